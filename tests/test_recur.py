"""``offcut recur`` (offcut.client.recur): the recurring-job driver runs a small training
script (offcut.client.training with a fake clock, no GPU) against a real daemon: history rows,
the environment contract, learning-rate scaling, ``{seed}`` and ``--workdir``, observer mode,
failed and runaway runs, bad input."""

from __future__ import annotations

import csv
import json
import os
import shlex
import stat
import sys
import time

import pytest
from typer.testing import CliRunner

from offcut.client.cli import app
from offcut.client.recur import HISTORY_COLUMNS, default_job_id, scaled_learning_rate
from offcut.client.training import BackendUnavailable

TRAIN_SCRIPT = r'''
import argparse, json, os, signal, sys, time
from offcut.client.training import ManualBackend, ZeusTraining

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, required=True)
p.add_argument("--lr", default="")
p.add_argument("--trial", type=int, default=0)
p.add_argument("--record", default="")
p.add_argument("--converge-from", type=int, default=64)  # batch sizes that reach the target
p.add_argument("--converge-epoch", type=int, default=2)
p.add_argument("--crash-trial", type=int, default=0)     # exit 3 before any epoch
p.add_argument("--ignore-stop", action="store_true")
p.add_argument("--ignore-sigterm", action="store_true")
p.add_argument("--seed", type=int, default=None)
p.add_argument("--limits-log", default="")              # every power limit the run set
a = p.parse_args()
if a.record:
    with open(a.record, "a") as fh:
        env = {k: v for k, v in os.environ.items() if k.startswith("OFFCUT_")}
        fh.write(json.dumps({"argv_trial": a.trial, "batch_size": a.batch_size, "lr": a.lr,
                             "seed": a.seed, "cwd": os.getcwd(), "PWD": os.environ.get("PWD"),
                             **env}) + "\n")
if a.trial == a.crash_trial:
    sys.exit(3)
if a.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
now = [0.0]
backend = ManualBackend(clock=lambda: now[0], power_w=lambda limit: 0.9 * limit,
                        power_limit_range_w=(100.0, 250.0))
with ZeusTraining.from_env(backend=backend) as zt:
    assert zt.batch_size == a.batch_size
    while not zt.should_stop:
        zt.on_epoch_begin()
        for _ in range(640 // zt.batch_size):            # one pass over 640 samples
            zt.on_step_begin()
            now[0] += 0.02 * zt.batch_size ** 0.7 * (250.0 / backend.power_limit_w) ** 0.5
        reached = zt.batch_size >= a.converge_from and zt.epoch + 1 >= a.converge_epoch
        zt.on_epoch_end(0.9 if reached else 0.1)
    if a.ignore_stop:
        while True:
            time.sleep(0.05)
if a.limits_log:                                          # after close (which restores max)
    with open(a.limits_log, "a") as fh:
        fh.write(json.dumps({"trial": a.trial, "limits_set": backend.limits_set}) + "\n")
'''


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN_SCRIPT)
    return path


def command(script, *extra) -> str:
    return " ".join([shlex.quote(sys.executable), shlex.quote(str(script)),
                     "--batch-size {batch_size} --trial {trial}", *extra])


def recur(address, out, cmd, *extra, batch_sizes="32,64,128", default="64"):
    args = ["recur", "--command", cmd, "--batch-sizes", batch_sizes, "--default", default,
            "--target", address, "--target-metric", "0.8", "--max-epochs", "4",
            "--max-power-w", "250", "--seed", "3", "--out", str(out), "--poll-s", "0.05",
            "--grace-s", "0.3", "--job-id", "toy", *extra]
    return CliRunner().invoke(app, args)


def history(out) -> list[dict]:
    with (out / "history.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == HISTORY_COLUMNS
        return list(reader)


def test_recurrences_run_until_converged_and_history_matches_the_daemon(daemon, tmp_path, script):
    _, client = daemon
    out, record = tmp_path / "out", tmp_path / "runs.jsonl"
    cmd = command(script, "--lr {learning_rate}", f"--record {record}")
    result = recur(client.address, out, cmd, "--recurrences", "3", "--base-lr", "0.1",
                   "--lr-scaling", "linear")
    assert result.exit_code == 0, result.output
    rows = history(out)
    # pruning from the default 64: 64 converges; 32 does not (ends the downward walk); 128 does
    assert [(r["recurrence"], r["try"], r["trial"], r["batch_size"], r["reached"])
            for r in rows[:3]] == [("1", "1", "1", "64", "True"), ("2", "1", "2", "32", "False"),
                                   ("2", "2", "3", "128", "True")]
    assert rows[3]["recurrence"] == "3" and rows[3]["reached"] == "True"
    assert len(rows) == 4 and rows[3]["batch_size"] in ("64", "128")
    trials = {t.trial_number: t for t in client.get_zeus_job("toy").trials}
    for row in rows:
        trial = trials[int(row["trial"])]
        assert int(row["batch_size"]) == trial.batch_size
        assert float(row["energy_j"]) == pytest.approx(trial.energy_j, rel=1e-5)
        assert float(row["time_s"]) == pytest.approx(trial.time_s, rel=1e-5)
        assert float(row["cost"]) == pytest.approx(trial.cost_j, rel=1e-5)
        assert (row["exit_code"], row["power_limit_w"], row["status"]) == ("0", "", trial.status)
        assert (row["reached"] == "True") == (trial.status == "converged")
    # the environment contract and {learning_rate} = base_lr * b / default
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["argv_trial"] for r in runs] == [1, 2, 3, 4]
    for r in runs:
        assert r["OFFCUT_ZEUS_TRIAL"] == str(r["argv_trial"])
        assert r["OFFCUT_BATCH_SIZE"] == str(r["batch_size"])
        assert (r["OFFCUT_ADDRESS"], r["OFFCUT_ZEUS_JOB_ID"]) == (client.address, "toy")
        assert float(r["lr"]) == pytest.approx(0.1 * r["batch_size"] / 64)
    assert {r["lr"] for r in runs if r["batch_size"] == 32} == {"0.05"}
    assert "recurrence 2/3 try 2: trial 3, batch size 128, lr 0.2" in result.output
    assert (out / "logs" / "r2-t1-trial2.log").is_file()

    # the same spec again is accepted: the job goes on where it was
    result = recur(client.address, out, cmd, "--base-lr", "0.1", "--lr-scaling", "linear")
    assert result.exit_code == 0, result.output
    assert [r["trial"] for r in history(out)] == ["5"]
    # a different spec under the same id is refused with a hint
    result = recur(client.address, out, cmd, "--base-lr", "0.1", "--eta", "0.9")
    assert result.exit_code == 1
    assert "registered with a different spec" in result.output and "--job-id" in result.output


def test_seed_and_workdir_reach_the_command(daemon, tmp_path, script):
    _, client = daemon
    out, record = tmp_path / "out", tmp_path / "runs.jsonl"
    # one folder for every run: the command names its script relative to it
    cmd = (f"{shlex.quote(sys.executable)} {script.name} --batch-size {{batch_size}} "
           f"--trial {{trial}} --seed {{seed}} --record {record}")
    result = recur(client.address, out, cmd, "--recurrences", "2", "--workdir",
                   str(script.parent))
    assert result.exit_code == 0, result.output
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    # --seed 3 is the base: trial n gets 3 + n - 1 (ZeusMaster: seed, seed + 1, ... per run)
    assert [(r["argv_trial"], r["seed"]) for r in runs] == [(1, 3), (2, 4), (3, 5)]
    assert {r["cwd"] for r in runs} == {r["PWD"] for r in runs} == {str(script.parent)}
    assert [r["seed"] for r in history(out)] == ["3", "4", "5"]
    assert "seed 4" in result.output and f"in {script.parent}" in result.output

    # a folder per run (placeholders), created private; --run-seed; the job goes on (trial 4)
    runs_dir = tmp_path / "runs"
    result = recur(client.address, out, command(script, f"--seed {{seed}} --record {record}"),
                   "--run-seed", "4294967295",
                   "--workdir", str(runs_dir / "r{recurrence}-trial{trial}-bs{batch_size}"))
    assert result.exit_code == 0, result.output
    last = json.loads(record.read_text().splitlines()[-1])
    assert last["argv_trial"] == 4 and last["seed"] == 2  # (2^32 - 1 + 4 - 1) mod 2^32
    workdir = runs_dir / f"r1-trial4-bs{last['batch_size']}"
    assert last["cwd"] == str(workdir)
    for folder in (runs_dir, workdir):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, oct(folder.stat().st_mode)


def test_a_refused_run_workdir_ends_its_trial(daemon, tmp_path, script):
    _, client = daemon
    (tmp_path / "w1").write_text("a file, not a folder")
    result = recur(client.address, tmp_path / "out", command(script), "--workdir",
                   str(tmp_path / "w{trial}"))
    assert result.exit_code == 2, result.output
    assert f"--workdir: {tmp_path / 'w1'} exists and is not a directory" in result.output
    assert [t.status for t in client.get_zeus_job("toy").trials] == ["abandoned"]


def test_observer_mode_keeps_every_run_at_the_maximum_power_limit(daemon, tmp_path, script):
    _, client = daemon
    out, limits = tmp_path / "out", tmp_path / "limits.jsonl"
    result = recur(client.address, out, command(script, f"--limits-log {limits}"),
                   "--observer-mode", "--power-limits", "150-250", "--power-step", "50",
                   "--warmup-steps", "1", "--profile-steps", "2", "--recurrences", "3",
                   "--eta", "0.3")
    assert result.exit_code == 0, result.output
    assert "observer mode: every run at the maximum power limit 250 W" in result.output
    rows = history(out)
    # the batch size still follows the optimizer (64, then 32 fails, 128 converges, ...)
    assert [r["batch_size"] for r in rows[:3]] == ["64", "32", "128"] and len(rows) == 4
    logs = [json.loads(line) for line in limits.read_text().splitlines()]
    assert [log["trial"] for log in logs] == [1, 2, 3, 4]
    for log in logs:                      # the run set the maximum, and nothing else
        assert log["limits_set"] and set(log["limits_set"]) == {250.0}, log
    trials = {t.trial_number: t for t in client.get_zeus_job("toy").trials}
    for row in rows:
        energy, time_s, cost = float(row["energy_j"]), float(row["time_s"]), float(row["cost"])
        # measured at the maximum: the script draws 0.9 x limit = 225 W throughout
        assert energy == pytest.approx(225.0 * time_s, rel=1e-4)
        # the measured cost: zeus_cost = eta E + (1 - eta) MaxPower T (Zeus, Section 3.1, Eq. 2)
        assert cost == pytest.approx(0.3 * energy + 0.7 * 250.0 * time_s, rel=1e-4)
        assert cost == pytest.approx(trials[int(row["trial"])].cost_j, rel=1e-5)
        assert float(row["power_limit_w"]) == 250.0
    # the power-limit optimizer measured each batch size at the maximum only
    for b in {int(r["batch_size"]) for r in rows}:
        profile = client.power_profile("toy", b)
        assert profile.done and profile.chosen_power_limit_w == 250.0
        assert {m.power_limit_w for m in profile.measurements} == {250.0}
    spec = client.get_zeus_job("toy").power
    assert (spec.min_power_limit_w, spec.max_power_limit_w) == (250.0, 250.0)
    # the optimizing job of the same command is another job by default
    assert default_job_id("python t.py") != default_job_id("python t.py", observer_mode=True)


def test_learning_rate_scalings():
    assert scaled_learning_rate(0.1, 128, 64, "linear") == pytest.approx(0.2)
    assert scaled_learning_rate(0.1, 256, 64, "sqrt") == pytest.approx(0.2)
    assert scaled_learning_rate(0.1, 16, 64, "none") == 0.1


def test_power_limits_are_profiled_and_the_chosen_limit_is_recorded(daemon, tmp_path, script):
    _, client = daemon
    out = tmp_path / "out"
    result = recur(client.address, out, command(script), "--power-limits", "150-250",
                   "--power-step", "50", "--warmup-steps", "1", "--profile-steps", "2")
    assert result.exit_code == 0, result.output
    profile = client.power_profile("toy", 64)
    assert profile.done and [m.power_limit_w for m in profile.measurements] == [250, 200, 150]
    (row,) = history(out)
    assert float(row["power_limit_w"]) == profile.chosen_power_limit_w
    assert client.get_zeus_job("toy").power.profile_steps == 2


def test_a_command_exiting_non_zero_is_a_failed_run_and_is_retried(daemon, tmp_path, script):
    _, client = daemon
    out = tmp_path / "out"
    result = recur(client.address, out, command(script, "--crash-trial 1"))
    assert result.exit_code == 0, result.output
    rows = history(out)
    assert [(r["try"], r["trial"], r["batch_size"], r["exit_code"], r["reached"], r["status"])
            for r in rows] == [("1", "1", "64", "3", "False", "abandoned"),
                               ("2", "2", "64", "0", "True", "converged")]
    assert "the command reported no epoch" in result.output


def test_the_driver_stops_when_every_batch_size_failed(daemon, tmp_path, script):
    _, client = daemon
    out = tmp_path / "out"
    result = recur(client.address, out, command(script, "--converge-from 100000"),
                   "--max-epochs", "1", "--beta", "0", batch_sizes="64,128")
    assert result.exit_code == 1, result.output
    assert "offcut: stopping: job_id: every batch size of job 'toy' failed" in result.output
    assert [(r["trial"], r["batch_size"], r["reached"]) for r in history(out)] == [
        ("1", "64", "False"), ("2", "128", "False")]


def test_a_command_that_cannot_start_stops_the_driver_and_closes_its_trial(daemon, tmp_path):
    _, client = daemon
    result = recur(client.address, tmp_path / "out", "no-such-program-xyz {batch_size}")
    assert result.exit_code == 1
    assert "cannot run 'no-such-program-xyz'" in result.output
    assert [t.status for t in client.get_zeus_job("toy").trials] == ["abandoned"]


@pytest.mark.parametrize("ignore_sigterm, exit_code", [(False, "-15"), (True, "-9")])
def test_a_run_ignoring_the_stop_verdict_is_terminated(daemon, tmp_path, script,
                                                       ignore_sigterm, exit_code):
    _, client = daemon
    out = tmp_path / "out"
    extra = ["--ignore-stop", "--converge-from 100000"]
    extra += ["--ignore-sigterm"] if ignore_sigterm else []
    start = time.monotonic()
    result = recur(client.address, out, command(script, *extra), "--max-epochs", "2",
                   "--max-tries", "1", "--timeout-s", "8")
    assert time.monotonic() - start < 5
    assert "the daemon stopped this trial (not converged)" in result.output
    assert result.exit_code == 1, result.output
    assert "did not reach the target metric in 1 tries" in result.output
    (row,) = history(out)
    assert (row["exit_code"], row["reached"], row["status"], row["epochs"]) == (
        exit_code, "False", "failed", "2")
    assert "SIGTERM" in result.output
    assert ("SIGKILL" in result.output) == ignore_sigterm


@pytest.mark.parametrize("change, message, code", [
    ({"--lr-scaling": "cubic"}, "--lr-scaling: 'cubic' is not one of linear, sqrt, none", 2),
    ({"--default": "48"}, "--default 48 is not one of --batch-sizes 32,64,128", 2),
    ({"--batch-sizes": "32,sixty-four"}, "--batch-sizes: expected comma-separated positive", 2),
    ({"--command": "python train.py --bs {bs}"}, "unknown placeholder {bs}", 2),
    ({"--command": "python train.py --lr {learning_rate}"}, "give --base-lr", 2),
    ({"--power-limits": "250-100"}, "--power-limits: need 0 < MIN <= MAX", 2),
    ({"--workdir": "runs/{bs}"}, "--workdir: unknown placeholder {bs}", 2),
    ({"--workdir": "runs/{learning_rate}"}, "--workdir uses {learning_rate}: give --base-lr", 2),
    ({"--workdir": " "}, "--workdir is empty", 2),
    ({"--run-seed": "-1"}, "--run-seed must be in [0, 2^32), got -1", 2),
    ({"--run-seed": str(2**32)}, "--run-seed must be in [0, 2^32)", 2),
    ({"--command": "python train.py --seed {seed.real}"}, "unknown placeholder {seed.real}", 2),
    ({}, "cannot reach offcutd at unix://", 1),
])
def test_bad_input_is_one_clear_line(tmp_path, change, message, code):
    args = {"--command": "python train.py --batch-size {batch_size}", "--batch-sizes": "32,64,128",
            "--default": "64", "--target-metric": "0.8", "--max-power-w": "250",
            "--target": f"unix://{tmp_path}/nobody.sock", "--out": str(tmp_path / "out")}
    args.update(change)
    result = CliRunner().invoke(app, ["recur", *[x for kv in args.items() for x in kv]])
    assert result.exit_code == code, result.output
    assert result.output.startswith("offcut: ") and message in result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output


@pytest.mark.parametrize("kind", ["file", "world-writable", "other-user"])
def test_an_unsafe_fixed_workdir_is_refused_before_any_trial(tmp_path, kind):
    path = tmp_path / "work"
    if kind == "file":
        path.write_text("x")
        message = "exists and is not a directory"
    elif kind == "world-writable":
        path.mkdir()
        path.chmod(0o1777)                # sticky like /tmp: others still add files
        message = "is writable by every user (mode 1777)"
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        path.mkdir(mode=0o755)
        os.chown(path, 65534, 65534)
        message = "is owned by uid 65534, not by this user"
    result = CliRunner().invoke(app, [
        "recur", "--command", "python train.py", "--batch-sizes", "32,64", "--default", "64",
        "--target-metric", "0.8", "--max-power-w", "250", "--workdir", str(path),
        "--target", f"unix://{tmp_path}/nobody.sock"])   # refused before connecting
    assert result.exit_code == 2, result.output
    assert result.output.startswith("offcut: --workdir: ") and message in result.output
    assert result.output.strip().count("\n") == 0


def test_observer_mode_needs_the_maximum_power_limit(tmp_path, monkeypatch):
    def no_nvml(*_):
        raise BackendUnavailable("NVML could not start (NVML Shared Library Not Found)")
    monkeypatch.setattr("offcut.client.recur.nvml_power_limit_range", no_nvml)
    result = CliRunner().invoke(app, [
        "recur", "--command", "python train.py", "--batch-sizes", "32,64", "--default", "64",
        "--target-metric", "0.8", "--max-power-w", "250", "--observer-mode",
        "--target", f"unix://{tmp_path}/nobody.sock"])
    assert result.exit_code == 2, result.output
    assert "give --power-limits MIN-MAX (observer mode keeps every run at MAX)" in result.output


def test_max_power_and_power_range_read_via_pynvml(monkeypatch):
    from offcut.client.recur import RecurOptions, parse_power_limits

    monkeypatch.setattr("offcut.client.recur.nvml_power_limit_range",
                        lambda *_: (100.0, 300.0, 4))   # 4 visible GPUs, 100-300 W each
    opts = RecurOptions(command="python t.py", batch_sizes=[32, 64], default_batch_size=64,
                        target_metric=0.8, power_limits=parse_power_limits("auto"),
                        power_limits_auto=True, num_gpus=2, power_step_w=50.0)
    opts.validate()
    opts.resolve_gpu_figures()
    spec = opts.job_spec("j")
    assert spec.max_power_w == 600.0                       # max limit x GPUs per run
    assert (spec.power.min_power_limit_w, spec.power.max_power_limit_w) == (100.0, 300.0)
    assert spec.power.step_w == 50.0 and spec.beta_knob == 2.0 and not spec.HasField("seed")


def test_max_power_is_required_when_pynvml_cannot_read_it(tmp_path, monkeypatch):
    def no_nvml(*_):
        raise BackendUnavailable("NVML could not start (NVML Shared Library Not Found)")
    monkeypatch.setattr("offcut.client.recur.nvml_power_limit_range", no_nvml)
    result = CliRunner().invoke(app, [
        "recur", "--command", "python train.py", "--batch-sizes", "32,64", "--default", "64",
        "--target-metric", "0.8", "--target", f"unix://{tmp_path}/nobody.sock"])
    assert result.exit_code == 2
    assert "give --max-power-w" in result.output and "pynvml" in result.output
    assert result.output.strip().count("\n") == 0

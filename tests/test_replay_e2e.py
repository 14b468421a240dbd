"""End-to-end replays: the CLI starts a real offcutd and drives it over a unix socket."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from offcut.client.cli import app
from offcut.replay.driver import STEP_COLUMNS

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real BFTrainer data not found at {DATA}")
runner = CliRunner()


def _run(*args: str):
    result = runner.invoke(app, list(args))
    return result


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_demo_replays_bundled_log_and_all_tasks_finish(tmp_path):
    out = tmp_path / "demo"
    result = _run("demo", "--out", str(out), "--solver", "dp", "--no-progress")
    assert result.exit_code == 0, result.output
    s = _summary(out)
    assert s["tasks_submitted"] == s["tasks_completed"] == 6
    assert s["all_done_at"] is not None and s["stop_reason"] == "all tasks done"
    # the offcuts give less than the same node-hours on dedicated nodes, but most of it
    assert 0.5 < s["dedicated_efficiency"] < 1.0 and s["dedicated_tasks_left_out"] == 0
    # its parts, each against its own baseline, multiply to it: what the held node counts give
    # on dedicated nodes is at most the best count's rate, and the tasks keep at most that
    kept, scaling = s["same_counts_efficiency"], s["scaling_factor"]
    assert 0.5 < kept <= 1.0 + 1e-9 and 0.5 < scaling <= 1.0 + 1e-9
    assert kept * scaling == pytest.approx(s["dedicated_efficiency"], rel=1e-12)
    assert s["held_count_samples"] <= s["dedicated_samples"] * (1 + 1e-9)
    assert "= overhead" in result.output and "x scaling" in result.output
    # used node-hours can never exceed idle node-hours, and the tasks did use nodes
    assert 0 < s["used_node_hours"] <= s["idle_node_hours"]
    # all work is accounted: completed tasks earned exactly their total work in net samples
    tasks = pd.read_csv(out / "placements.csv")
    total_work = tasks.groupby("task_id")["total_work_samples"].first().sum()
    assert s["total_samples"] == pytest.approx(total_work, rel=1e-9)
    # completion rows carry the exact completion time, not the time of the event after it
    done = tasks[tasks["change"] == "completed"]
    assert len(done) == 6 and done["time"].max() == s["all_done_at"]
    finish = {t["task_id"]: t["finish_time"] for t in s["tasks"]}
    assert all(finish[r.task_id] == r.time for r in done.itertuples())
    with open(out / "steps.csv") as fh:
        header = next(csv.reader(fh))
    assert header == STEP_COLUMNS
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == s["events"] + 1  # + the initial snapshot row
    assert (steps["nNrun"] <= steps["nNd"]).all()
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out / "report.png") in result.output


def test_max_events_stops_the_replay(tmp_path):
    out = tmp_path / "short"
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay
    from offcut.replay.synth import demo_data_dir

    data = demo_data_dir()
    s = run_replay(load_node_log(data, skip_rows=0), load_task_set(data), out,
                   ReplayOptions(solver="dp", max_events=50, progress=False))
    assert s["events"] == 50 and s["stop_reason"] == "max_events"
    assert len(pd.read_csv(out / "steps.csv")) == 51


@pytest.mark.parametrize("args, needle", [
    (["--node-log", "/nonexistent/log.tar.gz", "--tasks", "/nonexistent/t.csv"], "not found"),
    (["--node-log", "{demo}", "--tasks", "{demo}", "--first-node", "5000"], "first"),
])
def test_bad_replay_input_is_one_clear_line(tmp_path, args, needle):
    from offcut.replay.synth import demo_data_dir

    args = [a.replace("{demo}", str(demo_data_dir())) for a in args]
    result = _run("replay", "bftrainer", *args, "--out", str(tmp_path / "o"), "--no-progress")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert needle in result.output.lower()


@needs_data
def test_pickles_need_allow_pickle(tmp_path):
    result = _run("replay", "bftrainer", "--node-log", str(DATA / "ndstat-10sdn6-evt.tar.gz"),
                  "--tasks", str(DATA / "hps-shufflenet-Jbnd-10J.pkl"), "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "--allow-pickle" in result.output
    assert not (tmp_path / "summary.json").exists()


@needs_data
@pytest.mark.parametrize("num_nodes, original_all_done", [
    (128, "2021-02-12 03:33:11"),  # BFTrainer's MILP on the same input (issue 2)
    (64, "2021-02-12 13:42:38"),
])
def test_real_log_all_tasks_done_no_later_than_bftrainer(tmp_path, num_nodes, original_all_done):
    out = tmp_path / f"r{num_nodes}"
    result = _run("replay", "bftrainer", "--allow-pickle",
                  "--node-log", str(DATA / "ndstat-10sdn6-evt.tar.gz"),
                  "--tasks", str(DATA / "hps-shufflenet-Jbnd-10J.pkl"),
                  "--num-nodes", str(num_nodes), "--tfwd", "10", "--solver", "cbc",
                  "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    s = _summary(out)
    assert s["tasks_completed"] == s["tasks_submitted"] == 10
    assert s["solves_by_backend"].get("cbc", 0) > 0 and s["solver_fallbacks"] == 0
    assert pd.Timestamp(s["all_done_at"]) <= pd.Timestamp(original_all_done)


@needs_data
def test_recorded_real_instances_agree_across_solvers(tmp_path):
    """Instances recorded from the real replay: dp (exact), cbc and gurobi give one optimum,
    and by the exact backends' tie rule (docs/architecture.md, "The tie rule") the same counts."""
    records = tmp_path / "instances.jsonl"
    out = tmp_path / "rec"
    result = _run("replay", "bftrainer", "--allow-pickle",
                  "--node-log", str(DATA / "ndstat-10sdn6-evt.tar.gz"),
                  "--tasks", str(DATA / "hps-shufflenet-Jbnd-10J.pkl"),
                  "--num-nodes", "128", "--solver", "dp", "--max-events", "150",
                  "--record-instances", str(records), "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in records.read_text().splitlines() if x.strip()]
    assert len(lines) > 50

    def objectives(solver: str) -> list[dict]:
        res = _run("solve", str(records), "--solver", solver)
        assert res.exit_code == 0, res.output
        rows = [json.loads(x) for x in res.output.splitlines() if x.startswith("{")]
        assert len(rows) == len(lines)
        return rows

    dp = objectives("dp")
    exact = [r["objective"] for r in dp]
    cbc = objectives("cbc")
    assert {r["solver"] for r in cbc} <= {"cbc", "trivial"}  # trivial: no idle node
    assert [r["objective"] for r in cbc] == pytest.approx(exact, rel=1e-6, abs=1e-6)
    assert [r["counts"] for r in cbc] == [r["counts"] for r in dp]
    gurobi = objectives("gurobi")
    if any(r.get("fallback_reason") for r in gurobi):
        pytest.skip("gurobipy not usable here: " + gurobi[0].get("fallback_reason", ""))
    assert [r["objective"] for r in gurobi] == pytest.approx(exact, rel=1e-6, abs=1e-6)
    assert [r["counts"] for r in gurobi] == [r["counts"] for r in dp]


@needs_data
def test_whole_machine_replay_first_500_events(tmp_path):
    """All 4,734 nodes, the 1,001-task ImageNet set, 100 admitted tasks, exact dp, over gRPC."""
    out = tmp_path / "full"
    result = _run("replay", "bftrainer", "--allow-pickle",
                  "--node-log", str(DATA / "ndstat-10sdn6-evt.tar.gz"),
                  "--tasks", str(DATA / "ImageNet-imgps-Jbnd-1001J.pkl"),
                  "--max-tasks", "100", "--solver", "dp", "--max-events", "500",
                  "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    s = _summary(out)
    assert s["num_nodes"] == 4734 and s["events"] == 500
    assert s["solves_by_backend"].get("dp", 0) > 0 and s["solver_fallbacks"] == 0
    steps = pd.read_csv(out / "steps.csv")
    assert steps["nJob"].max() == 100  # admission cap reached, never exceeded
    assert (steps["nNrun"] <= steps["nNd"]).all() and steps["nNrun"].max() > 0
    assert s["daemon_peak_rss_mb"] is None or s["daemon_peak_rss_mb"] < 300


def _replay_without(blocked: tuple[str, ...], args: list[str], out: Path, tmp_path: Path) -> str:
    """``offcut ARGS --out OUT`` in a fresh process (its private offcutd too) where the modules
    ``blocked`` cannot be imported, as on an install without those extras; the placements."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    if blocked:
        shim = tmp_path / f"without-{'-'.join(blocked)}"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(
            "import sys\n" + "".join(f"sys.modules[{m!r}] = None  # ImportError\n"
                                     for m in blocked))
        env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "offcut.client.cli", *args, "--out", str(out),
                           "--no-progress"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["solver"] == "dp" and set(summary["solves_by_backend"]) == {"dp"}
    return (out / "placements.csv").read_text()


@pytest.mark.parametrize("replay", ["demo", "hps-shufflenet-10x128"])
def test_the_default_decides_the_same_whatever_is_installed(replay, tmp_path):
    """The default solver (dp) makes the same decisions, event for event and count for count,
    with gurobipy and python-mip installed (this environment: '.[dev]') and without them (an
    install of '.' alone): nothing about the default depends on the extras."""
    if replay == "demo":
        args = ["demo"]
    else:
        if not DATA.is_dir():
            pytest.skip(f"real BFTrainer data not found at {DATA}")
        args = ["replay", "bftrainer", "--allow-pickle", "--node-log",
                str(DATA / "ndstat-10sdn6-evt.tar.gz"), "--tasks",
                str(DATA / "hps-shufflenet-Jbnd-10J.pkl"), "--num-nodes", "128"]
    full = _replay_without((), args, tmp_path / "full", tmp_path)
    bare = _replay_without(("gurobipy", "mip"), args, tmp_path / "bare", tmp_path)
    assert full.count("\n") > 20  # the tasks were placed and rescaled many times
    assert bare == full

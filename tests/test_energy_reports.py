"""Measured energy per task (issue 36 item 4; docs/execution.md, "Energy"): ``Tasks.ReportEnergy``
over real gRPC daemons. Reports of several ranks and generations are summed (the largest
figure per generation and rank), late reports of a replaced generation still count, the
bounds are refused naming the field and change nothing, another user's task is NOT_FOUND, the
per-rank figures of the newest generations only are kept, everything survives ``kill -9`` of
an ``offcutd`` process, and ``offcut show``, ``offcut history`` (tasks.csv) and the Prometheus
series label the joules and samples per joule ``measured`` or ``modelled``."""

from __future__ import annotations

import csv
import math
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from offcut.client import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd
from offcut.client.cli import app
from offcut.daemon.edge.auth import add_token
from offcut.daemon.app.scheduler.energy import KEPT_GENERATIONS, MAX_RANK_ENERGY_J
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from offcut.v1 import tasks_pb2

from daemon_helpers import make_spec

runner = CliRunner()


def place(c, nodes=4, **spec) -> tasks_pb2.Task:
    """``nodes`` idle nodes and one task that takes them all (generation 1)."""
    c.report_nodes(time.time(), "slurm", 1, idle=[f"n{i}" for i in range(1, nodes + 1)])
    task = c.submit(make_spec("e", max_nodes=nodes, ns=(0, 1, 2, 4), **spec)).task
    assert len(task.nodes) == nodes and task.generation == 1
    return task


def energy_of(c, task_id) -> tasks_pb2.TaskEnergy:
    return c.get_task(task_id).energy


# ----------------------------------------------------------------------------- sums
def test_reports_of_ranks_and_generations_are_summed_and_kept_for_the_newest(daemon):
    _, c = daemon
    task = place(c, procs_per_node=2, power_w=[0.0, 100.0, 200.0, 400.0])
    t = task.task_id
    assert task.energy.source == "modelled"            # nothing measured yet
    # generation 1: 4 nodes x 2 processes = 8 ranks
    for rank in range(8):
        got = c.report_energy(t, 1, rank, 100.0 * (rank + 1)).task.energy
    assert (got.source, got.joules) == ("measured", pytest.approx(3600.0))
    assert (got.last_generation, got.last_generation_ranks, got.last_generation_world_size,
            got.generations_reported) == (1, 8, 8, 1)
    assert c.report_energy(t, 1, 3, 10.0).task.energy.joules == pytest.approx(3600.0)  # lower
    assert c.report_energy(t, 1, 3, 450.0).task.energy.joules == pytest.approx(3650.0)  # +50
    with pytest.raises(InvalidArgument, match=r"^rank: 8 is not below the world size 8"):
        c.report_energy(t, 1, 8, 1.0)

    # the daemon shrinks the task to 2 nodes: generation 2, 4 ranks
    c.report_nodes(time.time(), "slurm", 2, preempted=list(task.nodes[2:]))
    assert c.get_task(t).generation == 2
    # generation 1's last reports arrive after the daemon moved on: they still count
    assert c.report_energy(t, 1, 7, 900.0).task.energy.joules == pytest.approx(3750.0)
    for rank in range(4):
        got = c.report_energy(t, 2, rank, 10.0).task.energy
    assert got.joules == pytest.approx(3790.0)
    assert (got.last_generation, got.last_generation_joules, got.last_generation_ranks,
            got.last_generation_world_size, got.generations_reported) == (2, 40.0, 4, 4, 2)
    with pytest.raises(InvalidArgument, match=r"^rank: 4 is not below the world size 4 of "
                                              r"generation 2"):
        c.report_energy(t, 2, 4, 1.0)
    with pytest.raises(FailedPrecondition, match=r"^generation: 3 is after the current "
                                                 r"generation 2"):
        c.report_energy(t, 3, 0, 1.0)
    # samples per joule: the task's samples over the measured joules
    task = c.get_task(t)
    assert task.energy.samples_per_joule == pytest.approx(task.work_done_samples / 3790.0)
    assert task.energy_j > 0 and task.energy_j != pytest.approx(3790.0)  # the model, kept apart

    # restarts in place: generations 3 .. 6; only the newest KEPT_GENERATIONS keep their ranks
    for g in range(2, 2 + KEPT_GENERATIONS):
        c.report_task_run(t, "interrupted", generation=g, node="n1", job_id=str(g))
    assert c.get_task(t).generation == 2 + KEPT_GENERATIONS
    with pytest.raises(FailedPrecondition, match=r"^generation: generation 2 of task .* is "
                                                 r"older than the newest 4"):
        c.report_energy(t, 2, 0, 99.0)
    got = c.report_energy(t, 6, 1, 5.0).task.energy
    assert got.joules == pytest.approx(3795.0)           # closed generations still counted
    assert (got.last_generation, got.generations_reported) == (6, 3)


def test_a_retried_report_is_answered_once_and_a_repeat_changes_nothing(daemon):
    _, c = daemon
    t = place(c, nodes=2).task_id
    first = c.report_energy(t, 1, 0, 50.0, request_id="e-1")
    again = c.report_energy(t, 1, 0, 50.0, request_id="e-1")
    assert again.decision.duplicate and again.decision.revision == first.decision.revision
    repeat = c.report_energy(t, 1, 0, 50.0)             # a new id, the same figure
    assert repeat.decision.revision == first.decision.revision + 1
    assert repeat.task.energy.joules == pytest.approx(50.0)


@pytest.mark.parametrize("change, field, error", [
    ({"joules": math.nan}, "joules", InvalidArgument),
    ({"joules": math.inf}, "joules", InvalidArgument),
    ({"joules": -1.0}, "joules", InvalidArgument),
    ({"joules": MAX_RANK_ENERGY_J * 1.01}, "joules", InvalidArgument),
    ({"generation": 0}, "generation", InvalidArgument),
    ({"generation": 2**63}, "generation", InvalidArgument),
    ({"generation": 2}, "generation", FailedPrecondition),
    ({"rank": 2}, "rank", InvalidArgument),
    ({"rank": 2**32 - 1}, "rank", InvalidArgument),
    ({"task_id": ""}, "task_id", InvalidArgument),
    ({"task_id": "t999999"}, "task_id", NotFound),
    ({"request_id": "x" * 201}, "request_id", InvalidArgument),
])
def test_out_of_bounds_reports_are_refused_naming_the_field(daemon, change, field, error):
    _, c = daemon
    t = place(c, nodes=2).task_id
    c.report_energy(t, 1, 0, 10.0)
    before = c.status().revision, c.get_task(t)
    args = {"task_id": t, "generation": 1, "rank": 0, "joules": 20.0, "request_id": None}
    args.update(change)
    with pytest.raises(error, match=rf"^{field}: "):
        c.report_energy(args.pop("task_id"), args.pop("generation"), args.pop("rank"),
                        args.pop("joules"), **args)
    assert (c.status().revision, c.get_task(t)) == before


def test_a_user_reports_for_their_own_tasks_only(daemons, tmp_path):
    path = tmp_path / "tokens.toml"
    tokens = {"alice": add_token(path, "alice", "user"), "bob": add_token(path, "bob", "user"),
              "slurm": add_token(path, "slurm", "slurm")}
    srv, _ = daemons.start("sec", tokens_file=str(path))
    clients = {who: Client(srv.address, timeout_s=10, token=tok) for who, tok in tokens.items()}
    try:
        clients["slurm"].report_nodes(time.time(), "slurm", 1, idle=["n1", "n2"])
        t = clients["alice"].submit(make_spec("mine", max_nodes=2)).task.task_id
        assert clients["alice"].report_energy(t, 1, 1, 7.0).task.energy.joules == 7.0
        with pytest.raises(NotFound, match=rf"^task_id: no task '{t}'"):
            clients["bob"].report_energy(t, 1, 0, 1e6)
        with pytest.raises(PermissionDenied):            # Slurm's side does not measure
            clients["slurm"].report_energy(t, 1, 0, 1e6)
        assert clients["alice"].get_task(t).energy.joules == 7.0
    finally:
        for client in clients.values():
            client.close()


# ----------------------------------------------------------------------------- durability
def test_acknowledged_reports_survive_kill_9_of_the_daemon(tmp_path):
    """A real ``offcutd`` process (a snapshot every 2 journal rows, so both the snapshot and
    the journal tail after it are read back) is SIGKILLed after acknowledged reports and
    restarted on the same state file: the sums, the per-rank maxima and the stored replies
    are all there."""
    address = f"unix://{tmp_path / 'offcutd.sock'}"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(tmp_path / "state.sqlite"),
           "--solver", "dp", "--snapshot-every", "2", "--durability", "normal",
           "--log-level", "warning"]
    proc = start_offcutd(cmd, address, tmp_path / "offcutd.log")
    try:
        with Client(address, timeout_s=20) as c:
            t = place(c, nodes=2, procs_per_node=2).task_id
            for rank, joules in enumerate([11.0, 22.0, 33.0, 44.0]):
                c.report_energy(t, 1, rank, joules, request_id=f"r{rank}")
            c.report_nodes(time.time(), "slurm", 2, preempted=["n2"])       # generation 2
            c.report_energy(t, 2, 1, 5.0, request_id="g2")
            before = c.get_task(t)
        assert before.energy.joules == pytest.approx(115.0)
        proc.kill()
        proc.wait(30)
        proc = start_offcutd(cmd, address, tmp_path / "offcutd.log", append=True)
        with Client(address, timeout_s=20) as c:
            after = c.get_task(t)
            assert after.energy == before.energy and after.generation == 2
            again = c.report_energy(t, 1, 3, 44.0, request_id="r3")        # answered stored
            assert again.decision.duplicate
            assert c.report_energy(t, 1, 3, 40.0).task.energy.joules == pytest.approx(115.0)
            assert c.report_energy(t, 2, 0, 1.0).task.energy.joules == pytest.approx(116.0)
            with pytest.raises(InvalidArgument, match="^rank: 2 is not below the world size 2"):
                c.report_energy(t, 2, 2, 1.0)                               # 1 node x 2
    finally:
        proc.kill()
        proc.wait(30)


# ----------------------------------------------------------------------------- shown
def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_show_history_and_metrics_label_measured_and_modelled(daemons, tmp_path):
    srv, c = daemons.start(metrics_listen="127.0.0.1:0")
    c.report_nodes(time.time(), "slurm", 1, idle=["n1", "n2", "n3", "n4"])
    measured = c.submit(make_spec("gpu", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 10.0, 18.0))).task
    modelled = c.submit(make_spec("est", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 10.0, 18.0),
                                  power_w=[0.0, 300.0, 600.0])).task
    assert len(measured.nodes) == len(modelled.nodes) == 2
    c.report_energy(measured.task_id, 1, 0, 1200.0)
    c.report_energy(measured.task_id, 1, 1, 800.0)
    c.report_nodes(time.time(), "slurm", 2, idle=["n5"])   # the clock moves: the model accrues
    m, e = c.get_task(measured.task_id), c.get_task(modelled.task_id)
    assert (m.energy.source, m.energy.joules) == ("measured", 2000.0)
    assert e.energy.source == "modelled" and e.energy_j > 0
    assert e.energy.joules == pytest.approx(e.energy_j)

    out = runner.invoke(app, ["show", measured.task_id, "-a", srv.address])
    assert out.exit_code == 0, out.output
    assert ("Energy       2000 J measured (1 generation reported; generation 1: 2000 J from "
            "2 of 2 ranks)") in out.output
    assert f"SamplesPerJ  {m.energy.samples_per_joule:.6g} (measured)" in out.output
    out = runner.invoke(app, ["show", modelled.task_id, "-a", srv.address])
    assert f"Energy       {e.energy_j:.6g} J modelled, an estimate" in out.output
    assert "(modelled)" in out.output

    samples = scrape(srv.metrics_port)
    joules = {s: samples[("offcut_task_energy_by_source_joules", (("source", s),))]
              for s in ("measured", "modelled")}
    assert joules == {"measured": 2000.0, "modelled": pytest.approx(e.energy_j)}
    per_joule = samples[("offcut_task_samples_per_joule", (("source", "measured"),))]
    assert per_joule == pytest.approx(m.work_done_samples / 2000.0)

    out = runner.invoke(app, ["history", "--out", str(tmp_path / "hist"), "-a", srv.address])
    assert out.exit_code == 0, out.output
    assert "2 tasks (1 with measured energy)" in out.output
    with open(tmp_path / "hist" / "tasks.csv") as fh:
        rows = {r["task_id"]: r for r in csv.DictReader(fh)}
    row = rows[measured.task_id]          # as of its last energy report
    assert (row["energy_source"], float(row["energy_j"]), row["state"]) == (
        "measured", 2000.0, "running")
    row = rows[modelled.task_id]          # as of its submission
    assert row["energy_source"] == "modelled" and float(row["energy_j"]) == 0.0

"""Completion and wasted work (docs/execution.md, "Completion", "Wasted work"; issue 38): a
launched task whose report reaches its work keeps its nodes until its processes exit 0 (at
most ``final_grace_s``); a restart below the latest report is counted as samples trained
again; a run that ignored the stop signal is a warning. Real daemons over gRPC, event times
driven by the calls (replay clock)."""

from __future__ import annotations

import pytest

from offcut.views import TaskState

from daemon_helpers import T0, make_spec

pytestmark = pytest.mark.replay_clock

RUNNING, COMPLETED = TaskState.RUNNING, TaskState.COMPLETED


def launched_task(c, work=100.0, **spec) -> str:
    """A reporting task on n1, n2 with a run reported started (as the launcher does)."""
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    tid = c.submit(make_spec("w", max_nodes=2, work=work, reports_progress=True, **spec),
                   submit_time=T0 + 1).task.task_id
    c.report_task_run(tid, "started", node="n1", job_id="1", generation=1, time=T0 + 2)
    return tid


def report(c, tid, at, samples, nodes=2):
    return c.report_progress([{"task_id": tid, "time": T0 + at, "samples_done": samples,
                               "nodes": nodes}])


def test_a_launched_task_completes_when_its_processes_exit_0_not_at_its_report(daemons):
    _, c = daemons.start("a", final_grace_s=600)
    tid = launched_task(c)
    report(c, tid, 10, 100.0)  # the final checkpoint: the work is reached
    t = c.get_task(tid)
    assert t.state == RUNNING and sorted(t.nodes) == ["n1", "n2"]  # its evaluation runs on
    assert int(t.work_reached_time) == int(T0 + 10) and t.work_done_samples == 100.0
    # a second task cannot take the finishing task's nodes
    other = c.submit(make_spec("o", max_nodes=2), submit_time=T0 + 11).task
    assert not c.get_task(other.task_id).nodes
    r = c.report_task_run(tid, "finished", node="n1", job_id="1", generation=1,
                          time=T0 + 40)  # exit 0, 30 s later
    assert r.task.state == COMPLETED and int(r.task.finish_time) == int(T0 + 40)
    assert sorted(c.get_task(other.task_id).nodes) == ["n1", "n2"]  # freed only now
    assert not r.task.warnings


def test_final_grace_bounds_the_final_phase_with_a_warning(daemons):
    _, c = daemons.start("a", final_grace_s=60)
    tid = launched_task(c)
    report(c, tid, 10, 100.0)
    c.report_nodes(T0 + 69, "slurm", 2, idle=["n3"])  # within the grace: still finishing
    assert c.get_task(tid).state == RUNNING
    r = c.report_nodes(T0 + 80, "slurm", 3, idle=["n4"])  # past it
    t = c.get_task(tid)
    assert t.state == COMPLETED and int(t.finish_time) == int(T0 + 70)
    assert [w.kind for w in t.warnings] == ["final-grace"]
    assert "60 s (final_grace_s)" in t.warnings[0].message
    assert tid in r.completed_task_ids  # (the Decision of that node event)


def test_without_final_grace_or_a_launcher_the_report_completes_the_task(daemons):
    _, c = daemons.start("a", final_grace_s=0)
    tid = launched_task(c)
    report(c, tid, 10, 100.0)
    assert c.get_task(tid).state == COMPLETED
    _, c2 = daemons.start("b", final_grace_s=600)
    c2.report_nodes(T0, "slurm", 1, idle=["n1"])
    tid2 = c2.submit(make_spec("x", max_nodes=1, work=10.0, reports_progress=True),
                     submit_time=T0 + 1).task.task_id  # no run reported: nobody launched it
    c2.report_progress([{"task_id": tid2, "time": T0 + 5, "samples_done": 10.0, "nodes": 1}])
    assert c2.get_task(tid2).state == COMPLETED


def test_a_crash_after_reaching_the_work_restarts_the_final_phase(daemons):
    _, c = daemons.start("a", final_grace_s=600)
    tid = launched_task(c)
    report(c, tid, 10, 100.0)
    r = c.report_task_run(tid, "failed", node="n1", job_id="1", exit_code=1, generation=1,
                          time=T0 + 20)  # the evaluation crashed
    assert r.task.state == RUNNING and r.task.generation == 2 and r.task.failed_runs == 1
    assert r.task.work_reached_time is None  # the new generation finishes anew


def test_a_restart_below_the_latest_report_counts_samples_redone(daemons):
    _, c = daemons.start("a")
    tid = launched_task(c, work=1000.0)
    report(c, tid, 10, 400.0)
    c.report_task_run(tid, "interrupted", node="n1", job_id="1", exit_code=75, generation=1,
                      time=T0 + 20)
    c.report_task_run(tid, "started", node="n1", job_id="2", generation=2, time=T0 + 21)
    report(c, tid, 30, 50.0)  # generation 2 began from scratch: no checkpoint was loaded
    t = c.get_task(tid)
    assert t.samples_redone == 350.0 and t.work_done_samples == 50.0
    assert [w.kind for w in t.warnings] == ["no-checkpoint"]
    assert t.warnings[0].generation == 2 and "below the 400 reported" in t.warnings[0].message
    report(c, tid, 40, 60.0)  # the same generation goes on: nothing more
    assert c.get_task(tid).samples_redone == 350.0


def test_a_report_may_not_go_down_while_the_same_processes_run(daemons):
    from offcut.errors import FailedPrecondition

    _, c = daemons.start("a")
    tid = launched_task(c, work=1000.0)
    report(c, tid, 10, 400.0)
    with pytest.raises(FailedPrecondition, match="samples_done"):
        report(c, tid, 20, 300.0)
    assert c.get_task(tid).samples_redone == 0.0


def test_a_run_that_ignored_the_stop_signal_is_a_warning(daemons):
    _, c = daemons.start("a")
    tid = launched_task(c)
    r = c.report_task_run(tid, "interrupted", node="n1", job_id="1", generation=1,
                          time=T0 + 20, stop_ignored=True,
                          message="stopped for a new generation; it ignored the stop signal")
    assert [w.kind for w in r.task.warnings] == ["stop-ignored"]
    assert "ignored the stop signal" in r.task.warnings[0].message
    assert {p.task_id: p.change for p in r.decision.placements}[tid] == \
        "restart"


def test_offcut_show_names_the_wasted_work_and_the_warnings(daemons):
    from typer.testing import CliRunner

    from offcut.client.cli import app

    srv, c = daemons.start("a")
    tid = launched_task(c, work=1000.0)
    report(c, tid, 10, 400.0)
    c.report_task_run(tid, "failed", node="n1", job_id="1", exit_code=1, generation=1,
                      time=T0 + 20, stop_ignored=True)
    report(c, tid, 30, 100.0)  # generation 2 from scratch
    out = CliRunner().invoke(app, ["show", tid, "--address", srv.address],
                             catch_exceptions=False).stdout
    lines = {ln.split(None, 1)[0]: ln.split(None, 1)[1] for ln in out.splitlines()
             if ln.strip() and not ln.startswith(" ")}
    assert lines["FailedRuns"] == "1" and lines["SamplesRedone"] == "300"
    assert lines["FailedInARow"].startswith("1 (without progress")
    warnings = [ln for ln in out.splitlines() if ln.startswith("Warning")]
    assert [w.split()[1] for w in warnings] == ["stop-ignored", "no-checkpoint"]
    assert "(generation 2," in warnings[1] and "300 samples or more" in warnings[1]


def test_offcut_watch_shows_a_warning_as_it_is_noted(daemons):
    """The warning reaches ``WatchPlacements`` (and ``offcut watch``) at the revision that
    noted it, also for a watch of that task only, even with no placement change."""
    from offcut.client.task_cli import format_update

    srv, c = daemons.start("a")
    tid = launched_task(c, work=1000.0)
    report(c, tid, 10, 400.0)
    c.report_task_run(tid, "interrupted", node="n1", job_id="1", exit_code=75, generation=1,
                      time=T0 + 20)
    before = c.status().revision
    report(c, tid, 30, 50.0)  # noted now: no placement changes with it
    for watched in ("", tid):
        stream = c.watch(task_id=watched, after_revision=before, timeout_s=5)
        update = next(iter(stream))
        stream.cancel()
        assert not update.placements and [w.kind for w in update.warnings] == ["no-checkpoint"]
        assert update.warnings[0].task_id == tid
        (line,) = format_update(update)
        assert f"{tid}  WARNING no-checkpoint (generation 2)" in line


def test_offcut_history_exports_every_warning_with_its_decision(daemons, tmp_path):
    """Every warning is journaled with the decision that noted it (``Decision.warnings``), so
    ``offcut history`` writes it to warnings.csv, also after the task's own list (at most
    16) has dropped it; duplicates of a request answer with the stored warnings."""
    import csv
    from datetime import datetime, timezone

    from typer.testing import CliRunner

    from offcut.client.cli import app
    from offcut.daemon.app.scheduler.waste import MAX_TASK_WARNINGS

    srv, c = daemons.start("a")
    tid = launched_task(c, work=10_000.0)
    c.report_nodes(T0 + 3, "slurm", 2, idle=["n3"])  # a node event: the export has steps
    kept_at = c.status().revision
    noted = MAX_TASK_WARNINGS + 2
    for g in range(1, noted + 1):  # each generation ignores the stop signal once
        r = c.report_task_run(tid, "interrupted", node="n1", job_id=str(g), generation=g,
                              time=T0 + 10 * g, stop_ignored=True)
        assert [w.kind for w in r.decision.warnings] == ["stop-ignored"]
        assert r.decision.warnings[0].task_id == tid and r.decision.warnings[0].generation == g
    assert len(c.get_task(tid).warnings) == MAX_TASK_WARNINGS  # the task keeps the newest
    out = tmp_path / "hist"
    res = CliRunner().invoke(app, ["history", "--out", str(out), "--address", srv.address],
                             catch_exceptions=False)
    assert f"{noted} warnings -> " in res.stdout
    with open(out / "warnings.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["generation"]) for r in rows] == list(range(1, noted + 1))
    assert {r["task_id"] for r in rows} == {tid} and {r["kind"] for r in rows} == {"stop-ignored"}
    assert all("ignored the stop signal" in r["message"] for r in rows)
    assert rows[0]["time"] == datetime.fromtimestamp(T0 + 10, timezone.utc).isoformat(
        timespec="seconds")
    # an export after a revision holds only the later warnings
    res = CliRunner().invoke(app, ["history", "--out", str(out), "--after-revision",
                                   str(kept_at + noted - 1), "--address", srv.address],
                             catch_exceptions=False)
    with open(out / "warnings.csv", newline="") as fh:
        assert [int(r["generation"]) for r in csv.DictReader(fh)] == [noted]

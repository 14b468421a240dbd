"""Reports and the live history export: ``Status.ExportHistory`` over real gRPC, the shared
steps.csv / placements.csv writer, ``offcut history`` and ``offcut report`` (plots + summary.txt),
and one-line errors for bad report input."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import grpc
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from offcut.client.cli import app
from offcut.errors import OffcutError
from offcut.replay.history import PLACEMENT_COLUMNS, STEP_COLUMNS, iso
from offcut.replay.report import REPORT_FILES, build_report, render_report
from offcut.views import Decision, PlacementChange, TaskView

from daemon_helpers import T0
from daemon_helpers import make_spec as _make_spec

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

PNG = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


make_spec = functools.partial(_make_spec, up=2.0, down=3.0)  # rescales cost something here


def drive(c) -> list[tuple[str, Decision, TaskView | None]]:
    """Node events, two submissions and a cancel (no completion: work is large); returns
    (kind, decision, task) as the client received them, in order."""
    got = [("snapshot", c.sync_nodes(T0, "s", 1, ["n1", "n2", "n3"]), None)]
    r = c.submit(make_spec("a"), submit_time=T0 + 10, owner="alice")
    got.append(("submit", r.decision, r.task))
    got.append(("nodes", c.report_nodes(T0 + 20, "w", 1, idle=["n4", "n5"]), None))
    r = c.submit(make_spec("b", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 5.0, 9.0)),
                 submit_time=T0 + 30, owner="bob")
    got.append(("submit", r.decision, r.task))
    got.append(("nodes", c.report_nodes(T0 + 40, "w", 2, preempted=["n1", "n4"]), None))
    r = c.cancel(got[1][2].task_id, time=T0 + 50)
    got.append(("cancel", r.decision, r.task))
    got.append(("nodes", c.report_nodes(T0 + 60, "w", 3, idle=["n6"]), None))
    return got


def change_name(p: PlacementChange) -> str:
    return p.change


def held_integral(times: list[float], values: list[float], end: float) -> float:
    return float(np.sum(np.asarray(values) * np.diff(np.append(times, end))))


def run_cli(*args: str):
    return runner.invoke(app, list(args))


# ----------------------------------------------------------------------------- export RPC
def test_export_history_returns_the_decisions_the_client_received(daemons):
    _, c = daemons.start()
    got = drive(c)
    entries = list(c.export_history())
    assert [e.revision for e in entries] == list(range(1, len(got) + 1))
    assert [e.kind for e in entries] == [k for k, _, _ in got]
    for e, (_, d, task) in zip(entries, got):
        assert e.decision.revision == e.revision  # journal row id == decision revision
        assert e.decision == d
        if task is None:
            assert e.task is None
        else:
            assert e.task == task
    # paging
    assert [e.revision for e in c.export_history(after_revision=4)] == [5, 6, 7]
    assert [e.revision for e in c.export_history(after_revision=2, limit=2)] == [3, 4]
    assert list(c.export_history(after_revision=7)) == []
    assert list(c.export_history(after_revision=2**64 - 1)) == []


def test_export_history_error_ends_the_stream_with_a_status(daemons):
    srv, c = daemons.start()
    drive(c)
    srv.engine.store.db.execute("UPDATE journal SET response = x'ff' WHERE id = 3")  # corrupt
    seen = []
    with pytest.raises(OffcutError, match="ExportHistory failed; see the daemon log") as err:
        for e in c.export_history():
            seen.append(e.revision)
    assert err.value.code == grpc.StatusCode.INTERNAL
    assert seen == [1, 2]
    assert c.status().revision == 7  # the daemon keeps serving


def test_journal_reads_in_chunks_up_to_the_row_current_at_the_start(daemons):
    srv, c = daemons.start()
    drive(c)
    store = srv.engine.store
    assert [r[0] for r in store.journal(after_id=1, chunk_rows=2)] == [2, 3, 4, 5, 6, 7]
    assert [r[0] for r in store.journal(after_id=0, limit=3, chunk_rows=2)] == [1, 2, 3]
    rows = store.journal(after_id=5, chunk_rows=1)
    assert next(rows)[0] == 6
    c.report_nodes(T0 + 70, "w", 4, idle=["n7"])  # revision 8, after the export began
    assert [r[0] for r in rows] == [7]
    assert [r[:2] for r in store.journal(after_id=7)] == [(8, "nodes")]


# ----------------------------------------------------------------------------- offcut history
def test_history_cli_writes_the_replay_csvs_and_a_report_that_matches_them(daemons, tmp_path):
    srv, c = daemons.start()
    got = drive(c)
    status = c.status()
    out = tmp_path / "hist"
    result = run_cli("history", "--out", str(out), "--address", srv.address)
    assert result.exit_code == 0, result.output

    # steps.csv: the replay's columns, one row per node event, figures of those decisions
    with open(out / "steps.csv") as fh:
        assert next(csv.reader(fh)) == STEP_COLUMNS
    with open(out / "placements.csv") as fh:
        assert next(csv.reader(fh)) == PLACEMENT_COLUMNS
    steps = pd.read_csv(out / "steps.csv")
    node = [d for k, d, _ in got if k in ("nodes", "snapshot")]
    assert len(steps) == len(node) == 4
    assert list(steps["evt"]) == [0, 1, 2, 3]
    for row, d in zip(steps.itertuples(), node):
        s = d.stats
        assert row.evtTime == iso(d.time)
        assert (row.Nleft, row.Npre, row.Njoin, row.nJob, row.nNd, row.nJrun, row.nNrun) == (
            s.nodes_left, s.tasks_preempted, s.nodes_joined, s.admitted_tasks, s.idle_nodes,
            s.running_tasks, s.nodes_in_use)
        assert (row.Thr, row.Rate, row.ReScost, row.PreCost) == pytest.approx(
            (s.progress_samples, s.rate_samples_per_s, s.rescale_cost_samples,
             s.preemption_cost_samples), abs=1e-6)
        assert row.solve_ms == pytest.approx(d.solve.solve_ms, abs=5e-4)
    assert steps["Nleft"].sum() == 2 and steps["PreCost"].sum() > 0  # the preemption is there

    # placements.csv: a submitted row per submission, then every placement change, in order
    expected = []
    for kind, d, task in got:
        if kind == "submit":
            expected.append((task.task_id, "submitted", 0, iso(task.submit_time)))
        expected += [(p.task_id, change_name(p), len(p.nodes), iso(p.time))
                     for p in d.placements]
    plc = pd.read_csv(out / "placements.csv")
    assert list(zip(plc.task_id, plc.change, plc.nodes, plc.time)) == expected
    assert {"submitted", "start", "preempted", "cancelled"} <= set(plc.change)

    # report files, and a summary whose figures are those of the CSVs and of the daemon
    for name in ("report.png", "throughput.png", "decisions.png"):
        assert (out / name).read_bytes()[:8] == PNG
        assert str(out / name) in result.output
    text = (out / "summary.txt").read_text()
    assert text in result.output
    t = [d.time for _, d, _ in got]
    idle_h = held_integral(t, [d.stats.idle_nodes for _, d, _ in got], t[-1]) / 3600
    used_h = held_integral(t, [d.stats.nodes_in_use for _, d, _ in got], t[-1]) / 3600
    assert idle_h == pytest.approx(status.idle_node_seconds / 3600, abs=1e-9)
    assert used_h == pytest.approx(status.used_node_seconds / 3600, abs=1e-9)
    assert 0 < used_h < idle_h
    assert "4 node events (steps.csv rows), 1 took idle nodes back" in text
    assert f"idle {idle_h:.3f}, used {used_h:.3f} (from placements.csv)" in text
    assert f"utilisation {100 * used_h / idle_h:.1f} %" in text
    assert f"{steps['Thr'].sum():.6g} net over node events" in text
    assert "0 of 2 completed" in text and "1 cancelled" in text
    rescales = sum(change_name(p) in ("start", "grow", "shrink", "stop")
                   for _, d, _ in got for p in d.placements)
    preemptions = sum(change_name(p) == "preempted" for _, d, _ in got for p in d.placements)
    assert f"{rescales} rescales (start/grow/shrink/stop), {preemptions} preemptions" in text
    ms = steps.loc[steps["solve_ms"] > 0, "solve_ms"]
    assert f"p50 {np.percentile(ms, 50):.3f}, p99 {np.percentile(ms, 99):.3f}" in text
    assert "period        2020-09-13 12:26:40 -> 2020-09-13 12:27:40 UTC (0.017 h)" in text


def test_history_after_revision_skips_earlier_entries(daemons, tmp_path):
    srv, c = daemons.start()
    got = drive(c)
    out = tmp_path / "late"
    result = run_cli("history", "--out", str(out), "-a", srv.address, "--after-revision", "4")
    assert result.exit_code == 0, result.output
    assert "exported revisions 5..7: 2 node events" in result.output
    steps = pd.read_csv(out / "steps.csv")
    later = [d for k, d, _ in got[4:] if k == "nodes"]
    assert list(steps["evt"]) == [0, 1]
    assert list(steps["evtTime"]) == [iso(d.time) for d in later]
    assert list(steps["nNd"]) == [d.stats.idle_nodes for d in later]
    plc = pd.read_csv(out / "placements.csv")
    assert "submitted" not in set(plc.change)  # both submissions were before revision 5
    assert len(plc) == sum(len(d.placements) for _, d, _ in got[4:])
    # the history starts mid-run: used node-hours come from steps.csv's nNrun
    assert "(from steps.csv)" in (out / "summary.txt").read_text()

    result = run_cli("history", "--out", str(tmp_path / "none"), "-a", srv.address,
                     "--after-revision", "7")
    assert result.exit_code == 1
    assert "no events after revision 7" in result.output and "Traceback" not in result.output


def test_history_failure_keeps_an_earlier_export(daemons, tmp_path):
    srv, c = daemons.start()
    drive(c)
    out = tmp_path / "h"
    assert run_cli("history", "--out", str(out), "-a", srv.address).exit_code == 0
    before = (out / "steps.csv").read_text()
    result = run_cli("history", "--out", str(out), "-a", f"unix://{tmp_path}/nobody.sock")
    assert result.exit_code == 1 and "cannot reach offcutd" in result.output
    assert (out / "steps.csv").read_text() == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".history-")] == []


def test_export_of_a_replayed_daemon_equals_the_replay_csvs(daemons, tmp_path):
    """A replay driving a daemon and the export of that daemon's journal write the same
    steps.csv and placements.csv (one writer); the replay writes its report and summary.txt."""
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay
    from offcut.replay.synth import demo_data_dir

    srv, _ = daemons.start()
    data = demo_data_dir()
    replay_out, export_out = tmp_path / "replay", tmp_path / "export"
    s = run_replay(load_node_log(data, skip_rows=0), load_task_set(data), replay_out,
                   ReplayOptions(solver="dp", max_events=40, target=srv.address, progress=False))
    assert s["events"] == 40
    for name in ("report.png", "throughput.png", "decisions.png"):
        assert (replay_out / name).read_bytes()[:8] == PNG
    text = (replay_out / "summary.txt").read_text()
    assert "41 node events (steps.csv rows)" in text  # + the initial snapshot
    assert "stop_reason max_events" in text and "solver dp" in text
    result = run_cli("history", "--out", str(export_out), "-a", srv.address)
    assert result.exit_code == 0, result.output
    for name in ("steps.csv", "placements.csv"):
        assert (export_out / name).read_text() == (replay_out / name).read_text(), name
    assert not (export_out / "summary.json").exists()


# ----------------------------------------------------------------------------- offcut report
def _write_csvs(folder: Path, numeric_times: bool = False) -> pd.DataFrame:
    folder.mkdir(parents=True, exist_ok=True)
    t = np.array([0.0, 60.0, 180.0, 600.0])
    times = list(t) if numeric_times else [iso(T0 + x) for x in t]
    steps = pd.DataFrame({
        "evtTime": times, "Thr": [0.0, 100.0, 250.0, 900.0], "Rate": [0.0, 2.0, 3.0, 1.5],
        "ReScost": [0.0, 5.0, 0.0, 1.0], "evt": range(4), "Nleft": [0, 0, 2, 0],
        "Npre": [0, 0, 1, 0], "Njoin": [4, 2, 0, 1], "nJob": 1, "nNd": [4, 6, 4, 5],
        "nJrun": 1, "nNrun": [0, 4, 2, 2], "PreCost": [0.0, 0.0, 7.5, 0.0],
        "solve_ms": [0.0, 0.25, 0.5, 1.0]})
    steps.to_csv(folder / "steps.csv", index=False)
    pt = [0.0, 60.0, 180.0, 600.0]
    pd.DataFrame({
        "time": pt if numeric_times else [iso(T0 + x) for x in pt],
        "task_id": "t000001", "task_name": "a", "change": ["submitted", "start", "preempted", "completed"],
        "nodes": [0, 4, 2, 0], "work_done_samples": [0.0, 0.0, 400.0, 1000.0],
        "total_work_samples": 1000.0}).to_csv(folder / "placements.csv", index=False)
    return steps


@pytest.mark.parametrize("numeric_times", [False, True])
def test_report_cli_renders_plots_and_summary(tmp_path, numeric_times):
    out = tmp_path / "r"
    _write_csvs(out, numeric_times)
    result = run_cli("report", str(out))
    assert result.exit_code == 0, result.output
    text = (out / "summary.txt").read_text()
    assert text in result.output
    # idle: 4*60 + 6*120 + 4*420 node-s; used: the task held 4 nodes 120 s, 2 nodes 420 s
    assert "idle 0.733, used 0.367 (from placements.csv), utilisation 50.0 %" in text
    assert "4 node events (steps.csv rows), 1 took idle nodes back" in text
    assert "1250 net over node events" in text and "lost to rescales 6, to preemptions 7.5" in text
    assert "1 of 1 completed (1000 samples of work), 0 cancelled" in text
    assert "1 rescales (start/grow/shrink/stop), 1 preemptions" in text
    assert f"p50 0.500, p99 {np.percentile([0.25, 0.5, 1.0], 99):.3f}, max 1.000 (3 node events" in text
    assert "(0.167 h)" in text
    for name in ("report.png", "throughput.png", "decisions.png", "timeline.png"):
        assert (out / name).read_bytes()[:8] == PNG and str(out / name) in result.output


def test_the_timeline_holds_each_tasks_nodes_and_preemptions(tmp_path):
    """timeline.png's lanes: nodes held over time per task, preemptions, node-hours; the
    task with the most node-hours first."""
    from offcut.replay.report import _load, task_timelines

    out = tmp_path / "r"
    _write_csvs(out, numeric_times=True)
    plc = pd.read_csv(out / "placements.csv")
    extra = pd.DataFrame({"time": [100.0, 160.0], "task_id": "t000002", "task_name": "b",
                          "change": ["start", "completed"], "nodes": [1, 0],
                          "work_done_samples": [0.0, 10.0], "total_work_samples": 10.0})
    pd.concat([plc, extra]).to_csv(out / "placements.csv", index=False)
    steps, plc, _ = _load(out)
    a, b = task_timelines(plc, end_s=600.0)
    assert (a.key, a.label, a.times, a.nodes) == ("t000001", "a", [0.0, 60.0, 180.0, 600.0],
                                                   [0, 4, 2, 0])
    assert a.preempted == [180.0] and b.preempted == []
    assert a.node_hours == pytest.approx((4 * 120 + 2 * 420) / 3600)
    assert (b.key, b.nodes) == ("t000002", [1, 0]) and b.node_hours == pytest.approx(60 / 3600)
    assert task_timelines(plc.iloc[0:0], 600.0) == []


def test_report_uses_summary_json_facts(tmp_path):
    out = tmp_path / "r"
    _write_csvs(out)
    (out / "summary.json").write_text('{"stop_reason": "all tasks done", "solver": "dp", "events": 3}')
    rep = build_report(out)
    assert [f.name for f in rep.files] == list(REPORT_FILES)
    assert rep.figures["events"] == 4 and rep.figures["tasks_completed"] == 1
    assert rep.figures["replay"] == {"stop_reason": "all tasks done", "solver": "dp"}
    assert "replay        stop_reason all tasks done; solver dp (summary.json)" in rep.text
    assert rep.summary_path.read_text() == rep.text
    assert render_report(out) == out / "report.png"  # the older entry point still works
    (out / "summary.json").write_text("{not json")
    result = run_cli("report", str(out))
    assert result.exit_code == 2 and "summary.json: not valid JSON" in result.output


@pytest.mark.parametrize("breakage, needle", [
    ("missing-folder", "no such folder"),
    ("no-steps", "steps.csv: replay steps not found"),
    ("drop-nNd", "steps.csv: replay steps lacks column(s) nNd"),
    ("text-in-nNrun", "steps.csv: column 'nNrun' must be numeric (line 3: 'many')"),
    ("empty-Rate", "steps.csv: column 'Rate' has an empty value (line 2)"),
    ("bad-time", "steps.csv: column 'evtTime': bad time"),
    ("ragged", "steps.csv: cannot read replay steps: ParserError"),
    ("bad-nodes", "placements.csv: column 'nodes' must be numeric"),
    ("no-rows", "steps.csv: replay steps table has no rows"),
])
def test_bad_report_input_is_one_line_and_exit_2(tmp_path, breakage, needle):
    out = tmp_path / "r"
    steps = _write_csvs(out)
    if breakage == "missing-folder":
        out = tmp_path / "nowhere"
    elif breakage == "no-steps":
        (out / "steps.csv").unlink()
    elif breakage == "drop-nNd":
        steps.drop(columns=["nNd"]).to_csv(out / "steps.csv", index=False)
    elif breakage == "text-in-nNrun":
        steps.astype({"nNrun": object}).assign(nNrun=[0, "many", 2, 2]).to_csv(out / "steps.csv", index=False)
    elif breakage == "empty-Rate":
        steps.assign(Rate=[None, 2.0, 3.0, 1.5]).to_csv(out / "steps.csv", index=False)
    elif breakage == "bad-time":
        steps.assign(evtTime=["yesterday"] * 4).to_csv(out / "steps.csv", index=False)
    elif breakage == "ragged":
        with open(out / "steps.csv", "a") as fh:
            fh.write("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16\n")
    elif breakage == "bad-nodes":
        plc = pd.read_csv(out / "placements.csv")
        plc.astype({"nodes": object}).assign(nodes=["x", 4, 2, 0]).to_csv(out / "placements.csv", index=False)
    elif breakage == "no-rows":
        steps.iloc[:0].to_csv(out / "steps.csv", index=False)
    result = run_cli("report", str(out))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("offcut: "), result.output
    assert needle in lines[0]
    assert not (out / "summary.txt").exists()

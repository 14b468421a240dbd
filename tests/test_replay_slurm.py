"""A site's own node log from Slurm's accounting (offcut.replay.slurm_log, ``offcut replay
slurm``): hand-made accounting, and the real site test cluster's, whose idle intervals must
be those the watcher saw live."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from offcut.replay.bftrainer_data import ReplayInputError
from offcut.replay.slurm_log import (node_log_from_sacct, read_node_log_from_sacct,
                                     sacct_command)

T0 = pd.Timestamp("2026-11-27T04:00:00")
S0 = T0.value / 1e9


def rows(*jobs: tuple) -> str:
    return "".join(f"{i}|job{i}|{p}|COMPLETED|{nodes}|{start}|{end}\n"
                   for i, (p, nodes, start, end) in enumerate(jobs, start=1))


def intervals(log) -> dict[str, list[tuple[float, float | None]]]:
    """node -> busy intervals [s from the log's start] of a node log (None: still busy at its
    end)."""
    origin = log.initial_time.value / 1e9
    busy = {n: None for n in log.node_names}
    out = {n: [] for n in log.node_names}
    for n in log.node_names:
        if n not in log.initial_idle:
            busy[n] = 0.0
    for ch in log.events():
        t = ch.time.value / 1e9 - origin
        for n in ch.became_busy:
            busy[n] = t
        for n in ch.became_idle:
            out[n].append((busy[n], t))
            busy[n] = None
    for n, b in busy.items():
        if b is not None:
            out[n].append((b, None))
    return out


def test_busy_is_where_jobs_ran_outside_the_scavenger_partitions():
    text = rows(("batch", "n[1-2]", S0 - 60, S0 + 30),       # running at the start
                ("batch", "n2", S0 + 20, S0 + 50),           # overlaps on n2
                ("scavenger", "n3", S0 + 10, S0 + 40),       # Offcut's own: n3 stays idle
                ("batch", "n3", S0 + 100, "Unknown"),        # still running at the end
                ("batch", "None assigned", "Unknown", "Unknown"),  # never started
                ("batch", "n9", S0 + 5, S0 + 6))             # not a replayed node
    log = node_log_from_sacct(text, ["n1", "n2", "n3"], T0, T0 + pd.Timedelta(seconds=200))
    assert log.initial_idle == ["n3"] and log.initial_time == T0
    assert intervals(log) == {"n1": [(0.0, 30.0)], "n2": [(0.0, 50.0)], "n3": [(100.0, None)]}
    assert log.num_events == 3
    others = node_log_from_sacct(text, ["n3"], T0, T0 + pd.Timedelta(seconds=200),
                                 own_partitions=())
    assert intervals(others) == {"n3": [(10.0, 40.0), (100.0, None)]}


@pytest.mark.parametrize("text,needle", [
    ("1|a|batch|COMPLETED|n1|5\n", "line 1: 6 columns"),
    ("1|a|batch|COMPLETED|n1|5|6\n2|a|batch|COMPLETED|n1|2026-11-27T04:00:00|7\n",
     "line 2: start '2026-11-27T04:00:00'"),
    ("1|a|batch|COMPLETED|n[1-|5|6\n", r"node list 'n\[1-'"),
])
def test_malformed_accounting_names_the_line(text, needle):
    with pytest.raises(ReplayInputError, match=needle):
        node_log_from_sacct(text, ["n1"], T0, T0 + pd.Timedelta(seconds=10), source="x.sacct")


def test_the_replay_of_the_site_clusters_accounting_matches_what_the_watcher_saw(slurm_site):
    """A scripted workload of ordinary sbatch jobs on the real cluster (slurmdbd): the idle
    intervals built from its sacct equal those the watcher's idle rule observed live, within
    Slurm's one-second times plus the polling (0.2 s) and scheduling lag."""
    from offcut.slurm_plugin.slurm_cli import SlurmCLI
    from offcut.slurm_plugin.slurm_json import OwnJobRule
    from offcut.slurm_plugin.sources import CLISource, observe

    cluster = slurm_site
    nodes = ["n1", "n2", "n3"]
    cli = SlurmCLI(slurm_conf=str(cluster.conf))
    source = CLISource(cli)
    cluster.wait_for(lambda: set(observe(source, OwnJobRule()).view.idle) >= set(nodes),
                     timeout=60, what="every node idle")
    start = pd.Timestamp(int(time.time()) - 1, unit="s")
    seen: list[tuple[float, set[str]]] = []
    jobs = [cluster.sbatch("-p", "batch", "-w", "n1", wrap="sleep 4"),
            cluster.sbatch("-p", "scavenger", "-w", "n3", wrap="sleep 3")]
    second = []

    def sample_until_done() -> bool:
        """One live observation of the idle set (every 0.2 s: the watcher's rule); the
        second batch job is submitted 2 s in; done when every job ended and all idle."""
        seen.append((time.time(), set(observe(source, OwnJobRule()).view.idle)))
        if not second and seen[-1][0] - seen[0][0] > 2:
            second.append(cluster.sbatch("-p", "batch", "-w", "n2", wrap="sleep 3"))
        states = [cluster.job_state(j) for j in jobs + second]
        return bool(second) and all(s in ("COMPLETED", "FAILED", "CANCELLED") for s in states) \
            and set(nodes) <= seen[-1][1]

    cluster.wait_for(sample_until_done, timeout=120, interval=0.2,
                     what="the workload's jobs ended, every node idle again")
    end = pd.Timestamp(int(time.time()) + 2, unit="s")
    env = {**os.environ, "SLURM_CONF": str(cluster.conf), "SLURM_TIME_FORMAT": "%s"}

    def accounted() -> str | None:
        """sacct's text once slurmdbd has both batch jobs' end times (it gets the job records
        from slurmctld a moment later), else None."""
        proc = subprocess.run(sacct_command(start, end), env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr
        ended = sum(1 for ln in proc.stdout.splitlines()
                    if "|batch|" in ln and ln.split("|")[6] not in ("Unknown", ""))
        return proc.stdout if ended >= 2 else None

    text = cluster.wait_for(accounted, timeout=60, interval=0.2,
                            what="slurmdbd recorded both batch jobs' ends")
    log = node_log_from_sacct(text, nodes, start, end)
    replayed = intervals(log)
    live: dict[str, list[tuple[float, float | None]]] = {n: [] for n in nodes}
    for n in nodes:
        busy_since = None
        for t, idle in seen:
            if n not in idle and busy_since is None:
                busy_since = t - S_of(start)
            elif n in idle and busy_since is not None:
                live[n].append((busy_since, t - S_of(start)))
                busy_since = None
    # the scavenger job leaves n3 idle; live, the poll may catch it completing (not idle for
    # Slurm until its epilog ran), which the accounting does not record: within the lag only
    assert replayed["n3"] == [] and all(b - a <= 2.0 for a, b in live["n3"]), live["n3"]
    for n in ("n1", "n2"):
        assert len(replayed[n]) == len(live[n]) == 1, (n, replayed, live)
        (r0, r1), (l0, l1) = replayed[n][0], live[n][0]
        assert abs(r0 - l0) <= 2.0 and abs(r1 - l1) <= 2.0, (n, replayed[n], live[n])


def S_of(ts: pd.Timestamp) -> float:
    return ts.value / 1e9


def test_offcut_replay_slurm_replays_the_accounting_with_a_task_set(tmp_path):
    """The CLI: the accounting of four nodes over 6 hours and the bundled demo task set moved
    to the window's start; every node change is an event of the replay."""
    from typer.testing import CliRunner

    from offcut.client.cli import app
    from offcut.replay.synth import demo_data_dir

    hour = 3600
    text = rows(("batch", "n[1-2]", S0, S0 + 2 * hour), ("batch", "n3", S0 + hour, S0 + 5 * hour),
                ("scavenger", "n4", S0, S0 + 6 * hour))
    (tmp_path / "w.sacct").write_text(text)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [
        "replay", "slurm", "--sacct", str(tmp_path / "w.sacct"), "--nodes", "n[1-4]",
        "--start", "2026-11-27T04:00:00", "--end", "2026-11-27T10:00:00",
        "--tasks", str(demo_data_dir()), "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "4 nodes from 2026-11-27 04:00:00 (3 changes in the accounting)" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_nodes"] == 4 and summary["tasks_submitted"] > 0
    steps = pd.read_csv(out / "steps.csv")
    # idle at the start: n4 (its job is a scavenger's); then n1, n2 free at +2 h, n3 busy +1..+5 h
    assert list(steps["nNd"][:4]) == [2, 1, 3, 4]
    bad = CliRunner().invoke(app, [
        "replay", "slurm", "--sacct", str(tmp_path / "w.sacct"), "--nodes", "n[1-",
        "--start", "2026-11-27T04:00:00", "--end", "2026-11-27T10:00:00",
        "--tasks", str(demo_data_dir()), "--out", str(out)])
    assert bad.exit_code == 2 and "--nodes" in bad.output


def test_slurm_convert_writes_the_safe_form_that_replays_the_same_log(tmp_path):
    from typer.testing import CliRunner

    from offcut.client.cli import app
    from offcut.replay.bftrainer_data import load_node_log

    text = rows(("batch", "n[1-2]", S0, S0 + 7200), ("batch", "n3", S0 + 3600, S0 + 18000))
    (tmp_path / "w.sacct").write_text(text)
    res = CliRunner().invoke(app, [
        "replay", "slurm-convert", "--sacct", str(tmp_path / "w.sacct"), "--nodes", "n[1-4]",
        "--start", "2026-11-27T04:00:00", "--end", "2026-11-27T10:00:00",
        "--out", str(tmp_path / "safe")])
    assert res.exit_code == 0, res.output
    assert "4 nodes, 3 changes" in res.output
    direct = node_log_from_sacct(text, ["n1", "n2", "n3", "n4"], T0,
                                 T0 + pd.Timedelta(hours=6))
    stored = load_node_log(tmp_path / "safe", skip_rows=0)
    assert stored.node_names == direct.node_names and stored.initial_time == T0
    assert sorted(stored.initial_idle) == sorted(direct.initial_idle) == ["n3", "n4"]
    assert intervals(stored) == intervals(direct)


# ----------------------------------------------------------------------------- sacct --json
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm_accounting"
CAPTURED = ["n1", "n2", "n3"]


def captured_window() -> tuple[pd.Timestamp, pd.Timestamp]:
    a, b = map(int, (FIXTURES / "window.txt").read_text().split())
    return pd.Timestamp(a, unit="s"), pd.Timestamp(b, unit="s")


def fixture_log(name: str, events: str | None = None):
    t0, t1 = captured_window()
    return read_node_log_from_sacct(FIXTURES / name, CAPTURED, t0, t1,
                                    events_path=FIXTURES / events if events else None)


#: the captured workload's busy intervals [s from the window's start] (README there): n1 runs
#: "first" then "pair" back to back, n2 "pair", n3 only a scavenger job, then "running" until
#: the end; the cancelled pending job holds nothing
CAPTURED_BUSY = {"n1": [(4.0, 12.0)], "n2": [(9.0, 12.0)], "n3": [(13.0, None)]}


@pytest.mark.parametrize("name", ["workload-22.05.json", "workload-24.05-handmade.json"])
def test_sacct_json_of_two_releases_gives_the_text_forms_intervals(name):
    """22.05's real sacct --json (openapi dbv0.0.38) and 24.05's (data_parser v0.0.41, made
    by hand from its source: state lists, {"set", "infinite", "number"} numbers) of the same
    workload build the node log the text form builds."""
    text = fixture_log("workload.sacct")
    log = fixture_log(name)
    assert intervals(text) == CAPTURED_BUSY
    assert intervals(log) == intervals(text)
    assert log.initial_idle == text.initial_idle == CAPTURED
    assert log.num_events == text.num_events == 4


def test_sacct_json_reads_times_as_slurm_number_objects():
    """Times spelled {"set", "infinite", "number"} (as 23.02+ spells most numbers) read like
    plain ones; unset start: never ran; unset end: still running."""
    def job(jid, nodes, start, end, partition="batch"):
        return {"job_id": jid, "partition": partition, "nodes": nodes,
                "state": {"current": ["COMPLETED"]}, "time": {"start": start, "end": end}}

    def obj(n, is_set=True):
        return {"set": is_set, "infinite": False, "number": n}
    doc = {"jobs": [job(1, "n[1-2]", obj(S0 + 10), obj(S0 + 20)),
                    job(2, "n3", obj(S0 + 5), obj(0, False)),
                    job(3, "None assigned", obj(0, False), obj(0, False)),
                    job(4, "n1", S0 + 30, S0 + 40, partition="scavenger")],
           "errors": [], "warnings": []}
    log = node_log_from_sacct(json.dumps(doc), ["n1", "n2", "n3"], T0,
                              T0 + pd.Timedelta(seconds=100))
    assert intervals(log) == {"n1": [(10.0, 20.0)], "n2": [(10.0, 20.0)], "n3": [(5.0, None)]}


def _jobs(*records) -> str:
    return json.dumps({"jobs": list(records), "errors": []})


_GOOD = {"job_id": 7, "partition": "batch", "nodes": "n1", "time": {"start": S0, "end": S0 + 1}}


@pytest.mark.parametrize("text,needle", [
    # truncated: the parse position, and that the file ends there
    ((FIXTURES / "workload-22.05.json").read_text()[:5000],
     r"x.json: not readable JSON at line 304 column 5 \(character 4994 of 5000\).*"
     r"the file looks truncated: it breaks off in record 1$"),  # (before its job_id)
    ((FIXTURES / "workload-22.05.json").read_text()[:12000],
     r"breaks off in record 3 \(job 4\)"),
    ('{"jobs": [1, }', r"x.json: not readable JSON at line 1 column 14 \(character 13 of 14\)"),
    ('{"meta": {}}', r"x.json: not sacct --json output"),
    # 22.05's sacct --json under SLURM_TIME_FORMAT=%s (seen on the test cluster; exit 0)
    ('{"meta": {}, "errors": [{"description": "Unable to parse time format", "error_number": '
     '9000, "error": "Query empty or not RFC7320 compliant", "source": "start_time"}]}',
     "x.json: sacct reported errors: Query empty or not RFC7320 compliant"),
    (_jobs(_GOOD, "oops"), "x.json record 1: a job record is an object, not str"),
    (_jobs(_GOOD, {"job_id": 8, "partition": "batch", "nodes": "n1"}),
     r"x.json record 1 \(job 8\): no \"time\" object"),
    (_jobs(dict(_GOOD, nodes="n[1-")), r"x.json record 0 \(job 7\): malformed node list 'n\[1-'"),
    (_jobs(dict(_GOOD, nodes=["n1"])), r"x.json record 0 \(job 7\): \"partition\" and \"nodes\""),
    (_jobs(dict(_GOOD, time={"start": "soon", "end": 5})),
     r"x.json record 0 \(job 7\): time/start 'soon' is not a number"),
    (_jobs(dict(_GOOD, time={"start": -5, "end": 5})),
     r"x.json record 0 \(job 7\): time/start -5 is not a time"),
    # a hostile hostlist is refused before it is expanded
    ("1|a|batch|COMPLETED|n[1-99999999]|5|6\n", r"x.json line 1: node list 'n\[1-99999999\]' names 99999999 nodes \(limit"),
])
def test_malformed_or_truncated_sacct_json_names_the_record_or_position(text, needle):
    with pytest.raises(ReplayInputError, match=needle):
        node_log_from_sacct(text, ["n1"], T0, T0 + pd.Timedelta(seconds=10), source="x.json")


# ----------------------------------------------------------------------------- node events
def events(*rows_: tuple) -> str:
    return "".join(f"{nodes}|{start}|{end}|{state}\n" for nodes, start, end, state in rows_)


def test_down_or_drained_nodes_are_not_idle():
    """Node events (sacctmgr show event) make their nodes unavailable: a hostlist expands, an
    event open at the query lasts to the window's end, one from before the start holds the
    node at the start, overlapping a job it extends the busy time; cluster events (no node)
    are skipped."""
    jobs = rows(("batch", "n1", S0 + 10, S0 + 30))
    ev = events(("n[1-2]", S0 + 20, S0 + 40, "DOWN"),   # overlaps n1's job
                ("n3", S0 - 100, S0 + 15, "DRAIN"),     # from before the window
                ("n4", S0 + 50, "Unknown", "IDLE+DRAIN"),  # still drained at the query
                ("", S0 - 500, "Unknown", ""))           # a cluster event
    nodes = ["n1", "n2", "n3", "n4"]
    log = node_log_from_sacct(jobs, nodes, T0, T0 + pd.Timedelta(seconds=100), events=ev)
    assert log.initial_idle == ["n1", "n2", "n4"]
    assert intervals(log) == {"n1": [(10.0, 40.0)], "n2": [(20.0, 40.0)], "n3": [(0.0, 15.0)],
                              "n4": [(50.0, None)]}
    without = node_log_from_sacct(jobs, nodes, T0, T0 + pd.Timedelta(seconds=100))
    assert intervals(without) == {"n1": [(10.0, 30.0)], "n2": [], "n3": [], "n4": []}


@pytest.mark.parametrize("text,needle", [
    ("n1|5|6\n", r"w.events line 1: 3 columns, expected 4"),
    ("n1|5|6|DOWN\nn2|2026-11-27T04:00:00|7|DOWN\n",
     r"w.events line 2: TimeStart '2026-11-27T04:00:00' is not epoch seconds"),
    ("n[1-|5|6|DOWN\n", r"w.events line 1: malformed node list 'n\[1-'"),
    ("n1|Unknown|6|DOWN\n", r"w.events line 1: a node event without TimeStart"),
])
def test_malformed_events_name_the_line(text, needle):
    with pytest.raises(ReplayInputError, match=needle):
        node_log_from_sacct("", ["n1"], T0, T0 + pd.Timedelta(seconds=10), events=text,
                            events_source="w.events")


def test_the_captured_drain_makes_n2_unavailable():
    """The real 22.05 capture: n2 drained while idle for 3 s (its node event) is busy then,
    with the text and the JSON accounting alike."""
    for name in ("workload.sacct", "workload-22.05.json", "workload-24.05-handmade.json"):
        log = fixture_log(name, "workload.events")
        assert intervals(log) == dict(CAPTURED_BUSY, n2=[(2.0, 5.0), (9.0, 12.0)]), name


def test_offcut_replay_slurm_convert_reads_json_and_events(tmp_path):
    from typer.testing import CliRunner

    from offcut.client.cli import app
    from offcut.replay.bftrainer_data import load_node_log

    t0, t1 = captured_window()
    args = ["replay", "slurm-convert", "--sacct", str(FIXTURES / "workload-22.05.json"),
            "--events", str(FIXTURES / "workload.events"), "--nodes", "n[1-3]",
            "--start", t0.isoformat(), "--end", t1.isoformat()]
    res = CliRunner().invoke(app, args + ["--out", str(tmp_path / "safe")])
    assert res.exit_code == 0, res.output
    assert "3 nodes, 6 changes" in res.output
    stored = load_node_log(tmp_path / "safe", skip_rows=0)
    assert intervals(stored) == dict(CAPTURED_BUSY, n2=[(2.0, 5.0), (9.0, 12.0)])
    (tmp_path / "bad.events").write_text("n2|1|2|DRAIN\nn2|x|2|DRAIN\n")
    bad = CliRunner().invoke(app, args[:5] + [str(tmp_path / "bad.events")] + args[6:]
                             + ["--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "bad.events line 2: TimeStart 'x'" in bad.output
    assert not (tmp_path / "bad").exists()


def test_a_node_drained_during_the_workload_is_not_idle_in_the_replay(slurm_site):
    """The real cluster (slurmdbd): n3 drained for ~3 s while a batch job runs on n1. The node
    events of sacctmgr make n3 busy from its drain to its resume as sinfo saw them (within
    Slurm's one-second times and the polling), the JSON and the text accounting build the same
    log, and without the events n3 stays idle."""
    from offcut.replay.slurm_log import sacct_json_command, sacctmgr_events_command

    cluster = slurm_site
    nodes = ["n1", "n2", "n3"]
    cluster.wait_for(lambda: all(s == "idle" for s in cluster.node_states().values()),
                     timeout=60, interval=0.2, what="every node idle")
    start = pd.Timestamp(int(time.time()) - 1, unit="s")
    job = cluster.sbatch("-p", "batch", "-w", "n1", wrap="sleep 3")
    try:
        drain_sent = time.time()
        cluster.scontrol("update", "nodename=n3", "state=drain", "reason=replay-test")
        drained = cluster.wait_for(lambda: "drain" in cluster.node_states()["n3"] and time.time(),
                                   timeout=30, what="n3 drained")
        cluster.wait_for(lambda: time.time() > drained + 3, timeout=10,
                         what="3 s of drain (the workload, not a synchronisation)")
    finally:
        resume_sent = time.time()
        cluster.scontrol("update", "nodename=n3", "state=resume")
    resumed = cluster.wait_for(lambda: cluster.node_states()["n3"] == "idle" and time.time(),
                               timeout=30, what="n3 resumed")
    cluster.wait_for(lambda: cluster.job_state(job) in ("COMPLETED", "UNKNOWN"), timeout=60,
                     what="the job done")
    end = pd.Timestamp(int(time.time()) + 2, unit="s")
    env = {**cluster.env, "SLURM_TIME_FORMAT": "%s"}

    def run(argv, env=env):  # (sacct --json of 22.05 fails under SLURM_TIME_FORMAT=%s)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, (argv, proc.stderr)
        return proc.stdout

    def recorded():  # slurmdbd gets the job's end and the event's end a moment later
        out = run(sacct_json_command(start, end), cluster.env), \
            run(sacct_command(start, end)), run(sacctmgr_events_command(start, end))
        ended = [j for j in json.loads(out[0]).get("jobs", []) if j["time"]["end"]]
        closed = [ln for ln in out[2].splitlines() if ln.startswith("n3|")
                  and not ln.split("|")[2] in ("", "Unknown")]
        return out if ended and closed else None
    js, text, ev = cluster.wait_for(recorded, timeout=60, interval=0.5,
                                    what="the job and the event in the accounting")
    from_json = intervals(node_log_from_sacct(js, nodes, start, end, events=ev))
    assert intervals(node_log_from_sacct(text, nodes, start, end, events=ev)) == from_json
    assert from_json["n2"] == [] and len(from_json["n1"]) == 1
    (b0, b1), = from_json["n3"]
    # each change happened after its command was sent and before sinfo showed it (polling on
    # a loaded machine shows it late); Slurm's times are whole seconds
    s0 = S_of(start)
    assert drain_sent - s0 - 1 <= b0 <= drained - s0 + 1 \
        and resume_sent - s0 - 1 <= b1 <= resumed - s0 + 1, \
        (from_json["n3"], (drain_sent - s0, drained - s0), (resume_sent - s0, resumed - s0), ev)
    assert intervals(node_log_from_sacct(js, nodes, start, end))["n3"] == []


def test_accounting_naming_too_many_nodes_in_all_is_refused(monkeypatch):
    # each hostlist is bounded (MAX_NODES); so is their sum over the file, whose expansion
    # a hostile file could otherwise make as long as it likes
    import offcut.replay.slurm_accounting as accounting

    monkeypatch.setattr(accounting, "MAX_EXPANDED_NODES", 250)
    text = rows(*[("batch", "n[1-100]", S0 + 1 + 3 * i, S0 + 2 + 3 * i) for i in range(3)])
    with pytest.raises(ReplayInputError, match=r"line 3: .*more than 250 nodes in all"):
        node_log_from_sacct(text, ["n1"], T0, T0 + pd.Timedelta(seconds=10), source="x.sacct")
    assert node_log_from_sacct(rows(*[("batch", "n[1-100]", S0 + 1 + 3 * i, S0 + 2 + 3 * i)
                                      for i in range(2)]), ["n1"], T0,
                               T0 + pd.Timedelta(seconds=10)).num_events == 4


def test_the_accounting_commands_give_the_window_in_the_hosts_local_time(monkeypatch):
    # Slurm reads --starttime / Start= in the host's time zone; the window is UTC
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        from offcut.replay.slurm_log import sacct_json_command, sacctmgr_events_command

        end = T0 + pd.Timedelta(hours=1)
        assert "--starttime=2026-11-27T05:00:00" in sacct_command(T0, end)  # UTC+1 in November
        assert "--endtime=2026-11-27T06:00:00" in sacct_json_command(T0, end)
        assert "Start=2026-11-27T05:00:00" in sacctmgr_events_command(T0, end)
    finally:
        monkeypatch.undo()
        time.tzset()

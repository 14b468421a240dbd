"""A site's own node log from Slurm's accounting (offcut.replay.slurm_log, ``offcut replay
slurm``): hand-made accounting, and the real site test cluster's, whose idle intervals must
be those the watcher saw live."""

from __future__ import annotations

import os
import subprocess
import time

import pandas as pd
import pytest

from offcut.replay.bftrainer_data import ReplayInputError
from offcut.replay.slurm_log import node_log_from_sacct, sacct_command

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
    deadline = time.monotonic() + 120
    second = None
    while time.monotonic() < deadline:
        seen.append((time.time(), set(observe(source, OwnJobRule()).view.idle)))
        if second is None and seen[-1][0] - seen[0][0] > 2:
            jobs.append(cluster.sbatch("-p", "batch", "-w", "n2", wrap="sleep 3"))
            second = True
        states = [cluster.job_state(j) for j in jobs]
        if second and all(s in ("COMPLETED", "FAILED", "CANCELLED") for s in states) \
                and set(nodes) <= seen[-1][1]:
            break
        time.sleep(0.2)
    end = pd.Timestamp(int(time.time()) + 2, unit="s")
    env = {**os.environ, "SLURM_CONF": str(cluster.conf), "SLURM_TIME_FORMAT": "%s"}
    text = ""
    for _ in range(50):  # slurmdbd gets the job records from slurmctld a moment later
        proc = subprocess.run(sacct_command(start, end), env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        if sum(1 for ln in text.splitlines() if "|batch|" in ln and ln.split("|")[6]
               not in ("Unknown", "")) >= 2:
            break
        time.sleep(0.2)
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
    assert replayed["n3"] == [] and live["n3"] == []  # the scavenger job leaves n3 idle
    for n in ("n1", "n2"):
        assert len(replayed[n]) == len(live[n]) == 1, (n, replayed, live)
        (r0, r1), (l0, l1) = replayed[n][0], live[n][0]
        assert abs(r0 - l0) <= 2.0 and abs(r1 - l1) <= 2.0, (n, replayed[n], live[n])


def S_of(ts: pd.Timestamp) -> float:
    return ts.value / 1e9


def test_offcut_replay_slurm_replays_the_accounting_with_a_task_set(tmp_path):
    """The CLI: the accounting of four nodes over 6 hours and the bundled demo task set moved
    to the window's start; every node change is an event of the replay."""
    import json

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

"""Offcut's hooks and watcher on a real Slurm 22.05 cluster (4 nodes, started and stopped by
tests/slurm_cluster.py; SKIPPED with the reason when Slurm is not installed or not root).

Every test submits real jobs: PrologSlurmctld / EpilogSlurmctld run Offcut's wrappers in
Slurm's bare environment, and the daemon's view (idle pool, task placements) is checked."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time

import hostlist
import pytest

from offcut.client import make_task_spec
from offcut.v1 import tasks_pb2


import slurm_cluster as _sc  # the fixtures themselves come from conftest.py
from offcut.views import TaskState
from slurm_cluster import idle_set

pytestmark = pytest.mark.slow
ALL = ["n1", "n2", "n3", "n4"]


def with_idle_pool(client, nodes=ALL) -> None:
    client.sync_nodes(time.time(), "test-setup", 1, idle=nodes)
    assert idle_set(client) == set(nodes)


def submit_task(client, name="elastic") -> str:
    spec = make_task_spec(name, nodes="1-4", work_samples=1e12,
                          scalability=([1, 2, 3, 4], [10.0, 19.0, 27.0, 34.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0)
    return client.submit(spec, owner="test").task.task_id


def task_nodes(client, task_id) -> set[str]:
    return set(client.get_task(task_id).nodes)


def watch_once(cluster, client, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "offcut.slurm_plugin.cli", "watch", "--once", "--address",
         client.address, "--slurm-conf", str(cluster.conf), "--log-level", "debug", *args],
        capture_output=True, text=True, timeout=60, env=cluster.env)


def test_prolog_preempts_exactly_the_jobs_nodes_and_the_job_runs(slurm, cluster_daemon):
    srv, client = cluster_daemon
    with_idle_pool(client)
    tid = submit_task(client)
    assert task_nodes(client, tid) == set(ALL)
    t0 = time.monotonic()
    jid = slurm.sbatch("-N2", wrap="echo ran on $SLURM_JOB_NODELIST; sleep 2")
    slurm.wait_state(jid, {"RUNNING", "COMPLETING", "COMPLETED"})
    to_running = time.monotonic() - t0
    lines = slurm.wait_hook("prolog", jid)
    job_nodes = set(hostlist.expand_hostlist(slurm.jobs()[jid]["node_list"]))
    assert len(job_nodes) == 2
    # exactly the job's nodes left the pool, and the task lost exactly those
    assert idle_set(client) == set(ALL) - job_nodes
    assert task_nodes(client, tid) == set(ALL) - job_nodes
    task = client.get_task(tid)
    assert task.state == TaskState.RUNNING
    assert any("preempted" in ln and "2 nodes left the idle pool" in ln and "1 tasks preempted" in ln
               for ln in lines), lines
    # the regular job ran to completion, on those nodes
    slurm.wait_state(jid, {"COMPLETED"}, timeout=30)
    assert set(hostlist.expand_hostlist(slurm.output(jid).split()[-1])) == job_nodes
    print(f"\n[slurm] sbatch -> RUNNING with Offcut's prolog: {to_running:.2f} s; "
          f"{[ln.split(': ', 1)[1] for ln in lines if 'done (' in ln]}")


def test_epilog_returns_the_nodes_when_the_job_ends(slurm, cluster_daemon):
    srv, client = cluster_daemon
    with_idle_pool(client)
    tid = submit_task(client)
    jid = slurm.sbatch("-N2", wrap="sleep 1")
    slurm.wait_hook("prolog", jid)
    taken = set(ALL) - idle_set(client)
    assert len(taken) == 2 and task_nodes(client, tid) == set(ALL) - taken
    slurm.wait_state(jid, {"COMPLETED"})
    lines = slurm.wait_hook("epilog", jid)
    assert any("reported idle" in ln and "2 joined" in ln for ln in lines), lines
    assert idle_set(client) == set(ALL)
    # the daemon re-allocated: the task grows back onto every node
    assert task_nodes(client, tid) == set(ALL)


def test_scavenger_job_hooks_send_nothing(slurm, cluster_daemon):
    srv, client = cluster_daemon
    with_idle_pool(client)
    rev = client.status().revision
    jid = slurm.sbatch("-p", "scavenger", "-N2", "-J", "offcut-t1", wrap="sleep 1")
    slurm.wait_state(jid, {"COMPLETED"})
    assert any("done (skipped)" in ln for ln in slurm.wait_hook("prolog", jid))
    assert any("done (skipped)" in ln for ln in slurm.wait_hook("epilog", jid))
    assert client.status().revision == rev
    assert idle_set(client) == set(ALL)


def test_epilog_leaves_out_a_node_drained_while_the_job_ran(slurm, cluster_daemon):
    srv, client = cluster_daemon
    with_idle_pool(client)
    jid = slurm.sbatch("-N2", "-w", "n[3-4]", wrap="sleep 2")
    slurm.wait_hook("prolog", jid)
    assert idle_set(client) == {"n1", "n2"}
    slurm.scontrol("update", "nodename=n4", "state=drain", "reason=offcut-test")
    slurm.wait_state(jid, {"COMPLETED"})
    lines = slurm.wait_hook("epilog", jid)
    assert any("not reporting n4: drain" in ln for ln in lines), lines
    assert idle_set(client) == {"n1", "n2", "n3"}


def test_prolog_with_the_daemon_down_exits_fast_and_the_job_runs(slurm):
    assert not slurm.socket.exists()  # no daemon in this test
    t0 = time.monotonic()
    jid = slurm.sbatch("-N2", wrap="echo ok")
    slurm.wait_state(jid, {"COMPLETED"}, timeout=30)
    took = time.monotonic() - t0
    lines = slurm.wait_hook("prolog", jid)
    assert any("daemon unreachable" in ln for ln in lines), lines
    done = [ln for ln in lines if "done (unreachable)" in ln]
    assert done and float(done[0].rsplit(" in ", 1)[1].split()[0]) < 1000 * _sc.HOOK_TIMEOUT_S
    assert slurm.output(jid).strip() == "ok" and took < 20


def test_prolog_with_a_hanging_daemon_times_out_and_the_job_runs(slurm):
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)  # accepts TCP, never answers gRPC
    try:
        slurm.install_hooks(address=f"127.0.0.1:{hang.getsockname()[1]}", timeout_s=1.0)
        jid = slurm.sbatch("-N1", wrap="echo ok")
        slurm.wait_state(jid, {"COMPLETED"}, timeout=30)
        lines = slurm.wait_hook("prolog", jid)
    finally:
        hang.close()
    assert any("not delivered" in ln for ln in lines), lines
    ms = float([ln for ln in lines if "done (" in ln][0].rsplit(" in ", 1)[1].split()[0])
    assert ms < 2500, ms  # the attempts (retries of UNAVAILABLE included) end within 1 s
    assert slurm.output(jid).strip() == "ok"


def test_watcher_once_on_the_real_cluster(slurm, cluster_daemon):
    """The watcher alone (hooks pointed elsewhere) keeps the daemon's pool equal to Slurm's
    idle nodes: all idle; a regular job's nodes leave; a drained node leaves; a node busy only
    with an Offcut job stays; a node whose Offcut job Slurm is preempting leaves."""
    srv, client = cluster_daemon
    slurm.install_hooks(address="unix:///nonexistent/offcut.sock")

    def snapshot(*args):
        proc = watch_once(slurm, client, *args)
        assert proc.returncode == 0, proc.stderr
        return idle_set(client)

    assert snapshot() == set(ALL)
    assert "pyslurm not used" in watch_once(slurm, client).stderr  # the fallback is logged
    jid = slurm.sbatch("-N2", "-w", "n[1-2]", "--exclusive", wrap="sleep 60")
    slurm.wait_state(jid, {"RUNNING"})
    assert snapshot() == {"n3", "n4"}
    slurm.scontrol("update", "nodename=n4", "state=drain", "reason=offcut-test")
    slurm.wait_for(lambda: slurm.node_states()["n4"] == "drain", what="n4 drained")
    assert snapshot() == {"n3"}
    slurm.scontrol("update", "nodename=n4", "state=resume")
    slurm.wait_for(lambda: slurm.node_states()["n4"] == "idle", what="n4 resumed")
    assert snapshot() == {"n3", "n4"}
    # an Offcut job (scavenger partition, launcher-style name and comment) on n3
    oj = slurm.sbatch("-p", "scavenger", "-w", "n3", "--exclusive", "-J", "offcut-task1",
                      "--comment", "offcut", wrap="sleep 60")
    slurm.wait_state(oj, {"RUNNING"})
    assert slurm.node_states()["n3"] == "alloc"
    assert snapshot() == {"n3", "n4"}
    assert snapshot("--job-name-prefix", "offcut-", "--job-comment", "offcut") == {"n3", "n4"}
    assert snapshot("--job-name-prefix", "someone-else-") == {"n4"}
    # a regular job that needs n3: Slurm decides to preempt the Offcut job (preempt_time set,
    # GraceTime 10 s) and n3 is no longer idle even though the Offcut job still runs
    rj = slurm.sbatch("-N2", "-w", "n[3-4]", "--exclusive", wrap="sleep 1")
    slurm.wait_for(lambda: _sc_preempt_time(slurm, oj), timeout=30, what="preemption decided")
    assert slurm.job_state(oj) in ("RUNNING", "COMPLETING")
    assert snapshot() <= {"n4"}
    assert slurm.job_state(rj) in ("PENDING", "CONFIGURING", "RUNNING")


def _sc_preempt_time(cluster, job_id) -> bool:
    job = cluster.jobs().get(job_id, {})
    pt = job.get("preempt_time", 0)
    return bool(pt.get("number") if isinstance(pt, dict) else pt)


def test_hook_latency_against_a_live_daemon(slurm, cluster_daemon):
    """The wrappers as slurmctld runs them (bare environment), against the live daemon and the
    real cluster: a regular job waits in CONFIGURING for the prolog's time."""
    srv, client = cluster_daemon
    nodes = [f"x{i}" for i in range(20)]
    client.sync_nodes(time.time(), "test-setup", 1, idle=nodes)
    cases = {  # name: (wrapper, partition, node list of run i)
        "prolog, preemption sent": ("prolog_ctld.sh", "batch", lambda i: f"x{i}"),
        "prolog, scavenger job skipped": ("prolog_ctld.sh", "scavenger", lambda i: "n1"),
        "epilog, Slurm check + idle report": ("epilog_ctld.sh", "batch", lambda i: "n[1-2]"),
    }
    times = {}
    for case, (script, part, nodelist) in cases.items():
        runs = []
        for i in range(10):
            env = {"SLURM_JOB_ID": str(9000 + i), "SLURM_JOB_PARTITION": part,
                   "SLURM_JOB_NODELIST": nodelist(i), "SLURM_JOB_USER": "root"}
            t0 = time.perf_counter()
            subprocess.run([str(slurm.hook_dir / script)], env=env, timeout=30, check=True)
            runs.append((time.perf_counter() - t0) * 1000)
        times[case] = runs
    assert idle_set(client) == (set(nodes) - {f"x{i}" for i in range(10)}) | {"n1", "n2"}
    summary = "; ".join(f"{k}: median {statistics.median(v):.0f} ms, max {max(v):.0f} ms"
                        for k, v in times.items())
    print(f"\n[slurm] hook wrapper wall time, 10 runs each: {summary}")
    assert statistics.median(times["prolog, preemption sent"]) < 1500


def test_skip_reason_names_what_is_missing(monkeypatch):
    """Without Slurm, or not as root, the cluster tests skip and say why."""
    monkeypatch.setattr(_sc.shutil, "which", lambda name, path=None: None)
    assert "Slurm is not installed" in _sc.skip_reason() and "apt-get install" in _sc.skip_reason()
    monkeypatch.setattr(_sc.shutil, "which", lambda name, path=None: f"/usr/sbin/{name}")
    monkeypatch.setattr(_sc.os, "geteuid", lambda: 1000)
    assert "must run as root" in _sc.skip_reason()

"""Issue "GPU nodes as they are": several processes per node on the real 4-node Slurm 22.05
cluster of tests/slurm_cluster.py (CPU, gloo), run by the launcher's per-node supervisor
(offcut.slurm_plugin.node_run; docs/execution.md, "Processes per node").

* The digits example with 2 processes per node (world size 8 on four nodes) trains through the
  preemption of two nodes, among them rank 0's (the rendezvous host): a shrink to two nodes
  (world size 4), then a grow back to four; every generation resumes from the latest
  checkpoint; the final accuracy equals an undisturbed run's with the same global batches;
  every process of a job that got the stop signal logs that it received it; no process
  outlives its generation.
* A crash of local rank 1 on one node fails that node's run (the supervisor stops local rank
  0), the generation is restarted, and the task fails after ``max_failed_generations``.

Skipped with the reason without Slurm (or root), torch or scikit-learn."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import hostlist
import pytest

from offcut.client import make_task_spec
from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.launcher import parse_job_name
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from test_elastic_slurm import (ALL, BATCH, WORK, example_argv, generations, job_logs,
                                last_job_id, reported, running, undisturbed_accuracy)

pytestmark = pytest.mark.slow
CFG = SlurmConfig()
PROCS = 2
#: ElasticRun's line as a process exits 75 after the stop signal reached it
EXIT_GOT_SIGNAL_RE = re.compile(r"rank (\d+): exiting 75 \(got SIGUSR1\)")
FORWARD_RE = re.compile(r"offcut node_run: got SIGUSR1, forwarding it to")


def task_processes(checkpoint_dir: Path, training_only: bool = False
                   ) -> dict[int, tuple[int, str]]:
    """pid -> (OFFCUT_GENERATION, OFFCUT_NODE) of every live process of a task's jobs (found by
    their ``OFFCUT_CHECKPOINT_DIR``): the supervisors, the training processes and anything
    they started (only the training processes, the supervisors' children, with
    ``training_only``)."""
    found: dict[int, tuple[int, str, int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().split(") ", 1)[1].split()
            if stat[0] == "Z":
                continue
            env = dict(kv.split("=", 1) for kv in
                       (d / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in kv)
            if env.get("OFFCUT_CHECKPOINT_DIR") != str(checkpoint_dir):
                continue
            cmdline = (d / "cmdline").read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        found[int(d.name)] = (int(env.get("OFFCUT_GENERATION", "0")), env.get("OFFCUT_NODE", ""),
                              int(stat[1]), cmdline)
    supervisors = {pid for pid, f in found.items() if "node_run" in f[3]}
    return {pid: (g, node) for pid, (g, node, ppid, _) in found.items()
            if not training_only or ppid in supervisors}


def process_tree() -> str:
    """``ps`` of the Python and batch processes (for failure messages)."""
    import subprocess
    ps = subprocess.run(["ps", "-eo", "pid,ppid,etimes,args", "--forest"], capture_output=True,
                        text=True).stdout
    return "\n".join(line[:300] for line in ps.splitlines()
                     if "python" in line or "slurmstepd" in line)[-6000:]


def test_two_processes_per_node_train_through_shrink_grow_and_loss_of_rank_0(
        example, slurm, cluster_daemon, tmp_path):
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)
    after = last_job_id(slurm)
    spec = make_task_spec("digits-2ppn", nodes="1-4", work_samples=WORK,
                          scalability=([1, 2, 3, 4], [800.0, 1500.0, 2100.0, 2600.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0,
                          command=example_argv() + ["--min-step-s", "0.1"],
                          reports_progress=True, procs_per_node=PROCS)
    tid = client.submit(spec, owner="test").task.task_id
    ckpt = slurm.task_checkpoints(tmp_path, tid)
    states: set[int] = set()
    stale: list[dict] = []   # processes of a generation found alive after the next one ran
    stale_tree = ""
    with slurm.launcher(client.address, tmp_path) as out:
        # 1. generation 1: four nodes, two processes each
        slurm.wait_for(lambda: running(slurm, tid, after) == {n: 1 for n in ALL}, timeout=90,
                       what="generation 1 running on four nodes")
        slurm.wait_for(lambda: reported(client, tid) > 0, timeout=180,
                       what="a first checkpoint of generation 1")
        procs = slurm.wait_for(
            lambda: (p := task_processes(ckpt, True)) and len(p) == 4 * PROCS and p, timeout=60,
            what="two training processes on each node")
        assert {g for g, _ in procs.values()} == {1}
        assert sorted(n for _, n in procs.values()) == sorted(ALL * PROCS)
        states.add(client.get_task(tid).state)
        # 2. a regular job takes n1 (ranks 0 and 1: the rendezvous host) and n2
        release = tmp_path / "release"
        regular = slurm.sbatch("-N2", "-w", "n[1-2]", "--exclusive",
                               wrap=f'while [ ! -e "{release}" ]; do sleep 0.2; done')
        slurm.wait_state(regular, {"RUNNING"}, timeout=90)
        assert set(hostlist.expand_hostlist(slurm.jobs()[regular]["node_list"])) == {"n1", "n2"}
        shrunk = slurm.wait_for(
            lambda: (r := running(slurm, tid, after)) and set(r) == {"n3", "n4"}
            and set(r.values()) == {client.get_task(tid).generation} and r,
            timeout=120, what="a generation on n3, n4")
        gen_shrunk = shrunk["n3"]
        at_shrink = reported(client, tid)
        slurm.wait_for(lambda: reported(client, tid) > at_shrink, timeout=180,
                       what="a checkpoint of the shrunk generation")
        live = task_processes(ckpt)
        stale += [{pid: v} for pid, v in live.items() if v[0] != gen_shrunk]
        stale_tree = process_tree() if stale else ""
        assert len(task_processes(ckpt, True)) == 2 * PROCS, process_tree()
        states.add(client.get_task(tid).state)
        # 3. the regular job ends: back to four nodes, then complete
        release.touch()
        slurm.wait_state(regular, {"COMPLETED"}, timeout=60)
        slurm.wait_for(lambda: running(slurm, tid, after).keys() == set(ALL)
                       or client.get_task(tid).state == TaskState.COMPLETED,
                       timeout=120, what="the task back on four nodes")
        states.add(client.get_task(tid).state)
        slurm.wait_for(lambda: client.get_task(tid).state == TaskState.COMPLETED,
                       timeout=300, what="the task to complete")
        slurm.wait_for(lambda: not running(slurm, tid, after), timeout=60, what="no running job")
        slurm.wait_for(lambda: not task_processes(ckpt), timeout=60,
                       what="no process of the task left")
    assert not stale, f"processes outlived their generation: {stale}\n{stale_tree}"
    task = client.get_task(tid)
    assert TaskState.FAILED not in states | {task.state}
    assert task.work_done_samples == WORK and task.failed_runs == 0
    gens = generations(slurm, tid, after)
    grown = [g for g, jobs in gens.items() if g > gen_shrunk and set(jobs) == set(ALL)]
    assert grown, f"no four-node generation after the shrink: {sorted(gens)}"

    logs, trained, resumed, final = job_logs(out)
    signalled_jobs = 0
    forwarded = [(parsed, name, text) for name, text in logs.items()
                 if FORWARD_RE.search(text)
                 and (parsed := parse_job_name(CFG, name.rsplit("-", 1)[0]))]
    ran = sorted(trained)
    for parsed, name, text in forwarded:
        if parsed.generation == ran[-1]:
            continue  # the final generation: stopped after the task completed (the launcher)
        # the stop signal reached this node's supervisor: both of its processes say they
        # received it themselves (not only through a peer's flag)
        signalled_jobs += 1
        node_rank = sorted(gens[parsed.generation]).index(parsed.node)
        got = {int(r) for r in EXIT_GOT_SIGNAL_RE.findall(text)}
        assert got == {node_rank * PROCS, node_rank * PROCS + 1}, (name, text[-3000:])
    assert signalled_jobs >= 2 + 2, signalled_jobs  # n1, n2 by Slurm; n3, n4 at the grow
    assert ran[0] == 1 and {w for _, w in trained[1]} == {4 * PROCS}
    assert {w for _, w in trained[gen_shrunk]} == {2 * PROCS}
    assert {w for g in grown for _, w in trained.get(g, [])} <= {4 * PROCS}
    for prev, g in zip(ran, ran[1:]):
        assert resumed[g] == max(s for s, _ in trained[prev]), (g, resumed, trained)
    ckpts = sorted(int(p.stem.split("-")[1])
                   for p in slurm.task_checkpoints(tmp_path, tid).glob("ckpt-*.pt"))
    assert ckpts[-1] == WORK and final is not None and final[1] == WORK
    reference = undisturbed_accuracy(tmp_path)   # 4 ranks: the same global batches of BATCH
    print(f"\n[2 processes per node] generations {ran} (shrunk: {gen_shrunk}, grown: {grown}); "
          f"final test accuracy {final[0]:.2f}% vs {reference:.2f}% undisturbed, "
          f"{WORK} samples in global batches of {BATCH}")
    assert abs(final[0] - reference) <= 1.0


#: a process of ElasticRun that trains nothing; global rank 3 (local rank 1 of the second
#: node) raises at its third step in every generation
CRASHING = (
    "import logging, os, sys, time\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr,\n"
    "                    format='rank ' + os.environ['RANK'] + ': %(message)s')\n"
    "from offcut.client.elastic import ElasticRun\n"
    "with ElasticRun.from_env() as run:\n"
    "    for step in range(1, 10**9):\n"
    "        run.should_stop()\n"
    "        if run.rank == 3 and step == 3:\n"
    "            raise RuntimeError('local rank 1 of node 1 crashes')\n"
    "        time.sleep(0.05)\n")


def test_a_crash_of_local_rank_1_fails_the_run_and_then_the_task(torch, slurm, cluster_daemon,
                                                                 tmp_path):
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    script = tmp_path / "crashing_rank.py"
    script.write_text(CRASHING)
    script.chmod(0o644)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1", "n2"])
    after = last_job_id(slurm)
    spec = make_task_spec("crash", nodes="2", work_samples=1e6,
                          scalability=([1, 2], [10.0, 19.0]), rescale_up_s=0.0,
                          rescale_down_s=0.0, command=[sys.executable, str(script)],
                          reports_progress=True, procs_per_node=PROCS)
    tid = client.submit(spec, owner="test").task.task_id
    with slurm.launcher(client.address, tmp_path) as out:
        slurm.wait_for(lambda: client.get_task(tid).state == TaskState.FAILED,
                       timeout=300, what="the task to fail after its failed runs")
        slurm.wait_for(lambda: not running(slurm, tid, after), timeout=60, what="no running job")
        slurm.wait_for(lambda: not task_processes(slurm.task_checkpoints(tmp_path, tid)),
                       timeout=60,
                       what="no process of the task left")
    task = client.get_task(tid)
    assert task.failed_runs == 3 and "exit code 1" in task.failure_reason, task
    gens = generations(slurm, tid, after)
    assert sorted(gens) == [1, 2, 3], sorted(gens)
    logs = {p.name: p.read_text(errors="replace") for p in out.glob("*.out")}
    crashed = [n for n, text in logs.items()
               if "offcut node_run: local rank 1 failed (exit 1)" in text]
    assert len(crashed) == 3 and all("-n2-" in n for n in crashed), sorted(logs)
    for name in crashed:   # local rank 0 of that node was stopped, not left running
        assert "local rank 1 of node 1 crashes" in logs[name]
    # the other node's processes lost their peers: exit 75 (not failures of the task)
    for name, text in logs.items():
        if "-n1-" in name:
            assert "offcut node_run: local rank" not in text, text[-2000:]

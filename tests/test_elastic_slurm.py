"""Issue "Real elastic training on idle Slurm nodes": the example (a CNN on scikit-learn's
digits, examples/elastic_digits) placed by a real daemon and run by the launcher on the real
4-node Slurm 22.05 cluster of tests/slurm_cluster.py. A regular job preempts two of its
nodes, among them the node of rank 0 (which hosts the generation's rendezvous); the task goes
on on the other two from its checkpoint, grows back to four when the job ends, and
completes. Checked from Slurm's view (squeue --json), the daemon's and the checkpoints'.

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

import elastic_helpers as eh
from offcut.views import TaskState

pytestmark = pytest.mark.slow
ALL = ["n1", "n2", "n3", "n4"]
CFG = SlurmConfig()
WORK = 36_000          # samples (24 passes over the 1,500 training images)
BATCH = 64             # global batch size
EVERY_STEPS = 15       # a checkpoint every 15 steps of a process (960 samples)
#: offcut.client.elastic's log line of every checkpoint rank 0 writes (periodic, stop, final)
CHECKPOINT_RE = re.compile(r"checkpoint ckpt-\d+\.pt: (\d+) samples, generation (\d+), world "
                           r"size (\d+)")
RESUMED_RE = re.compile(r"rank 0: resumed from ckpt-(\d+)\.pt")
ACCURACY_RE = re.compile(r"final test accuracy: ([0-9.]+)% after (\d+) samples")


def example_argv() -> list[str]:
    return [sys.executable, str(eh.EXAMPLE), "--batch-size", str(BATCH),
            "--checkpoint-every-steps", str(EVERY_STEPS), "--checkpoint-every-s", "0",
            "--collective-timeout-s", "30", "--rendezvous-timeout-s", "120"]


def generations(slurm, tid: str, after: int = 0) -> dict[int, dict[str, dict]]:
    """generation -> node -> squeue record of the task's jobs (of job ids above ``after``:
    squeue still shows the ended jobs of an earlier test, whose task may have had the same
    id)."""
    out: dict[int, dict[str, dict]] = {}
    for job_id, j in slurm.jobs().items():
        parsed = parse_job_name(CFG, j.get("name", ""))
        if parsed and parsed.task_id == tid and j.get("partition") == "scavenger" \
                and int(job_id) > after:
            out.setdefault(parsed.generation, {})[parsed.node] = j
    return out


def running(slurm, tid: str, after: int = 0) -> dict[str, int]:
    """node -> generation of the task's running jobs (of job ids above ``after``)."""
    return {n: g for g, jobs in generations(slurm, tid, after).items() for n, j in jobs.items()
            if j["state"] == "RUNNING"}


def last_job_id(slurm) -> int:
    """The highest job id squeue shows (0: none): the jobs of a test have higher ones."""
    return max((int(j) for j in slurm.jobs()), default=0)


def reported(client, tid: str) -> float:
    m = client.get_task(tid).model
    return m.last_samples_done if m.has_report else 0.0


def job_logs(out: Path) -> tuple[dict[str, str], dict[int, list[tuple[int, int]]],
                                 dict[int, int], tuple[float, int] | None]:
    """What the jobs' output files in ``out`` say: (file name -> text; generation ->
    [(samples, world size)] of its checkpoints; generation -> the samples it resumed from;
    (final accuracy [%], samples) or None)."""
    logs = {p.name: p.read_text(errors="replace") for p in out.glob("*.out")}
    trained: dict[int, list[tuple[int, int]]] = {}
    resumed: dict[int, int] = {}
    final = None
    for name, text in logs.items():
        parsed = parse_job_name(CFG, name.rsplit("-", 1)[0])
        for m in CHECKPOINT_RE.finditer(text):
            trained.setdefault(int(m.group(2)), []).append((int(m.group(1)), int(m.group(3))))
        if (m := RESUMED_RE.search(text)) and parsed:
            resumed[parsed.generation] = int(m.group(1))
        if m := ACCURACY_RE.search(text):
            final = (float(m.group(1)), int(m.group(2)))
    return logs, trained, resumed, final


def undisturbed_accuracy(tmp_path: Path) -> float:
    """The same training, 4 ranks, never interrupted (local processes, same arguments)."""
    gen = eh.Generation(4, tmp_path / "undisturbed", tmp_path / "u",
                        example_argv()[2:] + ["--samples", str(WORK)])
    assert gen.wait() == [0, 0, 0, 0], gen.tails()
    accuracy, samples = eh.final_accuracy(gen.ranks[0].out)
    assert samples == WORK
    return accuracy


def test_example_trains_through_preemption_of_rank_0_and_growth(example, slurm, cluster_daemon,
                                                               tmp_path):
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)
    spec = make_task_spec("digits", nodes="1-4", work_samples=WORK,
                          scalability=([1, 2, 3, 4], [800.0, 1500.0, 2100.0, 2600.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0,
                          # paced (>= 0.1 s a step, >= 56 s in all): on a fast machine the
                          # unpaced run could finish on two nodes before the regular job ends
                          command=example_argv() + ["--min-step-s", "0.1"],
                          reports_progress=True)
    tid = client.submit(spec, owner="test").task.task_id
    states: set[int] = set()
    with slurm.launcher(client.address, tmp_path) as out:
        # 1. generation 1 on all four nodes trains and checkpoints
        slurm.wait_for(lambda: running(slurm, tid) == {n: 1 for n in ALL}, timeout=90,
                       what="generation 1 running on four nodes")
        slurm.wait_for(lambda: reported(client, tid) > 0, timeout=120,
                       what="a first checkpoint of generation 1")
        states.add(client.get_task(tid).state)
        # 2. a regular job takes n1 (rank 0, the rendezvous host) and n2
        release = tmp_path / "release"
        regular = slurm.sbatch("-N2", "-w", "n[1-2]", "--exclusive",
                               wrap=f'while [ ! -e "{release}" ]; do sleep 0.2; done')
        slurm.wait_state(regular, {"RUNNING"}, timeout=90)
        assert set(hostlist.expand_hostlist(slurm.jobs()[regular]["node_list"])) == {"n1", "n2"}
        slurm.wait_for(lambda: sorted(client.get_task(tid).nodes) == ["n3", "n4"], timeout=60,
                       what="the task to shrink to n3, n4")
        shrunk = slurm.wait_for(
            lambda: (r := running(slurm, tid)) and set(r) == {"n3", "n4"}
            and set(r.values()) == {client.get_task(tid).generation} and r,
            timeout=90, what="a generation on n3, n4")
        gen_shrunk = shrunk["n3"]
        at_shrink = reported(client, tid)
        slurm.wait_for(lambda: reported(client, tid) > at_shrink, timeout=120,
                       what="a checkpoint of the shrunk generation")
        task = client.get_task(tid)
        states.add(task.state)
        assert task.generation == gen_shrunk and task.failed_runs == 0
        # 3. the regular job ends: the task grows back to four and completes
        release.touch()
        slurm.wait_state(regular, {"COMPLETED"}, timeout=60)
        slurm.wait_for(lambda: running(slurm, tid).keys() == set(ALL)
                       or client.get_task(tid).state == TaskState.COMPLETED,
                       timeout=90, what="the task back on four nodes")
        states.add(client.get_task(tid).state)
        slurm.wait_for(lambda: client.get_task(tid).state == TaskState.COMPLETED,
                       timeout=240, what="the task to complete")
        slurm.wait_for(lambda: not running(slurm, tid), timeout=60, what="no running job")
    task = client.get_task(tid)
    assert TaskState.FAILED not in states | {task.state}
    assert task.work_done_samples == WORK and not task.nodes
    gens = generations(slurm, tid)
    grown = [g for g, jobs in gens.items() if g > gen_shrunk and set(jobs) == set(ALL)]
    assert grown, f"no four-node generation after the shrink: {sorted(gens)}"

    # what each generation did, from the jobs' output (rank 0 prints its checkpoints)
    _, trained, resumed, final = job_logs(out)
    ran = sorted(trained)
    assert ran[0] == 1 and {w for _, w in trained[1]} == {4}
    assert {w for _, w in trained[gen_shrunk]} == {2}
    assert {w for g in grown for _, w in trained.get(g, [])} <= {4}
    # every generation that trained resumed exactly from the last checkpoint written before
    # it: no sample trained twice, none skipped (a stop checkpoint loses nothing)
    for prev, g in zip(ran, ran[1:]):
        assert resumed[g] == max(s for s, _ in trained[prev]), (g, resumed, trained)
    ckpts = sorted(int(p.stem.split("-")[1])
                   for p in slurm.task_checkpoints(tmp_path, tid).glob("ckpt-*.pt"))
    assert ckpts[-1] == WORK and final is not None and final[1] == WORK
    accuracy = final[0]
    reference = undisturbed_accuracy(tmp_path)
    print(f"\n[elastic slurm] generations {ran} (shrunk: {gen_shrunk}, grown: {grown}); final "
          f"test accuracy {accuracy:.2f}% interrupted vs {reference:.2f}% undisturbed, "
          f"{WORK} samples")
    assert abs(accuracy - reference) <= 1.0

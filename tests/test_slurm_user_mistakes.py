"""Issue 38, "Trust it unattended": what a researcher's own script does wrong, and a final
evaluation after the last checkpoint, on the real 4-node Slurm cluster of
tests/slurm_cluster.py with the launcher (docs/execution.md, "Completion", "Wasted work").

* A final evaluation of 30 s after the last checkpoint runs to its end: the task is COMPLETED
  when its processes exit 0, not at the final report.
* A rank that crashes at its own step 40 in every generation (after checkpoints, so each
  generation makes progress): every failed run counts in ``FailedRuns`` and a ``crash-loop``
  warning names it; the task still completes (it made progress each time).
* A script that ignores the stop signal: killed when the preemption's GraceTime ends, noted as
  a ``stop-ignored`` warning.
* A script that ignores the checkpoint it loaded: ElasticRun refuses its first checkpoint after
  a restart, the reason says so, and the task fails after three failures without progress
  (the ``no-checkpoint`` warning for scripts that report without ElasticRun's guard:
  tests/test_wasted_work.py).
* A wrong interpreter path, and a rank that raises: the task fails after
  ``max_failed_generations`` runs, and its failure reason carries the last lines of the failed
  process's stderr ("No such file or directory", the traceback).

Skipped with the reason without Slurm (or root) or torch."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from offcut.client import make_task_spec
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from test_elastic_slurm import last_job_id, running

pytestmark = pytest.mark.slow

#: trains to $OFFCUT_TOTAL_WORK in steps of 10 samples (a checkpoint every 5 steps), writes the
#: final checkpoint, then "evaluates" for argv[2] s and writes argv[1] on rank 0 at the end;
#: with argv[3] = N, rank 0 crashes at its own step N of every generation
TRAIN = (
    "import logging, os, sys, time\n"
    "from pathlib import Path\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr,\n"
    "                    format='rank ' + os.environ['RANK'] + ': %(message)s')\n"
    "from offcut.client.elastic import ElasticRun\n"
    "mark, eval_s = Path(sys.argv[1]), float(sys.argv[2])\n"
    "crash_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0\n"
    "total = int(float(os.environ['OFFCUT_TOTAL_WORK']))\n"
    "with ElasticRun.from_env(checkpoint_every_steps=5) as run:\n"
    "    run.load_checkpoint()\n"
    "    done, step = run.samples_done, 0\n"
    "    while done < total:\n"
    "        step += 1\n"
    "        done += 10\n"
    "        run.step(done, lambda: {'done': done})\n"
    "        if crash_at and run.rank == 0 and step == crash_at:\n"
    "            raise RuntimeError(f'crash at my step {step}')\n"
    "        time.sleep(0.02)\n"
    "    run.save_checkpoint({'done': done}, done)\n"
    "    print('evaluating', flush=True)\n"
    "    time.sleep(eval_s)\n"
    "    if run.rank == 0:\n"
    "        mark.write_text(str(time.time()))\n"
    "        print('evaluation done', flush=True)\n")

#: ignores the stop signal (and SIGTERM) and never exits on its own
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(0.1)\n")


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def _seconds(ts) -> float:
    return ts


def test_a_final_evaluation_runs_to_its_end_before_completed(torch, slurm, cluster_daemon,
                                                             tmp_path):
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    script = _script(tmp_path, "train.py", TRAIN)
    mark = tmp_path / "evaluated"
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1", "n2"])
    after = last_job_id(slurm)
    spec = make_task_spec("final-eval", nodes="2", work_samples=200,
                          scalability=([1, 2], [100.0, 190.0]), rescale_up_s=0.0,
                          rescale_down_s=0.0,
                          command=[sys.executable, str(script), str(mark), "30"],
                          reports_progress=True)
    tid = client.submit(spec, owner="test").task.task_id
    with slurm.launcher(client.address, tmp_path):
        slurm.wait_for(lambda: (client.get_task(tid).work_reached_time is not None), timeout=180,
                       what="the final checkpoint's report")
        task = client.get_task(tid)
        assert task.state == TaskState.RUNNING and len(task.nodes) == 2
        assert not mark.exists()  # the evaluation runs
        slurm.wait_for(lambda: client.get_task(tid).state == TaskState.COMPLETED,
                       timeout=240, what="the task to complete")
        slurm.wait_for(lambda: not running(slurm, tid, after), timeout=60, what="no running job")
    task = client.get_task(tid)
    assert mark.exists(), "the evaluation was cut off"
    # COMPLETED when the processes exited 0, after the evaluation's 30 s, not at the report
    assert _seconds(task.finish_time) - _seconds(task.work_reached_time) >= 29.0
    assert _seconds(task.finish_time) >= float(mark.read_text()) - 1.0
    assert task.work_done_samples == 200 and not task.warnings and task.failed_runs == 0
    assert "finished" in task.last_run


def test_a_rank_crashing_in_every_generation_is_counted_and_named(torch, slurm, cluster_daemon,
                                                                  tmp_path):
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    script = _script(tmp_path, "train.py", TRAIN)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1"])
    after = last_job_id(slurm)
    spec = make_task_spec("crashy", nodes="1", work_samples=1500,
                          scalability=([1], [100.0]), rescale_up_s=0.0, rescale_down_s=0.0,
                          command=[sys.executable, str(script), str(tmp_path / "m"), "0", "40"],
                          reports_progress=True)
    tid = client.submit(spec, owner="test").task.task_id
    with slurm.launcher(client.address, tmp_path):
        slurm.wait_for(lambda: client.get_task(tid).state in (
            TaskState.COMPLETED, TaskState.FAILED), timeout=420,
            what="the task to end")
        slurm.wait_for(lambda: not running(slurm, tid, after), timeout=60, what="no running job")
    task = client.get_task(tid)
    # 40 steps of 10 samples per generation with a checkpoint every 5: each generation makes
    # progress, so the task completes; but every crash counted, and named
    assert task.state == TaskState.COMPLETED, task
    assert task.failed_runs >= 3 and task.failures_without_progress == 1, task
    assert "crash-loop" in [w.kind for w in task.warnings], task.warnings
    assert "exit code 1" in task.failure_reason


def test_a_script_that_ignores_the_stop_signal_is_named(slurm, cluster_daemon, tmp_path):
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    script = _script(tmp_path, "stubborn.py", STUBBORN)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1"])
    after = last_job_id(slurm)
    spec = make_task_spec("stubborn", nodes="1", work_samples=1e9,
                          scalability=([1], [1.0]), rescale_up_s=0.0, rescale_down_s=0.0,
                          command=[sys.executable, str(script)])
    tid = client.submit(spec, owner="test").task.task_id
    with slurm.launcher(client.address, tmp_path):
        slurm.wait_for(lambda: running(slurm, tid, after), timeout=90, what="the task's job")
        regular = slurm.sbatch("-N1", "-w", "n1", "--exclusive", wrap="sleep 1")
        slurm.wait_for(lambda: "stop-ignored" in [w.kind for w in client.get_task(tid).warnings],
                       timeout=120, what="the stop-ignored warning")
        slurm.wait_state(regular, {"COMPLETED"}, timeout=120)
    warning = next(w for w in client.get_task(tid).warnings if w.kind == "stop-ignored")
    assert "ignored the stop signal" in warning.message and "GraceTime" in warning.message
    client.cancel(tid)


#: local rank 1 raises at once (a traceback on its stderr); local rank 0 waits to be stopped
BOOM = (
    "import os, time\n"
    "if os.environ['LOCAL_RANK'] == '1':\n"
    "    raise RuntimeError('boom 42')\n"
    "time.sleep(600)\n")


def _fails(client, tid: str, slurm, after: int, tmp_path: Path):
    """Run the launcher until task ``tid`` is FAILED and no job of it runs; its task."""
    with slurm.launcher(client.address, tmp_path):
        slurm.wait_for(lambda: client.get_task(tid).state in (
            TaskState.FAILED, TaskState.COMPLETED), timeout=300,
            what="the task to fail")
        slurm.wait_for(lambda: not running(slurm, tid, after), timeout=60, what="no running job")
    return client.get_task(tid)


def test_a_wrong_interpreter_fails_the_task_naming_the_cause(slurm, cluster_daemon, tmp_path):
    """Was: FAILED with "exit code 127"; "No such file or directory" was only in the job's
    output file. Now the failure reason carries the last lines of the process's stderr."""
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1"])
    after = last_job_id(slurm)
    spec = make_task_spec("wrong-python", nodes="1", work_samples=1000,
                          scalability=([1], [100.0]), rescale_up_s=0.0, rescale_down_s=0.0,
                          command=["/nonexistent/python3", "train.py"])
    tid = client.submit(spec, owner="test").task.task_id
    task = _fails(client, tid, slurm, after, tmp_path)
    assert task.state == TaskState.FAILED and task.failed_runs == 3, task
    reason = task.failure_reason
    assert "exit code 127" in reason and "last lines of its stderr: " in reason, reason
    assert "/nonexistent/python3: No such file or directory" in reason, reason
    assert "No such file or directory" in task.last_run


def test_a_crashing_ranks_traceback_is_in_the_failure_reason(slurm, cluster_daemon, tmp_path):
    """Was: "exit code 1" only; the traceback was in the job's output file. Two processes on
    the node; local rank 1 raises, its peer is stopped: the reason names the exception."""
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    script = _script(tmp_path, "boom.py", BOOM)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1"])
    after = last_job_id(slurm)
    spec = make_task_spec("boom", nodes="1", work_samples=1000, scalability=([1], [100.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0, procs_per_node=2,
                          command=[sys.executable, str(script)])
    tid = client.submit(spec, owner="test").task.task_id
    task = _fails(client, tid, slurm, after, tmp_path)
    assert task.state == TaskState.FAILED and task.failed_runs == 3, task
    for text in (task.last_run, task.failure_reason):
        assert "exit code 1" in text and "RuntimeError: boom 42" in text, text
        assert "Traceback (most recent call last):" in text, text
        assert len(text) < 2500


#: a script that never resumes: it checkpoints (ElasticRun does) but ignores what it loaded and
#: starts from sample 0 in every generation
NO_RESUME = (
    "import logging, os, sys, time\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr,\n"
    "                    format='rank ' + os.environ['RANK'] + ': %(message)s')\n"
    "from offcut.client.elastic import ElasticRun\n"
    "with ElasticRun.from_env(checkpoint_every_steps=5) as run:\n"
    "    done = 0  # the mistake: run.samples_done (the loaded checkpoint's) is ignored\n"
    "    while True:\n"
    "        done += 10\n"
    "        run.step(done, lambda: {'done': done})\n"
    "        time.sleep(0.05)\n")


def test_a_script_that_does_not_resume_from_its_checkpoint_is_named(torch, slurm,
                                                                     cluster_daemon, tmp_path):
    """ElasticRun refuses to write a checkpoint below the latest one, so a script that ignores
    what it loaded fails at its first checkpoint after a restart: the reason names the mistake
    (its stderr), the failures make no progress, and the task fails after three of them with
    a crash-loop warning, instead of training the same samples again and again."""
    srv, client = cluster_daemon
    tmp_path.chmod(0o755)
    script = _script(tmp_path, "no_resume.py", NO_RESUME)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1", "n2"])
    after = last_job_id(slurm)
    spec = make_task_spec("no-resume", nodes="1-2", work_samples=1e9,
                          scalability=([1, 2], [100.0, 190.0]), rescale_up_s=0.0,
                          rescale_down_s=0.0, command=[sys.executable, str(script)],
                          reports_progress=True)
    tid = client.submit(spec, owner="test").task.task_id

    def reported() -> float:
        task = client.get_task(tid)
        return task.model.last_samples_done if task.model.has_report else 0.0

    with slurm.launcher(client.address, tmp_path):
        slurm.wait_for(lambda: reported() >= 100, timeout=180, what="reports of generation 1")
        regular = slurm.sbatch("-N1", "-w", "n1", "--exclusive", wrap="sleep 5")
        slurm.wait_for(lambda: client.get_task(tid).state == TaskState.FAILED,
                       timeout=300, what="the task to fail")
        slurm.wait_for(lambda: not running(slurm, tid, after), timeout=60, what="no running job")
        slurm.wait_state(regular, {"COMPLETED"}, timeout=120)
    task = client.get_task(tid)
    assert task.failed_runs == 3 and task.failures_without_progress == 3, task
    assert "call load_checkpoint() first" in task.failure_reason, task.failure_reason
    assert "crash-loop" in [w.kind for w in task.warnings]

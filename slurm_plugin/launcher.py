"""``offcut-slurm launch``: makes the daemon's placements real as Slurm jobs (DESIGN §7).

Each task the daemon places runs as one Slurm job per node in the preemptible partition
(``sbatch -p PARTITION -w NODE -N1 --exclusive --no-requeue``: the task owns the whole node), named ``PREFIX-TASKID-NODE``, with the
task's command (``slurm.command_template``) and its environment:

* ``OFFCUT_TASK_ID``, ``OFFCUT_TASK_NAME``, ``OFFCUT_NODE``, ``OFFCUT_RANK`` (index of the
  node in the task's sorted node list), ``OFFCUT_NODELIST`` (hostlist of the task's nodes when
  the job was submitted), ``OFFCUT_NUM_NODES``, ``OFFCUT_ADDRESS`` (the daemon).

The launcher is a level-triggered reconciler, so a restart, a missed update or a failed
Slurm call repairs itself on the next pass:

* desired = every (task, node) the daemon says a running task holds (``ListTasks``);
* actual = Offcut's jobs that ``squeue`` shows active (pending, configuring, running,
  completing), recognised by partition and name: a restarted launcher adopts them and never
  submits a second job for a (task, node);
* desired but not active -> ``sbatch``; active but not desired -> ``scancel`` (the job's
  processes get SIGTERM, then SIGKILL after Slurm's KillWait: the shrink signal);
* a job that ended is reported once to the daemon (``Tasks.ReportTaskRun``, idempotent by
  request id ``JOBID:STATE`` across restarts): COMPLETED -> ``finished`` (the task's program
  says its work is done: the daemon completes the task and releases its nodes); FAILED,
  TIMEOUT, OUT_OF_MEMORY, NODE_FAIL ... -> ``failed``; PREEMPTED, or cancelled by someone else
  -> ``preempted``; a job that started -> ``started``;
* a (task, node) whose job was preempted is not submitted again until the daemon's placement
  of the task has dropped that node (the prolog or the watcher tells the daemon the node is
  taken): no tug of war with the job that preempted it.

Ahead of preemption the job's batch shell gets ``slurm.signal`` (``--signal=B:SIG@LEAD``;
with ``SlurmctldParameters=preempt_send_user_signal`` Slurm sends it when it decides to
preempt, then waits the partition's GraceTime), so the task can checkpoint. The command is
``exec``-ed, so the training program itself receives the signal.

Passes are triggered by placement updates (``WatchPlacements``) and at least every
``--poll-s`` seconds (for jobs ending). Errors of Slurm or the daemon are logged once per
kind and retried on the next pass.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import hostlist

from offcut.daemon.config import SlurmConfig
from offcut.errors import FailedPrecondition, NotFound, OffcutError
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import (FINISHED_JOB_STATES, JobInfo, SlurmError,
                                            parse_jobs)

log = logging.getLogger("offcut.slurm.launcher")


def job_name(cfg: SlurmConfig, task_id: str, node: str) -> str:
    """``PREFIX-TASKID-NODE``: how Offcut's per-node jobs are named (and recognised)."""
    return f"{cfg.job_name_prefix}-{task_id}-{node}"


def parse_job_name(cfg: SlurmConfig, name: str) -> tuple[str, str] | None:
    """``(task_id, node)`` of one of Offcut's job names, None for any other name."""
    prefix = cfg.job_name_prefix + "-"
    if not name.startswith(prefix):
        return None
    task_id, sep, node = name[len(prefix):].partition("-")
    return (task_id, node) if sep and task_id and node else None


def batch_script(cfg: SlurmConfig, *, task_id: str, task_name: str, node: str, rank: int,
                 nodes: list[str], command: list[str], address: str) -> str:
    """The batch script of one per-node job: the environment, then ``exec`` of
    ``cfg.command_template`` (placeholders filled; ``{command}`` is the task's argv,
    shell-quoted).

    Raises:
        ValueError: the task has no command and the template needs one.
    """
    if not command and "{command}" in cfg.command_template:
        raise ValueError(f"task {task_id} has no command (submit it with -- COMMAND...)")
    nodelist = hostlist.collect_hostlist(nodes)
    line = cfg.command_template.format(
        command=shlex.join(command), task_id=task_id, task_name=shlex.quote(task_name),
        node=node, rank=rank, nodes=nodelist, num_nodes=len(nodes))
    env = {"OFFCUT_TASK_ID": task_id, "OFFCUT_TASK_NAME": task_name, "OFFCUT_NODE": node,
           "OFFCUT_RANK": str(rank), "OFFCUT_NODELIST": nodelist,
           "OFFCUT_NUM_NODES": str(len(nodes)), "OFFCUT_ADDRESS": address}
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    return f"#!/bin/bash\n# Offcut task {task_id} on {node} (rank {rank})\n{exports}\nexec {line}\n"


def sbatch_options(cfg: SlurmConfig, name: str, node: str) -> list[str]:
    """The sbatch options of one per-node job."""
    opts = ["-p", cfg.partition, "-w", node, "-N", "1", "--exclusive", "-J", name, "--no-requeue",
            f"--signal=B:{cfg.signal}@{cfg.signal_lead_s}", "-o", cfg.output]
    if cfg.account:
        opts.append(f"--account={cfg.account}")
    if cfg.workdir:
        opts.append(f"--chdir={cfg.workdir}")
    return opts + list(cfg.sbatch_args)


def run_state(job: JobInfo, cancelled_by_us: bool) -> str | None:
    """The run state to report for a job (None: nothing to report yet / at all): an ended job
    is ``finished`` (COMPLETED), ``preempted`` (PREEMPTED, or CANCELLED by someone other than
    this launcher), None (CANCELLED by this launcher) or ``failed`` (every other end state:
    FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL ...); a running one ``started``."""
    s = job.states
    if s & FINISHED_JOB_STATES:
        if "COMPLETED" in s:
            return "finished"
        if "PREEMPTED" in s:
            return "preempted"
        if "CANCELLED" in s:
            return None if cancelled_by_us else "preempted"
        return "failed"
    if "RUNNING" in s:
        return "started"
    return None


@dataclass
class PassResult:
    """What one reconciliation pass did (for logs and tests)."""

    submitted: list[tuple[str, str, str]] = field(default_factory=list)   # (task, node, job)
    cancelled: list[tuple[str, str, str]] = field(default_factory=list)
    reported: list[tuple[str, str, str]] = field(default_factory=list)    # (task, job, state)
    adopted: int = 0
    held: list[tuple[str, str]] = field(default_factory=list)             # preempted, waiting


class Launcher:
    """The reconciler. ``client`` is an :class:`offcut.client.Client`; ``cli`` runs Slurm.

    Args:
        client: the daemon's client (its address is passed to the jobs).
        cfg: the ``[slurm]`` section of the daemon's config.
        cli: Slurm commands.
        clock: wall clock [s] for run reports (injectable for tests).
    """

    def __init__(self, client, cfg: SlurmConfig, cli: SlurmCLI,
                 clock: Callable[[], float] = time.time):
        self.client = client
        self.cfg = cfg
        self.cli = cli
        self.clock = clock
        self.cancelled: set[str] = set()        # job ids this launcher cancelled
        self.reported: set[tuple[str, str]] = set()  # (job id, state) sent to the daemon
        self.held: set[tuple[str, str]] = set()      # (task, node) preempted, not resubmitted
        self._errors: set[str] = set()
        self._first = True

    # ------------------------------------------------------------------ helpers
    def _error(self, kind: str, message: str) -> None:
        if kind not in self._errors:
            log.error("%s", message)
            self._errors.add(kind)

    def _ok(self, kind: str) -> None:
        if kind in self._errors:
            log.info("%s: recovered", kind)
            self._errors.discard(kind)

    def own_jobs(self) -> dict[str, tuple[str, str, JobInfo]]:
        """Offcut's jobs that squeue knows: job id -> (task id, node, job)."""
        jobs = parse_jobs(self.cli.squeue_json())
        out = {}
        for job in jobs:
            if self.cfg.partition not in job.partition.split(","):
                continue
            parsed = parse_job_name(self.cfg, job.name)
            if parsed:
                out[job.job_id] = (parsed[0], parsed[1], job)
        return out

    def desired(self) -> dict[tuple[str, str], tuple[object, int]]:
        """(task id, node) -> (task, rank) for every node a running task holds."""
        from offcut.v1 import tasks_pb2

        out = {}
        for task in self.client.list_tasks(states=[tasks_pb2.TASK_STATE_RUNNING]):
            for rank, node in enumerate(sorted(task.nodes)):
                out[(task.task_id, node)] = (task, rank)
        return out

    def _report(self, task_id: str, job: JobInfo, state: str, node: str,
                result: PassResult) -> bool:
        """Send one run report (once per job and state; the daemon dedups retries by
        request id, also across launcher restarts). True when it was new."""
        key = (job.job_id, state)
        if key in self.reported:
            return False
        message = ""
        if state == "preempted" and job.being_preempted:
            message = "preempted by Slurm"
        elif state == "preempted":
            message = "cancelled outside Offcut"
        new = True
        try:
            reply = self.client.report_task_run(
                task_id, state, node=node, job_id=job.job_id, exit_code=job.exit_code,
                message=message, time=self.clock(), request_id=f"{job.job_id}:{state}")
            new = not reply.decision.duplicate  # known before a launcher restart
        except (NotFound, FailedPrecondition) as exc:  # the task is gone or already finished
            log.debug("run report %s of job %s not needed: %s", state, job.job_id, exc)
        self.reported.add(key)
        if not new:
            return False
        result.reported.append((task_id, job.job_id, state))
        log.info("task %s: job %s on %s %s", task_id, job.job_id, node, state)
        return True

    # ------------------------------------------------------------------ one pass
    def reconcile(self) -> PassResult:
        """One pass: read the daemon and Slurm, report ended jobs, submit and cancel.

        Raises:
            OffcutError: the daemon cannot be reached or refused a call.
            SlurmError: squeue failed or answered garbage (nothing is submitted then).
        """
        result = PassResult()
        jobs = self.own_jobs()
        active: dict[tuple[str, str], str] = {}
        preempted: set[tuple[str, str]] = set()
        for job_id, (task_id, node, job) in sorted(jobs.items(), key=lambda kv: int(kv[0])):
            state = run_state(job, job_id in self.cancelled)
            if state is not None or "COMPLETING" in job.states:  # it ran (a short job may
                self._report(task_id, job, "started", node, result)  # never be seen RUNNING)
            if state not in (None, "started"):
                if self._report(task_id, job, state, node, result) and state == "preempted":
                    preempted.add((task_id, node))
            if not (job.states & FINISHED_JOB_STATES):
                active[(task_id, node)] = job_id
        desired = self.desired()  # after the reports: a finished task holds nothing now
        # a newly preempted (task, node) waits until the daemon has dropped that node
        self.held = {k for k in self.held | preempted if k in desired}
        if self._first:
            result.adopted = len(active)
            if active:
                log.info("adopted %d running job(s) of Offcut", len(active))
            self._first = False
        for key, job_id in active.items():
            if key not in desired and job_id not in self.cancelled:
                self.cli.cancel([job_id])
                self.cancelled.add(job_id)
                result.cancelled.append((key[0], key[1], job_id))
                log.info("task %s: cancelled job %s on %s (no longer placed there)",
                         key[0], job_id, key[1])
        for (task_id, node), (task, rank) in sorted(desired.items()):
            if (task_id, node) in active:
                continue
            if (task_id, node) in self.held:
                result.held.append((task_id, node))
                continue
            name = job_name(self.cfg, task_id, node)
            try:
                script = batch_script(self.cfg, task_id=task_id, task_name=task.spec.name,
                                      node=node, rank=rank, nodes=sorted(task.nodes),
                                      command=list(task.spec.command),
                                      address=self.client.address)
            except ValueError as exc:
                self._error(f"script-{task_id}", f"cannot launch task {task_id}: {exc}")
                continue
            job_id = self.cli.submit(sbatch_options(self.cfg, name, node), script=script)
            result.submitted.append((task_id, node, job_id))
            log.info("task %s: submitted job %s on %s (rank %d of %d)", task_id, job_id, node,
                     rank, len(task.nodes))
        return result

    # ------------------------------------------------------------------ the loop
    def run(self, poll_s: float = 5.0, stop: threading.Event | None = None,
            on_pass: Callable[[PassResult], None] | None = None) -> None:
        """Reconcile at every placement update and at least every ``poll_s`` seconds until
        ``stop`` is set. Never raises for Slurm or daemon errors (logged, retried)."""
        stop = stop or threading.Event()
        revision = 0
        while not stop.is_set():
            try:
                result = self.reconcile()
                self._ok("pass")
                if on_pass:
                    on_pass(result)
            except (OffcutError, SlurmError) as exc:
                self._error("pass", f"reconciliation failed (retrying every {poll_s:g} s): {exc}")
            revision = self._wait(revision, poll_s, stop)

    def _wait(self, revision: int, poll_s: float, stop: threading.Event) -> int:
        """Block until a placement update after ``revision`` or ``poll_s`` seconds."""
        try:
            if not revision:
                revision = self.client.status().revision
            stream = self.client.watch(after_revision=revision, timeout_s=poll_s)
            for update in stream:
                return update.revision
        except OffcutError:
            stop.wait(min(poll_s, 1.0))
        return revision


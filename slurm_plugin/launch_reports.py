"""The launcher's reports to the daemon (:mod:`offcut.slurm_plugin.launcher`): every job that
started or ended, once (``Tasks.ReportTaskRun`` with its generation, idempotent by request id
``JOBID:STATE`` across restarts), with the run state of :func:`run_state` and, for a failure,
the last lines of the failed process's stderr; nodes Slurm is taking back (``ReportNodes``,
source ``slurm-launcher``); and a task that cannot run as its owner (``failed``, without a
generation). The placements of each reply are applied to the desired state at once, and
the task a run report's reply carries is merged into it (no later ``GetTask``;
:class:`RunReporter`).
"""

from __future__ import annotations

import logging
import time
from typing import AbstractSet, Callable, Container, Mapping

from offcut.daemon.config import SlurmConfig
from offcut.errors import FailedPrecondition, NotFound
from offcut.slurm_plugin import job_failure
from offcut.slurm_plugin.job_submission import checkpoint_dir
from offcut.slurm_plugin.launch_types import Generation, JobName, PassResult
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.owners import OwnerAccounts, OwnerRefused, user_name
from offcut.slurm_plugin.placements import DesiredState
from offcut.slurm_plugin.slurm_json import FINISHED_JOB_STATES, JobInfo

log = logging.getLogger("offcut.slurm.launcher")

#: the exit code of a process that checkpointed (or had nothing to save) and asks to be
#: restarted (EX_TEMPFAIL; docs/execution.md)
EXIT_RESTART = 75

#: the order in which the ended runs of one generation are reported: the failure that broke
#: it before the peers that lost it (and exited 75)
_REPORT_ORDER = {"failed": 0, "preempted": 1, "interrupted": 2}

#: an ended run: its job's name, the job, its run state
EndedRun = tuple[JobName, JobInfo, str]


def run_state(job: JobInfo, *, cancelled_by_us: bool = False,
              signalled_by_us: bool = False) -> str | None:
    """The run state to report for a job (None: nothing to report yet / at all).

    An ended job: ``finished`` (COMPLETED: exit 0); None (cancelled by this launcher without
    a stop signal first: it never ran, or was given back); ``interrupted`` (exit 75, killed
    by a signal after this launcher's stop signal, or cancelled by it after the signal's
    grace: it ignored the signal);
    ``preempted`` (PREEMPTED, ended while Slurm was preempting it, or CANCELLED by someone
    else); ``failed`` (any other end: a non-zero exit other than 75, also after this
    launcher's stop signal, where it is the run's own status: a rank that crashed while its
    peers' end made the launcher stop the generation; a signal, TIMEOUT, OUT_OF_MEMORY,
    NODE_FAIL ...). The daemon counts a failure only for the task's current generation
    (docs/execution.md). A running job: ``started``."""
    s = job.states
    if s & FINISHED_JOB_STATES:
        if "COMPLETED" in s:
            return "finished"
        if "CANCELLED" in s and cancelled_by_us:
            return "interrupted" if signalled_by_us else None
        if job.exit_code == EXIT_RESTART and not job.signal:
            return "interrupted"
        if signalled_by_us and (job.signal or not job.exit_code):
            return "interrupted"
        if "PREEMPTED" in s or "CANCELLED" in s or job.being_preempted:
            return "preempted"
        return "failed"
    if "RUNNING" in s:
        return "started"
    return None



class RunReporter:
    """Sends the launcher's reports to the daemon, each once, and applies the placements of
    their replies to the desired state.

    Args:
        client: the daemon's client (``report_task_run``, ``report_nodes``).
        cfg: the ``[slurm]`` section of the daemon's config (the checkpoint folders).
        accounts: whose account runs each task's jobs (a failure note is read as the job's
            user).
        key: the launcher's secret, asked for on first use (it names the checkpoint folders).
        state: the desired state the replies' placements are applied to (the launcher
            points it at each pass's state).
        clock: wall clock [s] of the run reports.
        stopped_by_us: ``(cancelled, signalled)``: the ids of the jobs this launcher
            cancelled and of those it sent the stop signal, now (a job that ended as asked
            was interrupted, not preempted; :class:`~offcut.slurm_plugin.job_stops.JobStopper`).

    Attributes:
        reported: (job id, state) sent to the daemon; retention: the jobs squeue still shows.
        refused: tasks reported as not launchable; retention: the running tasks
            (:meth:`forget`).
    """

    def __init__(self, client, cfg: SlurmConfig, accounts: OwnerAccounts,
                 key: Callable[[], LauncherKey], state: DesiredState, clock: Callable[[], float],
                 stopped_by_us: Callable[[], tuple[Container[str], Container[str]]]):
        self.client = client
        self.cfg = cfg
        self.accounts = accounts
        self.key = key
        self.state = state
        self.clock = clock
        self.stopped_by_us = stopped_by_us
        self.reported: set[tuple[str, str]] = set()
        self.refused: set[str] = set()
        self._node_seq = 0  # seq of the last node event sent (time-based, ns)

    def placed(self, decision, task=None) -> None:
        """Apply the placements of a decision the launcher's own call got back (newer than
        what the stream has brought so far; a duplicate's stored answer is old news), and
        merge ``task`` (a :class:`~offcut.views.TaskView`: a ``ReportTaskRun`` reply's, read after them)."""
        if not decision.duplicate:
            self.state.apply(decision.placements, int(decision.revision), ordered=False)
        if task is not None and task.task_id:
            self.state.fill(task.task_id, task)

    def report_runs(self, jobs: Mapping[str, tuple[JobName, JobInfo]], result: PassResult
                    ) -> tuple[dict[str, tuple[JobName, JobInfo]],
                               dict[tuple[str, int], list[EndedRun]], set[tuple[str, str]]]:
        """Report what the jobs did: starts and finishes at once, the other ends of a
        generation once all its jobs have ended (the failure that broke it first, then the
        peers that lost it). Returns the active jobs (job id -> (name, job)), the ended runs
        by (task, generation), and the (task, node) pairs Slurm is taking (newly preempted).

        Raises:
            OffcutError: the daemon cannot be reached or refused a report (the pass is
                retried; what was reported is not sent again).
        """
        cancelled, signalled = self.stopped_by_us()
        active: dict[str, tuple[JobName, JobInfo]] = {}
        live: set[tuple[str, int]] = set()  # (task, generation) with a job still active
        ended: dict[tuple[str, int], list[EndedRun]] = {}
        for job_id, (name, job) in sorted(jobs.items(), key=lambda kv: int(kv[0])):
            state = run_state(job, cancelled_by_us=job_id in cancelled,
                              signalled_by_us=job_id in signalled)
            if state is not None or "COMPLETING" in job.states:  # it ran (a short job may
                self.report(name, job, "started", result)      # never be seen RUNNING)
            if not (job.states & FINISHED_JOB_STATES):
                active[job_id] = (name, job)
                live.add((name.task_id, name.generation))
            elif state == "finished":  # the work is done: at once
                self.report(name, job, state, result)
            elif state is not None:
                ended.setdefault((name.task_id, name.generation), []).append((name, job, state))
        preempted: set[tuple[str, str]] = set()
        for group, runs in ended.items():
            if group in live:
                continue
            # the nodes Slurm is taking first: the daemon's restart of this generation must
            # not place the next one on them (a generation this launcher would hold, never
            # submitted, until the preempting job's PrologSlurmctld reports them; issue 38).
            # Idempotent with that prolog's report; the preempting job's epilog (or the
            # watcher) gives them back.
            taken = sorted({name.node for name, job, state in runs
                            if (job.being_preempted or "PREEMPTED" in job.states)
                            and (job.job_id, state) not in self.reported})
            if taken:
                self.report_taken(taken)
            for name, job, state in sorted(runs, key=lambda r: _REPORT_ORDER[r[2]]):
                if self.report(name, job, state, result) and (
                        state == "preempted" or job.being_preempted):
                    preempted.add((name.task_id, name.node))  # Slurm is taking the node
        return active, ended, preempted

    def _message(self, name: JobName, job: JobInfo, state: str) -> tuple[str, bool]:
        """The run report's message for ``job`` ended as ``state``, and whether it ignored
        the stop signal (killed after the grace time)."""
        cancelled, signalled = self.stopped_by_us()
        text = ""
        by_slurm = job.being_preempted or "PREEMPTED" in job.states
        # killed after the grace time: this launcher cancelled it after its stop signal, or
        # Slurm's preemption ended it by a signal (it did not exit 75 within GraceTime)
        ignored = (state == "interrupted" and job.job_id in signalled
                   and job.job_id in cancelled) or (
            state == "preempted" and by_slurm and bool(job.signal))
        if state == "preempted":
            text = "preempted by Slurm" if by_slurm else "cancelled outside Offcut"
        elif state == "interrupted":
            text = ("stopped for a new generation" if job.job_id in signalled
                    else "checkpointed, restart requested")
        if ignored:
            text += ("; it ignored the stop signal: cancelled after rescale_grace_s"
                     if state == "interrupted" else
                     "; it ignored the stop signal: killed when the preemption's GraceTime ended")
        if job.signal and state in ("failed", "interrupted"):
            text = (text + f"; killed by signal {job.signal}").lstrip("; ")
        if state == "failed":
            tail = self.stderr_tail(name, job)
            if tail:
                text = (text + f"; last lines of its stderr: {tail}").lstrip("; ")
        return text, ignored

    def report(self, name: JobName, job: JobInfo, state: str, result: PassResult) -> bool:
        """Send one run report (once per job and state; the daemon dedups retries by
        request id, also across launcher restarts). True when the daemon took it as new
        (False: a repeat, or refused as not applicable).

        Raises:
            OffcutError: the daemon cannot be reached (the report is sent again next pass).
        """
        key = (job.job_id, state)
        if key in self.reported:
            return False
        text, ignored = self._message(name, job, state)
        try:
            reply = self.client.report_task_run(
                name.task_id, state, node=name.node, job_id=job.job_id,
                exit_code=job.exit_code, message=text, time=self.clock(),
                request_id=f"{job.job_id}:{state}", generation=name.generation or None,
                stop_ignored=ignored)
            new = not reply.decision.duplicate  # known before a launcher restart
            self.placed(reply.decision, reply.task)
        except (NotFound, FailedPrecondition) as exc:  # the task is gone or already finished,
            # or the job is not the task's (a generation it never had): nothing happened, so
            # nothing follows from it (no node is held for a refused preemption report); the
            # task is read again (in case the stream lost its finish)
            log.debug("run report %s of job %s not needed: %s", state, job.job_id, exc)
            self.state.reread(name.task_id)
            new = False
        self.reported.add(key)
        if not new:
            return False
        result.reported.append((name.task_id, job.job_id, state))
        log.info("task %s generation %d: job %s on %s %s", name.task_id, name.generation,
                 job.job_id, name.node, state)
        return True

    def stderr_tail(self, name: JobName, job: JobInfo) -> str:
        """The last lines of stderr of ``job``'s failed process, from the failure note in the
        task's checkpoint folder, read with the rights of the user Slurm says the job ran as
        (:func:`offcut.slurm_plugin.job_failure.stderr_tail`; never as root for an owner's
        job); "" when there is none, or that user is not one the launcher runs jobs as."""
        if job.uid is None:
            return ""
        try:
            account = self.accounts.account(user_name(job.uid))
            folder = checkpoint_dir(self.cfg, name.task_id, account, self.key())
        except (OwnerRefused, OSError) as exc:
            log.debug("no stderr lines for job %s: %s", job.job_id, exc)
            return ""
        return job_failure.stderr_tail(folder, job.job_id, account)

    def report_taken(self, nodes: list[str]) -> None:
        """Report ``nodes`` taken back to the daemon (``ReportNodes`` preempted, source
        ``slurm-launcher``, a fresh monotone seq). Raises what ``report_nodes`` raises (the
        pass is retried)."""
        now_ns = time.time_ns()
        self._node_seq = max(now_ns, self._node_seq + 1)
        self.placed(self.client.report_nodes(now_ns / 1e9, "slurm-launcher", self._node_seq,
                                             preempted=nodes))

    def refuse(self, gen: Generation, reason: str, result: PassResult) -> None:
        """Report once that ``gen``'s task cannot run as its owner (``reason``): a ``failed``
        run without a generation, which fails the task at once (a retry cannot help), with
        the message ``not launched: REASON``; idempotent by request id ``TASK:not-launched``.

        Raises:
            OffcutError: the daemon cannot be reached (sent again next pass).
        """
        if gen.task_id in self.refused:
            return
        log.error("task %s not launched: %s", gen.task_id, reason)
        try:
            reply = self.client.report_task_run(
                gen.task_id, "failed", message=f"not launched: {reason}", time=self.clock(),
                request_id=f"{gen.task_id}:not-launched")
            self.placed(reply.decision, reply.task)
        except (NotFound, FailedPrecondition) as exc:  # the task is gone or already finished
            log.debug("failure report of task %s not needed: %s", gen.task_id, exc)
        self.refused.add(gen.task_id)
        result.refused.append((gen.task_id, reason))

    def forget(self, shown: AbstractSet[str], desired: Mapping[str, Generation]) -> None:
        """Retention: keep what was reported of the jobs squeue still shows (``shown``: ids;
        a job Slurm no longer shows is never reported again) and the refusals of running
        tasks (``desired``)."""
        self.reported = {k for k in self.reported if k[0] in shown}
        self.refused &= desired.keys()

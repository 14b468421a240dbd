"""Stopping the launcher's jobs (:mod:`offcut.slurm_plugin.launcher`): a job of a replaced
generation, or of a task that no longer runs, gets the stop signal and, after
``slurm.rescale_grace_s``, ``scancel``; a job of a current generation pending for longer than
``slurm.pending_timeout_s`` gives its node back to the daemon and is cancelled
(:class:`JobStopper`).
"""

from __future__ import annotations

import logging
from typing import AbstractSet, Callable

from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.launch_types import JobName, PassResult
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import JobInfo

log = logging.getLogger("offcut.slurm.launcher")


class JobStopper:
    """Stops and cancels jobs, and remembers which (a job this launcher stopped ended as
    asked: :func:`offcut.slurm_plugin.launch_reports.run_state`).

    Args:
        cfg: the ``[slurm]`` section of the daemon's config (signal, grace, pending limit).
        cli: Slurm commands (``scancel``).
        clock: wall clock [s] (a pending job's age, against Slurm's submit time).
        monotonic: clock [s] of the rescale grace periods.
        report_taken: reports nodes taken back to the daemon (``ReportNodes``); raises
            what the call raises.

    Attributes:
        cancelled: job ids this launcher cancelled.
        signalled: job id -> when [s, ``monotonic``] this launcher sent it the stop signal.
        Retention of both: the jobs squeue still shows (:meth:`forget`).
    """

    def __init__(self, cfg: SlurmConfig, cli: SlurmCLI, clock: Callable[[], float],
                 monotonic: Callable[[], float], report_taken: Callable[[list[str]], None]):
        self.cfg = cfg
        self.cli = cli
        self.clock = clock
        self.monotonic = monotonic
        self.report_taken = report_taken
        self.cancelled: set[str] = set()
        self.signalled: dict[str, float] = {}

    def pending_too_long(self, job: JobInfo) -> bool:
        """Whether ``job`` is pending for longer than ``pending_timeout_s`` (by Slurm's
        submit time and this host's clock; never when either is unknown or the limit 0)."""
        limit = self.cfg.pending_timeout_s
        return bool(limit and "PENDING" in job.states and job.submit_time
                    and self.clock() - job.submit_time > limit
                    and job.job_id not in self.cancelled)

    def give_back(self, job_id: str, name: JobName, result: PassResult) -> None:
        """Report ``name.node`` taken back to the daemon (source ``slurm-launcher``), then
        cancel the pending job. The report comes first: if it fails, the job stays and the
        next pass tries again, so a task never waits on a node the daemon still counts.

        Raises:
            OffcutError: the report failed. SlurmError: ``scancel`` failed.
        """
        self.report_taken([name.node])
        self.cli.cancel([job_id])
        self.cancelled.add(job_id)
        result.given_back.append((name.task_id, name.node, job_id))
        log.warning("task %s generation %d: job %s pending on %s for over %g s; node given "
                    "back to the daemon, job cancelled", name.task_id, name.generation, job_id,
                    name.node, self.cfg.pending_timeout_s)

    def stop(self, job_id: str, name: JobName, job: JobInfo, result: PassResult) -> None:
        """Stop a job of a replaced generation (or of a task that no longer runs): the stop
        signal first (a job that has not started is cancelled at once), ``scancel`` after
        ``rescale_grace_s``.

        Raises:
            SlurmError: ``scancel`` failed.
        """
        if job_id in self.cancelled:
            return
        now = self.monotonic()
        started = "RUNNING" in job.states
        if started and job_id not in self.signalled and self.cfg.rescale_grace_s > 0:
            self.cli.cancel([job_id], signal=self.cfg.signal, options=["--batch"])
            self.signalled[job_id] = now
            result.signalled.append((name.task_id, name.node, job_id))
            log.info("task %s: generation %d on %s (job %s) asked to stop (%s)", name.task_id,
                     name.generation, name.node, job_id, self.cfg.signal)
            return
        if started and now - self.signalled.get(job_id, now) < self.cfg.rescale_grace_s:
            return
        self.cli.cancel([job_id])
        self.cancelled.add(job_id)
        result.cancelled.append((name.task_id, name.node, job_id))
        log.info("task %s: cancelled job %s on %s (generation %d replaced)", name.task_id,
                 job_id, name.node, name.generation)

    def forget(self, shown: AbstractSet[str]) -> None:
        """Retention: keep what is known of the jobs squeue still shows (``shown``: ids)."""
        self.cancelled &= shown
        self.signalled = {j: t for j, t in self.signalled.items() if j in shown}

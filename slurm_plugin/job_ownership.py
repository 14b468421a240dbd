"""Whose job it is (docs/execution.md, "Whose job it is"): which of the jobs in the partition
named like Offcut's are this launcher's jobs of a task (:class:`JobOwnership`). The launcher
(:mod:`offcut.slurm_plugin.launcher`) adopts, reports, stops and cancels only those.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.launch_types import Generation, JobName, parse_job_name
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.owners import OwnerAccounts, OwnerRefused
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import JobInfo, parse_jobs

log = logging.getLogger("offcut.slurm.launcher")

#: how much earlier [s] than its task a job may have been submitted and still be the task's
#: (slurmctld's and the daemon's clocks may differ a little)
CLOCK_SLACK_S = 5.0


def older_than_task(job: JobInfo, gen: Generation | None) -> bool:
    """A job named like one of a task's but submitted before the task existed: left by a
    daemon whose state was reset (task ids start again), never the task's."""
    return (gen is not None and job.submit_time > 0 and gen.submit_time > 0
            and job.submit_time < gen.submit_time - CLOCK_SLACK_S)


class JobOwnership:
    """The rule of whose job it is.

    A job in the partition named like one of Offcut's counts for a task only if (1) Slurm
    says its user id is the one the task's jobs run as (the owner's account, or the
    launcher's own with ``run_as_owner = false``), and (2) this launcher submitted it: its job
    id was recorded at submit (:meth:`record`), or its comment is the launcher key's tag of
    its name and user id (:meth:`LauncherKey.job_tag`; how a restarted launcher adopts its
    jobs). For a job of a task that no longer runs only (2) is asked (the tag binds the uid
    the launcher submitted it as). A job that fails is ignored: never adopted, reported,
    stopped or cancelled; logged once.

    Args:
        cfg: the ``[slurm]`` section of the daemon's config (partition, job name prefix).
        cli: Slurm commands (``squeue``).
        accounts: whose account runs each task's jobs.
        key: the launcher's secret, asked for on first use (it may fail: an OSError).
        started: when the launcher started [s since epoch]: a job submitted later is its
            own only by id.

    Attributes:
        mine: job ids this launcher submitted or adopted; retention: the ids squeue still
            shows (:meth:`own_jobs`).
        ignored: job ids named like Offcut's but not this launcher's (logged once);
            retention: the same.
    """

    def __init__(self, cfg: SlurmConfig, cli: SlurmCLI, accounts: OwnerAccounts,
                 key: Callable[[], LauncherKey], started: float):
        self.cfg = cfg
        self.cli = cli
        self.accounts = accounts
        self.key = key
        self.started = started
        self.mine: set[str] = set()
        self.ignored: set[str] = set()

    def record(self, job_id: str) -> None:
        """``job_id`` was submitted by this launcher: its job."""
        self.mine.add(job_id)

    def run_as_uid(self, gen: Generation) -> int | None:
        """The uid ``gen``'s jobs run as (None: the task cannot run as its owner)."""
        try:
            account = self.accounts.account(gen.owner)
        except OwnerRefused:
            return None
        return account.uid if account is not None else self.accounts.uid

    def not_ours(self, job: JobInfo, gen: Generation | None, *,
                 ended_unseen: bool = False) -> str:
        """Why ``job`` (named like one of ``gen``'s task's) is not this launcher's job of that
        task ("" when it is): the rule of the class docstring. ``ended_unseen``: a job found
        in Slurm's accounting, which keeps no comment by default (``AccountingStoreFlags=
        job_comment``): besides its id or tag, one submitted before this launcher started
        (+ :data:`CLOCK_SLACK_S`) counts, since a job submitted later that it does not know
        by its id is not its own.

        Raises:
            OSError: the launcher key cannot be loaded (LauncherKeyError).
        """
        if job.uid is None:
            return "Slurm did not say its user id"
        if gen is not None:
            want = self.run_as_uid(gen)
            if job.uid != want:
                return (f"it runs as uid {job.uid}, task {gen.task_id}'s jobs as "
                        f"{'nobody' if want is None else f'uid {want}'}")
        if job.job_id in self.mine or self.key().is_tag(job.comment, job.name, job.uid):
            return ""
        if ended_unseen and gen is not None and 0 < job.submit_time <= \
                self.started + CLOCK_SLACK_S:
            return ""
        return "this launcher did not submit it (no tag of its key in the comment)"

    def ignore(self, job: JobInfo, why: str) -> None:
        """Log once that ``job`` is not Offcut's although named so."""
        if job.job_id not in self.ignored:
            self.ignored.add(job.job_id)
            log.warning("job %s (%s, user %s) is named like Offcut's but is not this "
                        "launcher's: %s; ignored", job.job_id, job.name,
                        job.user or job.uid, why)

    def own_jobs(self, desired: Mapping[str, Generation] | None = None
                 ) -> dict[str, tuple[JobName, JobInfo]]:
        """Offcut's jobs that squeue knows: job id -> (its name's parts, the job); only the
        jobs the rule of the class docstring says are this launcher's (``desired``: the
        running tasks, whose owners the jobs must run as). Others named so are ignored
        (logged once; retention: the ids squeue still shows).

        Raises:
            SlurmError: squeue failed or answered garbage.
        """
        desired = desired or {}
        out = {}
        shown: set[str] = set()
        for job in parse_jobs(self.cli.squeue_json()):
            if self.cfg.partition not in job.partition.split(","):
                continue
            parsed = parse_job_name(self.cfg, job.name)
            if not parsed:
                continue
            shown.add(job.job_id)
            why = self.not_ours(job, desired.get(parsed.task_id))
            if why:
                self.ignore(job, why)
                continue
            out[job.job_id] = (parsed, job)
        self.mine = (self.mine & shown) | out.keys()
        self.ignored &= shown
        return out

"""Jobs that ended while the launcher was away, from Slurm's accounting (``sacct``): a job of a
current generation that this launcher has not seen and that ``squeue`` no longer shows (Slurm
forgets an ended job after ``MinJobAge``) is looked up once (:class:`AccountingLookup`), so
it is reported like one ``squeue`` shows and never submitted again (docs/deployment.md,
"3b. Accounting (slurmdbd)"; the launcher's rules: :mod:`offcut.slurm_plugin.launcher`).
"""

from __future__ import annotations

import logging
from typing import AbstractSet, Mapping

from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.job_ownership import CLOCK_SLACK_S, JobOwnership, older_than_task
from offcut.slurm_plugin.launch_types import (Generation, JobName, OnceLog, job_name,
                                              parse_job_name)
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import (FINISHED_JOB_STATES, JobInfo, SlurmError,
                                            parse_sacct)

log = logging.getLogger("offcut.slurm.launcher")


class AccountingLookup:
    """Looks up, once per (task, generation), the ended jobs of the current generations that
    neither this launcher nor ``squeue`` knows.

    Args:
        cfg: the ``[slurm]`` section of the daemon's config (partition, job name prefix).
        cli: Slurm commands (``sacct``).
        ownership: whose job it is (a job found is counted only when it is this launcher's).
        errors: the launcher's log of errors once per kind (kind ``sacct``).

    Attributes:
        looked_up: (task, generation) already asked of ``sacct``; retention: the current
            generations (:meth:`forget`).
    """

    def __init__(self, cfg: SlurmConfig, cli: SlurmCLI, ownership: JobOwnership,
                 errors: OnceLog):
        self.cfg = cfg
        self.cli = cli
        self.ownership = ownership
        self.errors = errors
        self.looked_up: set[tuple[str, int]] = set()

    def accounted(self, desired: Mapping[str, Generation],
                  jobs: Mapping[str, tuple[JobName, JobInfo]],
                  known: AbstractSet[tuple[str, int, str]]) -> dict[str, tuple[JobName, JobInfo]]:
        """Ended jobs of current generations that ``squeue`` no longer shows, from Slurm's
        accounting: job id -> (name, job). Asked once per (task, generation) this launcher
        has not submitted or seen (``known``: (task, generation, node); ``jobs``: the jobs
        squeue shows), a restarted launcher's first look at a generation, in one ``sacct``
        call; a generation with a job accounting still shows active is asked again next
        pass. Only jobs the rule of whose job it is says are this launcher's count
        (:class:`~offcut.slurm_plugin.job_ownership.JobOwnership`: the user id, always
        recorded; others are ignored, logged once). Without accounting, or when ``sacct``
        fails: nothing (logged once)."""
        shown = {(n.task_id, n.generation, n.node) for n, _ in jobs.values()}
        missing = {job_name(self.cfg, t, g.generation, n): g
                   for t, g in desired.items() if (t, g.generation) not in self.looked_up
                   for n in g.nodes
                   if (t, g.generation, n) not in known and (t, g.generation, n) not in shown}
        if not missing:
            return {}
        groups = {(g.task_id, g.generation) for g in missing.values()}
        try:
            records = parse_sacct(self.cli.sacct(
                sorted(missing), min(g.submit_time for g in missing.values()) - CLOCK_SLACK_S))
            self.errors.ok("sacct")
        except SlurmError as exc:
            if "disabled" in str(exc):  # no slurmdbd: a choice
                self.errors.error(
                    "sacct", f"Slurm's accounting is off ({exc}); jobs that ended while the "
                             "launcher was down and that squeue no longer shows cannot be told "
                             "from jobs never submitted (docs/deployment.md, "
                             "\"3b. Accounting (slurmdbd)\")",
                    level=logging.WARNING)
            else:
                self.errors.error(
                    "sacct", f"Slurm's accounting cannot be read ({exc}); jobs that ended "
                             "while the launcher was down and that squeue no longer shows "
                             "cannot be told from jobs never submitted")
            self.looked_up |= groups
            return {}
        found: dict[str, tuple[JobName, JobInfo]] = {}
        for job in records:
            gen = missing.get(job.name)
            parsed = parse_job_name(self.cfg, job.name)
            if gen is None or parsed is None or job.job_id in jobs \
                    or self.cfg.partition not in job.partition.split(",") \
                    or older_than_task(job, gen):
                continue
            why = self.ownership.not_ours(job, gen, ended_unseen=True)
            if why:
                self.ownership.ignore(job, why)
                continue
            if not job.states & FINISHED_JOB_STATES:  # (squeue and sacct asked a moment apart)
                groups.discard((gen.task_id, gen.generation))
                continue
            found[job.job_id] = (parsed, job)
            log.info("task %s generation %d: job %s on %s ended while the launcher was away "
                     "(%s in Slurm's accounting)", parsed.task_id, parsed.generation, job.job_id,
                     parsed.node, ",".join(sorted(job.states)))
        self.looked_up |= groups
        return found

    def forget(self, desired: Mapping[str, Generation]) -> None:
        """Retention: keep what was asked of the current generations (``desired``) only."""
        self.looked_up = {k for k in self.looked_up
                          if k[0] in desired and k[1] == desired[k[0]].generation}

"""What the launcher's collaborators share (:mod:`offcut.slurm_plugin.launcher`): a running
task's :class:`Generation` as the daemon placed it, the names of its per-node Slurm jobs
(:func:`job_name`, :func:`parse_job_name`), what one reconciliation pass did
(:class:`PassResult`), and the launcher's log of errors once per kind (:class:`OnceLog`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.placements import Running

log = logging.getLogger("offcut.slurm.launcher")

_TASK_GEN = re.compile(r"(?P<task>[^.\-]+)(?:\.(?P<gen>[0-9]{1,18}))?")


class JobName(NamedTuple):
    """What an Offcut job's name says: its task, generation (0: a job named before
    generations existed) and node."""

    task_id: str
    generation: int
    node: str


def job_name(cfg: SlurmConfig, task_id: str, generation: int, node: str) -> str:
    """``PREFIX-TASKID.GENERATION-NODE``: how Offcut's per-node jobs are named (and
    recognised)."""
    return f"{cfg.job_name_prefix}-{task_id}.{generation}-{node}"


def parse_job_name(cfg: SlurmConfig, name: str) -> JobName | None:
    """The :class:`JobName` of one of Offcut's job names (``PREFIX-TASKID.GEN-NODE``, or the
    older ``PREFIX-TASKID-NODE``), None for any other name."""
    prefix = cfg.job_name_prefix + "-"
    if not name.startswith(prefix):
        return None
    head, sep, node = name[len(prefix):].partition("-")
    m = _TASK_GEN.fullmatch(head)
    if not (sep and node and m):
        return None
    return JobName(m["task"], int(m["gen"] or 0), node)


@dataclass(frozen=True)
class Generation:
    """One generation of a running task, as the daemon placed it."""

    task_id: str
    task_name: str
    generation: int
    nodes: tuple[str, ...]     # sorted: the node's index is its rank
    command: tuple[str, ...]
    zeus_job_id: str = ""
    submit_time: float = 0.0  # the task's [s since epoch]
    owner: str = ""           # the task's owner (a user name), whose account runs its jobs
    gpus_per_node: int = 0    # the task's spec.gpus_per_node: the jobs' --gres=gpu:N
    constraint: tuple[str, ...] = ()  # the task's spec.constraint: the jobs' --constraint
    procs_per_node: int = 1   # processes on each node (TaskSpec.local_world_size)
    total_work: float = 0.0   # the task's total_work_samples: the jobs' OFFCUT_TOTAL_WORK


def generation_of(running: Running) -> Generation:
    """The :class:`Generation` of one running task of the desired state (its last read, its
    current generation and nodes: :data:`offcut.slurm_plugin.placements.Running`)."""
    t, generation, nodes = running
    spec = t.spec
    return Generation(task_id=t.task_id, task_name=spec.name, generation=generation,
                      nodes=nodes, command=tuple(spec.command), zeus_job_id=spec.zeus_job_id,
                      submit_time=t.submit_time or 0.0, owner=t.owner,
                      gpus_per_node=spec.gpus_per_node, constraint=tuple(spec.constraint),
                      procs_per_node=spec.local_world_size,
                      total_work=spec.total_work_samples)


@dataclass
class PassResult:
    """What one reconciliation pass did (for logs and tests)."""

    submitted: list[tuple[str, str, str]] = field(default_factory=list)   # (task, node, job)
    cancelled: list[tuple[str, str, str]] = field(default_factory=list)
    signalled: list[tuple[str, str, str]] = field(default_factory=list)   # stop signal sent
    reported: list[tuple[str, str, str]] = field(default_factory=list)    # (task, job, state)
    adopted: int = 0
    held: list[tuple[str, str]] = field(default_factory=list)             # preempted, waiting
    waiting: list[str] = field(default_factory=list)  # tasks whose new generation waits
    refused: list[tuple[str, str]] = field(default_factory=list)  # (task, why): not launched
    given_back: list[tuple[str, str, str]] = field(default_factory=list)  # pending too long

    @property
    def busy(self) -> bool:
        """A generation is being replaced or waits: the next pass should come soon."""
        return bool(self.waiting or self.signalled)


class OnceLog:
    """Errors logged once per kind until that kind recovers (the launcher retries every
    pass; a failure that lasts is not logged again on each). Retention: the kinds still
    failing; :meth:`retain` drops those of tasks that no longer run."""

    def __init__(self) -> None:
        self.failing: set[str] = set()

    def error(self, kind: str, message: str, level: int = logging.ERROR) -> None:
        """Log ``message`` at ``level`` unless ``kind`` is already failing."""
        if kind not in self.failing:
            log.log(level, "%s", message)
            self.failing.add(kind)

    def ok(self, kind: str) -> None:
        """``kind`` works again: logged once when it was failing."""
        if kind in self.failing:
            log.info("%s: recovered", kind)
            self.failing.discard(kind)

    def retain(self, keep) -> None:
        """Forget the failing kinds for which ``keep(kind)`` is false."""
        self.failing = {k for k in self.failing if keep(k)}

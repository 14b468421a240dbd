"""The scheduler's one state object: settings, event clock, idle pool, tasks, counters; its
persistence (snapshots, docs/architecture.md, "Journal and snapshots"), the bookkeeping every
collaborator of :class:`~offcut.daemon.app.scheduler.Scheduler` shares (owners' retained tasks,
changed tasks) and the step-log figures. The collaborators read and write it; none holds state
of its own but caches."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import asdict
from typing import Any

from offcut.daemon.app.model import NodeKind, ObjectiveSettings, Task, task_number
from offcut.taskspec import Limits
from offcut.views import TaskState
from offcut.daemon.app.scheduler.outcome import Outcome


#: how long a finished task stays in the scheduler's state by default [s]: a day
DEFAULT_FINISHED_TASK_RETENTION_S = 86400.0

#: bytes counted for a task besides its spec's strings and numbers (:func:`retained_bytes`):
#: the task's own fields, its learner and ledger, the containers that index it
TASK_OVERHEAD_BYTES = 2048
#: bytes counted per number of a spec's lists (a float in memory, about 20 characters of JSON)
NUMBER_BYTES = 24
#: bytes counted per string of a spec (an object header, a JSON quote pair and comma)
STRING_OVERHEAD_BYTES = 56


def retained_bytes(task: Task) -> int:
    """What keeping ``task`` costs [bytes], an estimate of its size in memory and in each
    stored copy (snapshot, archive row, journal reply): :data:`TASK_OVERHEAD_BYTES`, plus its
    spec's strings (UTF-8 bytes of the name, every command argument, the Zeus job id and the
    constraint features, each with :data:`STRING_OVERHEAD_BYTES`) and :data:`NUMBER_BYTES`
    per number of its curve (``node_counts``, ``throughputs``, ``objective_values``,
    ``power_w``). The same task always gives the same figure (it is added at submit and
    taken off when the task leaves the state). docs/security.md, "Round two: what one user
    makes the daemon keep"."""
    spec = task.spec
    strings = (spec.name, task.owner, task.request_id, spec.zeus_job_id, *spec.command,
               *spec.constraint)
    size = sum(len(x.encode("utf-8", "surrogatepass")) + STRING_OVERHEAD_BYTES for x in strings)
    numbers = (len(spec.node_counts) + len(spec.throughputs) + len(spec.objective_values)
               + len(spec.power_w))
    return TASK_OVERHEAD_BYTES + size + NUMBER_BYTES * numbers


class SchedulerState:
    """Cluster state: idle pool, tasks, placements, accounting; the one object the
    scheduler's collaborators share (:class:`~offcut.daemon.app.scheduler.Scheduler` composes
    them over it).

    Responsibility: the data and its persistence (:meth:`to_dict` / :meth:`from_dict`, the
    snapshot format; :meth:`snapshot_changes`), and bookkeeping that is the same whoever
    changes the state: :meth:`retain` / :meth:`release` (per-owner retained tasks),
    :meth:`mark_changed` (tasks an event may have changed), :meth:`admitted` (the tasks the
    allocation considers), :meth:`fill_figures` (an outcome's step-log figures). It applies no
    event and knows none of the collaborators.

    Args:
        tfwd_s: BFTrainer's look-ahead Tfwd [s] used in the allocation objective.
        max_running_tasks: maxJ, tasks admitted to the allocation at once.
        limits: size limits the event validation checks (:mod:`.validation`); None = none
            (re-applying the journal, whose events were checked against the limits of their
            time). Not part of the persisted state: the engine sets the configured ones.
        objective: what the allocation maximises (the policy's name) and the power figures
            (:class:`ObjectiveSettings`; persisted, like ``tfwd_s``).
        max_failed_generations: a task whose current generation's run fails this many times
            in a row (each failure restarts it as a new generation) is FAILED
            (docs/execution.md; persisted).
        finished_task_retention_s: a finished task leaves the state (memory and snapshots)
            this long [s of event clock] after it finished; the engine keeps it in the state
            file's archive, where it stays readable (docs/operations.md, "Retention: what is
            kept, and for how long"; persisted).
        final_grace_s: how long a launched task whose report reached its work keeps its nodes
            for its processes to exit 0 [s of event clock] (docs/execution.md, "Completion";
            0: completed at the report; persisted).
    """

    def __init__(self, tfwd_s: float = 10.0, max_running_tasks: int = 10,
                 limits: Limits | None = None, objective: ObjectiveSettings | None = None,
                 max_failed_generations: int = 3,
                 finished_task_retention_s: float = DEFAULT_FINISHED_TASK_RETENTION_S,
                 final_grace_s: float = 0.0):
        self.tfwd_s = float(tfwd_s)
        self.max_running_tasks = int(max_running_tasks)
        #: failed runs of a task's current generations in a row that fail it (docs/execution.md)
        self.max_failed_generations = int(max_failed_generations)
        #: how long a finished task stays in the state after it finished [s]
        self.finished_task_retention_s = float(finished_task_retention_s)
        #: a launched task's time to exit 0 after its report reached the work [s]
        self.final_grace_s = float(final_grace_s)
        self.limits = limits
        self.objective = objective if objective is not None else ObjectiveSettings()
        self.task_energy_j = 0.0
        self.clock: float | None = None
        #: the newest observation time of an applied node event [s since epoch, as Slurm's
        #: side stamped it]: a node event observed before it is stale (validation)
        self.node_clock: float | None = None
        self.revision = 0
        self.pool: dict[str, float] = {}        # idle node -> idle since [s]
        self.holder: dict[str, str] = {}        # idle node -> task id holding it
        # node -> what it has (GPUs, features): replaced by each SyncNodes that carries kinds
        # (retention: bounded by max_event_nodes); a node not in it is PLAIN_NODE
        self.kinds: dict[str, NodeKind] = {}
        self.tasks: dict[str, Task] = {}        # submit order
        self.active: dict[str, Task] = {}       # unfinished tasks, submit order
        self.active_owners: Counter[str] = Counter()  # owner -> its tasks in ``active``
        #: owner -> (its tasks in ``tasks``: unfinished, and finished ones not yet retired;
        #: their :func:`retained_bytes` together): what the per-owner caps
        #: ``max_retained_tasks_per_owner`` / ``max_retained_task_bytes_per_owner`` bound
        #: (checked by the engine at a capped submit); an owner with none has no entry
        self.retained_owners: dict[str, tuple[int, int]] = {}
        #: (finish time [s], task id) of the finished tasks still in ``tasks``, oldest first
        self.finished: deque[tuple[float, str]] = deque()
        #: ids of the tasks that may have changed, and of those retired, since the last
        #: snapshot (:meth:`snapshot_changes`; not persisted: a loaded state starts clean)
        self.changed: set[str] = set()
        self.removed: set[str] = set()
        self.last_seq: dict[str, int] = {}
        self.next_task_number = 1
        self.total_samples = 0.0
        self.idle_node_seconds = 0.0
        self.used_node_seconds = 0.0

    def event_time(self, event_time: float) -> float:
        """The time [s] an event stamped ``event_time`` is applied at: never before the
        clock (docs/architecture.md, "Time and events")."""
        return event_time if self.clock is None else max(event_time, self.clock)

    def retirement_horizon(self, t: float) -> float:
        """[s] The tasks that finished at or before this time leave the state when an event
        is applied at ``t`` (``finished_task_retention_s``)."""
        return t - self.finished_task_retention_s

    def retain(self, task: Task) -> None:
        """Count ``task`` (now in ``tasks``) in its owner's :attr:`retained_owners`."""
        n, size = self.retained_owners.get(task.owner, (0, 0))
        self.retained_owners[task.owner] = (n + 1, size + retained_bytes(task))

    def release(self, task: Task) -> None:
        """Take ``task`` (gone from ``tasks``) off its owner's :attr:`retained_owners`."""
        n, size = self.retained_owners.get(task.owner, (1, 0))
        if n <= 1:
            self.retained_owners.pop(task.owner, None)
        else:
            self.retained_owners[task.owner] = (n - 1, max(0, size - retained_bytes(task)))

    def mark_changed(self, event: Any, out: Outcome, touched: set[str]) -> None:
        """Record which tasks ``event`` may have changed: those admitted before or after it
        (``touched``: before; only admitted tasks accrue, hold nodes or are re-allocated), the
        task it names (submitted, cancelled, reported on), those it completed or placed, and
        those it retired (:meth:`snapshot_changes`)."""
        touched.update(task.task_id for task in self.admitted())
        if out.task_id:
            touched.add(out.task_id)
        touched.update(getattr(r, "task_id", "") for r in getattr(event, "reports", ()))
        task_id = getattr(event, "task_id", "")
        if task_id:
            touched.add(task_id)
        touched.update(out.completed_task_ids)
        touched.update(p.task_id for p in out.placements)
        gone = {task.task_id for task in out.retired}
        self.removed |= gone
        self.changed |= {i for i in touched if i in self.tasks}
        self.changed -= gone

    def snapshot_changes(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        """What an incremental snapshot writes: the state without its tasks (:meth:`to_dict`
        less ``tasks``), the tasks that may have changed since the last one
        (:meth:`Task.to_dict`, submit order) and the ids of the tasks retired since; then
        starts the next interval."""
        header = self.to_dict(with_tasks=False)
        changed = [self.tasks[i].to_dict() for i in sorted(self.changed, key=task_number)
                   if i in self.tasks]
        removed = sorted((i for i in self.removed if i not in self.tasks), key=task_number)
        self.changed, self.removed = set(), set()
        return header, changed, removed

    def mark_all_changed(self) -> None:
        """Make the next incremental snapshot write every task (after a load from a full or
        an unreliable snapshot)."""
        self.changed = set(self.tasks)

    def admitted(self) -> list[Task]:
        """The tasks considered by the allocation (submit order, at most maxJ)."""
        return list(itertools.islice(self.active.values(), self.max_running_tasks))

    @property
    def energy_j(self) -> float:
        """Energy of the idle pool while Offcut ran it [J]: the tasks' nodes plus the unused
        idle nodes at ``idle_node_power_w``."""
        unused = max(0.0, self.idle_node_seconds - self.used_node_seconds)
        return self.task_energy_j + unused * self.objective.idle_node_power_w

    def fill_figures(self, out: Outcome) -> None:
        """Put the state's step-log figures in ``out`` (after the event: the model's
        throughput of the running tasks [samples/s], admitted and running tasks, idle nodes,
        nodes in use)."""
        admitted = [t for t in self.admitted() if t.state is not TaskState.QUEUED]
        running = [t for t in admitted if t.state is TaskState.RUNNING]
        out.rate_samples_per_s = float(sum(t.rate for t in running))
        out.admitted_tasks = len(admitted)
        out.idle_nodes = len(self.pool)
        out.running_tasks = len(running)
        out.nodes_in_use = len(self.holder)

    def to_dict(self, with_tasks: bool = True) -> dict[str, Any]:
        """The whole state as JSON-able data (for snapshots; without ``tasks`` unless
        ``with_tasks``)."""
        d = {
            "tfwd_s": self.tfwd_s, "max_running_tasks": self.max_running_tasks,
            "clock": self.clock, "node_clock": self.node_clock, "revision": self.revision,
            "pool": self.pool,
            "kinds": {n: [k.gpus, list(k.features)] for n, k in self.kinds.items()},
            "last_seq": self.last_seq,
            "next_task_number": self.next_task_number, "total_samples": self.total_samples,
            "idle_node_seconds": self.idle_node_seconds,
            "used_node_seconds": self.used_node_seconds,
            "objective": asdict(self.objective), "task_energy_j": self.task_energy_j,
            "max_failed_generations": self.max_failed_generations,
            "finished_task_retention_s": self.finished_task_retention_s,
            "final_grace_s": self.final_grace_s,
        }
        if with_tasks:
            d["tasks"] = [t.to_dict() for t in self.tasks.values()]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SchedulerState":
        """Inverse of :meth:`to_dict`."""
        core = cls(d["tfwd_s"], d["max_running_tasks"],
                   objective=ObjectiveSettings(**d["objective"]),
                   max_failed_generations=d["max_failed_generations"],
                   finished_task_retention_s=d["finished_task_retention_s"],
                   # (absent in format-4 snapshots written before the final phase existed:
                   # a task completed at its report)
                   final_grace_s=d.get("final_grace_s", 0.0))
        core.task_energy_j = d["task_energy_j"]
        core.clock, core.revision = d["clock"], d["revision"]
        core.node_clock = d["node_clock"]
        core.pool = dict(d["pool"])
        core.kinds = {n: NodeKind(g, tuple(f)) for n, (g, f) in d["kinds"].items()}
        core.tasks = {t["task_id"]: Task.from_dict(t) for t in d["tasks"]}
        core.active = {k: t for k, t in core.tasks.items() if not t.state.finished}
        core.active_owners = Counter(t.owner for t in core.active.values())
        for task in core.tasks.values():
            core.retain(task)
        core.finished = deque(sorted((t.finish_time or 0.0, k) for k, t in core.tasks.items()
                                     if t.state.finished))
        core.holder = {n: t.task_id for t in core.tasks.values() for n in t.nodes}
        core.last_seq = dict(d["last_seq"])
        core.next_task_number = d["next_task_number"]
        core.total_samples = d["total_samples"]
        core.idle_node_seconds = d["idle_node_seconds"]
        core.used_node_seconds = d["used_node_seconds"]
        return core

    def fingerprint(self) -> tuple:
        """A comparable summary of the state (tests: state before == state after)."""
        return (self.clock, self.node_clock, self.revision, tuple(sorted(self.pool.items())),
                tuple(sorted(self.kinds.items())),
                tuple((t.task_id, t.state.value, tuple(t.nodes), round(t.work_done, 6))
                      for t in self.tasks.values()),
                tuple(sorted(self.last_seq.items())))

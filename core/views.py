"""One form per concept for what the daemon answers: tasks, decisions, placement updates,
status (docs/architecture.md, "Layers"). Plain dataclasses with units, shared by the daemon
(its application builds them, :mod:`offcut.daemon.app.replies`) and the client (which returns
them, :class:`offcut.client.Client`); :mod:`offcut.wire.tasks` is their one conversion to and
from the ``offcut.v1`` messages. Nothing here knows the wire.

Units: times are float seconds since the Unix epoch (UTC), None where unset; durations [s];
work [samples]; rates [samples/s]; energy [J]; power [W]; solve times [ms].

The journal stores a reply's decision and tasks as JSON (``Decision.to_dict``,
``TaskView.to_dict``; docs/architecture.md, "Durability"): their field names and order are
that stored form, so they change only with the reply format
(:data:`offcut.daemon.app.replies.REPLY_FORMAT`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from offcut.taskspec import TaskSpec

__all__ = [
    "MEASURED", "MODELLED", "Decision", "EnergyView", "EventFigures", "HistoryEntry",
    "MeasuredCount", "ModelView", "PlacementChange", "PlacementUpdate", "ProgressReply",
    "SnapshotStatistics", "SolveSummary", "SolverStatistics", "StatusView", "TaskReply",
    "TaskState", "TaskView", "TaskWarning",
]


class TaskState(str, Enum):
    """Life cycle of a task (``offcut.v1.TaskState``; the journal stores the value)."""

    QUEUED = "queued"        # waiting for admission (max_running_tasks)
    ADMITTED = "admitted"    # considered by the allocation, holds no node
    RUNNING = "running"      # holds >= 1 node
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"        # its program failed (reported by the launcher)

    @property
    def finished(self) -> bool:
        """True for completed, cancelled and failed tasks."""
        return self in (TaskState.COMPLETED, TaskState.CANCELLED, TaskState.FAILED)


@dataclass
class TaskWarning:
    """One warning about a task (docs/execution.md, "Wasted work"; ``offcut.v1.TaskWarning``):
    its ``kind`` (``no-checkpoint``, ``crash-loop``, ``stop-ignored``, ``final-grace``), the
    ``message`` in words, the event ``time`` it was noted [s since epoch], the ``generation``
    it concerns. (Field order: a decision's journaled warnings are ``asdict`` of these.)"""

    task_id: str
    kind: str
    message: str
    time: float
    generation: int

    @classmethod
    def of(cls, task_id: str, entry: dict[str, Any]) -> "TaskWarning":
        """The warning of a ``Task.warnings`` entry (``kind``, ``message``, ``time``,
        ``generation``) of task ``task_id``."""
        return cls(kind=entry["kind"], message=entry["message"], time=entry["time"],
                   generation=entry["generation"], task_id=task_id)

    def entry(self) -> dict[str, Any]:
        """The ``Task.warnings`` entry (without the task id), as the journal stores it."""
        return {"kind": self.kind, "message": self.message, "time": self.time,
                "generation": self.generation}


@dataclass
class MeasuredCount:
    """One node count a learner measured: throughput [samples/s], observed time [s], power
    [W] (0 when no energy was reported)."""

    nodes: int
    samples_per_s: float
    seconds: float
    power_w: float


@dataclass
class ModelView:
    """What a task's learner knows (tasks that report progress; issue "Learn scalability
    online"). Rescale costs [s] in use and measured (None until measured); the last accepted
    report (time [s since epoch], None before any; cumulative samples; cumulative energy [J]
    or None); for a learned task the curve the allocation uses with its uncertainty band
    [samples/s]."""

    rescale_up_s: float
    rescale_down_s: float
    measured_rescale_up_s: float | None = None
    measured_rescale_down_s: float | None = None
    measured: list[MeasuredCount] = field(default_factory=list)
    last_report_time: float | None = None
    last_samples_done: float = 0.0
    last_energy_j: float | None = None
    curve_node_counts: list[int] = field(default_factory=list)
    curve_throughputs: list[float] = field(default_factory=list)
    curve_low: list[float] = field(default_factory=list)
    curve_high: list[float] = field(default_factory=list)
    #: the time lost to the measured rescales and preemptions [s] and how many
    measured_rescale_lost_s: float = 0.0
    measured_rescales: int = 0

    @property
    def has_report(self) -> bool:
        """Whether a progress report was accepted (``last_report_time`` is set)."""
        return self.last_report_time is not None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelView":
        """Inverse of ``dataclasses.asdict``."""
        d = dict(d)
        d["measured"] = [MeasuredCount(**m) for m in d.get("measured", [])]
        return cls(**d)


#: where a task's shown energy comes from (``EnergyView.source``)
MEASURED, MODELLED = "measured", "modelled"


@dataclass
class EnergyView:
    """A task's energy as shown (docs/execution.md, "Energy"; ``offcut.v1.TaskEnergy``):
    ``source`` :data:`MEASURED` (the sum of what its processes measured on their GPUs,
    ``Tasks.ReportEnergy``) or :data:`MODELLED` (the daemon's model: an estimate);
    ``joules`` [J]; ``samples_per_joule`` [samples/J] (0 when ``joules`` is 0).
    Measured only: generations with a report, the newest of them, its sum [J], its ranks
    that reported and its world size."""

    source: str
    joules: float
    samples_per_joule: float
    generations_reported: int = 0
    last_generation: int = 0
    last_generation_joules: float = 0.0
    last_generation_ranks: int = 0
    last_generation_world_size: int = 0


@dataclass
class TaskView:
    """A task as answered: its spec, owner, state, times [s since epoch; None unset], nodes,
    progress projected to the scheduler's clock (work [samples], rate [samples/s]), counters,
    execution (generation, failed runs, reason; docs/execution.md), energy [J] (modelled or
    reported), modelled power [W], learned model (None for a task without reports), and the
    energy as shown (measured or modelled)."""

    task_id: str
    spec: TaskSpec
    owner: str
    state: TaskState
    submit_time: float | None
    admit_time: float | None
    finish_time: float | None
    nodes: list[str]
    work_done_samples: float
    rate_samples_per_s: float
    rescales: int
    preemptions: int
    launches: int
    last_run: str
    generation: int
    failed_runs: int
    failure_reason: str
    energy_j: float
    power_w: float
    model: ModelView | None = None
    energy: EnergyView | None = None
    # wasted work and the final phase (docs/execution.md, "Wasted work", "Completion")
    samples_redone: float = 0.0
    failures_without_progress: int = 0
    warnings: list[TaskWarning] = field(default_factory=list)
    work_reached_time: float | None = None
    # the launch of its generations (docs/execution.md, "Waiting for the launcher")
    started_generation: int = 0
    generation_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the journal's; warnings without their task id)."""
        d = asdict(self)
        d["spec"] = self.spec.to_dict()
        d["state"] = self.state.value
        d["warnings"] = [w.entry() for w in self.warnings]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskView":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["spec"] = TaskSpec.from_dict(d["spec"])
        d["state"] = TaskState(d["state"])
        d["model"] = ModelView.from_dict(d["model"]) if d.get("model") is not None else None
        d["energy"] = EnergyView(**d["energy"]) if d.get("energy") is not None else None
        d["warnings"] = [TaskWarning.of(d["task_id"], w) for w in d.get("warnings", [])]
        return cls(**d)


@dataclass
class PlacementChange:
    """How one task's node set changed (``offcut.v1.Placement``): ``change`` is one of
    ``start | grow | shrink | stop | preempted | completed | cancelled | failed | restart``;
    ``nodes`` held after it (sorted), the count before it, the modelled ``rate``
    [samples/s] after it, ``work_done`` and ``total_work`` [samples], the ``time`` it took
    effect [s since epoch] and the task's generation after it (docs/execution.md)."""

    task_id: str
    task_name: str
    change: str
    nodes: list[str]
    previous_count: int
    rate: float
    work_done: float
    total_work: float
    time: float
    generation: int = 0


@dataclass
class EventFigures:
    """BFTrainer's step-log figures of one event (arXiv 2106.12091, Section 5;
    ``offcut.v1.EventStats``): the interval since the previous event [s], net samples earned
    in it, the rate after it [samples/s], rescale and preemption losses [samples], nodes that
    left / joined the pool, tasks preempted, and the pool, tasks and nodes in use after it."""

    interval_s: float = 0.0
    progress_samples: float = 0.0
    rate_samples_per_s: float = 0.0
    rescale_cost_samples: float = 0.0
    nodes_left: int = 0
    tasks_preempted: int = 0
    nodes_joined: int = 0
    admitted_tasks: int = 0
    idle_nodes: int = 0
    running_tasks: int = 0
    nodes_in_use: int = 0
    preemption_cost_samples: float = 0.0
    tasks_completed: int = 0


@dataclass
class SolveSummary:
    """The allocation solves of one event (``offcut.v1.SolveStats``): the configured and the
    answering backend, the last answer's status (``fallback`` when any solve fell back,
    ``skipped`` when none ran), objective and bound, their total time [ms], and the last
    fallback reason."""

    requested_solver: str
    solver: str = ""
    status: str = "skipped"
    objective: float = 0.0
    bound: float = 0.0
    solve_ms: float = 0.0
    fallback_reason: str = ""
    solves: int = 0


@dataclass
class Decision:
    """The answer to one applied event (``offcut.v1.Decision``): its time [s since epoch],
    source and sequence number, the revision it made, the placement changes, figures and
    solves, preempted names that were not idle, the tasks it completed."""

    time: float
    source: str
    seq: int
    revision: int
    placements: list[PlacementChange]
    stats: EventFigures
    solve: SolveSummary
    ignored_nodes: list[str] = field(default_factory=list)
    completed_task_ids: list[str] = field(default_factory=list)
    #: [s since epoch] the time the sender stamped on the event: data, not the clock
    #: (docs/security.md); None when it gave none
    sent_time: float | None = None
    #: warnings the event noted (docs/execution.md, "Wasted work"), in the order noted
    warnings: list[TaskWarning] = field(default_factory=list)
    #: a repeated request answered from the journal (set on the answer, never journaled)
    duplicate: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, the journal's: equal to ``dataclasses.asdict`` without ``duplicate``
        (field order included) but without its deep copies: the lists are the decision's own, so encode it at once (the journal's stored reply does, once per
        event)."""
        d = {name: getattr(self, name) for name in self.__dataclass_fields__
             if name != "duplicate"}
        d["placements"] = [dict(vars(p)) for p in self.placements]
        d["stats"], d["solve"] = dict(vars(self.stats)), dict(vars(self.solve))
        d["warnings"] = [dict(vars(w)) for w in self.warnings]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Decision":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["placements"] = [PlacementChange(**p) for p in d["placements"]]
        d["stats"] = EventFigures(**d["stats"])
        d["solve"] = SolveSummary(**d["solve"])
        d["warnings"] = [TaskWarning.of(w["task_id"], w) for w in d.get("warnings", [])]
        return cls(**d)


@dataclass
class TaskReply:
    """The answer to an event about one task (submit, cancel, run report, energy report):
    the task after it and the decision."""

    task: TaskView
    decision: Decision


@dataclass
class ProgressReply:
    """The answer to a progress report: the decision and the reported tasks after it."""

    decision: Decision
    tasks: list[TaskView] = field(default_factory=list)


@dataclass
class PlacementUpdate:
    """Placement changes and warnings of one revision (``WatchPlacements``): its time [s
    since epoch] and cause (``nodes | snapshot | submit | cancel | run | progress |
    energy``). ``owners``: the owner of each placed or warned task (by task id), kept by the
    daemon so that a user's stream is filtered without the engine's lock (in memory only,
    never journaled nor sent: empty in the client)."""

    revision: int
    time: float
    cause: str
    placements: list[PlacementChange]
    owners: dict[str, str] = field(default_factory=dict)
    warnings: list[TaskWarning] = field(default_factory=list)


@dataclass
class HistoryEntry:
    """One applied event of the journal (``ExportHistory``): its revision, kind (``nodes |
    snapshot | submit | cancel | run | progress | energy``), the stored decision (None only
    when the daemon sent none) and, for an event about one task, the task as answered then
    (else None)."""

    revision: int
    kind: str
    decision: Decision | None
    task: TaskView | None = None


@dataclass
class SolverStatistics:
    """Decision times since start [ms] (percentiles over every event that solved), fallbacks,
    solves per backend, the last fallback reason."""

    configured_solver: str
    decisions: int
    decision_ms_p50: float
    decision_ms_p95: float
    decision_ms_p99: float
    decision_ms_max: float
    fallbacks: int
    solves_by_backend: dict[str, int]
    last_fallback_reason: str


@dataclass
class SnapshotStatistics:
    """The snapshots written at events since start: count, percentiles and maximum of the
    time each held events back under the engine's lock [ms], the newest one's time [ms] and
    its event's revision (0: none yet)."""

    count: int
    ms_p50: float
    ms_p99: float
    ms_max: float
    last_ms: float
    last_revision: int


@dataclass
class StatusView:
    """The daemon's state in figures: event clock [s since epoch; None before any event],
    revision, pool, tasks per state, accounting [samples, node-seconds, J], settings, the
    last decision and solver statistics (None when not asked for or not shown).
    ``idle_node_names`` only when asked for; ``clock_mode`` (``live`` or ``replay``) is the
    gRPC edge's (empty in the application's view)."""

    clock: float | None
    revision: int
    idle_nodes: int
    nodes_in_use: int
    idle_node_names: list[str]
    tasks_by_state: dict[TaskState, int]
    solver: SolverStatistics | None
    last_seq: dict[str, int]
    total_samples: float
    idle_node_seconds: float
    used_node_seconds: float
    tfwd_s: float
    max_running_tasks: int
    objective: str
    eta: float
    task_energy_j: float
    energy_j: float
    last_decision: Decision | None
    snapshots: SnapshotStatistics | None = None
    #: nodes held for generations no launcher reported started (docs/execution.md, "Waiting
    #: for the launcher")
    nodes_awaiting_launch: int = 0
    clock_mode: str = ""

    @property
    def queued_tasks(self) -> int:
        """Tasks waiting for admission."""
        return self.tasks_by_state.get(TaskState.QUEUED, 0)

    @property
    def admitted_tasks(self) -> int:
        """Admitted tasks holding no node."""
        return self.tasks_by_state.get(TaskState.ADMITTED, 0)

    @property
    def running_tasks(self) -> int:
        """Tasks holding nodes."""
        return self.tasks_by_state.get(TaskState.RUNNING, 0)

    @property
    def completed_tasks(self) -> int:
        """Completed tasks (retained or archived)."""
        return self.tasks_by_state.get(TaskState.COMPLETED, 0)

    @property
    def cancelled_tasks(self) -> int:
        """Cancelled tasks (retained or archived)."""
        return self.tasks_by_state.get(TaskState.CANCELLED, 0)

    @property
    def failed_tasks(self) -> int:
        """Failed tasks (retained or archived)."""
        return self.tasks_by_state.get(TaskState.FAILED, 0)

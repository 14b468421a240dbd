"""What the application answers, in its own types: decisions, task views, status, and the
journal's stored form of a reply (docs/architecture.md, "Durability").

Nothing here knows the wire: :mod:`offcut.daemon.edge.protocol` converts these to ``offcut.v1``
messages at the gRPC edge, outside the engine's lock. The engine builds them under its lock
(they are copies, so a servicer may convert them at leisure) and stores each applied event's
:class:`Reply` in the journal as JSON (:meth:`Reply.to_record`), so a repeated request gets
the answer it got the first time and ``ExportHistory`` serves the history, whatever the
protocol's version.

Journal reply format (``REPLY_FORMAT``): ``{"format": 2, "decision": {...}, "tasks":
[...]}``, the fields of :class:`Decision` and :class:`TaskView` by name (times in s since the
epoch, None where unset), as state-file format 4 (the first released one) stores it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from offcut.daemon.app.model import Task, TaskSpec, TaskState

from offcut.daemon.app.scheduler.outcome import PlacementChange

if TYPE_CHECKING:
    from offcut.daemon.app.scheduler import Outcome, Scheduler

#: the version of the stored reply written by this release
REPLY_FORMAT = 2


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
    report (time [s since epoch], cumulative samples, cumulative energy [J] or None); for a
    learned task the curve the allocation uses with its uncertainty band [samples/s]."""

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
    #: the time lost to the measured rescales and preemptions [s] and how many (absent in
    #: answers stored by releases before it)
    measured_rescale_lost_s: float = 0.0
    measured_rescales: int = 0

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
    ``Tasks.ReportEnergy``) or :data:`MODELLED` (``Task.energy_j``, the daemon's model: an
    estimate); ``joules`` [J]; ``samples_per_joule`` [samples/J] (0 when ``joules`` is 0).
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


def energy_view(task: Task) -> EnergyView:
    """``task``'s :class:`EnergyView`: measured once any of its processes reported, with the
    samples of its last progress report (else its work done); else modelled, with its work
    done [samples]."""
    ledger = task.energy
    if ledger is None or not ledger.measured:
        joules, samples = task.energy_j, task.work_done
        return EnergyView(MODELLED, joules, samples / joules if joules > 0 else 0.0)
    last = task.learner.last_report if task.learner is not None else None
    samples = last[1] if last is not None else task.work_done
    joules = ledger.total_j
    g, g_joules, g_ranks, g_size = ledger.last()
    return EnergyView(MEASURED, joules, samples / joules if joules > 0 else 0.0,
                      generations_reported=ledger.generations, last_generation=g,
                      last_generation_joules=g_joules, last_generation_ranks=g_ranks,
                      last_generation_world_size=g_size)


@dataclass
class TaskView:
    """A task as answered: its spec, owner, state, times [s since epoch; None unset], nodes,
    progress projected to the scheduler's clock (work [samples], rate [samples/s]), counters,
    execution (generation, failed runs, reason; docs/execution.md), energy [J] (modelled or
    reported), modelled power [W], learned model, and the energy as shown (measured or
    modelled; None in answers stored by releases before it)."""

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
    # wasted work and the final phase (docs/execution.md, "Wasted work", "Completion");
    # absent in answers stored by releases before them
    samples_redone: float = 0.0
    failures_without_progress: int = 0
    warnings: list[dict[str, Any]] = field(default_factory=list)
    work_reached_time: float | None = None
    # the launch of its generations (docs/execution.md, "Waiting for the launcher")
    started_generation: int = 0
    generation_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        d = asdict(self)
        d["spec"] = self.spec.to_dict()
        d["state"] = self.state.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskView":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["spec"] = TaskSpec.from_dict(d["spec"])
        d["state"] = TaskState(d["state"])
        d["model"] = ModelView.from_dict(d["model"]) if d.get("model") is not None else None
        d["energy"] = EnergyView(**d["energy"]) if d.get("energy") is not None else None
        return cls(**d)


def model_view(task: Task, scheduler: "Scheduler") -> ModelView | None:
    """What the task's learner knows (None for a task without reports)."""
    learner = task.learner
    if learner is None:
        return None
    up, down = scheduler.rescale_costs(task)
    measured_up, measured_down = learner.measured_rescale_s()
    view = ModelView(rescale_up_s=up, rescale_down_s=down, measured_rescale_up_s=measured_up,
                     measured_rescale_down_s=measured_down, measured=[
                         MeasuredCount(nodes=n, samples_per_s=m["rate"], seconds=m["seconds"],
                                       power_w=m["power_w"] or 0.0)
                         for n, m in sorted(learner.measured().items())])
    last = learner.last_report
    if last is not None:
        view.last_report_time, view.last_samples_done, view.last_energy_j = last
    view.measured_rescale_lost_s, view.measured_rescales = learner.rescale_loss()
    if task.spec.learned and not task.state.finished:
        ns, ps = scheduler.learned_curve(task)
        view.curve_node_counts = [int(n) for n in ns]
        view.curve_throughputs = [float(p) for p in ps]
        prior = scheduler.prior_rate()
        bands = [learner.band(int(n), prior) for n in ns]
        view.curve_low = [b[0] for b in bands]
        view.curve_high = [b[2] for b in bands]
    return view


def task_view(task: Task, scheduler: "Scheduler") -> TaskView:
    """A copy of ``task`` as answered, its progress projected to the scheduler's clock."""
    return TaskView(
        task_id=task.task_id, spec=task.spec, owner=task.owner, state=task.state,
        submit_time=task.submit_time, admit_time=task.admit_time,
        finish_time=task.finish_time, nodes=list(task.nodes),
        work_done_samples=task.work_done, rate_samples_per_s=task.rate,
        rescales=task.rescales, preemptions=task.preemptions, launches=task.launches,
        last_run=task.last_run, generation=task.generation, failed_runs=task.failed_runs,
        failure_reason=task.failure_reason, energy_j=task.energy_j, power_w=task.power,
        model=model_view(task, scheduler), energy=energy_view(task),
        samples_redone=task.samples_redone,
        failures_without_progress=task.failures_without_progress,
        warnings=[dict(w) for w in task.warnings], work_reached_time=task.work_reached_time,
        started_generation=task.started_generation, generation_time=task.generation_time)


@dataclass
class EventFigures:
    """BFTrainer's step-log figures of one event (arXiv 2106.12091, Section 5): the interval since
    the previous event [s], net samples earned in it, the rate after it [samples/s], rescale
    and preemption losses [samples], nodes that left / joined the pool, tasks preempted, and
    the pool, tasks and nodes in use after it."""

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
    """The allocation solves of one event: the configured and the answering backend, the
    last answer's status (``fallback`` when any solve fell back, ``skipped`` when none ran),
    objective and bound, their total time [ms], and the last fallback reason."""

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
    """The answer to one applied event (``offcut.v1.Decision`` at the edge)."""

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
    #: warnings the event noted (docs/execution.md, "Wasted work"): ``Task.warnings`` entries
    #: with their ``task_id``, in the order noted
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, equal to ``dataclasses.asdict`` (field order included) but without
        its deep copies: the lists are the decision's own, so encode it at once (the journal's
        stored reply does, once per event)."""
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["placements"] = [dict(vars(p)) for p in self.placements]
        d["stats"], d["solve"] = dict(vars(self.stats)), dict(vars(self.solve))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Decision":
        """Inverse of :meth:`to_dict` (and of ``dataclasses.asdict``)."""
        d = dict(d)
        d["placements"] = [PlacementChange(**p) for p in d["placements"]]
        d["stats"] = EventFigures(**d["stats"])
        d["solve"] = SolveSummary(**d["solve"])
        return cls(**d)


def decision_of(out: "Outcome", requested_solver: str,
                sent_time: float | None = None) -> Decision:
    """The decision of an applied event's :class:`~offcut.daemon.app.scheduler.Outcome`;
    ``sent_time`` [s since epoch]: the event's time as its sender stamped it (None: none)."""
    solve = SolveSummary(requested_solver=requested_solver, solves=len(out.solves),
                         solve_ms=sum(s.solve_ms for s in out.solves))
    if out.solves:
        last = out.solves[-1]
        solve.solver, solve.objective, solve.bound = last.solver, last.objective, last.bound
        reasons = [s.fallback_reason for s in out.solves if s.fallback_reason]
        solve.status = "fallback" if reasons else last.status
        solve.fallback_reason = reasons[-1] if reasons else ""
    stats = EventFigures(tasks_completed=len(out.completed_task_ids), **{
        f.name: getattr(out, f.name) for f in fields(EventFigures) if f.name != "tasks_completed"})
    return Decision(time=out.time, source=out.source, seq=out.seq, revision=out.revision,
                    placements=list(out.placements), stats=stats,
                    solve=solve, ignored_nodes=list(out.ignored_nodes),
                    completed_task_ids=list(out.completed_task_ids), sent_time=sent_time,
                    warnings=[{"task_id": task_id, **w} for task_id, w in out.warnings])


@dataclass
class Reply:
    """The answer to one applied event: its decision, and the tasks it answers about (the
    submitted, cancelled or reported task; every task of a progress report; none for node
    events). ``duplicate``: a repeated request answered from the journal."""

    decision: Decision
    tasks: list[TaskView] = field(default_factory=list)
    duplicate: bool = False

    def to_record(self) -> bytes:
        """The journal's stored form (format :data:`REPLY_FORMAT`, UTF-8 JSON)."""
        return json.dumps({"format": REPLY_FORMAT, "decision": self.decision.to_dict(),
                           "tasks": [t.to_dict() for t in self.tasks]},
                          separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, stored: bytes) -> "Reply":
        """Inverse of :meth:`to_record`; ValueError for another format or undecodable data."""
        d = json.loads(bytes(stored).decode())
        if not isinstance(d, dict) or d.get("format") != REPLY_FORMAT:
            raise ValueError(f"stored reply of format {d.get('format') if isinstance(d, dict) else '?'}"
                             f", this release reads format {REPLY_FORMAT}")
        return cls(decision=Decision.from_dict(d["decision"]),
                   tasks=[TaskView.from_dict(t) for t in d["tasks"]])


@dataclass
class PlacementUpdate:
    """Placement changes of one revision, as streamed by ``WatchPlacements``; ``owners``: the
    owner of each placed task (by task id), so that a user's stream is filtered without the
    engine's lock (kept in memory only, never journaled)."""

    revision: int
    time: float
    cause: str
    placements: list[PlacementChange]
    owners: dict[str, str] = field(default_factory=dict)
    #: warnings noted at this revision: (task id, ``Task.warnings`` entry)
    warnings: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


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
    time each held events back under the engine's lock [ms] (building it, committing it with
    its event's journal row, the retention after it; within 1 %: the sketch of
    :mod:`offcut.daemon.app.decision_times`), the newest one's time [ms] and its event's
    revision (0: none yet)."""

    count: int
    ms_p50: float
    ms_p99: float
    ms_max: float
    last_ms: float
    last_revision: int


@dataclass
class StatusView:
    """The daemon's state in figures: event clock [s since epoch], revision, pool, tasks per
    state, accounting [samples, node-seconds, J], settings, the last decision and solver
    statistics (None when not asked for). ``idle_node_names`` only when asked for."""

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

"""Domain types of the scheduler: task specs, tasks, node events
(docs/architecture.md, "Time and events" and "Tasks and the progress model").

Times are float seconds since the Unix epoch (UTC), taken from the events themselves; nothing
here reads a clock. Node counts are ints, work is in samples, throughput in samples/s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from offcut.errors import InvalidArgument
from offcut.nodes import all_node_names, is_node_name
from offcut.taskspec import FEATURE_RE, TaskSpec
from offcut.views import TaskState

#: most gpu GRES a node may be reported with (``NodeKind.gpus``)
MAX_NODE_GPUS = 1024
#: most features a node may be reported with (``NodeKind.features``)
MAX_NODE_FEATURES = 64


@dataclass(frozen=True)
class NodeKind:
    """What one node has, as Slurm configures it (docs/architecture.md, "Node kinds"):
    ``gpus``, its gpu GRES (0 to :data:`MAX_NODE_GPUS`); ``features``, its active features
    (sorted, at most :data:`MAX_NODE_FEATURES`, each matching
    :data:`offcut.taskspec.FEATURE_RE`). A node the daemon was never told about has no GPUs
    and no features."""

    gpus: int = 0
    features: tuple[str, ...] = ()

    def fits(self, spec: TaskSpec) -> bool:
        """Whether a node of this kind may run a task of ``spec``: it has every feature of
        ``spec.constraint`` and, for a GPU task, at least ``spec.gpus_per_node`` GPUs; a CPU
        task (``gpus_per_node == 0``) runs only on nodes without GPUs (a GPU node is kept
        for the tasks that need it)."""
        if spec.gpus_per_node:
            if self.gpus < spec.gpus_per_node:
                return False
        elif self.gpus:
            return False
        return all(f in self.features for f in spec.constraint)

    def check(self, field_name: str) -> None:
        """InvalidArgument naming ``field_name`` when a bound is broken."""
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) \
                or not 0 <= self.gpus <= MAX_NODE_GPUS:
            raise InvalidArgument(f"gpus must be 0 to {MAX_NODE_GPUS}, got {self.gpus!r}",
                                  field_name)
        if len(self.features) > MAX_NODE_FEATURES:
            raise InvalidArgument(f"has {len(self.features)} features, more than "
                                  f"{MAX_NODE_FEATURES}", field_name)
        for feature in self.features:
            if not isinstance(feature, str) or not FEATURE_RE.fullmatch(feature):
                raise InvalidArgument(f"feature {str(feature)[:70]!r} must be 1-64 letters, "
                                      "digits, '_', '.' or '-'", field_name)


#: the kind of a node nothing was said of
PLAIN_NODE = NodeKind()


@dataclass(frozen=True)
class ObjectiveSettings:
    """What the allocation maximises, and the power figures of the energy objectives
    (DaemonConfig options of the same names; docs/architecture.md, "Allocation policies").

    Attributes:
        objective: the allocation policy's name (the ``policy`` setting; state-file format
            4 stores it under this name): a built-in of :data:`offcut.daemon.config.OBJECTIVES`,
            ``throughput`` (BFTrainer's: samples over the look-ahead), ``energy`` (samples
            per joule), ``zeus_cost`` (samples per unit of Zeus's cost
            ``eta * E + (1 - eta) * MAXPOWER * T``, NSDI '23, Section 3; ``energy`` is eta = 1; both
            solved exactly by Dinkelbach's method over the exact backends,
            ``offcut.daemon.app.solvers.fractional``) or ``fair_share`` (max-min fair node-hours
            per owner), or a third-party policy's entry-point name
            (:mod:`offcut.daemon.app.policies`).
        eta: the zeus_cost knob (eta_knob) in [0, 1].
        node_power_w: prior draw [W] of one node running a task, used until the task's spec
            (``power_w``) or its energy reports say otherwise.
        idle_node_power_w: draw [W] of an idle node that no task uses (it stays on).
        node_max_power_w: maximum power [W] of one node (Zeus's MAXPOWER, per node).
        prior_rate_per_node: throughput [samples/s per node] assumed for a learned task before
            any task has been measured.
    """

    objective: str = "throughput"
    eta: float = 0.5
    node_power_w: float = 1000.0
    idle_node_power_w: float = 250.0
    node_max_power_w: float = 1600.0
    prior_rate_per_node: float = 1.0

    @property
    def effective_eta(self) -> float:
        """eta of the ratio objective: 1 for ``energy``, ``eta`` for ``zeus_cost``, 0 for
        every other policy (no ratio objective)."""
        return {"energy": 1.0, "zeus_cost": self.eta}.get(self.objective, 0.0)


@dataclass
class Task:
    """A submitted task and its progress as of the core's clock.

    ``nodes`` are the names it holds (sorted); ``work_done`` [samples] is net of rescale and
    preemption losses; ``rate`` [samples/s] is ``spec.throughput_at(len(nodes))``;
    ``node_seconds`` [node-s] is ``len(nodes) * dt`` accrued over its life (snapshots written
    before it existed load as 0).
    """

    task_id: str
    spec: TaskSpec
    owner: str
    submit_time: float
    state: TaskState = TaskState.QUEUED
    admit_time: float | None = None
    finish_time: float | None = None
    nodes: list[str] = field(default_factory=list)
    work_done: float = 0.0
    rate: float = 0.0
    rescales: int = 0
    preemptions: int = 0
    request_id: str = ""
    launches: int = 0        # runs reported started (live mode)
    last_run: str = ""       # the last run report, in words
    energy_j: float = 0.0    # energy of its nodes so far [J] (reported, or modelled between reports)
    power: float = 0.0       # modelled draw [W] at its current node count
    generation: int = 0      # docs/execution.md: + 1 at every change of its node set and restart
    failed_runs: int = 0     # every failed run of its current generations so far
    failure_reason: str = ""  # the last failure that restarted or failed it, in words
    node_seconds: float = 0.0  # nodes held x seconds so far [node-s] (fair_share's usage)
    learner: Any = field(default=None, repr=False)  # offcut.daemon.app.learning.TaskLearner
    #: what its processes measured (offcut.daemon.app.scheduler.ledger.EnergyLedger; None: nothing
    #: yet); docs/execution.md, "Energy"
    energy: Any = field(default=None, repr=False)
    # wasted work (docs/execution.md, "Wasted work"; daemon/app/scheduler/waste.py)
    samples_redone: float = 0.0       # [samples] trained again: restarts below the latest report
    reported_high: float = 0.0        # [samples] the most any report said (a high-water mark)
    report_generation: int = 0        # the generation of the last accepted report
    failures_without_progress: int = 0  # failed runs in a row with no progress beyond ...
    failure_progress: float = -1.0    # ... the reported samples at the previous failure
    warnings: list[dict[str, Any]] = field(default_factory=list)  # TaskWarning dicts, oldest first
    #: when a report reached the total work while launched processes still ran (docs/execution.md,
    #: "Completion"): COMPLETED when they exit 0, or ``final_grace_s`` later
    work_reached_time: float | None = None
    #: the newest generation a launcher reported started (docs/execution.md, "Waiting for the
    #: launcher"); below ``generation`` while the current generation's jobs have not started
    started_generation: int = 0
    generation_time: float | None = None  # [s] when the current generation was placed

    @property
    def awaiting_launch(self) -> bool:
        """Whether it holds nodes for a generation no launcher has reported started."""
        return bool(self.nodes) and self.started_generation < self.generation

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for snapshots."""
        # field by field (dataclasses.asdict would deep-copy the spec only to replace it);
        # the one mutable field, ``nodes``, is copied
        d = {f.name: getattr(self, f.name) for f in _TASK_FIELDS}
        d["nodes"] = list(self.nodes)
        d["warnings"] = [dict(w) for w in self.warnings]
        d["spec"] = self.spec.to_dict()
        d["state"] = self.state.value
        d["learner"] = self.learner.to_dict() if self.learner is not None else None
        d["energy"] = self.energy.to_dict() if self.energy is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["spec"] = TaskSpec.from_dict(d["spec"])
        d["state"] = TaskState(d["state"])
        if d.get("learner") is not None:
            from offcut.daemon.app.learning import TaskLearner
            d["learner"] = TaskLearner.from_dict(d["learner"])
        if d.get("energy") is not None:
            from offcut.daemon.app.scheduler.ledger import EnergyLedger
            d["energy"] = EnergyLedger.from_dict(d["energy"])
        return cls(**d)


#: :class:`Task`'s fields, in declaration order (:meth:`Task.to_dict`)
_TASK_FIELDS = fields(Task)


def task_number(task_id: str) -> int:
    """The submit number of a task id ``t<number>`` (``t000042`` -> 42; 0 when malformed)."""
    digits = task_id[1:]
    return int(digits) if digits.isascii() and digits.isdigit() else 0  # ("²".isdigit())


def check_node_names(names: list[str], field_name: str) -> None:
    """Raise :class:`InvalidArgument` naming ``field_name`` if any name is malformed or repeated
    (the message names the first bad entry)."""
    if all_node_names(names) and len(set(names)) == len(names):
        return  # the common case, checked at once; the loop below finds what is wrong
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not is_node_name(name):
            shown = repr(name)[:60]
            raise InvalidArgument(f"entry {i} ({shown}) is not a valid node name", field_name)
        if name in seen:
            raise InvalidArgument(f"node {name!r} is listed twice", field_name)
        seen.add(name)


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class NodeEvent:
    """Nodes that became idle and idle nodes taken back, at ``time`` [s since epoch] (the
    event clock's time: the daemon's receive time on a live daemon); ``sent_time`` [s since
    epoch] is the time the sender stamped on it, kept as data (None: it gave none)."""

    time: float
    source: str
    seq: int
    idle: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()
    snapshot: bool = False  # True: ``idle`` is the full idle set (SyncNodes)
    sent_time: float | None = None
    #: (node, kind) of every node the sender knows (SyncNodes only): when non-empty it
    #: replaces the daemon's table of node kinds; empty: the table stays as it is
    kinds: tuple[tuple[str, NodeKind], ...] = ()

    @property
    def observed_time(self) -> float:
        """When Slurm's side observed it [s since epoch]: ``sent_time``, else ``time``."""
        return self.time if self.sent_time is None else self.sent_time


@dataclass(frozen=True)
class SubmitEvent:
    """A task submission at ``time`` [s since epoch] by ``owner``; ``request_id`` makes
    retries idempotent; ``sent_time``: the sender's ``submit_time`` (data; None: unset)."""
    time: float
    spec: TaskSpec
    owner: str
    request_id: str = ""
    sent_time: float | None = None


@dataclass(frozen=True)
class CancelEvent:
    """Cancellation of task ``task_id`` at ``time`` [s since epoch]; ``sent_time``: the
    sender's time (data; None: unset); ``request_id`` makes a retry idempotent (per caller)."""
    time: float
    task_id: str
    sent_time: float | None = None
    request_id: str = ""


#: run states a launcher reports (TaskRunEvent.state; docs/execution.md)
RUN_STATES = ("started", "preempted", "finished", "failed", "interrupted")


@dataclass(frozen=True)
class TaskRunEvent:
    """What happened to a run of task ``task_id`` at ``time`` [s since epoch] (from the
    launcher): ``state`` in :data:`RUN_STATES`. ``finished`` completes the task; ``started``
    and ``preempted`` are recorded. ``generation`` is the run's generation (docs/execution.md);
    with it, ``failed`` and ``interrupted`` of the current generation restart the task on the
    same nodes (``failed`` fails it after ``max_failed_generations`` in a row) and reports of
    earlier generations are only recorded; without it (None), ``failed`` fails the task at
    once. ``request_id`` makes retries idempotent; ``sent_time``: the sender's time (data;
    None: unset)."""
    time: float
    task_id: str
    state: str
    node: str = ""
    job_id: str = ""
    exit_code: int = 0
    message: str = ""
    request_id: str = ""
    generation: int | None = None
    sent_time: float | None = None
    stop_ignored: bool = False  # killed after the grace time: it ignored the stop signal

    def describe(self) -> str:
        """The report in words (``Task.last_run``)."""
        words = [self.state]
        if self.generation is not None:
            words.append(f"in generation {self.generation}")
        if self.node:
            words.append(f"on {self.node}")
        if self.job_id:
            words.append(f"(job {self.job_id})")
        if self.exit_code or (self.job_id and self.state in ("failed", "interrupted")):
            words.append(f"exit code {self.exit_code}")  # a run that never started has none
        if self.message:
            words.append(f"- {self.message}")
        return " ".join(words)


@dataclass(frozen=True)
class ProgressReport:
    """One progress report of a task, as the learner sees it (``offcut.v1.ProgressReport``
    without the task id).

    Attributes:
        time: [s since epoch] when the task measured it; finite, > 0, not before its previous
            report's time.
        samples_done: cumulative samples processed since the task began [samples]; finite,
            >= 0, never decreases (a restart does not reset it).
        nodes: the node count it ran on since its previous report (what it holds now); >= 0
            and one of the counts it held since that report.
        energy_j: cumulative energy [J] of the task's nodes since it began, never decreasing;
            None = not measured.
    """

    time: float
    samples_done: float
    nodes: int
    energy_j: float | None = None


@dataclass(frozen=True)
class ProgressItem:
    """One task's progress report in a :class:`ProgressEvent`: ``task_id`` and the
    :class:`ProgressReport` its learner checks and takes."""
    task_id: str
    report: ProgressReport


@dataclass(frozen=True)
class ProgressEvent:
    """Progress reports of running tasks, applied together at ``time`` (the latest report's
    time) [s since epoch]. ``request_id`` makes retries idempotent."""
    time: float
    reports: tuple[ProgressItem, ...]
    request_id: str = ""


@dataclass(frozen=True)
class EnergyEvent:
    """What the GPUs of process ``rank`` of ``generation`` of task ``task_id`` drew since it
    started, ``joules`` [J] (cumulative; ``Tasks.ReportEnergy``, docs/execution.md, "Energy"),
    applied at ``time`` [s since epoch] (the daemon's receive time). ``request_id`` makes a
    retry idempotent (per caller); ``sent_time`` is always None (the report carries no time)."""
    time: float
    task_id: str
    generation: int
    rank: int
    joules: float
    request_id: str = ""
    sent_time: float | None = None


Event = NodeEvent | SubmitEvent | CancelEvent | TaskRunEvent | ProgressEvent | EnergyEvent


def event_to_dict(event: Event) -> dict[str, Any]:
    """JSON-able form of an event for the journal (``sent_time``, a node event's ``kinds`` and
    a cancellation's ``request_id`` only when set: rows stay as short as format 4 has them)."""
    if isinstance(event, NodeEvent):
        d = {"kind": "nodes", "time": event.time, "source": event.source, "seq": event.seq,
             "idle": list(event.idle), "preempted": list(event.preempted),
             "snapshot": event.snapshot}
        if event.kinds:  # (only when set)
            d["kinds"] = [[n, k.gpus, list(k.features)] for n, k in event.kinds]
    elif isinstance(event, SubmitEvent):
        d = {"kind": "submit", "time": event.time, "spec": event.spec.to_dict(),
             "owner": event.owner, "request_id": event.request_id}
    elif isinstance(event, TaskRunEvent):
        d = {"kind": "run", **asdict(event)}
        del d["sent_time"]
    elif isinstance(event, ProgressEvent):
        return {"kind": "progress", "time": event.time, "request_id": event.request_id,
                "reports": [{"task_id": r.task_id, **asdict(r.report)} for r in event.reports]}
    elif isinstance(event, EnergyEvent):
        return {"kind": "energy", "time": event.time, "task_id": event.task_id,
                "generation": event.generation, "rank": event.rank, "joules": event.joules,
                "request_id": event.request_id}
    else:
        d = {"kind": "cancel", "time": event.time, "task_id": event.task_id}
        if event.request_id:  # (only when set)
            d["request_id"] = event.request_id
    if event.sent_time is not None:
        d["sent_time"] = event.sent_time
    return d


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_dict`."""
    kind = d["kind"]
    sent = d.get("sent_time")
    if kind == "nodes":
        return NodeEvent(d["time"], d["source"], d["seq"], tuple(d["idle"]),
                         tuple(d["preempted"]), d.get("snapshot", False), sent,
                         tuple((n, NodeKind(g, tuple(f))) for n, g, f in d.get("kinds", ())))
    if kind == "submit":
        return SubmitEvent(d["time"], TaskSpec.from_dict(d["spec"]), d["owner"], d["request_id"],
                           sent)
    if kind == "cancel":
        return CancelEvent(d["time"], d["task_id"], sent, d.get("request_id", ""))
    if kind == "run":
        return TaskRunEvent(**{k: v for k, v in d.items() if k != "kind"})
    if kind == "progress":
        items = tuple(ProgressItem(r["task_id"], ProgressReport(
            **{k: v for k, v in r.items() if k != "task_id"})) for r in d["reports"])
        return ProgressEvent(d["time"], items, d.get("request_id", ""))
    if kind == "energy":
        return EnergyEvent(d["time"], d["task_id"], d["generation"], d["rank"], d["joules"],
                           d["request_id"])
    raise ValueError(f"unknown event kind {kind!r}")

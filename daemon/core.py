"""The deterministic cluster core: ``(state, event) -> (state', outcome)``
(docs/architecture.md §2-4).

No I/O and no wall clock: every time comes from the events. The allocation backend is passed
in as a callable, so a restart can re-apply journaled events with the answers recorded then.

Progress model (BFTrainer, arXiv 2106.12091 §3-4; docs/architecture.md §3):

* between events a task earns ``rate * dt`` samples, rate = Ps(n) if n >= Jmin else 0;
* a decision that grows a task from c nodes costs ``Ps(c) * Tcup`` samples, a shrink
  ``Ps(c) * Tcdw`` (0 when c < Jmin: the task was earning nothing);
* losing nodes to preemption costs ``Tcdw * rate`` once per task per event;
* a task finishes the moment its work reaches ``total_work``: the core stops the clock there,
  releases its nodes and re-allocates before going on to the event's time;
* at most ``max_running_tasks`` unfinished tasks are admitted, in submit order.

Reported progress (issue "Learn scalability online"): a task whose spec ``reports`` progress
(``reports_progress``, or no curve: *learned*) is never completed by the model; between its
reports it accrues at the modelled rate (the learned estimate for a learned task, capped
below ``total_work``), and each report replaces its progress and energy with the reported
figures. A report reaching ``total_work`` completes it at the report's time. Each such task has
a :class:`~offcut.daemon.learning.TaskLearner` that checks its reports, measures its throughput
per node count, its power and its rescale costs; a learned task is allocated with that model
(:meth:`Core.problem`). A progress event re-solves the allocation when a task completed or a
learner measured a node count for the first time.

Energy (issue "energy-aware allocation"): every running task accrues ``power * dt`` [J], power
from its spec's ``power_w`` curve, else its learner's measurements, else the prior
``node_power_w`` per node. With objective ``energy`` / ``zeus_cost`` the allocation maximises
samples per unit of zeus_cost exactly (:func:`offcut.daemon.solvers.fractional.solve_ratio`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.daemon import placement
from offcut.daemon.learning import TaskLearner
from offcut.daemon.model import (RUN_STATES, CancelEvent, Event, Limits, NodeEvent,
                                 ObjectiveSettings, ProgressEvent, SubmitEvent, Task, TaskRunEvent,
                                 TaskState, check_node_names)
from offcut.daemon.solvers.fractional import EnergyTerms, solve_ratio
from offcut.daemon.solvers.problem import AllocationProblem, objective_table

MAX_SOURCE_LEN = 200
MAX_MESSAGE_LEN = 2000


@dataclass
class SolveRecord:
    """One allocation answer, as journaled. ``counts`` is per admitted task (submit order)."""

    counts: list[int]
    solver: str
    status: str
    objective: float
    bound: float
    solve_ms: float
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the journal."""
        return self.__dict__.copy()


Allocate = Callable[[AllocationProblem], SolveRecord]


@dataclass
class PlacementChange:
    """How one task's node set changed (mirrors ``offcut.v1.Placement``)."""

    task_id: str
    task_name: str
    change: str  # start | grow | shrink | stop | preempted | completed | cancelled
    nodes: list[str]
    previous_count: int
    rate: float
    work_done: float
    total_work: float
    time: float  # when it took effect [s since epoch]
    generation: int = 0  # the task's generation after the change (docs/execution.md)


@dataclass
class Outcome:
    """What applying one event did (becomes an ``offcut.v1.Decision``)."""

    time: float
    source: str = ""
    seq: int = 0
    cause: str = "nodes"
    revision: int = 0
    placements: list[PlacementChange] = field(default_factory=list)
    solves: list[SolveRecord] = field(default_factory=list)
    ignored_nodes: list[str] = field(default_factory=list)
    completed_task_ids: list[str] = field(default_factory=list)
    task_id: str | None = None
    # BFTrainer step-log figures
    interval_s: float = 0.0
    progress_samples: float = 0.0
    rescale_cost_samples: float = 0.0
    preemption_cost_samples: float = 0.0
    nodes_left: int = 0
    nodes_joined: int = 0
    tasks_preempted: int = 0
    rate_samples_per_s: float = 0.0
    admitted_tasks: int = 0
    idle_nodes: int = 0
    running_tasks: int = 0
    nodes_in_use: int = 0


class Core:
    """Cluster state: idle pool, tasks, placements, accounting; applies events.

    Args:
        tfwd_s: BFTrainer's look-ahead Tfwd [s] used in the allocation objective.
        max_running_tasks: maxJ, tasks admitted to the allocation at once.
        limits: size limits checked by :meth:`validate`; None = none (re-applying the
            journal, whose events were checked against the limits of their time). Not part
            of the persisted state: the engine sets the configured ones.
        objective: what the allocation maximises and the power figures
            (:class:`ObjectiveSettings`; persisted, like ``tfwd_s``).
        max_failed_generations: a task whose current generation's run fails this many times
            in a row (each failure restarts it as a new generation) is FAILED
            (docs/execution.md; persisted).
    """

    def __init__(self, tfwd_s: float = 10.0, max_running_tasks: int = 10,
                 limits: Limits | None = None, objective: ObjectiveSettings | None = None,
                 max_failed_generations: int = 3):
        self.tfwd_s = float(tfwd_s)
        self.max_running_tasks = int(max_running_tasks)
        #: failed runs of a task's current generations in a row that fail it (docs/execution.md)
        self.max_failed_generations = int(max_failed_generations)
        self.limits = limits
        self.objective = objective if objective is not None else ObjectiveSettings()
        self.task_energy_j = 0.0
        self.clock: float | None = None
        self.revision = 0
        self.pool: dict[str, float] = {}        # idle node -> idle since [s]
        self.holder: dict[str, str] = {}        # idle node -> task id holding it
        self.tasks: dict[str, Task] = {}        # submit order
        self.active: dict[str, Task] = {}       # unfinished tasks, submit order
        self._objective: dict[str, tuple] = {}  # task id -> (Ns, Os, S(n)) arrays (cache)
        self.last_seq: dict[str, int] = {}
        self.next_task_number = 1
        self.total_samples = 0.0
        self.idle_node_seconds = 0.0
        self.used_node_seconds = 0.0
        self.requests: dict[str, str] = {}      # submit request_id -> task id
        self._learn_version = 0                 # bumped when a learner's model changes (caches)
        self._prior_cache: tuple[int, float] | None = None

    # ================================================================= validation (pure)
    def validate(self, event: Event) -> None:
        """Raise InvalidArgument / FailedPrecondition / NotFound if ``event`` cannot be applied.
        Never changes state."""
        if not math.isfinite(event.time) or event.time <= 0:
            raise InvalidArgument("must be a set, positive timestamp", "time")
        if isinstance(event, NodeEvent):
            if not event.source or len(event.source) > MAX_SOURCE_LEN or not event.source.isprintable():
                raise InvalidArgument(f"must be 1-{MAX_SOURCE_LEN} printable characters", "source")
            if event.seq < 1:
                raise InvalidArgument("must be >= 1", "seq")
            last = self.last_seq.get(event.source, 0)
            if event.seq <= last:
                raise FailedPrecondition(
                    f"{event.seq} is not after the last applied seq {last} of source "
                    f"{event.source!r}", "seq")
            if self.clock is not None and event.time < self.clock:
                raise FailedPrecondition(
                    f"event at {event.time:.3f} is older than the last applied event at "
                    f"{self.clock:.3f}", "time")
            if self.limits is not None:
                self._check_event_size(event, self.limits.max_event_nodes)
            check_node_names(list(event.idle), "idle")
            check_node_names(list(event.preempted), "preempted")
            if not event.snapshot:
                if not event.idle and not event.preempted:
                    raise InvalidArgument("an event must name at least one node", "idle")
                both = set(event.idle) & set(event.preempted)
                if both:
                    raise InvalidArgument(
                        f"node {sorted(both)[0]!r} is both idle and preempted", "preempted")
            if self.limits is not None:
                self._check_pool_size(event, self.limits.max_idle_nodes)
        elif isinstance(event, SubmitEvent):
            event.spec.validate(self.limits)
            if event.request_id and len(event.request_id) > MAX_SOURCE_LEN:
                raise InvalidArgument(f"must be at most {MAX_SOURCE_LEN} characters", "request_id")
            if not event.owner or len(event.owner) > MAX_SOURCE_LEN:
                raise InvalidArgument(f"must be 1-{MAX_SOURCE_LEN} characters", "owner")
        elif isinstance(event, ProgressEvent):
            self._validate_progress(event)
        elif isinstance(event, (CancelEvent, TaskRunEvent)):
            task = self.tasks.get(event.task_id)
            if task is None:
                raise NotFound(f"no task {event.task_id!r}", "task_id")
            if isinstance(event, TaskRunEvent):
                self._validate_run(event)
                if event.generation is not None and not 1 <= event.generation <= task.generation:
                    raise FailedPrecondition(
                        f"{event.generation} is not a generation of task {task.task_id} (1 .. "
                        f"{task.generation})", "generation")
            if task.state.finished:
                raise FailedPrecondition(f"task {event.task_id} is already {task.state.value}",
                                         "task_id")

    @staticmethod
    def _check_event_size(event: NodeEvent, limit: int) -> None:
        """INVALID_ARGUMENT when an event names more than ``limit`` (max_event_nodes) nodes."""
        if len(event.idle) > limit:
            raise InvalidArgument(f"has {len(event.idle)} node names, more than max_event_nodes "
                                  f"({limit})", "idle")
        if len(event.idle) + len(event.preempted) > limit:
            raise InvalidArgument(f"idle and preempted name {len(event.idle) + len(event.preempted)}"
                                  f" nodes together, more than max_event_nodes ({limit})",
                                  "preempted")

    def _check_pool_size(self, event: NodeEvent, limit: int) -> None:
        """Refuse an event after which the idle pool would hold more than ``limit``
        (max_idle_nodes) nodes: INVALID_ARGUMENT for a snapshot (too large by itself),
        FAILED_PRECONDITION for a report (too large given the pool)."""
        if event.snapshot:
            if len(event.idle) > limit:
                raise InvalidArgument(f"has {len(event.idle)} nodes, more than max_idle_nodes "
                                      f"({limit})", "idle")
            return
        size = (len(self.pool) + sum(1 for n in event.idle if n not in self.pool)
                - sum(1 for n in event.preempted if n in self.pool))
        if size > limit:
            raise FailedPrecondition(f"the idle pool would hold {size} nodes, more than "
                                     f"max_idle_nodes ({limit})", "idle")

    def _validate_progress(self, event: ProgressEvent) -> None:
        """Checks of a progress event: every report names a running-or-waiting task that
        reports progress, once, with figures its learner accepts (``reports[i].<field>``)."""
        if not event.reports:
            raise InvalidArgument("a progress request needs at least one report", "reports")
        limit = self.limits.max_progress_reports if self.limits is not None else None
        if limit is not None and len(event.reports) > limit:
            raise InvalidArgument(f"has {len(event.reports)} reports, more than "
                                  f"max_progress_reports ({limit})", "reports")
        if event.request_id and len(event.request_id) > MAX_SOURCE_LEN:
            raise InvalidArgument(f"must be at most {MAX_SOURCE_LEN} characters", "request_id")
        seen: set[str] = set()
        for i, r in enumerate(event.reports):
            where = f"reports[{i}]."
            task = self.tasks.get(r.task_id)
            if task is None:
                raise NotFound(f"no task {r.task_id!r}", where + "task_id")
            if r.task_id in seen:
                raise InvalidArgument(f"task {r.task_id} is reported twice", where + "task_id")
            seen.add(r.task_id)
            if task.state.finished:
                raise FailedPrecondition(f"task {r.task_id} is already {task.state.value}",
                                         where + "task_id")
            if task.learner is None:
                raise FailedPrecondition(f"task {r.task_id} was not submitted with "
                                         "reports_progress (its progress is modelled)",
                                         where + "task_id")
            task.learner.check(r.report, where)

    @staticmethod
    def _validate_run(event: TaskRunEvent) -> None:
        if event.state not in RUN_STATES:
            raise InvalidArgument(f"must be one of {', '.join(RUN_STATES)}", "state")
        if event.node:
            check_node_names([event.node], "node")
        for name, value, limit in (("job_id", event.job_id, MAX_SOURCE_LEN),
                                   ("request_id", event.request_id, MAX_SOURCE_LEN),
                                   ("message", event.message, MAX_MESSAGE_LEN)):
            if len(value) > limit:
                raise InvalidArgument(f"must be at most {limit} characters", name)
        if not -(2**31) <= event.exit_code < 2**31:
            raise InvalidArgument("must be a 32-bit integer", "exit_code")

    # ================================================================= applying
    def apply(self, event: Event, allocate: Allocate) -> Outcome:
        """Validate and apply ``event``; returns the outcome. Raises like :meth:`validate`
        (then nothing changed)."""
        self.validate(event)
        return self.apply_validated(event, allocate)

    def apply_validated(self, event: Event, allocate: Allocate) -> Outcome:
        """Apply an event that :meth:`validate` accepted in the current state (callers that
        validate first to separate rejections from failures, like the engine)."""
        t = event.time if self.clock is None else max(event.time, self.clock)
        out = Outcome(time=t)
        out.interval_s = 0.0 if self.clock is None else t - self.clock
        self._advance(t, out, allocate)
        changed = False
        if isinstance(event, NodeEvent):
            out.source, out.seq = event.source, event.seq
            out.cause = "snapshot" if event.snapshot else "nodes"
            self.last_seq[event.source] = event.seq
            changed = self._apply_nodes(event, t, out)
        elif isinstance(event, SubmitEvent):
            out.cause = "submit"
            task = Task(task_id=f"t{self.next_task_number:06d}", spec=event.spec,
                        owner=event.owner, submit_time=event.time, request_id=event.request_id)
            self.next_task_number += 1
            self.tasks[task.task_id] = task
            self.active[task.task_id] = task
            if event.request_id:
                self.requests[event.request_id] = task.task_id
            if event.spec.reports:
                task.learner = TaskLearner()
            out.task_id = task.task_id
            changed = True
        elif isinstance(event, CancelEvent):
            out.cause = "cancel"
            task = self.tasks[event.task_id]
            out.task_id = task.task_id
            if not task.state.finished:  # it may have completed on the way to ``t``
                self._finish(task, TaskState.CANCELLED, t, out)
                changed = True
        elif isinstance(event, TaskRunEvent):
            out.cause = "run"
            task = self.tasks[event.task_id]
            out.task_id = task.task_id
            changed = self._apply_run(task, event, t, out)
        elif isinstance(event, ProgressEvent):
            out.cause = "progress"
            changed = self._apply_progress(event, t, out)
        if changed:
            self._reallocate(t, out, allocate)
        self.revision += 1
        out.revision = self.revision
        self._fill_figures(out)
        return out

    # ----------------------------------------------------------------- time
    def _advance(self, t: float, out: Outcome, allocate: Allocate) -> None:
        """Accrue progress up to ``t``, completing tasks (and re-allocating) on the way."""
        if self.clock is None:
            self.clock = t
            return
        while True:
            soonest, soonest_task = math.inf, None
            for task in self.admitted():  # only admitted tasks can hold nodes
                if task.rate > 0 and task.state is TaskState.RUNNING and task.learner is None:
                    left = task.spec.total_work_samples - task.work_done
                    at = self.clock + max(left, 0.0) / task.rate
                    if at < soonest:
                        soonest, soonest_task = at, task
            if soonest_task is None or soonest > t:
                break
            self._accrue(soonest - self.clock, out)
            self.clock = soonest
            for task in self.admitted():
                if task.state is TaskState.RUNNING and task.learner is None and (
                        task is soonest_task or
                        task.work_done >= task.spec.total_work_samples * (1 - 1e-12)):
                    out.progress_samples += task.spec.total_work_samples - task.work_done
                    self.total_samples += task.spec.total_work_samples - task.work_done
                    task.work_done = task.spec.total_work_samples
                    self._finish(task, TaskState.COMPLETED, soonest, out)
                    out.completed_task_ids.append(task.task_id)
            self._reallocate(soonest, out, allocate)
        self._accrue(t - self.clock, out)
        self.clock = t

    def _accrue(self, dt: float, out: Outcome) -> None:
        if dt <= 0:
            return
        for task in self.admitted():
            if task.rate > 0:
                gained = task.rate * dt
                if task.learner is not None:  # completed only by a report: stay below the total
                    gained = min(gained, max(0.0, task.spec.total_work_samples * (1 - 1e-9)
                                             - task.work_done))
                task.work_done += gained
                out.progress_samples += gained
                self.total_samples += gained
            if task.power > 0:
                task.energy_j += task.power * dt
                self.task_energy_j += task.power * dt
        self.idle_node_seconds += len(self.pool) * dt
        self.used_node_seconds += len(self.holder) * dt

    # ----------------------------------------------------------------- nodes
    def _apply_nodes(self, event: NodeEvent, t: float, out: Outcome) -> bool:
        if event.snapshot:
            now_idle = set(event.idle)
            joined = sorted(now_idle - self.pool.keys())
            left = sorted(n for n in self.pool if n not in now_idle)
        else:
            joined, left = [], []
            for n in event.idle:
                (out.ignored_nodes if n in self.pool else joined).append(n)
            for n in event.preempted:
                (left if n in self.pool else out.ignored_nodes).append(n)
        hit: dict[str, Task] = {}
        for n in left:
            del self.pool[n]
            owner = self.holder.pop(n, None)
            if owner is not None:
                hit[owner] = self.tasks[owner]
        for task in hit.values():
            cost = self._chargeable(task, task.spec.rescale_down_s * task.rate)
            task.work_done -= cost
            out.progress_samples -= cost
            out.preemption_cost_samples += cost
            self.total_samples -= cost
            task.preemptions += 1
            before = len(task.nodes)
            task.nodes = [n for n in task.nodes if n in self.pool]
            self._set_running_state(task)
            if task.learner is not None:
                task.learner.on_allocation(t, len(task.nodes), "preempted")
            out.placements.append(self._change(task, "preempted", before, t))
        for n in joined:
            self.pool[n] = t
        out.nodes_left, out.nodes_joined, out.tasks_preempted = len(left), len(joined), len(hit)
        return bool(joined or left)

    def _apply_run(self, task: Task, event: TaskRunEvent, t: float, out: Outcome) -> bool:
        """Record a run report (docs/execution.md). ``finished`` completes the task (its
        program says the work is done: the model's progress is replaced by ``total_work``).
        With a generation, ``failed`` / ``interrupted`` of the current generation restart the
        task on its nodes as a new generation (a ``restart`` placement change), ``failed``
        fails it when it is the ``max_failed_generations``-th in a row; reports of earlier
        generations are only recorded. Without one, ``failed`` fails the task at once.
        Returns whether the allocation must be re-solved."""
        task.last_run = event.describe()
        if event.state == "started":
            task.launches += 1
        if task.state.finished:  # it may have completed on the way to ``t``
            return False
        if event.state == "finished":
            gained = task.spec.total_work_samples - task.work_done
            task.work_done = task.spec.total_work_samples
            out.progress_samples += gained
            self.total_samples += gained
            self._finish(task, TaskState.COMPLETED, t, out)
            out.completed_task_ids.append(task.task_id)
            return True
        if event.generation is None:
            if event.state == "failed":
                task.failure_reason = task.last_run
                self._finish(task, TaskState.FAILED, t, out)
                return True
            return False
        if event.generation != task.generation or event.state == "started":
            return False  # superseded: a run stopped while its generation was replaced
        if task.learner is not None:
            task.learner.on_pause(t)  # the current generation's processes stopped
        if event.state == "preempted":
            return False  # the node event that takes the node decides
        if event.state == "interrupted":
            task.failed_runs = 0
        else:
            task.failed_runs += 1
            task.failure_reason = task.last_run
            if task.failed_runs >= self.max_failed_generations:
                task.failure_reason = (f"{task.failed_runs} generations in a row failed; the "
                                       f"last: {task.last_run}")
                self._finish(task, TaskState.FAILED, t, out)
                return True
        if task.nodes:
            out.placements.append(self._change(task, "restart", len(task.nodes), t))
        return False

    def _apply_progress(self, event: ProgressEvent, t: float, out: Outcome) -> bool:
        """Apply validated reports: each feeds the task's learner and replaces its progress
        (and energy, when reported); a report reaching ``total_work`` completes the task.
        Returns whether the allocation must be re-solved (a completion, or a learner that
        measured a node count for the first time)."""
        changed = False
        for r in event.reports:
            task = self.tasks[r.task_id]
            if task.state.finished:
                continue
            task.failed_runs = 0  # it runs: failures so far were not in a row
            version = task.learner.version
            if task.learner.observe(r.report):
                changed = True
            if task.learner.version != version:
                self._learn_version += 1  # the population prior may have moved
            total = task.spec.total_work_samples
            report = r.report
            delta = min(report.samples_done, total) - task.work_done
            task.work_done += delta
            out.progress_samples += delta
            self.total_samples += delta
            if report.energy_j is not None:
                self.task_energy_j += report.energy_j - task.energy_j
                task.energy_j = float(report.energy_j)
            if report.samples_done >= total:
                self._finish(task, TaskState.COMPLETED, t, out)
                out.completed_task_ids.append(task.task_id)
                changed = True
            else:
                self._set_running_state(task)  # the learned rate may have moved
        return changed

    # ----------------------------------------------------------------- task models
    def rate_at(self, task: Task, n: int) -> float:
        """Modelled throughput [samples/s] of ``task`` on ``n`` nodes: Ps(n)
        (docs/architecture.md §3), or the learner's estimate for a learned task; 0 below Jmin."""
        if n < task.spec.min_nodes:
            return 0.0
        if task.spec.learned:
            return task.learner.rate_at(n, self.prior_rate())
        return task.spec.throughput_at(n)

    def power_at(self, task: Task, n: int) -> float:
        """Modelled power draw [W] of ``task`` on ``n`` nodes: its spec's ``power_w`` curve,
        else its learner's measurements, else the prior ``node_power_w`` per node."""
        if n <= 0:
            return 0.0
        spec = task.spec
        if spec.power_w:
            return float(np.interp(n, spec.node_counts, spec.power_w))
        if task.learner is not None:
            return float(task.learner.power_at(n, self.objective.node_power_w))
        return n * self.objective.node_power_w

    def rescale_costs(self, task: Task) -> tuple[float, float]:
        """(Tcup, Tcdw) [s] of ``task``: measured by its learner for a learned task (the
        spec's values are the prior), else the spec's."""
        spec = task.spec
        if spec.learned:
            return (task.learner.rescale_up_s(spec.rescale_up_s),
                    task.learner.rescale_down_s(spec.rescale_down_s))
        return spec.rescale_up_s, spec.rescale_down_s

    def prior_rate(self) -> float:
        """Throughput per node [samples/s] assumed for a learned task before its first
        measurement: the median of the other tasks' measured per-node rates (a population
        prior), else ``prior_rate_per_node``."""
        key = self._learn_version
        if self._prior_cache is None or self._prior_cache[0] != key:
            rates = [r for task in self.tasks.values() if task.learner is not None
                     for r in [task.learner.per_node_rate()] if r is not None and r > 0]
            prior = float(np.median(rates)) if rates else self.objective.prior_rate_per_node
            self._prior_cache = (key, prior)
        return self._prior_cache[1]

    @staticmethod
    def _chargeable(task: Task, cost: float) -> float:
        """The part of a rescale or preemption cost [samples] charged to ``task``'s progress:
        all of it, except that a task that reports its progress never drops below its last
        reported samples (a measured fact; its next report tells the real loss)."""
        if task.learner is None:
            return cost
        last = task.learner.last_report
        floor = last[1] if last is not None else 0.0
        return max(0.0, min(cost, task.work_done - floor))

    def _set_running_state(self, task: Task) -> None:
        n = len(task.nodes)
        task.rate = self.rate_at(task, n)
        task.power = self.power_at(task, n)
        if not task.state.finished:
            task.state = TaskState.RUNNING if task.nodes else TaskState.ADMITTED

    def _finish(self, task: Task, state: TaskState, t: float, out: Outcome) -> None:
        before = len(task.nodes)
        for n in task.nodes:
            self.holder.pop(n, None)
        task.nodes = []
        task.rate = 0.0
        task.power = 0.0
        task.state = state
        task.finish_time = t
        del self.active[task.task_id]
        self._objective.pop(task.task_id, None)
        out.placements.append(self._change(task, state.value, before, t))

    def _change(self, task: Task, change: str, before: int, t: float) -> PlacementChange:
        """The placement change of ``task`` (node set already updated); every change but a
        finish starts a new generation (docs/execution.md)."""
        if not task.state.finished:
            task.generation += 1
        return PlacementChange(task.task_id, task.spec.name, change, list(task.nodes), before,
                               task.rate, task.work_done, task.spec.total_work_samples, t,
                               task.generation)

    # ----------------------------------------------------------------- allocation
    def admitted(self) -> list[Task]:
        """The tasks considered by the allocation (submit order, at most maxJ)."""
        return list(itertools.islice(self.active.values(), self.max_running_tasks))

    def problem(self, tasks: list[Task]) -> AllocationProblem:
        """The count-level allocation problem for ``tasks`` (docs/architecture.md §4)."""
        curves = [self._curves(t) for t in tasks]
        costs = [self.rescale_costs(t) for t in tasks]
        return AllocationProblem(
            idle_nodes=len(self.pool),
            current_nodes=[len(t.nodes) for t in tasks],
            min_nodes=[t.spec.min_nodes for t in tasks],
            max_nodes=[t.spec.max_nodes for t in tasks],
            node_counts=[c[0] for c in curves],
            objective_values=[c[1] for c in curves],
            tfwd_s=self.tfwd_s,
            rescale_up_s=[c[0] for c in costs],
            rescale_down_s=[c[1] for c in costs],
            objective_tables=[c[2] for c in curves],
            check=False,  # specs were validated at submission
        )

    def _curves(self, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Ns, Os, S(n) for n = 0..Jmax) of a task as float arrays, cached per task (a
        learned task's: its learner's optimistic curve, cached per learner version)."""
        spec = task.spec
        key = (task.learner.version, self.prior_rate()) if spec.learned else None
        cached = self._objective.get(task.task_id)
        if cached is None or cached[0] != key:
            if spec.learned:
                ns_l, ps_l = task.learner.curve(spec.min_nodes, spec.max_nodes, key[1])
                ns, os_ = np.asarray(ns_l, dtype=float), np.asarray(ps_l, dtype=float)
            else:
                ns = np.asarray(spec.node_counts, dtype=float)
                os_ = np.asarray(spec.objective, dtype=float)
            cached = (key, (ns, os_, objective_table(ns, os_, spec.min_nodes, spec.max_nodes)))
            self._objective[task.task_id] = cached
        return cached[1]

    def learned_curve(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """(Ns, Ps) the allocation uses for a learned task (its learner's optimistic curve)."""
        ns, os_, _ = self._curves(task)
        return ns, os_

    @property
    def energy_j(self) -> float:
        """Energy of the idle pool while Offcut ran it [J]: the tasks' nodes plus the unused
        idle nodes at ``idle_node_power_w``."""
        unused = max(0.0, self.idle_node_seconds - self.used_node_seconds)
        return self.task_energy_j + unused * self.objective.idle_node_power_w

    def _power_values(self, task: Task, node_counts: np.ndarray) -> np.ndarray:
        """The task's power draw [W] at each of ``node_counts`` (its curve's points); at least
        1 mW per node at positive counts (a task whose energy reports stood still must not
        make the ratio objective's denominator vanish)."""
        return np.array([max(self.power_at(task, int(n)), 1e-3 * n) for n in node_counts])

    def _reallocate(self, t: float, out: Outcome, allocate: Allocate) -> None:
        tasks = self.admitted()
        for task in tasks:
            if task.state is TaskState.QUEUED:
                task.state = TaskState.ADMITTED
                task.admit_time = t
        if not tasks:
            return
        problem = self.problem(tasks)
        if self.objective.objective == "throughput":
            answer = allocate(problem)
            out.solves.append(answer)
            counts = [int(c) for c in answer.counts]
        else:
            def solve(p: AllocationProblem) -> SolveRecord:
                record = allocate(p)
                out.solves.append(record)
                return record
            terms = EnergyTerms(eta=self.objective.effective_eta,
                                idle_node_power_w=self.objective.idle_node_power_w,
                                node_max_power_w=self.objective.node_max_power_w,
                                power_values=[self._power_values(t, ns)
                                              for t, ns in zip(tasks, problem.node_counts)])
            counts = [int(c) for c in solve_ratio(problem, terms, solve).counts]
        if len(counts) != len(tasks):
            raise RuntimeError(f"allocation returned {len(counts)} counts for {len(tasks)} tasks")
        # shrink first: released nodes become free for growing tasks
        before = {task.task_id: len(task.nodes) for task in tasks}
        for task, n in zip(tasks, counts):
            if n < len(task.nodes):
                kept, released = placement.shrink(task.nodes, n)
                for node in released:
                    del self.holder[node]
                task.nodes = kept
        free = [n for n in self.pool if n not in self.holder]
        for task, n in zip(tasks, counts):
            extra = n - len(task.nodes)
            if extra > 0:
                picked = placement.grow(task.nodes, extra, free, self.pool)
                taken = set(picked)
                free = [x for x in free if x not in taken]
                for node in picked:
                    self.holder[node] = task.task_id
                task.nodes = sorted(task.nodes + picked)
        for task in tasks:
            c, n = before[task.task_id], len(task.nodes)
            if n == c:
                continue
            lost_rate = self.rate_at(task, c)
            up_s, down_s = self.rescale_costs(task)
            cost = self._chargeable(task, lost_rate * (up_s if n > c else down_s))
            task.work_done -= cost
            out.progress_samples -= cost
            out.rescale_cost_samples += cost
            self.total_samples -= cost
            task.rescales += 1
            self._set_running_state(task)
            kind = "start" if c == 0 else "stop" if n == 0 else "grow" if n > c else "shrink"
            if task.learner is not None:
                task.learner.on_allocation(t, n, kind)
            out.placements.append(self._change(task, kind, c, t))

    def _fill_figures(self, out: Outcome) -> None:
        admitted = [t for t in self.admitted() if t.state is not TaskState.QUEUED]
        running = [t for t in admitted if t.state is TaskState.RUNNING]
        out.rate_samples_per_s = float(sum(t.rate for t in running))
        out.admitted_tasks = len(admitted)
        out.idle_nodes = len(self.pool)
        out.running_tasks = len(running)
        out.nodes_in_use = len(self.holder)

    # ================================================================= persistence
    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-able data (for snapshots)."""
        return {
            "tfwd_s": self.tfwd_s, "max_running_tasks": self.max_running_tasks,
            "clock": self.clock, "revision": self.revision, "pool": self.pool,
            "tasks": [t.to_dict() for t in self.tasks.values()], "last_seq": self.last_seq,
            "next_task_number": self.next_task_number, "total_samples": self.total_samples,
            "idle_node_seconds": self.idle_node_seconds,
            "used_node_seconds": self.used_node_seconds, "requests": self.requests,
            "objective": asdict(self.objective), "task_energy_j": self.task_energy_j,
            "max_failed_generations": self.max_failed_generations,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Core":
        """Inverse of :meth:`to_dict`."""
        core = cls(d["tfwd_s"], d["max_running_tasks"],
                   objective=ObjectiveSettings(**d["objective"]) if "objective" in d else None,
                   max_failed_generations=d.get("max_failed_generations", 3))
        core.task_energy_j = d.get("task_energy_j", 0.0)
        core.clock, core.revision = d["clock"], d["revision"]
        core.pool = dict(d["pool"])
        core.tasks = {t["task_id"]: Task.from_dict(t) for t in d["tasks"]}
        core.active = {k: t for k, t in core.tasks.items() if not t.state.finished}
        core.holder = {n: t.task_id for t in core.tasks.values() for n in t.nodes}
        core.last_seq = dict(d["last_seq"])
        core.next_task_number = d["next_task_number"]
        core.total_samples = d["total_samples"]
        core.idle_node_seconds = d["idle_node_seconds"]
        core.used_node_seconds = d["used_node_seconds"]
        core.requests = dict(d["requests"])
        return core

    def fingerprint(self) -> tuple:
        """A comparable summary of the state (tests: state before == state after)."""
        return (self.clock, self.revision, tuple(sorted(self.pool.items())),
                tuple((t.task_id, t.state.value, tuple(t.nodes), round(t.work_done, 6))
                      for t in self.tasks.values()),
                tuple(sorted(self.last_seq.items())))


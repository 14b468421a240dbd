"""The scheduler: the deterministic application core, ``(state, event) -> (state', outcome)``
(docs/architecture.md, "Time and events", "Tasks and the progress model" and "Allocation").

No I/O and no wall clock: every time comes from the events. The allocation backend is passed
in as a callable, so a restart can re-apply journaled events with the answers recorded then.

Progress model (BFTrainer, arXiv 2106.12091, Sections 3-4; docs/architecture.md,
"Tasks and the progress model"):

* between events a task earns ``rate * dt`` samples, rate = Ps(n) if n >= Jmin else 0;
* a decision that grows a task from c nodes costs ``Ps(c) * Tcup`` samples, a shrink
  ``Ps(c) * Tcdw`` (0 when c < Jmin: the task was earning nothing);
* losing nodes to preemption costs ``Tcdw * rate`` once per task per event;
* a task finishes the moment its work reaches ``total_work``: the scheduler stops the clock there,
  releases its nodes and re-allocates before going on to the event's time;
* at most ``max_running_tasks`` unfinished tasks are admitted, in submit order.

Reported progress (issue "Learn scalability online"): a task whose spec ``reports`` progress
(``reports_progress``, or no curve: *learned*) is never completed by the model; between its
reports it accrues at the modelled rate (the learned estimate for a learned task, capped
below ``total_work``), and each report replaces its progress and energy with the reported
figures. A report reaching ``total_work`` completes it at the report's time. Each such task has
a :class:`~offcut.daemon.app.learning.TaskLearner` that checks its reports, measures its throughput
per node count, its power and its rescale costs; a learned task is allocated with that model
(:meth:`Scheduler.problem`). A progress event re-solves the allocation when a task completed or a
learner measured a node count for the first time.

Energy (issue "energy-aware allocation"): every running task accrues ``power * dt`` [J], power
from its spec's ``power_w`` curve, else its learner's measurements, else the prior
``node_power_w`` per node. Every task also accrues ``len(nodes) * dt`` node-seconds.

What the allocation maximises is the configured :class:`~offcut.daemon.app.policies.AllocationPolicy`
(``ObjectiveSettings.objective``, the ``policy`` setting): the scheduler builds an
:class:`~offcut.daemon.app.policies.AllocationRequest`, the policy answers one node count per
admitted task through the allocation callable, the scheduler checks the answer and places the nodes
(docs/architecture.md, "Allocation policies").

The work is done by collaborators over one :class:`~.state.SchedulerState`, each in its own
module with a narrow interface (:mod:`.interfaces`); only this module composes them (the import
contracts of pyproject.toml).
"""

from __future__ import annotations

import operator
from typing import Any, Collection

import numpy as np

from offcut.daemon.app.model import (CancelEvent, EnergyEvent, Event, NodeEvent, ProgressEvent,
                                 SubmitEvent, Task, TaskRunEvent)
from offcut.daemon.app.policies import AllocationPolicy, AllocationRequest
from offcut.daemon.app.policies.guard import PolicyGuard
from offcut.daemon.app.scheduler.allocation import Reallocator
from offcut.daemon.app.scheduler.clock import ProgressModel
from offcut.daemon.app.scheduler.energy import EnergyReports
from offcut.daemon.app.scheduler.lifecycle import TaskLifecycle
from offcut.daemon.app.scheduler.models import TaskModels
from offcut.daemon.app.scheduler.nodes import NodePool
from offcut.daemon.app.scheduler.outcome import Allocate, Outcome
from offcut.daemon.app.scheduler.placement_rules import PlacementRules
from offcut.daemon.app.scheduler.policy_runner import PolicyRunner
from offcut.daemon.app.scheduler.progress import ProgressReports
from offcut.daemon.app.scheduler.state import SchedulerState
from offcut.daemon.app.scheduler.validation import EventValidation
from offcut.daemon.app.solvers.problem import AllocationProblem


def _state_field(name: str, doc: str) -> property:
    """A property of :class:`Scheduler` that reads and writes ``state.<name>``."""
    def put(self: "Scheduler", value: Any) -> None:
        setattr(self.state, name, value)
    return property(operator.attrgetter(f"state.{name}"), put,
                    doc=f"{doc} (``state.{name}``, :class:`~.state.SchedulerState`)")


class Scheduler:
    """Applies events to the cluster state: composes the collaborators over one
    :class:`~.state.SchedulerState` (``state``) and dispatches each event to them.

    Collaborators (attributes; each a class of its own module, narrow interface in its
    docstring): ``validation`` (:class:`~.validation.EventValidation`), ``models``
    (:class:`~.models.TaskModels`: throughput, power, rescale costs), ``lifecycle``
    (:class:`~.lifecycle.TaskLifecycle`: submit, cancel, run reports, finish, generations),
    ``node_pool`` (:class:`~.nodes.NodePool`: node events), ``progress_model``
    (:class:`~.clock.ProgressModel`: the event clock and the progress between events),
    ``reports`` (:class:`~.progress.ProgressReports`), ``energy_reports``
    (:class:`~.energy.EnergyReports`), ``policies`` (:class:`~.policy_runner.PolicyRunner`:
    problem, request, the policy's checked counts), ``reallocator``
    (:class:`~.allocation.Reallocator`: placement changes), ``rules``
    (:class:`~.placement_rules.PlacementRules`: horizon and node names, replaceable with
    :meth:`use_placement_rules`).

    Its public surface is the engine's and the replies': :meth:`apply`,
    :meth:`apply_validated`, :meth:`validate`, the state's fields and persistence (read and
    written through: ``scheduler.pool is scheduler.state.pool``), and the models' and
    policy runner's questions (:meth:`rate_at`, :meth:`problem` ...).

    Args: those of :class:`~.state.SchedulerState` (a new, empty state); :meth:`over` and
    :meth:`from_dict` compose over an existing one.
    """

    def __init__(self, *args, **kwargs):
        self._compose(SchedulerState(*args, **kwargs))  # (its arguments and defaults: one place)

    @classmethod
    def over(cls, state: SchedulerState) -> "Scheduler":
        """A scheduler over ``state`` (taken as it is, not copied)."""
        scheduler = cls.__new__(cls)
        scheduler._compose(state)
        return scheduler

    def _compose(self, state: SchedulerState) -> None:
        """Make the collaborators over ``state`` and wire them together."""
        self.state = state
        self.models = TaskModels(state)
        self.lifecycle = TaskLifecycle(state, self.models)
        self.rules: PlacementRules = PlacementRules(state)
        self.policies = PolicyRunner(state, self.models, self.rules)
        self.reallocator = Reallocator(state, self.models, self.lifecycle, self.rules,
                                       counts=self._allocation_counts)
        self.progress_model = ProgressModel(state, self.lifecycle, self.reallocator.reallocate)
        self.node_pool = NodePool(state, self.lifecycle)
        self.reports = ProgressReports(state, self.models, self.lifecycle)
        self.energy_reports = EnergyReports(state)
        self.validation = EventValidation(state, self.energy_reports.validate)
        #: event type -> (journal kind, handler) of the events other than node events
        self._handlers = {
            SubmitEvent: ("submit", self.lifecycle.submit),
            CancelEvent: ("cancel", self.lifecycle.cancel),
            TaskRunEvent: ("run", self.lifecycle.run),
            ProgressEvent: ("progress", self.reports.apply),
            EnergyEvent: ("energy", self.energy_reports.apply),
        }

    def use_placement_rules(self, rules: PlacementRules) -> None:
        """Place nodes by ``rules`` from now on (a variant outside the product:
        benchmarks/horizon_oracle.py); the state stays. Not persisted: a scheduler loaded
        from a snapshot uses the daemon's rules."""
        self.rules = self.policies.rules = self.reallocator.rules = rules

    # ------------------------------------------------------------------ applying events
    def validate(self, event: Event) -> None:
        """Raise InvalidArgument / FailedPrecondition / NotFound / ResourceExhausted (naming
        the field) if ``event`` cannot be applied (:class:`~.validation.EventValidation`).
        Never changes state."""
        self.validation.validate(event)

    def apply(self, event: Event, allocate: Allocate) -> Outcome:
        """Validate and apply ``event``; returns the outcome. Raises like :meth:`validate`
        (then nothing changed)."""
        self.validation.validate(event)
        return self.apply_validated(event, allocate)

    def apply_validated(self, event: Event, allocate: Allocate) -> Outcome:
        """Apply an event that :meth:`validate` accepted in the current state (callers that
        validate first to separate rejections from failures, like the engine): retire the
        tasks finished longer ago than the retention, advance the clock to the event's time,
        apply it, re-allocate when it changed anything."""
        state = self.state
        t = state.event_time(event.time)
        out = Outcome(time=t)
        touched = {task.task_id for task in state.admitted()}  # they may change on the way
        self.lifecycle.retire_finished(t, out)
        out.interval_s = 0.0 if state.clock is None else t - state.clock
        self.progress_model.advance(t, out, allocate)
        if isinstance(event, NodeEvent):
            changed = self.node_pool.apply(event, t, out)
        else:
            out.cause, handler = self._handlers[type(event)]
            changed = handler(event, t, out)
        if changed:
            self.reallocator.reallocate(t, out, allocate)
        state.revision += 1
        out.revision = state.revision
        state.fill_figures(out)
        state.mark_changed(event, out, touched)
        return out

    def _allocation_counts(self, tasks: list[Task], t: float, out: Outcome, allocate: Allocate,
                           idle_nodes: int | None = None) -> list[int]:
        """The node counts the re-allocator places for ``tasks`` (one node group): the policy
        runner's checked counts (:meth:`PolicyRunner.counts <.policy_runner.PolicyRunner.counts>`).
        A seam for a variant of the scheduler that decides otherwise (a test's reference
        rule)."""
        return self.policies.counts(tasks, t, out, allocate, idle_nodes)

    # ------------------------------------------------------------------ the models' questions
    def rate_at(self, task: Task, n: int) -> float:
        """Modelled throughput [samples/s] of ``task`` on ``n`` nodes (:class:`~.models.TaskModels`)."""
        return self.models.rate_at(task, n)

    def power_at(self, task: Task, n: int) -> float:
        """Modelled power draw [W] of ``task`` on ``n`` nodes (:class:`~.models.TaskModels`)."""
        return self.models.power_at(task, n)

    def rescale_costs(self, task: Task) -> tuple[float, float]:
        """(Tcup, Tcdw) [s] of ``task`` (:class:`~.models.TaskModels`)."""
        return self.models.rescale_costs(task)

    def prior_rate(self) -> float:
        """Throughput per node [samples/s] assumed for a learned task before its first
        measurement (:class:`~.models.TaskModels`)."""
        return self.models.prior_rate()

    def learned_curve(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """(Ns, Ps) the allocation uses for a learned task (:class:`~.models.TaskModels`)."""
        return self.models.learned_curve(task)

    def _power_values(self, task: Task, node_counts: np.ndarray) -> np.ndarray:
        """``task``'s power draw [W] at each of ``node_counts`` (:class:`~.models.TaskModels`)."""
        return self.models.power_values(task, node_counts)

    # ------------------------------------------------------------------ the policy's questions
    def problem(self, tasks: list[Task], idle_nodes: int | None = None) -> AllocationProblem:
        """The count-level allocation problem for ``tasks`` on ``idle_nodes`` nodes (None: the
        idle pool; :class:`~.policy_runner.PolicyRunner`)."""
        return self.policies.problem(tasks, idle_nodes)

    def allocation_request(self, tasks: list[Task], t: float,
                           idle_nodes: int | None = None) -> AllocationRequest:
        """The policy's view of re-allocating ``tasks`` at ``t`` [s]
        (:class:`~.policy_runner.PolicyRunner`)."""
        return self.policies.request(tasks, t, idle_nodes)

    def policy(self) -> AllocationPolicy:
        """The allocation policy in use; :class:`PolicyError` when it is unknown or cannot
        load (:class:`~.policy_runner.PolicyRunner`)."""
        return self.policies.policy()

    def owner_node_seconds(self) -> dict[str, float]:
        """Node-seconds used so far per owner (:class:`~.policy_runner.PolicyRunner`)."""
        return self.policies.owner_node_seconds()

    @property
    def policy_guard(self) -> PolicyGuard | None:
        """The guard policies run under (the engine sets its own, kept across reloads; None:
        one of the scheduler's own, made on first use)."""
        return self.policies.guard

    @policy_guard.setter
    def policy_guard(self, guard: PolicyGuard | None) -> None:
        self.policies.guard = guard

    def policy_guard_in_use(self) -> PolicyGuard:
        """The :class:`PolicyGuard` the policy runs under (:class:`~.policy_runner.PolicyRunner`)."""
        return self.policies.guard_in_use()

    def node_groups(self, tasks: list[Task]) -> list[tuple[Collection[str], list[Task]]]:
        """``tasks`` grouped by the idle nodes they may run on (:class:`~.allocation.Reallocator`)."""
        return self.reallocator.node_groups(tasks)

    # ------------------------------------------------------------------ the state
    tfwd_s = _state_field("tfwd_s", "BFTrainer's look-ahead Tfwd [s]")
    max_running_tasks = _state_field("max_running_tasks", "maxJ, tasks admitted at once")
    max_failed_generations = _state_field("max_failed_generations",
                                          "failed runs in a row that fail a task")
    finished_task_retention_s = _state_field("finished_task_retention_s",
                                             "how long a finished task stays in the state [s]")
    final_grace_s = _state_field("final_grace_s", "a launched task's time to exit 0 after its "
                                 "report reached the work [s]")
    limits = _state_field("limits", "size limits of new events (None: none)")
    objective = _state_field("objective", "the policy's name and the power figures")
    clock = _state_field("clock", "the event clock [s since epoch] (None: no event yet)")
    node_clock = _state_field("node_clock", "the newest observation time of a node event [s]")
    revision = _state_field("revision", "events applied")
    pool = _state_field("pool", "idle node -> idle since [s]")
    holder = _state_field("holder", "idle node -> the task id holding it")
    kinds = _state_field("kinds", "node -> what it has (GPUs, features)")
    tasks = _state_field("tasks", "task id -> task, submit order (finished ones until retired)")
    active = _state_field("active", "unfinished tasks, submit order")
    active_owners = _state_field("active_owners", "owner -> its tasks in ``active``")
    retained_owners = _state_field("retained_owners",
                                   "owner -> (its tasks in ``tasks``, their retained bytes)")
    finished = _state_field("finished", "(finish time [s], task id) of the finished tasks kept")
    changed = _state_field("changed", "ids of tasks that may have changed since the snapshot")
    removed = _state_field("removed", "ids of tasks retired since the snapshot")
    last_seq = _state_field("last_seq", "node-event source -> its last applied seq")
    next_task_number = _state_field("next_task_number", "the number of the next task id")
    total_samples = _state_field("total_samples", "samples trained by all tasks")
    task_energy_j = _state_field("task_energy_j", "energy of the tasks' nodes [J]")
    idle_node_seconds = _state_field("idle_node_seconds", "idle pool x time [node-s]")
    used_node_seconds = _state_field("used_node_seconds", "nodes held x time [node-s]")

    @property
    def energy_j(self) -> float:
        """Energy of the idle pool while Offcut ran it [J] (:attr:`SchedulerState.energy_j`)."""
        return self.state.energy_j

    def admitted(self) -> list[Task]:
        """The tasks considered by the allocation (submit order, at most maxJ)."""
        return self.state.admitted()

    def to_dict(self, with_tasks: bool = True) -> dict[str, Any]:
        """The whole state as JSON-able data (:meth:`SchedulerState.to_dict`: the snapshot
        format)."""
        return self.state.to_dict(with_tasks)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Scheduler":
        """A scheduler over the state ``d`` (:meth:`to_dict`'s form)."""
        return cls.over(SchedulerState.from_dict(d))

    def snapshot_changes(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        """What an incremental snapshot writes (:meth:`SchedulerState.snapshot_changes`)."""
        return self.state.snapshot_changes()

    def mark_all_changed(self) -> None:
        """Make the next incremental snapshot write every task."""
        self.state.mark_all_changed()

    def fingerprint(self) -> tuple:
        """A comparable summary of the state (tests: state before == state after)."""
        return self.state.fingerprint()

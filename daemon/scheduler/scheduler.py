"""The scheduler: the deterministic application core, ``(state, event) -> (state', outcome)``
(docs/architecture.md, "Time and events", "Tasks and the progress model" and "Allocation").
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
a :class:`~offcut.daemon.learning.TaskLearner` that checks its reports, measures its throughput
per node count, its power and its rescale costs; a learned task is allocated with that model
(:meth:`Scheduler.problem`). A progress event re-solves the allocation when a task completed or a
learner measured a node count for the first time.

Energy (issue "energy-aware allocation"): every running task accrues ``power * dt`` [J], power
from its spec's ``power_w`` curve, else its learner's measurements, else the prior
``node_power_w`` per node. Every task also accrues ``len(nodes) * dt`` node-seconds.

What the allocation maximises is the configured :class:`~offcut.daemon.policies.AllocationPolicy`
(``ObjectiveSettings.objective``, the ``policy`` setting): the scheduler builds an
:class:`~offcut.daemon.policies.AllocationRequest`, the policy answers one node count per
admitted task through the allocation callable, the scheduler checks the answer and places the nodes
(docs/architecture.md, "Allocation policies").
"""

from __future__ import annotations

from offcut.daemon.model import (CancelEvent, EnergyEvent, Event, NodeEvent, ProgressEvent,
                                 SubmitEvent, TaskRunEvent)
from offcut.daemon.scheduler.outcome import Allocate, Outcome
from offcut.daemon.scheduler.allocation import Allocation
from offcut.daemon.scheduler.clock import ProgressClock
from offcut.daemon.scheduler.energy import EnergyReports
from offcut.daemon.scheduler.lifecycle import TaskLifecycle
from offcut.daemon.scheduler.models import TaskModels
from offcut.daemon.scheduler.nodes import NodeEvents
from offcut.daemon.scheduler.progress import ProgressReports
from offcut.daemon.scheduler.state import SchedulerState
from offcut.daemon.scheduler.validation import EventValidation


class Scheduler(EventValidation, ProgressClock, NodeEvents, TaskLifecycle, ProgressReports,
                EnergyReports, Allocation, TaskModels, SchedulerState):
    """Applies events to the cluster state, one concern per base class: validation
    (:mod:`.validation`), the clock and progress model (:mod:`.clock`), node events
    (:mod:`.nodes`), task life cycle (:mod:`.lifecycle`), progress reports (:mod:`.progress`),
    measured energy (:mod:`.energy`), allocation (:mod:`.allocation`), task models (:mod:`.models`), over the state and its
    persistence (:mod:`.state`; constructor arguments there)."""

    def apply(self, event: Event, allocate: Allocate) -> Outcome:
        """Validate and apply ``event``; returns the outcome. Raises like :meth:`validate`
        (then nothing changed)."""
        self.validate(event)
        return self.apply_validated(event, allocate)

    def apply_validated(self, event: Event, allocate: Allocate) -> Outcome:
        """Apply an event that :meth:`validate` accepted in the current state (callers that
        validate first to separate rejections from failures, like the engine): retire the
        tasks finished longer ago than the retention, advance the clock to the event's time,
        apply it, re-allocate when it changed anything."""
        t = event.time if self.clock is None else max(event.time, self.clock)
        out = Outcome(time=t)
        touched = {task.task_id for task in self.admitted()}  # they may change on the way
        self._retire_finished(t, out)
        out.interval_s = 0.0 if self.clock is None else t - self.clock
        self._advance(t, out, allocate)
        if isinstance(event, NodeEvent):
            out.source, out.seq = event.source, event.seq
            out.cause = "snapshot" if event.snapshot else "nodes"
            self.last_seq[event.source] = event.seq
            observed = event.observed_time
            self.node_clock = observed if self.node_clock is None else max(self.node_clock,
                                                                           observed)
            changed = self._apply_nodes(event, t, out)
        else:
            out.cause, handler = self._HANDLERS[type(event)]
            changed = handler(self, event, t, out)
        if changed:
            self._reallocate(t, out, allocate)
        self.revision += 1
        out.revision = self.revision
        self._fill_figures(out)
        self._mark_changed(event, out, touched)
        return out

    #: event type -> (journal kind, handler) of the events other than node events
    _HANDLERS = {
        SubmitEvent: ("submit", TaskLifecycle._apply_submit),
        CancelEvent: ("cancel", TaskLifecycle._apply_cancel),
        TaskRunEvent: ("run", TaskLifecycle._apply_run_event),
        ProgressEvent: ("progress", ProgressReports._apply_progress),
        EnergyEvent: ("energy", EnergyReports._apply_energy),
    }

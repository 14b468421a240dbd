"""Checks of an event against the state before anything changes (docs/architecture.md,
"Time and events"): INVALID_ARGUMENT, FAILED_PRECONDITION and NOT_FOUND naming the field."""

from __future__ import annotations

import math

from typing import Callable

from offcut.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from offcut.daemon.app.model import (RUN_STATES, CancelEvent, EnergyEvent, Event, NodeEvent,
                                 ProgressEvent, SubmitEvent, TaskRunEvent, check_node_names)
from offcut.daemon.app.scheduler.state import SchedulerState


MAX_SOURCE_LEN = 200
#: distinct node-event sources the state remembers a last seq of (every snapshot holds them):
#: Slurm's side uses a handful (the prolog, the epilog, the watcher); a source past this many is
#: RESOURCE_EXHAUSTED, so no sender can grow the state by inventing sources
MAX_SOURCES = 1024
MAX_MESSAGE_LEN = 2000


class EventValidation:
    """Validation of the six event kinds; pure (never changes state).

    Reads ``state.last_seq``, ``clock``, ``node_clock``, ``limits``, ``pool`` and ``tasks``
    (and the learners' checks of a report); writes nothing. An energy report is checked by
    ``check_energy`` (the energy reports' own :meth:`validate
    <offcut.daemon.app.scheduler.energy.EnergyReports.validate>`, composed by the scheduler).

    Interface: :meth:`validate`.
    """

    def __init__(self, state: SchedulerState,
                 check_energy: Callable[[EnergyEvent], None]) -> None:
        self.state = state
        self.check_energy = check_energy

    def validate(self, event: Event) -> None:
        """Raise InvalidArgument / FailedPrecondition / NotFound / ResourceExhausted (naming
        the field) if ``event`` cannot be applied. Never changes state."""
        state = self.state
        if not math.isfinite(event.time) or event.time <= 0:
            raise InvalidArgument("must be a set, positive timestamp", "time")
        if isinstance(event, NodeEvent):
            if not event.source or len(event.source) > MAX_SOURCE_LEN or not event.source.isprintable():
                raise InvalidArgument(f"must be 1-{MAX_SOURCE_LEN} printable characters", "source")
            if event.seq < 1:
                raise InvalidArgument("must be >= 1", "seq")
            last = state.last_seq.get(event.source, 0)
            if not last and len(state.last_seq) >= MAX_SOURCES:
                raise ResourceExhausted(f"the daemon already knows {MAX_SOURCES} sources; send "
                                        "with one of them (Slurm's side needs a few)", "source")
            if event.seq <= last:
                raise FailedPrecondition(
                    f"{event.seq} is not after the last applied seq {last} of source "
                    f"{event.source!r}", "seq")
            if state.clock is not None and event.time < state.clock:
                raise FailedPrecondition(
                    f"event at {event.time:.3f} is older than the last applied event at "
                    f"{state.clock:.3f}", "time")
            if state.node_clock is not None and event.observed_time < state.node_clock:
                raise FailedPrecondition(
                    f"observed at {event.observed_time:.3f}, before the newest applied node "
                    f"observation at {state.node_clock:.3f}: observe the nodes again", "time")
            if state.limits is not None:
                self._check_event_size(event, state.limits.max_event_nodes)
            check_node_names(list(event.idle), "idle")
            check_node_names(list(event.preempted), "preempted")
            if event.kinds:
                check_node_names([n for n, _ in event.kinds], "kinds")
                for node, kind in event.kinds:
                    kind.check(f"kinds[{node}]")
            if not event.snapshot:
                if not event.idle and not event.preempted:
                    raise InvalidArgument("an event must name at least one node", "idle")
                both = set(event.idle) & set(event.preempted)
                if both:
                    raise InvalidArgument(
                        f"node {sorted(both)[0]!r} is both idle and preempted", "preempted")
            if state.limits is not None:
                self._check_pool_size(event, state.limits.max_idle_nodes)
        elif isinstance(event, SubmitEvent):
            event.spec.validate(state.limits)
            if event.request_id and len(event.request_id) > MAX_SOURCE_LEN:
                raise InvalidArgument(f"must be at most {MAX_SOURCE_LEN} characters", "request_id")
            if not event.owner or len(event.owner) > MAX_SOURCE_LEN:
                raise InvalidArgument(f"must be 1-{MAX_SOURCE_LEN} characters", "owner")
        elif isinstance(event, ProgressEvent):
            self._validate_progress(event)
        elif isinstance(event, EnergyEvent):
            self.check_energy(event)  # (offcut.daemon.app.scheduler.energy)
        elif isinstance(event, (CancelEvent, TaskRunEvent)):
            if isinstance(event, CancelEvent) and len(event.request_id) > MAX_SOURCE_LEN:
                raise InvalidArgument(f"must be at most {MAX_SOURCE_LEN} characters", "request_id")
            task = state.tasks.get(event.task_id)
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
        if len(event.kinds) > limit:
            raise InvalidArgument(f"has {len(event.kinds)} nodes, more than max_event_nodes "
                                  f"({limit})", "kinds")
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
        pool = self.state.pool
        size = (len(pool) + sum(1 for n in event.idle if n not in pool)
                - sum(1 for n in event.preempted if n in pool))
        if size > limit:
            raise FailedPrecondition(f"the idle pool would hold {size} nodes, more than "
                                     f"max_idle_nodes ({limit})", "idle")

    def _validate_progress(self, event: ProgressEvent) -> None:
        """Checks of a progress event: every report names a running-or-waiting task that
        reports progress, once, with figures its learner accepts (``reports[i].<field>``)."""
        if not event.reports:
            raise InvalidArgument("a progress request needs at least one report", "reports")
        limits = self.state.limits
        limit = limits.max_progress_reports if limits is not None else None
        if limit is not None and len(event.reports) > limit:
            raise InvalidArgument(f"has {len(event.reports)} reports, more than "
                                  f"max_progress_reports ({limit})", "reports")
        if event.request_id and len(event.request_id) > MAX_SOURCE_LEN:
            raise InvalidArgument(f"must be at most {MAX_SOURCE_LEN} characters", "request_id")
        seen: set[str] = set()
        for i, r in enumerate(event.reports):
            where = f"reports[{i}]."
            task = self.state.tasks.get(r.task_id)
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

"""The engine: one lock around the scheduler, the allocator, the store and the watchers.

Order of every state-changing call (:meth:`Engine.apply`): answer a repeated
``(source, seq)`` / ``request_id`` from the journal; otherwise apply the event to the
scheduler, build the reply, commit journal row (and snapshot when due) in one transaction,
publish placement changes, reply. A failure after the
scheduler changed (a store error, a bug) reloads the scheduler from the state file, so no half-applied
state survives.

The engine speaks the application's types only (events in, :mod:`offcut.daemon.app.replies`
out); it imports neither grpc nor protobuf. Everything it hands out is a copy made under its
lock, so the gRPC edge converts replies to messages after releasing it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from offcut.errors import FailedPrecondition, NotFound, OffcutError
from offcut.daemon.app import engine_reads
from offcut.daemon.app.decision_times import DecisionTimes
from offcut.daemon.app.scheduler import Outcome, Scheduler, SolveRecord
from offcut.daemon.app.model import (CancelEvent, EnergyEvent, Event, NodeEvent, ObjectiveSettings, ProgressEvent, SubmitEvent, TaskRunEvent, event_to_dict)
from offcut.taskspec import Limits
from offcut.views import TaskState
from offcut.daemon.app.owner_caps import OwnerCaps
from offcut.daemon.app.placement_updates import RETAINED_UPDATES, PlacementUpdates
from offcut.daemon.app.recovery import journal_solves, recover
from offcut.daemon.app.repeated_requests import request_key, stored_reply
from offcut.daemon.app.replies import Reply, decision_of, task_view
from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.solvers.problem import AllocationProblem
from offcut.daemon.app.policies.guard import PolicyGuard
from offcut.daemon.app.storage_errors import StateFull, StateReadOnly
from offcut.daemon.app.snapshots import SnapshotDelta
from offcut.daemon.app.store import Store
from offcut.views import (Decision, PlacementUpdate, SnapshotStatistics, SolverStatistics,
                          StatusView, TaskView, TaskWarning)

log = logging.getLogger("offcut.daemon")

#: the caller of requests that name none (a daemon without tokens: every caller is this one)
LOCAL_CALLER = "local"

__all__ = ["Engine", "LOCAL_CALLER", "RETAINED_UPDATES", "clock_now"]


class Engine:
    """Serialises events through the scheduler and makes them durable.

    Its collaborators: :func:`offcut.daemon.app.recovery.recover` rebuilds the scheduler from the
    state file; :mod:`offcut.daemon.app.repeated_requests` keys events for the journal and
    answers repeats; :class:`~offcut.daemon.app.owner_caps.OwnerCaps` refuses submissions over
    the per-owner caps; :mod:`offcut.daemon.app.engine_reads` builds the read-only views (under
    this engine's lock, or after it for the archive);
    :class:`~offcut.daemon.app.placement_updates.PlacementUpdates` retains the placement updates
    and tells their listeners. The lock and the order of an event's steps stay here.

    Args:
        store: the state file.
        allocator: solves allocation problems (``Allocator``).
        tfwd_s, max_running_tasks: scheduler settings; applied on top of the stored state.
        objective: the allocation objective and power figures (None: keep the stored ones).
        max_failed_generations: failed runs in a row that fail a task (docs/execution.md;
            None: keep the stored setting).
        finished_task_retention_s: how long a finished task stays in the scheduler's state
            (memory, snapshots) after it finished [s]; then it is kept in the state file's
            archive and still answered by :meth:`task` and :meth:`tasks` (None: keep the
            stored setting).
        final_grace_s: a launched task's time to exit 0 after a report reached its work [s]
            (docs/execution.md, "Completion"; None: keep the stored setting).
        task_archive_retention_s: how long an archived task is kept after it finished [s]
            (pruned at each snapshot; inf: for ever).
        max_active_tasks_per_owner: the most unfinished (queued, admitted, running) tasks of
            one owner when a ``capped`` caller submits (:meth:`apply`; None: no cap).
        max_retained_tasks_per_owner: the most tasks of one owner in the scheduler's state
            (unfinished, and finished ones not yet retired) when a ``capped`` caller submits
            (None: no cap).
        max_retained_task_bytes_per_owner: the most bytes those tasks may count together
            (:func:`offcut.daemon.app.scheduler.state.retained_bytes`, the new task's included)
            when a ``capped`` caller submits [bytes] (None: no cap).
        journal_retention_s: how long journal rows are kept [s of event clock]: the window
            in which a repeated request id or ``(source, seq)`` is answered from the journal
            and ``ExportHistory`` reaches back (marked at each snapshot, deleted a few rows per
            following event: :meth:`Store.retire_journal`; inf: for ever).
        record_instances: optional JSONL path; every solved problem is appended to it.
        limits: request size limits checked for new events (default: :class:`Limits`'s
            defaults); the journal is re-applied without them.
    """

    def __init__(self, store: Store, allocator: Allocator, *, tfwd_s: float = 10.0,
                 max_running_tasks: int = 10, record_instances: str | Path | None = None,
                 limits: Limits | None = None, objective: ObjectiveSettings | None = None,
                 max_failed_generations: int | None = None,
                 finished_task_retention_s: float | None = None,
                 final_grace_s: float | None = None,
                 task_archive_retention_s: float = float("inf"),
                 journal_retention_s: float = float("inf"),
                 max_active_tasks_per_owner: int | None = None,
                 max_retained_tasks_per_owner: int | None = None,
                 max_retained_task_bytes_per_owner: int | None = None):
        self.store = store
        #: what one owner may hold when a capped caller submits (None: no cap)
        self.owner_caps = OwnerCaps(max_active_tasks=max_active_tasks_per_owner,
                                    max_retained_tasks=max_retained_tasks_per_owner,
                                    max_retained_task_bytes=max_retained_task_bytes_per_owner)
        self.task_archive_retention_s = float(task_archive_retention_s)
        self.journal_retention_s = float(journal_retention_s)
        self._fresh_retention_s = finished_task_retention_s
        self.limits = limits if limits is not None else Limits()
        self.allocator = allocator
        self.requested_solver = allocator.solver
        self.lock = threading.RLock()
        #: the retained placement updates (:meth:`updates_after`) and their listeners, with a
        #: lock of their own that is held for a copy only, never across a solve: the gRPC
        #: edge's event loop reads them without waiting for an event to be applied
        self.placement_updates = PlacementUpdates(RETAINED_UPDATES)
        #: decision times [ms] since start, in fixed memory (quantile sketch, count, buckets)
        self.decision_times = DecisionTimes()
        #: how long each snapshot written at an event held events back [ms]: building it,
        #: committing it with its event's journal row, the retention after it (:meth:`_commit`),
        #: in the same fixed memory; and the newest one's (ms, revision)
        self.snapshot_times = DecisionTimes()
        self.last_snapshot: tuple[float, int] = (0.0, 0)
        self.fallbacks = 0
        self.solves_by_backend: dict[str, int] = {}
        self.last_fallback_reason = ""
        self.last_decision: Decision | None = None
        self._record = open(record_instances, "a", encoding="utf-8") if record_instances else None
        self.closed = False
        #: the guard of allocation policies, kept across scheduler reloads (a policy disabled
        #: after a timeout stays so until the process restarts; its fallback counts)
        self.policy_guard = PolicyGuard()
        self.scheduler = self._recover()
        #: archived tasks per state (kept with the archive; Status counts them)
        self.archived_counts: dict[TaskState, int] = self._count_archived()
        self._apply_settings(tfwd_s=float(tfwd_s), max_running_tasks=int(max_running_tasks),
                             max_failed_generations=max_failed_generations,
                             finished_task_retention_s=finished_task_retention_s,
                             final_grace_s=final_grace_s, objective=objective)

    def _apply_settings(self, **settings) -> None:
        """Put the configured scheduler settings on top of the stored state (a None value keeps the
        stored one); logs what changed in a state with history (a new state's built-in
        defaults are not news) and writes one snapshot when anything did."""
        changed = False
        for name, value in settings.items():
            old = getattr(self.scheduler, name)
            if value is not None and value != old:
                (log.info if self.scheduler.revision else log.debug)(
                    "setting %s: %s -> %s", name, old, value)
                setattr(self.scheduler, name, value)
                changed = True
        if changed:
            self.store.write_snapshot(self._snapshot_state())

    def _snapshot_state(self) -> SnapshotDelta:
        """The next snapshot: the state without its tasks, and the tasks that changed or left
        since the last one (an incremental snapshot, docs/architecture.md,
        "Journal and snapshots")."""
        header, changed, removed = self.scheduler.snapshot_changes()
        return SnapshotDelta(header, changed, removed)

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> Scheduler:
        """The scheduler of the state file (:func:`offcut.daemon.app.recovery.recover`)."""
        return recover(self.store, policy_guard=self.policy_guard, limits=self.limits,
                       fresh_retention_s=self._fresh_retention_s)

    # ------------------------------------------------------------------ allocation
    def _allocate(self, problem: AllocationProblem) -> SolveRecord:
        if self._record is not None:
            self._record.write(problem.to_json() + "\n")
        solution, reason = self.allocator.solve(problem)
        record = SolveRecord(counts=[int(c) for c in solution.counts], solver=solution.solver,
                             status=solution.status, objective=float(solution.objective),
                             bound=float(solution.bound) if np.isfinite(solution.bound) else float("inf"),
                             solve_ms=float(solution.solve_ms), fallback_reason=reason)
        self.solves_by_backend[solution.solver] = self.solves_by_backend.get(solution.solver, 0) + 1
        if reason:
            self.fallbacks += 1
            self.last_fallback_reason = reason
            log.warning("allocation fell back to %s: %s", solution.solver, reason)
        return record

    # ------------------------------------------------------------------ events
    def apply(self, event: Event, *, stamp: bool = False, caller: str = LOCAL_CALLER,
              capped: bool = False) -> Reply:
        """Apply ``event``; return its :class:`Reply` (``duplicate`` set when a repeated
        ``(source, seq)``, or a request id ``caller`` sent before for this kind of event, is
        answered from the journal).

        ``stamp``: apply it no earlier than the event clock (at the later of its time and the
        clock, taken under the lock): events at the daemon's receive time
        (:mod:`offcut.daemon.edge.event_times`) stay in the order they are applied.
        ``caller``: who sends it (the idempotency namespace of its request id). ``capped``: a
        submission is refused (ResourceExhausted naming ``max_active_tasks_per_owner``) when
        its owner already has that many unfinished tasks; checked after a repeated request id
        was answered and before anything changes, under the lock (never when the journal is
        re-applied: rows met the cap of their time). Raises :class:`OffcutError` for rejected
        events (state unchanged).
        """
        with self.lock:
            if self.closed:
                raise OffcutError("the daemon is shutting down")
            reply = stored_reply(self.store, event, caller)
            if reply is not None:
                return reply
            if capped and isinstance(event, SubmitEvent):
                self.owner_caps.check(self.scheduler, event)
            if stamp and self.scheduler.clock is not None and event.time < self.scheduler.clock:
                event = dataclasses.replace(event, time=self.scheduler.clock)
            try:
                self.scheduler.validate(event)  # rejected events raise here, before any change
            except NotFound as exc:
                self._refuse_archived(event, exc)
                raise
            started = time.perf_counter()
            try:
                out = self.scheduler.apply_validated(event, self._allocate)
                reply = Reply(decision=decision_of(out, self.requested_solver,
                                                   getattr(event, "sent_time", None)),
                              tasks=[task_view(self.scheduler.tasks[i], self.scheduler)
                                     for i in _answered_task_ids(event, out)])
                raw = reply.to_record()
            except Exception:  # after validation, any failure may have left a partial change
                log.exception("applying %s failed; reloading state", type(event).__name__)
                self.scheduler = self._recover()
                raise
            self._commit(event, out, raw, caller)
            if out.solves:
                self.decision_times.record((time.perf_counter() - started) * 1000.0)
            self.last_decision = reply.decision
            if out.placements or out.warnings:
                tasks = self.scheduler.tasks
                owners = self._owners(reply.decision.placements)
                owners.update((tid, tasks[tid].owner) for tid, _ in out.warnings
                              if tid in tasks)
                self.placement_updates.publish(PlacementUpdate(
                    revision=out.revision, time=out.time, cause=out.cause,
                    placements=reply.decision.placements, owners=owners,
                    warnings=[TaskWarning.of(tid, w) for tid, w in out.warnings]))
            return reply

    def _refuse_archived(self, event: Event, exc: NotFound) -> None:
        """FAILED_PRECONDITION instead of ``exc`` when the event names a task that finished
        and was archived (the same answer as before it left the state)."""
        if isinstance(event, ProgressEvent):
            ids = [(f"reports[{i}].task_id", r.task_id) for i, r in enumerate(event.reports)]
        else:
            ids = [("task_id", getattr(event, "task_id", ""))]
        for field, task_id in ids:
            if field == exc.field and task_id and (
                    stored := self.store.archived_task(task_id)) is not None:
                raise FailedPrecondition(f"task {task_id} is already {stored['state']}",
                                         field) from None

    def _commit(self, event: Event, out: Outcome, raw: bytes, caller: str) -> None:
        """Journal an applied event with its stored reply (and a snapshot when due); a
        failure reloads the scheduler from the state file and is raised."""
        snapshot = self.store.snapshot_due()
        try:
            started = time.perf_counter()
            state = self._snapshot_state() if snapshot else None
            pruned = self.store.append(
                kind=out.cause, event=event_to_dict(event),
                solves=journal_solves(out), response=raw,
                source=event.source if isinstance(event, NodeEvent) else None,
                seq=event.seq if isinstance(event, NodeEvent) else None,
                request_id=request_key(event, caller), state=state,
                archive=[t.to_dict() for t in out.retired],
                prune_archive_before=(out.time - self.task_archive_retention_s
                                      if snapshot and self.task_archive_retention_s < math.inf
                                      else None))
            held_s = time.perf_counter() - started  # building the snapshot, then the commit
        except Exception as exc:
            if isinstance(exc, (StateReadOnly, StateFull)):  # the store logged it, once
                log.warning("revision %d not committed (%s); reloading state", out.revision,
                            type(exc).__name__)
            else:
                log.exception("committing revision %d failed; reloading state", out.revision)
            self.scheduler = self._recover()
            self.archived_counts = self._count_archived()
            raise
        for task in out.retired:
            self.archived_counts[task.state] = self.archived_counts.get(task.state, 0) + 1
        for state_value, n in pruned.items():
            self.archived_counts[TaskState(state_value)] -= n
        if snapshot:
            started = time.perf_counter()
            self._apply_retention(out.time)
            ms = (held_s + time.perf_counter() - started) * 1e3
            self.snapshot_times.record(ms)
            self.last_snapshot = (ms, out.revision)
        if out.ignored_nodes:  # (normal: the launcher, the hooks and the watcher report the
            # same change; the sender is told in its Decision's ignored_nodes)
            log.info("event %s/%s: ignored %d node(s) that were not idle or already idle: %s",
                     out.source, out.seq, len(out.ignored_nodes),
                     ", ".join(out.ignored_nodes[:10]))

    def _apply_retention(self, now: float) -> None:
        """After a snapshot: mark the journal rows older than their retention for deletion
        (``now``: the event clock [s]; the archived tasks past theirs went in the snapshot's
        own transaction). A failure is logged, not raised: the event is committed, and the
        next snapshot tries again."""
        try:
            if self.journal_retention_s < float("inf"):  # deleted a few per next event
                self.store.retire_journal(now - self.journal_retention_s)
        except Exception:  # noqa: BLE001 - retention is housekeeping, retried next time
            log.exception("retention at the snapshot of %s failed", self.store.path)

    # ------------------------------------------------------------------ reads
    def owner_of(self, task_id: str) -> str | None:
        """The owner of task ``task_id`` (None for an unknown id)."""
        with self.lock:
            task = engine_reads.task_or_archived(self.scheduler, self.store, task_id)
            return task.owner if task is not None else None

    def _count_archived(self) -> dict[TaskState, int]:
        """Archived tasks per state, from the state file."""
        return {TaskState(k): n for k, n in self.store.archived_counts().items()}

    def task(self, task_id: str) -> TaskView:
        """One task as it is now; NotFound naming ``task_id`` for an unknown id."""
        with self.lock:
            task = engine_reads.task_or_archived(self.scheduler, self.store, task_id)
            if task is None:
                raise NotFound(f"no task {task_id!r}", "task_id")
            return task_view(task, self.scheduler)

    def tasks(self, states: set[TaskState] | None = None, owner: str = "", *,
              after: int = 0, limit: int | None = None) -> tuple[list[TaskView], bool]:
        """``(views, more)``: tasks in submit order, those in ``states`` (None or empty: all)
        of ``owner`` (empty: every owner) with a submit number above ``after``, at most
        ``limit`` (None: all); ``more`` is True when tasks past the last one returned match
        too (a page of ListTasks). The archived finished tasks are included when finished
        states are asked for; the archive is read after the engine's lock is released
        (committed rows, :meth:`Store.archived_tasks`), so a long list never holds up an
        event; a task retired in between is in both and answered once."""
        with self.lock:
            scheduler = self.scheduler
            views = engine_reads.live_task_views(scheduler, states, owner, after=after,
                                                 limit=limit)
        return engine_reads.with_archived(views, scheduler, self.store, states, owner,
                                          after=after, limit=limit)

    def status(self, include_idle: bool, with_solver: bool = True) -> StatusView:
        """The state in figures (idle node names only when ``include_idle``; the solver
        statistics (decision-time percentiles from a fixed-size sketch) unless ``with_solver`` is False:
        the metrics scrape, which has its own histogram, skips them)."""
        with self.lock:
            return engine_reads.status_view(
                self.scheduler, self.archived_counts, include_idle=include_idle,
                solver=self.solver_statistics() if with_solver else None,
                last_decision=self.last_decision, snapshots=self._snapshot_statistics())

    def _snapshot_statistics(self) -> SnapshotStatistics:
        """The snapshots written at events since start (under the lock)."""
        times = self.snapshot_times.summary()
        return SnapshotStatistics(count=times.count, ms_p50=times.p50_ms, ms_p99=times.p99_ms,
                                  ms_max=times.max_ms, last_ms=self.last_snapshot[0],
                                  last_revision=self.last_snapshot[1])

    def solver_statistics(self) -> SolverStatistics:
        """Decision-time percentiles [ms] since start (within 1 %: :mod:`decision_times`),
        fallbacks, solves per backend."""
        with self.lock:
            times = self.decision_times.summary()
            return SolverStatistics(
                configured_solver=self.requested_solver, decisions=times.count,
                decision_ms_p50=times.p50_ms, decision_ms_p95=times.p95_ms,
                decision_ms_p99=times.p99_ms, decision_ms_max=times.max_ms,
                fallbacks=self.fallbacks, solves_by_backend=dict(self.solves_by_backend),
                last_fallback_reason=self.last_fallback_reason)

    # ------------------------------------------------------------------ placement updates
    def _owners(self, placements) -> dict[str, str]:
        """The owner of each placed task, by task id (under the lock)."""
        tasks = self.scheduler.tasks
        return {p.task_id: tasks[p.task_id].owner for p in placements if p.task_id in tasks}

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after each applied event that published placement updates, and
        once when the engine closes. It runs on the applying thread with the engine's lock
        held, so it must only hand the news on (e.g. ``loop.call_soon_threadsafe``): never
        block, never take the lock itself."""
        self.placement_updates.add_listener(callback)

    def updates_after(self, revision: int, task_id: str = "") -> list[PlacementUpdate]:
        """The retained placement updates with revision > ``revision``, oldest first (the
        last :data:`RETAINED_UPDATES`); with ``task_id``, only that task's placements, and
        only updates that have some. Never waits for an event being applied (the updates
        have a lock of their own); costs O(updates returned), not O(retained)."""
        return self.placement_updates.after(revision, task_id)

    def close(self) -> None:
        """Snapshot, end the watchers (listeners are told), close the allocator and the state
        file."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.placement_updates.notify()
            try:
                self.store.write_snapshot(self._snapshot_state())
            finally:
                self.store.close()
                self.allocator.close()
                if self._record is not None:
                    self._record.close()


def _answered_task_ids(event: Event, out: Outcome) -> list[str]:
    """The tasks a reply carries: the one submitted, cancelled or reported on (a run or an
    energy report); every task of a progress report; none for node events."""
    if isinstance(event, ProgressEvent):
        return [r.task_id for r in event.reports]
    if isinstance(event, (SubmitEvent, CancelEvent, TaskRunEvent, EnergyEvent)):
        return [out.task_id]
    return []


def clock_now() -> float:
    """Wall-clock time [s since epoch] for requests that carry no time (service layer only)."""
    return time.time()


"""The engine: one lock around the scheduler, the allocator, the store and the watchers.

Order of every state-changing call: answer a repeated ``(source, seq)`` / ``request_id`` from
the journal; otherwise apply the event to the scheduler, build the reply, commit journal row (and
snapshot when due) in one transaction, publish placement changes, reply. A failure after the
scheduler changed (a store error, a bug) reloads the scheduler from the state file, so no half-applied
state survives.

The engine speaks the application's types only (events in, :mod:`offcut.daemon.replies`
out); it imports neither grpc nor protobuf. Everything it hands out is a copy made under its
lock, so the gRPC edge converts replies to messages after releasing it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import numpy as np

from offcut.errors import FailedPrecondition, NotFound, OffcutError, ResourceExhausted
from offcut.daemon.decision_times import DecisionTimes
from offcut.daemon.scheduler import Outcome, Scheduler, SolveRecord
from offcut.daemon.scheduler.state import retained_bytes
from offcut.daemon.model import (CancelEvent, EnergyEvent, Event, Limits, NodeEvent,
                                 ObjectiveSettings, ProgressEvent, SubmitEvent, Task,
                                 TaskRunEvent, TaskState, event_from_dict, event_to_dict)
from offcut.daemon.replies import (Decision, PlacementUpdate, Reply, SnapshotStatistics,
                                   SolverStatistics, StatusView, TaskView, decision_of,
                                   task_view)
from offcut.daemon.solvers.allocator import Allocator
from offcut.daemon.solvers.problem import AllocationProblem
from offcut.daemon.model import task_number
from offcut.daemon.policies.guard import PolicyGuard
from offcut.daemon.storage_errors import StateFull, StateReadOnly
from offcut.daemon.store import SnapshotDelta, Store

log = logging.getLogger("offcut.daemon")

#: the caller of requests that name none (a daemon without tokens: every caller is this one)
LOCAL_CALLER = "local"

#: placement updates kept for ``WatchPlacements(after_revision=...)``
RETAINED_UPDATES = 4096


class _Replayed:
    """Allocation answers recorded in the journal, handed back in order on recovery.

    A row may also carry a third-party policy's answers (entries with a ``"policy"`` key,
    after the solves of their decision; :meth:`Allocation._allocation_counts`): a solve is
    never handed out past one, and :meth:`policy_answer` skips to the next."""

    def __init__(self, solves: list[dict]):
        self._entries = solves
        self._i = 0
        #: the row carries policy answers (written since they are journaled)
        self.replaying_answers = any("policy" in e for e in solves)

    def __call__(self, problem: AllocationProblem) -> SolveRecord:
        entries, i = self._entries, self._i
        if i >= len(entries) or "policy" in entries[i]:
            raise RuntimeError("journal has fewer allocation answers than the event needs")
        self._i = i + 1
        return SolveRecord(**entries[i])

    def policy_answer(self) -> dict | None:
        """The next policy answer of the row (the solves before it skipped), else None."""
        entries = self._entries
        while self._i < len(entries) and "policy" not in entries[self._i]:
            self._i += 1
        if self._i >= len(entries):
            return None
        self._i += 1
        return entries[self._i - 1]


def _journal_solves(out: Outcome) -> list[dict]:
    """The journal's ``solves`` of an event: its solves in order, each policy answer at its
    place among them."""
    entries = [s.to_dict() for s in out.solves]
    for at, answer in reversed(out.policy_answers):
        entries.insert(at, answer)
    return entries


class Engine:
    """Serialises events through the scheduler and makes them durable.

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
            (:func:`offcut.daemon.scheduler.state.retained_bytes`, the new task's included)
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
        #: tasks / bytes of one owner the state may keep when a capped caller submits
        self.max_retained_tasks_per_owner = max_retained_tasks_per_owner
        self.max_retained_task_bytes_per_owner = max_retained_task_bytes_per_owner
        #: unfinished tasks one owner may have when a capped caller submits (None: no cap)
        self.max_active_tasks_per_owner = max_active_tasks_per_owner
        self.task_archive_retention_s = float(task_archive_retention_s)
        self.journal_retention_s = float(journal_retention_s)
        self._fresh_retention_s = finished_task_retention_s
        self.limits = limits if limits is not None else Limits()
        self.allocator = allocator
        self.requested_solver = allocator.solver
        self.lock = threading.RLock()
        #: the retained placement updates (:meth:`updates_after`), guarded by a lock of their
        #: own that is held for a copy only, never across a solve: the gRPC edge's event loop
        #: reads them without waiting for an event to be applied
        self.updates: deque[PlacementUpdate] = deque(maxlen=RETAINED_UPDATES)
        self._updates_lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
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
        state, rows = self.store.load()
        if state:
            scheduler = Scheduler.from_dict(state)
        elif self._fresh_retention_s is not None:  # a new state: the configured retention
            scheduler = Scheduler(finished_task_retention_s=self._fresh_retention_s)
        else:
            scheduler = Scheduler()
        scheduler.policy_guard = self.policy_guard
        n, retired = 0, []
        for event, solves in rows:
            retired += scheduler.apply(event_from_dict(event), _Replayed(solves)).retired
            n += 1
        if retired:  # archived when first applied; again in case the retention changed since
            self.store.archive_tasks(t.to_dict() for t in retired)
        if state and (not self.store.loaded_incremental or self.store.bad_snapshots):
            scheduler.mark_all_changed()  # the next snapshot writes every task
        if state or n:
            log.info("state %s: revision %d (%d journal rows re-applied after the snapshot)",
                     self.store.path, scheduler.revision, n)
        scheduler.limits = self.limits  # new events only: the journal was checked when it was written
        return scheduler

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
        (:mod:`offcut.daemon.event_times`) stay in the order they are applied.
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
            reply = self._stored_reply(event, caller)
            if reply is not None:
                return reply
            if capped and isinstance(event, SubmitEvent):
                self._check_owner_cap(event)
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
                self._publish(PlacementUpdate(
                    revision=out.revision, time=out.time, cause=out.cause,
                    placements=reply.decision.placements, owners=owners,
                    warnings=list(out.warnings)))
            return reply

    def _check_owner_cap(self, event: SubmitEvent) -> None:
        """ResourceExhausted when ``event``'s owner has as many unfinished tasks as
        ``max_active_tasks_per_owner`` allows, as many tasks in the state as
        ``max_retained_tasks_per_owner`` allows, or when the new task would bring the bytes
        of its tasks in the state past ``max_retained_task_bytes_per_owner`` (the field
        names the setting; call under the lock, before anything changes)."""
        owner = event.owner
        cap = self.max_active_tasks_per_owner
        held = self.scheduler.active_owners.get(owner, 0)
        if cap is not None and held >= cap:
            raise ResourceExhausted(
                f"owner {owner!r} has {held} queued or running tasks, the most this daemon "
                f"allows ({cap}); cancel some or wait until they finish",
                "max_active_tasks_per_owner")
        kept, size = self.scheduler.retained_owners.get(owner, (0, 0))
        finished = _finished_text(self.scheduler.finished_task_retention_s)
        cap = self.max_retained_tasks_per_owner
        if cap is not None and kept >= cap:
            raise ResourceExhausted(
                f"owner {owner!r} has {kept} tasks in the daemon's memory (queued, running, "
                f"and {finished}), the most this daemon allows ({cap}); "
                "finished tasks leave memory that long after they finished",
                "max_retained_tasks_per_owner")
        cap = self.max_retained_task_bytes_per_owner
        if cap is not None:
            new = retained_bytes(Task(task_id="", spec=event.spec, owner=owner,
                                      submit_time=event.time, request_id=event.request_id))
            if size + new > cap:
                raise ResourceExhausted(
                    f"owner {owner!r} has tasks of {size:,} bytes in the daemon's memory "
                    f"(queued, running, and {finished}); this one's "
                    f"{new:,} bytes would pass the {cap:,} this daemon allows; finished tasks "
                    "leave memory that long after they finished",
                    "max_retained_task_bytes_per_owner")

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

    def _stored_reply(self, event: Event, caller: str) -> Reply | None:
        """The journal's reply to a repeated event (flagged duplicate), else None."""
        if isinstance(event, NodeEvent):
            stored = self.store.response_for_seq(event.source, event.seq)
            return _duplicate(stored) if stored is not None else None
        key = _request_key(event, caller)
        if key is None:
            return None
        stored = self.store.response_for_request(key)
        return _duplicate(stored) if stored is not None else None

    def _commit(self, event: Event, out: Outcome, raw: bytes, caller: str) -> None:
        """Journal an applied event with its stored reply (and a snapshot when due); a
        failure reloads the scheduler from the state file and is raised."""
        snapshot = self.store.snapshot_due()
        try:
            started = time.perf_counter()
            state = self._snapshot_state() if snapshot else None
            pruned = self.store.append(
                kind=out.cause, event=event_to_dict(event),
                solves=_journal_solves(out), response=raw,
                source=event.source if isinstance(event, NodeEvent) else None,
                seq=event.seq if isinstance(event, NodeEvent) else None,
                request_id=_request_key(event, caller), state=state,
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
            task = self._task_or_archived(task_id)
            return task.owner if task is not None else None

    def _count_archived(self) -> dict[TaskState, int]:
        """Archived tasks per state, from the state file."""
        return {TaskState(k): n for k, n in self.store.archived_counts().items()}

    def _task_or_archived(self, task_id: str) -> Task | None:
        """Task ``task_id`` from the state, else from the archive, else None (under the lock)."""
        task = self.scheduler.tasks.get(task_id)
        if task is None:
            stored = self.store.archived_task(task_id)
            task = Task.from_dict(stored) if stored is not None else None
        return task

    def task(self, task_id: str) -> TaskView:
        """One task as it is now; NotFound naming ``task_id`` for an unknown id."""
        with self.lock:
            task = self._task_or_archived(task_id)
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
            matching = sorted((t for t in scheduler.tasks.values()
                               if task_number(t.task_id) > after
                               and (not states or t.state in states)
                               and (not owner or t.owner == owner)),
                              key=lambda t: task_number(t.task_id))
            views = [task_view(t, scheduler)
                     for t in (matching if limit is None else matching[:limit + 1])]
        finished = [s.value for s in (states or TaskState) if s.finished]
        if finished:
            seen = {v.task_id for v in views}
            archived = [task_view(Task.from_dict(d), scheduler)  # finished: no engine state
                        for d in self.store.archived_tasks(
                            finished, owner, after=after,
                            limit=None if limit is None else limit + 1)
                        if d["task_id"] not in seen]
            views += archived
        views.sort(key=lambda v: task_number(v.task_id))
        if limit is None or len(views) <= limit:
            return views, False
        return views[:limit], True

    def status(self, include_idle: bool, with_solver: bool = True) -> StatusView:
        """The state in figures (idle node names only when ``include_idle``; the solver
        statistics (decision-time percentiles from a fixed-size sketch) unless ``with_solver`` is False:
        the metrics scrape, which has its own histogram, skips them)."""
        with self.lock:
            scheduler = self.scheduler
            counts = {s: self.archived_counts.get(s, 0) for s in TaskState}
            for task in scheduler.tasks.values():
                counts[task.state] += 1
            awaiting = sum(len(t.nodes) for t in scheduler.active.values() if t.awaiting_launch)
            return StatusView(
                clock=scheduler.clock, revision=scheduler.revision, idle_nodes=len(scheduler.pool),
                nodes_in_use=len(scheduler.holder),
                idle_node_names=sorted(scheduler.pool) if include_idle else [],
                tasks_by_state=counts,
                solver=self.solver_statistics() if with_solver else None,
                last_seq=dict(scheduler.last_seq), total_samples=scheduler.total_samples,
                idle_node_seconds=scheduler.idle_node_seconds,
                used_node_seconds=scheduler.used_node_seconds, tfwd_s=scheduler.tfwd_s,
                max_running_tasks=scheduler.max_running_tasks, objective=scheduler.objective.objective,
                eta=scheduler.objective.effective_eta, task_energy_j=scheduler.task_energy_j,
                energy_j=scheduler.energy_j, last_decision=self.last_decision,
                snapshots=self._snapshot_statistics(), nodes_awaiting_launch=awaiting)

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

    def _publish(self, update: PlacementUpdate) -> None:
        """Retain ``update`` for :meth:`updates_after` and tell the listeners."""
        with self._updates_lock:
            self.updates.append(update)
        self._notify()

    def _notify(self) -> None:
        """Call every listener (see :meth:`add_listener`); a failing one is logged."""
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not fail the event that was applied
                log.exception("placement listener %r failed", listener)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after each applied event that published placement updates, and
        once when the engine closes. It runs on the applying thread with the engine's lock
        held, so it must only hand the news on (e.g. ``loop.call_soon_threadsafe``): never
        block, never take the lock itself."""
        with self._updates_lock:
            self._listeners.append(callback)

    def updates_after(self, revision: int, task_id: str = "") -> list[PlacementUpdate]:
        """The retained placement updates with revision > ``revision``, oldest first (the
        last :data:`RETAINED_UPDATES`); with ``task_id``, only that task's placements, and
        only updates that have some. Never waits for an event being applied (the updates
        have a lock of their own); costs O(updates returned), not O(retained)."""
        with self._updates_lock:
            new = []
            for update in reversed(self.updates):
                if update.revision <= revision:
                    break
                new.append(update)
        new.reverse()
        if not task_id:
            return new
        mine = []
        for update in new:
            placements = [p for p in update.placements if p.task_id == task_id]
            warnings = [w for w in update.warnings if w[0] == task_id]
            if placements or warnings:
                mine.append(dataclasses.replace(update, placements=placements,
                                                warnings=warnings))
        return mine

    def close(self) -> None:
        """Snapshot, end the watchers (listeners are told), close the allocator and the state
        file."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._notify()
            try:
                self.store.write_snapshot(self._snapshot_state())
            finally:
                self.store.close()
                self.allocator.close()
                if self._record is not None:
                    self._record.close()


#: the kind of each event that may carry a ``request_id`` (its idempotency namespace)
_REQUEST_KINDS = ((SubmitEvent, "submit"), (TaskRunEvent, "run"), (ProgressEvent, "progress"),
                  (CancelEvent, "cancel"), (EnergyEvent, "energy"))


def _finished_text(seconds: float) -> str:
    """Which finished tasks stay in memory, for a message: ``"finished in the last 1 day"``
    (``seconds``: finished_task_retention_s [s])."""
    if not math.isfinite(seconds):
        return "finished at any time (finished_task_retention_s is unlimited)"
    return f"finished in the last {_duration_text(seconds)}"


def _duration_text(seconds: float) -> str:
    """``seconds`` in words for a message: ``"1 day"``, ``"3 h"``, ``"90 s"``."""
    if seconds >= 86400 and seconds % 86400 == 0:
        days = int(seconds // 86400)
        return f"{days} day" + ("s" if days != 1 else "")
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return f"{seconds:g} s"


def _request_key(event: Event, caller: str) -> str | None:
    """The journal's idempotency key of an event with a ``request_id``: per caller and per
    kind (``["submit", caller, id]`` as JSON), so one caller's ids can never answer, block or
    reveal another's, and ids of different kinds never answer each other. None without one."""
    for cls, kind in _REQUEST_KINDS:
        if isinstance(event, cls) and event.request_id:
            return json.dumps([kind, caller, event.request_id], separators=(",", ":"))
    return None


def _duplicate(stored: bytes) -> Reply:
    """A stored reply, flagged as the answer to a repeated request."""
    reply = Reply.from_record(stored)
    reply.duplicate = True
    return reply


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


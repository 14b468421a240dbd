"""The engine: one lock around the core, the allocator, the store and the watchers.

Order of every state-changing call: answer a repeated ``(source, seq)`` / ``request_id`` from
the journal; otherwise apply the event to the core, build the reply, commit journal row (and
snapshot when due) in one transaction, publish placement changes, reply. A failure after the
core changed (a store error, a bug) reloads the core from the state file, so no half-applied
state survives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from google.protobuf.message import Message

from offcut.errors import OffcutError
from offcut.daemon.core import Core, Outcome, SolveRecord
from offcut.daemon.model import (Event, Limits, NodeEvent, ObjectiveSettings, ProgressEvent,
                                 SubmitEvent, TaskRunEvent,
                                 event_from_dict, event_to_dict)
from offcut.daemon.protocol import decision_to_pb
from offcut.daemon.solvers.allocator import Allocator
from offcut.daemon.solvers.problem import AllocationProblem
from offcut.daemon.store import Store
from offcut.v1 import decision_pb2, status_pb2, tasks_pb2

log = logging.getLogger("offcut.daemon")

#: placement updates kept for ``WatchPlacements(after_revision=...)``
RETAINED_UPDATES = 4096


class _Replayed:
    """Allocation answers recorded in the journal, handed back in order on recovery."""

    def __init__(self, solves: list[dict]):
        self._solves = iter(solves)

    def __call__(self, problem: AllocationProblem) -> SolveRecord:
        try:
            return SolveRecord(**next(self._solves))
        except StopIteration:
            raise RuntimeError("journal has fewer allocation answers than the event needs") from None


class Engine:
    """Serialises events through the core and makes them durable.

    Args:
        store: the state file.
        allocator: solves allocation problems (``Allocator``).
        tfwd_s, max_running_tasks: core settings; applied on top of the stored state.
        objective: the allocation objective and power figures (None: keep the stored ones).
        max_failed_generations: failed runs in a row that fail a task (docs/execution.md;
            None: keep the stored setting).
        record_instances: optional JSONL path; every solved problem is appended to it.
        limits: request size limits checked for new events (default: :class:`Limits`'s
            defaults); the journal is re-applied without them.
    """

    def __init__(self, store: Store, allocator: Allocator, *, tfwd_s: float = 10.0,
                 max_running_tasks: int = 10, record_instances: str | Path | None = None,
                 limits: Limits | None = None, objective: ObjectiveSettings | None = None,
                 max_failed_generations: int | None = None):
        self.store = store
        self.limits = limits if limits is not None else Limits()
        self.allocator = allocator
        self.requested_solver = allocator.solver
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.updates: deque[tasks_pb2.PlacementUpdate] = deque(maxlen=RETAINED_UPDATES)
        self.decision_ms: list[float] = []
        self.fallbacks = 0
        self.solves_by_backend: dict[str, int] = {}
        self.last_fallback_reason = ""
        self.last_decision: decision_pb2.Decision | None = None
        self._record = open(record_instances, "a", encoding="utf-8") if record_instances else None
        self.closed = False
        self.core = self._recover()
        self._apply_settings(tfwd_s=float(tfwd_s), max_running_tasks=int(max_running_tasks),
                             max_failed_generations=max_failed_generations,
                             objective=objective)

    def _apply_settings(self, **settings) -> None:
        """Put the configured core settings on top of the stored state (a None value keeps the
        stored one); logs what changed and writes one snapshot when anything did."""
        changed = False
        for name, value in settings.items():
            old = getattr(self.core, name)
            if value is not None and value != old:
                log.info("setting %s: %s -> %s", name, old, value)
                setattr(self.core, name, value)
                changed = True
        if changed:
            self.store.write_snapshot(self.core.to_dict())

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> Core:
        state, rows = self.store.load()
        core = Core.from_dict(state) if state else Core()
        n = 0
        for event, solves in rows:
            core.apply(event_from_dict(event), _Replayed(solves))
            n += 1
        if state or n:
            log.info("state %s: revision %d (%d journal rows re-applied after the snapshot)",
                     self.store.path, core.revision, n)
        core.limits = self.limits  # new events only: the journal was checked when it was written
        return core

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
    def apply(self, event: Event, build: Callable[[Outcome, decision_pb2.Decision], Message],
              parse: Callable[[bytes], Message]) -> tuple[Message, bool]:
        """Apply ``event``; return ``(reply, duplicate)``.

        ``build(outcome, decision)`` makes the reply message (stored serialized in the
        journal); ``parse`` turns stored bytes back into a reply for a repeated request. Raises :class:`OffcutError`
        for rejected events (state unchanged).
        """
        with self.lock:
            if self.closed:
                raise OffcutError("the daemon is shutting down")
            stored = None
            if isinstance(event, NodeEvent):
                stored = self.store.response_for_seq(event.source, event.seq)
            elif _request_key(event):
                stored = self.store.response_for_request(_request_key(event))
            if stored is not None:
                return parse(stored), True
            self.core.validate(event)  # rejected events raise here, before anything changes
            started = time.perf_counter()
            try:
                out = self.core.apply_validated(event, self._allocate)
                decision = decision_to_pb(out, self.requested_solver)
                reply = build(out, decision)
                raw = reply.SerializeToString()
            except Exception:  # after validation, any failure may have left a partial change
                log.exception("applying %s failed; reloading state", type(event).__name__)
                self.core = self._recover()
                raise
            try:
                self.store.append(
                    kind=out.cause, event=event_to_dict(event),
                    solves=[s.to_dict() for s in out.solves], response=raw,
                    source=event.source if isinstance(event, NodeEvent) else None,
                    seq=event.seq if isinstance(event, NodeEvent) else None,
                    request_id=_request_key(event),
                    state=self.core.to_dict() if self.store.snapshot_due() else None)
            except Exception:
                log.exception("committing revision %d failed; reloading state", out.revision)
                self.core = self._recover()
                raise
            if out.ignored_nodes:
                log.warning("event %s/%s: ignored %d node(s) that were not idle or already idle: %s",
                            out.source, out.seq, len(out.ignored_nodes),
                            ", ".join(out.ignored_nodes[:10]))
            if out.solves:
                self.decision_ms.append((time.perf_counter() - started) * 1000.0)
            self.last_decision = decision
            if out.placements:
                self.updates.append(tasks_pb2.PlacementUpdate(
                    revision=out.revision, time=decision.time, cause=out.cause,
                    placements=decision.placements))
            self.changed.notify_all()
            return reply, False

    # ------------------------------------------------------------------ reads
    def solver_statistics(self) -> status_pb2.SolverStatistics:
        """Decision-time percentiles [ms] since start, fallbacks, solves per backend."""
        ms = np.asarray(self.decision_ms) if self.decision_ms else np.zeros(1)
        return status_pb2.SolverStatistics(
            configured_solver=self.requested_solver, decisions=len(self.decision_ms),
            decision_ms_p50=float(np.percentile(ms, 50)), decision_ms_p95=float(np.percentile(ms, 95)),
            decision_ms_p99=float(np.percentile(ms, 99)), decision_ms_max=float(ms.max()),
            fallbacks=self.fallbacks, solves_by_backend=self.solves_by_backend,
            last_fallback_reason=self.last_fallback_reason)

    def watch(self, after_revision: int, task_id: str, is_active: Callable[[], bool]
              ) -> Iterator[tasks_pb2.PlacementUpdate]:
        """Placement updates with revision > ``after_revision`` (retained ones first), then
        new ones as they happen, until ``is_active()`` turns false or the engine closes."""
        last = after_revision
        while is_active() and not self.closed:
            with self.lock:
                pending = [u for u in self.updates if u.revision > last]
                if not pending:
                    self.changed.wait(timeout=0.5)
                    continue
            for update in pending:
                last = update.revision
                if task_id:
                    mine = [p for p in update.placements if p.task_id == task_id]
                    if not mine:
                        continue
                    update = tasks_pb2.PlacementUpdate(revision=update.revision, time=update.time,
                                                       cause=update.cause, placements=mine)
                yield update

    def close(self) -> None:
        """Snapshot, stop watchers, close the allocator and the state file."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.changed.notify_all()
            try:
                self.store.write_snapshot(self.core.to_dict())
            finally:
                self.store.close()
                self.allocator.close()
                if self._record is not None:
                    self._record.close()


def _request_key(event: Event) -> str | None:
    """The journal's idempotency key of an event with a ``request_id``: submissions use it
    as given, run reports in their own ``run:`` namespace (so ids of different kinds never
    answer each other)."""
    if isinstance(event, SubmitEvent) and event.request_id:
        return event.request_id
    if isinstance(event, TaskRunEvent) and event.request_id:
        return f"run:{event.request_id}"
    if isinstance(event, ProgressEvent) and event.request_id:
        return f"progress:{event.request_id}"
    return None


def clock_now() -> float:
    """Wall-clock time [s since epoch] for requests that carry no time (service layer only)."""
    return time.time()


"""gRPC servicers: the edge between the wire and the application (docs/architecture.md, "Layers").

Requests become events (:mod:`offcut.daemon.edge.protocol`) before the engine is called, and the
engine's replies (copies in :mod:`offcut.daemon.app.replies` types) become messages after it
returned, so no conversion runs under the engine's lock. Application errors become gRPC
statuses here. No decisions are made here.

The server is ``grpc.aio``'s (:mod:`offcut.daemon.edge.server`): the unary handlers are plain
functions, run on worker threads (:mod:`offcut.daemon.edge.workers`; :func:`_rpc`); the server
streams are coroutines on the event loop that write with ``context.write`` and hold no thread
while they wait (:func:`_rpc_stream`); a blocking step of theirs goes to the loop's executor."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
from concurrent.futures import Executor

import grpc
from grpc.aio import AbortError

from offcut.errors import InvalidArgument, NotFound, OffcutError, PermissionDenied
from offcut.daemon.edge.auth import LOCAL_ADMIN, USER, Authenticator, Principal
from offcut.daemon.edge import protocol
from offcut.wire import tasks as tasks_wire
from offcut.daemon.app.engine import Engine, clock_now
from offcut.daemon.app.model import task_number
from offcut.daemon.edge.event_times import EventTimes
from offcut.daemon.edge.handlers import MessageRefused
from offcut.daemon.app.replies import Reply
from offcut.daemon.edge.streams import PlacementFeed, StreamSlots
from offcut.daemon.zeus.registry import ZeusRegistry
from offcut.v1 import (decision_pb2, nodes_pb2_grpc, status_pb2, status_pb2_grpc, tasks_pb2,
                       tasks_pb2_grpc)

log = logging.getLogger("offcut.daemon")

#: open streams without a configured bound (tests that build servicers directly)
DEFAULT_MAX_STREAMS = 4096

#: longest status message sent, characters: messages quote request values, and gRPC clients
#: refuse trailing metadata over 8 KiB (the caller would see RESOURCE_EXHAUSTED instead)
MAX_STATUS_MESSAGE = 1000


def status_message(exc: OffcutError) -> str:
    """``str(exc)``, cut to :data:`MAX_STATUS_MESSAGE` characters (the field name leads it)."""
    text = str(exc)
    if len(text) > MAX_STATUS_MESSAGE:
        text = text[:MAX_STATUS_MESSAGE - 30] + f"... ({len(text)} characters)"
    return text


@contextlib.contextmanager
def _abort_on_error(name: str, context):
    """Turn an :class:`OffcutError` into its gRPC status; anything else is INTERNAL and
    logged (a bug: keep serving, say so without leaking internals). ``context`` is a plain
    handler's (its ``abort`` raises at once); a call already aborted stays so."""
    try:
        yield
    except AbortError:
        raise
    except OffcutError as exc:
        context.abort(grpc.StatusCode[exc.status], status_message(exc))
    except Exception:
        log.exception("%s failed", name)
        context.abort(grpc.StatusCode.INTERNAL, f"{name} failed; see the daemon log")


def _rpc(method):
    """A unary handler (a plain function, run on a worker thread): :class:`OffcutError` ->
    its gRPC status; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        with _abort_on_error(method.__name__, context):
            return method(self, request, context)

    return wrapper


def _rpc_stream(method):
    """A handler that is a coroutine on the event loop: a server stream that sends with
    ``await context.write(message)``, or a unary call that returns its reply (``_rpc_async``:
    the Zeus round trip, docs/architecture.md, "Threads"). An error ends the call with the matching
    status (:func:`_rpc`'s mapping); stream entries already sent stay sent. A cancelled call
    raises ``asyncio.CancelledError`` where the coroutine waits, so its ``finally`` blocks run
    at once."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except (AbortError, MessageRefused):  # a refused message: the guard answers it
            raise
        except OffcutError as exc:
            await context.abort(grpc.StatusCode[exc.status], status_message(exc))
        except Exception:
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"{method.__name__} failed; see the daemon log")

    return wrapper


#: a unary handler served as a coroutine on the event loop (see :func:`_rpc_stream`)
_rpc_async = _rpc_stream

#: journal kinds whose stored reply answers about one task (shown as the entry's ``task``)
_ONE_TASK_KINDS = ("submit", "cancel", "run", "energy")


def history_entry(row_id: int, kind: str, stored: bytes) -> status_pb2.HistoryEntry:
    """A journal row as an ``offcut.v1.HistoryEntry``: its decision, and for a submission,
    cancellation or run report the ``task`` it answered (as it was answered then)."""
    reply = Reply.from_record(stored)
    entry = status_pb2.HistoryEntry(revision=row_id, kind=kind,
                                    decision=tasks_wire.decision_to_pb(reply.decision))
    if kind in _ONE_TASK_KINDS and reply.tasks:
        entry.task.CopyFrom(tasks_wire.task_to_pb(reply.tasks[0]))
    return entry


#: journal rows read and converted per step of ``ExportHistory`` (on the loop's executor)
HISTORY_BATCH = 256


class _HistoryBatches:
    """The journal rows of an export, read and converted in batches on the loop's executor
    threads (a lock keeps a batch and the closing from overlapping: a cancelled export
    closes its reader while a batch may still run)."""

    def __init__(self, rows):
        self._rows = rows
        self._lock = threading.Lock()

    def next(self, n: int) -> tuple[list[status_pb2.HistoryEntry], Exception | None]:
        """Up to ``n`` more entries (none: the export is complete), and the error that
        stopped the batch early (a row that cannot be read or converted), to be raised after
        the entries before it were sent."""
        entries: list[status_pb2.HistoryEntry] = []
        with self._lock:
            try:
                for row_id, kind, stored in itertools.islice(self._rows, n):
                    entries.append(history_entry(row_id, kind, stored))
            except Exception as exc:  # noqa: BLE001 - raised by the stream after the entries
                return entries, exc
        return entries, None

    def close(self) -> None:
        """Close the reader (its read-only connection)."""
        with self._lock:
            self._rows.close()


class NodeEventsService(nodes_pb2_grpc.NodeEventsServicer):
    """``offcut.v1.NodeEvents``: idle / preempt reports and idle-set snapshots, applied at
    the daemon's receive time on a live daemon (``times``; the sender's ``time`` is data).

    Args:
        engine, auth, times: as the other servicers'.
        streams: the bounds on open streams (``StreamNodes`` counts against them).
        executor: where ``StreamNodes`` applies its events (the node events' reserved threads,
            :mod:`offcut.daemon.edge.workers`; None: the event loop's default executor).
    """

    def __init__(self, engine: Engine, auth: Authenticator | None = None,
                 times: EventTimes | None = None, streams: StreamSlots | None = None,
                 executor: Executor | None = None):
        self.engine = engine
        self.auth = auth or Authenticator(None)
        self.times = times or EventTimes()
        self.streams = streams or StreamSlots(DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS)
        self.executor = executor

    def _apply(self, request, who: Principal, snapshot: bool) -> decision_pb2.Decision:
        """Convert, time (``times``) and apply one node event of ``who``; its Decision."""
        now = clock_now()
        event = protocol.node_event_from_pb(request, now, snapshot=snapshot)
        event, stamp = self.times.place(event, now, who)
        reply = self.engine.apply(event, stamp=stamp)
        return tasks_wire.decision_to_pb(reply.decision, reply.duplicate)

    @_rpc
    def ReportNodes(self, request, context):
        """Idle / preempted nodes -> Decision (INVALID_ARGUMENT, FAILED_PRECONDITION on bad events)."""
        return self._apply(request, self.auth.of(context), snapshot=False)

    @_rpc
    def SyncNodes(self, request, context):
        """The full idle set -> diffed into joins and preemptions -> Decision."""
        return self._apply(request, self.auth.of(context), snapshot=True)

    @_rpc_stream
    async def StreamNodes(self, request_iterator, context):
        """Node events in the order received, each applied as :meth:`ReportNodes` applies it
        (on ``executor``, one at a time) and answered by its Decision before the next is read.
        An event refused (its status as ReportNodes'), or a message over 1 MiB
        (RESOURCE_EXHAUSTED) or unparsable (INVALID_ARGUMENT), ends the stream; the events
        before it stay applied and answered. RESOURCE_EXHAUSTED at once when the caller, or
        the daemon, has as many streams open as allowed (``max_streams_per_caller``,
        ``max_streams``). Per message it costs the daemon about half a unary call's gRPC
        work (docs/architecture.md, "Threads")."""
        who = self.auth.of(context)
        key = self.streams.acquire(who.user if self.auth.enabled else None, "StreamNodes")
        loop = asyncio.get_running_loop()
        try:
            async for request in request_iterator:
                decision = await loop.run_in_executor(self.executor, self._apply, request, who,
                                                      False)
                await context.write(decision)
        finally:  # also when cancelled (the sender went away): the slot comes back at once
            self.streams.release(key)


#: ListTasks' page size when the request gives none, and the largest it may ask for (a page
#: of 10,000 tasks with 100-point curves stays far below the 4 MiB a client accepts by default)
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 1000, 10_000


def _page_after(token: str) -> int:
    """The submit number a ListTasks page starts after: ``token`` is the previous page's
    ``next_page_token`` (the last task id it answered; empty: the start). Raises
    InvalidArgument naming ``page_token`` for anything else."""
    if not token:
        return 0
    number = task_number(token)
    if len(token) > 32 or not token.startswith("t") or number <= 0:
        raise InvalidArgument("is not a next_page_token of ListTasks", "page_token")
    return number


def _visible(engine: Engine, who: Principal, task_id: str) -> bool:
    """Whether ``who`` may see task ``task_id`` (admin and slurm: all; users: their own)."""
    return who.sees_all_tasks or engine.owner_of(task_id) == who.user


def _decision_for(engine: Engine, who: Principal, reply: Reply) -> decision_pb2.Decision:
    """The reply's decision as ``who`` may see it: a user's without other users' placements,
    completions and warnings."""
    decision = reply.decision
    if not who.sees_all_tasks:
        decision = dataclasses.replace(
            decision,
            placements=[p for p in decision.placements if _visible(engine, who, p.task_id)],
            completed_task_ids=[t for t in decision.completed_task_ids
                                if _visible(engine, who, t)],
            warnings=[w for w in decision.warnings if _visible(engine, who, w.task_id)])
    return tasks_wire.decision_to_pb(decision, reply.duplicate)


def _caller(who: Principal) -> dict:
    """The engine's idempotency namespace of ``who``'s request ids (docs/security.md)."""
    return {"caller": who.user}


class TasksService(tasks_pb2_grpc.TasksServicer):
    """``offcut.v1.Tasks``: submit, get, list, cancel, watch placements. With tokens, users
    see and act on their own tasks only (another user's task is NOT_FOUND); admin and slurm
    see all (which role may call which method: ``auth.METHOD_ROLES``, docs/architecture.md,
    "Security")."""

    def __init__(self, engine: Engine, auth: Authenticator | None = None,
                 streams: StreamSlots | None = None, times: EventTimes | None = None,
                 zeus: ZeusRegistry | None = None):
        self.engine = engine
        self.auth = auth or Authenticator(None)
        self.streams = streams or StreamSlots(DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS)
        self.times = times or EventTimes()
        self.zeus = zeus

    def _check_zeus_job(self, job_id: str, owner: str) -> None:
        """NOT_FOUND naming ``spec.zeus_job_id`` unless the Zeus job exists and (with tokens)
        the task's ``owner`` may act on it: a task's runs use its job as their owner
        (docs/security.md). Without a registry (servicers built alone) nothing is checked."""
        if not job_id or self.zeus is None:
            return
        runner = Principal(owner, USER) if self.auth.enabled else LOCAL_ADMIN
        try:
            self.zeus.job(job_id, runner)
        except NotFound:
            raise NotFound(f"no Zeus job {job_id!r} of {owner!r} (register it first: offcut "
                           "recur, or BatchSizeOptimizer.RegisterJob)", "spec.zeus_job_id") from None

    @_rpc
    def SubmitTask(self, request, context):
        """Validate the spec (INVALID_ARGUMENT naming ``spec.<field>``), queue the task, re-allocate.
        A user submits as themselves (another ``owner`` is PERMISSION_DENIED); a
        ``spec.zeus_job_id`` must name a Zeus job the task's owner may act on (NOT_FOUND). A
        user's submission over ``max_active_tasks_per_owner`` is RESOURCE_EXHAUSTED (admins
        are not capped; docs/security.md)."""
        who = self.auth.of(context)
        owner = request.owner
        if self.auth.enabled and owner != who.user:
            if owner and not who.is_admin:
                raise PermissionDenied(f"users submit as themselves ({who.user!r})", "owner")
            owner = owner or who.user
        now = clock_now()
        event = protocol.submit_from_pb(request, now, self.engine.limits)
        if owner and owner != event.owner:
            event = dataclasses.replace(event, owner=owner)
        self._check_zeus_job(event.spec.zeus_job_id, event.owner)
        event, stamp = self.times.place(event, now, who)
        reply = self.engine.apply(event, stamp=stamp, capped=not who.is_admin, **_caller(who))
        if reply.tasks[0].owner != who.user and not who.is_admin:  # someone else's request id
            raise PermissionDenied("belongs to another user's submission", "request_id")
        return tasks_pb2.SubmitTaskResponse(task=tasks_wire.task_to_pb(reply.tasks[0]),
                                            decision=_decision_for(self.engine, who, reply))

    @_rpc
    def GetTask(self, request, context):
        """One task (NOT_FOUND for an unknown id)."""
        if not request.task_id:
            raise InvalidArgument("is required", "task_id")
        who = self.auth.of(context)
        if not _visible(self.engine, who, request.task_id):
            raise NotFound(f"no task {request.task_id!r}", "task_id")
        return tasks_wire.task_to_pb(self.engine.task(request.task_id))

    @_rpc
    def ListTasks(self, request, context):
        """Tasks filtered by state and owner, in submit order (a user: their own only)."""
        who = self.auth.of(context)
        owner = request.owner
        if not who.sees_all_tasks:
            if owner and owner != who.user:
                raise PermissionDenied("users list their own tasks only", "owner")
            owner = who.user
        wanted = set()
        for s in request.states:
            if s not in tasks_wire.STATE_FROM_PB:
                raise InvalidArgument(f"unknown state {s}", "states")
            wanted.add(tasks_wire.STATE_FROM_PB[s])
        after = _page_after(request.page_token)
        size = request.page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"at most {MAX_PAGE_SIZE}, got {size}", "page_size")
        views, more = self.engine.tasks(wanted, owner, after=after, limit=size)
        return tasks_pb2.ListTasksResponse(
            tasks=[tasks_wire.task_to_pb(t) for t in views],
            next_page_token=views[-1].task_id if more else "")

    def _apply_for_own_task(self, request, context, from_pb):
        """Apply the event ``from_pb(request, now)`` of a request about one task
        (``request.task_id``), which the caller must see (NOT_FOUND naming ``task_id``
        otherwise, before anything is applied); returns ``(caller, reply)``."""
        who = self.auth.of(context)
        if request.task_id and not _visible(self.engine, who, request.task_id):
            raise NotFound(f"no task {request.task_id!r}", "task_id")
        now = clock_now()
        event, stamp = self.times.place(from_pb(request, now), now, who)
        return who, self.engine.apply(event, stamp=stamp, **_caller(who))

    @_rpc
    def CancelTask(self, request, context):
        """Cancel a task, release its nodes, re-allocate (NOT_FOUND / FAILED_PRECONDITION); a
        repeated ``request_id`` of the same caller gets the stored reply."""
        who, reply = self._apply_for_own_task(request, context, protocol.cancel_from_pb)
        return tasks_pb2.CancelTaskResponse(task=tasks_wire.task_to_pb(reply.tasks[0]),
                                            decision=_decision_for(self.engine, who, reply))

    @_rpc
    def ReportTaskRun(self, request, context):
        """A launcher's run report: started / preempted are recorded, finished completes the
        task, failed fails it (both re-allocate). NOT_FOUND for an unknown task,
        FAILED_PRECONDITION for a finished one; a repeated ``request_id`` gets the stored reply."""
        who = self.auth.of(context)
        now = clock_now()
        event, stamp = self.times.place(protocol.task_run_from_pb(request, now), now, who)
        reply = self.engine.apply(event, stamp=stamp, **_caller(who))
        return tasks_pb2.ReportTaskRunResponse(task=tasks_wire.task_to_pb(reply.tasks[0]),
                                               decision=tasks_wire.decision_to_pb(
                                                   reply.decision, reply.duplicate))

    @_rpc
    def ReportProgress(self, request, context):
        """Progress reports of running tasks (from the training side, a launcher or a replay):
        applied together; each replaces the task's progress and feeds its learned model; a
        report reaching the task's total work completes it. A user may report their own tasks
        only (another user's task is NOT_FOUND); INVALID_ARGUMENT / FAILED_PRECONDITION name
        ``reports[i].<field>``; a repeated ``request_id`` gets the stored reply."""
        who = self.auth.of(context)
        now = clock_now()
        event = protocol.progress_from_pb(request, now)
        for i, r in enumerate(event.reports):
            if not _visible(self.engine, who, r.task_id):
                raise NotFound(f"no task {r.task_id!r}", f"reports[{i}].task_id")
        event, stamp = self.times.place(event, now, who)
        reply = self.engine.apply(event, stamp=stamp, **_caller(who))
        return tasks_pb2.ReportProgressResponse(
            decision=_decision_for(self.engine, who, reply),
            tasks=[tasks_wire.task_to_pb(t) for t in reply.tasks])

    @_rpc
    def ReportEnergy(self, request, context):
        """What one process's GPUs drew in its generation (docs/execution.md, "Energy"): the
        largest figure per (generation, rank) counts, summed per generation and task. A user
        may report their own tasks only (another user's task is NOT_FOUND); INVALID_ARGUMENT
        names ``joules``, ``generation`` or ``rank`` out of bounds, FAILED_PRECONDITION a
        generation after the current one or no longer kept; a repeated ``request_id`` gets the
        stored reply."""
        who, reply = self._apply_for_own_task(request, context, protocol.energy_from_pb)
        return tasks_pb2.ReportEnergyResponse(task=tasks_wire.task_to_pb(reply.tasks[0]),
                                              decision=_decision_for(self.engine, who, reply))

    @_rpc_stream
    async def WatchPlacements(self, request, context):
        """Stream placement updates (retained ones after ``after_revision`` first); a user sees
        changes of their own tasks only. RESOURCE_EXHAUSTED when the caller, or the daemon,
        has as many streams open as allowed (``max_streams_per_caller``, ``max_streams``).
        Runs on the event loop: it waits on its :class:`PlacementFeed` subscription (no
        thread, no polling; woken only by updates it may see); the engine's lock, which a
        solve may hold, is taken on the loop's executor only."""
        who = self.auth.of(context)
        if request.task_id:
            owner = await asyncio.to_thread(self.engine.owner_of, request.task_id)
            if owner is None or not (who.sees_all_tasks or owner == who.user):
                raise NotFound(f"no task {request.task_id!r}", "task_id")
        caller = who.user if self.auth.enabled else None  # without tokens: one caller, all
        feed = self.placement_feed()
        key = self.streams.acquire(caller, "WatchPlacements")
        sub = feed.subscribe(None if who.sees_all_tasks else who.user, request.task_id)
        try:
            last = request.after_revision
            while not (feed.closed or self.engine.closed):
                sub.event.clear()  # before reading: no update slips in between
                for update in self.engine.updates_after(last, request.task_id):
                    last = update.revision
                    if not who.sees_all_tasks:
                        mine = [p for p in update.placements
                                if update.owners.get(p.task_id) == who.user]
                        noted = [w for w in update.warnings
                                 if update.owners.get(w.task_id) == who.user]
                        if not (mine or noted):
                            continue
                        update = dataclasses.replace(update, placements=mine, warnings=noted)
                    await context.write(tasks_wire.update_to_pb(update))
                await sub.event.wait()
        finally:  # also when cancelled (the client went away): the slot comes back at once
            feed.unsubscribe(sub)
            self.streams.release(key)

    def placement_feed(self) -> PlacementFeed:
        """The engine's placement updates as news on the running event loop (made at the
        first watch)."""
        feed = getattr(self, "_feed", None)
        if feed is None:
            feed = self._feed = PlacementFeed(self.engine, asyncio.get_running_loop())
        return feed

    def end_watches(self) -> None:
        """End every open ``WatchPlacements`` (status OK; on the event loop): the daemon
        stops."""
        feed = getattr(self, "_feed", None)
        if feed is not None:
            feed.close()


class StatusService(status_pb2_grpc.StatusServicer):
    """``offcut.v1.Status``: idle pool, tasks, last decision, solver statistics; the export
    of the journal (``ExportHistory``)."""

    def __init__(self, engine: Engine, auth: Authenticator | None = None,
                 times: EventTimes | None = None):
        self.engine = engine
        self.auth = auth or Authenticator(None)
        self.times = times or EventTimes()

    @_rpc
    def GetStatus(self, request: status_pb2.GetStatusRequest, context):
        """Idle pool, tasks by state, last decision, solver statistics. A user gets the
        aggregate figures only (no node names, last decision or event sources); admin and
        slurm get all."""
        who = self.auth.of(context)
        reply = tasks_wire.status_to_pb(
            self.engine.status(request.include_idle_nodes and who.sees_all_tasks))
        reply.clock_mode = self.times.mode
        if not who.sees_all_tasks:
            reply.ClearField("last_decision")
            reply.last_seq.clear()
        return reply

    @_rpc_stream
    async def ExportHistory(self, request: status_pb2.ExportHistoryRequest, context):
        """Stream the journal after ``after_revision`` (at most ``limit`` entries, 0 = all),
        oldest first, up to the revision current when the call began. Journal row ids equal
        revisions (``Store.journal``), so this pages by row id; rows are read in chunks on a
        read-only connection, without the engine's lock, and converted in batches of
        :data:`HISTORY_BATCH` on the event loop's executor (never on the loop, never on a
        worker of the unary calls)."""
        after = min(request.after_revision, 2**63 - 1)  # SQLite integers are signed 64-bit
        loop = asyncio.get_running_loop()
        batches = _HistoryBatches(self.engine.store.journal(after_id=after,
                                                            limit=request.limit or None))
        try:
            while True:
                entries, error = await loop.run_in_executor(None, batches.next, HISTORY_BATCH)
                for entry in entries:
                    await context.write(entry)
                if error is not None:
                    raise error
                if not entries:
                    return
        finally:  # (a batch may still run when cancelled: the closing waits for it there)
            loop.run_in_executor(None, batches.close)

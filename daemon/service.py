"""gRPC servicers: the edge between the wire and the application (docs/architecture.md §2).

Requests become events (:mod:`offcut.daemon.protocol`) before the engine is called, and the
engine's replies (copies in :mod:`offcut.daemon.replies` types) become messages after it
returned, so no conversion runs under the engine's lock. Application errors become gRPC
statuses here. No decisions are made here."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging

import grpc

from offcut.errors import InvalidArgument, NotFound, OffcutError, PermissionDenied
from offcut.daemon.auth import LOCAL_ADMIN, USER, Authenticator, Principal
from offcut.daemon import protocol
from offcut.daemon.engine import Engine, clock_now
from offcut.daemon.event_times import EventTimes
from offcut.daemon.replies import Reply
from offcut.daemon.streams import StreamSlots
from offcut.daemon.zeus.registry import ZeusRegistry
from offcut.v1 import (decision_pb2, nodes_pb2_grpc, status_pb2, status_pb2_grpc, tasks_pb2,
                       tasks_pb2_grpc)

log = logging.getLogger("offcut.daemon")

#: open streams without a configured bound (tests that build servicers directly)
DEFAULT_MAX_STREAMS = 16

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
    logged (a bug: keep serving, say so without leaking internals)."""
    try:
        yield
    except OffcutError as exc:
        context.abort(grpc.StatusCode[exc.status], status_message(exc))
    except Exception:
        log.exception("%s failed", name)
        context.abort(grpc.StatusCode.INTERNAL, f"{name} failed; see the daemon log")


def _rpc(method):
    """Map :class:`OffcutError` to its gRPC status; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        with _abort_on_error(method.__name__, context):
            return method(self, request, context)

    return wrapper


def _rpc_stream(method):
    """:func:`_rpc` for server-streaming methods (generators): an error while producing the
    stream ends it with the matching status; entries already sent stay sent."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        with _abort_on_error(method.__name__, context):
            yield from method(self, request, context)

    return wrapper


class _Undecodable:
    """A request whose bytes are not a valid message of the method's type."""

    def __init__(self, type_name: str, error: Exception):
        self.type_name = type_name
        self.error = error

    def abort(self, context):
        """Answer INVALID_ARGUMENT naming the request."""
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"request: not a valid {self.type_name} message "
                      f"({str(self.error)[:200] or type(self.error).__name__})")


class DecodeGuardInterceptor(grpc.ServerInterceptor):
    """Answers requests that cannot be parsed (truncated or invalid bytes, invalid UTF-8 in a
    string field) with INVALID_ARGUMENT naming the request type, where gRPC Python would answer
    INTERNAL ("Exception deserializing request!"). Goes last among the interceptors, so the
    others (metrics, authentication) see and count such calls like any other."""

    def __init__(self) -> None:
        #: method -> (its handler, that handler guarded): gRPC hands out the same handler
        #: object for a registered method on every call, so each is wrapped once, not per call
        #: (interceptors run on the server's serving thread, before a worker takes the call)
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(self, continuation, handler_call_details):
        """The method's handler with its request deserializer and behaviour wrapped (unary
        requests; client-streaming handlers, none in offcut.v1, pass unchanged)."""
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._guarded[method] = (handler, _guarded(handler, method))
        return cached[1]


def _guarded(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` (unary request) whose undecodable requests are answered INVALID_ARGUMENT."""
    decode = handler.request_deserializer
    owner = getattr(decode, "__self__", None)
    type_name = getattr(getattr(owner, "DESCRIPTOR", None), "full_name", method)

    def safe_decode(data: bytes):
        try:
            return decode(data)
        except Exception as exc:  # DecodeError, or a deserializer's own failure
            return _Undecodable(type_name, exc)

    def unary(behavior):
        def wrapper(request, context):
            if isinstance(request, _Undecodable):
                request.abort(context)
            return behavior(request, context)
        return wrapper

    def stream(behavior):
        def wrapper(request, context):
            if isinstance(request, _Undecodable):
                request.abort(context)
            yield from behavior(request, context)
        return wrapper

    kw = dict(request_deserializer=safe_decode, response_serializer=handler.response_serializer)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kw)
    return grpc.unary_stream_rpc_method_handler(stream(handler.unary_stream), **kw)


#: journal kinds whose stored reply answers about one task (shown as the entry's ``task``)
_ONE_TASK_KINDS = ("submit", "cancel", "run")


def history_entry(row_id: int, kind: str, stored: bytes) -> status_pb2.HistoryEntry:
    """A journal row as an ``offcut.v1.HistoryEntry``: its decision, and for a submission,
    cancellation or run report the ``task`` it answered (as it was answered then)."""
    reply = Reply.from_record(stored)
    entry = status_pb2.HistoryEntry(revision=row_id, kind=kind,
                                    decision=protocol.decision_to_pb(reply.decision))
    if kind in _ONE_TASK_KINDS and reply.tasks:
        entry.task.CopyFrom(protocol.task_to_pb(reply.tasks[0]))
    return entry


class NodeEventsService(nodes_pb2_grpc.NodeEventsServicer):
    """``offcut.v1.NodeEvents``: idle / preempt reports and idle-set snapshots, applied at
    the daemon's receive time on a live daemon (``times``; the sender's ``time`` is data)."""

    def __init__(self, engine: Engine, auth: Authenticator | None = None,
                 times: EventTimes | None = None):
        self.engine = engine
        self.auth = auth or Authenticator(None)
        self.times = times or EventTimes()

    def _apply(self, request, context, snapshot: bool) -> decision_pb2.Decision:
        now = clock_now()
        event = protocol.node_event_from_pb(request, now, snapshot=snapshot)
        event, stamp = self.times.place(event, now, self.auth.of(context))
        reply = self.engine.apply(event, stamp=stamp)
        return protocol.decision_to_pb(reply.decision, reply.duplicate)

    @_rpc
    def ReportNodes(self, request, context):
        """Idle / preempted nodes -> Decision (INVALID_ARGUMENT, FAILED_PRECONDITION on bad events)."""
        return self._apply(request, context, snapshot=False)

    @_rpc
    def SyncNodes(self, request, context):
        """The full idle set -> diffed into joins and preemptions -> Decision."""
        return self._apply(request, context, snapshot=True)


def _visible(engine: Engine, who: Principal, task_id: str) -> bool:
    """Whether ``who`` may see task ``task_id`` (admin and slurm: all; users: their own)."""
    return who.sees_all_tasks or engine.owner_of(task_id) == who.user


def _decision_for(engine: Engine, who: Principal, reply: Reply) -> decision_pb2.Decision:
    """The reply's decision as ``who`` may see it: a user's without other users' placements
    and completions."""
    decision = reply.decision
    if not who.sees_all_tasks:
        decision = dataclasses.replace(
            decision,
            placements=[p for p in decision.placements if _visible(engine, who, p.task_id)],
            completed_task_ids=[t for t in decision.completed_task_ids
                                if _visible(engine, who, t)])
    return protocol.decision_to_pb(decision, reply.duplicate)


def _caller(who: Principal) -> dict:
    """The engine's idempotency namespace of ``who``'s request ids (docs/security.md)."""
    return {"caller": who.user, "sees_all": who.sees_all_tasks}


class TasksService(tasks_pb2_grpc.TasksServicer):
    """``offcut.v1.Tasks``: submit, get, list, cancel, watch placements. With tokens, users
    see and act on their own tasks only (another user's task is NOT_FOUND); admin and slurm
    see all (which role may call which method: ``auth.METHOD_ROLES``, docs/architecture.md
    §8)."""

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
        ``spec.zeus_job_id`` must name a Zeus job the task's owner may act on (NOT_FOUND)."""
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
        reply = self.engine.apply(event, stamp=stamp, **_caller(who))
        if reply.tasks[0].owner != who.user and not who.is_admin:  # someone else's request id
            raise PermissionDenied("belongs to another user's submission", "request_id")
        return tasks_pb2.SubmitTaskResponse(task=protocol.task_to_pb(reply.tasks[0]),
                                            decision=_decision_for(self.engine, who, reply))

    @_rpc
    def GetTask(self, request, context):
        """One task (NOT_FOUND for an unknown id)."""
        if not request.task_id:
            raise InvalidArgument("is required", "task_id")
        who = self.auth.of(context)
        if not _visible(self.engine, who, request.task_id):
            raise NotFound(f"no task {request.task_id!r}", "task_id")
        return protocol.task_to_pb(self.engine.task(request.task_id))

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
            if s not in protocol.PB_TO_STATE:
                raise InvalidArgument(f"unknown state {s}", "states")
            wanted.add(protocol.PB_TO_STATE[s])
        views = self.engine.tasks(wanted, owner)
        return tasks_pb2.ListTasksResponse(tasks=[protocol.task_to_pb(t) for t in views])

    @_rpc
    def CancelTask(self, request, context):
        """Cancel a task, release its nodes, re-allocate (NOT_FOUND / FAILED_PRECONDITION)."""
        who = self.auth.of(context)
        if request.task_id and not _visible(self.engine, who, request.task_id):
            raise NotFound(f"no task {request.task_id!r}", "task_id")
        now = clock_now()
        event, stamp = self.times.place(protocol.cancel_from_pb(request, now), now, who)
        reply = self.engine.apply(event, stamp=stamp)
        return tasks_pb2.CancelTaskResponse(task=protocol.task_to_pb(reply.tasks[0]),
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
        return tasks_pb2.ReportTaskRunResponse(task=protocol.task_to_pb(reply.tasks[0]),
                                               decision=protocol.decision_to_pb(
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
            tasks=[protocol.task_to_pb(t) for t in reply.tasks])

    @_rpc_stream
    def WatchPlacements(self, request, context):
        """Stream placement updates (retained ones after ``after_revision`` first); a user sees
        changes of their own tasks only. RESOURCE_EXHAUSTED when the caller, or the daemon,
        has as many streams open as allowed (``max_streams_per_caller``, ``max_streams``)."""
        who = self.auth.of(context)
        if request.task_id and not (self.engine.owner_of(request.task_id) is not None
                                    and _visible(self.engine, who, request.task_id)):
            raise NotFound(f"no task {request.task_id!r}", "task_id")
        context.add_callback(self.engine.wake)  # a cancelled stream frees its slot at once
        caller = who.user if self.auth.enabled else None  # without tokens: one caller, all
        with self.streams.hold(caller, "WatchPlacements"):
            for update in self.engine.watch(request.after_revision, request.task_id,
                                            context.is_active):
                if not who.sees_all_tasks:
                    mine = [p for p in update.placements if _visible(self.engine, who, p.task_id)]
                    if not mine:
                        continue
                    update = dataclasses.replace(update, placements=mine)
                yield protocol.update_to_pb(update)


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
        reply = protocol.status_to_pb(
            self.engine.status(request.include_idle_nodes and who.sees_all_tasks))
        reply.clock_mode = self.times.mode
        if not who.sees_all_tasks:
            reply.ClearField("last_decision")
            reply.last_seq.clear()
        return reply

    @_rpc_stream
    def ExportHistory(self, request: status_pb2.ExportHistoryRequest, context):
        """Stream the journal after ``after_revision`` (at most ``limit`` entries, 0 = all),
        oldest first, up to the revision current when the call began. Journal row ids equal
        revisions (``Store.journal``), so this pages by row id; rows are read in chunks on a
        read-only connection, without the engine's lock."""
        after = min(request.after_revision, 2**63 - 1)  # SQLite integers are signed 64-bit
        rows = self.engine.store.journal(after_id=after, limit=request.limit or None)
        try:
            for row_id, kind, stored in rows:
                if not context.is_active():
                    return
                yield history_entry(row_id, kind, stored)
        finally:
            rows.close()

"""gRPC servicers: proto <-> domain, errors -> status codes. No decisions are made here."""

from __future__ import annotations

import contextlib
import functools
import logging

import grpc

from offcut.errors import InvalidArgument, NotFound, OffcutError, PermissionDenied
from offcut.daemon.auth import LOCAL_ADMIN, Authenticator, Principal
from offcut.daemon import protocol
from offcut.daemon.engine import Engine, clock_now
from offcut.v1 import (decision_pb2, nodes_pb2_grpc, status_pb2, status_pb2_grpc, tasks_pb2,
                       tasks_pb2_grpc)

log = logging.getLogger("offcut.daemon")

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
        context.abort(exc.code, status_message(exc))
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


def _decision(stored: bytes) -> decision_pb2.Decision:
    return decision_pb2.Decision.FromString(stored)


#: journal kind -> type of the stored reply (node events store the Decision itself)
_STORED_REPLY = {"submit": tasks_pb2.SubmitTaskResponse, "cancel": tasks_pb2.CancelTaskResponse,
                 "run": tasks_pb2.ReportTaskRunResponse,
                 "progress": tasks_pb2.ReportProgressResponse}


def history_entry(row_id: int, kind: str, stored: bytes) -> status_pb2.HistoryEntry:
    """A journal row as an ``offcut.v1.HistoryEntry``: its decision (the stored reply, or the
    ``decision`` of a stored SubmitTask/CancelTask reply, with the ``task`` it answered). A row
    of a kind not listed here is sent with its revision and kind only."""
    if kind in ("nodes", "snapshot"):
        return status_pb2.HistoryEntry(revision=row_id, kind=kind, decision=_decision(stored))
    reply_type = _STORED_REPLY.get(kind)
    if reply_type is None:
        return status_pb2.HistoryEntry(revision=row_id, kind=kind)
    reply = reply_type.FromString(stored)
    return status_pb2.HistoryEntry(revision=row_id, kind=kind, decision=reply.decision,
                                   task=reply.task)


class NodeEventsService(nodes_pb2_grpc.NodeEventsServicer):
    """``offcut.v1.NodeEvents``: idle / preempt reports and idle-set snapshots."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def _apply(self, event):
        reply, duplicate = self.engine.apply(
            event, build=lambda out, decision: decision, parse=_decision)
        if duplicate:
            reply.duplicate = True
        return reply

    @_rpc
    def ReportNodes(self, request, context):
        """Idle / preempted nodes -> Decision (INVALID_ARGUMENT, FAILED_PRECONDITION on bad events)."""
        return self._apply(protocol.node_event_from_pb(request, snapshot=False))

    @_rpc
    def SyncNodes(self, request, context):
        """The full idle set -> diffed into joins and preemptions -> Decision."""
        return self._apply(protocol.node_event_from_pb(request, snapshot=True))


def _visible(engine: Engine, who: Principal, task_id: str) -> bool:
    """Whether ``who`` may see task ``task_id`` (admins: all; users: their own)."""
    if who.is_admin:
        return True
    task = engine.core.tasks.get(task_id)
    return task is not None and task.owner == who.user


def _redact(engine: Engine, who: Principal, decision: decision_pb2.Decision) -> None:
    """Drop other users' placements and completions from a decision shown to a user."""
    if who.is_admin:
        return
    mine = [p for p in decision.placements if _visible(engine, who, p.task_id)]
    done = [t for t in decision.completed_task_ids if _visible(engine, who, t)]
    del decision.placements[:]
    decision.placements.extend(mine)
    del decision.completed_task_ids[:]
    decision.completed_task_ids.extend(done)


class TasksService(tasks_pb2_grpc.TasksServicer):
    """``offcut.v1.Tasks``: submit, get, list, cancel, watch placements. With tokens, users
    see and act on their own tasks only (another user's task is NOT_FOUND;
    docs/architecture.md §8)."""

    def __init__(self, engine: Engine, auth: Authenticator | None = None):
        self.engine = engine
        self.auth = auth or Authenticator(None)

    def _task_pb(self, task_id: str, who: Principal = LOCAL_ADMIN) -> tasks_pb2.Task:
        task = self.engine.core.tasks.get(task_id)
        if task is None or not _visible(self.engine, who, task_id):
            raise NotFound(f"no task {task_id!r}", "task_id")
        return protocol.task_to_pb(task, self.engine.core)

    @_rpc
    def SubmitTask(self, request, context):
        """Validate the spec (INVALID_ARGUMENT naming ``spec.<field>``), queue the task, re-allocate.
        A user submits as themselves (another ``owner`` is PERMISSION_DENIED)."""
        who = self.auth.of(context)
        if self.auth.enabled and request.owner != who.user:
            if request.owner and not who.is_admin:
                raise PermissionDenied(f"users submit as themselves ({who.user!r})", "owner")
            if not request.owner:
                request = tasks_pb2.SubmitTaskRequest.FromString(request.SerializeToString())
                request.owner = who.user
        with self.engine.lock:
            event = protocol.submit_from_pb(request, self.engine.core.clock, clock_now(),
                                            self.engine.limits)

            def build(out, decision):
                return tasks_pb2.SubmitTaskResponse(task=self._task_pb(out.task_id),
                                                    decision=decision)

            reply, duplicate = self.engine.apply(event, build, tasks_pb2.SubmitTaskResponse.FromString)
            if reply.task.owner != who.user and not who.is_admin:  # someone else's request id
                raise PermissionDenied("belongs to another user's submission", "request_id")
            _redact(self.engine, who, reply.decision)
        if duplicate:
            reply.decision.duplicate = True
        return reply

    @_rpc
    def GetTask(self, request, context):
        """One task (NOT_FOUND for an unknown id)."""
        if not request.task_id:
            raise InvalidArgument("is required", "task_id")
        who = self.auth.of(context)
        with self.engine.lock:
            return self._task_pb(request.task_id, who)

    @_rpc
    def ListTasks(self, request, context):
        """Tasks filtered by state and owner, in submit order (a user: their own only)."""
        who = self.auth.of(context)
        owner = request.owner
        if not who.is_admin:
            if owner and owner != who.user:
                raise PermissionDenied("users list their own tasks only", "owner")
            owner = who.user
        wanted = set()
        for s in request.states:
            if s not in protocol.PB_TO_STATE:
                raise InvalidArgument(f"unknown state {s}", "states")
            wanted.add(protocol.PB_TO_STATE[s])
        with self.engine.lock:
            core = self.engine.core
            tasks = [protocol.task_to_pb(t, core) for t in core.tasks.values()
                     if (not wanted or t.state in wanted)
                     and (not owner or t.owner == owner)]
        return tasks_pb2.ListTasksResponse(tasks=tasks)

    @_rpc
    def CancelTask(self, request, context):
        """Cancel a task, release its nodes, re-allocate (NOT_FOUND / FAILED_PRECONDITION)."""
        who = self.auth.of(context)
        with self.engine.lock:
            if request.task_id and not _visible(self.engine, who, request.task_id):
                raise NotFound(f"no task {request.task_id!r}", "task_id")
            event = protocol.cancel_from_pb(request, self.engine.core.clock, clock_now())

            def build(out, decision):
                return tasks_pb2.CancelTaskResponse(task=self._task_pb(out.task_id),
                                                    decision=decision)

            reply, _ = self.engine.apply(event, build, tasks_pb2.CancelTaskResponse.FromString)
            _redact(self.engine, who, reply.decision)
        return reply

    @_rpc
    def ReportTaskRun(self, request, context):
        """A launcher's run report: started / preempted are recorded, finished completes the
        task, failed fails it (both re-allocate). NOT_FOUND for an unknown task,
        FAILED_PRECONDITION for a finished one; a repeated ``request_id`` gets the stored reply."""
        with self.engine.lock:
            event = protocol.task_run_from_pb(request, self.engine.core.clock, clock_now())

            def build(out, decision):
                return tasks_pb2.ReportTaskRunResponse(task=self._task_pb(out.task_id),
                                                       decision=decision)

            reply, duplicate = self.engine.apply(event, build,
                                                 tasks_pb2.ReportTaskRunResponse.FromString)
        if duplicate:
            reply.decision.duplicate = True
        return reply

    @_rpc
    def ReportProgress(self, request, context):
        """Progress reports of running tasks (from the training side, a launcher or a replay):
        applied together; each replaces the task's progress and feeds its learned model; a
        report reaching the task's total work completes it. A user may report their own tasks
        only (another user's task is NOT_FOUND); INVALID_ARGUMENT / FAILED_PRECONDITION name
        ``reports[i].<field>``; a repeated ``request_id`` gets the stored reply."""
        who = self.auth.of(context)
        event = protocol.progress_from_pb(request, clock_now())
        with self.engine.lock:
            for i, r in enumerate(event.reports):
                if not _visible(self.engine, who, r.task_id):
                    raise NotFound(f"no task {r.task_id!r}", f"reports[{i}].task_id")

            def build(out, decision):
                return tasks_pb2.ReportProgressResponse(
                    decision=decision,
                    tasks=[self._task_pb(r.task_id) for r in event.reports])

            reply, duplicate = self.engine.apply(event, build,
                                                 tasks_pb2.ReportProgressResponse.FromString)
            _redact(self.engine, who, reply.decision)
        if duplicate:
            reply.decision.duplicate = True
        return reply

    def WatchPlacements(self, request, context):
        """Stream placement updates (retained ones after ``after_revision`` first); a user sees
        changes of their own tasks only."""
        who = self.auth.of(context)
        if request.task_id and (request.task_id not in self.engine.core.tasks
                                or not _visible(self.engine, who, request.task_id)):
            context.abort(grpc.StatusCode.NOT_FOUND,
                          status_message(NotFound(f"no task {request.task_id!r}", "task_id")))
        for update in self.engine.watch(request.after_revision, request.task_id, context.is_active):
            if not who.is_admin:
                mine = [p for p in update.placements if _visible(self.engine, who, p.task_id)]
                if not mine:
                    continue
                update = tasks_pb2.PlacementUpdate(revision=update.revision, time=update.time,
                                                   cause=update.cause, placements=mine)
            yield update


class StatusService(status_pb2_grpc.StatusServicer):
    """``offcut.v1.Status``: idle pool, tasks, last decision, solver statistics; the export
    of the journal (``ExportHistory``)."""

    def __init__(self, engine: Engine, auth: Authenticator | None = None):
        self.engine = engine
        self.auth = auth or Authenticator(None)

    @_rpc
    def GetStatus(self, request: status_pb2.GetStatusRequest, context):
        """Idle pool, tasks by state, last decision, solver statistics. A user gets the
        aggregate figures only (no node names, last decision or event sources)."""
        who = self.auth.of(context)
        with self.engine.lock:
            reply = protocol.status_to_pb(self.engine.core, self.engine.last_decision,
                                          self.engine.solver_statistics(),
                                          request.include_idle_nodes and who.is_admin)
        if not who.is_admin:
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

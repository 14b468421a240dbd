"""Requests before their handler: a size limit per method, undecodable messages, and decoding
and encoding off the event loop (docs/security.md, "Streams and message sizes").

Every method has a request size limit (:func:`request_limits`): node events
(``NodeEvents/ReportNodes``, ``NodeEvents/SyncNodes``) the configured ``max_message_mb``; the
methods whose requests carry a list bounded by a configured limit (``SubmitTask``,
``ReportProgress``, ``RegisterJob``) what the largest request within those limits needs; every
other method :data:`SMALL_REQUEST_BYTES`. gRPC's transport limit
(``grpc.max_receive_message_length``) is the largest of them. :class:`RequestGuardInterceptor`
checks a request's size before it is parsed and before any handler runs, for every caller,
authenticated or not (a caller without a valid token is refused before its request is even
read: :class:`offcut.daemon.edge.auth.AuthInterceptor`); a larger one is RESOURCE_EXHAUSTED naming
the method's limit. A request that does not parse is INVALID_ARGUMENT naming its type (gRPC
Python would answer UNKNOWN).

``grpc.aio`` parses a unary request on its event loop, where a large one (a snapshot of
100,000 node names) would stall every stream for the parse. The guard hands a plain handler
its request's bytes instead, parses them on the handler's worker thread and encodes the
response there too, so the loop only moves bytes.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable

import grpc

from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.handlers import (ASYNC_GENERATOR, COROUTINE, SYNC, MessageRefused,
                                   behavior_of, kind_of, rebuild)
from offcut.nodes import STREAM_MESSAGE_BYTES

MIB = 1024 * 1024

#: request size limit [bytes] of every method whose request holds no configurable list
#: (ids and names of at most a few hundred characters, numbers, times): 1 MiB
SMALL_REQUEST_BYTES = MIB

#: node events: limited by ``max_message_mb`` (200,000 node names need up to about 26 MB)
NODE_EVENT_METHODS = ("/offcut.v1.NodeEvents/ReportNodes", "/offcut.v1.NodeEvents/SyncNodes")

#: worst-case encoded bytes of one element of a request's configurable list (protobuf: a
#: tag and a length or a packed value): a curve point (``node_counts`` varint <= 5, three
#: doubles: ``throughputs``, ``objective_values``, ``power_w``), a command argument's tag and
#: length, a progress report (a task id of up to 200 ASCII characters, as the daemon makes
#: them; a Timestamp <= 19; three numbers <= 29; tags and lengths), a batch size (an int32
#: varint <= 10)
CURVE_POINT_BYTES = 5 + 3 * 8
COMMAND_ARG_OVERHEAD_BYTES = 4
PROGRESS_REPORT_BYTES = 256
BATCH_SIZE_BYTES = 10


def request_limits(config: DaemonConfig) -> dict[str, int]:
    """Request size limit [bytes] per full method name for the methods with a limit of their
    own; every other method has :data:`SMALL_REQUEST_BYTES`. Each is at most
    ``max_message_mb`` MiB (the transport's limit, which the node events get)."""
    cap = config.max_message_mb * MIB
    limits = config.limits()
    own = {method: cap for method in NODE_EVENT_METHODS}
    own["/offcut.v1.NodeEvents/StreamNodes"] = STREAM_MESSAGE_BYTES  # per message
    own["/offcut.v1.Tasks/SubmitTask"] = (
        SMALL_REQUEST_BYTES + limits.max_curve_points * CURVE_POINT_BYTES
        + limits.max_command_bytes + limits.max_command_args * COMMAND_ARG_OVERHEAD_BYTES)
    own["/offcut.v1.Tasks/ReportProgress"] = (
        SMALL_REQUEST_BYTES + limits.max_progress_reports * PROGRESS_REPORT_BYTES)
    own["/offcut.v1.BatchSizeOptimizer/RegisterJob"] = (
        SMALL_REQUEST_BYTES + limits.max_batch_sizes * BATCH_SIZE_BYTES)
    return {method: min(limit, cap) for method, limit in own.items()}


def transport_limit(config: DaemonConfig) -> int:
    """gRPC's receive limit [bytes]: the largest per-method limit."""
    return max([SMALL_REQUEST_BYTES, *request_limits(config).values()])


def _size_text(n: int) -> str:
    """``n`` bytes as ``"1 MiB"`` / ``"5,013,536 bytes (4.8 MiB)"``."""
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n:,} bytes ({n / MIB:.1f} MiB)"


@dataclass(frozen=True)
class _Refused:
    """A request refused before its handler: the status and its message."""

    code: grpc.StatusCode
    message: str


@dataclass(frozen=True)
class _Raw:
    """A request's bytes, within its limit, parsed later on a worker thread."""

    data: bytes


class _Method:
    """One method's checks: its limit, its request type's name and its parser."""

    def __init__(self, method: str, limit: int, decode: Callable[[bytes], Any] | None):
        self.method, self.limit, self.decode = method, limit, decode
        owner = getattr(decode, "__self__", None)
        self.type_name = getattr(getattr(owner, "DESCRIPTOR", None), "full_name", method)

    def oversize(self, data: bytes) -> _Refused | None:
        """RESOURCE_EXHAUSTED naming the limit when ``data`` is larger than it."""
        if len(data) <= self.limit:
            return None
        return _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"request: {len(data):,} bytes, more than the {_size_text(self.limit)} "
                        f"{self.method.rsplit('/', 1)[-1]} accepts (request size limit, "
                        "docs/security.md)")

    def parse(self, data: bytes) -> Any:
        """The request parsed, or :class:`_Refused` (INVALID_ARGUMENT) when it does not."""
        try:
            return self.decode(data)
        except Exception as exc:  # DecodeError, or a deserializer's own failure
            return _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                            f"request: not a valid {self.type_name} message "
                            f"({str(exc)[:200] or type(exc).__name__})")

    def checked(self, data: bytes) -> Any:
        """The request parsed after the size check, or :class:`_Refused`."""
        return self.oversize(data) or self.parse(data)

    def raw(self, data: bytes) -> Any:
        """The request's bytes after the size check (parsed later), or :class:`_Refused`."""
        return self.oversize(data) or _Raw(data)

    def raising(self, data: bytes) -> Any:
        """A request stream's message parsed after the size check; raises
        :class:`~offcut.daemon.edge.handlers.MessageRefused`."""
        request = self.checked(data)
        if isinstance(request, _Refused):
            raise MessageRefused(request.code, request.message)
        return request


class RequestGuardInterceptor(grpc.aio.ServerInterceptor):
    """Checks each request's size before it is parsed and answers requests that do not parse;
    parses and encodes a plain handler's messages on its worker thread (see the module's
    docstring). Goes last among the interceptors, so the others (metrics, authentication) see
    and count the refused calls like any other.

    Args:
        limits: request size limit [bytes] by full method name (:func:`request_limits`).
        default_limit: the limit of every other method [bytes].
    """

    def __init__(self, limits: dict[str, int], default_limit: int = SMALL_REQUEST_BYTES):
        self.limits = dict(limits)
        self.default_limit = int(default_limit)
        #: method -> (its handler, that handler guarded): gRPC hands out the same handler
        #: object for a registered method on every call, so each is wrapped once, not per call
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def limit(self, method: str) -> int:
        """The request size limit of ``method`` [bytes]."""
        return self.limits.get(method, self.default_limit)

    async def intercept_service(self, continuation, handler_call_details):
        """The method's handler with its request deserializer and behaviour wrapped."""
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is None or cached[0] is not handler:
            checks = _Method(method, self.limit(method), handler.request_deserializer)
            cached = self._guarded[method] = (handler, _guarded(handler, checks))
        return cached[1]


def _guarded(handler: grpc.RpcMethodHandler, checks: _Method) -> grpc.RpcMethodHandler:
    """``handler`` with the checks of ``checks`` (see :class:`RequestGuardInterceptor`)."""
    behavior = behavior_of(handler)
    kind = kind_of(behavior)
    if handler.request_streaming:
        return rebuild(handler, _stream_request(behavior, kind),
                       request_deserializer=checks.raising)
    if kind == SYNC and not handler.response_streaming:
        return rebuild(handler, _on_worker(behavior, checks, handler.response_serializer),
                       request_deserializer=checks.raw, response_serializer=None)
    if kind == COROUTINE:
        return rebuild(handler, _coroutine(behavior), request_deserializer=checks.checked)
    if kind == ASYNC_GENERATOR:
        return rebuild(handler, _async_generator(behavior), request_deserializer=checks.checked)
    return rebuild(handler, _sync_stream(behavior), request_deserializer=checks.checked)


def _on_worker(behavior: Callable, checks: _Method,
               serialize: Callable[[Any], bytes] | None) -> Callable:
    """A plain unary handler that parses its request's bytes and encodes its response on the
    worker thread it runs on."""
    @functools.wraps(behavior)
    def wrapper(request, context):
        if isinstance(request, _Raw):
            request = checks.parse(request.data)
        if isinstance(request, _Refused):
            context.abort(request.code, request.message)
        response = behavior(request, context)
        return serialize(response) if serialize is not None else response
    return wrapper


def _coroutine(behavior: Callable) -> Callable:
    """A coroutine behaviour that answers a refused request first."""
    @functools.wraps(behavior)
    async def wrapper(request, context):
        if isinstance(request, _Refused):
            await context.abort(request.code, request.message)
        return await behavior(request, context)
    return wrapper


def _async_generator(behavior: Callable) -> Callable:
    """An async generator behaviour that answers a refused request first."""
    @functools.wraps(behavior)
    async def wrapper(request, context):
        if isinstance(request, _Refused):
            await context.abort(request.code, request.message)
        async with contextlib.aclosing(behavior(request, context)) as responses:
            async for response in responses:
                yield response
    return wrapper


def _sync_stream(behavior: Callable) -> Callable:
    """A plain server-streaming behaviour (none in offcut.v1) that answers a refused request
    first."""
    @functools.wraps(behavior)
    def wrapper(request, context):
        if isinstance(request, _Refused):
            context.abort(request.code, request.message)
        yield from behavior(request, context)
    return wrapper


def _stream_request(behavior: Callable, kind: str) -> Callable:
    """A request-streaming behaviour (server reflection) whose refused message ends the call
    with the refusal's status (a plain one: client-streaming only; the daemon has none)."""
    if kind == ASYNC_GENERATOR:
        @functools.wraps(behavior)
        async def generator(requests, context):
            try:
                async with contextlib.aclosing(behavior(requests, context)) as responses:
                    async for response in responses:
                        yield response
            except MessageRefused as exc:
                await context.abort(exc.code, exc.message)
        return generator
    if kind == COROUTINE:
        @functools.wraps(behavior)
        async def coroutine(requests, context):
            try:
                return await behavior(requests, context)
            except MessageRefused as exc:
                await context.abort(exc.code, exc.message)
        return coroutine

    @functools.wraps(behavior)
    def plain(requests, context):  # a plain client-streaming handler (none in the daemon)
        try:
            return behavior(requests, context)
        except MessageRefused as exc:
            context.abort(exc.code, exc.message)
    return plain

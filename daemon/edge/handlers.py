"""Building blocks of the daemon's gRPC interceptors: a method handler with its behaviour
replaced or wrapped, its arity and the kind of its behaviour kept.

The daemon serves with ``grpc.aio`` (:mod:`offcut.daemon.edge.server`), which runs a behaviour by
its kind (:func:`kind_of`): a plain function (the unary handlers of ``offcut.v1``) on a worker
thread with a synchronous context, whose ``abort`` raises at once; a coroutine function (the
server streams, written with ``context.write``, and gRPC's health ``Check``/``Watch``) or an
async generator function (server reflection) on the event loop with the asyncio context, whose
``abort`` is a coroutine. A wrapper must therefore be of the kind of what it wraps, and await
``abort`` where the context is asyncio's.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import grpc

#: the kinds of behaviour (:func:`kind_of`)
SYNC, COROUTINE, ASYNC_GENERATOR = "sync", "coroutine", "async generator"

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}

_KEEP: Any = object()


class MessageRefused(Exception):
    """A message of a request stream refused before its handler saw it (too large, or not
    parsable: raised by :mod:`offcut.daemon.edge.request_guard`'s deserializer where the handler
    reads the stream). A handler lets it pass: the guard's wrapper ends the call with
    ``code`` and ``message`` (the messages before it stay handled)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def kind_of(behavior: Callable) -> str:
    """:data:`SYNC`, :data:`COROUTINE` or :data:`ASYNC_GENERATOR`: how ``grpc.aio`` runs
    ``behavior`` (a plain function, even one returning a generator, runs on a worker
    thread)."""
    if inspect.iscoroutinefunction(behavior):
        return COROUTINE
    if inspect.isasyncgenfunction(behavior):
        return ASYNC_GENERATOR
    return SYNC


def behavior_of(handler: grpc.RpcMethodHandler) -> Callable:
    """The behaviour of ``handler`` (the one of its four arities that is set)."""
    return (handler.unary_unary or handler.unary_stream or handler.stream_unary
            or handler.stream_stream)


def rebuild(handler: grpc.RpcMethodHandler, behavior: Callable, *,
            request_streaming: bool | None = None, request_deserializer: Any = _KEEP,
            response_serializer: Any = _KEEP) -> grpc.RpcMethodHandler:
    """``handler`` with ``behavior`` as its behaviour; the (de)serializers are kept unless
    given (None: the behaviour takes or gives bytes). ``request_streaming``: serve the request
    as a stream (True) whatever the method's arity: gRPC then reads no message before the
    behaviour asks for one, which is how a refusal answers without reading the request."""
    streaming = handler.request_streaming if request_streaming is None else request_streaming
    return _FACTORIES[(bool(streaming), bool(handler.response_streaming))](
        behavior,
        request_deserializer=(handler.request_deserializer if request_deserializer is _KEEP
                              else request_deserializer),
        response_serializer=(handler.response_serializer if response_serializer is _KEEP
                             else response_serializer))


def wrapped(handler: grpc.RpcMethodHandler | None,
            wrap: Callable[[Callable], Callable]) -> grpc.RpcMethodHandler | None:
    """``handler`` with its behaviour replaced by ``wrap(behaviour)`` (None stays None: an
    unknown method)."""
    if handler is None:
        return None
    return rebuild(handler, wrap(behavior_of(handler)))


def refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode,
            message: str) -> grpc.RpcMethodHandler:
    """A handler answering ``code`` with ``message`` in place of ``handler`` (same response
    arity), served as a request stream whose message is never read: a refused caller's
    request, however large, is not received into the daemon's memory (gRPC keeps at most its
    flow-control window of it)."""

    async def refuse(request_iterator, context) -> None:
        await context.abort(code, message)

    return rebuild(handler, refuse, request_streaming=True)

"""The threads that run the daemon's plain (unary) handlers (docs/architecture.md,
"Threads").

``grpc.aio`` runs a plain handler function on its ``migration_thread_pool`` and everything
else (I/O, interceptors, every open stream) on its event loop (:mod:`offcut.daemon.edge.event_loop`),
so streams hold none of these threads. :class:`RpcWorkers` is that pool: ``RPC_WORKERS``
threads (``offcut-rpc``) for every unary call, and :data:`NODE_EVENT_WORKERS` more
(``offcut-node-events``) reserved for the methods :class:`ReservedLaneInterceptor` marks,
Slurm's node events: however many other calls are queued, a node event waits for none of them
(only for the engine's lock, which applies one event at a time).
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Callable

import grpc

from offcut.daemon.edge.handlers import SYNC, behavior_of, kind_of, rebuild

#: threads reserved for node events (a Slurm hook waits on each; the watcher sends one set)
NODE_EVENT_WORKERS = 4

#: the attribute that marks a behaviour for the reserved threads; it survives the other
#: interceptors' wrappers (they use ``functools.wraps``, which copies a function's attributes)
RESERVED_ATTRIBUTE = "offcut_reserved_lane"


class RpcWorkers(Executor):
    """The pool that runs plain handlers: a marked behaviour (:data:`RESERVED_ATTRIBUTE`) on
    the reserved threads, anything else on the general ones.

    Args:
        workers: general threads (``offcut-rpc``).
        reserved_workers: reserved threads (``offcut-node-events``).
    """

    def __init__(self, workers: int, reserved_workers: int = NODE_EVENT_WORKERS):
        self.general = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="offcut-rpc")
        self.reserved = ThreadPoolExecutor(max_workers=reserved_workers,
                                           thread_name_prefix="offcut-node-events")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on the reserved threads when ``fn`` is marked, else on
        the general ones."""
        pool = self.reserved if getattr(fn, RESERVED_ATTRIBUTE, False) else self.general
        return pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut both pools down (see :meth:`concurrent.futures.Executor.shutdown`)."""
        self.general.shutdown(wait, cancel_futures=cancel_futures)
        self.reserved.shutdown(wait, cancel_futures=cancel_futures)


def reserved(behavior: Callable) -> Callable:
    """``behavior`` marked to run on the reserved threads."""
    @functools.wraps(behavior)
    def marked(request, context):
        return behavior(request, context)
    setattr(marked, RESERVED_ATTRIBUTE, True)
    return marked


class ReservedLaneInterceptor(grpc.aio.ServerInterceptor):
    """Marks the plain handlers of ``methods`` (full method names) for :class:`RpcWorkers`'
    reserved threads. Goes last among the interceptors (the others' wrappers keep the mark).
    """

    def __init__(self, methods: tuple[str, ...] | frozenset[str]):
        self.methods = frozenset(methods)
        self._marked: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        """The method's handler, marked when it is one of ``methods`` and plain."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method not in self.methods \
                or kind_of(behavior_of(handler)) != SYNC:
            return handler
        cached = self._marked.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._marked[method] = (handler,
                                             rebuild(handler, reserved(behavior_of(handler))))
        return cached[1]

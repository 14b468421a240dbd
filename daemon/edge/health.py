"""The daemon's gRPC health service (``grpc.health.v1.Health``, open to every caller).

gRPC's asyncio health servicer, whose ``Watch`` streams take :class:`StreamSlots` (all of them
under one key, :data:`HEALTH_WATCHERS`: they are unauthenticated), and :class:`HealthStatus`,
the synchronous way the rest of the daemon (``OffcutServer.start``, the solver's circuit
breaker on a worker thread) sets a service's status on the event loop that serves it.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health

from offcut.daemon.edge.event_loop import EventLoopThread
from offcut.daemon.edge.streams import HEALTH_WATCHERS, StreamSlots
from offcut.errors import ResourceExhausted


class BoundedHealthServicer(health.aio.HealthServicer):
    """gRPC's asyncio health service whose ``Watch`` streams take :class:`StreamSlots`;
    ``Check`` is unchanged."""

    def __init__(self, slots: StreamSlots):
        super().__init__()
        self._slots = slots

    async def Watch(self, request, context) -> None:
        """``Watch`` of the health service, or RESOURCE_EXHAUSTED over the cap."""
        try:
            key = self._slots.acquire(HEALTH_WATCHERS, "Watch")
        except ResourceExhausted as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        try:
            await super().Watch(request, context)
        finally:
            self._slots.release(key)


class HealthStatus:
    """Sets statuses of ``servicer`` (which lives on ``loop``) from any thread.

    Args:
        servicer: the health servicer the server serves.
        loop: the event loop that serves it.
    """

    def __init__(self, servicer: BoundedHealthServicer, loop: EventLoopThread):
        self.servicer = servicer
        self._loop = loop

    def _on_loop(self, coro) -> None:
        """Run ``coro`` on the loop: wait for it from another thread; on the loop's own
        thread (a callback there), schedule it."""
        if self._loop.in_loop_thread():
            asyncio.ensure_future(coro)
        else:
            self._loop.run(coro)

    def set(self, service: str, status: int) -> None:
        """Set ``service``'s status (``HealthCheckResponse.SERVING`` ...); ignored after
        :meth:`enter_graceful_shutdown`."""
        self._on_loop(self.servicer.set(service, status))

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on (the daemon stops)."""
        self._on_loop(self.servicer.enter_graceful_shutdown())

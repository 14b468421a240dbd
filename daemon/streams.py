"""Bounds on open server streams (docs/security.md).

gRPC Python serves every call, a stream included, on a worker of one fixed pool: a caller
that opens as many long-lived streams (``WatchPlacements``, health ``Watch``) as there are
workers leaves none for the Slurm hook's node events. :class:`StreamSlots` caps the open
streams in all and per caller below the pool's size, so unary calls always find a worker; a
stream over a cap is answered ``RESOURCE_EXHAUSTED`` at once.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from typing import Iterator

import grpc
from grpc_health.v1 import health

from offcut.errors import ResourceExhausted


class StreamSlots:
    """At most ``total`` open streams, and ``per_caller`` per caller.

    Args:
        total: open streams in all (keep it below the server's worker count).
        per_caller: open streams of one caller (a user name, or one shared key for the
            unauthenticated health ``Watch``).
    """

    def __init__(self, total: int, per_caller: int):
        self.total, self.per_caller = int(total), int(per_caller)
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self._unnamed = itertools.count()  # a key of its own for each stream of no caller

    def acquire(self, caller: str | None, method: str) -> str:
        """Take a slot for one stream of ``caller``; returns the key to :meth:`release` it
        with. ResourceExhausted (naming ``method`` and the limit) when a cap is reached.
        ``caller`` None: only the total cap applies (a daemon without tokens cannot tell its
        callers apart)."""
        with self._lock:
            if sum(self._open.values()) >= self.total:
                raise ResourceExhausted(f"the daemon has {self.total} streams open, its limit "
                                        "(max_streams); try again later", method)
            key = caller if caller is not None else f"(unnamed {next(self._unnamed)})"
            if self._open[key] >= self.per_caller:
                raise ResourceExhausted(f"{key!r} has {self.per_caller} streams open, the "
                                        "limit per caller (max_streams_per_caller)", method)
            self._open[key] += 1
            return key

    def release(self, key: str) -> None:
        """Give back a slot taken by :meth:`acquire`."""
        with self._lock:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]

    @contextlib.contextmanager
    def hold(self, caller: str | None, method: str) -> Iterator[None]:
        """A slot (:meth:`acquire`) while the block runs."""
        key = self.acquire(caller, method)
        try:
            yield
        finally:
            self.release(key)

    def open_streams(self) -> int:
        """Streams open now."""
        with self._lock:
            return sum(self._open.values())


#: the caller key of health ``Watch`` streams (they need no token: one shared budget)
HEALTH_WATCHERS = "(health watchers)"


class BoundedHealthServicer(health.HealthServicer):
    """gRPC's health service whose ``Watch`` streams take :class:`StreamSlots` (all of them
    under one key: they are unauthenticated); ``Check`` is unchanged."""

    def __init__(self, slots: StreamSlots):
        super().__init__()
        self._slots = slots

    def Watch(self, request, context, send_response_callback=None):
        """``Watch`` of the health service, or RESOURCE_EXHAUSTED over the cap."""
        try:
            key = self._slots.acquire(HEALTH_WATCHERS, "Watch")
        except ResourceExhausted as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        try:
            watcher = super().Watch(request, context, send_response_callback)
            if watcher is not None:  # (None only in gRPC's non-blocking mode, not used here)
                yield from watcher
        finally:
            self._slots.release(key)

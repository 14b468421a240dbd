"""Open server streams: their bounds, and the news that wakes them (docs/security.md).

The daemon serves streams (``WatchPlacements``, ``ExportHistory``, health ``Watch``) as
coroutines on gRPC's event loop (:mod:`offcut.daemon.edge.event_loop`): an open stream that waits
holds no thread, so streams never take the workers that unary calls, node events among them,
need (:mod:`offcut.daemon.edge.workers`). They still cost memory and a little of the loop's time,
so :class:`StreamSlots` caps the open ``WatchPlacements`` and health ``Watch`` streams in all
(``max_streams``) and per caller (``max_streams_per_caller``); one over a cap is answered
``RESOURCE_EXHAUSTED`` at once. :class:`PlacementFeed` wakes the waiting ``WatchPlacements``
streams when the engine publishes placement updates: one engine listener for all of them,
no thread and no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter
from typing import Iterator

from offcut.daemon.app.engine import Engine
from offcut.errors import ResourceExhausted


class StreamSlots:
    """At most ``total`` open streams, and ``per_caller`` per caller.

    Args:
        total: open streams in all.
        per_caller: open streams of one caller (a user name, or one shared key for the
            unauthenticated health ``Watch``).
    """

    def __init__(self, total: int, per_caller: int):
        self.total, self.per_caller = int(total), int(per_caller)
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self._count = 0  # sum(self._open.values())
        self._unnamed = itertools.count()  # a key of its own for each stream of no caller

    def acquire(self, caller: str | None, method: str) -> str:
        """Take a slot for one stream of ``caller``; returns the key to :meth:`release` it
        with. ResourceExhausted (naming ``method`` and the limit) when a cap is reached.
        ``caller`` None: only the total cap applies (a daemon without tokens cannot tell its
        callers apart)."""
        with self._lock:
            if self._count >= self.total:
                raise ResourceExhausted(f"the daemon has {self.total} streams open, its limit "
                                        "(max_streams); try again later", method)
            key = caller if caller is not None else f"(unnamed {next(self._unnamed)})"
            if self._open[key] >= self.per_caller:
                raise ResourceExhausted(f"{key!r} has {self.per_caller} streams open, the "
                                        "limit per caller (max_streams_per_caller)", method)
            self._open[key] += 1
            self._count += 1
            return key

    def release(self, key: str) -> None:
        """Give back a slot taken by :meth:`acquire`."""
        with self._lock:
            self._open[key] -= 1
            self._count -= 1
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
            return self._count


#: the caller key of health ``Watch`` streams (they need no token: one shared budget)
HEALTH_WATCHERS = "(health watchers)"


class Subscription:
    """One stream's interest in placement updates (:meth:`PlacementFeed.subscribe`): its
    ``event`` is set when an update it may see arrives (or the feed closes)."""

    def __init__(self, user: str | None, task_id: str):
        self.user, self.task_id = user, task_id
        self.event = asyncio.Event()


class PlacementFeed:
    """The engine's placement updates as news on the event loop that serves the streams.

    The engine calls the feed (on the applying thread, with its lock held) after each event
    that published placement updates and when it closes; the feed hands that on to the loop
    (``call_soon_threadsafe``), reads the new updates there (:meth:`Engine.updates_after`,
    never waiting for the engine's lock) and sets the event of each subscribed stream that may
    see one of them: a stream of every task, a stream of one of the placed tasks, a user's
    stream when one of the placed tasks is theirs. So an event wakes the streams it concerns,
    not all of them: no thread, no polling, no work for the others. A stream clears its event
    *before* it reads the engine's updates, so no update slips between its read and its wait.

    Args:
        engine: whose placement updates to follow.
        loop: the event loop of the streams (the running one when built on it).
    """

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop):
        self._engine = engine
        self._loop = loop
        self._seen = 0  # the revision of the newest update the feed has dispatched
        self._all: set[Subscription] = set()
        self._by_user: dict[str, set[Subscription]] = {}
        self._by_task: dict[str, set[Subscription]] = {}
        #: set by :meth:`close`: the streams end (the daemon stops)
        self.closed = False
        engine.add_listener(self._changed_threadsafe)

    def subscribe(self, user: str | None, task_id: str = "") -> Subscription:
        """A stream's subscription (on the loop): ``user`` None for a caller who sees every
        user's tasks, else the user whose tasks it sees; ``task_id`` "" for every task (it
        may see), else that one task. :meth:`unsubscribe` it when the stream ends."""
        sub = Subscription(user, task_id)
        if task_id:
            self._by_task.setdefault(task_id, set()).add(sub)
        elif user is None:
            self._all.add(sub)
        else:
            self._by_user.setdefault(user, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forget a subscription (on the loop)."""
        if sub.task_id:
            _discard(self._by_task, sub.task_id, sub)
        elif sub.user is None:
            self._all.discard(sub)
        else:
            _discard(self._by_user, sub.user, sub)

    def _changed_threadsafe(self) -> None:
        """The engine's listener: any thread, engine lock held; schedules :meth:`_dispatch`."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to wake
            self._loop.call_soon_threadsafe(self._dispatch)

    def _dispatch(self) -> None:
        """Wake the subscriptions the new updates concern (on the loop)."""
        if self.closed or self._engine.closed:
            self._wake_all()
            return
        updates = self._engine.updates_after(self._seen)
        if not updates:
            return
        self._seen = updates[-1].revision
        woken: set[Subscription] = set(self._all)
        for update in updates:
            for task_id in [p.task_id for p in update.placements] + [w.task_id for w in
                                                                      update.warnings]:
                woken.update(self._by_task.get(task_id, ()))
                woken.update(self._by_user.get(update.owners.get(task_id, ""), ()))
        for sub in woken:
            sub.event.set()

    def _wake_all(self) -> None:
        """Set every subscription's event."""
        for sub in [*self._all, *_members(self._by_user), *_members(self._by_task)]:
            sub.event.set()

    def close(self) -> None:
        """End every stream that follows the feed (on the loop; the daemon stops)."""
        self.closed = True
        self._wake_all()


def _discard(index: dict[str, set[Subscription]], key: str, sub: Subscription) -> None:
    """Remove ``sub`` from ``index[key]`` (and the key once empty)."""
    subs = index.get(key)
    if subs is not None:
        subs.discard(sub)
        if not subs:
            del index[key]


def _members(index: dict[str, set[Subscription]]) -> list[Subscription]:
    """Every subscription of ``index``."""
    return [sub for subs in index.values() for sub in subs]

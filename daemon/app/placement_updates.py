"""The engine's retained placement updates and their listeners (docs/architecture.md,
"Streams").

The engine publishes one :class:`~offcut.views.PlacementUpdate` per applied event
that changed placements or raised warnings, under its own lock; ``WatchPlacements`` streams
read them back with :meth:`PlacementUpdates.after` on the gRPC edge's event loop. The updates
have a lock of their own, held for a copy only and never across a solve, so a reader never
waits for an event being applied.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from typing import Callable

from offcut.views import PlacementUpdate

log = logging.getLogger("offcut.daemon")

#: placement updates kept for ``WatchPlacements(after_revision=...)``
RETAINED_UPDATES = 4096


class PlacementUpdates:
    """The last :data:`RETAINED_UPDATES` placement updates (in memory, lost at a restart)
    and the callbacks told of each new one.

    Args:
        retained: how many updates are kept (oldest dropped first; at least 1).

    Raises:
        ValueError: ``retained`` below 1.
    """

    def __init__(self, retained: int = RETAINED_UPDATES):
        if retained < 1:
            raise ValueError(f"retained: {retained} is below 1")
        #: the retained updates, oldest first (guarded by ``_lock``)
        self.retained: deque[PlacementUpdate] = deque(maxlen=retained)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def publish(self, update: PlacementUpdate) -> None:
        """Retain ``update`` for :meth:`after` and tell the listeners."""
        with self._lock:
            self.retained.append(update)
        self.notify()

    def notify(self) -> None:
        """Call every listener (see :meth:`add_listener`); a failing one is logged."""
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not fail the event that was applied
                log.exception("placement listener %r failed", listener)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` at each :meth:`publish` and :meth:`notify` (see
        :meth:`offcut.daemon.app.engine.Engine.add_listener` for what it may do)."""
        with self._lock:
            self._listeners.append(callback)

    def after(self, revision: int, task_id: str = "") -> list[PlacementUpdate]:
        """The retained updates with revision > ``revision``, oldest first; with ``task_id``,
        only that task's placements and warnings, and only updates that have some. Holds the
        lock for the copy only; costs O(updates returned), not O(retained)."""
        with self._lock:
            new = []
            for update in reversed(self.retained):
                if update.revision <= revision:
                    break
                new.append(update)
        new.reverse()
        if not task_id:
            return new
        mine = []
        for update in new:
            placements = [p for p in update.placements if p.task_id == task_id]
            warnings = [w for w in update.warnings if w.task_id == task_id]
            if placements or warnings:
                mine.append(dataclasses.replace(update, placements=placements,
                                                warnings=warnings))
        return mine

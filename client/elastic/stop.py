"""The stop of an elastic generation (docs/execution.md): the stop signal
(``OFFCUT_STOP_SIGNAL``) and ``SIGTERM`` turned into a flag, and the flag agreed by every
rank at the same step. Part of :mod:`offcut.client.elastic`.
"""

from __future__ import annotations

import signal
from typing import Any

from offcut.client.elastic.group import ProcessGroup


class StopSignals:
    """This process's stop flag and the handlers that set it.

    Until :meth:`arm` (during the rendezvous, which blocks in C++ where Python handlers cannot
    run) the signals keep their default action (:meth:`hold_default`), so the process dies at
    once; afterwards they only set :attr:`requested`. :meth:`restore` puts the handlers found
    back. Install and restore in the main thread (``signal.signal`` raises ``ValueError``
    elsewhere).

    Args:
        stop_signal: the launcher's stop signal; ``SIGTERM`` is handled alike.

    Attributes:
        signals: the signal numbers handled, ascending.
        requested: True once this process got one of them.
        received: the number of the last one received (None before).
    """

    def __init__(self, stop_signal: signal.Signals):
        self.signals = sorted({int(stop_signal), int(signal.SIGTERM)})
        self.requested = False
        self.received: int | None = None
        self._saved: dict[int, Any] = {}

    def hold_default(self) -> None:
        """Give the signals their default action (die at once), keeping the handlers found."""
        for s in self.signals:
            self._saved[s] = signal.signal(s, signal.SIG_DFL)

    def arm(self) -> None:
        """From now on the signals set :attr:`requested`."""
        for s in self.signals:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.requested = True
        self.received = signum

    def restore(self) -> None:
        """Put back the handlers :meth:`hold_default` found (idempotent)."""
        for s, handler in self._saved.items():
            try:
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass
        self._saved.clear()

    def ignore(self) -> None:
        """From now on the signals are ignored, the handlers found no longer put back: a
        process that is ending with a failure finishes with its own exit status, not killed
        by a stop signal that a peer's end brought (the launcher stops a generation once one
        of its runs ended)."""
        self._saved.clear()
        for s in self.signals:
            try:
                signal.signal(s, signal.SIG_IGN)
            except (ValueError, TypeError):  # not the main thread
                pass

    def agree(self, group: ProcessGroup, checkpoint_due: bool) -> tuple[bool, bool]:
        """Whether any rank :attr:`requested` a stop and whether any rank says a checkpoint is
        ``checkpoint_due``: one ``all_reduce`` (MAX) of both flags, so call it on every rank at
        the same step. Raises the collective's error when a peer vanished."""
        stop, due = group.max_over_ranks([int(self.requested), int(checkpoint_due)])
        return bool(stop), bool(due)

    def cause(self) -> str:
        """How the stop came, for the log: `` (got SIGUSR1)`` or `` (by a peer)``."""
        return (f" (got {signal.Signals(self.received).name})" if self.received
                else " (by a peer)")

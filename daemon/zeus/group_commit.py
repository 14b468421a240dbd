"""Group commit of the Zeus registry's writes: the rows of concurrent calls go to the state
file in one transaction, so one fsync (``durability="full"``) makes all of them durable
(docs/architecture.md §6, "Zeus rows").

A call queues its :class:`~offcut.daemon.store.ZeusWrite` with :meth:`GroupCommit.submit`
(under the registry's lock, so the queue is in the order the calls changed memory), lets go
of the lock and waits in :meth:`GroupCommit.wait`. The first waiter that finds no commit under
way becomes the leader: it takes every write queued so far, commits them in one transaction
(:meth:`offcut.daemon.store.Store.zeus_write`) and wakes the others; writes queued meanwhile go
in the next transaction. A call answers only after its own write is durable, and since
transactions commit in queue order, every write it may have read (an earlier call on the same
job) is durable too. No thread of its own: with one caller a commit is that caller's, as
before.

If a transaction fails, every write in it fails, and so does every write queued behind it
(those calls changed memory that held the failed changes); ``broken`` is set and further
writes are refused until the registry has reloaded its memory from the file
(:meth:`GroupCommit.reset`). A waiter gets the transaction's own error when it is an
:class:`~offcut.errors.OffcutError` (a read-only or full state file: UNAVAILABLE /
RESOURCE_EXHAUSTED), else :class:`CommitFailed`.
"""

from __future__ import annotations

import threading
from typing import Callable

from offcut.errors import OffcutError
from offcut.daemon.store import Store, ZeusWrite


class CommitFailed(RuntimeError):
    """The transaction holding a write failed (the write is not durable)."""


class GroupCommit:
    """The queue of writes not yet durable and its leader election (thread-safe).

    Args:
        store: the state file (its ``zeus_write`` commits a batch).
        expire: called by a leader before each transaction: the ``expire_before`` [s, wall
            clock] to pass along (forget older stored answers), or None for not this time.
    """

    def __init__(self, store: Store, expire: Callable[[], float | None] = lambda: None):
        self.store = store
        self.expire = expire
        self._cond = threading.Condition()
        self._queue: list[tuple[int, ZeusWrite]] = []
        self._next = 1  # the ticket of the next write
        self.settled = 0  # every ticket <= this is durable or failed
        self._failed: dict[int, BaseException] = {}  # failed ticket -> its transaction's error
        self._leading = False
        self.broken = False
        #: transactions committed and writes in them (for tests and metrics)
        self.transactions = 0
        self.writes = 0

    def submit(self, write: ZeusWrite) -> int:
        """Queue ``write``; its ticket (increasing). Raises CommitFailed while ``broken`` (a
        transaction failed and the registry has not reloaded yet: ``write`` may build on
        changes that were never stored)."""
        with self._cond:
            if self.broken:
                raise CommitFailed("an earlier Zeus write failed; the registry reloads first")
            ticket = self._next
            self._next += 1
            self._queue.append((ticket, write))
            return ticket

    def reset(self) -> None:
        """Accept writes again (the registry reloaded its memory after a failure)."""
        with self._cond:
            self.broken = False

    def wait(self, ticket: int, _owner: bool = True) -> None:
        """Return once ``ticket``'s write is durable; its transaction's OffcutError, else
        CommitFailed, if it failed.
        A leader needs no lock but this object's, so a caller may wait while holding the
        registry's lock (:meth:`flush` does)."""
        with self._cond:
            while self.settled < ticket:
                if self._leading:
                    self._cond.wait()
                    continue
                batch, self._queue = self._queue, []
                self._leading = True
                self._cond.release()
                error = None
                try:
                    self.store.zeus_write([w for _, w in batch], self.expire())
                except Exception as exc:  # noqa: BLE001 (reported to every waiter)
                    error = exc
                finally:
                    self._cond.acquire()
                    self._leading = False
                if error is not None:
                    self.broken = True
                    batch += self._queue  # queued behind it: built on the failed changes
                    self._queue = []
                    self._failed.update((t, error) for t, _ in batch)
                else:
                    self.transactions += 1
                    self.writes += len(batch)
                if batch:
                    self.settled = max(self.settled, batch[-1][0])
                self._cond.notify_all()
            error = self._failed.pop(ticket, None) if _owner else None
            if error is not None:
                if isinstance(error, OffcutError):
                    raise error
                raise CommitFailed(f"the state file did not take a Zeus write (ticket "
                                   f"{ticket}): {error}") from error

    def flush(self) -> None:
        """Wait until every write queued so far is durable (failures are the callers' to
        report)."""
        with self._cond:
            last = self._next - 1
        self.wait(last, _owner=False)

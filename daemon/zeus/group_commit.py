"""Group commit of the Zeus registry's writes: the rows of concurrent calls go to the state
file in one transaction, so one fsync (``durability="full"``) makes all of them durable
(docs/zeus.md, "Storage").

A call queues its :class:`~offcut.daemon.zeus.storage.ZeusWrite` with :meth:`GroupCommit.submit`
(under the registry's lock, so the queue is in the order the calls changed memory), lets go
of the lock and waits in :meth:`GroupCommit.wait`. The first waiter that finds no commit under
way becomes the leader: it takes every write queued so far, commits them in one transaction
(``commit``: :meth:`offcut.daemon.zeus.storage.ZeusStorage.write`) and wakes the others; writes queued meanwhile go
in the next transaction. A call answers only after its own write is durable, and since
transactions commit in queue order, every write it may have read (an earlier call on the same
job) is durable too. A caller on a worker thread may lead a commit itself; a caller on the
event loop (the Zeus methods served as coroutines: ``Predict``, ``ReportEpoch``) waits with
:meth:`GroupCommit.wait_async` for a future that the committer thread (``offcut-zeus-commit``)
settles after committing, so the loop never waits for an fsync and a round trip needs no
worker thread (docs/architecture.md, "Threads").

If a transaction fails, every write in it fails, and so does every write queued behind it
(those calls changed memory that held the failed changes); ``broken`` is set and further
writes are refused until the registry has reloaded its memory from the file
(:meth:`GroupCommit.reset`). A waiter gets the transaction's own error when it is an
:class:`~offcut.errors.OffcutError` (a read-only or full state file: UNAVAILABLE /
RESOURCE_EXHAUSTED), else :class:`CommitFailed`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Callable

from offcut.errors import OffcutError

if TYPE_CHECKING:  # (the storage imports this module)
    from offcut.daemon.zeus.storage import ZeusWrite


class CommitFailed(RuntimeError):
    """The transaction holding a write failed (the write is not durable)."""


class GroupCommit:
    """The queue of writes not yet durable and its leader election (thread-safe).

    Args:
        commit: writes a batch in one transaction, with the ``expire_before`` of ``expire``
            (:meth:`offcut.daemon.zeus.storage.ZeusStorage.write`); raises if it failed.
        expire: called by a leader before each transaction: the ``expire_before`` [s, wall
            clock] to pass along (forget older stored answers), or None for not this time.
    """

    def __init__(self, commit: "Callable[[list[ZeusWrite], float | None], None]",
                 expire: Callable[[], float | None] = lambda: None):
        self.commit = commit
        self.expire = expire
        self._cond = threading.Condition()
        self._queue: list[tuple[int, "ZeusWrite"]] = []
        self._next = 1  # the ticket of the next write
        self.settled = 0  # every ticket <= this is durable or failed
        self._failed: dict[int, BaseException] = {}  # failed ticket -> its transaction's error
        self._leading = False
        self.broken = False
        #: transactions committed and writes in them (for tests and metrics)
        self.transactions = 0
        self.writes = 0
        #: ticket -> (its caller's event loop, the future to settle): waiters on an event
        #: loop (:meth:`wait_async`), settled by the committer thread
        self._async: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._committer: threading.Thread | None = None
        self._closed = False

    def submit(self, write: "ZeusWrite") -> int:
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
                    self.commit([w for _, w in batch], self.expire())
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
            error = self._error_of(ticket) if _owner else None
            if error is not None:
                raise error

    def wait_async(self, ticket: int) -> "asyncio.Future[None]":
        """A future of the running event loop that is done once ``ticket``'s write is durable
        (its exception as :meth:`wait` raises it if it failed). The commit runs on the
        committer thread (started at the first call), so the loop never waits for an fsync."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            if self.settled >= ticket:
                _settle(future, self._error_of(ticket))
                return future
            if self._closed:  # no committer any more: never leave a caller waiting
                _settle(future, CommitFailed("the daemon is stopping; the write was not "
                                             "committed"))
                return future
            self._async[ticket] = (loop, future)
            if self._committer is None:
                self._committer = threading.Thread(target=self._commit_for_loops, daemon=True,
                                                   name="offcut-zeus-commit")
                self._committer.start()
            self._cond.notify_all()
        return future

    def _error_of(self, ticket: int) -> BaseException | None:
        """``ticket``'s failure as its waiter gets it (the transaction's OffcutError, else
        CommitFailed), or None; forgotten once taken (call holding ``_cond``)."""
        error = self._failed.pop(ticket, None)
        if error is None or isinstance(error, OffcutError):
            return error
        failed = CommitFailed(f"the state file did not take a Zeus write (ticket {ticket}): "
                              f"{error}")
        failed.__cause__ = error
        return failed

    def _commit_for_loops(self) -> None:
        """The committer thread (``offcut-zeus-commit``, started by the first
        :meth:`wait_async`): waits for writes that callers on an event loop wait for, commits
        them (as a leader, with whatever else is queued; or waits for the leading caller) and
        settles their futures on their loops. Runs for the process's life (a daemon thread)."""
        while True:
            with self._cond:
                while not self._async and not self._closed:
                    self._cond.wait()
                if not self._async:
                    return  # closed, and nobody waits
                target = max(self._async)
            try:
                self.wait(target, _owner=False)
            except Exception:  # noqa: BLE001 (errors are the waiters', below)
                pass
            with self._cond:
                for ticket in [t for t in self._async if t <= self.settled]:
                    loop, future = self._async.pop(ticket)
                    loop.call_soon_threadsafe(_settle, future, self._error_of(ticket))

    def close(self) -> None:
        """End the committer thread once no caller on a loop waits any more (the daemon
        stops; in-flight calls were given their grace period). Waits for it up to 10 s."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            committer, self._committer = self._committer, None
        if committer is not None:
            committer.join(10)

    def flush(self) -> None:
        """Wait until every write queued so far is durable (failures are the callers' to
        report)."""
        with self._cond:
            last = self._next - 1
        self.wait(last, _owner=False)


def _settle(future: "asyncio.Future[None]", error: BaseException | None) -> None:
    """Finish ``future`` (on its loop) with ``error`` or done."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)

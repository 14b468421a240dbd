"""Durable state of the engine: a SQLite journal of applied events plus periodic snapshots
and the archive of finished tasks (docs/architecture.md, "Journal and snapshots"), in the
state file that :mod:`offcut.daemon.app.state_file` opens (its format, identity checks and
upgrades, shared with the Zeus subsystem's storage).

:class:`Store` composes the parts, each in its own module: the journal
(:class:`offcut.daemon.app.journal.Journal`: one row per applied event with its sha256, checked
before it is re-applied), the snapshots (:mod:`offcut.daemon.app.snapshots`) and the archive
(:class:`offcut.daemon.app.task_archive.TaskArchive`). All of it is the application's own JSON,
never a wire message. A row and, when due, a snapshot of the whole core are written in one
transaction before the daemon replies. WAL mode; ``durability="full"`` (default) fsyncs every
commit, so a committed reply survives ``kill -9`` and power loss; ``"normal"`` survives
``kill -9`` only.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, Iterator, Mapping

from offcut.daemon.app import snapshot_prune
from offcut.daemon.app.journal import (JOURNAL_ROW_COLUMNS, Journal, journal_row_problem,
                                       journal_row_refusal)
from offcut.daemon.app.snapshots import SnapshotDelta, put_snapshot, snapshots
from offcut.daemon.app.state_file import (ReadOnlyConnection, StoreError, Upgrade,
                                         WriteTransactions, open_state_file)
from offcut.daemon.app.task_archive import TaskArchive


log = logging.getLogger("offcut.daemon")

#: archived tasks past their retention that one event's transaction deletes after a snapshot
#: marked them (oldest first; a few per event, as the journal's rows)
ARCHIVE_DELETES_PER_APPEND = 16
#: the engine's tables (journal, snapshots, archive)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    source TEXT,
    seq INTEGER,
    request_id TEXT,
    event TEXT NOT NULL,
    solves TEXT NOT NULL,
    response BLOB NOT NULL,
    sha256 TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS journal_source_seq ON journal(source, seq) WHERE source IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS journal_request ON journal(request_id) WHERE request_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS snapshots (
    journal_id INTEGER PRIMARY KEY,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS task_archive (
    task_id TEXT PRIMARY KEY,
    number INTEGER NOT NULL,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    finish_time REAL NOT NULL,
    task TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS task_archive_finish ON task_archive(finish_time);
CREATE INDEX IF NOT EXISTS task_archive_owner ON task_archive(owner, number);
CREATE TABLE IF NOT EXISTS snapshot_checksums (
    journal_id INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshot_tasks (
    task_id TEXT NOT NULL,
    journal_id INTEGER NOT NULL,
    number INTEGER NOT NULL,
    task TEXT,
    sha256 TEXT,
    PRIMARY KEY (task_id, journal_id)
);
CREATE INDEX IF NOT EXISTS snapshot_tasks_journal ON snapshot_tasks(journal_id);
"""


class Store:
    """The engine's part of the state file: journal, snapshots and archive of finished tasks
    (module docstring), on a connection of its own.

    Args:
        path: SQLite file (created with its parent folder if missing).
        snapshot_every: write a full snapshot every this many journal rows (>= 1).
        durability: ``full`` (fsync every commit: a reply survives power loss) or ``normal``
            (WAL without fsync per commit: a reply survives ``kill -9`` of the daemon, the
            last commits may be lost on power loss; ~1 ms less per event).
        upgrades: format -> the upgrade of a file of that format to the next
            (:data:`offcut.daemon.app.migrations.UPGRADES`); a file of an older released format
            (at least :data:`FIRST_RELEASED_FORMAT`) is upgraded in place after a copy is
            saved next to it as ``<name>.format<N>.bak`` (mode 0600).
        init: take an existing empty file (0 bytes, or SQLite without tables) for a new state.
        quick_check: run ``PRAGMA quick_check`` before using the file (the daemon's start).

    The file is opened by :func:`open_state_file`; writes that fail for read-only or full
    storage raise :mod:`offcut.daemon.app.storage_errors`' errors (:class:`WriteTransactions`).

    Raises:
        StoreError: the file is empty (without ``init``), not a SQLite database, another
            application's, of a newer format, of a pre-release one (:func:`format_refusal`),
            of an older released one without an upgrade, or fails ``quick_check``
            (docs/operations.md); :class:`StateNotWritable` when this
            process cannot write the file, its ``-wal``/``-shm`` or its folder.
    """

    def __init__(self, path: str | Path, snapshot_every: int = 1000, durability: str = "full",
                 upgrades: Mapping[int, Upgrade] | None = None, *, init: bool = False,
                 quick_check: bool = False):
        self.path = Path(path)
        self.snapshot_every = max(1, int(snapshot_every))
        #: called with the id of each committed journal row (the commit mark of
        #: :class:`offcut.daemon.app.state_lock.StateLock`), or None
        self.on_commit: Callable[[int], None] | None = None
        #: the snapshot :meth:`load` skipped as corrupt (journal id), if any
        self.bad_snapshots: list[int] = []
        #: whether :meth:`load` took an incremental snapshot (tasks as ``snapshot_tasks`` rows)
        self.loaded_incremental = False
        self.db = open_state_file(self.path, durability, _SCHEMA, upgrades=upgrades, init=init,
                                  quick_check=quick_check)
        try:
            #: where the walk over unread snapshot task rows starts when the file stores no
            #: cursor (taken now, before any new snapshot: snapshot_prune.default_cursor)
            self._prune_default = snapshot_prune.default_cursor(self.db)
            last = self.db.execute("SELECT COALESCE(MAX(journal_id), 0) FROM snapshots"
                                   ).fetchone()[0]
            self._rows_since_snapshot = self.db.execute(
                "SELECT COUNT(*) FROM journal WHERE id > ?", (last,)).fetchone()[0]
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise StoreError(f"{self.path}: not a usable Offcut state file ({exc})") from exc
        self._transactions = WriteTransactions(self.db, self.path)
        self._reader = ReadOnlyConnection(self.path)
        #: the journal's rows (its retention mark: :meth:`retire_journal`)
        self.journal_rows = Journal(self.db, self.path)
        #: the finished tasks
        self.archive = TaskArchive(self.db, self.path, self._reader.rows, self._reader.lock)

    # ------------------------------------------------------------------ storage failures
    @property
    def on_storage(self) -> Callable[[str | None], None] | None:
        """Called with the reason when a write fails for lack of writable storage
        (:mod:`offcut.daemon.app.storage_errors`), and with None at the next write that
        succeeds (:class:`WriteTransactions`)."""
        return self._transactions.on_storage

    @on_storage.setter
    def on_storage(self, callback: Callable[[str | None], None] | None) -> None:
        self._transactions.on_storage = callback

    @property
    def storage_problem(self) -> str | None:
        """Why the last write failed for lack of writable storage (None once one succeeds)."""
        return self._transactions.storage_problem

    def _writing(self) -> AbstractContextManager[None]:
        """One write transaction (:meth:`WriteTransactions.writing`)."""
        return self._transactions.writing()

    # ------------------------------------------------------------------ reading
    def load(self) -> tuple[dict[str, Any] | None, Iterator[tuple[dict, list[dict]]]]:
        """The newest good snapshot (or None) and the journal rows after it as
        ``(event_dict, solves)`` pairs, oldest first.

        A snapshot whose sha256 does not match (or whose JSON does not parse) is skipped with
        a warning naming it (listed in :attr:`bad_snapshots`) and the next older one is used
        with the journal after it; with none good, the journal is replayed from its start.
        Each row is checked as it is read (:func:`journal_row_problem`: its sha256, and its
        JSON): a damaged row is never re-applied.

        Raises:
            StoreError: no good snapshot and the journal does not start at row 1 (rows a
                replay needs are missing), or gaps after the snapshot taken; while iterating
                the rows, a damaged row (:func:`journal_row_refusal`: one line naming the
                row and the recovery step).
        """
        state, after = None, 0
        self.bad_snapshots = []
        self.loaded_incremental = False
        for journal_id, loaded, why in snapshots(self.db):
            if loaded is None:
                log.warning("state %s: snapshot at journal row %d is corrupt (%s); falling back "
                            "to an older one and the journal after it", self.path, journal_id, why)
                self.bad_snapshots.append(journal_id)
                continue
            self.loaded_incremental = bool(loaded.pop("incremental", False))
            state, after = loaded, journal_id
            break
        if state is None and self.bad_snapshots and not self.journal_complete():
            raise StoreError(f"{self.path}: every snapshot is corrupt (journal rows "
                             f"{', '.join(map(str, self.bad_snapshots))}) and the journal does not "
                             f"start at row 1; restore a backup (docs/operations.md)")
        if self.journal_rows.count_after(after) != max(0, self.last_journal_id() - after):
            raise StoreError(f"{self.path}: journal rows after row {after} (the snapshot "
                             f"taken) have gaps; restore a backup (docs/operations.md)")

        def rows() -> Iterator[tuple[dict, list[dict]]]:
            cur = self.db.execute(f"SELECT {JOURNAL_ROW_COLUMNS} FROM journal WHERE id > ? "
                                  f"ORDER BY id", (after,))
            for row in cur:
                why = journal_row_problem(row)
                if why:
                    raise StoreError(journal_row_refusal(self.path, row[0], why))
                yield json.loads(row[5]), json.loads(row[6])

        return state, rows()

    def last_journal_id(self) -> int:
        """The id of the newest journal row (0 for none)."""
        return self.journal_rows.last_id()

    def checkpoint(self) -> None:
        """Copy every committed page from the ``-wal`` into the main file and empty the
        ``-wal`` (at start: the main file alone then holds everything committed so far)."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def journal_complete(self) -> bool:
        """True when the journal holds every row from 1 to its newest (none missing)."""
        return self.journal_rows.complete()

    def journal(self, after_id: int = 0, limit: int | None = None, chunk_rows: int = 500
                ) -> Iterator[tuple[int, str, bytes]]:
        """Journal rows with ``id > after_id`` as ``(id, kind, response)``, oldest first, up to
        the last row committed when the iteration starts, at most ``limit`` rows (None = all).

        A row's id equals the core revision of its event (:class:`Journal`), so paging by id
        is paging by ``Decision.revision``. Rows older than the journal's retention are
        deleted (:meth:`retire_journal`): an ``after_id`` before the oldest kept row starts at
        that row. Reads ``chunk_rows`` rows per query on a private read-only connection, so a
        long journal is not loaded at once (:meth:`Journal.read`)."""
        return self.journal_rows.read(after_id, limit, chunk_rows)

    def response_for_seq(self, source: str, seq: int) -> bytes | None:
        """The stored reply to event ``(source, seq)``, or None."""
        return self.journal_rows.response_for_seq(source, seq)

    def response_for_request(self, request_id: str) -> bytes | None:
        """The stored reply to the submission with ``request_id``, or None."""
        return self.journal_rows.response_for_request(request_id)

    def retire_journal(self, before_time: float) -> int:
        """Mark for deletion the journal rows of events before ``before_time`` [s since
        epoch] that no kept snapshot needs; the next appends delete
        :data:`JOURNAL_DELETES_PER_APPEND` of them each (:meth:`Journal.retire`). Returns the
        last id marked (the horizon, never lowered)."""
        return self.journal_rows.retire(before_time)

    # ------------------------------------------------------------------ writing
    def append(self, *, kind: str, event: dict[str, Any], solves: list[dict[str, Any]],
               response: bytes, source: str | None = None, seq: int | None = None,
               request_id: str | None = None, state: dict[str, Any] | None = None,
               archive: list[dict[str, Any]] = (),
               prune_archive_before: float | None = None) -> dict[str, int]:
        """Commit one applied event, the finished tasks it took out of the state
        (``archive``: :meth:`Task.to_dict` forms) and a snapshot of ``state`` if given,
        atomically (callers pass ``state`` when :meth:`snapshot_due` says so).

        The archive's retention: ``prune_archive_before`` [s since epoch] (given at a
        snapshot) marks the archived tasks that finished before it; the transactions of the
        following events delete :data:`ARCHIVE_DELETES_PER_APPEND` of them each, oldest
        first, until none is left (no commit of their own, and nothing added to the marking
        snapshot's transaction, which holds the engine's lock longest; a restart forgets the
        mark and the next snapshot sets it again). Returns how many archived tasks this
        transaction deleted per state value."""
        with self._writing():  # one transaction
            self.archive.insert(archive)
            gone = self.archive.prune_marked(ARCHIVE_DELETES_PER_APPEND)  # an earlier mark's
            row_id = self.journal_rows.insert(kind, event, solves, response, source, seq,
                                              request_id)
            if state is not None:
                self._put_snapshot(row_id, state)
            else:  # rows past the retention, a few per event
                self.journal_rows.delete_retired()
        if prune_archive_before is not None:
            self.archive.mark_retired(prune_archive_before)
        self._rows_since_snapshot = 0 if state is not None else self._rows_since_snapshot + 1
        if self.on_commit is not None:
            self.on_commit(row_id)
        return gone

    def snapshot_due(self) -> bool:
        """True when the next :meth:`append` should carry a snapshot."""
        return self._rows_since_snapshot + 1 >= self.snapshot_every

    def write_snapshot(self, state: dict[str, Any]) -> None:
        """Snapshot ``state`` as of the last journal row (e.g. at shutdown or after a
        settings change)."""
        with self._writing():
            self._put_snapshot(self.last_journal_id(), state)
        self._rows_since_snapshot = 0

    def _put_snapshot(self, journal_id: int, state: "dict[str, Any] | SnapshotDelta") -> None:
        """Store a snapshot inside the caller's transaction (:func:`put_snapshot`)."""
        put_snapshot(self.db, journal_id, state, self._prune_default)

    # ------------------------------------------------------------------ finished tasks
    def archive_tasks(self, tasks: Iterable[dict[str, Any]]) -> None:
        """Insert finished tasks into the archive in a transaction of their own (recovery)."""
        with self._writing():
            self.archive.insert(tasks)

    def archived_task(self, task_id: str) -> dict[str, Any] | None:
        """An archived task's :meth:`Task.to_dict` form, or None
        (:meth:`TaskArchive.task`)."""
        return self.archive.task(task_id)

    def archived_tasks(self, states: Iterable[str] = (), owner: str = "", *,
                       after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Archived tasks in submit order, filtered and paged as :meth:`TaskArchive.tasks`
        says (committed rows, read without the writer's connection, so callers need not hold
        the engine's lock)."""
        return self.archive.tasks(states, owner, after=after, limit=limit)

    def archived_counts(self) -> dict[str, int]:
        """Archived tasks per state value."""
        return self.archive.counts()

    @property
    def bad_archive_rows_skipped(self) -> int:
        """Damaged archive rows skipped by reads so far (:meth:`TaskArchive._task`)."""
        return self.archive.bad_rows_skipped

    def close(self) -> None:
        """Close the database connections."""
        self._reader.close()
        self.db.close()

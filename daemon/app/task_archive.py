"""The archive of finished tasks in the state file (docs/architecture.md, "Journal and
snapshots"; the retention: docs/operations.md).

Finished tasks leave the scheduler's state after its retention
(``SchedulerState.finished_task_retention_s``) and are kept here, one ``task_archive`` row
each, readable by id, owner and state, until ``archive_retention_s`` after they finished
(:meth:`offcut.daemon.app.store.Store.append`'s ``prune_archive_before``: deleted a few per later
event, oldest first). :class:`TaskArchive` writes inside the transactions of its
:class:`offcut.daemon.app.store.Store` and lists committed rows on the store's read-only
connection.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from offcut.daemon.app.model import task_number

log = logging.getLogger("offcut.daemon")

#: damaged ``task_archive`` rows whose ids are remembered (each logged once); past it they
#: are only counted
MAX_BAD_ARCHIVE_ROWS = 1000


class TaskArchive:
    """The ``task_archive`` table of the state file open as ``db`` (at ``path``, for
    messages); ``read`` runs a select on the store's read-only connection (committed rows,
    no writer's lock) and ``lock`` is that connection's lock (it also guards the count of
    damaged rows)."""

    def __init__(self, db: sqlite3.Connection, path: Path,
                 read: Callable[[str, "tuple | list"], list[tuple]], lock: threading.Lock):
        self.db = db
        self.path = path
        self._read = read
        self._lock = lock
        #: damaged rows skipped by reads so far (:meth:`_task`), and the ids of those already
        #: logged (at most MAX_BAD_ARCHIVE_ROWS)
        self.bad_rows_skipped = 0
        self._bad_ids: set[str] = set()
        #: the retention's mark: archived tasks finished before it [s since epoch] are deleted
        #: a few per transaction (:meth:`prune_marked`); None when none is marked
        self.retired_before: float | None = None

    def insert(self, tasks: Iterable[dict[str, Any]]) -> None:
        """Insert finished tasks (:meth:`Task.to_dict` forms) inside the caller's transaction
        (a task archived again, when the journal is re-applied, replaces its row)."""
        self.db.executemany(
            "INSERT OR REPLACE INTO task_archive VALUES (?, ?, ?, ?, ?, ?)",
            [(t["task_id"], task_number(t["task_id"]), t["owner"], t["state"],
              float(t["finish_time"] or 0.0), json.dumps(t, separators=(",", ":")))
             for t in tasks])

    def task(self, task_id: str) -> dict[str, Any] | None:
        """An archived task's :meth:`Task.to_dict` form, or None."""
        row = self.db.execute("SELECT task FROM task_archive WHERE task_id = ?",
                              (task_id,)).fetchone()
        return self._task(task_id, row[0]) if row else None

    def tasks(self, states: Iterable[str] = (), owner: str = "", *,
              after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Archived tasks in submit order, those in ``states`` (task state values; empty: all)
        of ``owner`` (empty: every owner) whose submit number is above ``after``, at most
        ``limit`` (None: all); committed rows, read without the writer's connection, so
        callers need not hold the engine's lock."""
        sql, args = "SELECT task_id, task FROM task_archive WHERE number > ?", [int(after)]
        states = list(states)
        if states:
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args += states
        if owner:
            sql += " AND owner = ?"
            args.append(owner)
        sql += " ORDER BY number"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [t for t in (self._task(task_id, text) for task_id, text in
                            self._read(sql, args)) if t is not None]

    def _task(self, task_id: str, text: Any) -> dict[str, Any] | None:
        """A row's task, or None for a damaged row (JSON that does not parse or is not a
        task's object): skipped, so one bad row never fails every listing; logged once per row
        (the first :data:`MAX_BAD_ARCHIVE_ROWS` remembered) and counted in
        :attr:`bad_rows_skipped`."""
        try:
            task = json.loads(text)
            if isinstance(task, dict) and task.get("task_id") == task_id:
                return task
            why = "not this task's record"
        except (ValueError, TypeError) as exc:
            why = f"not JSON: {exc}"
        with self._lock:
            self.bad_rows_skipped += 1
            new = (task_id not in self._bad_ids and len(self._bad_ids) < MAX_BAD_ARCHIVE_ROWS)
            if new:
                self._bad_ids.add(task_id)
        if new:
            log.error("state %s: archived task %r is damaged (%s); skipped in listings "
                      "(run offcutd check; restore a backup to get it back)",
                      self.path, str(task_id)[:80], why)
        return None

    def counts(self) -> dict[str, int]:
        """Archived tasks per state value."""
        return dict(self.db.execute("SELECT state, COUNT(*) FROM task_archive GROUP BY state"))

    def mark_retired(self, finished_before: float) -> None:
        """Mark the archived tasks that finished before ``finished_before`` [s since epoch]
        for deletion (the later of two marks wins); :meth:`prune_marked` deletes them. The
        mark is in memory: a restart forgets it, and the next snapshot sets it again."""
        before = float(finished_before)
        self.retired_before = (before if self.retired_before is None
                               else max(self.retired_before, before))

    def prune_marked(self, limit: int) -> dict[str, int]:
        """Delete up to ``limit`` marked tasks (:meth:`prune`, inside the caller's
        transaction); the mark is cleared once fewer than ``limit`` were left (if that
        transaction then rolls back, the rows wait for the next snapshot's mark). Returns how
        many per state value ({} when nothing is marked)."""
        if self.retired_before is None:
            return {}
        gone = self.prune(self.retired_before, limit)
        if sum(gone.values()) < limit:
            self.retired_before = None  # caught up
        return gone

    def prune(self, finished_before: float, limit: int) -> dict[str, int]:
        """Delete up to ``limit`` archived tasks that finished before ``finished_before`` [s
        since epoch], oldest first (inside the caller's transaction; by the finish-time index
        and the primary key); returns how many per state value."""
        rows = self.db.execute("SELECT task_id, state FROM task_archive WHERE finish_time < ? "
                               "ORDER BY finish_time LIMIT ?",
                               (float(finished_before), int(limit))).fetchall()
        gone = dict(Counter(state for _, state in rows))
        if rows:
            self.db.executemany("DELETE FROM task_archive WHERE task_id = ?",
                                [(task_id,) for task_id, _ in rows])
        return gone

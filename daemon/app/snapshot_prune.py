"""Deleting the ``snapshot_tasks`` rows that no kept snapshot reads, a bounded number of rows
per snapshot (docs/architecture.md, "Journal and snapshots").

A snapshot's tasks are, per task, its newest ``snapshot_tasks`` row at or before the snapshot
(:func:`offcut.daemon.app.store.snapshots`). Once a snapshot ``S`` is at or before the oldest kept
snapshot, every task ``S`` wrote a row for has its older rows unread by any kept snapshot, and
a row of ``S`` saying that a task left (``task`` NULL) is unread too once those older rows are
gone (a task id never comes back). Such rows are deleted here.

The rows are walked in ``(journal_id, rowid)`` order from a cursor kept in ``meta`` (key
:data:`CURSOR_KEY`, value ``"<journal_id> <rowid>"``: every row before it was walked), inside
the caller's transaction: the deletions and the cursor commit with the snapshot or not at all.
Deleting a row later than it could be is never wrong (no snapshot reads it); deleting it
earlier never happens, so a crash at any point loses nothing. Only when the rows are deleted
is left to timing (:func:`prune`'s ``seconds``), never which rows a snapshot reads.

Why bounded: a snapshot that wrote every task (the first one after an upgrade or a fallback,
200,000 tasks: 200,000 rows) becomes the oldest kept one two snapshots later, and walking all
its rows under the engine's lock at once took 80-310 ms on a 2-core machine (the
``DELETE ... WHERE journal_id = ? AND task IS NULL`` of earlier releases read every row of
that snapshot) and seconds after a fallback (a delete per task). A snapshot walks as many rows
as it wrote plus :data:`PRUNE_MIN_ROWS` (so the walk overtakes what later snapshots add), and
more while :data:`PRUNE_SECONDS` last: its cost stays that of the tasks that changed. Rows of
a snapshot of every task that each delete an older row cost 10-30 µs each on that machine, so
such a backlog of 200,000 rows is gone after about 200-600 snapshots; until then it only takes
disk space (at most the rows of one snapshot of every task).
"""

from __future__ import annotations

import sqlite3
import time

#: the ``meta`` key of the cursor (``"<journal_id> <rowid>"``)
CURSOR_KEY = "snapshot_tasks_pruned"

#: rows a snapshot walks on top of the rows it wrote, however long they take [rows]
PRUNE_MIN_ROWS = 256

#: how long a snapshot walks on after that while rows are left [s]
PRUNE_SECONDS = 0.010

#: rows read and deleted per step of the walk [rows]
CHUNK_ROWS = 256


def default_cursor(db: sqlite3.Connection) -> tuple[int, int]:
    """The cursor of a file that has none stored, taken when the file is opened (before any
    new snapshot): after the rows of the oldest kept snapshot (releases before the cursor
    deleted every unread row at each snapshot), or (0, 0) for a file without snapshots.
    Reads only."""
    oldest = db.execute("SELECT MIN(journal_id) FROM snapshots").fetchone()[0]
    if oldest is None:
        return 0, 0
    last = db.execute("SELECT MAX(rowid) FROM snapshot_tasks WHERE journal_id = ?",
                      (oldest,)).fetchone()[0]
    return oldest, last or 0


def cursor(db: sqlite3.Connection, default: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """The stored cursor ``(journal_id, rowid)``: every ``snapshot_tasks`` row before it was
    walked (``default`` when none is stored yet)."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (CURSOR_KEY,)).fetchone()
    if row is None:
        return default
    journal_id, rowid = row[0].split()
    return int(journal_id), int(rowid)


def _set_cursor(db: sqlite3.Connection, at: tuple[int, int]) -> None:
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (CURSOR_KEY, f"{at[0]} {at[1]}"))


def prune(db: sqlite3.Connection, min_rows: int, seconds: float,
          default: tuple[int, int] = (0, 0)) -> int:
    """Walk the rows of the snapshots at or before the oldest kept one from the cursor
    (``default``: :func:`default_cursor` when none is stored), deleting the rows they make
    unread, and store the cursor (inside the caller's transaction): at least ``min_rows`` rows
    [rows], then steps of :data:`CHUNK_ROWS` while less than ``seconds`` [s] have passed;
    returns the rows walked (the walk stops early when nothing is left to walk for now)."""
    start = time.perf_counter()
    oldest = db.execute("SELECT MIN(journal_id) FROM snapshots").fetchone()[0]
    if oldest is None:
        return 0
    journal_id, rowid = cursor(db, default)
    walked = 0
    while journal_id <= oldest:  # never the rows of a snapshot that a kept one may need
        if walked < min_rows:
            limit = min_rows - walked
        elif time.perf_counter() - start < seconds:
            limit = CHUNK_ROWS
        else:
            break
        rows = db.execute(
            "SELECT rowid, task_id, task IS NULL FROM snapshot_tasks WHERE journal_id = ? AND "
            "rowid > ? ORDER BY rowid LIMIT ?", (journal_id, rowid, limit)).fetchall()
        if not rows:
            later = db.execute("SELECT MIN(journal_id) FROM snapshot_tasks WHERE journal_id > ? "
                               "AND journal_id <= ?", (journal_id, oldest)).fetchone()[0]
            if later is None:
                break
            journal_id, rowid = later, 0
            continue
        if db.execute("SELECT 1 FROM snapshot_tasks WHERE journal_id < ? LIMIT 1",
                      (journal_id,)).fetchone() is not None:
            # by primary key (task_id, journal_id): O(rows of those tasks)
            db.executemany("DELETE FROM snapshot_tasks WHERE task_id = ? AND journal_id < ?",
                           [(task_id, journal_id) for _, task_id, _ in rows])
        # after the older rows of the same tasks, so that a task that left cannot come back
        db.executemany("DELETE FROM snapshot_tasks WHERE rowid = ?",
                       [(r,) for r, _, left in rows if left])
        rowid = rows[-1][0]
        walked += len(rows)
    _set_cursor(db, (journal_id, rowid))
    return walked


def backlog(db: sqlite3.Connection, default: tuple[int, int] = (0, 0)) -> int:
    """The rows of snapshots at or before the oldest kept one that the cursor has not walked
    yet [rows] (O(those rows): for tests and inspection)."""
    oldest = db.execute("SELECT MIN(journal_id) FROM snapshots").fetchone()[0]
    if oldest is None:
        return 0
    journal_id, rowid = cursor(db, default)
    return db.execute(
        "SELECT COUNT(*) FROM snapshot_tasks WHERE journal_id <= ? AND "
        "(journal_id > ? OR (journal_id = ? AND rowid > ?))",
        (oldest, journal_id, journal_id, rowid)).fetchone()[0]

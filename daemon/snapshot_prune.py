"""Deleting the ``snapshot_tasks`` rows that no kept snapshot reads, a bounded number of rows
per snapshot (docs/architecture.md §6).

A snapshot's tasks are, per task, its newest ``snapshot_tasks`` row at or before the snapshot
(:func:`offcut.daemon.store.snapshots`). Once a snapshot ``S`` is at or before the oldest kept
snapshot, every task ``S`` wrote a row for has its older rows unread by any kept snapshot, and
a row of ``S`` saying that a task left (``task`` NULL) is unread too once those older rows are
gone (a task id never comes back). Such rows are deleted here.

The rows are walked in ``(journal_id, rowid)`` order from a cursor kept in ``meta`` (key
:data:`CURSOR_KEY`, value ``"<journal_id> <rowid>"``: every row before it was walked), at most
``budget`` rows per call, inside the caller's transaction: the deletions and the cursor commit
with the snapshot or not at all. Deleting a row later than it could be is never wrong (the
row is not read); deleting it earlier never happens, so a crash at any point loses nothing.

Why bounded: a snapshot that wrote every task (the first one after an upgrade or a fallback,
200,000 tasks: 200,000 rows) becomes the oldest kept one two snapshots later, and walking all
its rows under the engine's lock then took 80-310 ms on a 2-core machine (the old
``DELETE ... WHERE journal_id = ? AND task IS NULL`` read every row of that snapshot). With
``budget`` = :data:`PRUNE_ROWS_PER_SNAPSHOT` plus the rows the snapshot itself wrote, a
snapshot's cost stays proportional to the tasks that changed, and the walk still overtakes
what later snapshots add.
"""

from __future__ import annotations

import sqlite3

#: the ``meta`` key of the cursor (``"<journal_id> <rowid>"``)
CURSOR_KEY = "snapshot_tasks_pruned"

#: rows walked per snapshot on top of the rows the snapshot wrote [rows]: 4,096 rows cost
#: about 10 ms on a 2-core machine when every one deletes older rows (docs/architecture.md §6)
PRUNE_ROWS_PER_SNAPSHOT = 4096


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


def prune(db: sqlite3.Connection, budget: int, default: tuple[int, int] = (0, 0)) -> int:
    """Walk at most ``budget`` rows of the snapshots at or before the oldest kept one from the
    cursor (``default``: :func:`default_cursor` when none is stored), deleting the rows they
    make unread, and store the cursor (inside the caller's transaction); returns the rows
    walked (fewer than ``budget``: nothing is left to walk for now)."""
    oldest = db.execute("SELECT MIN(journal_id) FROM snapshots").fetchone()[0]
    if oldest is None:
        return 0
    journal_id, rowid = cursor(db, default)
    walked = 0
    while walked < budget and journal_id <= oldest:  # never a snapshot a kept one may need
        rows = db.execute(
            "SELECT rowid, task_id, task IS NULL FROM snapshot_tasks WHERE journal_id = ? AND "
            "rowid > ? ORDER BY rowid LIMIT ?", (journal_id, rowid, budget - walked)).fetchall()
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

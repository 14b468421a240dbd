"""Snapshots of the scheduler's state in the state file: written with their sha256, the two
newest kept, read back checked (docs/architecture.md, "Journal and snapshots").

A snapshot is the whole state (one ``snapshots`` row) or incremental (:class:`SnapshotDelta`:
the state without its tasks, and per task that changed one ``snapshot_tasks`` row); a
snapshot's tasks are then, per task, the newest row at or before it (:func:`tasks_at`). The
task rows no kept snapshot reads are deleted a bounded number per snapshot
(:mod:`offcut.daemon.app.snapshot_prune`).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Iterator

from offcut.daemon.app import snapshot_prune
from offcut.daemon.app.model import task_number


@dataclass(frozen=True)
class SnapshotDelta:
    """An incremental snapshot (:func:`put_snapshot`): ``header``, the state without its
    tasks; ``changed``, the tasks that may have changed since the last snapshot
    (:meth:`Task.to_dict` forms); ``removed``, the ids of the tasks that left the state."""

    header: dict[str, Any]
    changed: list[dict[str, Any]]
    removed: list[str]


def sha256_text(text: str) -> str:
    """The sha256 (hex) of ``text``'s UTF-8 bytes (a snapshot's and a task row's checksum)."""
    return hashlib.sha256(text.encode()).hexdigest()


def tasks_at(db: sqlite3.Connection, journal_id: int) -> list[dict[str, Any]]:
    """The tasks of the incremental snapshot at ``journal_id``: per task the newest
    ``snapshot_tasks`` row at or before it, in submit order, without the tasks that left.

    Raises:
        ValueError: a row whose sha256 does not match (the snapshot is corrupt)."""
    tasks = []
    for task_id, text, digest in db.execute(
            "SELECT t.task_id, t.task, t.sha256 FROM snapshot_tasks t WHERE t.journal_id = "
            "(SELECT MAX(journal_id) FROM snapshot_tasks u WHERE u.task_id = t.task_id AND "
            "u.journal_id <= ?) ORDER BY t.number", (journal_id,)):
        if text is None:
            continue
        if digest is not None and sha256_text(text) != digest:
            raise ValueError(f"sha256 mismatch of task {task_id}")
        tasks.append(json.loads(text))
    return tasks


def snapshots(db: sqlite3.Connection) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """The snapshots of the state file open as ``db``, newest first, each checked as
    :meth:`offcut.daemon.app.store.Store.load` takes it: ``(journal id, state, "")`` for a good
    one (its tasks assembled; ``"incremental"`` popped), ``(journal id, None, why)`` for a
    corrupt one (a sha256 of the snapshot or of one of its task rows that does not match,
    JSON that does not parse). Shared by the daemon's start and ``offcutd check``."""
    sql = ("SELECT s.journal_id, s.state, c.sha256 FROM snapshots s LEFT JOIN "
           "snapshot_checksums c ON c.journal_id = s.journal_id")
    for journal_id, text, digest in db.execute(sql + " ORDER BY 1 DESC").fetchall():
        try:
            if digest is not None and sha256_text(text) != digest:
                raise ValueError("sha256 mismatch")
            state = json.loads(text)
            if state.pop("incremental", False):
                state["tasks"] = tasks_at(db, journal_id)
                state["incremental"] = True
        except (ValueError, TypeError, sqlite3.Error) as exc:
            yield journal_id, None, str(exc)
            continue
        yield journal_id, state, ""


def put_snapshot(db: sqlite3.Connection, journal_id: int,
                 state: "dict[str, Any] | SnapshotDelta",
                 prune_default: tuple[int, int]) -> None:
    """Store a snapshot with its sha256 and keep the two newest (inside the caller's
    transaction; the journal keeps every row after the older one
    (:meth:`offcut.daemon.app.journal.Journal.retire`), so a fallback to it has the rows it needs;
    a fallback to the journal's start needs a journal that was never compacted).

    ``state`` is the whole state (a dict with ``tasks``) or a :class:`SnapshotDelta`: the
    state without its tasks, the tasks that changed since the last snapshot and the ids of
    those that left; its tasks are then rows of ``snapshot_tasks`` (one per task and snapshot
    that changed it, with their sha256; ``task`` NULL: the task left), and a snapshot's tasks
    are, per task, the newest row at or before it (:func:`tasks_at`). ``prune_default``: where
    the walk over unread task rows starts when the file stores no cursor
    (:func:`offcut.daemon.app.snapshot_prune.default_cursor`, taken when the file was opened).
    """
    rows = []
    if isinstance(state, SnapshotDelta):
        header = dict(state.header, incremental=True)
        rows = [(d["task_id"], journal_id, task_number(d["task_id"]), text, sha256_text(text))
                for d in state.changed
                for text in (json.dumps(d, separators=(",", ":")),)]
        rows += [(task_id, journal_id, task_number(task_id), None, None)
                 for task_id in state.removed]
        db.executemany("INSERT OR REPLACE INTO snapshot_tasks VALUES (?, ?, ?, ?, ?)", rows)
    else:
        header = state
    text = json.dumps(header, separators=(",", ":"))
    db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?)", (journal_id, text))
    db.execute("INSERT OR REPLACE INTO snapshot_checksums VALUES (?, ?)",
               (journal_id, sha256_text(text)))
    db.execute("DELETE FROM snapshots WHERE journal_id NOT IN "
               "(SELECT journal_id FROM snapshots ORDER BY journal_id DESC LIMIT 2)")
    db.execute("DELETE FROM snapshot_checksums WHERE journal_id NOT IN "
               "(SELECT journal_id FROM snapshots)")
    # the task rows no kept snapshot reads, a bounded number per snapshot (as many as it
    # wrote and PRUNE_MIN_ROWS more, then more for PRUNE_SECONDS), so that its cost stays
    # that of the tasks that changed even when the one that just became the oldest kept
    # snapshot wrote every task
    snapshot_prune.prune(db, len(rows) + snapshot_prune.PRUNE_MIN_ROWS,
                         snapshot_prune.PRUNE_SECONDS, prune_default)

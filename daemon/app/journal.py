"""The journal of the state file: one row per applied event, with its checksum, its reads
and its retention (docs/architecture.md, "Journal and snapshots").

A row holds the event, the allocation answers used (so a restart re-applies it without
re-solving) and the stored reply (:meth:`offcut.daemon.app.replies.Reply.to_record`, so a
repeated ``(source, seq)`` or request id gets the same answer), each as the application's own
JSON, and the sha256 of its id and content (:func:`journal_checksum`), checked before it is
re-applied. :class:`Journal` works inside the transactions of its
:class:`offcut.daemon.app.store.Store` (it opens none of its own) and reads on the store's
connection or, for long reads, a private read-only one.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any, Iterator

#: journal rows past the retention deleted in each append's transaction (:meth:`Journal.retire`)
JOURNAL_DELETES_PER_APPEND = 16

#: the columns of a journal row that :func:`journal_checksum` covers, in its order, then the
#: stored sha256 (the select of every reader that checks rows)
JOURNAL_ROW_COLUMNS = "id, kind, source, seq, request_id, event, solves, response, sha256"

_JOURNAL_SUM_TAG = b"offcut journal row 1\n"


def journal_checksum(row_id: int, kind: str, source: str | None, seq: int | None,
                     request_id: str | None, event: str, solves: str,
                     response: bytes | str) -> str:
    """The sha256 (hex) stored with a journal row (``journal.sha256``, format 4): over the
    row's id and every content column, each as its UTF-8 bytes (``response`` as stored) with
    its length in front, NULL as ``-`` (so no two rows' columns run together into one text).
    About 2 µs for a row of a few hundred bytes; written in the row's own transaction."""
    parts = [_JOURNAL_SUM_TAG]
    for value in (row_id, kind, source, seq, request_id, event, solves, response):
        if value is None:
            parts.append(b"-")
            continue
        raw = (bytes(value) if isinstance(value, (bytes, bytearray, memoryview))
               else str(value).encode())
        parts.append(b"%d:" % len(raw))
        parts.append(raw)
    return hashlib.sha256(b"".join(parts)).hexdigest()


def journal_row_problem(row: tuple) -> str:
    """Why a journal row (the columns of :data:`JOURNAL_ROW_COLUMNS`; ``sha256`` NULL only in
    rows that a pre-release upgrade to format 4 carried over, which cannot be checked) cannot
    be re-applied: its sha256 does not match its content
    (edited or corrupted after it was written), or its event or solves are not JSON; "" for a
    good row. Shared by the daemon's start (:meth:`offcut.daemon.app.store.Store.load`) and
    ``offcutd check``."""
    *content, digest = row
    if digest is not None and journal_checksum(*content) != digest:
        return "its sha256 does not match its content: edited or corrupted after it was written"
    for name, text in (("event", content[5]), ("solves", content[6])):
        try:
            json.loads(text)
        except (ValueError, TypeError):
            return f"its {name} is not JSON"
    return ""


def journal_row_refusal(path: Path | str, row_id: int, why: str) -> str:
    """The one line of a start refused for a damaged journal row, with the recovery step."""
    return (f"{path}: journal row {row_id} is damaged ({why}); offcutd refuses to re-apply "
            f"it: restore a backup (offcutd check names every such row; docs/operations.md, "
            f"\"Start-up checks and refusals\")")


def damaged_journal_rows(db: sqlite3.Connection, after: int = 0, upto: int | None = None,
                         limit: int = 20, *, parse: bool = True, chunk_rows: int = 500
                         ) -> tuple[list[tuple[int, str]], int]:
    """The damaged journal rows with ``after < id <= upto`` (``upto`` None: to the end), read
    ``chunk_rows`` at a time: ``([(id, why), ...] (the first ``limit``), how many in all)``.
    ``parse``: also check that event and solves are JSON (:func:`journal_row_problem`; without
    it only the sha256 is compared). For ``offcutd check``."""
    bad: list[tuple[int, str]] = []
    count = 0
    end = upto if upto is not None else db.execute(
        "SELECT COALESCE(MAX(id), 0) FROM journal").fetchone()[0]
    while after < end:
        rows = db.execute(f"SELECT {JOURNAL_ROW_COLUMNS} FROM journal WHERE id > ? AND "
                          f"id <= ? ORDER BY id LIMIT ?",
                          (after, end, max(1, int(chunk_rows)))).fetchall()
        if not rows:
            break
        for row in rows:
            if parse:
                why = journal_row_problem(row)
            else:
                why = ("its sha256 does not match its content: edited or corrupted after it "
                       "was written" if row[-1] is not None and
                       journal_checksum(*row[:-1]) != row[-1] else "")
            if why:
                count += 1
                if len(bad) < limit:
                    bad.append((row[0], why))
        after = rows[-1][0]
    return bad, count


class Journal:
    """The ``journal`` table of the state file open as ``db`` (at ``path``, for messages and
    the private read-only connections of :meth:`read`).

    A row's id equals the core revision of its event: each applied event bumps the revision
    by one and appends exactly one row in the same order, and a failed commit reloads the core
    from the file. Retention (:meth:`retire`): rows of events older than the journal's
    retention that no kept snapshot needs are deleted, a few per later append.
    """

    def __init__(self, db: sqlite3.Connection, path: Path):
        self.db = db
        self.path = path
        #: rows up to this id are past the retention, deleted a few per append (:meth:`retire`;
        #: 0: none pending; memory only: the next snapshot marks again)
        self.horizon = 0

    # ------------------------------------------------------------------ writing
    def insert(self, kind: str, event: dict[str, Any], solves: list[dict[str, Any]],
               response: bytes, source: str | None, seq: int | None,
               request_id: str | None) -> int:
        """Insert one row with its sha256 (inside the caller's transaction); its id."""
        # the id SQLite would pick (the largest + 1), taken here for the row's sha256
        row_id = self.db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM journal").fetchone()[0]
        content = (row_id, kind, source, seq, request_id or None,
                   json.dumps(event, separators=(",", ":")),
                   json.dumps(solves, separators=(",", ":")), response)
        cur = self.db.execute(
            "INSERT INTO journal (id, kind, source, seq, request_id, event, solves, "
            "response, sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*content, journal_checksum(*content)))
        return cur.lastrowid

    def delete_retired(self) -> None:
        """Delete up to :data:`JOURNAL_DELETES_PER_APPEND` rows past the retention, oldest
        first (inside the caller's transaction); the mark is cleared once none is left."""
        if not self.horizon:
            return
        deleted = self.db.execute(
            "DELETE FROM journal WHERE id IN (SELECT id FROM journal WHERE id <= ? "
            "ORDER BY id LIMIT ?)", (self.horizon, JOURNAL_DELETES_PER_APPEND)).rowcount
        if deleted < JOURNAL_DELETES_PER_APPEND:
            self.horizon = 0  # caught up

    # ------------------------------------------------------------------ reading
    def count_after(self, after: int) -> int:
        """How many rows have ``id > after``."""
        return self.db.execute("SELECT COUNT(*) FROM journal WHERE id > ?", (after,)
                               ).fetchone()[0]

    def last_id(self) -> int:
        """The id of the newest row (0 for none)."""
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM journal").fetchone()[0]

    def complete(self) -> bool:
        """True when the journal holds every row from 1 to its newest (none missing)."""
        first, last, n = self.db.execute(
            "SELECT COALESCE(MIN(id), 1), COALESCE(MAX(id), 0), COUNT(*) FROM journal").fetchone()
        return first == 1 and n == last

    def read(self, after_id: int = 0, limit: int | None = None, chunk_rows: int = 500
             ) -> Iterator[tuple[int, str, bytes]]:
        """Rows with ``id > after_id`` as ``(id, kind, response)``, oldest first, up to the
        last row committed when the iteration starts, at most ``limit`` rows (None = all);
        ``chunk_rows`` per query on a private read-only connection (WAL: it never blocks the
        daemon's writer and needs none of its locks); closing the iterator closes it."""
        chunk_rows = max(1, int(chunk_rows))
        db = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True,
                             check_same_thread=False)
        try:
            last = db.execute("SELECT COALESCE(MAX(id), 0) FROM journal").fetchone()[0]
            after, left = int(after_id), limit
            while after < last and (left is None or left > 0):
                n = chunk_rows if left is None else min(chunk_rows, left)
                rows = db.execute("SELECT id, kind, response FROM journal WHERE id > ? AND id <= ? "
                                  "ORDER BY id LIMIT ?", (after, last, n)).fetchall()
                if not rows:
                    break
                for row in rows:
                    yield row[0], row[1], bytes(row[2])
                after = rows[-1][0]
                if left is not None:
                    left -= len(rows)
        finally:
            db.close()

    def response_for_seq(self, source: str, seq: int) -> bytes | None:
        """The stored reply to event ``(source, seq)``, or None."""
        row = self.db.execute("SELECT response FROM journal WHERE source = ? AND seq = ?",
                              (source, seq)).fetchone()
        return row[0] if row else None

    def response_for_request(self, request_id: str) -> bytes | None:
        """The stored reply to the submission with ``request_id``, or None."""
        row = self.db.execute("SELECT response FROM journal WHERE request_id = ?",
                              (request_id,)).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------------ retention
    def _first_row_at_or_after(self, t: float, lo: int, hi: int) -> int:
        """The smallest id in ``[lo, hi]`` whose event time is >= ``t`` [s] (hi + 1 when
        none): a binary search, since rows are appended in event-clock order with consecutive
        ids (only a prefix is ever deleted)."""
        hi += 1
        while lo < hi:
            mid = (lo + hi) // 2
            row = self.db.execute("SELECT json_extract(event, '$.time') FROM journal "
                                  "WHERE id = ?", (mid,)).fetchone()
            if row is not None and row[0] is not None and float(row[0]) >= t:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _cut(self, before_time: float) -> int:
        """The last id that retention may delete: rows of events before ``before_time`` [s
        since epoch] that no kept snapshot needs (up to the older of the two kept snapshots);
        0 when none (reads only)."""
        kept = [r[0] for r in self.db.execute(
            "SELECT journal_id FROM snapshots ORDER BY journal_id DESC LIMIT 2")]
        if not kept:
            return 0
        # two subqueries: SQLite answers MIN or MAX alone from the rowid's B-tree, but scans
        # the whole table for both in one select (9 ms at a week of the real log's journal)
        lo, hi = self.db.execute("SELECT (SELECT MIN(id) FROM journal), "
                                 "(SELECT MAX(id) FROM journal)").fetchone()
        if lo is None:
            return 0
        cut = self._first_row_at_or_after(before_time, lo, min(min(kept), hi)) - 1
        return cut if cut >= lo else 0

    def retire(self, before_time: float) -> int:
        """Mark for deletion the rows of events before ``before_time`` [s since epoch] that no
        kept snapshot needs (:meth:`_cut`): the next appends delete
        :data:`JOURNAL_DELETES_PER_APPEND` of them each (:meth:`delete_retired`), in their own
        transaction (reads only here: a snapshot's event does not wait for a thousand deletes;
        a steady daemon appends one row per event, so the deletes keep up). Their idempotency
        keys and history go with them (the retention window: docs/operations.md). Returns the
        last id marked (the horizon, never lowered)."""
        self.horizon = max(self.horizon, self._cut(before_time))
        return self.horizon

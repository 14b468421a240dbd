"""Durable state: a SQLite journal of applied events plus periodic snapshots
(docs/architecture.md, "Journal and snapshots").

Every applied event is one row of ``journal`` holding the event, the allocation answers used
(so a restart re-applies it without re-solving) and the stored reply
(:meth:`offcut.daemon.replies.Reply.to_record`, so a repeated ``(source, seq)`` or request id
gets the same answer). All of it is the application's own JSON, never a wire message. Each row
carries the sha256 of its id and content (:func:`journal_checksum`), checked before it is
re-applied. A row and, when due, a
snapshot of the whole core are written in one transaction before the daemon replies. WAL
mode; ``durability="full"`` (default) fsyncs every commit, so a committed reply survives
``kill -9`` and power loss; ``"normal"`` survives ``kill -9`` only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import sqlite3
import stat
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

from offcut.addresses import make_private_parents
from offcut.daemon import snapshot_prune
from offcut.daemon.model import task_number
from offcut.daemon.storage_errors import classify

log = logging.getLogger("offcut.daemon")

#: journal rows past the retention deleted in each append's transaction (:meth:`Store.retire_journal`)
JOURNAL_DELETES_PER_APPEND = 16
#: archived tasks past their retention that one event's transaction deletes after a snapshot
#: marked them (oldest first; a few per event, as the journal's rows)
ARCHIVE_DELETES_PER_APPEND = 16

#: the state-file format written by this release (``meta`` ``schema_version`` and ``PRAGMA
#: user_version``; CHANGELOG.md). Format 4, the first released one (0.1.0): each journal
#: row's reply and each stored Zeus answer as the application's JSON (docs/architecture.md,
#: "Durability"), each row's sha256 (``journal.sha256``: :func:`journal_checksum`), a Zeus
#: job's trials and observed runs as rows (``zeus_trials``, ``zeus_observations``) beside its
#: small summary in ``zeus_state``, and when each Zeus answer was stored
#: (``zeus_requests.created_at``). A file of an older released format is upgraded in place
#: when opened, after a backup, by the upgrades registered in
#: :data:`offcut.daemon.migrations.UPGRADES` (one per format step).
SCHEMA_VERSION = 4

#: the format of the first release (0.1.0): formats below it were written only by pre-release
#: builds and are refused in one line (:func:`format_refusal`)
FIRST_RELEASED_FORMAT = 4

#: a pre-release commit whose offcutd still reads the pre-release formats 1-3 (it upgrades
#: them to 4 in place; named by the refusal of such a file, for its history)
PRE_RELEASE_READER = "a3dcd09"

#: size the WAL file is truncated to after a checkpoint [bytes]
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024

#: ``PRAGMA application_id`` of an Offcut state file ("OFCT"): a SQLite file with another id is
#: another program's and is refused
APPLICATION_ID = 0x4F464354

#: the tables an Offcut state file may hold (a file with others is refused as foreign)
TABLES = frozenset({"meta", "journal", "snapshots", "snapshot_checksums", "snapshot_tasks",
                    "task_archive",
                    "zeus_state", "zeus_trials", "zeus_observations", "zeus_requests"})

#: damaged ``task_archive`` rows whose ids are remembered (each logged once); past it they
#: are only counted
MAX_BAD_ARCHIVE_ROWS = 1000

_SQLITE_HEADER = b"SQLite format 3\x00"

#: an in-place upgrade of an open state file from one format to the next (runs inside a
#: transaction; raises to leave the file as it was)
Upgrade = Callable[[sqlite3.Connection], None]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
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
CREATE TABLE IF NOT EXISTS zeus_state (
    kind TEXT NOT NULL,
    job_id TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (kind, job_id, batch_size)
);
CREATE TABLE IF NOT EXISTS zeus_requests (
    request_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    response BLOB NOT NULL,
    created_at REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS zeus_trials (
    job_id TEXT NOT NULL,
    trial_number INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    status TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (job_id, trial_number)
);
CREATE INDEX IF NOT EXISTS zeus_trials_open ON zeus_trials(job_id, trial_number)
    WHERE status IN ('running', 'suspended');
CREATE TABLE IF NOT EXISTS zeus_observations (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    reward REAL NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"""



@dataclass(frozen=True)
class SnapshotDelta:
    """An incremental snapshot (:meth:`Store._put_snapshot`): ``header``, the state without
    its tasks; ``changed``, the tasks that may have changed since the last snapshot
    (:meth:`Task.to_dict` forms); ``removed``, the ids of the tasks that left the state."""

    header: dict[str, Any]
    changed: list[dict[str, Any]]
    removed: list[str]


class StoreError(RuntimeError):
    """The state file cannot be opened or is not an Offcut state file."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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
    good row. Shared by the daemon's start (:meth:`Store.load`) and ``offcutd check``."""
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


def _tasks_at(db: sqlite3.Connection, journal_id: int) -> list[dict[str, Any]]:
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
        if digest is not None and _sha256(text) != digest:
            raise ValueError(f"sha256 mismatch of task {task_id}")
        tasks.append(json.loads(text))
    return tasks


def snapshots(db: sqlite3.Connection) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """The snapshots of the state file open as ``db``, newest first, each checked as
    :meth:`Store.load` takes it: ``(journal id, state, "")`` for a good one (its tasks
    assembled; ``"incremental"`` popped), ``(journal id, None, why)`` for a corrupt one (a
    sha256 of the snapshot or of one of its task rows that does not match, JSON that does not
    parse). Shared by the daemon's start and ``offcutd check``."""
    sql = ("SELECT s.journal_id, s.state, c.sha256 FROM snapshots s LEFT JOIN "
           "snapshot_checksums c ON c.journal_id = s.journal_id")
    for journal_id, text, digest in db.execute(sql + " ORDER BY 1 DESC").fetchall():
        try:
            if digest is not None and _sha256(text) != digest:
                raise ValueError("sha256 mismatch")
            state = json.loads(text)
            if state.pop("incremental", False):
                state["tasks"] = _tasks_at(db, journal_id)
                state["incremental"] = True
        except (ValueError, TypeError, sqlite3.Error) as exc:
            yield journal_id, None, str(exc)
            continue
        yield journal_id, state, ""


class StateNotWritable(StoreError):
    """The state file, its ``-wal``/``-shm`` file or its folder cannot be written by this
    process (a mode such as 0400, another owner, a read-only mount): refused at start with
    the recovery step (docs/operations.md, "Read-only or full storage")."""


def check_writable(path: str | Path) -> None:
    """Refuse a state this process could open only read-only (SQLite would silently open it
    read-only, answer reads and fail every write).

    Checks the file and its ``-wal``/``-shm`` files that exist (opened read-write and
    closed at once, nothing written) and the folder (write and search permission: SQLite
    creates the ``-wal``/``-shm`` files there, and the daemon its lock). Missing ones pass
    (they are created later, 0600/0700).

    Raises:
        StateNotWritable: one line naming the file, why, and the recovery step.
    """
    path = Path(path)
    euid = os.geteuid()
    folder = path.absolute().parent
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
        st = folder.stat()
        raise StateNotWritable(
            f"{folder}: the state's folder cannot be written by offcutd (uid {euid}; the folder "
            f"is mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); make it writable "
            f"(chown {euid} {folder}; chmod 700 {folder}), remount it read-write, or run "
            f"offcutd as its owner (docs/operations.md, \"Read-only or full storage\")")
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            fd = os.open(p, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError):
            continue  # missing: created later; a folder: inspect_file names it
        except OSError as exc:
            try:
                st = p.stat()
                how = f"mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"
            except OSError:
                how = "not readable either"
            fix = ("remount it read-write or move the state" if exc.errno == errno.EROFS else
                   f"make it writable (chown {euid} {p}; chmod 600 {p}) or run offcutd as its "
                   f"owner")
            raise StateNotWritable(
                f"{p}: the state cannot be written by offcutd (uid {euid}: "
                f"{exc.strerror}; {how}); {fix} (docs/operations.md, \"Read-only or full "
                f"storage\")") from None
        os.close(fd)


def bad_zeus_rows(db: sqlite3.Connection, limit: int = 20
                  ) -> list[tuple[str, str, int, str]]:
    """Up to ``limit`` damaged ``zeus_state`` rows as ``(kind, job id, batch size, why)``:
    a summary that is not a JSON object (the daemon's start refuses them:
    :meth:`Store.zeus_load`; shared with ``offcutd check``)."""
    bad = []
    for kind, job_id, size, text in db.execute(
            "SELECT kind, job_id, batch_size, state FROM zeus_state"):
        try:
            ok = isinstance(json.loads(text), dict)
            why = "not a JSON object"
        except (ValueError, TypeError) as exc:
            ok, why = False, f"not JSON: {exc}"
        if not ok:
            bad.append((str(kind)[:40], str(job_id)[:80], size, why))
            if len(bad) >= limit:
                break
    return bad


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 when missing (SQLite then creates the ``-wal``
    and ``-shm`` files with the same mode)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass


def inspect_file(path: Path, *, init: bool = False) -> bool:
    """Check what lies at ``path`` before SQLite opens it; True when a new state is to be
    created there (the file is missing, or empty and ``init`` is set).

    Raises:
        StoreError: an empty file without ``init`` (an existing empty file is never taken for
            a new state: it may be a state file truncated by accident), or a file that is not
            SQLite.
    """
    if not path.exists():
        return True
    if path.is_dir():
        raise StoreError(f"{path}: is a folder, not a state file")
    size = path.stat().st_size
    if size == 0:
        if init:
            return True
        raise StoreError(f"{path}: is an empty (0-byte) file, not an Offcut state; if it is "
                         f"meant to become a new one, start once with offcutd --init "
                         f"(docs/operations.md)")
    with open(path, "rb") as f:
        head = f.read(len(_SQLITE_HEADER))
    if head != _SQLITE_HEADER:
        raise StoreError(f"{path}: is not a SQLite file (not an Offcut state file)")
    return False


def format_refusal(path: Path | str, version: int) -> str | None:
    """The one line refusing a state file of format ``version`` (its ``meta``
    ``schema_version``), or None when this offcutd reads it (an older released format is
    upgraded: :class:`Store`'s ``upgrades``).

    A format newer than :data:`SCHEMA_VERSION` was written by a later release; one below
    :data:`FIRST_RELEASED_FORMAT` by a pre-release build (before 0.1.0), whose upgrades are
    not carried: the line says to start on a new state, and which pre-release offcutd
    (:data:`PRE_RELEASE_READER`) still reads the old file."""
    if version > SCHEMA_VERSION:
        return (f"{path}: state-file format {version} is newer than this offcutd's "
                f"({SCHEMA_VERSION}); run the release that wrote it")
    if version < FIRST_RELEASED_FORMAT:
        return (f"{path}: state-file format {version} was written by a pre-release Offcut "
                f"(before 0.1.0, whose state format is {FIRST_RELEASED_FORMAT}); this offcutd "
                f"cannot read it: move it aside and start offcutd on a new state file (the "
                f"pre-release offcutd of commit {PRE_RELEASE_READER} still reads it, e.g. for "
                f"offcut history)")
    return None


def stored_format(db: sqlite3.Connection) -> int | None:
    """The format an existing state file says it is (``meta`` ``schema_version``), or None
    when it has no ``meta`` row yet (a new file)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
                  ).fetchone() is None:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None


def check_identity(db: sqlite3.Connection, path: Path, *, init: bool = False) -> None:
    """Refuse another program's SQLite file (another ``application_id``, or, for a file
    without one, tables Offcut does not write) or a format this offcutd does not read
    (:func:`format_refusal`: a newer one, or a pre-release one).

    Args:
        db: an open connection to the file.
        path: its path (for the messages).
        init: accept a SQLite file without tables (``offcutd --init``).

    Raises:
        StoreError: naming what was found.
    """
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    if app_id not in (0, APPLICATION_ID):
        raise StoreError(f"{path}: a SQLite file of another application "
                         f"(application_id {app_id:#x}, Offcut's is {APPLICATION_ID:#x}); "
                         f"refusing to use it as the state")
    tables = {r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
    foreign = sorted(tables - TABLES)
    if foreign or (app_id == 0 and tables and "meta" not in tables):
        raise StoreError(f"{path}: a SQLite file that is not an Offcut state (tables "
                         f"{', '.join(sorted(tables))}); refusing to use it as the state")
    if app_id == 0 and not tables and not init:
        raise StoreError(f"{path}: an empty SQLite file without Offcut's "
                         f"application_id; start once with offcutd --init to make it a "
                         f"new state (docs/operations.md)")
    user_version = db.execute("PRAGMA user_version").fetchone()[0]
    if user_version > SCHEMA_VERSION:
        raise StoreError(format_refusal(path, user_version))
    version = stored_format(db)
    refusal = format_refusal(path, version) if version is not None else None
    if refusal:
        raise StoreError(refusal)


class Store:
    """The daemon's state file.

    Args:
        path: SQLite file (created with its parent folder if missing).
        snapshot_every: write a full snapshot every this many journal rows (>= 1).
        durability: ``full`` (fsync every commit: a reply survives power loss) or ``normal``
            (WAL without fsync per commit: a reply survives ``kill -9`` of the daemon, the
            last commits may be lost on power loss; ~1 ms less per event).

        upgrades: format -> the upgrade of a file of that format to the next
            (:data:`offcut.daemon.migrations.UPGRADES`); a file of an older released format
            (at least :data:`FIRST_RELEASED_FORMAT`) is upgraded in place after a copy is
            saved next to it as ``<name>.format<N>.bak`` (mode 0600).
        init: take an existing empty file (0 bytes, or SQLite without tables) for a new state.
        quick_check: run ``PRAGMA quick_check`` before using the file (the daemon's start).

    A new file is created 0600 (its ``-wal``/``-shm`` inherit the mode) and marked with
    :data:`APPLICATION_ID` and ``PRAGMA user_version`` = :data:`SCHEMA_VERSION`; writes that fail
    for read-only or full storage raise :mod:`offcut.daemon.storage_errors`' errors.

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
        #: :class:`offcut.daemon.state_lock.StateLock`), or None
        self.on_commit: Callable[[int], None] | None = None
        #: journal rows up to this id are past the retention, deleted a few per append
        #: (:meth:`retire_journal`; 0: none pending; memory only: the next snapshot marks again)
        self._journal_horizon = 0
        self._archive_horizon: float | None = None  # archived tasks finished before: deleted
        #: called with the reason when a write fails for lack of writable storage
        #: (:mod:`offcut.daemon.storage_errors`), and with None at the next write that succeeds
        self.on_storage: Callable[[str | None], None] | None = None
        self.storage_problem: str | None = None
        #: the snapshot :meth:`load` skipped as corrupt (journal id), if any
        self.bad_snapshots: list[int] = []
        #: whether :meth:`load` took an incremental snapshot (tasks as ``snapshot_tasks`` rows)
        self.loaded_incremental = False
        #: the read-only connection of :meth:`_read` (opened at first use) and its lock
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        #: damaged archive rows skipped by reads so far (:meth:`_archived`), and the ids of
        #: those already logged (at most MAX_BAD_ARCHIVE_ROWS)
        self.bad_archive_rows_skipped = 0
        self._bad_archive_ids: set[str] = set()
        if durability not in ("full", "normal"):
            raise StoreError(f"durability must be 'full' or 'normal', not {durability!r}")
        make_private_parents(str(self.path))  # missing folders 0700 (docs/operations.md)
        new = inspect_file(self.path, init=init)
        check_writable(self.path)  # SQLite would open it read-only and fail every write
        if new:
            create_private(self.path)
        try:
            self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            if not new:
                check_identity(self.db, self.path, init=init)
            if quick_check:
                result = [r[0] for r in self.db.execute("PRAGMA quick_check")]
                if result != ["ok"]:
                    raise StoreError(f"{self.path}: integrity check failed: "
                                     f"{'; '.join(map(str, result[:5]))} (docs/operations.md)")
            self.db.execute("PRAGMA journal_mode=WAL")
            # the -wal file is truncated back to this size after a checkpoint (it would
            # otherwise keep its largest size for ever)
            self.db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            self.db.execute(f"PRAGMA synchronous={durability.upper()}")
            self.db.executescript(_SCHEMA)
            version = self._meta("schema_version")
            if version is None:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(version) < SCHEMA_VERSION:  # (refusals were raised by check_identity)
                self._upgrade(int(version), upgrades or {})
            self.db.execute("CREATE INDEX IF NOT EXISTS zeus_requests_created "
                            "ON zeus_requests(created_at)")
            if self.db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            if self.db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            #: where the walk over unread snapshot task rows starts when the file stores no
            #: cursor (taken now, before any new snapshot: snapshot_prune.default_cursor)
            self._prune_default = snapshot_prune.default_cursor(self.db)
        except sqlite3.DatabaseError as exc:
            if getattr(self, "db", None) is not None:
                self.db.close()
            raise StoreError(f"{self.path}: not a usable Offcut state file ({exc})") from exc
        except StoreError:
            self.db.close()
            raise
        self._rows_since_snapshot = self._count_since_snapshot()

    def _upgrade(self, version: int, upgrades: Mapping[int, Upgrade]) -> None:
        """Upgrade the file from ``version`` to :data:`SCHEMA_VERSION`, one format at a time,
        each in one transaction, after saving a copy of the file as it was."""
        missing = [v for v in range(version, SCHEMA_VERSION) if v not in upgrades]
        if missing:
            raise StoreError(f"{self.path}: state-file format {version}, this offcutd writes "
                             f"{SCHEMA_VERSION}; start offcutd on it once to upgrade it")
        backup = self.path.with_name(f"{self.path.name}.format{version}.bak")
        if not backup.exists():
            create_private(backup)
            copy = sqlite3.connect(str(backup))
            try:
                self.db.backup(copy)
            finally:
                copy.close()
        for v in range(version, SCHEMA_VERSION):
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                upgrades[v](self.db)
                self.db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                                (str(v + 1),))
            log.info("state %s: upgraded from format %d to %d (copy of format %d: %s)",
                     self.path, v, v + 1, version, backup)

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _count_since_snapshot(self) -> int:
        last = self.db.execute("SELECT COALESCE(MAX(journal_id), 0) FROM snapshots").fetchone()[0]
        return self.db.execute("SELECT COUNT(*) FROM journal WHERE id > ?", (last,)).fetchone()[0]

    # ------------------------------------------------------------------ reading
    def _read(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Rows of ``sql`` from a second, read-only connection, opened at first use and
        shared under a lock of its own (WAL: it sees committed rows only and never waits for
        the writer's transaction or fsync, so callers need no engine lock)."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro",
                                               uri=True, check_same_thread=False)
            return self._reader.execute(sql, args).fetchall()

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
        if self.db.execute("SELECT COUNT(*) FROM journal WHERE id > ?", (after,)
                           ).fetchone()[0] != max(0, self.last_journal_id() - after):
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
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM journal").fetchone()[0]

    def checkpoint(self) -> None:
        """Copy every committed page from the ``-wal`` into the main file and empty the
        ``-wal`` (at start: the main file alone then holds everything committed so far)."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def journal_complete(self) -> bool:
        """True when the journal holds every row from 1 to its newest (none missing)."""
        first, last, n = self.db.execute(
            "SELECT COALESCE(MIN(id), 1), COALESCE(MAX(id), 0), COUNT(*) FROM journal").fetchone()
        return first == 1 and n == last

    def journal(self, after_id: int = 0, limit: int | None = None, chunk_rows: int = 500
                ) -> Iterator[tuple[int, str, bytes]]:
        """Journal rows with ``id > after_id`` as ``(id, kind, response)``, oldest first, up to
        the last row committed when the iteration starts, at most ``limit`` rows (None = all).

        A row's id equals the core revision of its event: each applied event bumps the
        revision by one and appends exactly one row in the same order, and a failed commit
        reloads the core from this file. So paging by id is paging by ``Decision.revision``.
        Rows older than the journal's retention are deleted (:meth:`retire_journal`): an
        ``after_id`` before the oldest kept row starts at that row.

        Reads ``chunk_rows`` rows per query on a private read-only connection (WAL: it never
        blocks the daemon's writer and needs none of its locks), so a long journal is not
        loaded at once; closing the iterator closes the connection.
        """
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

    # ------------------------------------------------------------------ writing
    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One write transaction; a storage failure (read-only, full) is raised as
        :class:`~offcut.daemon.storage_errors.StateReadOnly` /
        :class:`~offcut.daemon.storage_errors.StateFull` (rolled back, nothing written) and
        reported to :attr:`on_storage`; the next success reports the recovery."""
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                yield
        except sqlite3.Error as exc:
            error = classify(exc, self.path)
            if error is None:
                raise
            if self.db.in_transaction:
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if str(error) != self.storage_problem:  # logged and reported once per problem
                log.error("%s", error)
                self.storage_problem = str(error)
                if self.on_storage is not None:
                    self.on_storage(self.storage_problem)
            raise error from exc
        if self.storage_problem is not None:
            self.storage_problem = None
            log.warning("state %s: writable again", self.path)
            if self.on_storage is not None:
                self.on_storage(None)

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
        pruning = self._archive_horizon is not None  # marked at an earlier snapshot
        gone: dict[str, int] = {}
        with self._writing():  # one transaction
            self._archive(archive)
            if pruning:
                gone = self._prune_archive(self._archive_horizon, ARCHIVE_DELETES_PER_APPEND)
            # the id SQLite would pick (the largest + 1), taken here for the row's sha256
            row_id = self.db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM journal").fetchone()[0]
            content = (row_id, kind, source, seq, request_id or None,
                       json.dumps(event, separators=(",", ":")),
                       json.dumps(solves, separators=(",", ":")), response)
            cur = self.db.execute(
                "INSERT INTO journal (id, kind, source, seq, request_id, event, solves, "
                "response, sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*content, journal_checksum(*content)))
            if state is not None:
                self._put_snapshot(cur.lastrowid, state)
            elif self._journal_horizon:  # rows past the retention, a few per event
                deleted = self.db.execute(
                    "DELETE FROM journal WHERE id IN (SELECT id FROM journal WHERE id <= ? "
                    "ORDER BY id LIMIT ?)",
                    (self._journal_horizon, JOURNAL_DELETES_PER_APPEND)).rowcount
                if deleted < JOURNAL_DELETES_PER_APPEND:
                    self._journal_horizon = 0  # caught up
        if pruning and sum(gone.values()) < ARCHIVE_DELETES_PER_APPEND:
            self._archive_horizon = None  # caught up
        if prune_archive_before is not None:
            before = float(prune_archive_before)
            self._archive_horizon = (before if self._archive_horizon is None
                                     else max(self._archive_horizon, before))
        self._rows_since_snapshot = 0 if state is not None else self._rows_since_snapshot + 1
        if self.on_commit is not None:
            self.on_commit(cur.lastrowid)
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

    # ------------------------------------------------------------------ finished tasks
    # Finished tasks leave the scheduler's state after its retention (SchedulerState.
    # finished_task_retention_s) and are kept here, one row each, readable by id, owner and
    # state, until archive_retention_s after they finished (append's prune_archive_before).
    def _archive(self, tasks: Iterable[dict[str, Any]]) -> None:
        """Insert finished tasks into the archive (inside the caller's transaction; a task
        archived again, when the journal is re-applied, replaces its row)."""
        self.db.executemany(
            "INSERT OR REPLACE INTO task_archive VALUES (?, ?, ?, ?, ?, ?)",
            [(t["task_id"], task_number(t["task_id"]), t["owner"], t["state"],
              float(t["finish_time"] or 0.0), json.dumps(t, separators=(",", ":")))
             for t in tasks])

    def archive_tasks(self, tasks: Iterable[dict[str, Any]]) -> None:
        """Insert finished tasks into the archive in a transaction of their own (recovery)."""
        with self._writing():
            self._archive(tasks)

    def archived_task(self, task_id: str) -> dict[str, Any] | None:
        """An archived task's :meth:`Task.to_dict` form, or None."""
        row = self.db.execute("SELECT task FROM task_archive WHERE task_id = ?",
                              (task_id,)).fetchone()
        return self._archived(task_id, row[0]) if row else None

    def archived_tasks(self, states: Iterable[str] = (), owner: str = "", *,
                       after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Archived tasks in submit order, those in ``states`` (task state values; empty: all)
        of ``owner`` (empty: every owner) whose submit number is above ``after``, at most
        ``limit`` (None: all); committed rows, read without the writer's connection
        (:meth:`_read`), so callers need not hold the engine's lock."""
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
        return [t for t in (self._archived(task_id, text) for task_id, text in
                            self._read(sql, args)) if t is not None]

    def _archived(self, task_id: str, text: Any) -> dict[str, Any] | None:
        """An archive row's task, or None for a damaged row (JSON that does not parse or is
        not a task's object): skipped, so one bad row never fails every listing; logged once
        per row (the first :data:`MAX_BAD_ARCHIVE_ROWS` remembered) and counted in
        :attr:`bad_archive_rows_skipped`."""
        try:
            task = json.loads(text)
            if isinstance(task, dict) and task.get("task_id") == task_id:
                return task
            why = "not this task's record"
        except (ValueError, TypeError) as exc:
            why = f"not JSON: {exc}"
        with self._reader_lock:
            self.bad_archive_rows_skipped += 1
            new = (task_id not in self._bad_archive_ids
                   and len(self._bad_archive_ids) < MAX_BAD_ARCHIVE_ROWS)
            if new:
                self._bad_archive_ids.add(task_id)
        if new:
            log.error("state %s: archived task %r is damaged (%s); skipped in listings "
                      "(run offcutd check; restore a backup to get it back)",
                      self.path, str(task_id)[:80], why)
        return None

    def archived_counts(self) -> dict[str, int]:
        """Archived tasks per state value."""
        return dict(self.db.execute("SELECT state, COUNT(*) FROM task_archive GROUP BY state"))

    def _prune_archive(self, finished_before: float, limit: int) -> dict[str, int]:
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

    # ------------------------------------------------------------------ journal retention
    def _first_row_at_or_after(self, t: float, lo: int, hi: int) -> int:
        """The smallest journal id in ``[lo, hi]`` whose event time is >= ``t`` [s] (hi + 1
        when none): a binary search, since rows are appended in event-clock order with
        consecutive ids (only a prefix is ever deleted)."""
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

    def _journal_cut(self, before_time: float) -> int:
        """The last journal id that retention may delete: rows of events before
        ``before_time`` [s since epoch] that no kept snapshot needs (up to the older of the two
        kept snapshots); 0 when none (reads only)."""
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

    def retire_journal(self, before_time: float) -> int:
        """Mark for deletion the journal rows of events before ``before_time`` [s since
        epoch] that no kept snapshot needs (:meth:`_journal_cut`): the next appends delete
        :data:`JOURNAL_DELETES_PER_APPEND` of them each, in their own transaction (reads only
        here: a snapshot's event does not wait for a thousand deletes; a steady daemon appends
        one row per event, so the deletes keep up). Their idempotency keys and history go with
        them (the retention window: docs/operations.md). Returns the last id marked (the
        horizon, never lowered)."""
        self._journal_horizon = max(self._journal_horizon, self._journal_cut(before_time))
        return self._journal_horizon

    def _put_snapshot(self, journal_id: int, state: "dict[str, Any] | SnapshotDelta") -> None:
        """Store a snapshot with its sha256 and keep the two newest (inside the caller's
        transaction; the journal keeps every row after the older one (retire_journal), so a
        fallback to it has the rows it needs; a fallback to the journal's start needs a journal
        that was never compacted).

        ``state`` is the whole state (a dict with ``tasks``) or a :class:`SnapshotDelta`:
        the state without its tasks, the tasks that changed since the last snapshot and the
        ids of those that left; its tasks are then rows of ``snapshot_tasks`` (one per task
        and snapshot that changed it, with their sha256; ``task`` NULL: the task left), and
        a snapshot's tasks are, per task, the newest row at or before it (:meth:`_tasks_at`).
        """
        rows = []
        if isinstance(state, SnapshotDelta):
            header = dict(state.header, incremental=True)
            rows = [(d["task_id"], journal_id, task_number(d["task_id"]), text, _sha256(text))
                    for d in state.changed
                    for text in (json.dumps(d, separators=(",", ":")),)]
            rows += [(task_id, journal_id, task_number(task_id), None, None)
                     for task_id in state.removed]
            self.db.executemany("INSERT OR REPLACE INTO snapshot_tasks VALUES (?, ?, ?, ?, ?)",
                                rows)
        else:
            header = state
        text = json.dumps(header, separators=(",", ":"))
        self.db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?)", (journal_id, text))
        self.db.execute("INSERT OR REPLACE INTO snapshot_checksums VALUES (?, ?)",
                        (journal_id, _sha256(text)))
        self.db.execute("DELETE FROM snapshots WHERE journal_id NOT IN "
                        "(SELECT journal_id FROM snapshots ORDER BY journal_id DESC LIMIT 2)")
        self.db.execute("DELETE FROM snapshot_checksums WHERE journal_id NOT IN "
                        "(SELECT journal_id FROM snapshots)")
        # the task rows no kept snapshot reads, a bounded number per snapshot (as many as it
        # wrote and PRUNE_MIN_ROWS more, then more for PRUNE_SECONDS), so that its cost stays
        # that of the tasks that changed even when the one that just became the oldest kept
        # snapshot wrote every task
        snapshot_prune.prune(self.db, len(rows) + snapshot_prune.PRUNE_MIN_ROWS,
                             snapshot_prune.PRUNE_SECONDS, self._prune_default)

    # ------------------------------------------------------------------ Zeus optimizers
    # A Zeus job is stored as rows (docs/zeus.md, "Storage"): its small summary (spec, RNG,
    # pruning and bandit state: O(batch sizes)) replaced in ``zeus_state``, one row per trial in
    # ``zeus_trials`` (written when the trial changes) and one per observed run in
    # ``zeus_observations`` (appended); a power profile is one ``zeus_state`` row. So a call
    # writes O(1) rows whatever the job's history. Reads go through the read-only connection
    # (:meth:`_read`).

    def zeus_load(self) -> list[tuple[str, str, int, dict[str, Any]]]:
        """Every stored optimizer object's summary as ``(kind, job_id, batch_size, state)``
        (a job's trials and observed runs: :meth:`zeus_trial_records`,
        :meth:`zeus_observation_rows`)."""
        bad = bad_zeus_rows(self.db, limit=1)
        if bad:
            kind, job_id, size, why = bad[0]
            raise StoreError(f"{self.path}: zeus_state row ({kind}, {job_id}, {size}) is "
                             f"damaged ({why}); restore a backup (docs/operations.md)")
        return [(kind, job_id, bs, json.loads(state)) for kind, job_id, bs, state in
                self.db.execute("SELECT kind, job_id, batch_size, state FROM zeus_state")]

    def zeus_observation_rows(self, job_id: str) -> list[tuple[int, int, float]]:
        """The job's kept observed runs ``(seq, batch size, reward = -cost [J])`` by seq."""
        return [(int(s), int(b), float(r)) for s, b, r in self._read(
            "SELECT seq, batch_size, reward FROM zeus_observations WHERE job_id = ? "
            "ORDER BY seq", (job_id,))]

    def zeus_trial_page(self, job_id: str, before: int, limit: int) -> list[dict[str, Any]]:
        """The stored records of the job's ``limit`` newest trials numbered below ``before``,
        newest first (by primary key: O(limit))."""
        return [json.loads(r) for r, in self._read(
            "SELECT record FROM zeus_trials WHERE job_id = ? AND trial_number < ? "
            "ORDER BY trial_number DESC LIMIT ?", (job_id, int(before), max(0, int(limit))))]

    def zeus_first_finished_trial(self, job_id: str) -> int | None:
        """The lowest number of the job's stored finished trials (None: none)."""
        rows = self._read("SELECT trial_number FROM zeus_trials WHERE job_id = ? AND status "
                          "NOT IN ('running', 'suspended') ORDER BY trial_number LIMIT 1",
                          (job_id,))
        return int(rows[0][0]) if rows else None

    def zeus_trial_records(self, job_id: str, last: int | None = None) -> list[dict[str, Any]]:
        """The job's trial records ascending by number: all (``last`` None), or the open ones
        and the ``last`` newest."""
        if last is None:
            rows = self._read("SELECT record FROM zeus_trials WHERE job_id = ? "
                                   "ORDER BY trial_number", (job_id,))
        else:
            rows = self._read(
                "SELECT record FROM (SELECT trial_number, record FROM zeus_trials "
                "WHERE job_id = ? ORDER BY trial_number DESC LIMIT ?) UNION "
                # literal states: the partial index zeus_trials_open is used only for them
                "SELECT record FROM zeus_trials WHERE job_id = ? AND "
                "status IN ('running', 'suspended')", (job_id, max(0, int(last)), job_id))
            records = [json.loads(r) for r, in rows]
            return sorted(records, key=lambda t: t["trial_number"])
        return [json.loads(r) for r, in rows]

    def zeus_trial_record(self, job_id: str, trial_number: int) -> dict[str, Any] | None:
        """One trial's stored record, or None."""
        rows = self._read("SELECT record FROM zeus_trials WHERE job_id = ? AND "
                               "trial_number = ?", (job_id, int(trial_number)))
        return json.loads(rows[0][0]) if rows else None

    def zeus_response(self, request_id: str, job_id: str) -> bytes | None:
        """The stored reply about ``job_id`` (a Zeus call's answer) under ``request_id`` (a
        key of :func:`offcut.daemon.zeus.registry.request_key`), or None; one query."""
        rows = self._read("SELECT response FROM zeus_requests WHERE request_id = ? AND "
                          "job_id = ?", (request_id, job_id))
        return rows[0][0] if rows else None

    def zeus_write(self, writes: "list[ZeusWrite]", expire_before: float | None = None) -> None:
        """Apply ``writes`` in order in ONE transaction (with ``durability="full"`` one fsync
        for all: the registry's group commit; of several summaries of one object only the
        last is written), and with ``expire_before`` [s, wall clock]
        forget the stored answers created before it (the request-retention window).

        The registry stores a reply only after finding none for ``(request_id, job_id)``
        (its keys name the job: registry, ``request_key``), so a stored reply is never
        replaced by another job's."""
        # a summary that a later write of the batch replaces is not written (the same rows
        # after the transaction, one statement less: group commits batch one job's calls)
        last = {(w.kind, w.job_id, w.batch_size): i for i, w in enumerate(writes)
                if w.state is not None}
        with self._writing():
            for i, w in enumerate(writes):
                if w.state is not None and last[(w.kind, w.job_id, w.batch_size)] == i:
                    state = (w.state if isinstance(w.state, str)
                             else json.dumps(w.state, separators=(",", ":")))
                    self.db.execute("INSERT OR REPLACE INTO zeus_state VALUES (?, ?, ?, ?)",
                                    (w.kind, w.job_id, w.batch_size, state))
                if w.trials:
                    put_zeus_trials(self.db, w.job_id, w.trials)
                if w.observations:
                    put_zeus_observations(self.db, w.job_id, w.observations)
                if w.prune_trials is not None:  # (a bounded range of the primary key)
                    self.db.execute(
                        "DELETE FROM zeus_trials WHERE job_id = ? AND trial_number BETWEEN ? "
                        "AND ? AND status NOT IN ('running', 'suspended')",
                        (w.job_id, *w.prune_trials))
                if w.drop_trials:
                    self.db.executemany(
                        "DELETE FROM zeus_trials WHERE job_id = ? AND trial_number = ?",
                        [(w.job_id, int(n)) for n in w.drop_trials])
                if w.drop_observations:
                    self.db.executemany(
                        "DELETE FROM zeus_observations WHERE job_id = ? AND seq = ?",
                        [(w.job_id, int(s)) for s in w.drop_observations])
                if w.request_id:
                    self.db.execute("INSERT OR REPLACE INTO zeus_requests VALUES (?, ?, ?, ?)",
                                    (w.request_id, w.job_id, w.response, w.created_at))
            if expire_before is not None:
                self.db.execute("DELETE FROM zeus_requests WHERE created_at < ?",
                                (float(expire_before),))

    def zeus_delete_job(self, job_id: str, answer: "ZeusWrite | None" = None) -> None:
        """Remove a job, its trials, observed runs, power profiles and remembered replies
        atomically; then store ``answer``'s reply to its request id (the DeleteJob's own, a
        ``ZeusWrite`` with ``request_id``, ``response`` and ``created_at``) in the same
        transaction."""
        with self._writing():
            for table in ("zeus_state", "zeus_requests", "zeus_trials", "zeus_observations"):
                self.db.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
            if answer is not None and answer.request_id:
                self.db.execute("INSERT OR REPLACE INTO zeus_requests VALUES (?, ?, ?, ?)",
                                (answer.request_id, job_id, answer.response, answer.created_at))

    def close(self) -> None:
        """Close the database connection."""
        if self._reader is not None:
            self._reader.close()
        self.db.close()


def put_zeus_trials(db: sqlite3.Connection, job_id: str, trials: Iterable[dict[str, Any]]
                    ) -> None:
    """Write (insert or replace) ``zeus_trials`` rows of ``job_id``'s trial records: the one
    row format (:meth:`Store.zeus_write`; an upgrade to a later format may write it too)."""
    db.executemany("INSERT OR REPLACE INTO zeus_trials VALUES (?, ?, ?, ?, ?)",
                   [(job_id, int(t["trial_number"]), int(t["batch_size"]), t["status"],
                     json.dumps(t, separators=(",", ":"))) for t in trials])


def put_zeus_observations(db: sqlite3.Connection, job_id: str,
                          observations: Iterable[tuple[int, int, float]]) -> None:
    """Write (insert or replace) ``zeus_observations`` rows of ``job_id``'s observed runs
    ``(seq, batch size, reward = -cost [J])``: the one row format, as :func:`put_zeus_trials`."""
    db.executemany("INSERT OR REPLACE INTO zeus_observations VALUES (?, ?, ?, ?)",
                   [(job_id, int(seq), int(b), float(r)) for seq, b, r in observations])


@dataclass
class ZeusWrite:
    """The rows one Zeus call changes (:meth:`Store.zeus_write`): the object's summary
    (``state``, a dict or its JSON text; None = unchanged) under ``(kind, job_id, batch_size)``, the job's trial
    records that changed (each replaces its row), its newly observed runs ``(seq, batch
    size, reward = -cost [J])``, the answer to ``request_id`` stored at ``created_at`` [s,
    wall clock], and the rows its retention deletes (in the same transaction)."""

    kind: str
    job_id: str
    batch_size: int
    state: dict[str, Any] | str | None
    trials: list[dict[str, Any]] = field(default_factory=list)
    observations: list[tuple[int, int, float]] = field(default_factory=list)
    request_id: str | None = None
    response: bytes | None = None
    created_at: float = 0.0
    #: retention (docs/operations.md): delete the finished trials numbered in this inclusive
    #: range, the trials numbered here, and the observed runs of these seqs
    prune_trials: tuple[int, int] | None = None
    drop_trials: list[int] = field(default_factory=list)
    drop_observations: list[int] = field(default_factory=list)

"""The state file as a whole (docs/architecture.md, "Formats and upgrades"; "Trust and
ownership"): its format number, identity checks (an Offcut file, of a format this release
reads, owned and private), opening with its pragmas and in-place upgrades, and the write
transactions and read-only connections its two writers share: the engine's
:class:`offcut.daemon.app.store.Store` (journal, snapshots, archive) and the Zeus subsystem's
:class:`offcut.daemon.zeus.storage.ZeusStorage` (its own tables and connection on the same
file).
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping

from offcut.addresses import make_private_parents
from offcut.daemon.app.storage_errors import classify

log = logging.getLogger("offcut.daemon")

#: the state-file format written by this release (``meta`` ``schema_version`` and ``PRAGMA
#: user_version``; CHANGELOG.md). Format 4, the first released one (0.1.0): each journal
#: row's reply and each stored Zeus answer as the application's JSON (docs/architecture.md,
#: "Durability"), each row's sha256 (``journal.sha256``: :func:`journal_checksum`), a Zeus
#: job's trials and observed runs as rows (``zeus_trials``, ``zeus_observations``) beside its
#: small summary in ``zeus_state``, and when each Zeus answer was stored
#: (``zeus_requests.created_at``). A file of an older released format is upgraded in place
#: when opened, after a backup, by the upgrades registered in
#: :data:`offcut.daemon.app.migrations.UPGRADES` (one per format step).
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

#: the tables an Offcut state file may hold (a file with others is refused as foreign): the
#: engine's (:data:`_SCHEMA`, created by :class:`Store`) and the Zeus optimizers' (created by
#: :class:`offcut.daemon.zeus.storage.ZeusStorage`, which checks that they are named here)
TABLES = frozenset({"meta", "journal", "snapshots", "snapshot_checksums", "snapshot_tasks",
                    "task_archive",
                    "zeus_state", "zeus_trials", "zeus_observations", "zeus_requests"})

_SQLITE_HEADER = b"SQLite format 3\x00"

#: an in-place upgrade of an open state file from one format to the next (runs inside a
#: transaction; raises to leave the file as it was)
Upgrade = Callable[[sqlite3.Connection], None]

#: the table of the file as a whole (its format), created by every opener
_META_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"


class StoreError(RuntimeError):
    """The state file cannot be opened or is not an Offcut state file."""


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


def stored_format(db: sqlite3.Connection, path: Path | str = "state") -> int | None:
    """The format an existing state file says it is (``meta`` ``schema_version``), or None
    when it has no ``meta`` row yet (a new file). Raises StoreError when the value is not a
    format number (a damaged or edited ``meta``)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
                  ).fetchone() is None:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise StoreError(f"{path}: meta schema_version {row[0]!r} is not a format number: the "
                         "file is damaged; restore a backup (docs/operations.md)") from None


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
    version = stored_format(db, path)
    refusal = format_refusal(path, version) if version is not None else None
    if refusal:
        raise StoreError(refusal)


def open_state_file(path: Path, durability: str, schema: str, *,
                    upgrades: Mapping[int, Upgrade] | None = None, init: bool = False,
                    quick_check: bool = False) -> sqlite3.Connection:
    """A connection to the state file at ``path`` after every check of the file as a whole,
    with ``schema`` (the caller's tables, ``CREATE ... IF NOT EXISTS``) created: shared by the
    engine's :class:`Store` and the Zeus optimizers' storage, each on its own connection.

    Missing folders are created 0700 and a new file 0600 (its ``-wal``/``-shm`` inherit the
    mode), marked with :data:`APPLICATION_ID`, ``PRAGMA user_version`` =
    :data:`SCHEMA_VERSION` and ``meta``'s ``schema_version``; an existing one is checked
    (:func:`inspect_file`, :func:`check_writable`, :func:`check_identity`, ``quick_check``)
    and, of an older released format, upgraded in place by ``upgrades`` after a copy is saved
    next to it (:func:`_upgrade`). WAL mode, ``synchronous`` = ``durability``, the ``-wal``
    truncated to :data:`WAL_SIZE_LIMIT_BYTES` after a checkpoint.

    Raises:
        StoreError, StateNotWritable: as :class:`Store` (the connection is closed then).
    """
    if durability not in ("full", "normal"):
        raise StoreError(f"durability must be 'full' or 'normal', not {durability!r}")
    make_private_parents(str(path))  # missing folders 0700 (docs/operations.md)
    new = inspect_file(path, init=init)
    check_writable(path)  # SQLite would open it read-only and fail every write
    if new:
        create_private(path)
    db = None
    try:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        if not new:
            check_identity(db, path, init=init)
        if quick_check:
            result = [r[0] for r in db.execute("PRAGMA quick_check")]
            if result != ["ok"]:
                raise StoreError(f"{path}: integrity check failed: "
                                 f"{'; '.join(map(str, result[:5]))} (docs/operations.md)")
        db.execute("PRAGMA journal_mode=WAL")
        # the -wal file is truncated back to this size after a checkpoint (it would
        # otherwise keep its largest size for ever)
        db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        db.execute(f"PRAGMA synchronous={durability.upper()}")
        db.executescript(_META_SCHEMA)
        version = stored_format(db, path)
        if version is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif version < SCHEMA_VERSION:  # (refusals were raised by check_identity)
            _upgrade(db, path, version, upgrades or {})
        db.executescript(schema)  # after any upgrade: it may name what an upgrade adds
        if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return db
    except sqlite3.DatabaseError as exc:
        if db is not None:
            db.close()
        raise StoreError(f"{path}: not a usable Offcut state file ({exc})") from exc
    except StoreError:
        if db is not None:
            db.close()
        raise


def _upgrade(db: sqlite3.Connection, path: Path, version: int,
             upgrades: Mapping[int, Upgrade]) -> None:
    """Upgrade the file open as ``db`` from ``version`` to :data:`SCHEMA_VERSION`, one format
    at a time, each in one transaction, after saving a copy of the file as it was
    (``<name>.format<N>.bak``, mode 0600).

    Raises:
        StoreError: a format on the way has no upgrade in ``upgrades``."""
    missing = [v for v in range(version, SCHEMA_VERSION) if v not in upgrades]
    if missing:
        raise StoreError(f"{path}: state-file format {version}, this offcutd writes "
                         f"{SCHEMA_VERSION}; start offcutd on it once to upgrade it")
    backup = path.with_name(f"{path.name}.format{version}.bak")
    if not backup.exists():
        create_private(backup)
        copy = sqlite3.connect(str(backup))
        try:
            db.backup(copy)
        finally:
            copy.close()
    for v in range(version, SCHEMA_VERSION):
        with db:
            db.execute("BEGIN IMMEDIATE")
            upgrades[v](db)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(v + 1),))
        log.info("state %s: upgraded from format %d to %d (copy of format %d: %s)",
                 path, v, v + 1, version, backup)


class WriteTransactions:
    """Write transactions on one connection to the state file, with the storage failures
    they meet reported (one per subsystem's connection: the engine's :class:`Store`, the Zeus
    optimizers' storage).

    ``on_storage`` is called with the reason when a write fails for lack of writable storage
    (:mod:`offcut.daemon.app.storage_errors`), and with None at the next write that succeeds;
    ``storage_problem`` holds the reason meanwhile."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        self.db = db
        self.path = path
        self.on_storage: Callable[[str | None], None] | None = None
        self.storage_problem: str | None = None

    @contextmanager
    def writing(self) -> Iterator[None]:
        """One write transaction (``BEGIN IMMEDIATE``, committed at the end); a storage
        failure (read-only, full) is raised as
        :class:`~offcut.daemon.app.storage_errors.StateReadOnly` /
        :class:`~offcut.daemon.app.storage_errors.StateFull` (rolled back, nothing written) and
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


class ReadOnlyConnection:
    """A second, read-only connection to the state file at ``path``, opened at first use and
    shared under :attr:`lock` (WAL: it sees committed rows only and never waits for the
    writer's transaction or fsync, so its callers need no writer's lock)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def rows(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Every row of ``sql`` with ``args``."""
        with self.lock:
            if self._db is None:
                self._db = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro",
                                           uri=True, check_same_thread=False)
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        """Close the connection (if opened)."""
        with self.lock:
            if self._db is not None:
                self._db.close()
                self._db = None

"""Operator commands on a state file: ``offcutd check`` and ``offcutd backup``
(docs/operations.md).

Both open the file read-only (a ``mode=ro`` URI) and never take the daemon's lock, so they work
while ``offcutd`` runs on it.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

from offcut.daemon.app import snapshot_prune
from offcut.daemon.app.state_lock import StateOwnershipError, check_state_dir, lock_path, read_mark
from offcut.daemon.app.state_file import (SCHEMA_VERSION, StoreError, check_identity,
                                         check_writable, inspect_file, stored_format)
from offcut.daemon.app.journal import damaged_journal_rows
from offcut.daemon.app.snapshots import snapshots
from offcut.daemon.zeus.storage import bad_zeus_rows


class BackupError(RuntimeError):
    """The backup could not be written (the message names the file and why)."""


def _open_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)


def _holder(state: Path) -> int | None:
    """The pid of the live daemon holding ``state``'s lock, or None when none holds it."""
    try:
        fd = os.open(lock_path(state), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_mark(state)[0] or -1
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None


def _check_new_state(state: Path) -> tuple[list[str], bool]:
    """:func:`check_state` of a path with no file: ``offcutd`` creates a new, empty state
    there at its start (docs/operations.md, "Start-up checks and refusals"), so it is fine
    when the start's folder checks pass: the folder private and writable, or, when missing,
    its nearest existing ancestor writable (the start creates each missing level 0700)."""
    out = [f"note: {state}: no such file; offcutd creates a new, empty state there at its "
           "first start"]
    folder = state.absolute().parent
    if folder.is_dir():
        try:
            check_state_dir(state)
            out.append(f"ok: folder {folder} is private to its owner")
            check_writable(state)
            out.append(f"ok: writable by uid {os.geteuid()}")
        except (StateOwnershipError, StoreError) as exc:
            return out + [f"FAIL: {exc}"], False
        return out, True
    above = folder
    while not above.exists():
        above = above.parent
    if not (above.is_dir() and os.access(above, os.W_OK | os.X_OK, effective_ids=True)):
        return out + [f"FAIL: {folder} does not exist and {above} cannot be written by uid "
                      f"{os.geteuid()}: create {folder} (mode 0700, owned by offcutd's "
                      "user)"], False
    out.append(f"ok: {folder} does not exist; offcutd creates it (mode 0700, each missing "
               "level)")
    return out, True


class _Findings:
    """The lines :func:`check_state` prints, and whether ``offcutd`` would start."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ok = True

    def add(self, line: str) -> None:
        """One ``ok: ...`` or ``note: ...`` line."""
        self.lines.append(line)

    def fail(self, msg: str) -> None:
        """One ``FAIL: ...`` line: ``offcutd`` would refuse to start."""
        self.ok = False
        self.lines.append(f"FAIL: {msg}")


def check_state(state: str | Path) -> tuple[list[str], bool]:
    """Every start-up check of ``offcutd`` on ``state``, read-only.

    Returns:
        ``(findings, ok)``: one line per check (``ok: ...``, ``FAIL: ...``, ``note: ...``),
        and whether ``offcutd`` would start on the file. A missing file is a ``note`` (the
        start creates a new state there), ok when its folder passes the start's checks.
    """
    state = Path(state)
    if not state.exists():
        return _check_new_state(state)
    f = _Findings()
    try:
        check_state_dir(state)
        f.add(f"ok: folder {state.absolute().parent} is private to its owner")
    except StateOwnershipError as exc:
        f.fail(str(exc))
    try:
        check_writable(state)  # as the daemon's start (for the user running this command)
        f.add(f"ok: writable by uid {os.geteuid()}")
    except StoreError as exc:
        f.fail(str(exc))
        return f.lines, f.ok  # (opening it now would leave -wal/-shm files of its mode behind)
    holder = _holder(state)
    f.add(f"note: in use by offcutd pid {holder}" if holder else "note: no offcutd holds it")
    try:
        inspect_file(state)
    except StoreError as exc:
        f.fail(str(exc))
        return f.lines, f.ok
    try:
        db = _open_ro(state)
    except sqlite3.Error as exc:
        f.fail(f"{state}: cannot be opened read-only ({exc})")
        return f.lines, f.ok
    try:
        _check_contents(db, state, holder, f)
    finally:
        db.close()
    return f.lines, f.ok


def _check_contents(db: sqlite3.Connection, state: Path, holder: int | None,
                    f: _Findings) -> None:
    """:func:`check_state` of the open file ``db``: its identity, SQLite's ``quick_check``,
    its format, the journal and snapshots (:func:`_check_journal`), the Zeus rows, the
    snapshot rows still to prune, and (when no daemon holds it: ``holder`` None) that every
    acknowledged journal row is present. Stops at the first finding that makes the rest
    meaningless (not an Offcut file, a failed ``quick_check``)."""
    try:
        check_identity(db, state)
        f.add("ok: an Offcut state file")
    except StoreError as exc:
        f.fail(str(exc))
        return
    result = [r[0] for r in db.execute("PRAGMA quick_check")]
    if result == ["ok"]:
        f.add("ok: quick_check")
    else:
        f.fail(f"quick_check: {'; '.join(map(str, result[:5]))}")
        return
    version = stored_format(db) or SCHEMA_VERSION
    if version < SCHEMA_VERSION:  # (a released one: check_identity refused the others)
        f.add(f"note: format {version}; offcutd upgrades it to {SCHEMA_VERSION} at start")
    else:
        f.add(f"ok: format {version}")
    last = _check_journal(db, f)
    for kind, job_id, size, why in bad_zeus_rows(db):
        f.fail(f"zeus_state row ({kind}, {job_id}, {size}) is damaged ({why}); offcutd "
               f"refuses to start on it: restore a backup")
    waiting = snapshot_prune.backlog(db, snapshot_prune.default_cursor(db))
    if waiting:
        f.add(f"note: {waiting} task rows of older snapshots are still to be deleted "
              f"(a few hundred at each snapshot; they only take disk space)")
    mark = read_mark(state)[1]
    if mark is not None and not holder:
        if last < mark:
            f.fail(f"journal rows {last + 1}..{mark} were acknowledged but are gone (a "
                   f"deleted or truncated -wal file)")
        else:
            f.add(f"ok: every acknowledged journal row is present (last {mark})")


def _check_journal(db: sqlite3.Connection, f: _Findings) -> int:
    """The journal and snapshot checks of :func:`check_state`, as the daemon's start makes
    them: the rows present, each snapshot, the rows after the newest good snapshot (all
    there, each row's sha256 and JSON sound: they are re-applied) and the older ones (only
    noted: they answer repeated requests and ``offcut history``). Returns the last row's id
    (0 for an empty journal)."""
    first, last, n = db.execute("SELECT COALESCE(MIN(id), 1), COALESCE(MAX(id), 0), "
                                "COUNT(*) FROM journal").fetchone()
    complete = first == 1 and n == last
    f.add(f"{'ok' if complete else 'note'}: journal rows {first}..{last} ({n} rows"
          f"{'' if complete else ', some missing'})")
    good, found, base = 0, [], 0  # base: the newest good snapshot's row (the daemon's start)
    for journal_id, state_, why in snapshots(db):  # newest first, as the daemon's start reads
        found.append(journal_id)
        if state_ is None:
            f.add(f"note: snapshot at journal row {journal_id} is corrupt ({why}); "
                  f"offcutd falls back to an older one (or the journal's start)")
        else:
            base = base or journal_id
            good += 1
            f.add(f"ok: snapshot at journal row {journal_id}")
    if found and not good and not complete:
        f.fail("no good snapshot and the journal does not start at row 1: restore a backup")
    # the rows the daemon re-applies (after the newest good snapshot) must all be there
    needed = db.execute("SELECT COUNT(*) FROM journal WHERE id > ?", (base,)).fetchone()[0]
    if needed != max(0, last - base):
        f.fail(f"journal rows after row {base} (the snapshot the daemon starts from) have "
               f"gaps: {needed} of {last - base} present; offcutd refuses to re-apply them: "
               f"restore a backup")
    # each row the daemon re-applies is checked as its start checks it (sha256, JSON)
    bad, count = damaged_journal_rows(db, after=base)
    for row_id, why in bad:
        f.fail(f"journal row {row_id} is damaged ({why}); offcutd refuses to re-apply it "
               f"(it re-applies the rows after row {base}): restore a backup")
    if count > len(bad):
        f.fail(f"{count - len(bad)} more damaged journal rows after row {base}")
    if not count:
        f.add(f"ok: journal rows after row {base} (re-applied at start) check out")
    # older rows are not re-applied, but answer repeated requests and offcut history
    older, count = damaged_journal_rows(db, after=0, upto=base, limit=5, parse=False)
    if count:
        f.add(f"note: {count} journal rows up to row {base} are damaged (their sha256 "
              f"does not match: rows {', '.join(str(i) for i, _ in older)}"
              f"{', ...' if count > len(older) else ''}); offcutd does not re-apply "
              f"them but answers repeated requests and offcut history from them: "
              f"restore a backup to get them back")
    return last


def backup_state(state: str | Path, to: str | Path) -> int:
    """Copy ``state`` to ``to`` (created 0600, must not exist) with SQLite's online backup
    API: a consistent copy of the last committed state, also while ``offcutd`` writes.

    Returns:
        The number of pages copied.

    Raises:
        BackupError: ``state`` is missing or unusable, or ``to`` exists or cannot be written.
    """
    state, to = Path(state), Path(to)
    if not state.is_file():
        raise BackupError(f"{state}: no such state file")
    try:
        inspect_file(state)
    except StoreError as exc:
        raise BackupError(str(exc)) from None
    try:
        fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise BackupError(f"{to}: exists; refusing to overwrite it") from None
    except OSError as exc:
        raise BackupError(f"{to}: cannot be created ({exc.strerror})") from None
    os.close(fd)
    try:
        src = _open_ro(state)
        dst = sqlite3.connect(str(to))
        try:
            src.backup(dst)
            pages = dst.execute("PRAGMA page_count").fetchone()[0]
        finally:
            dst.close()
            src.close()
    except sqlite3.Error as exc:
        to.unlink(missing_ok=True)
        raise BackupError(f"{state} -> {to}: {exc}") from None
    return pages

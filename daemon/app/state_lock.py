"""Ownership of the state file: one daemon per state, in a private folder
(docs/operations.md).

:class:`StateLock` holds an exclusive ``fcntl.flock`` on ``<state>.lock`` (0600, next to the
state file) for the daemon's lifetime; the file holds the holder's pid and the id of the last
journal row it committed (the *commit mark*), so the next start notices acknowledged rows that
vanished with a deleted or truncated ``-wal`` (:meth:`StateLock.previous_mark`).
:func:`check_state_dir` refuses a folder writable by group or others or owned by another user,
as ssh does with ``~/.ssh``.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path


class StateOwnershipError(RuntimeError):
    """The state is held by another daemon, or its folder is not private to this user."""


def lock_path(state: str | Path) -> Path:
    """The lock file of ``state``: ``<state>.lock`` next to it."""
    state = Path(state)
    return state.with_name(state.name + ".lock")


def check_state_dir(state: str | Path, uid: int | None = None) -> None:
    """Refuse a state folder writable by group or others, or not owned by ``uid`` (default:
    this process's user); root-owned folders are accepted for any user only when not writable
    by others than root.

    Raises:
        StateOwnershipError: naming the folder and what is wrong with it.
    """
    uid = os.getuid() if uid is None else uid
    folder = Path(state).absolute().parent
    st = folder.stat()
    if st.st_uid not in (uid, 0):
        raise StateOwnershipError(
            f"state folder {folder} is owned by uid {st.st_uid}, not by this daemon's user "
            f"(uid {uid}); another user could replace the state file (docs/operations.md)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateOwnershipError(
            f"state folder {folder} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); make it private: chmod 0700 {folder} "
            f"(docs/operations.md)")


def read_mark(state: str | Path) -> tuple[int | None, int | None]:
    """``(pid, last journal id)`` recorded in ``state``'s lock file, None where absent or
    unreadable (a damaged file is read as far as it makes sense, never raises)."""
    try:
        text = lock_path(state).read_bytes().decode("ascii", "replace")
    except OSError:
        return None, None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if value.isascii() and value.isdigit():
            values[key] = int(value)
    return values.get("pid"), values.get("last_journal_id")


class StateLock:
    """An exclusive lock on ``state`` held until :meth:`release` (or the process ends: the
    kernel drops ``flock`` locks of a dead process, so a ``kill -9`` leaves no stale lock).

    Args:
        state: the state file's path.

    Raises:
        StateOwnershipError: another live process holds the lock (its pid is named), or the
            lock file cannot be opened (e.g. it is a symbolic link).
    """

    def __init__(self, state: str | Path):
        self.path = lock_path(state)
        try:  # O_NOFOLLOW: a link planted as the lock file is refused, never written through
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateOwnershipError(
                f"cannot open the lock file {self.path}: {exc.strerror}"
                + (" (it is a symbolic link: remove it)" if self.path.is_symlink() else "")
                + " (docs/operations.md)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = read_mark(state)[0]
            raise StateOwnershipError(
                f"state {state} is in use by another offcutd (pid {pid if pid else 'unknown'}, "
                f"lock {self.path}); stop it first, or give this daemon another --state") from None
        os.fchmod(fd, 0o600)
        # read under the lock: a daemon still stopping writes its last mark before it lets go
        self.previous_mark = read_mark(state)[1]
        self._fd: int | None = fd
        self.mark(self.previous_mark)

    def mark(self, last_journal_id: int | None) -> None:
        """Record this daemon's pid and the last committed journal id (no fsync: the mark is
        meant to survive the daemon's death, not a power loss)."""
        if self._fd is None:
            return
        text = f"pid {os.getpid()}\n"
        if last_journal_id is not None:
            text += f"last_journal_id {last_journal_id}\n"
        data = text.encode().ljust(64)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        """Drop the lock (the file stays, holding the last mark). A second call does nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

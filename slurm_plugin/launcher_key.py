"""The launcher's secret key: how a launcher recognises its own Slurm jobs and names the tasks'
checkpoint folders so that no other user can guess them (docs/security.md, "Round two: whose
job it is, and checkpoint folders").

Why a key. A job's name (``PREFIX-TASK.GEN-NODE``) is public and any user may submit a job so
named in the partition; Slurm records who a job's user is (``user_id``), but nothing about who
submitted it or why (root's ``sbatch --uid`` leaves no trace, and the submit line is kept only
from 23.02). So the launcher marks its jobs itself: ``sbatch --comment=offcut1:TAG``, where
``TAG`` is an HMAC-SHA256 (RFC 2104) under a secret only the launcher reads of the job's name
and the uid it runs as. Anyone may read the comment (squeue shows it), but no one without the
key can make a tag for another name or another uid, so a copied comment does not fit a job of
another user, nor another job. A restarted launcher recognises its jobs by the tag (and, while
it runs, by the job ids it recorded at submit). The same key gives each task's checkpoint
folder an unguessable name (:meth:`LauncherKey.checkpoint_suffix`), stable across the task's
generations and launcher restarts.

Alternatives weighed: ``--wckey`` is dropped by Slurm unless ``TrackWCKey`` is on; the batch
script cannot be read by the launcher for a job of another user without root and costs one
``scontrol`` call per job; a random nonce per job would have to be stored by the launcher
(a state file) to survive restarts, which the key avoids.

The key file: 32 random bytes (:func:`secrets.token_hex`, 64 hex characters and a newline),
created on first use with mode 0600 in a folder created 0700, read only when it is a regular
file (not a link), owned by the launcher's user and readable by no one else. Losing it (a
reinstalled launcher host) makes a restarted launcher ignore the jobs still running (they end,
or are preempted, by themselves) and gives every running task a new, empty checkpoint folder:
back it up with the daemon's state (docs/operations.md).

Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

#: bytes of the secret (HMAC-SHA256's block is 64; 32 is its output size, RFC 2104 section 3)
KEY_BYTES = 32
#: what starts the comment of a job the launcher submitted (version 1 of the tag)
TAG_PREFIX = "offcut1:"
#: hex characters of a job's tag (128 bits) and of a checkpoint folder's suffix (64 bits)
TAG_HEX = 32
SUFFIX_HEX = 16


class LauncherKeyError(OSError):
    """The key file cannot be created or read, or is unsafe (a link, not the launcher's, or
    readable by others); the message names the file and what to do."""


def default_key_path() -> Path:
    """``$XDG_STATE_HOME/offcut/launcher.key`` (``~/.local/state/offcut/`` without it), beside
    the daemon's default state file (offcut.daemon.config.default_state)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "offcut" / "launcher.key"


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LauncherKeyError(f"launcher key {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise LauncherKeyError(f"launcher key {path} belongs to uid {st.st_uid}, not to the "
                                   f"launcher's user (uid {os.geteuid()}): remove it")
        if st.st_mode & 0o077:
            raise LauncherKeyError(f"launcher key {path} has mode {stat.S_IMODE(st.st_mode):04o}: "
                                   "others may have read it; remove it (a new one is made) or "
                                   "chmod 600 it if no one did")
        text = os.read(fd, 4 * KEY_BYTES).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != KEY_BYTES:
        raise LauncherKeyError(f"launcher key {path} does not hold {2 * KEY_BYTES} hex "
                               "characters: remove it (a new one is made)")
    return secret


class LauncherKey:
    """A launcher's secret (``KEY_BYTES`` bytes) and what it signs.

    Args:
        secret: the key's bytes (at least 16).

    Raises:
        ValueError: a secret shorter than 16 bytes.
    """

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("a launcher key has at least 16 bytes")
        self._secret = bytes(secret)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "LauncherKey":
        """The key of ``path`` (default :func:`default_key_path`), created (mode 0600, its
        folder 0700) when missing; two launchers starting at once read the same one
        (``O_EXCL``).

        Raises:
            LauncherKeyError: the file is a link, not a regular file, not the launcher's user's,
                readable or writable by others, not 64 hex characters, or cannot be made.
        """
        path = Path(path) if path else default_key_path()
        try:
            return cls(_read(path))
        except FileNotFoundError:
            pass
        except LauncherKeyError:
            raise
        except OSError as exc:
            raise LauncherKeyError(f"launcher key {path} cannot be read ({exc.strerror or exc}; "
                                   "a link is refused)") from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:  # another launcher made it a moment ago
            return cls(_read(path))
        except OSError as exc:
            raise LauncherKeyError(f"launcher key {path} cannot be created "
                                   f"({exc.strerror or exc})") from None
        try:
            os.write(fd, (secrets.token_hex(KEY_BYTES) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return cls(_read(path))

    def _mac(self, *parts: str) -> str:
        msg = "\0".join(parts).encode("utf-8", "surrogateescape")
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()

    def job_tag(self, name: str, uid: int) -> str:
        """The comment of the launcher's job ``name`` that runs as ``uid``:
        ``offcut1:`` + 32 hex of HMAC-SHA256(key, ``"job" NUL name NUL uid``)."""
        return TAG_PREFIX + self._mac("job", name, str(int(uid)))[:TAG_HEX]

    def is_tag(self, comment: str, name: str, uid: int | None) -> bool:
        """Whether ``comment`` is :meth:`job_tag` of (``name``, ``uid``): the job was
        submitted by a launcher with this key, for that uid (compared in constant time)."""
        if uid is None or not comment.startswith(TAG_PREFIX):
            return False
        return hmac.compare_digest(comment.strip(), self.job_tag(name, uid))

    def checkpoint_suffix(self, task_id: str, owner: str) -> str:
        """16 hex characters of HMAC-SHA256(key, ``"checkpoint" NUL task id NUL owner``): the
        part of a task's checkpoint folder name (``TASKID-SUFFIX``) no other user can guess
        (a task id alone is sequential). The same for every generation of the task."""
        return self._mac("checkpoint", task_id, owner)[:SUFFIX_HEX]

"""A unix socket path held by one server for its lifetime: the daemon's gRPC socket and the
node power helper's socket share this rule (docs/security.md, "Round two: sockets and tokens").

A server that listens on a unix socket path used to check the path (nothing answers there) and
then bind it, and to unlink the path when it stopped. Both steps race with a second server on
the same path: two servers starting together both pass the check and the later bind replaces
the earlier one's socket; a server that stops removes whatever socket is at the path by then,
possibly a successor's (gRPC's own listener even unlinks its bound path at shutdown).

:class:`SocketPathClaim` closes both:

1. **one server per path**: an exclusive ``fcntl.flock`` on ``<path>.lock`` (0600, opened with
   ``O_NOFOLLOW`` in the socket's folder, which must be trusted:
   :func:`offcut.addresses.untrusted_socket_dir`), held for the server's lifetime; the check
   of what lies at the path and the publication of the new socket both happen under it, so
   two servers can never both pass the check. A second server is refused naming the lock and
   its holder's pid. The kernel drops the lock of a killed server, so ``kill -9`` leaves no
   stale lock (its socket file is then replaced by the next start). A server that stops
   removes the lock file while it still holds the lock; one that locks a file checks that it
   is still the file at the path (else it retries), so a removed file is never locked twice.
2. **the path changes only atomically, and only to the holder's socket**: the server binds a
   fresh random name in the same folder (:attr:`SocketPathClaim.bind_path`), gives it its mode,
   and :meth:`SocketPathClaim.publish` ``rename()``\\ s it over the path (atomic: a client sees
   the old socket or the new one, never no socket and never a loose mode), recording the
   socket's ``(st_dev, st_ino)``.
3. **only the binder unlinks**: :meth:`SocketPathClaim.release` unlinks the path only when it
   still is that inode (a successor's socket, or anything else put there, is left in place),
   then drops the lock. A listener that unlinks its own bound name at shutdown (gRPC) finds
   the random name gone and touches nothing.

Why a lock file rather than the rename alone: a rename cannot tell a stale socket from a live
one of a server that does not take the lock (an older release, another program); under the
lock the live-socket probe and the rename cannot interleave with another cooperating server,
and a server that does not take the lock is still refused while it answers. What remains: a
process of the folder's owner (or root) that ignores the lock can still replace the socket
between the probe and the rename; the folder's trust rule keeps everyone else out.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import socket
import stat

from offcut.addresses import untrusted_socket_dir

log = logging.getLogger("offcut.unix_socket")

#: longest unix socket path the kernel accepts [bytes] (``sun_path`` is 108 bytes with its NUL)
MAX_SOCKET_PATH = 107


class SocketPathError(RuntimeError):
    """The socket path cannot be taken: an untrusted folder, another server holds it or
    answers on it, something that is not a socket lies there, or the path is too long. The
    message (one line) names the path and what to do."""


def lock_path(path: str) -> str:
    """The lock file of socket ``path``: ``<path>.lock`` next to it."""
    return path + ".lock"


def _holder_pid(fd: int) -> str:
    """The pid recorded in an open lock file (``'unknown'`` when unreadable)."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace")
    except OSError:
        return "unknown"
    word = text.partition("pid ")[2].split("\n", 1)[0].strip()
    return word if word.isdigit() else "unknown"


def _answers(path: str) -> bool:
    """Whether a process accepts connections on unix socket ``path``.

    Raises:
        SocketPathError: the probe failed other than refused/absent (e.g. no permission to
            connect: then it cannot be told whether the socket is live).
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        raise SocketPathError(f"{path}: cannot tell whether a process listens on it "
                              f"({exc.strerror or exc}); refusing to replace it") from None
    finally:
        probe.close()
    return True


class SocketPathClaim:
    """The exclusive right to serve unix socket ``path`` (module docstring: the rule).

    Usage: ``claim = SocketPathClaim(path)``; bind the listener to :attr:`bind_path`;
    ``claim.publish(mode)``; ... ; stop the listener; ``claim.release()``.

    Args:
        path: the socket's path (absolute or relative; its folder must exist and be trusted
            by this process's user: :func:`offcut.addresses.untrusted_socket_dir`).

    Raises:
        SocketPathError: the folder could be another user's; the path is longer than
            :data:`MAX_SOCKET_PATH` bytes; another server holds ``<path>.lock`` (its pid is
            named) or a process answers on the path; the path is taken by something that is
            not a socket; the lock file cannot be opened (e.g. it is a symbolic link).
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.lock_path = lock_path(self.path)
        folder = os.path.dirname(self.path)
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise SocketPathError(f"{self.path}: longer than {MAX_SOCKET_PATH} bytes, the "
                                  "longest unix socket path; choose a shorter one")
        reason = untrusted_socket_dir(self.path, os.getuid())
        if reason:
            raise SocketPathError(f"refusing to listen on {self.path}: {reason}")
        self._identity: tuple[int, int] | None = None
        self._published = False
        fd = self._lock()
        self._fd: int | None = fd
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
            self._check_path()
            #: where the listener binds: a fresh name in the socket's folder, renamed over
            #: :attr:`path` by :meth:`publish`
            self.bind_path = self._fresh_name(folder)
        except BaseException:
            self.release()
            raise

    def _lock(self) -> int:
        """Open and lock :attr:`lock_path` (the lock file is removed by :meth:`release`
        under the lock, so a lock taken on a file that was removed meanwhile is retried on the
        new one: only the file at the path counts). Returns the open descriptor."""
        for _ in range(10):
            try:  # O_NOFOLLOW: a link planted as the lock file is refused, never written through
                fd = os.open(self.lock_path,
                             os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                link = exc.errno == errno.ELOOP
                raise SocketPathError(f"cannot open the socket's lock file {self.lock_path}: "
                                      f"{exc.strerror}" + (" (a symbolic link: remove it)"
                                                           if link else "")) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder_pid(fd)
                os.close(fd)
                raise SocketPathError(
                    f"{self.path}: another process is listening on it (pid {pid} holds "
                    f"{self.lock_path}: a second offcutd or power helper?); refusing to take "
                    "the socket over") from None
            mine = os.fstat(fd)
            try:
                there = os.lstat(self.lock_path)
            except FileNotFoundError:
                there = None
            if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
            os.close(fd)  # the holder removed it as it stopped: lock the new one
        raise SocketPathError(f"{self.lock_path}: keeps being replaced; cannot lock it")

    def _check_path(self) -> None:
        """Refuse what lies at :attr:`path` unless it is nothing or a stale socket (nothing
        answers: a killed server's). Called under the lock."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketPathError(f"{self.path} exists and is not a socket; refusing to "
                                  "replace it")
        if _answers(self.path):
            raise SocketPathError(f"{self.path}: another process is listening on it (a second "
                                  "offcutd or power helper, one that takes no lock?); refusing "
                                  "to take the socket over")
        # a stale socket: left in place until publish() renames the new one over it

    def _fresh_name(self, folder: str) -> str:
        """A random name in ``folder`` no longer than the kernel allows (``.`` + the socket's
        name + 8 hex digits when that fits, else ``.`` + 8 hex digits)."""
        tag = secrets.token_hex(4)
        for name in (f".{os.path.basename(self.path)}.{tag}", f".{tag}"):
            candidate = os.path.join(folder, name)
            if len(os.fsencode(candidate)) <= MAX_SOCKET_PATH:
                return candidate
        raise SocketPathError(f"{self.path}: its folder's path is too long for a unix socket "
                              f"({MAX_SOCKET_PATH} bytes in all); choose a shorter one")

    @property
    def identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the published socket (None before :meth:`publish`)."""
        return self._identity

    def publish(self, mode: int) -> None:
        """Give the socket bound at :attr:`bind_path` its ``mode`` and rename it over
        :attr:`path` (atomic), recording its device and inode.

        Raises:
            SocketPathError: nothing is bound at :attr:`bind_path`, or the claim was
                released.
        """
        if self._fd is None:
            raise SocketPathError(f"{self.path}: the claim was released")
        try:
            st = os.lstat(self.bind_path)
        except FileNotFoundError:
            raise SocketPathError(f"{self.bind_path}: no socket was bound there") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketPathError(f"{self.bind_path} is not a socket")
        os.chmod(self.bind_path, mode)
        os.rename(self.bind_path, self.path)
        self._identity = (st.st_dev, st.st_ino)
        self._published = True

    def owns_path(self) -> bool:
        """Whether :attr:`path` is still the socket this claim published."""
        if self._identity is None:
            return False
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def release(self) -> None:
        """Remove the published socket if :attr:`path` still is it (a successor's socket,
        or anything else put there since, stays), remove an unpublished bound name, remove the
        lock file and drop the lock. A second call does nothing. Call it after the listener
        stopped."""
        if self._fd is None:
            return
        try:
            if self._published:
                if self.owns_path():
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                elif os.path.lexists(self.path):
                    log.warning("%s is no longer this server's socket (another one replaced "
                                "it); left in place", self.path)
            elif getattr(self, "bind_path", None):
                try:
                    if stat.S_ISSOCK(os.lstat(self.bind_path).st_mode):
                        os.unlink(self.bind_path)
                except FileNotFoundError:
                    pass
        finally:
            fd, self._fd = self._fd, None
            try:  # removed under the lock (a server locking it next checks it is the file there)
                st, there = os.fstat(fd), os.lstat(self.lock_path)
                if (st.st_dev, st.st_ino) == (there.st_dev, there.st_ino):
                    os.unlink(self.lock_path)
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __repr__(self) -> str:
        return f"SocketPathClaim({self.path!r}, published={self._published})"

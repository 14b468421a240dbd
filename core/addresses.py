"""Default locations shared by the daemon and its clients."""

from __future__ import annotations

import os
import stat


def _default_base() -> str:
    """The folder the default socket's ``offcut/`` folder lives in: ``$XDG_RUNTIME_DIR``, else
    ``/tmp/offcut-<uid>`` (a name another local user can predict and create first)."""
    return os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/offcut-{os.getuid()}"


def default_socket() -> str:
    """The daemon's default address: ``unix://$XDG_RUNTIME_DIR/offcut/offcutd.sock``
    (``unix:///tmp/offcut-<uid>/offcut/offcutd.sock`` when ``XDG_RUNTIME_DIR`` is unset)."""
    return f"unix://{_default_base()}/offcut/offcutd.sock"


def untrusted_socket_dir(socket_path: str, uid: int, trusted_owners: tuple[int, ...] = ()
                         ) -> str | None:
    """Why the folder of unix socket ``socket_path`` cannot be trusted by user ``uid``, else
    None (like ssh with ``~/.ssh``): a process that can write there can put its own socket in
    the daemon's place and collect the tokens clients send.

    The socket's folder must be a real folder (not a symlink), owned by ``uid``, root or one of
    ``trusted_owners`` (a client passes the socket's owner: a site daemon's folder belongs to
    its service user), and writable by its owner only. Folders under the default ``/tmp/offcut-<uid>`` (a predictable
    name in a world-writable folder) must moreover be owned by ``uid`` with mode 0700, that
    folder included. A folder that does not exist yet is not judged (the daemon creates it
    0700)."""
    folder = os.path.dirname(os.path.abspath(socket_path))
    base = f"/tmp/offcut-{uid}"
    checks = [(folder, False)]
    if folder == base or folder.startswith(base + "/"):
        checks = [(d, True) for d in _folders_from(base, folder)]
    for d, private in checks:
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{d}: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a folder (a symlink or a file)"
        if private:
            if st.st_uid != uid or st.st_mode & 0o077:
                return (f"{d} must be owned by uid {uid} with mode 0700 (owner uid {st.st_uid}, "
                        f"mode {stat.S_IMODE(st.st_mode):04o}); another user may have made it")
        elif st.st_uid not in (uid, 0, *trusted_owners) or st.st_mode & 0o022:
            return (f"{d} must be owned by uid {uid} or root and writable by its owner only "
                    f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def _folders_from(top: str, folder: str) -> list[str]:
    """``top`` and every folder below it down to ``folder`` (``folder`` is ``top`` or below it)."""
    out = [top]
    rest = folder[len(top):].strip("/")
    for part in filter(None, rest.split("/")):
        out.append(os.path.join(out[-1], part))
    return out


def normalize_address(address: str) -> str:
    """``address`` as gRPC takes it: a filesystem path (``/run/offcut/offcutd.sock``,
    ``./s.sock``, ``~/s.sock``) becomes ``unix://`` + its absolute path, since gRPC would take
    it for a host name and fail with a DNS error; anything else is returned as is."""
    if address.startswith(("/", "./", "../", "~")):
        return "unix://" + os.path.abspath(os.path.expanduser(address))
    return address


def unix_socket_path(address: str) -> str | None:
    """The filesystem path of a ``unix:`` address (None for TCP and abstract sockets)."""
    if address.startswith("unix://"):
        return address[len("unix://"):]
    if address.startswith("unix:") and not address.startswith("unix-abstract:"):
        return address[len("unix:"):]
    return None


def unreachable_reason(address: str) -> str | None:
    """Why ``address`` certainly cannot answer (a unix socket path that does not exist or is
    not a socket), else None. Lets a hook give up in microseconds without importing grpc."""
    path = unix_socket_path(address)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"socket {path} does not exist (is offcutd running?)"
    except OSError as exc:
        return f"socket {path}: {exc.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    return None


def untrusted_socket(socket_path: str) -> str | None:
    """Why a client should not connect to unix socket ``socket_path`` (its folder fails
    :func:`untrusted_socket_dir` for this user, the socket's owner trusted), else None.

    A socket that does not exist (yet: the daemon restarting) is judged by its folder, the
    folder's owner trusted: it must still be a folder only its owner can write, so that no one
    else can put a socket there before the daemon's comes back (a client retrying would
    otherwise send its token to it). A folder that does not exist is not judged."""
    try:
        owner = os.stat(socket_path).st_uid
    except FileNotFoundError:
        try:
            owner = os.stat(os.path.dirname(os.path.abspath(socket_path))).st_uid
        except OSError:
            return None
    except OSError:
        return None
    return untrusted_socket_dir(socket_path, os.getuid(), (owner,))


def make_private_parents(path: str) -> None:
    """Create the missing folders above ``path`` (a unix socket, the state file), each with
    mode 0700 (so the default ``/tmp/offcut-<uid>`` and its ``offcut/`` both pass
    :func:`untrusted_socket_dir`); existing ones are left as they are."""
    folder = os.path.dirname(os.path.abspath(path))
    missing = []
    while folder and not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for d in reversed(missing):
        os.mkdir(d, 0o700)

"""Default locations shared by the daemon and its clients."""

from __future__ import annotations

import os
import stat


def default_socket() -> str:
    """The daemon's default address: ``unix://$XDG_RUNTIME_DIR/offcut/offcutd.sock``
    (``unix:///tmp/offcut-<uid>/offcut/offcutd.sock`` when ``XDG_RUNTIME_DIR`` is unset)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/offcut-{os.getuid()}"
    return f"unix://{base}/offcut/offcutd.sock"


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

"""Default locations shared by the daemon and its clients."""

from __future__ import annotations

import os


def default_socket() -> str:
    """The daemon's default address: ``unix://$XDG_RUNTIME_DIR/offcut/offcutd.sock``
    (``unix:///tmp/offcut-<uid>/offcut/offcutd.sock`` when ``XDG_RUNTIME_DIR`` is unset)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/offcut-{os.getuid()}"
    return f"unix://{base}/offcut/offcutd.sock"

"""What a failed write to the state file means for callers (docs/operations.md, "Read-only
or full storage").

:func:`classify` turns SQLite's write errors into :class:`StateReadOnly` (gRPC
``UNAVAILABLE``: the file or its folder cannot be written now: a read-only mount, an I/O error,
``query_only``) or :class:`StateFull` (``RESOURCE_EXHAUSTED``: ``SQLITE_FULL``, a full disk
or the ``max_page_count`` limit). Either way the transaction was rolled back: nothing was
acknowledged, and the call can be retried once storage is writable again.
"""

from __future__ import annotations

import sqlite3

from offcut.errors import ResourceExhausted, Unavailable


class StateReadOnly(Unavailable):
    """The state file cannot be written now (read-only storage or an I/O error)."""


class StateFull(ResourceExhausted):
    """The state file's storage is full (``SQLITE_FULL``)."""


_READ_ONLY = {"SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_PERM"}


def classify(exc: sqlite3.Error, path: object) -> Exception | None:
    """The storage error ``exc`` (raised by a write to the state file ``path``) stands for, or
    None when it is something else (a bug, a constraint).

    Args:
        exc: the ``sqlite3`` error (its ``sqlite_errorname``, else its message, is read).
        path: the state file, named in the message.
    """
    name = (getattr(exc, "sqlite_errorname", None) or "").split("_")[:2]
    base = "_".join(name)
    text = str(exc).lower()
    if base == "SQLITE_FULL" or "disk is full" in text:
        return StateFull(f"state {path}: storage is full ({exc}); nothing was written, retry "
                         f"once space is freed")
    if base in _READ_ONLY or "readonly" in text or "read-only" in text or "disk i/o" in text:
        return StateReadOnly(f"state {path}: cannot be written ({exc}); nothing was written, "
                             f"retry once the storage is writable")
    return None

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

from offcut.errors import DAEMON_SAYS, ResourceExhausted, Unavailable


class StateReadOnly(Unavailable):
    """The state file cannot be written now (read-only storage or an I/O error)."""


class StateFull(ResourceExhausted):
    """The state file's storage is full (``SQLITE_FULL``)."""


#: SQLite's primary result codes of storage that cannot be written now
_READ_ONLY = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN,
              sqlite3.SQLITE_PERM}


def classify(exc: sqlite3.Error, path: object) -> Exception | None:
    """The storage error ``exc`` (raised by a write to the state file ``path``) stands for, or
    None when it is something else (a bug, a constraint).

    Args:
        exc: the ``sqlite3`` error (its ``sqlite_errorcode``, Python >= 3.11; the primary
            code is its low byte).
        path: the state file, named in the message.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    base = code & 0xFF if code is not None else None
    if base == sqlite3.SQLITE_FULL:
        return StateFull(f"{DAEMON_SAYS}state {path}: storage is full ({exc}); nothing was "
                         f"written, retry once space is freed")
    if base in _READ_ONLY:
        return StateReadOnly(f"{DAEMON_SAYS}state {path}: cannot be written ({exc}); nothing "
                             f"was written, retry once the storage is writable")
    return None

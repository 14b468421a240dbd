"""Reading one TOML file, for every part that has one: the daemon's ``offcut.toml``
(:mod:`offcut.daemon.config`), its tokens file (:mod:`offcut.daemon.edge.auth`) and the
client's ``client.toml`` (:mod:`offcut.client.settings`).

Each caller turns :class:`TomlFileError` into its own error class (``ConfigError``,
``TokensFileError``, ``SettingsError``); the message names the file and, for a syntax or
encoding error, the line.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Callable

__all__ = ["MAX_TOML_BYTES", "TomlFileError", "read_toml"]

#: largest TOML file read [bytes]: a settings or tokens file is a few KiB
MAX_TOML_BYTES = 16 * 1024 * 1024


class TomlFileError(ValueError):
    """A TOML file that cannot be used: missing or unreadable, refused by the caller's check,
    larger than :data:`MAX_TOML_BYTES`, not UTF-8, or not TOML. The message names the file
    (``<what> <path>``) and the line where there is one."""


def read_toml(path: str | Path, what: str, *,
              check: Callable[[os.stat_result], str | None] | None = None) -> dict[str, Any]:
    """The table of the TOML file ``path`` (no other check of its keys or values).

    Args:
        path: the file.
        what: what the file is, for messages (``"config"``, ``"tokens file"``).
        check: called with the ``os.fstat`` of the opened file before it is read; a returned
            text refuses the file (the reason, e.g. "writable by others"), None accepts it.
            Checking the opened file, not the path, leaves no time to swap the file.

    Raises:
        TomlFileError: ``cannot read <what> <path>: <reason>`` (missing, unreadable, too
            large), ``<what> <path>: refused: <reason>`` (``check``), or ``<what> <path>: not
            valid TOML: <problem> (at line L, column C)``.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            problem = check(os.fstat(fh.fileno())) if check is not None else None
            if problem:
                raise TomlFileError(f"{what} {path}: refused: {problem}")
            data = fh.read(MAX_TOML_BYTES + 1)
    except OSError as exc:
        raise TomlFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TOML_BYTES:
        raise TomlFileError(f"cannot read {what} {path}: larger than {MAX_TOML_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TomlFileError(f"{what} {path}: not valid TOML: not UTF-8 (at line {line})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlFileError(f"{what} {path}: not valid TOML: {exc}") from None

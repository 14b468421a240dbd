"""User text made safe for where Offcut writes it: a terminal, and CSV files opened in
spreadsheets (docs/security.md, "Round two: replay inputs and output injection").

Text a user chose (task names, commands, failure reasons, Zeus job ids, node names, daemon
messages that quote them) reaches an admin's terminal and the CSV files of replays,
``offcut history`` and ``offcut recur``. Two rules, one function each, used everywhere:

* :func:`terminal_safe`: every character that is not printable (``str.isprintable``: the C0
  and C1 control characters such as ESC and BEL, DEL, Unicode format characters such as the
  bidirectional overrides U+202A-U+202E / U+2066-U+2069, unassigned code points, lone
  surrogates) is written as Python writes it in a string literal: ``\\x1b``, ``\\u202e``.
  So no escape sequence reaches the terminal (no retitled window, no rewritten line, no
  hidden text). Backslashes are left as they are: a literal ``\\x1b`` typed by a user reads
  the same as an escaped ESC, which is harmless.
* :func:`csv_cell` / :func:`csv_writer`: a text cell that begins with ``=``, ``+``, ``-``,
  ``@``, a tab or a carriage return gets a leading ``'`` (OWASP, "CSV Injection"), so a
  spreadsheet shows it as text instead of running it as a formula; numbers (also negative
  ones and numeric strings such as ``"-1.5"`` or ``"-inf"``) stay numbers. A text cell that
  already begins with ``'`` followed by one of those characters (or another ``'``) gets one
  more, so :func:`csv_uncell` restores every cell exactly (the replay's own ``tasks.csv``
  and ``nodes.csv`` round-trip).

Imports only the standard library (the shared core: docs/architecture.md, "Parts and data flow").
"""

from __future__ import annotations

import csv
import re
from typing import Any, Iterable

__all__ = ["terminal_safe", "csv_cell", "csv_uncell", "csv_writer", "SafeCsvWriter",
           "CSV_FORMULA_START"]

#: first characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection")
CSV_FORMULA_START = frozenset("=+-@\t\r")
#: a number as Python, pandas or Slurm write one (``repr(float)``, ``%g``, integers)
_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)",
                     re.IGNORECASE)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def terminal_safe(text: Any, *, keep_newlines: bool = False) -> str:
    """``text`` (``str()`` of anything else) with every non-printable character escaped
    (module docstring); a space stays a space, and so does a newline when
    ``keep_newlines`` (multi-line output such as a report). The result holds only printable
    characters, spaces and (with ``keep_newlines``) newlines; printable text is returned
    unchanged."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() or ch == " " or (keep_newlines and ch == "\n")
                   else _escape(ch) for ch in s)


def _needs_quote(s: str) -> bool:
    if not s:
        return False
    if s[0] in CSV_FORMULA_START:
        return not _NUMBER.fullmatch(s)
    return s[0] == "'" and len(s) > 1 and (s[1] in CSV_FORMULA_START or s[1] == "'")


def csv_cell(value: Any) -> Any:
    """A CSV cell as Offcut writes it: a ``str`` that a spreadsheet would run as a formula
    gets a leading ``'`` (module docstring); numbers, numeric strings and other values are
    returned unchanged."""
    if isinstance(value, str) and _needs_quote(value):
        return "'" + value
    return value


def csv_uncell(text: str) -> str:
    """The inverse of :func:`csv_cell` for a cell read back as text: one leading ``'`` is
    dropped where :func:`csv_cell` would have added it; any other text is unchanged."""
    if len(text) > 1 and text[0] == "'" and (text[1] in CSV_FORMULA_START or text[1] == "'"):
        return text[1:]
    return text


class SafeCsvWriter:
    """:func:`csv.writer` whose every row passes through :func:`csv_cell`."""

    def __init__(self, fh, **kwargs: Any):
        self._writer = csv.writer(fh, **kwargs)

    def writerow(self, row: Iterable[Any]) -> Any:
        """Write one row (cells through :func:`csv_cell`); returns what ``csv`` returns."""
        return self._writer.writerow([csv_cell(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        """Write every row of ``rows``."""
        for row in rows:
            self.writerow(row)


def csv_writer(fh, **kwargs: Any) -> SafeCsvWriter:
    """The CSV writer of every CSV file Offcut writes: :func:`csv.writer` (same arguments)
    with formula cells neutralised (:func:`csv_cell`)."""
    return SafeCsvWriter(fh, **kwargs)


def write_csv_frame(frame: Any, path: Any) -> None:
    """Write the pandas DataFrame ``frame`` to ``path`` as CSV (no index) with its text
    cells through :func:`csv_cell`, like :func:`csv_writer`'s rows; ``frame`` is unchanged.
    Raises ``OSError`` when the file cannot be written."""
    safe = frame.copy()
    for col in safe.columns:
        if safe[col].dtype.kind == "O":  # (object and pandas' string dtype: text cells)
            safe[col] = safe[col].map(csv_cell)
    safe.to_csv(path, index=False)

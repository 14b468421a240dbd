"""Rows of Slurm's ``--parsable2 --noheader`` text output (``sacct``, ``sinfo -o``): ``|``
between columns, one record per line. Shared by the Slurm plugin's accounting reader and the
replay of a site's accounting."""

from __future__ import annotations

from typing import Iterator, Sequence

__all__ = ["parsable_rows"]


def parsable_rows(text: str, fields: Sequence[str], source: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, columns)`` of every non-blank line of ``text`` (1-based numbers).

    Raises:
        ValueError: a line without exactly ``len(fields)`` columns, naming ``source``, the
            line, the expected columns and the line's start.
    """
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cols = line.split("|")
        if len(cols) != len(fields):
            raise ValueError(f"{source} line {number}: {len(cols)} columns, expected "
                             f"{len(fields)} ({'|'.join(fields)}): {line[:120]!r}")
        yield number, cols

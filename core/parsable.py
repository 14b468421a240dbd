"""Rows of Slurm's ``--parsable2 --noheader`` text output (``sacct``, ``sinfo -o``): ``|``
between columns, one record per line. Shared by the Slurm plugin's accounting reader and the
replay of a site's accounting."""

from __future__ import annotations

from typing import Iterator, Sequence

__all__ = ["NO_NODES", "NO_VALUE", "parsable_rows"]

#: how these columns say "no value" (a time never reached, no preemption time, ...)
NO_VALUE = frozenset({"", "Unknown", "None", "N/A"})
#: how ``NodeList`` says a job got no nodes (it never ran)
NO_NODES = frozenset({"", "None assigned"})


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

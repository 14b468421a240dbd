"""Dated figures of a benchmark, written by the benchmark that measured them: its printed
lines are also appended, under the command that made them, to
``benchmarks/results/NAME-DATE.txt`` (one file per benchmark and day)."""

from __future__ import annotations

import datetime as dt
import shlex
import sys
from pathlib import Path

#: where the dated results go
RESULTS = Path(__file__).resolve().parent / "results"


class ResultsLog:
    """Lines a benchmark prints and keeps (:meth:`say`), appended to today's results file by
    :meth:`write`.

    Args:
        name: the benchmark's name (its script's stem): the file is ``NAME-DATE.txt``.
    """

    def __init__(self, name: str):
        self.name = name
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        """Print ``line`` (flushed) and keep it for the results file."""
        print(line, flush=True)
        self.lines.append(line)

    def write(self) -> Path:
        """Append the kept lines under ``$ python benchmarks/NAME.py ARGS`` to
        ``benchmarks/results/NAME-DATE.txt`` (folder made when missing); its path. Raises
        OSError when it cannot be written."""
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{self.name}-{dt.date.today().isoformat()}.txt"
        with path.open("a") as out:
            out.write(f"$ python benchmarks/{self.name}.py {shlex.join(sys.argv[1:])}\n"
                      + "".join(f"{line}\n" for line in self.lines) + "\n")
        return path

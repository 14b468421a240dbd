"""Dated figures of a benchmark, written by the benchmark that measured them: its printed
lines are also written, under the machine, the commit and the command that made them, to
``benchmarks/results/NAME-DATE-TIME.txt`` (one file per run; UTC)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
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
        """Write the kept lines under a header (UTC time, :func:`machine`, the commit) and
        ``$ python benchmarks/NAME.py ARGS`` to a new ``benchmarks/results/NAME-DATE-TIME.txt``
        (folder made when missing); its path. Raises OSError when it cannot be written."""
        RESULTS.mkdir(exist_ok=True)
        now = dt.datetime.now(dt.timezone.utc)
        path = RESULTS / f"{self.name}-{now.strftime('%Y-%m-%d-%H%M%S')}.txt"
        header = [f"# {now.isoformat(timespec='seconds')}", f"# machine: {machine()}",
                  f"# commit: {_commit()}",
                  f"$ python benchmarks/{self.name}.py {shlex.join(sys.argv[1:])}"]
        with path.open("x") as out:
            out.write("".join(f"{line}\n" for line in header + self.lines))
        return path


def machine() -> str:
    """The machine in one line: host name, CPU model and count, memory [GiB], OS, Python."""
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh
                          if ln.startswith("model name")), "")
    except OSError:
        pass
    try:
        mem = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError):
        mem = "? GiB"
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({model or platform.processor() or '?'})"
            f", {mem}, {platform.system()} {platform.release()}, Python "
            f"{platform.python_version()}")


def _commit() -> str:
    """The repository's commit (``+`` when the tree has changes), or ``unknown``."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+" if dirty else "")) or "unknown"

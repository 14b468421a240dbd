"""Dated figures of a benchmark, written by the benchmark that measured them: its printed
figure lines (not its progress output) are also written, under the machine, the commit and the
command that made them, to ``benchmarks/results/NAME-DATE-TIME.txt`` (one file per run; UTC).
``--no-results`` (:func:`add_option`) prints them only, for smoke tests.

A benchmark uses it so::

    add_option(parser)
    args = parser.parse_args(argv)
    log = ResultsLog.from_args("name", args, argv)
    log.say(f"p99 {p99:.1f} ms")   # printed and kept
    log.finish()                   # written (unless --no-results); says where
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

#: where the dated results go
RESULTS = Path(__file__).resolve().parent / "results"


def add_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-results`` to ``parser``: print the figures, write no results file."""
    parser.add_argument("--no-results", action="store_true",
                        help="print the figures only, write no file to benchmarks/results/ "
                             "(smoke tests)")


class ResultsLog:
    """Lines a benchmark prints and keeps (:meth:`say`, :meth:`keep`), written to a new
    results file by :meth:`write` / :meth:`finish`.

    Args:
        name: the benchmark's name (its script's stem): the file is ``NAME-DATE-TIME.txt``.
        enabled: False: :meth:`write` writes nothing (``--no-results``).
        argv: the benchmark's arguments as the header's command shows them (default: this
            process's ``sys.argv[1:]``; give them when ``main(argv)`` was called with others).
    """

    def __init__(self, name: str, *, enabled: bool = True, argv: list[str] | None = None):
        self.name = name
        self.enabled = enabled
        self.argv = None if argv is None else [str(a) for a in argv]
        self.lines: list[str] = []

    @classmethod
    def from_args(cls, name: str, args: argparse.Namespace,
                  argv: list[str] | None = None) -> "ResultsLog":
        """A log for ``name`` that writes unless ``args.no_results`` (:func:`add_option`)."""
        return cls(name, enabled=not getattr(args, "no_results", False), argv=argv)

    def say(self, line: str = "") -> None:
        """Print ``line`` (flushed) and keep it for the results file."""
        print(line, flush=True)
        self.lines.append(line)

    def keep(self, text: str) -> None:
        """Keep ``text`` (one or more lines, each without its trailing blanks), already shown
        another way (a progress bar's ``tqdm.write``, a rich table), for the results file;
        prints nothing."""
        self.lines.extend(line.rstrip() for line in text.rstrip("\n").split("\n"))

    @contextlib.contextmanager
    def tee(self) -> Iterator[None]:
        """While the block runs, what it prints goes to stdout as usual and is also kept for
        the results file (a report printed by several functions)."""
        kept = io.StringIO()
        out = sys.stdout

        class Tee(io.TextIOBase):
            def write(self, text: str) -> int:
                kept.write(text)
                return out.write(text)

            def flush(self) -> None:
                out.flush()

        with contextlib.redirect_stdout(Tee()):
            try:
                yield
            finally:
                if kept.getvalue():
                    self.keep(kept.getvalue())

    def write(self) -> Path | None:
        """Write the kept lines under a header (UTC time, :func:`machine`, the commit) and
        ``$ python benchmarks/NAME.py ARGS`` to a new ``benchmarks/results/NAME-DATE-TIME.txt``
        (folder made when missing); its path, or None when not ``enabled``. Raises OSError
        when it cannot be written (also when that file exists: one file per run)."""
        if not self.enabled:
            return None
        RESULTS.mkdir(exist_ok=True)
        now = dt.datetime.now(dt.timezone.utc)
        path = RESULTS / f"{self.name}-{now.strftime('%Y-%m-%d-%H%M%S')}.txt"
        argv = sys.argv[1:] if self.argv is None else self.argv
        header = [f"# {now.isoformat(timespec='seconds')}", f"# machine: {machine()}",
                  f"# commit: {_commit()}",
                  f"$ python benchmarks/{self.name}.py {shlex.join(argv)}"]
        with path.open("x") as out:
            out.write("".join(f"{line}\n" for line in header + self.lines))
        return path

    def finish(self) -> Path | None:
        """:meth:`write`, then print where the figures went (or that ``--no-results`` kept
        them from a file); the path or None."""
        path = self.write()
        print(f"figures written to {path}" if path else
              "figures not written to benchmarks/results/ (--no-results)", flush=True)
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

"""Solve recorded allocation instances (JSONL of ``AllocationProblem.to_record()``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from offcut.errors import InvalidArgument

from .allocator import Allocator
from .problem import AllocationProblem


def read_records(path: str | Path) -> Iterator[tuple[int, AllocationProblem]]:
    """Yield (line number, problem) for each non-blank line of a JSONL file.

    Raises :class:`InvalidArgument` naming ``path:line`` for a line that is not JSON or not
    a valid record; ``OSError`` when the file cannot be read.
    """
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"line {lineno}: not JSON ({exc.msg})", where) from exc
            if not isinstance(record, dict):
                raise InvalidArgument(f"line {lineno}: expected a JSON object", where)
            try:
                problem = AllocationProblem.from_record(record)
            except InvalidArgument as exc:
                raise InvalidArgument(f"line {lineno}: {exc}", where) from exc
            yield lineno, problem


def solve_records(path: str | Path, solver: str = "dp", time_limit_s: float = 10.0,
                  isolate: bool = True) -> Iterator[dict]:
    """Solve every recorded instance in ``path`` with an :class:`Allocator`.

    Yields one dict per instance: ``objective`` (float, re-scored), ``bound`` (float, inf
    when none), ``counts`` (list[int], (J,)), ``solve_ms`` (wall time [ms]), ``solver``
    (backend that answered), ``status`` and, when the backend failed and ``dp`` answered,
    ``fallback_reason``. Raises :class:`InvalidArgument` naming the line of a malformed
    record (instances before it are yielded first) or a bad ``solver``.
    """
    alloc = Allocator(solver=solver, time_limit_s=time_limit_s, isolate=isolate)
    try:
        for _, problem in read_records(path):
            sol, reason = alloc.solve(problem)
            out = {"objective": sol.objective, "bound": sol.bound,
                   "counts": [int(x) for x in sol.counts], "solve_ms": sol.solve_ms,
                   "solver": sol.solver, "status": sol.status}
            if reason is not None:
                out["fallback_reason"] = reason
            yield out
    finally:
        alloc.close()

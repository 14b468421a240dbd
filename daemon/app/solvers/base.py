"""Shared names of the allocation backends (docs/architecture.md, "Solver backends")."""

from __future__ import annotations

SOLVER_NAMES = ("auto", "gurobi", "cbc", "dp", "greedy")
"""Accepted values of the ``solver`` setting (docs/architecture.md, "Solver backends")."""


class SolverFailed(Exception):
    """A backend produced no usable answer (crash, hang, time limit without an incumbent,
    infeasible or malformed result). The allocator falls back to the exact ``dp``."""


class SolverUnavailable(SolverFailed):
    """A backend cannot run here: its package is missing, or the model exceeds its licence
    (e.g. gurobipy's size-limited pip licence, error 10010)."""


def knapsack_items(problem) -> list[tuple[list[int], list[float]]]:
    """Per task, the choices of the multiple-choice knapsack form (docs/architecture.md,
    "Solver backends").

    For task j: (counts, values) with counts ascending in {0} U [Jmin_j, min(Jmax_j, N)] and
    values f_j(counts) from :meth:`AllocationProblem.value_tables`. Dominated counts (a smaller
    admissible count has a value >= this one's) are dropped: they can never be needed in an
    optimum, so the form stays exact. Count 0 is always kept.
    """
    import numpy as np

    items = []
    for f in problem.value_tables():
        keep_n = [0]
        keep_v = [float(f[0])]
        best = float(f[0])
        for n in range(1, len(f)):
            v = float(f[n])
            if np.isfinite(v) and v > best:
                keep_n.append(n)
                keep_v.append(v)
                best = v
        items.append((keep_n, keep_v))
    return items


def milp_solution(problem, counts, status: str, bound: float, started: float, solver: str):
    """Re-score a MILP backend's ``counts`` (shape (J,)) with our own evaluator and wrap them
    in a :class:`~offcut.daemon.app.solvers.problem.Solution`.

    ``status`` is ``optimal`` or ``feasible`` (time limit with an incumbent); ``bound`` the
    backend's proven bound (ignored when optimal); ``started`` a ``time.perf_counter()`` value.
    Raises :class:`SolverFailed` when the counts are infeasible (docs/architecture.md,
    "Solver backends": never trust a returned assignment).
    """
    import math
    import time

    from .problem import Solution

    try:
        obj = problem.evaluate(counts)
    except ValueError as exc:
        raise SolverFailed(f"{solver} returned an infeasible assignment: {exc}") from exc
    if status == "optimal" or not math.isfinite(bound):
        bound = obj if status == "optimal" else bound
    return Solution(counts=counts, objective=obj, bound=max(bound, obj),
                    solve_ms=(time.perf_counter() - started) * 1e3, solver=solver, status=status)

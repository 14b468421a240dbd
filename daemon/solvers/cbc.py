"""CBC (python-mip) backend: the multiple-choice knapsack form of docs/architecture.md §4.

Only the knapsack form is used: python-mip 2.0.0's CBC aborts, hangs or answers wrongly on
SOS2 models (docs/architecture.md §4, measured), so SOS constraints are never built here.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .base import SolverFailed, SolverUnavailable, knapsack_items, milp_solution
from .problem import AllocationProblem, Solution


def solve_cbc(problem: AllocationProblem, time_limit_s: float) -> Solution:
    """Solve ``problem`` with CBC through python-mip.

    Model: one binary x_{j,n} per undominated admissible count n of task j (count 0
    included), maximise sum f_j(n) x_{j,n} (f from :meth:`AllocationProblem.value_tables`,
    BFTrainer arXiv 2106.12091 §3 at count level), s.t. sum_n x_{j,n} == 1 for each j and
    sum_{j,n} n x_{j,n} <= N.

    ``time_limit_s``: CBC's ``max_seconds`` [s] (not trusted as a hard limit: run it under
    :class:`~offcut.daemon.solvers.guard.GuardedWorker` for that).

    Returns a :class:`Solution` (counts (J,), objective re-scored by ``problem.evaluate``);
    ``status="feasible"`` and ``bound = objective_bound`` when stopped by the time limit.
    Raises :class:`SolverUnavailable` when python-mip is missing, :class:`SolverFailed` when
    no solution was found or the answer is infeasible.
    """
    t0 = time.perf_counter()
    try:
        import mip
    except ImportError as exc:  # pragma: no cover - mip is a hard dependency
        raise SolverUnavailable(f"python-mip is not importable: {exc}") from exc

    J, N = problem.num_tasks, problem.idle_nodes
    items = knapsack_items(problem)
    counts = np.zeros(J, dtype=np.int64)
    free = [j for j in range(J) if len(items[j][0]) > 1]
    constant = sum(items[j][1][0] for j in range(J) if len(items[j][0]) == 1)
    status = "optimal"
    bound = math.inf
    if free:
        m = mip.Model(sense=mip.MAXIMIZE, solver_name=mip.CBC)
        m.verbose = 0
        m.max_mip_gap = 1e-9
        m.max_mip_gap_abs = 1e-9
        xs: dict[int, list] = {}
        for j in free:
            xs[j] = [m.add_var(var_type=mip.BINARY) for _ in items[j][0]]
            m += mip.xsum(xs[j]) == 1
        m += mip.xsum(n * x for j in free for n, x in zip(items[j][0], xs[j])) <= N
        m.objective = mip.xsum(v * x for j in free for v, x in zip(items[j][1], xs[j]))
        try:
            st = m.optimize(max_seconds=max(0.01, float(time_limit_s)))
        except Exception as exc:  # CBC/cffi errors
            raise SolverFailed(f"cbc raised {type(exc).__name__}: {exc}") from exc
        if st == mip.OptimizationStatus.OPTIMAL:
            status = "optimal"
        elif st == mip.OptimizationStatus.FEASIBLE:
            status = "feasible"
        else:
            raise SolverFailed(f"cbc found no solution (status {st.name})")
        if m.num_solutions < 1:
            raise SolverFailed(f"cbc reported {st.name} without a solution")
        for j in free:
            vals = [x.x if x.x is not None else 0.0 for x in xs[j]]
            counts[j] = items[j][0][int(np.argmax(vals))]
        bound = float(m.objective_bound) + constant
    return milp_solution(problem, counts, status, bound, t0, "cbc")

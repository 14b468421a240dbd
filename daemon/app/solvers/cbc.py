"""CBC (python-mip) backend: the multiple-choice knapsack form of docs/architecture.md,
"Solver backends".

Only the knapsack form is used: python-mip 2.0.0's CBC aborts, hangs or answers wrongly on
SOS2 models (docs/architecture.md, "Solver backends", measured), so SOS constraints are never built
here. Ties: after the proven optimum, lexicographic stages in the same model
(:func:`.ties.break_ties`) return the counts of the exact backends' one rule, the same as ``dp``'s.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .base import SolverFailed, SolverUnavailable, knapsack_items, milp_solution
from .problem import AllocationProblem, Solution
from .ties import break_ties, own_best_if_fits, tie_tolerance


def solve_cbc(problem: AllocationProblem, time_limit_s: float, ties: bool = True) -> Solution:
    """Solve ``problem`` with CBC through python-mip.

    Model: one binary x_{j,n} per undominated admissible count n of task j (count 0
    included), maximise sum f_j(n) x_{j,n} (f from :meth:`AllocationProblem.value_tables`,
    BFTrainer arXiv 2106.12091, Section 3 at count level), s.t. sum_n x_{j,n} == 1 for each j and
    sum_{j,n} n x_{j,n} <= N.

    ``time_limit_s``: CBC's ``max_seconds`` [s] for all stages together (not trusted as a
    hard limit: run it under :class:`~offcut.daemon.app.solvers.guard.GuardedWorker` for that).
    ``ties``: apply the exact backends' tie-breaking rule (:mod:`.ties`: lexicographic
    stages in the same model after a proven optimum) so the counts equal ``dp``'s; False
    only to measure its cost.

    Returns a :class:`Solution` (counts (J,), objective re-scored by ``problem.evaluate``);
    ``status="feasible"`` and ``bound = objective_bound`` when stopped by the time limit.
    Raises :class:`SolverUnavailable` when python-mip is missing, :class:`SolverFailed` when
    no solution was found, the answer is infeasible or the tie stages ran past
    ``time_limit_s``.
    """
    t0 = time.perf_counter()
    try:
        import mip
    except ImportError as exc:  # pragma: no cover - mip is a hard dependency
        raise SolverUnavailable(f"python-mip is not importable: {exc}") from exc

    J, N = problem.num_tasks, problem.idle_nodes
    if ties and (own := own_best_if_fits(problem)) is not None:
        return milp_solution(problem, own, "optimal", math.inf, t0, "cbc")  # rule, step 1
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
        if ties:  # the rule needs the optimum within its tolerance (ties.py)
            m.max_mip_gap = 0.0
            m.max_mip_gap_abs = 0.5 * tie_tolerance(problem)
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
        counts = _counts(items, xs, J)
        bound = float(m.objective_bound) + constant
        if ties and status == "optimal":
            counts = break_ties(problem, counts, _CbcTies(m, items, xs, constant, J),
                                t0 + float(time_limit_s))
    return milp_solution(problem, counts, status, bound, t0, "cbc")


def _counts(items, xs: dict, J: int) -> np.ndarray:
    """The counts (J,) int64 [nodes] of the model's current solution (0 for unmodelled
    tasks: their only choice)."""
    counts = np.zeros(J, dtype=np.int64)
    for j, row in xs.items():
        vals = [x.x if x.x is not None else 0.0 for x in row]
        counts[j] = items[j][0][int(np.argmax(vals))]
    return counts


class _CbcTies:
    """:class:`~.ties.TieModel` over a solved python-mip knapsack model: rows are added to
    it, the objective replaced, each solve started from the previous solution."""

    def __init__(self, m, items, xs: dict, constant: float, J: int):
        import mip

        self.mip, self.m, self.items, self.xs, self.J = mip, m, items, xs, J
        self.constant = constant
        self.count = {j: mip.xsum(n * x for n, x in zip(items[j][0], row))
                      for j, row in xs.items()}
        m.max_mip_gap = 0.0
        m.max_mip_gap_abs = 0.5  # integral objectives (node counts)
        m.infeas_tol = 1e-9
        m.integer_tol = 1e-9

    def require_value(self, lower: float) -> None:
        mip = self.mip
        self.m += mip.xsum(v * x for j, row in self.xs.items()
                           for v, x in zip(self.items[j][1], row)) >= lower - self.constant

    def limit_total(self, upper: int) -> None:
        if self.count:
            self.m += self.mip.xsum(self.count.values()) <= upper

    def _binary(self, j: int, n: int):
        cnts = self.items[j][0]
        return self.xs[j][cnts.index(n)] if n in cnts else None

    def fix(self, j: int, n: int) -> None:
        if j in self.xs:
            self._binary(j, n).lb = 1

    def solve(self, minimise, pin, time_limit_s):
        mip, m = self.mip, self.m
        pinned = None
        if pin is not None:
            if pin[0] not in self.xs:  # unmodelled: count 0 is its only choice
                if pin[1] != 0:
                    return None
            else:
                pinned = self._binary(*pin)
                if pinned is None:
                    return None  # dominated: never in the rule's answer (knapsack_items)
                pinned.lb = 1
        try:
            tasks = self.count.keys() if minimise is None else [j for j in minimise
                                                                 if j in self.count]
            m.objective = mip.minimize(mip.xsum(self.count[j] for j in tasks))
            try:
                st = m.optimize(max_seconds=max(0.01, time_limit_s))
            except Exception as exc:  # CBC/cffi errors
                raise SolverFailed(f"cbc raised {type(exc).__name__}: {exc}") from exc
            if st in (mip.OptimizationStatus.INFEASIBLE, mip.OptimizationStatus.INT_INFEASIBLE):
                return None
            if st != mip.OptimizationStatus.OPTIMAL:
                raise SolverFailed(f"cbc tie stage stopped with status {st.name}")
            return _counts(self.items, self.xs, self.J)
        finally:
            if pinned is not None:
                pinned.lb = 0

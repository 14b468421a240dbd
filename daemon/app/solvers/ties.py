"""The one tie-breaking rule of the exact backends (docs/architecture.md, "The tie rule").

The allocation problem (BFTrainer, Liu et al. arXiv 2106.12091, Section 3 eq. 1-9 at count level,
:mod:`.problem`) often has several optimal count vectors: identical tasks, flat curves,
rescale costs of zero. Every exact backend (``dp``, ``gurobi``, ``cbc``) returns the same one:

1. **Own best fits.** When every task's own best count (argmax_n f_j(n) over
   A_j = {0} U [Jmin_j, top_j], exact comparison; ties: c_j, then fewer nodes) sums to
   <= N, those counts (tasks interact only through the capacity row).
2. **Otherwise** among the optimal vectors (value >= V* - tol, with
   tol = 1e-12 (1 + sum_j max_{n in A_j} |f_j(n)|), see :func:`tie_tolerance`): the fewest
   total nodes; then, from the last task backwards, each task's most preferred count
   (:func:`preference_rank`: c_j first, then ascending) that keeps an optimal vector with
   that total reachable.

``dp`` applies the rule in its backtrack (:mod:`.dp_kernel`); the MILP backends apply it
with :func:`break_ties`, a lexicographic second stage in their own model (:class:`TieModel`).
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

import numpy as np

from .base import SolverFailed
from .problem import AllocationProblem

TIE_RTOL = 1e-12
"""Values within this fraction of 1 + sum_j max_{n in A_j} |f_j(n)| are equal (the rule's
tolerance, shared by every exact backend)."""


def tie_tolerance(problem: AllocationProblem) -> float:
    """The rule's tolerance in objective units: TIE_RTOL * (1 + sum_j max_{n in A_j} |f_j(n)|),
    A_j = {0} U [Jmin_j, top_j] (the scale :mod:`.dp_kernel` uses). Problem: BFTrainer
    arXiv 2106.12091, Section 3 at count level."""
    scale = 1.0
    for j, f in enumerate(problem.value_tables()):
        jmin = int(problem.min_nodes[j])
        mag = abs(float(f[0]))
        if jmin < len(f):
            mag = max(mag, float(np.abs(f[jmin:]).max()))
        scale += mag
    return TIE_RTOL * scale


def preference_rank(current: int, n: int) -> int:
    """Rank of count ``n`` [nodes] for a task holding ``current`` = c_j nodes: 0 for c_j
    (when c_j > 0), else n + 1; a lower rank is preferred (the rule's step 2)."""
    return 0 if n == current and current != 0 else n + 1


def preference_order(table: np.ndarray, current: int, min_nodes: int) -> np.ndarray:
    """Admissible counts of one task in the rule's order: c_j first (when admissible), then
    ascending. Shape (|A_j|,), int64 [nodes].

    ``table``: f_j(n), n = 0..top_j (only its length is used); ``current``: c_j;
    ``min_nodes``: Jmin_j. A_j = {0} U [Jmin_j, top_j] (BFTrainer arXiv 2106.12091, Section 3 at
    count level).
    """
    top = len(table) - 1
    adm = np.concatenate(([0], np.arange(min_nodes, top + 1, dtype=np.int64))) if min_nodes <= top \
        else np.zeros(1, dtype=np.int64)
    adm = adm.astype(np.int64)
    if current != 0 and (adm == current).any():
        adm = np.concatenate(([current], adm[adm != current]))
    return adm


def best_own_count(table: np.ndarray, order: np.ndarray) -> int:
    """argmax of one task's table over its admissible counts, ties broken by ``order``.

    ``table``: f_j(n), n = 0..top_j (float64, objective units); ``order``: (|A_j|,) int64
    admissible counts in preference order (:func:`preference_order`). Returns a count [nodes].
    """
    return int(order[int(np.argmax(table[order]))])


def own_best_counts(problem: AllocationProblem) -> np.ndarray:
    """Every task's own best count (argmax f_j, ties: c_j, then fewer nodes), shape (J,)
    int64 [nodes]. When they sum to <= N they are the rule's answer (step 1)."""
    tables = problem.value_tables()
    return np.array([
        best_own_count(tables[j], preference_order(tables[j], int(problem.current_nodes[j]),
                                                   int(problem.min_nodes[j])))
        for j in range(problem.num_tasks)], dtype=np.int64)


def own_best_if_fits(problem: AllocationProblem) -> np.ndarray | None:
    """The rule's answer when step 1 applies (:func:`own_best_counts` sum to <= N, so they
    are optimal: tasks interact only through the capacity row), else None. Shape (J,) int64
    [nodes]. The MILP backends call it before building a model: a count dominated by an
    equal-valued smaller one (dropped by the knapsack form) may be the answer here."""
    own = own_best_counts(problem)
    return own if int(own.sum()) <= problem.idle_nodes else None


class TieModel(Protocol):
    """A MILP backend's model as :func:`break_ties` drives it. Counts are (J,) int64 [nodes];
    the value is the objective of :meth:`AllocationProblem.evaluate` (constants included)."""

    def require_value(self, lower: float) -> None:
        """Add the row: value >= ``lower`` (objective units)."""

    def limit_total(self, upper: int) -> None:
        """Add the row: sum_j n_j <= ``upper`` [nodes]."""

    def fix(self, j: int, n: int) -> None:
        """Fix n_j = ``n`` for every later solve."""

    def solve(self, minimise: Sequence[int] | None, pin: tuple[int, int] | None,
              time_limit_s: float) -> np.ndarray | None:
        """Minimise sum_{j in minimise} n_j (all tasks when None; nothing when empty: a
        feasibility check), with n_j = n for ``pin`` = (j, n) for this solve only. Returns
        the counts of an optimal solution, or None when infeasible. Raises
        :class:`SolverFailed` when the solve ends without a proof (time limit, error)."""


def break_ties(problem: AllocationProblem, counts: np.ndarray, model: TieModel,
               deadline: float) -> np.ndarray:
    """The rule's answer (step 2 of the module docstring) from an optimal vector ``counts``
    ((J,) int64 [nodes], proven optimal by the MILP backend) and its ``model``, for a problem
    where step 1 does not apply (the backend checked :func:`own_best_if_fits` before it built
    the model).

    Stages, each skipped when it cannot change anything: value >= V* - tol (V* =
    ``problem.evaluate(counts)``); minimise the total; then from the last task backwards: a
    task at c_j, or at 0 with c_j inadmissible, keeps it; else try c_j (a feasibility
    solve), else minimise n_j; fix the result. At most 1 + 2 J solves, warm-started by the
    backend where it can; a solve is skipped when a Lagrangian bound
    (:class:`_LagrangianBound`) proves that no optimal vector has what it looks for (a
    smaller total, c_j, a smaller n_j), which is the usual case for a task without a tie. ``deadline``:
    ``time.perf_counter()`` value after which :class:`SolverFailed` is raised (the allocator
    then answers with ``dp``). Returns counts (J,) int64; raises :class:`SolverFailed` when
    the result does not keep the optimum (solver tolerances). Problem: BFTrainer
    arXiv 2106.12091, Section 3; lexicographic optimisation as in multi-objective MILP (fix each
    objective's optimum as a row, then optimise the next).
    """
    J = problem.num_tasks
    counts = np.asarray(counts, dtype=np.int64).copy()
    if J == 0:
        return counts
    best = problem.evaluate(counts)
    tol = tie_tolerance(problem)

    def left() -> float:
        rest = deadline - time.perf_counter()
        if rest <= 0:
            raise SolverFailed("tie-breaking stages ran past the time limit")
        return rest

    def solve(minimise, pin) -> np.ndarray | None:
        """A stage's solve. A MILP solver's feasibility tolerance (CBC's 1e-9 absolute) may
        let a vector through the value row that is below ``best - tol`` by the exact
        evaluation (``tol`` is smaller for small objectives); whether another vector of the
        stage meets the row exactly, the backend cannot tell, so :class:`SolverFailed`
        (the allocator answers with ``dp``, the rule's exact answer)."""
        sol = model.solve(minimise, pin, left())
        if sol is not None and problem.evaluate(sol) < best - tol:
            raise SolverFailed(
                f"a tie stage's answer is {best - problem.evaluate(sol):.3g} below the optimum, "
                f"more than the tie tolerance {tol:.3g}: a near-tie finer than the solver's "
                "tolerances")
        return sol

    model.require_value(best - tol)
    bound = _LagrangianBound(problem)
    need = best - 2 * tol  # a bound below it proves a stage cannot change anything
    total = int(counts.sum())
    if total and bound.best_value(total - 1, 0, 0.0, J - 1, None) >= need:
        sol = solve(None, None)
        if sol is not None:
            counts = sol
            total = int(counts.sum())
    model.limit_total(total)
    cur = problem.current_nodes
    jmin, top = problem.min_nodes, np.minimum(problem.max_nodes, problem.idle_nodes)
    tables = problem.value_tables()
    fixed_nodes, fixed_value = 0, 0.0  # of the tasks after j, fixed
    for j in range(J - 1, -1, -1):
        c, n = int(cur[j]), int(counts[j])
        c_ok = c != 0 and jmin[j] <= c <= top[j]
        if c_ok and n != c and bound.best_value(total, fixed_nodes, fixed_value, j,
                                                 np.array([c])) >= need:
            sol = solve((j,), (j, c))
            if sol is not None:
                counts = sol
                n = c
        if n != 0 and not (c_ok and n == c):
            smaller = np.concatenate(([0], np.arange(jmin[j], n)))
            if bound.best_value(total, fixed_nodes, fixed_value, j, smaller) >= need:
                sol = solve((j,), None)
                if sol is not None:
                    counts = sol
                    n = int(counts[j])
        counts[j] = n
        model.fix(j, n)
        fixed_nodes += n
        fixed_value += float(tables[j][n])
    if int(counts.sum()) > total:
        raise SolverFailed("tie-breaking stages lost the optimum (solver tolerances)")
    return counts


class _LagrangianBound:
    """Upper bounds on the value of count vectors by relaxing the capacity row with a price
    lambda >= 0 [objective units per node] (Lagrangian relaxation of the multiple-choice
    knapsack; e.g. Kellerer, Pferschy, Pisinger, "Knapsack Problems", Springer 2004, Section 11.2):
    for any vector y with sum_i y_i <= cap, value(y) <= lambda cap + sum_i max_k (f_i(k) -
    lambda k). Built lazily: a (J, max_j top_j + 1) float64 table of f, -inf where not
    admissible (about 8 J (N + 1) bytes)."""

    def __init__(self, problem: AllocationProblem):
        self.problem = problem
        self.F: np.ndarray | None = None
        self.prices: dict[int, tuple[float, np.ndarray]] = {}

    def _table(self) -> np.ndarray:
        if self.F is None:
            tables = self.problem.value_tables()
            width = max(len(t) for t in tables)
            F = np.full((len(tables), width), -np.inf)
            for j, t in enumerate(tables):
                F[j, :len(t)] = t
            self.F = F
            self.k = np.arange(width, dtype=float)
        return self.F

    def _price(self, cap: int) -> tuple[float, np.ndarray]:
        """lambda minimising the bound for all tasks free with capacity ``cap`` [nodes]
        (bisection on the subgradient cap - sum_i argmax_k (f_i(k) - lambda k)), and the
        prefix sums (J + 1,) of h_i(lambda) = max_k (f_i(k) - lambda k)."""
        if cap not in self.prices:
            F = self._table()
            finite = F[np.isfinite(F)]
            lo, hi = 0.0, float(finite.max() - finite.min()) + 1.0
            if int(np.argmax(F, axis=1).sum()) > cap:
                for _ in range(60):
                    mid = 0.5 * (lo + hi)
                    if int(np.argmax(F - mid * self.k, axis=1).sum()) > cap:
                        lo = mid
                    else:
                        hi = mid
            else:
                hi = 0.0
            h = (F - hi * self.k).max(axis=1)
            self.prices[cap] = (hi, np.concatenate(([0.0], np.cumsum(h))))
        return self.prices[cap]

    def best_value(self, cap: int, fixed_nodes: int, fixed_value: float, j: int,
                   choices: np.ndarray | None) -> float:
        """An upper bound [objective units] on the value of vectors with total <= ``cap``
        [nodes], the tasks after ``j`` fixed (``fixed_nodes`` nodes, ``fixed_value``), task
        ``j`` at one of ``choices`` (counts; None = free) and the tasks before it free.
        ``inf`` when there is nothing to bound."""
        if cap < fixed_nodes:
            return -np.inf
        lam, prefix = self._price(cap)
        if choices is None:
            own = prefix[j + 1] - prefix[j]
        else:
            row = self._table()[j, choices]
            own = float((row - lam * choices).max())
        return lam * (cap - fixed_nodes) + fixed_value + own + prefix[j]

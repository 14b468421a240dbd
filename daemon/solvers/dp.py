"""Exact dynamic program for the count-level allocation problem (DESIGN §4).

The problem is a multiple-choice knapsack: each task j picks one count n_j from its
admissible set A_j = {0} U [Jmin_j, min(Jmax_j, N)] with value f_j(n_j)
(:meth:`AllocationProblem.value_tables`, BFTrainer arXiv 2106.12091 §3 eq. 1-9 at count
level), subject to sum_j n_j <= N.
"""

from __future__ import annotations

import time

import numpy as np

from .problem import AllocationProblem, Solution

_CHUNK_ELEMENTS = 1 << 20  # cap on the (capacities x counts) block materialised at once
_LOOP_MAX_COUNTS = 512  # loop over counts (large pools, few counts), else blocks
_LOOP_MIN_NODES = 1024


def _preference_order(table: np.ndarray, current: int, min_nodes: int) -> np.ndarray:
    """Admissible counts of one task in tie-breaking order: c_j first (when admissible),
    then ascending. Shape (|A_j|,), int64."""
    top = len(table) - 1
    adm = np.concatenate(([0], np.arange(min_nodes, top + 1, dtype=np.int64))) if min_nodes <= top \
        else np.zeros(1, dtype=np.int64)
    adm = adm.astype(np.int64)
    if current != 0 and (adm == current).any():
        adm = np.concatenate(([current], adm[adm != current]))
    return adm


def _best_own_count(table: np.ndarray, order: np.ndarray) -> int:
    """argmax of one task's table over its admissible counts, ties broken by ``order``."""
    vals = table[order]
    return int(order[int(np.argmax(vals))])


def solve_dp(problem: AllocationProblem) -> Solution:
    """Solve ``problem`` exactly by dynamic programming over tasks and node counts.

    V_j(m) = max over n in A_j, n <= m of V_{j-1}(m - n) + f_j(n), for capacity m = 0..N
    (V_0 = 0), vectorised over m with numpy; a choice table per task recovers the argmax.
    Cost O(sum_j |A_j| * N) time, O(J * N) memory for the choice tables.

    Shortcut (exact): when the tasks' own best counts (argmax f_j) sum to <= N, they are the
    answer without a DP.

    Ties are broken deterministically: at each task prefer keeping c_j, then fewer nodes; the
    backtrack starts from the smallest capacity that reaches the optimum.

    Returns a :class:`Solution` with ``status="optimal"`` and ``bound == objective``
    (objective re-scored by :meth:`AllocationProblem.evaluate`). Raises nothing for a valid
    problem.
    """
    t0 = time.perf_counter()
    J, N = problem.num_tasks, problem.idle_nodes
    tables = problem.value_tables()
    orders = [
        _preference_order(tables[j], int(problem.current_nodes[j]), int(problem.min_nodes[j]))
        for j in range(J)
    ]
    own = np.array([_best_own_count(tables[j], orders[j]) for j in range(J)], dtype=np.int64)
    if int(own.sum()) <= N:
        counts = own
    else:
        counts = _knapsack(tables, orders, N)
    obj = problem.evaluate(counts)
    return Solution(counts=counts, objective=obj, bound=obj,
                    solve_ms=(time.perf_counter() - t0) * 1e3, solver="dp", status="optimal")


def _knapsack(tables: list[np.ndarray], orders: list[np.ndarray], N: int) -> np.ndarray:
    """The DP proper; returns counts (J,) int64."""
    J = len(tables)
    value = np.zeros(N + 1)  # best value with total count <= m (monotone in m)
    choices: list[np.ndarray] = []
    for j in range(J):
        f = tables[j]
        order = orders[j]
        top = len(f) - 1
        if len(order) <= _LOOP_MAX_COUNTS and N >= _LOOP_MIN_NODES:
            # one shifted max per admissible count, in preference order; strict '>' keeps
            # the earlier (preferred) count on ties
            new_value = np.full(N + 1, -np.inf)
            choice = np.zeros(N + 1, dtype=np.int64)
            for n in order.tolist():
                cand = value[:N + 1 - n] + f[n]
                tail = new_value[n:]
                better = cand > tail
                tail[better] = cand[better]
                choice[n:][better] = n
            value = new_value
            choices.append(choice)
            continue
        # padded[top + m - n] == value[m - n], -inf for m < n
        padded = np.concatenate((np.full(top, -np.inf), value))
        windows = np.lib.stride_tricks.sliding_window_view(padded, top + 1)  # (N+1, top+1)
        cols = top - order  # window column holding value[m - n] for count n
        gains = f[order]
        new_value = np.empty(N + 1)
        choice = np.empty(N + 1, dtype=np.int64)
        step = max(1, _CHUNK_ELEMENTS // len(order))
        for lo in range(0, N + 1, step):
            hi = min(N + 1, lo + step)
            cand = windows[lo:hi][:, cols] + gains  # (rows, |A_j|)
            k = np.argmax(cand, axis=1)  # first maximum: preference order
            new_value[lo:hi] = cand[np.arange(hi - lo), k]
            choice[lo:hi] = order[k]
        value = new_value
        choices.append(choice)
    best = value[N]
    m = int(np.argmax(value == best))  # smallest capacity reaching the optimum
    counts = np.zeros(J, dtype=np.int64)
    for j in range(J - 1, -1, -1):
        n = int(choices[j][m])
        counts[j] = n
        m -= n
    return counts

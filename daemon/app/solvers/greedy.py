"""BFTrainer's quota heuristic (``re_allocate_ndf``) at count level: the baseline
(docs/architecture.md, "Solver backends")."""

from __future__ import annotations

import math
import time

import numpy as np

from .problem import AllocationProblem, Solution


def solve_greedy(problem: AllocationProblem) -> Solution:
    """Even-share quota heuristic of BFTrainer (arXiv 2106.12091, baseline ``re_allocate_ndf``).

    With share s = N // J, each task first gets q_j = min(s, Jmax_j) * min(1, max(s - Jmin_j, 0))
    (the original rule: a task whose share equals Jmin_j gets 0; kept as the baseline). The
    leftover L = N - sum q is then handed out in task order: a task with q_j < Jmax_j takes
    inc = min(Jmax_j - q_j, L) unless q_j + inc < Jmin_j.

    Ignores rescale costs, curve shapes and cost curves (``cost_values``; they do enter the
    re-scored objective). Returns a feasible :class:`Solution` (counts (J,),
    objective re-scored by :meth:`AllocationProblem.evaluate`, ``bound = inf``,
    ``status="feasible"``).
    """
    t0 = time.perf_counter()
    J, N = problem.num_tasks, problem.idle_nodes
    q = np.zeros(J, dtype=np.int64)
    if J:
        share = N // J
        for j in range(J):
            jmin, jmax = int(problem.min_nodes[j]), int(problem.max_nodes[j])
            q[j] = min(share, jmax) * min(1, max(share - jmin, 0))
        leftover = N - int(q.sum())
        for j in range(J):
            jmin, jmax = int(problem.min_nodes[j]), int(problem.max_nodes[j])
            if q[j] < jmax:
                inc = min(jmax - int(q[j]), leftover)
                if q[j] + inc < jmin:
                    continue
                q[j] += inc
                leftover -= inc
    obj = problem.evaluate(q)
    return Solution(counts=q, objective=obj, bound=math.inf,
                    solve_ms=(time.perf_counter() - t0) * 1e3, solver="greedy", status="feasible")

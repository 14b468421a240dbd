"""Helpers shared by the allocation-backend tests: exhaustive enumeration of count vectors,
relative comparison of objectives."""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from offcut.daemon.app.solvers.problem import AllocationProblem


def count_vectors(p: AllocationProblem) -> Iterator[tuple[int, ...]]:
    """Every feasible count vector: prod_j ({0} U [Jmin_j, min(Jmax_j, N)]) with sum <= N."""
    N = p.idle_nodes
    choices = []
    for j in range(p.num_tasks):
        top = min(int(p.max_nodes[j]), N)
        choices.append([0] + list(range(int(p.min_nodes[j]), top + 1)))
    for combo in itertools.product(*choices):
        if sum(combo) <= N:
            yield combo


def fit_current(cur, idle_nodes: int):
    """Lower the largest current counts c_j, one node at a time, until they fit the idle pool
    (sum c_j <= N, as the problem requires); ``cur`` (J,) int array, changed in place and
    returned."""
    while cur.sum() > idle_nodes:
        cur[int(cur.argmax())] -= 1
    return cur


def brute_force(p: AllocationProblem) -> float:
    """Optimum by enumerating every count vector in prod_j ({0} U [Jmin_j, min(Jmax_j, N)])."""
    best = -math.inf
    for combo in count_vectors(p):
        best = max(best, p.evaluate(combo))
    return best


def rel_close(a: float, b: float, rtol: float = 1e-9) -> bool:
    """|a - b| <= rtol * max(1, |a|, |b|): equal up to a relative ``rtol`` (absolute near 0)."""
    return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))


def rule_counts(p: AllocationProblem) -> tuple[int, ...]:
    """The exact backends' tie rule (docs/architecture.md, "The tie rule",
    ``offcut.daemon.app.solvers.ties``) by enumeration, written from its statement: every task's own
    best count (ties: c_j, then fewer nodes) when they fit in N; else among the vectors within 1e-12
    (1 + sum_j max_{A_j} |f_j|) of the optimum the fewest total nodes, then, from the last task
    backwards, c_j first, then fewer nodes."""
    tabs = p.value_tables()
    J, N = p.num_tasks, p.idle_nodes

    def rank(j: int, n: int) -> int:
        c = int(p.current_nodes[j])
        return 0 if (n == c and c != 0) else n + 1

    adm = [[0] + list(range(int(p.min_nodes[j]), len(tabs[j]))) for j in range(J)]
    own = [min(adm[j], key=lambda n, j=j: (-tabs[j][n], rank(j, n))) for j in range(J)]
    if sum(own) <= N:
        return tuple(own)
    tol = 1e-12 * (1 + sum(max(abs(tabs[j][n]) for n in adm[j]) for j in range(J)))
    vecs = list(count_vectors(p))
    vals = [p.evaluate(v) for v in vecs]
    best = max(vals)
    opt = [v for v, x in zip(vecs, vals) if x >= best - tol]
    fewest = min(sum(v) for v in opt)
    return min((v for v in opt if sum(v) == fewest),
               key=lambda v: tuple(rank(j, v[j]) for j in range(J - 1, -1, -1)))

"""Helpers shared by the allocation-backend tests: exhaustive enumeration of count vectors,
relative comparison of objectives."""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from offcut.daemon.solvers.problem import AllocationProblem


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


def brute_force(p: AllocationProblem) -> float:
    """Optimum by enumerating every count vector in prod_j ({0} U [Jmin_j, min(Jmax_j, N)])."""
    best = -math.inf
    for combo in count_vectors(p):
        best = max(best, p.evaluate(combo))
    return best


def rel_close(a: float, b: float, rtol: float = 1e-9) -> bool:
    """|a - b| <= rtol * max(1, |a|, |b|): equal up to a relative ``rtol`` (absolute near 0)."""
    return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))

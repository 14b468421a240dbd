"""BFTrainer's objective (arXiv 2106.12091, Section 3; docs/architecture.md, "Allocation"): one
solve of the throughput problem, samples over the look-ahead Tfwd net of rescale losses."""

from __future__ import annotations

from .base import AllocationPolicy, AllocationRequest, Solve


class ThroughputPolicy(AllocationPolicy):
    """Maximise sum_j f_j(n_j) (the problem as the scheduler builds it): one ``solve``."""

    name = "throughput"

    def allocate(self, request: AllocationRequest, solve: Solve) -> list[int]:
        """BFTrainer's counts (arXiv 2106.12091, Section 4): the answer of one solve of the
        request's problem, one count per task."""
        return [int(c) for c in solve(request.problem).counts]

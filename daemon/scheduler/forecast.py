"""An idle forecast: each idle node's expected remaining idle time, for experiments
(docs/architecture.md §4, "The horizon"; ``benchmarks/horizon_oracle.py``).

BFTrainer weighs every rescale against one fixed look-ahead Tfwd. Slurm often knows how long
a node will stay idle (its next job's start, a reservation); an :class:`IdleForecast` hands the
scheduler such a figure per node, to measure what knowing it is worth. offcutd never sets one:
it is not persisted nor journaled, so a daemon using it would not re-apply its journal to the
same placements after a restart. Without one (``Scheduler.idle_forecast = None``, the default)
nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

#: how the count-level problem's horizon is chosen: ``fixed`` = Tfwd (``tfwd_s``); ``median`` /
#: ``mean`` = the median / mean expected remaining idle time of the idle pool at the event
HORIZONS = ("fixed", "median", "mean")


@dataclass(frozen=True)
class IdleForecast:
    """Expected remaining idle time of idle nodes, and what the scheduler does with it.

    Attributes:
        remaining_s: ``(nodes, t) -> array (len(nodes),)``: each node's expected remaining
            idle time [s] at event time ``t`` [s since epoch], >= 0 (an oracle replaying a
            log knows the true one).
        placement: choose node identities by it: a shrinking task releases the nodes that
            leave soonest, growing tasks take the free nodes that stay longest, the task with
            the highest preemption cost (Tcdw x its rate at the new count, samples) first.
        horizon: one of :data:`HORIZONS`: the look-ahead [s] the allocation problem weighs
            rescale costs against (BFTrainer, arXiv 2106.12091 §3, the Tfwd of its objective).
        min_horizon_s: the smallest horizon used [s] (> 0: the problem needs a positive one).
    """

    remaining_s: Callable[[Sequence[str], float], np.ndarray]
    placement: bool = False
    horizon: Literal["fixed", "median", "mean"] = "fixed"
    min_horizon_s: float = 1.0

    def __post_init__(self) -> None:
        if self.horizon not in HORIZONS:
            raise ValueError(f"horizon must be one of {', '.join(HORIZONS)}, got {self.horizon!r}")
        if not self.min_horizon_s > 0:
            raise ValueError(f"min_horizon_s must be > 0, got {self.min_horizon_s!r}")

    def by_node(self, nodes: Sequence[str], t: float) -> dict[str, float]:
        """``{node: expected remaining idle time [s]}`` of ``nodes`` at ``t``."""
        nodes = list(nodes)
        return dict(zip(nodes, np.asarray(self.remaining_s(nodes, t), dtype=float).tolist()))

    def horizon_s(self, pool: Sequence[str], t: float, tfwd_s: float) -> float:
        """The allocation horizon [s] at ``t`` on the idle ``pool``: ``tfwd_s`` when
        ``horizon`` is ``fixed`` or the pool is empty, else the pool's median / mean expected
        remaining idle time, at least ``min_horizon_s``."""
        if self.horizon == "fixed" or not pool:
            return tfwd_s
        left = np.asarray(self.remaining_s(list(pool), t), dtype=float)
        value = float(np.median(left) if self.horizon == "median" else left.mean())
        return max(self.min_horizon_s, value)

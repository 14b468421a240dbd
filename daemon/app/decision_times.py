"""Decision-time statistics of a long-running daemon in fixed memory (docs/operations.md,
"Retention: what is kept, and for how long": nothing grows with the number of events).

Every decision (event in, allocation solved, journal committed) adds its wall time to

* a DDSketch (Masson, Rim and Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch with
  Relative-Error Guarantees", VLDB 2019; the ``ddsketch`` package), whose quantiles are within
  :data:`RELATIVE_ACCURACY` (1 %) of the exact ones and whose size is capped at
  :data:`BIN_LIMIT` bins (collapsing the lowest bins first, so the high percentiles an operator
  watches keep their accuracy), for ``GetStatus``'s p50/p95/p99;
* the exact count, sum and maximum;
* cumulative counts per Prometheus bucket (``offcut_decision_seconds``), as a Prometheus
  histogram keeps them.

The figures cover the daemon's lifetime since it started (they are not persisted).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ddsketch import LogCollapsingLowestDenseDDSketch

#: relative accuracy of the sketch's quantiles (a reported p99 of 10 ms is within 9.9-10.1 ms
#: of the exact p99 of the decisions recorded)
RELATIVE_ACCURACY = 0.01
#: upper bounds [s] of the Prometheus latency buckets (decisions and RPCs)
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: the most bins the sketch keeps (~2 KiB at 1 %: covers 0.01 ms to hours at full accuracy)
BIN_LIMIT = 2048


@dataclass(frozen=True)
class DecisionTimeSummary:
    """A copy of the figures (all times in ms, except ``sum_s`` and the buckets).

    Attributes:
        count: decisions recorded.
        p50_ms, p95_ms, p99_ms: quantiles (within :data:`RELATIVE_ACCURACY`; 0 when empty).
        max_ms: the exact largest decision time (0 when empty).
        sum_s: the exact sum of the decision times [s].
        buckets: cumulative ``(upper bound [s], count)`` per bucket bound, then
            ``(inf, count)``: Prometheus's ``le`` buckets.
    """

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    sum_s: float
    buckets: tuple[tuple[float, int], ...]


class DecisionTimes:
    """Decision times [ms] in fixed memory: a quantile sketch, count, sum, maximum and
    Prometheus bucket counts. Not thread-safe: the engine records and reads under its lock.

    Args:
        bucket_bounds_s: upper bounds [s] of the cumulative buckets, increasing
            (default :data:`LATENCY_BUCKETS_S`).

    Raises:
        ValueError: bounds not strictly increasing and positive.
    """

    def __init__(self, bucket_bounds_s: tuple[float, ...] = LATENCY_BUCKETS_S):
        bounds = tuple(float(b) for b in bucket_bounds_s)
        if any(b <= 0 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"bucket bounds must be positive and increasing: {bounds}")
        self._bounds = bounds
        self._per_bucket = [0] * (len(bounds) + 1)  # the last one: above every bound
        self._sketch = LogCollapsingLowestDenseDDSketch(RELATIVE_ACCURACY, bin_limit=BIN_LIMIT)
        self.count = 0
        self._sum_ms = 0.0
        self._max_ms = 0.0

    def record(self, ms: float) -> None:
        """Add one decision time [ms] (negative values, from a clock step, count as 0)."""
        ms = max(0.0, float(ms))
        self._sketch.add(ms)
        self.count += 1
        self._sum_ms += ms
        self._max_ms = max(self._max_ms, ms)
        self._per_bucket[bisect.bisect_left(self._bounds, ms / 1000.0)] += 1

    def _quantile(self, q: float) -> float:
        value = self._sketch.get_quantile_value(q) if self.count else None
        # the sketch answers within its relative accuracy: never above the exact maximum
        return 0.0 if value is None else min(max(0.0, float(value)), self._max_ms)

    def summary(self) -> DecisionTimeSummary:
        """The figures now (a copy)."""
        cumulative, running = [], 0
        for bound, n in zip(self._bounds + (float("inf"),), self._per_bucket):
            running += n
            cumulative.append((bound, running))
        return DecisionTimeSummary(
            count=self.count, p50_ms=self._quantile(0.50), p95_ms=self._quantile(0.95),
            p99_ms=self._quantile(0.99), max_ms=self._max_ms, sum_s=self._sum_ms / 1000.0,
            buckets=tuple(cumulative))

"""A task's measured throughput and power per node count, from its clean report intervals
(issue "Learn scalability online"; the rules are in the "Measurements" and "Power" sections of
:mod:`offcut.daemon.app.learning`).

A clean interval at n nodes adds its seconds and samples to count n (the rate at n is the
time-weighted mean, sum samples / sum seconds; the spread of the per-interval rates, by a
weighted Welford update with weights = seconds, gives its standard error) and, when both ends
carry energy, its joules (power at n = sum J / sum s). The credibility guards keep every figure
finite: intervals longer than :data:`MAX_INTERVAL_S`, rates above :data:`MAX_RATE` and powers
above :data:`MAX_POWER_W` are not recorded.

Units: seconds [s], samples, samples/s, energy [J], power [W], node counts.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

#: credibility guards: such intervals are not recorded as measurements
MAX_INTERVAL_S = 1e8
MAX_RATE = 1e18
MAX_POWER_W = 1e18
#: relative standard error assumed at a count measured by a single interval
SINGLE_INTERVAL_REL_SE = 0.1


class CountStat:
    """Clean-interval statistics of one node count (weighted Welford, weights = seconds)."""

    __slots__ = ("seconds", "samples", "intervals", "mean", "m2", "w2", "energy_j", "energy_s")

    def __init__(self) -> None:
        self.seconds = 0.0     # sum of interval lengths [s]
        self.samples = 0.0     # sum of samples
        self.intervals = 0     # number of clean intervals
        self.mean = 0.0        # weighted mean of per-interval rates (== samples / seconds)
        self.m2 = 0.0          # sum w (r - mean)^2
        self.w2 = 0.0          # sum w^2
        self.energy_j = 0.0    # energy over the intervals with energy at both ends [J]
        self.energy_s = 0.0    # their seconds

    @property
    def rate(self) -> float:
        """Time-weighted mean rate [samples/s]; 0 before any second is measured."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def power_w(self) -> float | None:
        """Mean power [W] over the intervals with energy, None without one."""
        return self.energy_j / self.energy_s if self.energy_s > 0 else None

    def std_error(self) -> float:
        """Standard error [samples/s] of the mean rate."""
        rate = self.rate
        if self.intervals < 2 or self.seconds <= 0:
            return SINGLE_INTERVAL_REL_SE * rate
        k_eff = self.seconds / (self.w2 / self.seconds)  # (sum w)^2 / sum w^2, overflow-safe
        if not k_eff > 1.0 + 1e-12:
            return SINGLE_INTERVAL_REL_SE * rate
        var = max(self.m2, 0.0) / self.seconds
        se = math.sqrt(var / (k_eff - 1.0))
        return se if math.isfinite(se) else SINGLE_INTERVAL_REL_SE * rate

    def add(self, dt: float, ds: float, de: float | None) -> bool:
        """Add an interval of ``dt`` [s] with ``ds`` samples and ``de`` [J] (None: no energy);
        False (nothing changed) when it fails the credibility guards."""
        if dt > MAX_INTERVAL_S:
            return False
        r = ds / dt
        if not (math.isfinite(r) and 0 <= r <= MAX_RATE):
            return False
        seconds, samples = self.seconds + dt, self.samples + ds
        delta = r - self.mean
        mean = self.mean + (dt / seconds) * delta
        m2 = self.m2 + dt * delta * (r - mean)
        w2 = self.w2 + dt * dt
        if not all(map(math.isfinite, (seconds, samples, mean, m2, w2))):
            return False
        self.seconds, self.samples, self.mean, self.m2, self.w2 = seconds, samples, mean, m2, w2
        self.intervals += 1
        if de is not None:
            p = de / dt
            ej = self.energy_j + de
            if math.isfinite(p) and 0 <= p <= MAX_POWER_W and math.isfinite(ej):
                self.energy_j, self.energy_s = ej, self.energy_s + dt
        return True

    def to_dict(self, nodes: int) -> dict[str, Any]:
        """JSON-able fields, ``nodes`` first."""
        return {"nodes": nodes, **{k: getattr(self, k) for k in self.__slots__}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CountStat":
        """Inverse of :meth:`to_dict` (``nodes`` is the caller's)."""
        st = cls()
        for k in cls.__slots__:
            setattr(st, k, int(d[k]) if k == "intervals" else float(d[k]))
        return st


class ThroughputStats:
    """The :class:`CountStat` of every measured node count.

    ``by_count``: count -> its statistics; ``counts``: the measured counts, sorted;
    ``revision``: bumped at every recorded interval (in memory only: what caches of a model
    fitted to these statistics key on).
    """

    def __init__(self) -> None:
        self.by_count: dict[int, CountStat] = {}
        self.counts: list[int] = []
        self.revision = 0

    def __getitem__(self, n: int) -> CountStat:
        return self.by_count[n]

    def get(self, n: int) -> CountStat | None:
        """The statistics of count ``n``, None when it is not measured."""
        return self.by_count.get(n)

    def add_clean(self, n: int, dt: float, ds: float, de: float | None) -> tuple[bool, bool]:
        """Add one clean interval at ``n`` nodes (``dt`` [s], ``ds`` samples, ``de`` [J] or
        None); returns (new count measured, model changed)."""
        st = self.by_count.get(n) or CountStat()
        if not st.add(dt, ds, de):
            return False, False
        self.revision += 1
        new = n not in self.by_count
        if new:
            self.by_count[n] = st
            bisect.insort(self.counts, n)
        return new, True

    def power_at(self, n: int, prior_node_power_w: float) -> float:
        """Power [W] on ``n`` nodes: measured, else the per-node power at the nearest count
        with energy (the smaller one on a tie) times n, else ``prior_node_power_w`` [W per
        node] times n; 0 for n <= 0."""
        if n <= 0:
            return 0.0
        with_power = [m for m in self.counts if self.by_count[m].energy_s > 0]
        if not with_power:
            return sane_prior(prior_node_power_w) * n
        best = min(with_power, key=lambda m: (abs(m - n), m))
        st = self.by_count[best]
        p = st.energy_j / st.energy_s
        value = p if best == n else p / best * n
        return float(value) if math.isfinite(value) and value >= 0 else 0.0

    def per_node_rate(self) -> float | None:
        """Rate [samples/s] per node at the smallest measured count; None before any."""
        if not self.counts:
            return None
        m = self.counts[0]
        return self.by_count[m].rate / m

    def measured(self) -> dict[int, dict[str, Any]]:
        """count -> {"rate": samples/s, "seconds": s, "intervals": clean intervals,
        "power_w": W or None} for every measured count (a fresh dict)."""
        out = {}
        for m in self.counts:
            st = self.by_count[m]
            out[m] = {"rate": st.rate, "seconds": st.seconds, "intervals": st.intervals,
                      "power_w": st.power_w}
        return out

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-able: :meth:`CountStat.to_dict` of each count, ascending."""
        return [self.by_count[m].to_dict(m) for m in self.counts]

    @classmethod
    def from_list(cls, items: list[dict[str, Any]]) -> "ThroughputStats":
        """Inverse of :meth:`to_list`."""
        x = cls()
        for sd in items:
            x.by_count[int(sd["nodes"])] = CountStat.from_dict(sd)
        x.counts = sorted(x.by_count)
        return x


def sane_prior(x: float) -> float:
    """A prior as a finite value >= 0 (anything else counts as 0)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0

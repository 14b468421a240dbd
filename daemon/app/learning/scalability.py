"""A task's throughput curve fitted to its measured rates: point estimate, the optimistic
allocation curve and the uncertainty band (issue "Learn scalability online"; the rules are in
the "Point estimate", "The exploration rule" and "Uncertainty" sections of
:mod:`offcut.daemon.app.learning`).

Measured counts m_1 < ... < m_k with rates r_i and weights w_i (seconds) get a weighted
isotonic fit r^_i (``scipy.optimize.isotonic_regression``, PAVA) and an Amdahl serial fraction
s in [0, 1] (Amdahl, AFIPS 1967: r(n) = r1 n / (1 + s (n - 1))) by weighted least squares.
Measured counts use r^_i, between them linear interpolation, outside the Amdahl shape anchored
at the nearest measured count; above m_k the allocation curve uses the optimistic s / 2
(optimism in the face of uncertainty, as in UCB; Pollux, Qiao et al., OSDI '21).

Units: node counts, throughputs [samples/s], priors [samples/s per node].
"""

from __future__ import annotations

import bisect
import math
import operator
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression, minimize_scalar

from offcut.daemon.app.learning.throughput import ThroughputStats, sane_prior

#: band around the prior when nothing is measured: [prior / f, prior * f]
PRIOR_BAND_FACTOR = 2.0
#: the curve's grid on its nonlinear parts
GRID_FACTOR = 1.25
MAX_GRID_ABOVE = 16
MAX_GRID_BELOW = 8

#: (measured counts, isotonic rates [samples/s], Amdahl serial fraction)
Fit = tuple[np.ndarray, np.ndarray, float]


def amdahl_shape(n: np.ndarray, s: float) -> np.ndarray:
    """Amdahl's speed-up shape n / (1 + s (n - 1)) for n >= 1, s in [0, 1]."""
    return n / (1.0 + s * (n - 1.0))


def amdahl_serial_fraction(ms: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Serial fraction s in [0, 1] of the weighted least-squares fit of r1 n / (1 + s (n - 1))
    to (ms, y) with weights w (r1 >= 0 in closed form for each s; s by grid + bounded Brent)."""
    top = float(y.max())
    if not top > 0:
        return 0.0
    y = y / top
    w = w / w.sum()

    def sse(s: float) -> float:
        g = amdahl_shape(ms, s)
        r1 = float(np.sum(w * g * y) / np.sum(w * g * g))
        return float(np.sum(w * (y - r1 * g) ** 2))

    grid = np.concatenate(([0.0], np.logspace(-4.0, 0.0, 33)))
    vals = [sse(float(s)) for s in grid]
    i = int(np.argmin(vals))
    best_s, best = float(grid[i]), vals[i]
    lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])
    if hi > lo:
        res = minimize_scalar(sse, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7})
        if math.isfinite(float(res.fun)) and float(res.fun) < best:
            best_s = float(res.x)
    return min(max(best_s, 0.0), 1.0)


def geometric_grid(a: int, b: int, most: int) -> list[int]:
    """Integers from a to b (a >= 1, b > a) spaced by a factor >= GRID_FACTOR, at most
    ``most`` + 1 of them, always with a and b."""
    f = max(GRID_FACTOR, (b / a) ** (1.0 / most))
    out, x = [a], float(a)
    while True:
        x *= f
        if x >= b:
            break
        out.append(int(round(x)))
    out.append(b)
    return out


def _finite_non_negative(values: Any) -> np.ndarray:
    """``values`` with NaN -> 0, +inf -> the largest float, then clipped at 0."""
    out = np.nan_to_num(np.asarray(values, dtype=float), nan=0.0,
                        posinf=np.finfo(float).max, neginf=0.0)
    return np.clip(out, 0.0, None)


class ScalabilityModel:
    """Throughput estimates fitted to ``stats`` (read, never changed), the fit cached per
    ``stats.revision``."""

    def __init__(self, stats: ThroughputStats) -> None:
        self.stats = stats
        self._cache: tuple[int, Fit | None] | None = None

    def fit(self) -> Fit | None:
        """(measured counts, isotonic rates, Amdahl serial fraction); None when nothing is
        measured."""
        if self._cache is not None and self._cache[0] == self.stats.revision:
            return self._cache[1]
        fit = None
        counts = self.stats.counts
        if counts:
            ms = np.array(counts, dtype=float)
            r = np.array([self.stats[m].rate for m in counts])
            w = np.array([self.stats[m].seconds for m in counts])
            if len(ms) >= 2:
                rh = np.asarray(isotonic_regression(r, weights=w / w.sum()).x, dtype=float)
                rh = np.maximum.accumulate(np.clip(np.nan_to_num(rh), 0.0, None))
                s = amdahl_serial_fraction(ms, rh, w)
            else:
                rh, s = r, 0.0
            fit = (ms, rh, s)
        self._cache = (self.stats.revision, fit)
        return fit

    def values(self, ns: np.ndarray, prior: float, optimistic: bool) -> np.ndarray:
        """Point (or, above the largest measured count, optimistic) estimates [samples/s] at
        ``ns`` nodes; ``prior`` [samples/s per node] linearly when nothing is measured."""
        fit = self.fit()
        ns = np.asarray(ns, dtype=float)
        if fit is None:
            out = sane_prior(prior) * np.maximum(ns, 0.0)
        else:
            ms, rh, s = fit
            out = np.zeros_like(ns)
            below = (ns > 0) & (ns < ms[0])
            out[below] = rh[0] * amdahl_shape(ns[below], s) / amdahl_shape(ms[0], s)
            mid = (ns >= ms[0]) & (ns <= ms[-1])
            out[mid] = np.interp(ns[mid], ms, rh)
            above = ns > ms[-1]
            sa = s / 2.0 if optimistic else s
            out[above] = rh[-1] * amdahl_shape(ns[above], sa) / amdahl_shape(ms[-1], sa)
        return _finite_non_negative(out)

    def rate_at(self, n: int, prior_rate_per_node: float) -> float:
        """Point estimate [samples/s] on ``n`` nodes; 0 for n <= 0."""
        if n <= 0:
            return 0.0
        return float(self.values(np.array([n]), prior_rate_per_node, optimistic=False)[0])

    def curve(self, min_nodes: int, max_nodes: int,
              prior_rate_per_node: float) -> tuple[list[int], list[float]]:
        """The allocation curve (see :meth:`offcut.daemon.app.learning.TaskLearner.curve`): node
        counts from 0 to ``max_nodes``, throughputs [samples/s] non-decreasing. Raises
        ValueError unless 0 <= min_nodes <= max_nodes."""
        lo, hi = operator.index(min_nodes), operator.index(max_nodes)
        if not 0 <= lo <= hi:
            raise ValueError(f"need 0 <= min_nodes <= max_nodes, got {lo}, {hi}")
        if hi == 0:
            return [0], [0.0]
        lo = max(lo, 1)
        pts = {0, lo, hi}
        counts = self.stats.counts
        if self.fit() is not None:
            m1, mk = counts[0], counts[-1]
            pts.update(m for m in counts if lo <= m <= hi)
            if lo < m1:
                top = min(m1, hi)
                if top > lo:
                    pts.update(geometric_grid(lo, top, MAX_GRID_BELOW))
            if hi > mk:
                start = max(mk, lo)
                if hi > start:
                    pts.update(geometric_grid(start, hi, MAX_GRID_ABOVE))
        ns = sorted(pts)
        vals = self.values(np.array(ns, dtype=float), prior_rate_per_node, optimistic=True)
        vals = np.maximum.accumulate(vals)
        return ns, [float(v) for v in vals]

    def band(self, n: int, prior_rate_per_node: float) -> tuple[float, float, float]:
        """(low, estimate, high) [samples/s] on ``n`` nodes, low <= estimate <= high, finite
        and >= 0; (0, 0, 0) for n <= 0."""
        if n <= 0:
            return 0.0, 0.0, 0.0
        est = self.rate_at(n, prior_rate_per_node)
        fit = self.fit()
        if fit is None:
            low, high = est / PRIOR_BAND_FACTOR, est * PRIOR_BAND_FACTOR
        else:
            low, high = self._measured_band(n, est, fit)
        low, est, high = (float(v) for v in _finite_non_negative([low, est, high]))
        return min(low, est), est, max(high, est)

    def _measured_band(self, n: int, est: float, fit: Fit) -> tuple[float, float]:
        """(low, high) [samples/s] on ``n`` > 0 nodes around the estimate ``est`` once counts
        are measured (module docstring of :mod:`offcut.daemon.app.learning`, "Uncertainty")."""
        ms, rh, _ = fit
        counts, stats = self.stats.counts, self.stats
        i = bisect.bisect_left(counts, n)
        if i < len(counts) and counts[i] == n:
            se = stats[n].std_error()
            return est - 2.0 * se, est + 2.0 * se
        if i == len(counts):                   # above the largest measured count
            return float(rh[-1]), float(rh[-1]) * n / ms[-1]
        if i == 0:                             # below the smallest
            return float(rh[0]) * n / ms[0], float(rh[0])
        a, b = counts[i - 1], counts[i]        # between m_{i-1} and m_i
        low_a = float(rh[i - 1]) - 2.0 * stats[a].std_error()
        high_b = float(rh[i]) + 2.0 * stats[b].std_error()
        return max(low_a, float(rh[i]) * n / b), min(high_b, float(rh[i - 1]) * n / a)

"""Per-task online model of throughput, power and rescale costs (issue "Learn scalability online").

A task submitted without a scalability curve reports its progress (cumulative samples, the node
count it ran on, optionally cumulative energy); :class:`TaskLearner` turns those reports into
the curve, power and rescale costs the allocation uses (docs/architecture.md §3-4). It is pure
and deterministic: no I/O, no clock, no randomness; the same calls give the same model, and its
state is JSON-able (:meth:`TaskLearner.to_dict`).

Sources: the progress and cost model is BFTrainer's (Liu et al., arXiv 2106.12091 §3: growing
a task from c nodes costs Ps(c) * Tcup samples, shrinking it or losing nodes to preemption
Ps(c) * Tcdw); the extrapolation uses Amdahl's law (Amdahl, AFIPS 1967); learning a job's
throughput online from its own measurements and allocating with the learned model follows
Pollux (Qiao et al., OSDI '21) and MalleTrain (ICPE '24).

Measurements
------------
* The interval between consecutive reports (t0, s0, e0) -> (t1, s1, e1) is *clean* when no
  node-count change (:meth:`TaskLearner.on_allocation`) fell inside it and the count n > 0 was
  constant and equals the report's ``nodes``. A clean interval adds s1 - s0 samples and t1 - t0
  seconds to count n; the rate at n is the time-weighted mean (sum samples / sum seconds), and
  the spread of the per-interval rates gives its standard error. When both ends carry energy it
  also adds e1 - e0 joules (power at n = sum J / sum s of those intervals). Zero-length
  intervals add nothing. The first interval (from the task's start, samples 0, energy 0) is
  never clean: it holds the startup. A change is placed in time by the time passed to
  ``on_allocation``: one later than or at the report's time belongs to the next interval (the
  task measured before it happened). A report whose ``nodes`` is still the count before the
  changes inside its interval comes from the generation that ran on until it was stopped
  (docs/execution.md: the decision comes first, then the old generation checkpoints and
  reports, then the new one starts): its interval is clean at the old count and the changes
  are moved to its time, so the next interval holds the whole pause of the rescale. A pause
  (:meth:`TaskLearner.on_pause`: the generation ended, e.g. on Slurm's preemption signal,
  before the daemon knew of a change) makes its interval not clean, and a rescale interval
  counts its loss from the pause when it came before the change.
* Rescale costs: an interval with exactly one change c -> n at t_r (c > 0, n > 0, ``grow``:
  Tcup, ``shrink``/``preempted``: Tcdw, the report's ``nodes`` == n) lost
  L = r(c) (t_r - t0) + r(n) (t1 - t_r) - (s1 - s0) samples, so T = L / r(c) seconds, clipped
  to [0, (t1 - t_r) r(n) / r(c)]. It waits (the last 64 such intervals) until clean rates at c
  and n exist and is valued with the rates measured then. The learned Tcup / Tcdw is the median
  of the last 128 estimates of its kind; the caller's prior until one exists. A loss longer
  than the gap from the rescale to the next report is censored (under-estimated).
* Credibility guards (so no report can make the model non-finite): intervals longer than
  1e8 s, rates above 1e18 samples/s and powers above 1e18 W are not recorded as measurements.

Point estimate
--------------
Measured counts m_1 < ... < m_k with time-weighted rates r_i and weights w_i = seconds get a
weighted isotonic (non-decreasing) fit r^_i (``scipy.optimize.isotonic_regression``, PAVA). An
Amdahl model r(n) = r1 n / (1 + s (n - 1)), s in [0, 1] the serial fraction, is fitted to
(m_i, r^_i) by weighted least squares when k >= 2 (r1 in closed form for each s, s by a grid
then ``scipy.optimize.minimize_scalar`` on [0, 1]); k == 1 gives s = 0 (linear scaling). The
point estimate (:meth:`TaskLearner.rate_at`) is r^_i at measured counts, linear interpolation
between them, and outside [m_1, m_k] the Amdahl shape with the fitted s anchored at the nearest
measured count: r^_k g_s(n) / g_s(m_k) above, r^_1 g_s(n) / g_s(m_1) below, with
g_s(n) = n / (1 + s (n - 1)). No measurement: ``prior_rate_per_node * n``.

The exploration rule (the allocation curve)
-------------------------------------------
:meth:`TaskLearner.curve` is the curve the allocation maximises over. It equals the point
estimate everywhere except ABOVE the largest measured count m_k, where it uses the optimistic
serial fraction s / 2, anchored at (m_k, r^_k): r^_k g_{s/2}(n) / g_{s/2}(m_k). Unmeasured
larger counts therefore look at least as good as the fit says and no better than linear
scaling from m_k (they lie between the two). The optimiser (docs/architecture.md §4) grows a
task onto an unmeasured count only when this optimistic gain over the look-ahead Tfwd beats the
rescale cost Tcup * Ps(c) and every other use of the nodes; one clean interval there replaces the
guess by a measurement, and the optimism moves up to the new largest count (optimism in the face
of uncertainty, as in UCB). Between and below measured counts there is no optimism: the point
estimate is used. With no measurement at all the curve is the linear prior
``prior_rate_per_node * n``. Everything is deterministic: the same reports give the same curve,
hence the same allocation. The nonlinear parts are sampled on a geometric grid (factor >= 1.25,
at most 16 points above m_k and 8 below m_1), so the curve holds 0, min_nodes, max_nodes, every
measured count in [min_nodes, max_nodes] and at most ~27 other points; the allocator
interpolates linearly between them.

Uncertainty (:meth:`TaskLearner.band`): at a measured count the estimate +- 2 standard errors
of its mean rate (an assumed 10 % relative error while it has a single interval); between
measured counts the monotone bounds [low at m_i, high at m_{i+1}], tightened by linear scaling;
above m_k [r^_k (monotone), r^_k n / m_k (linear)]; below m_1 [r^_1 n / m_1, r^_1]; with no
measurement a factor of 2 either way around the prior.

Power (:meth:`TaskLearner.power_at`): measured power at counts with energy; elsewhere the
per-node power at the nearest such count (the smaller one on a tie) times n; no energy
measured: ``prior_node_power_w * n``.
"""

from __future__ import annotations

import bisect
import math
import operator
import statistics
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression, minimize_scalar

from offcut.daemon.model import ProgressReport, check_finite  # noqa: F401 (re-exported)
from offcut.errors import FailedPrecondition, InvalidArgument

#: kinds of :meth:`TaskLearner.on_allocation`
KINDS = ("start", "grow", "shrink", "stop", "preempted")
#: allocation changes kept between two reports (older ones make the interval unclean)
MAX_PENDING_ALLOCATIONS = 64
#: rescale intervals kept waiting for the rates at both counts
MAX_PENDING_RESCALES = 64
#: rescale estimates kept per direction (the median is over these)
MAX_RESCALE_ESTIMATES = 128
#: credibility guards: such intervals are not recorded as measurements
MAX_INTERVAL_S = 1e8
MAX_RATE = 1e18
MAX_POWER_W = 1e18
#: relative standard error assumed at a count measured by a single interval
SINGLE_INTERVAL_REL_SE = 0.1
#: band around the prior when nothing is measured: [prior / f, prior * f]
PRIOR_BAND_FACTOR = 2.0
#: the curve's grid on its nonlinear parts
GRID_FACTOR = 1.25
MAX_GRID_ABOVE = 16
MAX_GRID_BELOW = 8
_FORMAT = 1


class _Stat:
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
        return self.samples / self.seconds if self.seconds > 0 else 0.0

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

    def to_dict(self, nodes: int) -> dict[str, Any]:
        return {"nodes": nodes, **{k: getattr(self, k) for k in self.__slots__}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "_Stat":
        st = cls()
        for k in cls.__slots__:
            setattr(st, k, int(d[k]) if k == "intervals" else float(d[k]))
        return st


def _fmt(x: float) -> str:
    """A number for an error message: short when that is exact, else repr."""
    short = format(x, ".15g")
    return short if float(short) == x else repr(float(x))


def _real(value: Any, field: str) -> float:
    """``value`` as a finite float. Raises :class:`InvalidArgument` naming ``field`` when it
    is a bool, not a number (:func:`float` refuses it) or not finite."""
    if isinstance(value, bool):
        raise InvalidArgument(f"must be a number, got {value!r}", field)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"must be a number, got {value!r}", field) from None
    return check_finite(x, field)


def _sane(x: float) -> float:
    """A prior as a finite value >= 0 (anything else counts as 0)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


def _g(n: np.ndarray, s: float) -> np.ndarray:
    """Amdahl's speed-up shape n / (1 + s (n - 1)) for n >= 1, s in [0, 1]."""
    return n / (1.0 + s * (n - 1.0))


def _amdahl_serial_fraction(ms: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Serial fraction s in [0, 1] of the weighted least-squares fit of r1 n / (1 + s (n - 1))
    to (ms, y) with weights w (r1 >= 0 in closed form for each s; s by grid + bounded Brent)."""
    top = float(y.max())
    if not top > 0:
        return 0.0
    y = y / top
    w = w / w.sum()

    def sse(s: float) -> float:
        g = _g(ms, s)
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


def _geometric(a: int, b: int, most: int) -> list[int]:
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


class TaskLearner:
    """Online model of one task: throughput per node count, power, rescale costs.

    Fed by the daemon core: :meth:`on_allocation` at every change of the task's node count,
    :meth:`check` / :meth:`observe` for each progress report. Read by the allocation:
    :meth:`curve` (the optimistic curve of the module's exploration rule), :meth:`rate_at`,
    :meth:`band`, :meth:`power_at`, :meth:`rescale_up_s` / :meth:`rescale_down_s`.
    :attr:`version` changes whenever any of those answers may change. The state is JSON-able:
    ``TaskLearner.from_dict(json.loads(json.dumps(x.to_dict())))`` behaves exactly like ``x``.
    See the module docstring for the rules and sources.
    """

    def __init__(self) -> None:
        self._version = 0
        self._count = 0                     # the latest count set by on_allocation
        self._count_at_last = 0             # the count in effect at the last report's time
        self._paused: float | None = None   # when its processes stopped since the last report
        self._last: tuple[float, float] | None = None  # (time, samples) of the last report
        self._last_e: float | None = None   # energy of the last report (None: not measured)
        self._max_e: float | None = None    # the latest reported energy
        # count changes not yet covered by a report: [time, count, kind], time-ordered
        self._allocs: list[list] = []
        self._overflow_time: float | None = None  # latest dropped change (None: none dropped)
        self._dropped: list[int] = []       # counts held across dropped changes
        self._stats: dict[int, _Stat] = {}
        self._ms: list[int] = []            # measured counts, sorted
        self._pending: list[dict[str, Any]] = []  # rescale intervals waiting for rates
        self._up: list[float] = []
        self._down: list[float] = []
        self._fit_cache: tuple[int, Any] | None = None

    # ------------------------------------------------------------------ events
    def on_allocation(self, time: float, count: int, kind: str) -> None:
        """Record that the task's node count changed to ``count`` at ``time`` [s since epoch].

        ``kind`` is one of ``start``, ``grow``, ``shrink``, ``stop``, ``preempted``. Times are
        taken as non-decreasing (an earlier one is moved up to the last known time). Raises
        ValueError for an unknown kind, a negative count or a non-finite time (caller bugs).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown allocation kind {kind!r} (one of {', '.join(KINDS)})")
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"node count must be >= 0, got {count}")
        t = float(time)
        if not math.isfinite(t):
            raise ValueError(f"allocation time must be finite, got {time!r}")
        if self._allocs:
            t = max(t, self._allocs[-1][0])
        elif self._last is not None:
            t = max(t, self._last[0])
        self._allocs.append([t, count, kind])
        if len(self._allocs) > MAX_PENDING_ALLOCATIONS:
            dropped = self._allocs.pop(0)
            if self._count_at_last not in self._dropped:
                self._dropped.append(self._count_at_last)
            self._count_at_last = int(dropped[1])
            self._overflow_time = float(dropped[0])
        self._count = count

    def on_pause(self, time: float) -> None:
        """Record that the task's processes stopped at ``time`` [s since epoch] (its current
        generation ended: checkpointed, failed or preempted; docs/execution.md) before any
        change of its node count is known. The interval holding the pause is not clean, and a
        rescale interval counts its loss from the pause instead of the decision when the pause
        came first (a preemption: Slurm signals the task before the daemon hears of it).
        Raises ValueError for a non-finite time (a caller bug)."""
        t = float(time)
        if not math.isfinite(t):
            raise ValueError(f"pause time must be finite, got {time!r}")
        if self._paused is None:
            self._paused = t

    def _held(self) -> list[int]:
        """The counts the task held since its last report, sorted."""
        return sorted({self._count_at_last, *self._dropped, *(a[1] for a in self._allocs)})

    def check(self, report: ProgressReport, field_prefix: str = "") -> None:
        """Raise if ``report`` cannot be accepted now; changes nothing.

        Raises:
            InvalidArgument: a malformed value: ``time`` not finite or <= 0, ``samples_done``
                or ``energy_j`` not finite or negative, ``nodes`` not an integer >= 0.
            FailedPrecondition: a value inconsistent with the history: ``time`` before the
                last report's, ``samples_done`` or ``energy_j`` lower than the last reported,
                ``nodes`` not among the counts the task held since its last report (the count
                in effect right after it plus every count set by :meth:`on_allocation` since).
            The error's ``field`` is ``field_prefix`` + the field name.
        """
        self._check(report, field_prefix)

    def _check(self, report: ProgressReport, p: str) -> tuple[float, float, int, float | None]:
        t = _real(report.time, p + "time")
        if t <= 0:
            raise InvalidArgument(f"must be > 0 [s since epoch], got {_fmt(t)}", p + "time")
        s = _real(report.samples_done, p + "samples_done")
        if s < 0:
            raise InvalidArgument(f"must be >= 0, got {_fmt(s)}", p + "samples_done")
        e = None
        if report.energy_j is not None:
            e = _real(report.energy_j, p + "energy_j")
            if e < 0:
                raise InvalidArgument(f"must be >= 0 [J], got {_fmt(e)}", p + "energy_j")
        if isinstance(report.nodes, bool):
            raise InvalidArgument(f"must be an integer, got {report.nodes!r}", p + "nodes")
        try:
            n = operator.index(report.nodes)
        except TypeError:
            raise InvalidArgument(f"must be an integer, got {report.nodes!r}",
                                  p + "nodes") from None
        if n < 0:
            raise InvalidArgument(f"must be >= 0, got {n}", p + "nodes")
        if self._last is not None:
            t0, s0 = self._last
            if t < t0:
                raise FailedPrecondition(f"went back from {_fmt(t0)} (the last report's) to "
                                         f"{_fmt(t)}", p + "time")
            if s < s0:
                raise FailedPrecondition(f"went down from {_fmt(s0)} to {_fmt(s)}",
                                         p + "samples_done")
        if e is not None and self._max_e is not None and e < self._max_e:
            raise FailedPrecondition(f"went down from {_fmt(self._max_e)} to {_fmt(e)}",
                                     p + "energy_j")
        held = self._held()
        if n not in held:
            shown = ", ".join(str(c) for c in held[:20]) + (", ..." if len(held) > 20 else "")
            since = (f"since its last report at {_fmt(self._last[0])}" if self._last is not None
                     else "since it was submitted")
            raise FailedPrecondition(f"task held {shown} nodes {since}, not {n}", p + "nodes")
        return t, s, n, e

    def observe(self, report: ProgressReport) -> bool:
        """:meth:`check` ``report`` (raising like it, then nothing changes) and record it.

        Returns True when the model gained a node count with its first clean rate measurement
        (the caller may re-solve the allocation). Amortised O(1).
        """
        t, s, n, e = self._check(report, "")
        k = bisect.bisect_left([a[0] for a in self._allocs], t)  # changes before t
        inside, carried = self._allocs[:k], self._allocs[k:]
        if (inside and self._last is not None and n == self._count_at_last
                and n != inside[-1][1]):
            # a report of the generation that still ran on the old count after the decision
            # (docs/execution.md: it stops, checkpoints and reports, then the next starts):
            # the changes take effect after this report, which closes a clean interval
            carried = [[t, c, kind] for _, c, kind in inside] + carried
            inside = []
        overflow = self._overflow_time is not None
        gained = changed = False
        paused = self._paused if self._paused is not None and self._paused < t else None
        if self._last is not None:
            t0, s0 = self._last
            dt, ds = t - t0, s - s0
            c0 = self._count_at_last
            if dt > 0 and not overflow and not inside and c0 == n and n > 0 and paused is None:
                de = e - self._last_e if e is not None and self._last_e is not None else None
                gained, changed = self._add_clean(n, dt, ds, de)
            elif dt > 0 and not overflow and len(inside) == 1:
                tr, c1, kind = inside[0]
                if paused is not None and t0 <= paused < tr:
                    tr = paused  # the loss began when the processes stopped
                up = kind == "grow" and c1 > c0
                down = kind in ("shrink", "preempted") and c1 < c0
                if c0 > 0 and c1 > 0 and n == c1 and (up or down) and dt <= MAX_INTERVAL_S:
                    self._pending.append({"up": up, "from": c0, "to": c1, "t0": t0, "tr": tr,
                                          "t1": t, "samples": ds})
                    del self._pending[:-MAX_PENDING_RESCALES]
                    changed = self._resolve() or changed
        if gained:
            changed = self._resolve() or changed
        # bookkeeping: the interval is consumed
        if inside:
            self._count_at_last = int(inside[-1][1])
        self._allocs = carried
        if overflow and self._overflow_time < t:
            self._overflow_time = None
            self._dropped = []
        self._last = (t, s)
        self._last_e = e
        if paused is not None:
            self._paused = None
        if e is not None:
            self._max_e = e
        if changed:
            self._version += 1  # invalidates _fit_cache (keyed on the version)
        return gained

    def _add_clean(self, n: int, dt: float, ds: float, de: float | None) -> tuple[bool, bool]:
        """Add one clean interval at ``n``; returns (new count measured, model changed)."""
        if dt > MAX_INTERVAL_S:
            return False, False
        r = ds / dt
        if not (math.isfinite(r) and 0 <= r <= MAX_RATE):
            return False, False
        st = self._stats.get(n) or _Stat()
        seconds, samples = st.seconds + dt, st.samples + ds
        delta = r - st.mean
        mean = st.mean + (dt / seconds) * delta
        m2 = st.m2 + dt * delta * (r - mean)
        w2 = st.w2 + dt * dt
        if not all(map(math.isfinite, (seconds, samples, mean, m2, w2))):
            return False, False
        new = n not in self._stats
        st.seconds, st.samples, st.mean, st.m2, st.w2 = seconds, samples, mean, m2, w2
        st.intervals += 1
        if de is not None:
            p = de / dt
            ej = st.energy_j + de
            if math.isfinite(p) and 0 <= p <= MAX_POWER_W and math.isfinite(ej):
                st.energy_j, st.energy_s = ej, st.energy_s + dt
        if new:
            self._stats[n] = st
            bisect.insort(self._ms, n)
        return new, True

    def _resolve(self) -> bool:
        """Value the pending rescale intervals whose two counts are measured; True if an
        estimate was added."""
        added = False
        keep = []
        for p in self._pending:
            a, b = self._stats.get(p["from"]), self._stats.get(p["to"])
            if a is None or b is None:
                keep.append(p)
                continue
            rc, rn = a.rate, b.rate
            if not rc > 0:
                continue  # a loss cannot be valued in seconds of a zero rate
            lost = rc * (p["tr"] - p["t0"]) + rn * (p["t1"] - p["tr"]) - p["samples"]
            hi = (p["t1"] - p["tr"]) * rn / rc
            est = min(max(lost / rc, 0.0), hi)
            if not (math.isfinite(est) and est >= 0):
                continue
            target = self._up if p["up"] else self._down
            target.append(est)
            del target[:-MAX_RESCALE_ESTIMATES]
            added = True
        self._pending = keep
        return added

    # ------------------------------------------------------------------ the model
    @property
    def version(self) -> int:
        """Increments whenever anything affecting the rates, curve, power or rescale costs
        changes (callers cache on it)."""
        return self._version

    def _fit(self) -> tuple[np.ndarray, np.ndarray, float] | None:
        """(measured counts, isotonic rates, Amdahl serial fraction), cached per version;
        None when nothing is measured."""
        if self._fit_cache is not None and self._fit_cache[0] == self._version:
            return self._fit_cache[1]
        fit = None
        if self._ms:
            ms = np.array(self._ms, dtype=float)
            r = np.array([self._stats[m].rate for m in self._ms])
            w = np.array([self._stats[m].seconds for m in self._ms])
            if len(ms) >= 2:
                rh = np.asarray(isotonic_regression(r, weights=w / w.sum()).x, dtype=float)
                rh = np.maximum.accumulate(np.clip(np.nan_to_num(rh), 0.0, None))
                s = _amdahl_serial_fraction(ms, rh, w)
            else:
                rh, s = r, 0.0
            fit = (ms, rh, s)
        self._fit_cache = (self._version, fit)
        return fit

    def _values(self, ns: np.ndarray, prior: float, optimistic: bool) -> np.ndarray:
        """Point (or, above the largest measured count, optimistic) estimates at ``ns``."""
        fit = self._fit()
        ns = np.asarray(ns, dtype=float)
        if fit is None:
            out = _sane(prior) * np.maximum(ns, 0.0)
        else:
            ms, rh, s = fit
            out = np.zeros_like(ns)
            below = (ns > 0) & (ns < ms[0])
            out[below] = rh[0] * _g(ns[below], s) / _g(ms[0], s)
            mid = (ns >= ms[0]) & (ns <= ms[-1])
            out[mid] = np.interp(ns[mid], ms, rh)
            above = ns > ms[-1]
            sa = s / 2.0 if optimistic else s
            out[above] = rh[-1] * _g(ns[above], sa) / _g(ms[-1], sa)
        out = np.nan_to_num(out, nan=0.0, posinf=np.finfo(float).max, neginf=0.0)
        return np.clip(out, 0.0, None)

    def rate_at(self, n: int, prior_rate_per_node: float) -> float:
        """Point estimate of the throughput [samples/s] on ``n`` nodes; 0 for n <= 0.
        ``prior_rate_per_node`` [samples/s per node] is used (linearly) until a measurement
        exists."""
        if n <= 0:
            return 0.0
        return float(self._values(np.array([n]), prior_rate_per_node, optimistic=False)[0])

    def curve(self, min_nodes: int, max_nodes: int,
              prior_rate_per_node: float) -> tuple[list[int], list[float]]:
        """The curve the allocation uses (the module's exploration rule): node counts Ns
        strictly increasing from 0 with the last == ``max_nodes``, throughputs [samples/s]
        finite, >= 0 and non-decreasing; it holds 0, ``min_nodes``, ``max_nodes`` and every
        measured count in [min_nodes, max_nodes] (about 30 points, more only when more counts
        are measured). Piecewise linear between points. Raises ValueError unless
        0 <= min_nodes <= max_nodes."""
        lo, hi = operator.index(min_nodes), operator.index(max_nodes)
        if not 0 <= lo <= hi:
            raise ValueError(f"need 0 <= min_nodes <= max_nodes, got {lo}, {hi}")
        if hi == 0:
            return [0], [0.0]
        lo = max(lo, 1)
        pts = {0, lo, hi}
        fit = self._fit()
        if fit is not None:
            m1, mk = self._ms[0], self._ms[-1]
            pts.update(m for m in self._ms if lo <= m <= hi)
            if lo < m1:
                top = min(m1, hi)
                if top > lo:
                    pts.update(_geometric(lo, top, MAX_GRID_BELOW))
            if hi > mk:
                start = max(mk, lo)
                if hi > start:
                    pts.update(_geometric(start, hi, MAX_GRID_ABOVE))
        ns = sorted(pts)
        vals = self._values(np.array(ns, dtype=float), prior_rate_per_node, optimistic=True)
        vals = np.maximum.accumulate(vals)
        return ns, [float(v) for v in vals]

    def band(self, n: int, prior_rate_per_node: float) -> tuple[float, float, float]:
        """(low, estimate, high) throughput [samples/s] on ``n`` nodes, low <= estimate <= high,
        all finite and >= 0 (rules in the module docstring); (0, 0, 0) for n <= 0."""
        if n <= 0:
            return 0.0, 0.0, 0.0
        est = self.rate_at(n, prior_rate_per_node)
        fit = self._fit()
        if fit is None:
            low, high = est / PRIOR_BAND_FACTOR, est * PRIOR_BAND_FACTOR
        else:
            ms, rh, _ = fit
            i = bisect.bisect_left(self._ms, n)
            if i < len(self._ms) and self._ms[i] == n:
                se = self._stats[n].std_error()
                low, high = est - 2.0 * se, est + 2.0 * se
            elif i == len(self._ms):           # above the largest measured count
                low, high = float(rh[-1]), float(rh[-1]) * n / ms[-1]
            elif i == 0:                       # below the smallest
                low, high = float(rh[0]) * n / ms[0], float(rh[0])
            else:                              # between m_{i-1} and m_i
                a, b = self._ms[i - 1], self._ms[i]
                low_a = float(rh[i - 1]) - 2.0 * self._stats[a].std_error()
                high_b = float(rh[i]) + 2.0 * self._stats[b].std_error()
                low = max(low_a, float(rh[i]) * n / b)
                high = min(high_b, float(rh[i - 1]) * n / a)
        vals = np.nan_to_num(np.array([low, est, high], dtype=float), nan=0.0,
                             posinf=np.finfo(float).max, neginf=0.0)
        low, est, high = (float(v) for v in np.clip(vals, 0.0, None))
        return min(low, est), est, max(high, est)

    def power_at(self, n: int, prior_node_power_w: float) -> float:
        """Estimated power draw [W] of the task on ``n`` nodes; 0 for n <= 0 (module
        docstring: measured, else per-node power at the nearest measured count, else the
        prior ``prior_node_power_w`` [W per node] times n)."""
        if n <= 0:
            return 0.0
        with_power = [m for m in self._ms if self._stats[m].energy_s > 0]
        if not with_power:
            return _sane(prior_node_power_w) * n
        best = min(with_power, key=lambda m: (abs(m - n), m))
        st = self._stats[best]
        p = st.energy_j / st.energy_s
        value = p if best == n else p / best * n
        return float(value) if math.isfinite(value) and value >= 0 else 0.0

    @property
    def last_report(self) -> tuple[float, float, float | None] | None:
        """(time [s], samples_done, energy_j or None) of the last accepted report, or None:
        where a restarted training process continues its cumulative counters."""
        if self._last is None:
            return None
        return self._last[0], self._last[1], self._last_e

    def rescale_up_s(self, prior: float) -> float:
        """Learned Tcup [s] (BFTrainer §3: growing from c nodes loses Ps(c) * Tcup samples):
        the median of the measured estimates, ``prior`` until one exists."""
        up = self.measured_rescale_s()[0]
        return prior if up is None else up

    def rescale_down_s(self, prior: float) -> float:
        """Learned Tcdw [s] (shrinks and preemptions lose Ps(c) * Tcdw samples): the median of
        the measured estimates, ``prior`` until one exists."""
        down = self.measured_rescale_s()[1]
        return prior if down is None else down

    def measured_rescale_s(self) -> tuple[float | None, float | None]:
        """``(Tcup, Tcdw)`` [s] measured so far (the medians of :meth:`rescale_up_s` /
        :meth:`rescale_down_s`), None for a direction without an estimate yet."""
        return (float(statistics.median(self._up)) if self._up else None,
                float(statistics.median(self._down)) if self._down else None)

    def per_node_rate(self) -> float | None:
        """Measured rate [samples/s] per node at the smallest measured count (a population
        prior for other tasks); None before any measurement."""
        if not self._ms:
            return None
        m = self._ms[0]
        return self._stats[m].rate / m

    def measured(self) -> dict[int, dict[str, Any]]:
        """count -> {"rate": samples/s, "seconds": s observed, "intervals": clean intervals,
        "power_w": W or None}, for every measured count (a fresh dict)."""
        out = {}
        for m in self._ms:
            st = self._stats[m]
            out[m] = {"rate": st.rate, "seconds": st.seconds, "intervals": st.intervals,
                      "power_w": st.energy_j / st.energy_s if st.energy_s > 0 else None}
        return out

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-able data (lists, dicts, str, int, float, None; no
        non-finite floats); :meth:`from_dict` restores it exactly."""
        return {
            "format": _FORMAT,
            "version": self._version,
            "count": self._count,
            "count_at_last": self._count_at_last,
            "last": list(self._last) if self._last is not None else None,
            "last_energy_j": self._last_e,
            "max_energy_j": self._max_e,
            "allocations": [list(a) for a in self._allocs],
            "overflow_time": self._overflow_time,
            "dropped_counts": list(self._dropped),
            "stats": [self._stats[m].to_dict(m) for m in self._ms],
            "pending_rescales": [dict(p) for p in self._pending],
            "rescale_up_s": list(self._up),
            "rescale_down_s": list(self._down),
            "paused": self._paused,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskLearner":
        """Inverse of :meth:`to_dict`. Raises ValueError for an unknown format."""
        if d.get("format") != _FORMAT:
            raise ValueError(f"unknown TaskLearner state format {d.get('format')!r}")

        def opt(x: Any) -> float | None:
            return None if x is None else float(x)

        x = cls()
        x._version = int(d["version"])
        x._count = int(d["count"])
        x._count_at_last = int(d["count_at_last"])
        x._last = (float(d["last"][0]), float(d["last"][1])) if d["last"] is not None else None
        x._last_e = opt(d["last_energy_j"])
        x._max_e = opt(d["max_energy_j"])
        x._allocs = [[float(t), int(c), str(k)] for t, c, k in d["allocations"]]
        x._overflow_time = opt(d["overflow_time"])
        x._dropped = [int(c) for c in d["dropped_counts"]]
        for sd in d["stats"]:
            x._stats[int(sd["nodes"])] = _Stat.from_dict(sd)
        x._ms = sorted(x._stats)
        x._pending = [{"up": bool(p["up"]), "from": int(p["from"]), "to": int(p["to"]),
                       "t0": float(p["t0"]), "tr": float(p["tr"]), "t1": float(p["t1"]),
                       "samples": float(p["samples"])} for p in d["pending_rescales"]]
        x._up = [float(v) for v in d["rescale_up_s"]]
        x._down = [float(v) for v in d["rescale_down_s"]]
        x._paused = opt(d.get("paused"))  # (absent in states written before generations)
        return x

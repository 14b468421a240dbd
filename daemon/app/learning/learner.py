"""Per-task online model of throughput, power and rescale costs (issue "Learn scalability online").

A task submitted without a scalability curve reports its progress (cumulative samples, the node
count it ran on, optionally cumulative energy); :class:`TaskLearner` turns those reports into
the curve, power and rescale costs the allocation uses (docs/architecture.md,
"Tasks and the progress model" and "Allocation"). It is pure and deterministic: no I/O, no clock, no
randomness; the same calls give the same model, and its state is JSON-able
(:meth:`TaskLearner.to_dict`).

Sources: the progress and cost model is BFTrainer's (Liu et al., arXiv 2106.12091, Section 3:
growing a task from c nodes costs Ps(c) * Tcup samples, shrinking it or losing nodes to preemption
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
scaling from m_k (they lie between the two). The optimiser (docs/architecture.md, "Allocation")
grows a task onto an unmeasured count only when this optimistic gain over the look-ahead Tfwd beats
the rescale cost Tcup * Ps(c) and every other use of the nodes; one clean interval there replaces
the guess by a measurement, and the optimism moves up to the new largest count (optimism in the face
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

Parts
-----
:class:`TaskLearner` composes one collaborator per responsibility:
:mod:`offcut.daemon.app.learning.checks` (a report's checks), :mod:`offcut.daemon.app.learning.timeline`
(node-count changes, pauses and clean intervals), :mod:`offcut.daemon.app.learning.throughput` (rate
and power per node count), :mod:`offcut.daemon.app.learning.rescale` (Tcup, Tcdw) and
:mod:`offcut.daemon.app.learning.scalability` (fit, curve, band).
"""

from __future__ import annotations

from typing import Any

from offcut.daemon.app.model import ProgressReport
from offcut.taskspec import check_finite
from offcut.daemon.app.learning.checks import check_report
from offcut.daemon.app.learning.timeline import KINDS, MAX_PENDING_ALLOCATIONS, ReportTimeline, opt_float
from offcut.daemon.app.learning.rescale import (MAX_PENDING_RESCALES, MAX_RESCALE_ESTIMATES,
                                            RescaleCosts)
from offcut.daemon.app.learning.scalability import (GRID_FACTOR, MAX_GRID_ABOVE, MAX_GRID_BELOW,
                                             PRIOR_BAND_FACTOR, ScalabilityModel)
from offcut.daemon.app.learning.throughput import (MAX_INTERVAL_S, MAX_POWER_W, MAX_RATE,
                                            SINGLE_INTERVAL_REL_SE, ThroughputStats)

# the learner, and the names this module has always offered (the rules' constants live with
# the part that applies them)
__all__ = ["TaskLearner", "ProgressReport", "check_finite", "KINDS", "MAX_PENDING_ALLOCATIONS",
           "MAX_PENDING_RESCALES", "MAX_RESCALE_ESTIMATES", "MAX_INTERVAL_S", "MAX_RATE",
           "MAX_POWER_W", "SINGLE_INTERVAL_REL_SE", "PRIOR_BAND_FACTOR", "GRID_FACTOR",
           "MAX_GRID_ABOVE", "MAX_GRID_BELOW"]

_FORMAT = 1


class TaskLearner:
    """Online model of one task: throughput per node count, power, rescale costs.

    Fed by the scheduler: :meth:`on_allocation` at every change of the task's node count,
    :meth:`check` / :meth:`observe` for each progress report. Read by the allocation:
    :meth:`curve` (the optimistic curve of the module's exploration rule), :meth:`rate_at`,
    :meth:`band`, :meth:`power_at`, :meth:`rescale_up_s` / :meth:`rescale_down_s`.
    :attr:`version` changes whenever any of those answers may change. The state is JSON-able:
    ``TaskLearner.from_dict(json.loads(json.dumps(x.to_dict())))`` behaves exactly like ``x``.
    See the module docstring for the rules and sources.
    """

    def __init__(self) -> None:
        self._version = 0
        self._timeline = ReportTimeline()       # changes and pauses since the last report
        self._stats = ThroughputStats()         # clean rates and power per node count
        self._rescales = RescaleCosts()         # Tcup / Tcdw estimates
        self._model = ScalabilityModel(self._stats)

    # ------------------------------------------------------------------ events
    def on_allocation(self, time: float, count: int, kind: str) -> None:
        """Record that the task's node count changed to ``count`` at ``time`` [s since epoch].

        ``kind`` is one of ``start``, ``grow``, ``shrink``, ``stop``, ``preempted``. Times are
        taken as non-decreasing (an earlier one is moved up to the last known time). Raises
        ValueError for an unknown kind, a negative count or a non-finite time (caller bugs).
        """
        self._timeline.on_allocation(time, count, kind)

    def on_pause(self, time: float) -> None:
        """Record that the task's processes stopped at ``time`` [s since epoch] (its current
        generation ended: checkpointed, failed or preempted; docs/execution.md) before any
        change of its node count is known. The interval holding the pause is not clean, and a
        rescale interval counts its loss from the pause instead of the decision when the pause
        came first (a preemption: Slurm signals the task before the daemon hears of it).
        Raises ValueError for a non-finite time (a caller bug)."""
        self._timeline.on_pause(time)

    def _held(self) -> list[int]:
        """The counts the task held since its last report, sorted."""
        return self._timeline.held()

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
        check_report(report, self._timeline, field_prefix)

    def observe(self, report: ProgressReport) -> bool:
        """:meth:`check` ``report`` (raising like it, then nothing changes) and record it.

        Returns True when the model gained a node count with its first clean rate measurement
        (the caller may re-solve the allocation). Amortised O(1).
        """
        t, s, n, e = check_report(report, self._timeline)
        iv = self._timeline.interval(t, s, n, e)
        gained = changed = False
        if iv.s0 is not None and iv.s < iv.s0:
            pass  # a restart below the last report (checks): no rate nor rescale cost in it
        elif iv.clean:
            gained, changed = self._stats.add_clean(n, iv.dt, iv.ds, iv.energy_delta())
        elif self._rescales.record(iv):
            changed = self._rescales.resolve(self._stats)
        if gained:  # the new count may value waiting rescale intervals
            changed = self._rescales.resolve(self._stats) or changed
        self._timeline.close(iv)  # the interval is consumed
        if changed:
            self._version += 1
        return gained

    # ------------------------------------------------------------------ the model
    @property
    def version(self) -> int:
        """Increments whenever anything affecting the rates, curve, power or rescale costs
        changes (callers cache on it)."""
        return self._version

    def rate_at(self, n: int, prior_rate_per_node: float) -> float:
        """Point estimate of the throughput [samples/s] on ``n`` nodes; 0 for n <= 0.
        ``prior_rate_per_node`` [samples/s per node] is used (linearly) until a measurement
        exists."""
        return self._model.rate_at(n, prior_rate_per_node)

    def curve(self, min_nodes: int, max_nodes: int,
              prior_rate_per_node: float) -> tuple[list[int], list[float]]:
        """The curve the allocation uses (the module's exploration rule): node counts Ns
        strictly increasing from 0 with the last == ``max_nodes``, throughputs [samples/s]
        finite, >= 0 and non-decreasing; it holds 0, ``min_nodes``, ``max_nodes`` and every
        measured count in [min_nodes, max_nodes] (about 30 points, more only when more counts
        are measured). Piecewise linear between points. Raises ValueError unless
        0 <= min_nodes <= max_nodes."""
        return self._model.curve(min_nodes, max_nodes, prior_rate_per_node)

    def band(self, n: int, prior_rate_per_node: float) -> tuple[float, float, float]:
        """(low, estimate, high) throughput [samples/s] on ``n`` nodes, low <= estimate <= high,
        all finite and >= 0 (rules in the module docstring); (0, 0, 0) for n <= 0."""
        return self._model.band(n, prior_rate_per_node)

    def power_at(self, n: int, prior_node_power_w: float) -> float:
        """Estimated power draw [W] of the task on ``n`` nodes; 0 for n <= 0 (module
        docstring: measured, else per-node power at the nearest measured count, else the
        prior ``prior_node_power_w`` [W per node] times n)."""
        return self._stats.power_at(n, prior_node_power_w)

    @property
    def last_report(self) -> tuple[float, float, float | None] | None:
        """(time [s], samples_done, energy_j or None) of the last accepted report, or None:
        where a restarted training process continues its cumulative counters."""
        last = self._timeline.last
        if last is None:
            return None
        return last[0], last[1], self._timeline.last_energy_j

    def rescale_up_s(self, prior: float) -> float:
        """Learned Tcup [s] (BFTrainer, Section 3: growing from c nodes loses Ps(c) * Tcup samples):
        the median of the measured estimates, ``prior`` until one exists."""
        up = self.measured_rescale_s()[0]
        return prior if up is None else up

    def rescale_down_s(self, prior: float) -> float:
        """Learned Tcdw [s] (shrinks and preemptions lose Ps(c) * Tcdw samples): the median of
        the measured estimates, ``prior`` until one exists."""
        down = self.measured_rescale_s()[1]
        return prior if down is None else down

    def rescale_loss(self) -> tuple[float, int]:
        """``(seconds, rescales)``: the time lost to every rescale and preemption measured so
        far [s of progress at the rate before each; BFTrainer's convention, Section 3] and how many
        were measured (the others, e.g. those whose rates are not both measured yet, are not
        counted)."""
        return self._rescales.lost_s, self._rescales.valued

    def measured_rescale_s(self) -> tuple[float | None, float | None]:
        """``(Tcup, Tcdw)`` [s] measured so far (the medians of :meth:`rescale_up_s` /
        :meth:`rescale_down_s`), None for a direction without an estimate yet."""
        return self._rescales.measured()

    def per_node_rate(self) -> float | None:
        """Measured rate [samples/s] per node at the smallest measured count (a population
        prior for other tasks); None before any measurement."""
        return self._stats.per_node_rate()

    def measured(self) -> dict[int, dict[str, Any]]:
        """count -> {"rate": samples/s, "seconds": s observed, "intervals": clean intervals,
        "power_w": W or None}, for every measured count (a fresh dict)."""
        return self._stats.measured()

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-able data (lists, dicts, str, int, float, None; no
        non-finite floats); :meth:`from_dict` restores it exactly. The key order is part of
        the format (state files store the JSON): ``paused`` came last, with generations."""
        return {
            "format": _FORMAT,
            "version": self._version,
            **self._timeline.to_dict(),
            "stats": self._stats.to_list(),
            **self._rescales.to_dict(),
            "paused": self._timeline.paused,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskLearner":
        """Inverse of :meth:`to_dict`. Raises ValueError for an unknown format."""
        if d.get("format") != _FORMAT:
            raise ValueError(f"unknown TaskLearner state format {d.get('format')!r}")
        x = cls()
        x._version = int(d["version"])
        x._timeline = ReportTimeline.from_dict(d)
        x._stats = ThroughputStats.from_list(d["stats"])
        x._model = ScalabilityModel(x._stats)
        x._rescales = RescaleCosts.from_dict(d)
        # (absent in states written before generations)
        x._timeline.paused = opt_float(d.get("paused"))
        return x

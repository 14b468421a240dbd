"""The per-task online model (``offcut.daemon.app.learning``): rates, curve and exploration rule,
rescale costs, power, rejection of bad reports, persistence, and property tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offcut.daemon.app.learning import ProgressReport, TaskLearner
from offcut.errors import FailedPrecondition, InvalidArgument

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

T0 = 1.7e9


def amdahl(r1: float, s: float):
    return lambda n: 0.0 if n <= 0 else r1 * n / (1.0 + s * (n - 1))


class Sim:
    """A task whose true throughput is ``rate(n)`` [samples/s] with multiplicative noise per
    stretch of running, losing ``rate(c) * up_s`` samples when grown from c nodes and
    ``rate(c) * down_s`` when shrunk or preempted (BFTrainer's model), drawing ``watts(n)``."""

    def __init__(self, rate, up_s=0.0, down_s=0.0, noise=0.0, seed=0, watts=None):
        self.rate, self.up_s, self.down_s, self.noise = rate, up_s, down_s, noise
        self.watts = watts
        self.rng = np.random.default_rng(seed)
        self.learner = TaskLearner()
        self.t, self.samples, self.energy, self.n, self.debt = T0, 0.0, 0.0, 0, 0.0

    def run(self, dt: float) -> None:
        made = self.rate(self.n) * dt * (1.0 + self.noise * self.rng.standard_normal())
        made = max(made, 0.0)
        paid = min(made, self.debt)
        self.debt -= paid
        self.samples += made - paid
        if self.watts is not None:
            self.energy += self.watts(self.n) * dt
        self.t += dt

    def alloc(self, n: int, kind: str | None = None) -> None:
        c = self.n
        if kind is None:
            kind = "start" if c == 0 else "stop" if n == 0 else "grow" if n > c else "shrink"
        if c > 0 and n > 0:
            self.debt += self.rate(c) * (self.up_s if n > c else self.down_s)
        self.learner.on_allocation(self.t, n, kind)
        self.n = n

    def report(self, dt: float = 0.0) -> bool:
        if dt:
            self.run(dt)
        return self.learner.observe(ProgressReport(
            self.t, self.samples, self.n, self.energy if self.watts is not None else None))

    def rescale(self, n: int, before: float, after: float, kind: str | None = None) -> None:
        """Run ``before`` s, change to ``n`` nodes, run ``after`` s, report."""
        self.run(before)
        self.alloc(n, kind)
        self.report(after)


def check_curve(ns, ps, min_nodes, max_nodes):
    assert ns[0] == 0 and ns[-1] == max_nodes and min_nodes in ns
    assert all(b > a for a, b in zip(ns, ns[1:])), ns
    assert all(isinstance(n, int) for n in ns)
    assert all(math.isfinite(p) and p >= 0 for p in ps), ps
    assert all(b >= a for a, b in zip(ps, ps[1:])), ps
    assert len(ns) == len(ps)


# ---------------------------------------------------------------------- rates and the curve
def test_noisy_amdahl_rates_fit_and_optimistic_curve():
    true = amdahl(100.0, 0.05)  # ImageNet-like serial fraction
    sim = Sim(true, noise=0.05, seed=1)
    sim.alloc(1)
    sim.report(30.0)  # startup: never clean
    assert sim.learner.measured() == {}
    gained = []
    for n in (1, 2, 4, 8, 16):
        if n != sim.n:
            sim.alloc(n)
            sim.report(30.0)  # the rescale interval is not a clean measurement
        gained.append([sim.report(60.0) for _ in range(8)])
    # True exactly once per count: the first clean interval there
    assert all(g[0] and not any(g[1:]) for g in gained)
    m = sim.learner.measured()
    assert sorted(m) == [1, 2, 4, 8, 16]
    covered = 0
    for n, got in m.items():
        # 3.5 standard errors of the mean of 8 intervals with 5 % noise: 6.2 %
        assert got["rate"] == pytest.approx(true(n), rel=3.5 * 0.05 / math.sqrt(8)), n
        assert got["seconds"] == pytest.approx(480.0) and got["intervals"] == 8
        assert got["power_w"] is None
        low, est, high = sim.learner.band(n, 1.0)
        assert low < est < high
        covered += low <= true(n) <= high
    assert covered >= 4  # +- 2 standard errors: ~95 % each
    # extrapolation by the fitted Amdahl law is close to the truth
    for n in (24, 32, 64):
        assert sim.learner.rate_at(n, 1.0) == pytest.approx(true(n), rel=0.1), n
    ns, ps = sim.learner.curve(1, 64, 1.0)
    check_curve(ns, ps, 1, 64)
    assert {1, 2, 4, 8, 16} <= set(ns) and len(ns) <= 40
    curve = dict(zip(ns, ps))
    r16 = curve[16]
    for n, p in curve.items():
        if n > 16:  # optimistic: at least the fit, at most linear scaling from 16
            point = sim.learner.rate_at(n, 1.0)
            assert point < p <= r16 * n / 16 + 1e-9, n
            low, est, high = sim.learner.band(n, 1.0)
            assert low == pytest.approx(r16) and high == pytest.approx(r16 * n / 16)
            assert est == pytest.approx(point)
        elif n > 0:  # at and below the largest measured count: the point estimate
            assert p == pytest.approx(sim.learner.rate_at(n, 1.0)), n
    assert sim.learner.per_node_rate() == pytest.approx(m[1]["rate"])


def test_piecewise_linear_saturating_curve_is_monotone():
    true = lambda n: min(100.0 * n, 600.0)  # noqa: E731 - saturates at 6 nodes
    sim = Sim(true, noise=0.05, seed=7)
    sim.alloc(2)
    sim.report(30.0)
    for n in (2, 4, 8, 12):
        if n != sim.n:
            sim.alloc(n)
            sim.report(30.0)
        for _ in range(10):
            sim.report(60.0)
    for n, got in sim.learner.measured().items():
        assert got["rate"] == pytest.approx(true(n), rel=3.5 * 0.05 / math.sqrt(10)), n
    ns, ps = sim.learner.curve(2, 40, 1.0)
    check_curve(ns, ps, 2, 40)
    # saturated: extrapolation grows far slower than linear
    assert sim.learner.rate_at(40, 1.0) < 1.5 * 600.0
    est = [sim.learner.rate_at(n, 1.0) for n in range(0, 41)]
    assert all(b >= a for a, b in zip(est, est[1:]))
    assert est[2] / 2 <= est[1] <= est[2]  # below m_1: Amdahl shape, between linear and flat


def test_band_is_two_standard_errors_of_the_interval_rates():
    learner = TaskLearner()
    learner.on_allocation(T0, 3, "start")
    learner.observe(ProgressReport(T0 + 10, 0.0, 3))
    rates = [100.0, 104.0, 97.0, 101.0, 99.0, 103.0]
    t, s = T0 + 10, 0.0
    for i, r in enumerate(rates):
        t, s = t + 30.0, s + 30.0 * r
        learner.observe(ProgressReport(t, s, 3))
        if i == 0:  # one interval: an assumed 10 % standard error
            assert learner.band(3, 1.0) == pytest.approx((80.0, 100.0, 120.0))
    se = np.std(rates, ddof=1) / math.sqrt(len(rates))
    mean = float(np.mean(rates))
    assert learner.band(3, 1.0) == pytest.approx((mean - 2 * se, mean, mean + 2 * se))
    assert learner.measured()[3] == {"rate": pytest.approx(mean), "seconds": 180.0,
                                     "intervals": 6, "power_w": None}
    # unequal lengths: the rate is time-weighted
    learner.observe(ProgressReport(t + 120.0, s + 120.0 * 90.0, 3))
    assert learner.rate_at(3, 1.0) == pytest.approx((sum(rates) * 30 + 90.0 * 120) / 300)


def test_isotonic_fit_pools_a_non_monotone_measurement():
    learner = TaskLearner()
    learner.on_allocation(T0, 4, "start")
    learner.observe(ProgressReport(T0 + 10, 0.0, 4))
    learner.observe(ProgressReport(T0 + 110, 10_000.0, 4))          # 100/s at 4 for 100 s
    learner.on_allocation(T0 + 110, 8, "grow")
    learner.observe(ProgressReport(T0 + 120, 10_500.0, 8))
    learner.observe(ProgressReport(T0 + 420, 10_500.0 + 27_000.0, 8))  # 90/s at 8 for 300 s
    assert learner.measured()[8]["rate"] == pytest.approx(90.0)
    pooled = (100.0 * 100 + 90.0 * 300) / 400
    assert learner.rate_at(4, 1.0) == pytest.approx(pooled)
    assert learner.rate_at(8, 1.0) == pytest.approx(pooled)
    assert learner.rate_at(6, 1.0) == pytest.approx(pooled)
    # flat data: the Amdahl fit is s = 1 (no speed-up), so below 4 it stays flat too
    assert learner.rate_at(2, 1.0) == pytest.approx(pooled)
    assert learner.band(2, 1.0) == pytest.approx((pooled / 2, pooled, pooled))
    ns, ps = learner.curve(1, 16, 1.0)
    check_curve(ns, ps, 1, 16)


def test_prior_and_exploration_of_unmeasured_counts():
    learner = TaskLearner()
    # nothing measured: the linear prior
    assert learner.rate_at(5, 12.0) == 60.0 and learner.rate_at(0, 12.0) == 0.0
    assert learner.curve(2, 8, 12.0) == ([0, 2, 8], [0.0, 24.0, 96.0])
    assert learner.band(5, 12.0) == (30.0, 60.0, 120.0)
    assert learner.per_node_rate() is None and learner.measured() == {}
    assert learner.curve(0, 0, 12.0) == ([0], [0.0])
    with pytest.raises(ValueError):
        learner.curve(5, 4, 1.0)
    # one measured count: linear scaling above it (s = 0), the optimistic guess
    learner.on_allocation(T0, 4, "start")
    learner.observe(ProgressReport(T0 + 5, 0.0, 4))
    assert learner.observe(ProgressReport(T0 + 65, 60 * 200.0, 4))
    v1 = learner.version
    ns, ps = learner.curve(1, 32, 12.0)
    check_curve(ns, ps, 1, 32)
    assert dict(zip(ns, ps))[32] == pytest.approx(200.0 * 8)
    # a poor measurement at 8 replaces the guess there and lowers the optimism above it
    learner.on_allocation(T0 + 65, 8, "grow")
    learner.observe(ProgressReport(T0 + 70, 12_000.0, 8))
    assert learner.observe(ProgressReport(T0 + 130, 12_000.0 + 60 * 220.0, 8))
    assert learner.version > v1
    ns, ps = learner.curve(1, 32, 12.0)
    check_curve(ns, ps, 1, 32)
    c = dict(zip(ns, ps))
    assert c[8] == pytest.approx(220.0)
    assert 220.0 < c[32] < 220.0 * 4 * 0.5  # far below linear from 8 now
    assert learner.rate_at(32, 12.0) <= c[32]
    # deterministic: the same calls give the same model
    twin = TaskLearner.from_dict(json.loads(json.dumps(learner.to_dict())))
    assert twin.curve(1, 32, 12.0) == (ns, ps)


def test_power_measured_nearest_and_prior():
    sim = Sim(amdahl(50.0, 0.1), seed=3, watts=lambda n: 300.0 * n + 100.0)
    assert sim.learner.power_at(4, 250.0) == 1000.0
    sim.alloc(4)
    sim.report(20.0)
    sim.report(40.0)
    sim.report(40.0)
    assert sim.learner.measured()[4]["power_w"] == pytest.approx(1300.0)
    assert sim.learner.power_at(4, 250.0) == pytest.approx(1300.0)
    assert sim.learner.power_at(8, 250.0) == pytest.approx(2600.0)  # per node at 4, times 8
    assert sim.learner.power_at(0, 250.0) == 0.0
    sim.alloc(8)
    sim.report(20.0)
    sim.report(40.0)
    assert sim.learner.power_at(8, 250.0) == pytest.approx(2500.0)
    assert sim.learner.power_at(6, 250.0) == pytest.approx(1300.0 / 4 * 6)  # tie: the smaller
    assert sim.learner.power_at(7, 250.0) == pytest.approx(2500.0 / 8 * 7)


# ---------------------------------------------------------------------- rescale costs
def test_rescale_costs_are_recovered():
    true = amdahl(100.0, 0.05)
    sim = Sim(true, up_s=30.0, down_s=10.0, noise=0.01, seed=11)
    sim.alloc(4)
    sim.report(30.0)
    assert sim.learner.rescale_up_s(99.0) == 99.0 and sim.learner.rescale_down_s(7.0) == 7.0
    assert sim.learner.measured_rescale_s() == (None, None)
    sim.report(120.0)
    # the first grow to 8 happens before 8 is measured: the interval waits
    sim.rescale(8, 20.0, 120.0)
    assert sim.learner.rescale_up_s(99.0) == 99.0
    v = sim.learner.version
    sim.report(120.0)  # first clean rate at 8: the waiting interval is valued now
    assert sim.learner.version > v
    assert sim.learner.rescale_up_s(99.0) != 99.0
    cycle = [(16, "grow"), (8, "shrink"), (4, "preempted"), (8, "grow"), (16, "grow"),
             (4, "shrink")]
    for _ in range(3):
        for n, kind in cycle:
            sim.rescale(n, 25.0, 150.0, kind)
            sim.report(120.0)
    assert sim.learner.rescale_up_s(99.0) == pytest.approx(30.0, rel=0.12)
    assert sim.learner.rescale_down_s(99.0) == pytest.approx(10.0, rel=0.2)
    assert sim.learner.measured_rescale_s() == (sim.learner.rescale_up_s(0.0),
                                                sim.learner.rescale_down_s(0.0))
    # the time lost to all of them (issue 38, wasted work): every estimate counted once, and
    # kept across a snapshot (to_dict / from_dict)
    lost, valued = sim.learner.rescale_loss()
    assert valued == 19 and lost == pytest.approx(
        sum(sim.learner._rescales.up) + sum(sim.learner._rescales.down))
    assert lost == pytest.approx(10 * 30.0 + 9 * 10.0, rel=0.15)  # 10 grows, 9 shrinks
    assert TaskLearner.from_dict(json.loads(json.dumps(sim.learner.to_dict()))
                                 ).rescale_loss() == (lost, valued)
    for n, got in sim.learner.measured().items():
        assert got["rate"] == pytest.approx(true(n), rel=0.03)


def test_change_after_a_late_report_belongs_to_the_next_interval():
    learner = TaskLearner()
    learner.on_allocation(T0, 4, "start")
    learner.observe(ProgressReport(T0 + 10, 0.0, 4))
    learner.observe(ProgressReport(T0 + 50, 4000.0, 4))             # 100/s at 4
    learner.on_allocation(T0 + 100, 8, "grow")                       # decided at 100 ...
    assert not learner.observe(ProgressReport(T0 + 98, 8800.0, 4))  # ... measured at 98: clean
    assert learner.measured()[4]["seconds"] == pytest.approx(88.0)
    # 2 s more at 4, then 8 nodes at 180/s for 100 s with 1,800 samples (10 s at 180/s) lost
    learner.observe(ProgressReport(T0 + 130, 8800.0 + 200 + 180 * 30 - 1800, 8))
    learner.observe(ProgressReport(T0 + 200, 8800.0 + 200 + 180 * 100 - 1800, 8))
    assert learner.measured()[8]["rate"] == pytest.approx(180.0)
    assert learner.rescale_up_s(0.0) == pytest.approx(18.0)  # 1,800 samples / 100 per s


def test_no_measurement_from_unclean_intervals():
    learner = TaskLearner()
    learner.on_allocation(T0, 4, "start")
    learner.observe(ProgressReport(T0 + 10, 0.0, 4))
    learner.on_allocation(T0 + 20, 0, "preempted")
    learner.on_allocation(T0 + 30, 4, "start")
    learner.observe(ProgressReport(T0 + 60, 500.0, 4))  # two changes: unclean
    learner.observe(ProgressReport(T0 + 60, 500.0, 4))  # zero length: nothing
    assert learner.measured() == {} and learner.version == 0
    learner.on_allocation(T0 + 60, 0, "stop")
    learner.observe(ProgressReport(T0 + 90, 500.0, 0))   # held no node: nothing
    assert learner.measured() == {} and learner.version == 0


# ---------------------------------------------------------------------- bad reports
def history() -> TaskLearner:
    learner = TaskLearner()
    learner.on_allocation(T0, 4, "start")
    learner.observe(ProgressReport(T0 + 10, 200.0, 4, 1000.0))
    learner.observe(ProgressReport(T0 + 30, 1200.0, 4, 21_000.0))   # 50/s, 1000 W
    learner.on_allocation(T0 + 35, 8, "grow")
    learner.on_allocation(T0 + 40, 6, "shrink")
    return learner


BAD = [
    (dict(samples_done=-1.0), InvalidArgument, "samples_done", "got -1"),
    (dict(samples_done=float("nan")), InvalidArgument, "samples_done", "finite"),
    (dict(samples_done=float("inf")), InvalidArgument, "samples_done", "finite"),
    (dict(samples_done="many"), InvalidArgument, "samples_done", "number"),
    (dict(time=0.0), InvalidArgument, "time", "> 0"),
    (dict(time=-5.0), InvalidArgument, "time", "> 0"),
    (dict(time=float("inf")), InvalidArgument, "time", "finite"),
    (dict(energy_j=-5.0), InvalidArgument, "energy_j", "got -5"),
    (dict(energy_j=float("nan")), InvalidArgument, "energy_j", "finite"),
    (dict(nodes=-1), InvalidArgument, "nodes", "got -1"),
    (dict(nodes=2.5), InvalidArgument, "nodes", "integer"),
    (dict(nodes=True), InvalidArgument, "nodes", "integer"),
    (dict(samples_done=1100.0), FailedPrecondition, "samples_done",
     "went down from 1200 to 1100"),
    (dict(energy_j=20_000.0), FailedPrecondition, "energy_j", "went down from 21000 to 20000"),
    (dict(time=T0 + 29.5), FailedPrecondition, "time", "went back from 1700000030"),
    (dict(nodes=7), FailedPrecondition, "nodes",
     "task held 4, 6, 8 nodes since its last report at 1700000030, not 7"),
    (dict(nodes=0), FailedPrecondition, "nodes", "not 0"),
]


@pytest.mark.parametrize("change,error,field,text", BAD)
def test_bad_report_is_rejected_and_changes_nothing(change, error, field, text):
    learner = history()
    before = learner.to_dict()
    good = dict(time=T0 + 90, samples_done=4200.0, nodes=6, energy_j=90_000.0)
    bad = ProgressReport(**{**good, **change})
    for call in (lambda: learner.check(bad, "reports[3]."), lambda: learner.observe(bad)):
        with pytest.raises(error) as exc:
            call()
        assert text in str(exc.value)
    assert exc.value.field == field  # observe: no prefix
    with pytest.raises(error) as exc:
        learner.check(bad, "reports[3].")
    assert exc.value.field == "reports[3]." + field
    assert learner.to_dict() == before
    # not poisoned: a good report is still accepted and measured as usual
    learner.observe(ProgressReport(**good))
    learner.observe(ProgressReport(T0 + 150, 4200.0 + 60 * 70.0, 6, 90_000.0 + 60 * 1400.0))
    m = learner.measured()
    assert m[4] == {"rate": 50.0, "seconds": 20.0, "intervals": 1, "power_w": 1000.0}
    assert m[6]["rate"] == pytest.approx(70.0) and m[6]["power_w"] == pytest.approx(1400.0)


def test_held_counts_since_the_last_report():
    learner = history()
    for n in (4, 8, 6):  # every count held since the last report is accepted
        learner.check(ProgressReport(T0 + 60, 3000.0, n))
    learner.observe(ProgressReport(T0 + 60, 3000.0, 6))
    with pytest.raises(FailedPrecondition) as exc:   # now only 6 was held since
        learner.check(ProgressReport(T0 + 70, 3000.0, 8))
    assert "task held 6 nodes since its last report at 1700000060, not 8" in str(exc.value)
    fresh = TaskLearner()
    fresh.check(ProgressReport(T0, 0.0, 0))          # before the start it holds nothing
    with pytest.raises(FailedPrecondition, match="since it was submitted, not 2"):
        fresh.check(ProgressReport(T0, 0.0, 2))
    # energy may be missing from a report, but may not go below the last reported value
    learner.observe(ProgressReport(T0 + 70, 3100.0, 6))
    with pytest.raises(FailedPrecondition):
        learner.check(ProgressReport(T0 + 80, 3200.0, 6, 20_000.0))


def test_allocation_changes_without_reports_stay_bounded():
    learner = history()
    for i in range(1000):
        learner.on_allocation(T0 + 50 + i, 5 + i % 3, "grow" if i % 3 else "shrink")
    d = learner.to_dict()
    assert len(d["allocations"]) <= 64 and len(json.dumps(d)) < 20_000
    for n in (4, 5, 6, 7, 8):  # counts from dropped changes are still known as held
        learner.check(ProgressReport(T0 + 2000, 5000.0, n))
    learner.observe(ProgressReport(T0 + 2000, 5000.0, 5))      # unclean: nothing learned
    assert sorted(learner.measured()) == [4]
    learner.observe(ProgressReport(T0 + 2060, 5000.0 + 60 * 70.0, 5))  # clean again
    assert learner.measured()[5]["rate"] == pytest.approx(70.0)
    with pytest.raises(ValueError):
        learner.on_allocation(T0, 3, "teleport")
    with pytest.raises(ValueError):
        learner.on_allocation(T0, -1, "grow")


# ---------------------------------------------------------------------- persistence
def test_round_trip_preserves_behaviour():
    sim = Sim(amdahl(80.0, 0.08), up_s=20.0, down_s=5.0, noise=0.03, seed=5,
              watts=lambda n: 250.0 * n)
    sim.alloc(2)
    sim.report(30.0)
    for n in (2, 4, 8, 4):
        if n != sim.n:
            sim.rescale(n, 10.0, 100.0)
        sim.report(60.0)
        sim.report(60.0)
    sim.rescale(16, 10.0, 100.0)  # pending: 16 not measured yet
    sim.alloc(12)                  # a change not yet covered by a report
    learner = sim.learner
    d = learner.to_dict()
    assert d["pending_rescales"] and d["allocations"]
    text = json.dumps(d, allow_nan=False)
    twin = TaskLearner.from_dict(json.loads(text))
    assert twin.to_dict() == d and twin.version == learner.version
    for x in (learner, twin):
        assert x.curve(1, 64, 3.0) == learner.curve(1, 64, 3.0)
    for n in (0, 1, 3, 8, 12, 40):
        assert twin.band(n, 3.0) == learner.band(n, 3.0)
        assert twin.power_at(n, 99.0) == learner.power_at(n, 99.0)
    assert twin.rescale_up_s(1.0) == learner.rescale_up_s(1.0)
    assert twin.measured() == learner.measured()
    # both continue identically
    for x in (learner, twin):
        x.observe(ProgressReport(sim.t + 50, sim.samples + 5000.0, 12, sim.energy + 1e5))
        x.observe(ProgressReport(sim.t + 150, sim.samples + 15000.0, 12, sim.energy + 4e5))
    assert twin.to_dict() == learner.to_dict()
    with pytest.raises(ValueError):
        TaskLearner.from_dict({**d, "format": 99})


# ---------------------------------------------------------------------- properties
# a report: (seconds since the previous one, samples since, joules since or None, which
# held count it names: -1 = the count it holds now)
report_step = st.tuples(
    st.one_of(st.floats(1, 1e3), st.floats(1, 1e3), st.floats(0, 1e-6), st.just(0.0),
              st.floats(0, 1e9)),
    st.one_of(st.floats(0, 1e6), st.floats(0, 1e6), st.just(0.0), st.floats(0, 1e24)),
    st.one_of(st.none(), st.floats(0, 1e6)),
    st.one_of(st.just(-1), st.just(-1), st.integers(0, 1000)))
# a phase: seconds run before the change, the new count (0: stopped), its kind when it
# shrinks (shrink or preempted), the reports while it holds that count
phase = st.tuples(st.floats(0, 1e3), st.integers(0, 12), st.booleans(),
                  st.lists(report_step, max_size=5))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(phase, max_size=12), st.integers(1, 8), st.integers(0, 60),
       st.floats(0, 1e3))
def test_random_valid_reports_keep_the_model_valid(phases, min_nodes, extra, prior):
    max_nodes = min_nodes + extra
    learner = TaskLearner()
    t, samples, energy, n = T0, 0.0, 0.0, 0
    versions = [0]
    for before, count, preempted, reports in phases:
        t += before
        if count != n:
            kind = ("start" if n == 0 else "stop" if count == 0 else "grow" if count > n
                    else "preempted" if preempted else "shrink")
            learner.on_allocation(t, count, kind)
            n = count
        for dt, ds, de, pick in reports:
            t, samples = t + dt, samples + ds
            e = None
            if de is not None:
                energy += de
                e = energy
            held = learner._held()
            nodes = n if pick < 0 else held[pick % len(held)]
            learner.observe(ProgressReport(t, samples, nodes, e))
            versions.append(learner.version)
        check_curve(*learner.curve(min_nodes, max_nodes, prior), min_nodes, max_nodes)
    assert versions == sorted(versions)
    ns, ps = learner.curve(min_nodes, max_nodes, prior)
    check_curve(ns, ps, min_nodes, max_nodes)
    for m in learner.measured():
        if min_nodes <= m <= max_nodes:
            assert m in ns
    est = [learner.rate_at(k, prior) for k in range(0, max_nodes + 2)]
    assert all(math.isfinite(v) and v >= 0 for v in est)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(est, est[1:]))
    for k in range(0, max_nodes + 2, 3):
        low, mid, high = learner.band(k, prior)
        assert all(math.isfinite(v) for v in (low, mid, high)) and 0 <= low <= mid <= high
        p = learner.power_at(k, 300.0)
        assert math.isfinite(p) and p >= 0
    for cost in (learner.rescale_up_s(3.0), learner.rescale_down_s(3.0)):
        assert math.isfinite(cost) and cost >= 0
    r = learner.per_node_rate()
    assert r is None or (math.isfinite(r) and r >= 0)
    d = learner.to_dict()
    assert TaskLearner.from_dict(json.loads(json.dumps(d, allow_nan=False))).to_dict() == d


def test_a_report_of_the_old_generation_after_the_decision_moves_the_change():
    """docs/execution.md: the daemon decides a grow at 100; the old generation (2 nodes at
    100/s) runs on until it is stopped, checkpoints and reports at 103; the new one (4 nodes at
    180/s) starts at 108. The interval up to 103 is clean at 2, the pause lies in the next
    interval, and the learned Tcup is its 5 s valued at the old rate (BFTrainer, Section 3)."""
    learner = TaskLearner()
    learner.on_allocation(T0, 2, "start")
    learner.observe(ProgressReport(T0 + 10, 0.0, 2))
    learner.observe(ProgressReport(T0 + 50, 4000.0, 2))               # clean: 100/s at 2
    learner.on_allocation(T0 + 100, 4, "grow")
    learner.observe(ProgressReport(T0 + 103, 9300.0, 2))              # the stop checkpoint
    assert learner.measured()[2]["seconds"] == pytest.approx(93.0)    # clean up to 103
    learner.observe(ProgressReport(T0 + 128, 9300.0 + 180 * 20, 4))   # started at 108
    learner.observe(ProgressReport(T0 + 148, 9300.0 + 180 * 40, 4))   # clean: 180/s at 4
    assert learner.measured()[4]["rate"] == pytest.approx(180.0)      # the pause is not in it
    up, down = learner.measured_rescale_s()
    assert up == pytest.approx(5.0 * 180 / 100) and down is None


def test_a_pause_before_the_change_starts_the_loss_and_is_never_a_clean_interval():
    """A preemption: Slurm signals the 4-node generation, which checkpoints and reports at 103
    and ends (the launcher's run report: a pause at 104); the daemon hears of the preemption
    at 106 (the prolog), the 2-node generation starts at 110. The loss counts from the pause,
    and a plain restart (a pause without a change) leaves its interval unclean."""
    learner = TaskLearner()
    learner.on_allocation(T0, 4, "start")
    learner.observe(ProgressReport(T0 + 10, 0.0, 4))
    learner.observe(ProgressReport(T0 + 103, 93 * 200.0, 4))        # clean: 200/s at 4
    learner.on_pause(T0 + 104)
    learner.on_allocation(T0 + 106, 2, "preempted")
    s = 93 * 200.0
    learner.observe(ProgressReport(T0 + 130, s + 20 * 120.0, 2))    # started at 110
    learner.observe(ProgressReport(T0 + 150, s + 40 * 120.0, 2))    # clean: 120/s at 2
    up, down = learner.measured_rescale_s()
    # lost, counted from the pause: 200/s from 103 to 104 and 120/s from 104 to 110
    assert down == pytest.approx((200 * (104 - 103) + 120 * (130 - 104) - 20 * 120) / 200)
    # a restart on the same nodes: the interval holding its pause is not a measurement
    seconds = learner.measured()[2]["seconds"]
    learner.on_pause(T0 + 151)
    learner.observe(ProgressReport(T0 + 170, s + 40 * 120.0 + 10 * 120.0, 2))
    assert learner.measured()[2]["seconds"] == seconds
    learner.observe(ProgressReport(T0 + 180, s + 40 * 120.0 + 20 * 120.0, 2))
    assert learner.measured()[2]["seconds"] == seconds + 10
    state = learner.to_dict()
    learner.on_pause(T0 + 181)
    assert TaskLearner.from_dict(learner.to_dict()).to_dict() == learner.to_dict() != state


def test_measured_rescale_costs_are_used_for_a_task_with_a_curve_too():
    """Issue 38: a task that declares its curve and reports its progress gets its measured
    Tcup/Tcdw in the allocation (measured beats declared), the spec's until one is measured."""
    from offcut.daemon.app.model import Task
    from offcut.daemon.app.scheduler import Scheduler
    from offcut.taskspec import TaskSpec

    sim = Sim(amdahl(100.0, 0.05), up_s=30.0, down_s=10.0, noise=0.01, seed=11)
    spec = TaskSpec(name="curve", min_nodes=1, max_nodes=16, node_counts=[0, 16],
                    throughputs=[0.0, 1000.0], rescale_up_s=99.0, rescale_down_s=77.0,
                    total_work_samples=1e9, reports_progress=True)
    assert not spec.learned and spec.reports
    task = Task("t000001", spec, "alice", submit_time=T0, learner=sim.learner)
    scheduler = Scheduler()
    assert scheduler.rescale_costs(task) == (99.0, 77.0)  # nothing measured yet: the spec's
    sim.alloc(4)
    sim.report(30.0)
    sim.report(120.0)
    for _ in range(2):
        for n, kind in [(8, "grow"), (16, "grow"), (8, "shrink"), (4, "shrink")]:
            sim.rescale(n, 25.0, 150.0, kind)
            sim.report(120.0)
    up, down = scheduler.rescale_costs(task)
    assert up == pytest.approx(30.0, rel=0.2) and down == pytest.approx(10.0, rel=0.3)

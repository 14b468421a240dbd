"""Tests of the energy-aware objective: per-task cost curves in the allocation problem
(every exact backend stays exact with them) and the ratio objective N / D solved by
Dinkelbach's method (``offcut.daemon.app.solvers.fractional``), against exhaustive enumeration."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.solvers.cbc import solve_cbc
from offcut.daemon.app.solvers.dp import _solve_dp_reference, solve_dp
from offcut.daemon.app.solvers.fractional import (
    EnergyTerms, RatioResult, energy_j, samples, solve_ratio)
from offcut.daemon.app.solvers.greedy import solve_greedy
from offcut.daemon.app.solvers.gurobi import gurobi_importable, solve_gurobi
from offcut.daemon.app.solvers.problem import AllocationProblem, interpolate
from offcut.errors import InvalidArgument
from solver_helpers import brute_force, count_vectors, fit_current, rel_close as close

HAS_GUROBI = gurobi_importable()
needs_gurobi = pytest.mark.skipif(not HAS_GUROBI, reason="gurobipy is not importable")


# ---------------------------------------------------------------- instances
def random_problem(rng: np.random.Generator, max_tasks: int = 4, max_nodes: int = 12,
                   costs: bool = True, min_pool: int = 0) -> AllocationProblem:
    """J <= max_tasks, min_pool <= N <= max_nodes; curves with 1-4 points after 0 (some
    non-integer), monotone or not; c_j anywhere (also outside [Jmin, Jmax]); cost curves
    of either sign."""
    J = int(rng.integers(1, max_tasks + 1))
    N = int(rng.integers(min_pool, max_nodes + 1))
    jmin = rng.integers(1, 4, J)
    jmax = jmin + rng.integers(0, 9, J)
    ns, os_, cs = [], [], []
    for _ in range(J):
        k = int(rng.integers(1, 5))
        pts = rng.choice(np.arange(1, 15), size=k, replace=False).astype(float)
        if rng.random() < 0.3:
            pts += rng.uniform(-0.5, 0.5, k)
        pts = np.unique(np.clip(pts, 0.5, None))
        ns.append(np.concatenate(([0.0], pts)))
        vals = rng.uniform(0, 100, len(pts) + 1)
        if rng.random() < 0.5:
            vals = np.cumsum(vals) / 2
        os_.append(vals)
        cs.append(rng.uniform(-40, 120, len(pts) + 1))
    cur = rng.integers(0, 7, J)
    fit_current(cur, N)
    return AllocationProblem(
        idle_nodes=N, current_nodes=cur, min_nodes=jmin, max_nodes=jmax, node_counts=ns,
        objective_values=os_, tfwd_s=float(rng.uniform(0.5, 20)),
        rescale_up_s=rng.uniform(0, 30, J), rescale_down_s=rng.uniform(0, 30, J),
        cost_values=cs if costs else None)


def random_terms(rng: np.random.Generator, p: AllocationProblem, eta: float) -> EnergyTerms:
    """Power curves > 0 at positive counts (sub- or super-linear), p_idle sometimes 0."""
    power = []
    for ns in p.node_counts:
        per_node = rng.uniform(50, 400)
        w = per_node * ns ** rng.uniform(0.6, 1.3) + rng.uniform(0, 100, len(ns)) * (ns > 0)
        w[0] = 0.0 if rng.random() < 0.7 else rng.uniform(0, 50)
        power.append(w)
    p_idle = 0.0 if rng.random() < 0.3 else float(rng.uniform(10, 150))
    return EnergyTerms(eta=eta, idle_node_power_w=p_idle,
                       node_max_power_w=float(rng.uniform(300, 600)), power_values=power)


def dp_reference_solve(p: AllocationProblem):
    return _solve_dp_reference(p)


SEEDS = range(300)


# ---------------------------------------------------------------- cost curves: value tables
def test_value_tables_follow_the_formula():
    rng = np.random.default_rng(7)
    for _ in range(50):
        p = random_problem(rng)
        tables = p.value_tables()
        for j in range(p.num_tasks):
            ns, jmin = p.node_counts[j], int(p.min_nodes[j])
            c = int(p.current_nodes[j])
            r = 0.0 if c < jmin else float(interpolate(ns, p.objective_values[j], c))
            for n in range(len(tables[j])):
                if 0 < n < jmin:
                    assert tables[j][n] == -math.inf
                    continue
                s = float(interpolate(ns, p.objective_values[j], n)) if n else 0.0
                cost = float(interpolate(ns, p.cost_values[j], n)) if n else 0.0
                want = p.tfwd_s * (s - cost) - (n > c) * p.rescale_up_s[j] * r \
                    - (n < c) * p.rescale_down_s[j] * r
                assert close(tables[j][n], want), (j, n)
        # costs never change the rescale rate R_j
        plain = p.with_costs(None)
        assert [p.current_rate(j) for j in range(p.num_tasks)] == \
            [plain.current_rate(j) for j in range(p.num_tasks)]


def test_with_costs_shares_everything_else():
    rng = np.random.default_rng(3)
    p = random_problem(rng, costs=False)
    q = p.with_costs([np.ones(len(ns)) for ns in p.node_counts])
    assert p.cost_values is None and len(q.cost_values) == p.num_tasks
    rec_p, rec_q = p.to_record(), q.to_record()
    assert "cost_values" not in rec_p and rec_q.pop("cost_values")
    assert rec_p == rec_q
    assert q.with_costs(None).to_record() == rec_p
    # C = 1 everywhere at n >= Jmin: every admissible nonzero count loses Tfwd
    for tp, tq in zip(p.value_tables(), q.value_tables()):
        fin = np.isfinite(tp)
        fin[0] = False
        assert np.allclose(tp[fin] - tq[fin], p.tfwd_s)
        assert tp[0] == tq[0]


# ---------------------------------------------------------------- cost curves: exactness
def test_dp_with_costs_equals_brute_force():
    rng = np.random.default_rng(11)
    negative = 0
    for _ in SEEDS:
        p = random_problem(rng)
        opt = brute_force(p)
        negative += opt < 0
        for solve in (solve_dp, _solve_dp_reference):
            s = solve(p)
            assert s.status == "optimal" and s.bound == s.objective
            assert p.admissible(s.counts) is None
            assert close(s.objective, opt), (solve.__name__, s.objective, opt)
    assert negative > 0  # the instances do reach negative optima


def test_dp_with_costs_larger_pools_match_reference(monkeypatch):
    """Longer free segments (both the enumerated and the sliding-window path)."""
    import offcut.daemon.app.solvers.dp as dp_mod

    rng = np.random.default_rng(12)
    for width in (32, 1):
        monkeypatch.setattr(dp_mod, "_BRUTE_WIDTH", width)
        for _ in range(60):
            p = random_problem(rng, max_tasks=6, max_nodes=60)
            ref = _solve_dp_reference(p)
            s = solve_dp(p)
            assert p.admissible(s.counts) is None
            assert close(s.objective, ref.objective), (width, s.objective, ref.objective)


def test_cbc_with_costs_equals_brute_force():
    rng = np.random.default_rng(13)
    for _ in range(12):
        p = random_problem(rng)
        s = solve_cbc(p, 10.0)
        assert p.admissible(s.counts) is None
        assert close(s.objective, brute_force(p), 1e-7)


@needs_gurobi
def test_gurobi_with_costs_both_forms_equal_brute_force():
    rng = np.random.default_rng(14)
    for _ in range(40):
        p = random_problem(rng)
        opt = brute_force(p)
        for form in ("sos2", "knapsack"):
            s = solve_gurobi(p, 10.0, form=form)
            assert p.admissible(s.counts) is None
            assert close(s.objective, opt, 1e-7), (form, s.objective, opt)
            assert s.bound >= s.objective - 1e-6 * max(1.0, abs(opt))


@needs_gurobi
def test_gurobi_sos2_uses_net_curve():
    """SOS2 form: the cost curve changes which count is best; the cost at 0 nodes is
    nonzero (the O_0 correction must cancel S - C at 0), a curve point is non-integer,
    S - C is negative on part of the curve, and R_j stays S_j(c_j)."""
    base = dict(idle_nodes=10, current_nodes=[2, 3], min_nodes=[1, 2], max_nodes=[8, 8],
                node_counts=[[0, 2.5, 6, 10], [0, 4, 8]],
                objective_values=[[0, 50, 80, 90], [0, 40, 90]], tfwd_s=10.0,
                rescale_up_s=[2.0, 1.0], rescale_down_s=[3.0, 1.0])
    plain = AllocationProblem(**base)
    costed = plain.with_costs([[30.0, 10.0, 70.0, 200.0], [-20.0, 0.0, 80.0]])
    for p in (plain, costed):
        opt = brute_force(p)
        s = solve_gurobi(p, 10.0, form="sos2")
        assert close(s.objective, opt, 1e-7) and close(p.evaluate(s.counts), opt, 1e-7)
    assert list(solve_gurobi(plain, 10.0, form="sos2").counts) == [2, 8]
    assert list(solve_gurobi(costed, 10.0, form="sos2").counts) == [3, 4]
    # every task's net curve is below zero: the optimum shrinks everything it can
    heavy = plain.with_costs([[0, 500, 500, 500], [0, 500, 500]])
    s = solve_gurobi(heavy, 10.0, form="sos2")
    assert list(s.counts) == [0, 0]
    assert close(s.objective, brute_force(heavy), 1e-7)


def test_greedy_with_costs_is_rescored():
    rng = np.random.default_rng(15)
    for _ in range(40):
        p = random_problem(rng)
        s = solve_greedy(p)
        assert s.objective == p.evaluate(s.counts)
        assert s.objective != p.with_costs(None).evaluate(s.counts) or not s.counts.any()
        assert s.objective <= solve_dp(p).objective + 1e-9 * max(1.0, abs(s.objective))


def test_isolated_allocator_carries_costs():
    """The guarded child gets the problem as a record: the costs must travel with it."""
    rng = np.random.default_rng(16)
    probs = [random_problem(rng) for _ in range(4)]
    with Allocator("cbc", time_limit_s=10.0, isolate=True) as alloc:
        for p in probs:
            s, reason = alloc.solve(p)
            assert reason is None
            assert close(s.objective, brute_force(p), 1e-7)


# ---------------------------------------------------------------- records and validation
def test_record_round_trip_with_costs():
    rng = np.random.default_rng(17)
    for _ in range(10):
        p = random_problem(rng)
        rec = json.loads(p.to_json())
        assert len(rec["cost_values"]) == p.num_tasks
        q = AllocationProblem.from_record(rec)
        assert q.to_record() == p.to_record()
        assert all(np.array_equal(a, b) for a, b in zip(p.value_tables(), q.value_tables()))
        del rec["cost_values"]  # records without costs (older files) still load
        r = AllocationProblem.from_record(rec)
        assert r.cost_values is None and "cost_values" not in r.to_record()


def _good(**over):
    kw = dict(idle_nodes=4, current_nodes=[1, 0], min_nodes=[1, 1], max_nodes=[3, 3],
              node_counts=[[0, 4], [0, 2, 4]], objective_values=[[0, 4], [0, 5, 8]],
              tfwd_s=10, rescale_up_s=[1, 1], rescale_down_s=[1, 1],
              cost_values=[[0, 1], [0, -1, 2]])
    kw.update(over)
    return kw


@pytest.mark.parametrize("costs", [
    [[0, 1]],  # one curve for two tasks
    [[0, 1], [0, 1]],  # wrong length for task 1
    [[0, 1], [[0, 1, 2]]],  # not one-dimensional
    [[0, math.inf], [0, 1, 2]],
    [[0, math.nan], [0, 1, 2]],
    [["a", 1], [0, 1, 2]],
    5.0,
])
def test_cost_validation_names_field(costs):
    with pytest.raises(InvalidArgument) as e:
        AllocationProblem(**_good(cost_values=costs))
    assert e.value.field == "cost_values"
    good = AllocationProblem(**_good(cost_values=None))
    with pytest.raises(InvalidArgument) as e:
        good.with_costs(costs)
    assert e.value.field == "cost_values"
    rec = good.to_record()
    rec["cost_values"] = costs
    with pytest.raises(InvalidArgument, match="cost_values"):
        AllocationProblem.from_record(rec)


@pytest.mark.parametrize("over, field", [
    (dict(eta=1.5), "eta"),
    (dict(eta=-0.1), "eta"),
    (dict(eta=math.nan), "eta"),
    (dict(idle_node_power_w=-1.0), "idle_node_power_w"),
    (dict(idle_node_power_w=math.inf), "idle_node_power_w"),
    (dict(node_max_power_w=0.0), "node_max_power_w"),
    (dict(power_values=[[0, 100]]), "power_values"),
    (dict(power_values=[[0, 100], [0, 100]]), "power_values"),
    (dict(power_values=[[0, -100], [0, 50, 100]]), "power_values"),
    (dict(power_values=[[0, 100], [0, 0, 100]]), "power_values"),
    (dict(power_values=[[0, math.nan], [0, 50, 100]]), "power_values"),
])
def test_energy_terms_validation_names_field(over, field):
    p = AllocationProblem(**_good())
    kw = dict(eta=1.0, idle_node_power_w=20.0, node_max_power_w=300.0,
              power_values=[[0, 100], [0, 50, 100]])
    kw.update(over)
    terms = EnergyTerms(**kw)
    with pytest.raises(InvalidArgument) as e:
        terms.validate(p)
    assert e.value.field == field
    with pytest.raises(InvalidArgument) as e:
        solve_ratio(p, terms, solve_dp)
    assert e.value.field == field


def test_energy_and_samples_by_hand():
    p = AllocationProblem(**_good())
    terms = EnergyTerms(eta=0.5, idle_node_power_w=20.0, node_max_power_w=300.0,
                        power_values=[[0, 100], [0, 50, 100]])
    # task 0 at 2 nodes: 50 W; task 1 at 1 node: 25 W; 4 idle nodes; Tfwd 10 s
    eta_part = (50 - 2 * 20) + (25 - 1 * 20) + 4 * 20
    assert close(energy_j(p, terms, [2, 1]), 10 * (0.5 * eta_part + 0.5 * 4 * 300))
    assert close(energy_j(p, terms, [0, 0]), 10 * (0.5 * 4 * 20 + 0.5 * 4 * 300))
    # samples ignore costs: task 0 grows 1 -> 2 (loses Tcup R = 1), task 1 at 1 node: 2.5
    assert close(samples(p, [2, 1]), 10 * (2 + 2.5) - 1)
    with pytest.raises(ValueError):
        energy_j(p, terms, [4, 1])
    with pytest.raises(ValueError):
        samples(p, [4, 1])


# ---------------------------------------------------------------- ratio objective
def brute_force_ratio(p: AllocationProblem, terms: EnergyTerms) -> float:
    """max N(x) / D(x) over every feasible x with D(x) > 0."""
    return max(samples(p, x) / d for x in count_vectors(p)
               if (d := energy_j(p, terms, x)) > 0)


def _check_ratio(p: AllocationProblem, terms: EnergyTerms, solve,
                 rtol: float = 1e-9) -> RatioResult:
    res = solve_ratio(p, terms, solve)
    plain = p.with_costs(None)
    thr = solve(plain)
    assert res.iterations == len(res.answers) >= 1 and res.converged
    assert np.array_equal(np.asarray(res.answers[0].counts), np.asarray(thr.counts))
    assert p.admissible(res.counts) is None and res.counts.dtype == np.int64
    assert close(res.samples, samples(p, res.counts))
    assert close(res.energy_j, energy_j(p, terms, res.counts))
    thr_n, thr_d = samples(p, thr.counts), energy_j(p, terms, thr.counts)
    if thr_n <= 0:  # nothing worth running: the throughput optimum is the answer
        assert np.array_equal(res.counts, thr.counts) and res.iterations == 1
        return res
    assert close(res.ratio, res.samples / res.energy_j)
    best = brute_force_ratio(p, terms)
    assert close(res.ratio, best, rtol), (res.ratio, best)
    assert res.ratio >= thr_n / thr_d * (1 - 1e-12)
    assert res.samples <= thr_n * (1 + 1e-12)
    if terms.eta == 0:
        assert np.array_equal(res.counts, thr.counts) and res.iterations == 1
    return res


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ratio_dp_equals_brute_force(eta):
    rng = np.random.default_rng(int(eta * 10) + 21)
    improved = 0
    for _ in range(150):
        p = random_problem(rng, costs=False, min_pool=4)
        terms = random_terms(rng, p, eta)
        res = _check_ratio(p, terms, solve_dp)
        improved += not np.array_equal(res.counts, res.answers[0].counts)
        # the compiled dp and the reference dp agree on the ratio
        ref = solve_ratio(p, terms, dp_reference_solve)
        assert close(ref.ratio, res.ratio)
    if eta > 0:
        assert improved > 0  # the energy objective does move allocations


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ratio_cbc_equals_brute_force(eta):
    rng = np.random.default_rng(int(eta * 10) + 31)
    for _ in range(3):
        p = random_problem(rng, costs=False, min_pool=4)
        _check_ratio(p, random_terms(rng, p, eta), lambda q: solve_cbc(q, 10.0), 1e-7)


@needs_gurobi
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("form", ["sos2", "knapsack"])
def test_ratio_gurobi_equals_brute_force(eta, form):
    rng = np.random.default_rng(int(eta * 10) + 41)
    for _ in range(25):
        p = random_problem(rng, costs=False, min_pool=4)
        _check_ratio(p, random_terms(rng, p, eta), lambda q: solve_gurobi(q, 10.0, form=form),
                     1e-7)


def test_ratio_curve_ending_before_max_nodes():
    """P_j is flat beyond a curve's last point but n p_idle is not: the subproblems get a
    point at min(Jmax_j, N) so that C_j is exact there too."""
    p = AllocationProblem(idle_nodes=10, current_nodes=[0, 0], min_nodes=[1, 1],
                          max_nodes=[10, 3], node_counts=[[0, 2], [0, 3]],
                          objective_values=[[0, 10], [0, 12]], tfwd_s=10.0,
                          rescale_up_s=[0, 0], rescale_down_s=[0, 0])
    terms = EnergyTerms(eta=1.0, idle_node_power_w=100.0, node_max_power_w=300.0,
                        power_values=[[0, 300], [0, 500]])
    seen = []

    def solve(q):
        seen.append(q)
        return solve_dp(q)

    res = solve_ratio(p, terms, solve)
    assert close(res.ratio, brute_force_ratio(p, terms)) and res.converged
    # task 0 at 10 nodes draws 300 W but frees 8 idle nodes' 800 W: the optimum uses that
    assert res.counts[0] == 10
    assert seen[0] is p and res.iterations >= 2
    for q in seen[1:]:
        assert list(q.node_counts[0]) == [0, 2, 10] and list(q.node_counts[1]) == [0, 3]
        assert all(np.array_equal(a, b) for a, b in zip(
            q.with_costs(None).value_tables(), p.value_tables()))


def test_ratio_accepts_journaled_records_and_ignores_own_costs():
    """``solve`` may return any object with ``.counts`` (the core's SolveRecord: a list)."""
    rng = np.random.default_rng(51)
    p = random_problem(rng, costs=True)
    while samples(p, solve_dp(p.with_costs(None)).counts) <= 0:
        p = random_problem(rng, costs=True)
    terms = random_terms(rng, p, 1.0)

    def journaled(q):
        return SimpleNamespace(counts=[int(x) for x in solve_dp(q).counts], solver="dp")

    res = solve_ratio(p, terms, journaled)
    ref = solve_ratio(p.with_costs(None), terms, solve_dp)
    assert np.array_equal(res.counts, ref.counts) and res.ratio == ref.ratio
    assert res.iterations == ref.iterations and all(a.solver == "dp" for a in res.answers)
    assert close(res.ratio, brute_force_ratio(p, terms))


def test_ratio_deterministic_and_reports_non_convergence():
    rng = np.random.default_rng(61)
    found = False
    for _ in range(200):
        p = random_problem(rng, costs=False)
        terms = random_terms(rng, p, 1.0)
        res = solve_ratio(p, terms, solve_dp)
        again = solve_ratio(p, terms, solve_dp)
        assert np.array_equal(res.counts, again.counts) and res.ratio == again.ratio
        if res.iterations >= 3:  # the throughput optimum was not ratio-optimal
            capped = solve_ratio(p, terms, solve_dp, max_solves=2)
            assert not capped.converged and capped.iterations == 2
            assert capped.ratio <= res.ratio
            assert capped.ratio >= samples(p, res.answers[0].counts) / energy_j(
                p, terms, res.answers[0].counts)
            found = True
            break
    assert found
    with pytest.raises(InvalidArgument) as e:
        solve_ratio(p, terms, solve_dp, max_solves=0)
    assert e.value.field == "max_solves"


def test_ratio_trivial_cases():
    terms = EnergyTerms(eta=1.0, idle_node_power_w=0.0, node_max_power_w=300.0,
                        power_values=[[0, 100], [0, 50, 100]])
    # no idle nodes: nothing runs, D = 0, ratio 0
    p = AllocationProblem(**_good(idle_nodes=0, current_nodes=[0, 0], cost_values=None))
    res = solve_ratio(p, terms, solve_dp)
    assert list(res.counts) == [0, 0] and res.ratio == 0.0 and res.energy_j == 0.0
    assert res.iterations == 1 and res.converged
    # no tasks
    p = AllocationProblem(3, [], [], [], [], [], 10.0, [], [])
    res = solve_ratio(p, EnergyTerms(0.5, 10.0, 300.0, []), solve_dp)
    assert res.counts.shape == (0,) and res.samples == 0.0
    assert close(res.energy_j, 10.0 * (0.5 * 3 * 10.0 + 0.5 * 3 * 300.0))

"""Tests of the allocation backends (docs/architecture.md, "Solver backends"): every exact backend
equals an exhaustive enumeration on random instances; greedy is feasible and no better; the guard
survives crashes and hangs; records round trip; real BFTrainer task sets agree across
solvers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.solvers.base import SOLVER_NAMES, SolverFailed, SolverUnavailable
from offcut.daemon.app.solvers.cbc import solve_cbc
from offcut.daemon.app.solvers.dp import solve_dp
from offcut.daemon.app.solvers.greedy import solve_greedy
from offcut.daemon.app.solvers.gurobi import choose_form, gurobi_importable, solve_gurobi
from offcut.daemon.app.solvers.guard import GuardedWorker
from offcut.daemon.app.solvers.problem import AllocationProblem
from offcut.daemon.app.solvers.records import solve_records
from offcut.errors import InvalidArgument
from solver_helpers import brute_force, fit_current, rel_close

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
HAS_GUROBI = gurobi_importable()
needs_gurobi = pytest.mark.skipif(not HAS_GUROBI, reason="gurobipy is not importable")


# ---------------------------------------------------------------- helpers
def close(a: float, b: float) -> bool:
    return rel_close(a, b, 1e-6)


def _assemble(draw, N, jmin, jmax, ns, os_, cur) -> AllocationProblem:
    """A problem from drawn per-task parts; current counts are trimmed to fit N, Tfwd and
    rescale costs are drawn here."""
    J = len(jmin)
    cur = np.array(cur)
    fit_current(cur, N)
    return AllocationProblem(
        idle_nodes=N, current_nodes=cur, min_nodes=jmin, max_nodes=jmax, node_counts=ns,
        objective_values=os_, tfwd_s=draw(st.floats(0.5, 20)),
        rescale_up_s=draw(st.lists(st.floats(0, 30), min_size=J, max_size=J)),
        rescale_down_s=draw(st.lists(st.floats(0, 30), min_size=J, max_size=J)))


@st.composite
def problems(draw, max_tasks=5, max_nodes=12):
    J = draw(st.integers(1, max_tasks))
    N = draw(st.integers(0, max_nodes))
    monotone = draw(st.booleans())
    jmin, jmax, ns, os_, cur = [], [], [], [], []
    for _ in range(J):
        lo = draw(st.integers(1, 4))
        jmin.append(lo)
        jmax.append(lo + draw(st.integers(0, 8)))
        pts = sorted(draw(st.sets(st.integers(1, 14), min_size=1, max_size=5)))
        ns.append([0] + pts)
        vals = draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=len(pts) + 1,
                             max_size=len(pts) + 1))
        if monotone:
            vals = list(np.cumsum(vals) / 2)
        os_.append(vals)
        cur.append(draw(st.integers(0, 6)))
    return _assemble(draw, N, jmin, jmax, ns, os_, cur)


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MILP = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- exactness
@FAST
@given(problems())
def test_dp_equals_brute_force(p):
    s = solve_dp(p)
    assert s.status == "optimal" and s.bound == s.objective
    assert p.admissible(s.counts) is None
    assert close(s.objective, brute_force(p))


@FAST
@given(problems())
def test_greedy_feasible_and_not_better(p):
    s = solve_greedy(p)
    assert p.admissible(s.counts) is None
    assert s.bound == math.inf and s.status == "feasible"
    assert s.objective <= solve_dp(p).objective + 1e-6 * max(1.0, abs(s.objective))


@MILP
@given(problems())
def test_cbc_equals_brute_force(p):
    s = solve_cbc(p, 10.0)
    assert p.admissible(s.counts) is None
    assert close(s.objective, brute_force(p))


@needs_gurobi
@MILP
@given(problems())
def test_gurobi_both_forms_equal_brute_force(p):
    opt = brute_force(p)
    for form in ("sos2", "knapsack"):
        s = solve_gurobi(p, 10.0, form=form)
        assert p.admissible(s.counts) is None
        assert close(s.objective, opt), form
        assert s.bound >= s.objective - 1e-6 * max(1.0, abs(opt))


@pytest.fixture(scope="module")
def guarded_cbc():
    with Allocator("cbc", time_limit_s=10.0, isolate=True) as alloc:
        yield alloc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(problems())
def test_allocator_isolated_cbc_equals_brute_force(guarded_cbc, p):
    s, reason = guarded_cbc.solve(p)
    assert reason is None
    assert close(s.objective, brute_force(p))


@settings(max_examples=40, deadline=None)
@given(problems())
def test_allocator_auto_in_process(p):
    s, reason = Allocator("auto", isolate=False).solve(p)
    assert reason is None
    assert s.solver in ("gurobi", "cbc", "trivial")
    assert close(s.objective, brute_force(p))


def test_trivial_cases():
    alloc = Allocator("cbc", isolate=False)
    p = AllocationProblem(0, [0, 0], [1, 1], [2, 2], [[0, 1], [0, 1]], [[0, 1], [0, 1]], 10,
                          [1, 1], [1, 1])
    s, reason = alloc.solve(p)
    assert s.solver == "trivial" and list(s.counts) == [0, 0] and reason is None
    p = AllocationProblem(5, [], [], [], [], [], 10, [], [])
    s, _ = alloc.solve(p)
    assert s.solver == "trivial" and len(s.counts) == 0 and s.objective == 0.0
    assert alloc.solves_by_backend == {"trivial": 2}


def test_solver_names_and_bad_settings():
    assert SOLVER_NAMES == ("auto", "gurobi", "cbc", "dp", "greedy")
    with pytest.raises(InvalidArgument) as e:
        Allocator("cplex")
    assert e.value.field == "solver"
    with pytest.raises(InvalidArgument) as e:
        Allocator("dp", time_limit_s=0)
    assert e.value.field == "time_limit_s"


# ---------------------------------------------------------------- validation
def _good(**over):
    kw = dict(idle_nodes=4, current_nodes=[1, 0], min_nodes=[1, 1], max_nodes=[3, 3],
              node_counts=[[0, 4], [0, 4]], objective_values=[[0, 4], [0, 8]], tfwd_s=10,
              rescale_up_s=[1, 1], rescale_down_s=[1, 1])
    kw.update(over)
    return kw


@pytest.mark.parametrize("over, field", [
    (dict(idle_nodes=-1, current_nodes=[0, 0]), "idle_nodes"),
    (dict(current_nodes=[3, 3]), "current_nodes"),
    (dict(current_nodes=[-1, 0]), "current_nodes"),
    (dict(min_nodes=[0, 1]), "min_nodes"),
    (dict(max_nodes=[1]), "max_nodes"),
    (dict(tfwd_s=0), "tfwd_s"),
    (dict(rescale_up_s=[1, -1]), "rescale_up_s"),
    (dict(rescale_down_s=[1, math.inf]), "rescale_down_s"),
    (dict(node_counts=[[1, 4], [0, 4]]), "node_counts"),
    (dict(objective_values=[[0, -4], [0, 8]]), "objective_values"),
])
def test_validation_names_field(over, field):
    with pytest.raises(InvalidArgument) as e:
        AllocationProblem(**_good(**over))
    assert e.value.field == field
    assert field in str(e.value)


def test_from_record_missing_field():
    rec = AllocationProblem(**_good()).to_record()
    del rec["tfwd_s"]
    with pytest.raises(InvalidArgument, match="tfwd_s"):
        AllocationProblem.from_record(rec)


# ---------------------------------------------------------------- guard
SMALL = AllocationProblem(**_good())


def test_guard_abort_and_hang_restart():
    with GuardedWorker(margin_s=0.5) as w:
        ok = w.solve("cbc", SMALL, 5.0)
        assert SMALL.evaluate(ok["counts"]) == solve_dp(SMALL).objective
        pid = w.pid
        with pytest.raises(SolverFailed, match="died"):
            w.solve("_test_abort", SMALL, 1.0)
        with pytest.raises(SolverFailed, match="no answer"):
            w.solve("_test_hang", SMALL, 0.5)
        ok = w.solve("cbc", SMALL, 5.0)  # a fresh child answers again
        assert w.pid != pid and w.restarts >= 2
        assert SMALL.evaluate(ok["counts"]) == solve_dp(SMALL).objective


@pytest.mark.parametrize("hook", ["_test_abort", "_test_hang"])
def test_allocator_falls_back_when_backend_dies(hook):
    with Allocator("cbc", time_limit_s=1.0, margin_s=0.5) as alloc:
        alloc.solver = hook  # the hooks are not public solver names
        s, reason = alloc.solve(SMALL)
        assert reason and s.solver == "dp"
        assert s.objective == solve_dp(SMALL).objective
        assert alloc.fallbacks == 1
        alloc.solver = "cbc"
        s, reason = alloc.solve(SMALL)  # the worker restarted
        assert reason is None and s.solver == "cbc"


def test_allocator_falls_back_on_unavailable_gurobi(monkeypatch):
    import offcut.daemon.app.solvers.gurobi as g

    monkeypatch.setattr(g, "SIZE_LIMIT_VARS", 1)
    with pytest.raises(SolverUnavailable, match="variables"):
        choose_form(SMALL)
    alloc = Allocator("gurobi", isolate=False)
    s, reason = alloc.solve(SMALL)
    assert s.solver == "dp" and reason
    assert Allocator("auto", isolate=False).backend_for(SMALL) == "cbc"


def test_allocator_falls_back_on_infeasible_answer(monkeypatch):
    import offcut.daemon.app.solvers.cbc as cbc_mod
    from offcut.daemon.app.solvers.problem import Solution

    def bad(problem, limit):
        return Solution(np.array([9, 9]), 0.0, 0.0, 0.0, "cbc", "optimal")

    monkeypatch.setattr(cbc_mod, "solve_cbc", bad)
    s, reason = Allocator("cbc", isolate=False).solve(SMALL)
    assert s.solver == "dp" and "infeasible" in reason


# ---------------------------------------------------------------- records
def test_records_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    probs = []
    for _ in range(5):
        J = int(rng.integers(1, 4))
        probs.append(AllocationProblem(
            8, np.zeros(J, int), np.ones(J, int), np.full(J, 5),
            [[0, 2, 6]] * J, [list(rng.uniform(0, 9, 3))] * J, 10, rng.uniform(0, 5, J),
            rng.uniform(0, 5, J)))
    for p in probs:
        q = AllocationProblem.from_record(json.loads(p.to_json()))
        assert q.to_record() == p.to_record()
    f = tmp_path / "inst.jsonl"
    f.write_text("\n".join(p.to_json() for p in probs[:3]) + "\n\n" + "\n".join(
        p.to_json() for p in probs[3:]) + "\n")
    out = list(solve_records(f, "dp", 5.0))
    assert len(out) == 5
    for p, o in zip(probs, out):
        assert set(o) >= {"objective", "bound", "counts", "solve_ms", "solver", "status"}
        assert close(o["objective"], brute_force(p))
        assert o["solver"] == "dp" and "fallback_reason" not in o


def test_records_bad_line_named(tmp_path):
    f = tmp_path / "bad.jsonl"
    good = SMALL.to_json()
    f.write_text(good + "\n\n{not json\n")
    with pytest.raises(InvalidArgument, match="line 3"):
        list(solve_records(f, "dp", 5.0))
    rec = SMALL.to_record()
    rec["min_nodes"] = [0, 1]
    f.write_text(good + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(InvalidArgument, match="line 2.*min_nodes"):
        list(solve_records(f, "dp", 5.0))


# ---------------------------------------------------------------- real task sets
def _bftrainer_instance(n_nodes: int, seed: int) -> AllocationProblem:
    pd = pytest.importorskip("pandas")
    folder = DATA / "bftrainer"
    if not folder.is_dir():
        pytest.skip(f"real BFTrainer data not found at {folder} (shared data folder absent)")
    nps = pd.read_pickle(folder / "hps-shufflenet-JNPs-10J.pkl")
    bnd = pd.read_pickle(folder / "hps-shufflenet-Jbnd-10J.pkl").loc[nps.index]
    rng = np.random.default_rng(seed)
    J = len(nps)
    cur = np.zeros(J, dtype=int)
    held = rng.random(J) < 0.6
    cur[held] = rng.integers(1, 2 * n_nodes // J, held.sum())
    while cur.sum() > n_nodes:
        cur[int(np.argmax(cur))] -= 1
    return AllocationProblem(
        n_nodes, cur, bnd["Jmin"].to_numpy(int), bnd["Jmax"].to_numpy(int),
        list(nps["Ns"]), list(nps["Os"]), 10.0, bnd["Tcup"].to_numpy(float),
        bnd["Tcdw"].to_numpy(float))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recorded_task_set_all_solvers_agree(seed):
    p = _bftrainer_instance(128, seed)
    assert p.num_tasks == 10
    ref = solve_dp(p).objective
    assert close(solve_cbc(p, 30.0).objective, ref)
    if HAS_GUROBI:
        assert close(solve_gurobi(p, 30.0).objective, ref)
        assert close(solve_gurobi(p, 30.0, form="knapsack").objective, ref)
    assert solve_greedy(p).objective <= ref + 1e-6 * abs(ref)


# ---------------------------------------------------------------- breakpoint dp vs reference
@st.composite
def hard_problems(draw, max_tasks=5, max_nodes=40):
    """Non-concave, non-monotone curves (non-integer curve points too), c_j below Jmin or
    above Jmax, N below some Jmin, wide Jmax ranges."""
    J = draw(st.integers(1, max_tasks))
    N = draw(st.integers(0, max_nodes))
    jmin, jmax, ns, os_, cur = [], [], [], [], []
    for _ in range(J):
        lo = draw(st.integers(1, max(1, max_nodes // 2)))
        jmin.append(lo)
        jmax.append(lo + draw(st.integers(0, max_nodes)))
        pts = sorted(draw(st.sets(st.floats(0.5, 1.5 * max_nodes + 1, allow_nan=False),
                                  min_size=1, max_size=6)))
        ns.append([0.0] + pts)
        vals = draw(st.lists(st.floats(0, 1000, allow_nan=False), min_size=len(pts) + 1,
                             max_size=len(pts) + 1))
        if draw(st.booleans()):
            vals = list(np.cumsum(vals))
        os_.append(vals)
        cur.append(draw(st.integers(0, max_nodes)))
    return _assemble(draw, N, jmin, jmax, ns, os_, cur)


def _check_dp_against(p: AllocationProblem, opt: float) -> None:
    s = solve_dp(p)
    assert s.status == "optimal" and s.bound == s.objective and s.solver == "dp"
    assert p.admissible(s.counts) is None
    assert s.counts.dtype == np.int64 and s.counts.shape == (p.num_tasks,)
    assert s.objective == p.evaluate(s.counts)
    assert rel_close(s.objective, opt), (s.objective, opt)


@pytest.fixture
def window_everywhere(monkeypatch):
    """Force the sliding-window path for every free segment longer than one count."""
    import offcut.daemon.app.solvers.dp as dp_mod

    monkeypatch.setattr(dp_mod, "_BRUTE_WIDTH", 1)


@FAST
@given(hard_problems(max_tasks=4, max_nodes=10))
def test_breakpoint_dp_equals_brute_force_hard(p):
    _check_dp_against(p, brute_force(p))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hard_problems(max_tasks=7, max_nodes=60))
def test_breakpoint_dp_equals_reference(p):
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    ref = _solve_dp_reference(p)
    _check_dp_against(p, ref.objective)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(hard_problems(max_tasks=7, max_nodes=60))
def test_breakpoint_dp_window_path_equals_reference(window_everywhere, p):
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    _check_dp_against(p, _solve_dp_reference(p).objective)


@settings(max_examples=100, deadline=None)
@given(problems(max_nodes=30))
def test_reference_loop_and_block_paths_agree(p):
    import offcut.daemon.app.solvers.dp as dp_mod

    block = dp_mod._solve_dp_reference(p)
    old = dp_mod._LOOP_MIN_NODES
    dp_mod._LOOP_MIN_NODES = 0
    try:
        loop = dp_mod._solve_dp_reference(p)
    finally:
        dp_mod._LOOP_MIN_NODES = old
    assert loop.objective == block.objective
    assert list(loop.counts) == list(block.counts)


def test_breakpoint_dp_exact_ties_follow_documented_rule():
    # two identical linear tasks: every split of the pool is optimal; the rule is the
    # fewest total nodes, then from the last task backwards c_j, then fewer nodes
    p = AllocationProblem(10, [0, 0], [1, 1], [8, 8], [[0, 8], [0, 8]], [[0, 8], [0, 8]],
                          1.0, [0, 0], [0, 0])
    s = solve_dp(p)
    assert list(s.counts) == [8, 2]
    p = AllocationProblem(10, [0, 5], [1, 1], [8, 8], [[0, 8], [0, 8]], [[0, 8], [0, 8]],
                          1.0, [0, 0], [0, 0])
    assert list(solve_dp(p).counts) == [5, 5]
    # a flat curve: no node beyond what is needed
    p = AllocationProblem(10, [0, 0], [1, 1], [8, 8], [[0, 2], [0, 2]], [[0, 4], [0, 4]],
                          1.0, [0, 0], [0, 0])
    assert list(solve_dp(p).counts) == [2, 2]


def _benchmark_like(J: int, N: int, seed: int) -> AllocationProblem:
    """Synthetic Amdahl curves as in benchmarks/decision_time.py (no data needed)."""
    rng = np.random.default_rng(seed)
    ns = np.array([0, 1, 2, 4, 8, 16, 32, 64])
    curves = []
    for _ in range(J):
        r, a = rng.uniform(1e3, 1e4), rng.uniform(0.001, 0.05)
        curves.append(np.where(ns > 0, r * ns / (1 + a * (np.maximum(ns, 1) - 1)), 0.0))
    cur = np.zeros(J, dtype=int)
    held = rng.random(J) < 0.7
    cur[held] = rng.integers(1, max(2, 2 * N // J), held.sum())
    fit_current(cur, N)
    return AllocationProblem(N, cur, np.ones(J, int), np.full(J, 64), [ns] * J, curves, 10.0,
                             rng.uniform(17, 19, J), rng.uniform(11, 13, J))


def _random_large(J: int, N: int, seed: int) -> AllocationProblem:
    """Rugged random curves, wide [Jmin, Jmax], current counts anywhere."""
    rng = np.random.default_rng(seed)
    jmin = rng.integers(1, 40, J)
    jmax = jmin + rng.integers(0, 400, J)
    ns, os_ = [], []
    for _ in range(J):
        pts = np.unique(rng.integers(1, 500, rng.integers(1, 12)))
        ns.append(np.concatenate(([0], pts)))
        os_.append(rng.uniform(0, 1e4, len(pts) + 1))
    cur = rng.integers(0, 2 * N // J + 2, J)
    fit_current(cur, N)
    return AllocationProblem(N, cur, jmin, jmax, ns, os_, float(rng.uniform(1, 20)),
                             rng.uniform(0, 30, J), rng.uniform(0, 30, J))


@pytest.mark.parametrize("J, N, seed", [(30, 800, 0), (30, 800, 1), (100, 4734, 2),
                                        (100, 4734, 3)])
def test_breakpoint_dp_large_benchmark_like(J, N, seed):
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    p = _benchmark_like(J, N, seed)
    _check_dp_against(p, _solve_dp_reference(p).objective)


@pytest.mark.parametrize("J, N, seed", [(30, 800, 0), (30, 800, 1), (12, 1500, 2)])
@pytest.mark.parametrize("window", [False, True])
def test_breakpoint_dp_large_random(J, N, seed, window, monkeypatch):
    import offcut.daemon.app.solvers.dp as dp_mod
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    if window:
        monkeypatch.setattr(dp_mod, "_BRUTE_WIDTH", 1)
    p = _random_large(J, N, seed)
    _check_dp_against(p, _solve_dp_reference(p).objective)


def test_breakpoint_dp_real_curves_100x4734():
    pd = pytest.importorskip("pandas")
    folder = DATA / "bftrainer"
    if not (folder / "ImageNet-imgps-JNPs-1001J.pkl").exists():
        pytest.skip(f"real BFTrainer data not found at {folder}")
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    nps = pd.read_pickle(folder / "ImageNet-imgps-JNPs-1001J.pkl")
    bnd = pd.read_pickle(folder / "ImageNet-imgps-Jbnd-1001J.pkl").loc[nps.index]
    rng = np.random.default_rng(7)
    for _ in range(2):
        J, N = 100, 4734
        pick = rng.choice(len(nps), J, replace=False)
        cur = np.zeros(J, dtype=int)
        held = rng.random(J) < 0.7
        cur[held] = rng.integers(1, 2 * N // J, held.sum())
        fit_current(cur, N)
        b = bnd.iloc[pick]
        p = AllocationProblem(N, cur, b["Jmin"].to_numpy(int), b["Jmax"].to_numpy(int),
                              list(nps["Ns"].iloc[pick]), list(nps["Os"].iloc[pick]), 10.0,
                              b["Tcup"].to_numpy(float), b["Tcdw"].to_numpy(float))
        _check_dp_against(p, _solve_dp_reference(p).objective)


def _price(p: AllocationProblem):
    """dp_kernel._capacity_price on ``p`` (plain Python): (lambda, thr, lb, tables)."""
    import offcut.daemon.app.solvers.dp as dp_mod
    from offcut.daemon.app.solvers import dp_kernel

    tab, tab_off, ns, ns_off = dp_mod._pack(p)
    bp_all, bp_off = dp_kernel._all_breakpoints(tab_off, ns, ns_off, p.min_nodes,
                                                p.current_nodes)
    lam, thr, lb = dp_kernel._capacity_price(tab, tab_off, bp_all, bp_off, p.min_nodes,
                                             p.current_nodes, p.idle_nodes, 0.0)
    return lam, thr, lb, p.value_tables()


def test_capacity_price_keeps_every_optimal_count():
    """The reduced-cost fixing (dp_kernel._capacity_price) may drop a count only when no
    optimal vector uses it: on 300 seeded problems (Amdahl curves with rescale costs, which
    make f_j non-concave, and rugged curves) every task's count in the reference optimum
    passes its threshold, and the lower bound is a value some feasible vector reaches (<= the
    optimum). A third of them have optima off the relaxation's choices, where a threshold
    without the gap UB - LB would drop an optimal count."""
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    rng = np.random.default_rng(17)
    checked = loose = 0
    for i in range(300):
        seed = int(rng.integers(1 << 30))
        if i % 3 == 2:
            p = _random_large(int(rng.integers(2, 9)), int(rng.integers(20, 300)), seed)
        else:
            p = _benchmark_like(int(rng.integers(5, 16)), int(rng.integers(50, 300)), seed)
        lam, thr, lb, tables = _price(p)
        assert lam >= 0.0
        if lb == -np.inf:
            assert np.all(thr == -np.inf)
            continue
        ref = _solve_dp_reference(p)
        opt = sum(tables[j][n] for j, n in enumerate(ref.counts))
        scale = 1.0 + sum(float(np.abs(t).max()) for t in tables)
        assert lb <= opt + 1e-9 * scale
        for j, n in enumerate(ref.counts):
            assert tables[j][n] - lam * n >= thr[j] - 1e-9 * scale, (i, j, int(n))
        checked += 1
        reduced = [t[n] - lam * n for t, n in zip(tables, ref.counts)]
        admissible = [np.concatenate(([0], np.arange(max(int(jmin), 1), len(t))))
                      for t, jmin in zip(tables, p.min_nodes)]
        best = [float(np.max(t[n] - lam * n)) for t, n in zip(tables, admissible)]
        loose += max(b - r for b, r in zip(best, reduced)) > 1e-6 * scale
    # contested, and optima off the relaxation's choices (else a zero gap would pass)
    assert checked > 100 and loose > 40, (checked, loose)


def test_capacity_price_fixes_most_counts_of_a_contested_pool():
    """On a pool the tasks contest (100 Amdahl tasks, 2,700 nodes; own best counts sum to
    far more) the fixing leaves a small part of the counts, so the DP's rows shrink to a band
    near N; the answer is still the reference DP's."""
    from offcut.daemon.app.solvers.dp import _solve_dp_reference

    for seed in (4, 5):
        p = _benchmark_like(100, 2700, seed)
        lam, thr, lb, tables = _price(p)
        assert lam > 0 and lb > -np.inf
        admissible = kept = 0
        for j, t in enumerate(tables):
            n = np.concatenate(([0], np.arange(max(int(p.min_nodes[j]), 1), len(t))))
            admissible += len(n)
            kept += int(np.count_nonzero(t[n] - lam * n >= thr[j]))
        assert kept < 0.2 * admissible, (kept, admissible)
        _check_dp_against(p, _solve_dp_reference(p).objective)


@pytest.mark.parametrize("defeat", ["no option left", "optimum dropped"])
def test_dp_kernel_solves_without_the_fixing_when_it_fails(monkeypatch, defeat):
    """Should float rounding make the fixing drop every count of a task, or a count every
    optimal vector needs (the DP then misses the known feasible value), the kernel solves
    again without it and answers the reference optimum (plain-Python kernel)."""
    import offcut.daemon.app.solvers.dp as dp_mod
    from offcut.daemon.app.solvers import dp_kernel

    true_price = dp_kernel._capacity_price

    def broken(tab, tab_off, bp_all, bp_off, jmin, cur, N, margin):
        lam, thr, lb = true_price(tab, tab_off, bp_all, bp_off, jmin, cur, N, margin)
        assert lb > -np.inf
        if defeat == "no option left":
            thr[0] = np.inf
        else:  # only count 0 survives (a huge price): the DP's best is then below lb
            thr[:] = [tab[tab_off[j]] for j in range(len(jmin))]
            lam = 1e12
        return lam, thr, lb

    monkeypatch.setattr(dp_kernel, "_capacity_price", broken)
    rng = np.random.default_rng(3)
    for _ in range(5):
        p = _amdahl_problem(rng, 6, 60, np.zeros(6, dtype=np.int64))
        packed = dp_mod._pack(p)
        work = np.full((2 * p.num_tasks + 4, p.idle_nodes + 1), 1e9)
        answer = dp_kernel.kernel(*packed, p.min_nodes, p.current_nodes, p.idle_nodes,
                                  dp_mod.TIE_RTOL, dp_mod._BRUTE_WIDTH,
                                  dp_mod._FIRST_PASS_SLACK, work, dp_mod._no_rows())
        assert answer[1] >= 1  # a DP ran (not the shortcut)
        ref = dp_mod._solve_dp_reference(p)
        assert rel_close(p.evaluate(answer[0]), ref.objective)
        assert p.admissible(answer[0]) is None


def test_dp_kernel_without_cache_locator(monkeypatch):
    """A read-only install with no writable cache folder must not crash: the kernel is then
    compiled per process (numba's NullCache) instead of cached on disk."""
    numba_caching = pytest.importorskip("numba.core.caching")
    import offcut.daemon.app.solvers.dp as dp_mod

    monkeypatch.setattr(numba_caching.CacheImpl, "_locator_classes", [])
    monkeypatch.setattr(dp_mod, "_KERNEL", None)
    monkeypatch.setattr(dp_mod, "_KERNEL_ERROR", None)
    kernel = dp_mod._get_kernel()  # compiling it would take ~10 s: only build the dispatcher
    assert kernel is not None and type(kernel._cache).__name__ == "NullCache"


def _amdahl_problem(rng, J, N, cur):
    ns = [0, 1, 2, 4, 8, 16, 32]
    curves = []
    for _ in range(J):
        r, a = rng.uniform(1.0, 10.0), rng.uniform(0.0, 0.1)
        curves.append([0.0] + [r * n / (1 + a * (n - 1)) for n in ns[1:]])
    return AllocationProblem(N, cur, rng.integers(1, 3, J), rng.integers(8, 33, J), [ns] * J,
                             curves, 10.0, rng.uniform(0.0, 20.0, J), rng.uniform(0.0, 12.0, J))


def test_dp_keeps_the_rows_of_the_previous_solve_and_answers_as_a_fresh_solve():
    """Re-allocations within one event share N and their first tasks: the kernel keeps those
    rows of the previous solve (dp_kernel._common_prefix) and must answer exactly what a
    solve from nothing answers, whatever changed after the shared tasks (a task's c_j, a task
    replaced, one more task, fewer later tasks)."""
    import offcut.daemon.app.solvers.dp as dp_mod

    kernel = dp_mod._get_kernel()
    if kernel is None:
        pytest.skip(f"no compiled dp kernel: {dp_mod.compiled_kernel_missing()}")

    def solve(p, prev):
        packed = dp_mod._pack(p)
        work = dp_mod._workspace(p.num_tasks, p.idle_nodes)
        answer = kernel(*packed, p.min_nodes, p.current_nodes, p.idle_nodes, dp_mod.TIE_RTOL,
                        dp_mod._BRUTE_WIDTH, dp_mod._FIRST_PASS_SLACK, work, prev)
        counts, passes, kept = answer[0], answer[1], answer[5]
        rows = dp_mod._rows_left(p, packed, answer) if passes else dp_mod._no_rows()
        return list(counts), passes, kept, rows

    rng = np.random.default_rng(11)
    kept_rows = 0
    for _ in range(100):
        J = int(rng.integers(8, 15))
        # mostly a pool the tasks' demand (about 20 J) exceeds, so the optimum uses nearly all
        # of it and the last rows start above 0 (the kept rows' columns must then reach low
        # enough: dp_kernel._forward)
        N = int(rng.integers(40, 400)) if rng.random() < 0.3 else J * int(rng.integers(12, 18))
        cur = np.zeros(J, dtype=np.int64)
        first = _amdahl_problem(rng, J, N, cur)
        later = _amdahl_problem(rng, J + 1, N, np.zeros(J + 1, dtype=np.int64))
        k = int(rng.integers(1, J))  # tasks k.. differ in the second problem (same bounds)
        cur2 = np.zeros(J + 1, dtype=np.int64)
        values = [*first.objective_values[:k], *later.objective_values[k:]]
        if rng.random() < 0.5:  # only task k's c_j differs
            values = [*first.objective_values, later.objective_values[J]]
            cur2[k] = first.min_nodes[k]
        second = AllocationProblem(
            N, cur2, [*first.min_nodes, later.min_nodes[J]],
            [*first.max_nodes, later.max_nodes[J]], [*first.node_counts, later.node_counts[J]],
            values, 10.0, [*first.rescale_up_s, later.rescale_up_s[J]],
            [*first.rescale_down_s, later.rescale_down_s[J]])
        work = dp_mod._workspace(J + 1, N)  # one scratch for both (as solve_dp requires)
        # cells outside a row's valid columns must never be read: random values above any
        # true one (a read would change the answer)
        work[:] = rng.uniform(1e7, 2e7, work.shape)
        _, passes, _, rows = solve(first, dp_mod._no_rows())
        assert dp_mod._workspace(J + 1, N) is work
        got, passes2, kept, _ = solve(second, rows if passes else dp_mod._no_rows())
        fresh, fresh_passes, none_kept, _ = solve(second, dp_mod._no_rows())
        assert none_kept == 0
        assert got == fresh, second.to_json()
        assert passes2 == fresh_passes  # the same computation, not a recovery by a 2nd pass
        assert got == [int(x) for x in dp_mod._solve_dp_reference(second).counts] or \
            rel_close(second.evaluate(got), dp_mod._solve_dp_reference(second).objective)
        if passes and passes2:
            assert kept <= k
            kept_rows += kept
    assert kept_rows > 0  # rows were kept at all (else this test checks nothing new)

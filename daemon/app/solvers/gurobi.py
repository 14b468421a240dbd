"""Gurobi (gurobipy) backend of docs/architecture.md, "Solver backends", in two exact forms.

(a) count-level SOS2 form, per task j with at least one nonzero admissible count:
    integer n_j, binary z_j (on/off), weights lambda_{j,k} >= 0 over the curve points
    (P_k, O_k) (the curve truncated at top_j = min(Jmax_j, N), flat beyond its last point),
    SOS2(lambda_j), sum_k lambda_{j,k} = 1, n_j = sum_k lambda_{j,k} P_k,
    Jmin_j z_j <= n_j <= top_j z_j; binaries u_j (grow) and d_j (shrink) with
    n_j <= c_j + (N - c_j) u_j and n_j >= c_j - c_j d_j; capacity sum_j n_j <= N.
    Objective sum_j Tfwd (sum_k lambda_{j,k} O_k - O_0 (1 - z_j)) - Tcup_j R_j u_j
    - Tcdw_j R_j d_j, with O_k = S_j(P_k) - C_j(P_k) (C_j the optional cost curve, same
    points; any sign) and R_j = S_j(c_j) (costs excluded). Because n_j is integral and the
    points include 0, the lambda term is exactly S_j(n_j) - C_j(n_j); the O_0 (1 - z_j) term
    cancels the curve value at 0 nodes (S = C = 0 below Jmin, and n_j = 0 forces
    lambda_{j,0} = 1). u_j/d_j are omitted when they cannot bind
    (R_j = 0, c_j >= top_j, c_j = 0). Per task: 4 + K_j variables (fewer when u/d are
    omitted), 6 linear rows, + 1 capacity row.
(b) multiple-choice knapsack form (as :mod:`.cbc`): one binary per undominated count.

BFTrainer (arXiv 2106.12091, Section 3, eq. 1-9) at count level.

Ties: after the proven optimum, lexicographic stages in the same model (:func:`.ties.break_ties`)
return the counts of the exact backends' one rule, the same as ``dp``'s.

Licence: the pip wheel's size-limited licence allows <= 2,000 variables and <= 2,000 linear
constraints (GurobiError 10010 beyond). The form is chosen by counting before building.
Set the environment variable ``OFFCUT_GUROBI_FULL_LICENSE=1`` on a site with a full
licence to skip that size check (the SOS2 form is then always used); any licence Gurobi
finds is honoured in either case.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from .base import SolverFailed, SolverUnavailable, knapsack_items, milp_solution
from .problem import AllocationProblem, Solution, interpolate
from .ties import break_ties, own_best_if_fits, tie_tolerance

SIZE_LIMIT_VARS = 2000
SIZE_LIMIT_ROWS = 2000
TIE_ROWS = 2  # rows the tie stages add (value >= V* - tol, total <= T*; ties.break_ties)
NOT_INSTALLED = "gurobipy is not installed (pip install 'offcut[gurobi]')"

_ENV = None  # one silent Gurobi environment per process


def gurobi_importable() -> bool:
    """True when ``import gurobipy`` works in this process."""
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return False
    return True


def full_license() -> bool:
    """True when ``OFFCUT_GUROBI_FULL_LICENSE=1``: skip the size-limited licence check."""
    return os.environ.get("OFFCUT_GUROBI_FULL_LICENSE", "") == "1"


@dataclass
class _TaskPlan:
    j: int
    points: np.ndarray  # (K,) node counts 0 = P_0 < ... < P_{K-1} = top
    values: np.ndarray  # (K,) curve values S - C at the points (may be negative)
    top: int
    with_up: bool
    with_down: bool


def _sos2_plan(problem: AllocationProblem) -> tuple[list[_TaskPlan], int, int]:
    """Per-task data of form (a) and its size (variables, linear constraints)."""
    N = problem.idle_nodes
    plans = []
    nvars = 0
    nrows = 0
    for j in range(problem.num_tasks):
        top = int(min(problem.max_nodes[j], N))
        jmin = int(problem.min_nodes[j])
        if top < jmin:
            continue  # only count 0 is admissible: constant term, not modelled
        ns, os_ = problem.node_counts[j], problem.objective_values[j]
        if problem.cost_values is not None:
            os_ = os_ - problem.cost_values[j]  # S_j - C_j: same points (problem.py)
        inner = ns[ns < top]
        pts = np.concatenate((inner, [top])).astype(float)
        vals = interpolate(ns, os_, pts)
        c = int(problem.current_nodes[j])
        r = problem.current_rate(j)
        with_up = r > 0 and problem.rescale_up_s[j] > 0 and c < top
        with_down = r > 0 and problem.rescale_down_s[j] > 0 and c > 0
        plans.append(_TaskPlan(j, pts, vals, top, with_up, with_down))
        nvars += 2 + len(pts) + with_up + with_down
        nrows += 4 + with_up + with_down
    return plans, nvars, nrows + (1 if plans else 0)


def _knapsack_size(problem: AllocationProblem) -> tuple[list, int, int]:
    items = knapsack_items(problem)
    free = [j for j in range(problem.num_tasks) if len(items[j][0]) > 1]
    nvars = sum(len(items[j][0]) for j in free)
    return items, nvars, len(free) + (1 if free else 0)


def choose_form(problem: AllocationProblem) -> str:
    """``"sos2"`` or ``"knapsack"``: the first form that fits the size-limited licence (or
    ``"sos2"`` under ``OFFCUT_GUROBI_FULL_LICENSE=1``), counting the ``TIE_ROWS`` rows the
    tie stages add. Raises :class:`SolverUnavailable` naming the sizes when neither fits."""
    if full_license():
        return "sos2"
    _, v, r = _sos2_plan(problem)
    r += TIE_ROWS
    if v <= SIZE_LIMIT_VARS and r <= SIZE_LIMIT_ROWS:
        return "sos2"
    _, kv, kr = _knapsack_size(problem)
    kr += TIE_ROWS
    if kv <= SIZE_LIMIT_VARS and kr <= SIZE_LIMIT_ROWS:
        return "knapsack"
    raise SolverUnavailable(
        f"model too large for gurobipy's size-limited licence ({SIZE_LIMIT_VARS} variables, "
        f"{SIZE_LIMIT_ROWS} constraints): SOS2 form {v} variables x {r} constraints, knapsack "
        f"form {kv} variables x {kr} constraints ({problem.num_tasks} tasks, "
        f"{problem.idle_nodes} nodes); set OFFCUT_GUROBI_FULL_LICENSE=1 with a full licence")


def fits(problem: AllocationProblem) -> bool:
    """True when gurobipy is importable and some form fits its licence."""
    if not gurobi_importable():
        return False
    try:
        choose_form(problem)
    except SolverUnavailable:
        return False
    return True


def _env():
    global _ENV
    if _ENV is None:
        import gurobipy as gp

        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
        _ENV = env
    return _ENV


def solve_gurobi(problem: AllocationProblem, time_limit_s: float, form: str | None = None,
                 ties: bool = True) -> Solution:
    """Solve ``problem`` with Gurobi.

    ``time_limit_s``: Gurobi's ``TimeLimit`` [s], for all stages together; ``form``:
    ``"sos2"``, ``"knapsack"`` or None (pick with :func:`choose_form`); ``ties``: apply the
    exact backends' tie-breaking rule (:mod:`.ties`, lexicographic stages in the same model
    after a proven optimum) so the counts equal ``dp``'s; False only to measure its cost.

    Returns a :class:`Solution` (counts (J,), objective re-scored by ``problem.evaluate``,
    ``bound = ObjBound``; ``status="feasible"`` when stopped by the limit with an incumbent).
    Raises :class:`SolverUnavailable` when gurobipy is missing, the model exceeds the licence
    (also on GurobiError 10010) or no licence is found; :class:`SolverFailed` on any other
    error, when no solution was found or the tie stages ran past ``time_limit_s``.
    """
    t0 = time.perf_counter()
    try:
        import gurobipy as gp
        from gurobipy import GRB
    except ImportError as exc:
        raise SolverUnavailable(NOT_INSTALLED) from exc
    if ties and (own := own_best_if_fits(problem)) is not None:
        return milp_solution(problem, own, "optimal", math.inf, t0, "gurobi")  # rule, step 1
    if form is None:
        form = choose_form(problem)
    J = problem.num_tasks
    counts = np.zeros(J, dtype=np.int64)
    try:
        env = _env()
        with gp.Model(env=env) as m:
            m.Params.TimeLimit = max(0.01, float(time_limit_s))
            m.Params.MIPGap = 1e-9
            if ties:  # the rule needs the optimum within its tolerance (ties.py)
                m.Params.MIPGap = 0.0
                m.Params.MIPGapAbs = 0.5 * tie_tolerance(problem)
            m.Params.Threads = 1
            if form == "sos2":
                built = _build_sos2(m, problem, gp, GRB)
            elif form == "knapsack":
                built = _build_knapsack(m, problem, gp, GRB)
            else:
                raise ValueError(f"unknown gurobi form {form!r}")
            getters = built.getters
            if not getters:
                status, bound = "optimal", math.nan
            else:
                m.optimize()
                if m.SolCount < 1:
                    raise SolverFailed(f"gurobi found no solution (status {m.Status})")
                if m.Status == GRB.OPTIMAL:
                    status = "optimal"
                elif m.Status in (GRB.TIME_LIMIT, GRB.INTERRUPTED, GRB.SUBOPTIMAL):
                    status = "feasible"
                else:
                    raise SolverFailed(f"gurobi stopped with status {m.Status}")
                bound = float(m.ObjBound)
                for j, get in getters:
                    counts[j] = get()
                if ties and status == "optimal":
                    counts = break_ties(problem, counts, _GurobiTies(m, built, J, GRB),
                                        t0 + float(time_limit_s))
    except gp.GurobiError as exc:
        if getattr(exc, "errno", None) == 10010 or "size-limited" in str(exc):
            raise SolverUnavailable(f"gurobi: model too large for the licence: {exc}") from exc
        if getattr(exc, "errno", None) in (10009, 10032):  # no / expired licence
            raise SolverUnavailable(f"gurobi licence problem: {exc}") from exc
        raise SolverFailed(f"gurobi error {getattr(exc, 'errno', '?')}: {exc}") from exc
    return milp_solution(problem, counts, status, bound, t0, "gurobi")


@dataclass
class _Built:
    """A built model's handles: ``getters`` [(j, getter of n_j)] for the modelled tasks,
    ``count`` {j: linear expression of n_j}, ``value`` the objective expression (constants
    included: the scale of :meth:`AllocationProblem.evaluate`), ``pin(j, n)``: bound n_j to
    ``n`` (False when n is not a choice of the form), ``unpin(j)``: undo it."""

    getters: list
    count: dict
    value: object
    pin: object
    unpin: object


def _build_sos2(m, problem: AllocationProblem, gp, GRB) -> _Built:
    """Form (a). The objective constant of unmodelled tasks and of the O_0 correction is
    added so ObjBound is on the true scale."""
    plans, _, _ = _sos2_plan(problem)
    N = problem.idle_nodes
    tables = problem.value_tables()
    modelled = {p.j for p in plans}
    const = sum(float(tables[j][0]) for j in range(problem.num_tasks) if j not in modelled)
    obj = gp.LinExpr(const)
    ns_all = []
    getters = []
    T = problem.tfwd_s
    for p in plans:
        j = p.j
        c = int(problem.current_nodes[j])
        r = problem.current_rate(j)
        n = m.addVar(lb=0, ub=p.top, vtype=GRB.INTEGER)
        z = m.addVar(vtype=GRB.BINARY)
        lam = m.addVars(len(p.points), lb=0.0, ub=1.0)
        lam_l = [lam[k] for k in range(len(p.points))]
        m.addConstr(gp.quicksum(lam_l) == 1)
        m.addConstr(n == gp.LinExpr(p.points.tolist(), lam_l))
        m.addConstr(n >= int(problem.min_nodes[j]) * z)
        m.addConstr(n <= p.top * z)
        m.addSOS(GRB.SOS_TYPE2, lam_l, p.points.tolist())
        # T * (sum lam O - O_0 (1 - z)) = T sum lam O + T O_0 z - T O_0
        obj += T * gp.LinExpr(p.values.tolist(), lam_l) + T * float(p.values[0]) * z - T * float(p.values[0])
        if p.with_up:
            u = m.addVar(vtype=GRB.BINARY)
            m.addConstr(n <= c + (N - c) * u)
            obj -= float(problem.rescale_up_s[j]) * r * u
        if p.with_down:
            d = m.addVar(vtype=GRB.BINARY)
            m.addConstr(n >= c - c * d)
            obj -= float(problem.rescale_down_s[j]) * r * d
        ns_all.append(n)
        getters.append((j, (lambda v=n: int(round(v.X)))))
    if ns_all:
        m.addConstr(gp.quicksum(ns_all) <= N)
    m.setObjective(obj, GRB.MAXIMIZE)
    nvar = {j: v for (j, _), v in zip(getters, ns_all)}
    tops = {p.j: p.top for p in plans}

    def pin(j, v):
        nvar[j].LB = nvar[j].UB = v
        return True

    def unpin(j):
        nvar[j].LB, nvar[j].UB = 0, tops[j]

    return _Built(getters, nvar, obj, pin, unpin)


def _build_knapsack(m, problem: AllocationProblem, gp, GRB) -> _Built:
    """Form (b)."""
    items, _, _ = _knapsack_size(problem)
    const = sum(v[0] for n, v in items if len(n) == 1)
    obj = gp.LinExpr(const)
    cap = gp.LinExpr()
    getters = []
    count, binaries = {}, {}
    for j, (cnts, vals) in enumerate(items):
        if len(cnts) == 1:
            continue
        xs = [m.addVar(vtype=GRB.BINARY) for _ in cnts]
        binaries[j] = dict(zip(cnts, xs))
        m.addConstr(gp.quicksum(xs) == 1)
        count[j] = gp.LinExpr(cnts, xs)
        cap += gp.LinExpr(cnts, xs)
        obj += gp.LinExpr(vals, xs)
        getters.append((j, (lambda xs=xs, cnts=cnts: cnts[int(np.argmax([x.X for x in xs]))])))
    if getters:
        m.addConstr(cap <= problem.idle_nodes)
    m.setObjective(obj, GRB.MAXIMIZE)

    def pin(j, v):
        if v not in binaries[j]:
            return False  # dominated: never in the rule's answer (base.knapsack_items)
        binaries[j][v].LB = 1
        return True

    def unpin(j):
        for x in binaries[j].values():
            x.LB = 0

    return _Built(getters, count, obj, pin, unpin)


class _GurobiTies:
    """:class:`~.ties.TieModel` over a solved Gurobi model (either form): rows are added to
    it, objectives replaced, and every solve warm-starts from the previous solution."""

    def __init__(self, m, built: _Built, num_tasks: int, GRB):
        self.m, self.b, self.J, self.GRB = m, built, num_tasks, GRB
        m.Params.MIPGap = 0.0
        m.Params.MIPGapAbs = 0.5  # integral objectives (node counts)
        m.Params.FeasibilityTol = 1e-9
        m.Params.IntFeasTol = 1e-9

    def require_value(self, lower: float) -> None:
        self.m.addConstr(self.b.value >= lower)

    def limit_total(self, upper: int) -> None:
        if self.b.count:
            self.m.addConstr(sum(self.b.count.values()) <= upper)

    def fix(self, j: int, n: int) -> None:
        if j in self.b.count:
            self.b.pin(j, n)

    def solve(self, minimise, pin, time_limit_s):
        import gurobipy as gp

        m, GRB = self.m, self.GRB
        tasks = self.b.count.keys() if minimise is None else [j for j in minimise
                                                              if j in self.b.count]
        if pin is not None:
            if pin[0] not in self.b.count:  # unmodelled: count 0 is its only choice
                if pin[1] != 0:
                    return None
                pin = None
            elif not self.b.pin(*pin):
                return None
        try:
            m.setObjective(gp.quicksum(self.b.count[j] for j in tasks), GRB.MINIMIZE)
            m.Params.TimeLimit = max(0.01, time_limit_s)
            m.optimize()
            if m.Status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
                return None
            if m.Status != GRB.OPTIMAL:
                raise SolverFailed(f"gurobi tie stage stopped with status {m.Status}")
            counts = np.zeros(self.J, dtype=np.int64)
            for j, get in self.b.getters:
                counts[j] = get()
            return counts
        finally:
            if pin is not None:
                self.b.unpin(pin[0])

"""Exact energy-aware allocation: a ratio objective solved by Dinkelbach's method.

The admin chooses the objective: throughput (the plain problem of :mod:`.problem`, the
default), energy (samples per joule) or a Zeus-style blend with a weight eta. For a count
vector x = (n_1..n_J) of an :class:`~.problem.AllocationProblem` (its own ``cost_values``,
if any, are ignored: N is defined on the plain problem):

* N(x) = sum_j f_j(n_j) [samples, or objective units]: the plain problem's objective, i.e.
  what the tasks earn over the look-ahead Tfwd, net of rescale losses
  (:meth:`AllocationProblem.evaluate` without costs; :func:`samples`).
* D(x) [J] (:func:`energy_j`), the zeus_cost of the look-ahead window:

      D(x) = Tfwd * ( eta * [ sum_j (P_j(n_j) - n_j p_idle) + N_idle p_idle ]
                      + (1 - eta) * N_idle * p_max )

  with P_j(n) [W] task j's power draw at n nodes (piecewise linear at ``node_counts[j]``
  like S_j, flat beyond the last point, 0 below Jmin_j and at 0 nodes), p_idle [W] the draw
  of an idle node that no task uses (unused idle nodes stay on), p_max [W] the maximum power
  of one node (Zeus's MAXPOWER) and N_idle = ``problem.idle_nodes``. This is Zeus's cost
  zeus_cost = eta * E + (1 - eta) * MAXPOWER * T (You, Chung, Chowdhury, "Zeus: Understanding
  and Optimizing GPU Energy Consumption of DNN Training", NSDI '23, Section 3, the cost metric),
  summed over the pool's nodes for the window Tfwd: E is the energy the pool draws, T the
  window length (per node).

The allocation maximises N(x) / D(x), samples per unit of zeus_cost: with eta = 1 samples
per joule ("energy"); with eta = 0, D is the constant Tfwd N_idle p_max and this is exactly
the throughput problem.

Dinkelbach's method (W. Dinkelbach, "On Nonlinear Fractional Programming", Management
Science 13(7):492-498, 1967) solves it exactly with a sequence of ordinary allocation
problems: with lambda_0 = N(x_0) / D(x_0) for the throughput optimum x_0, iterate

    x_{k+1} = argmax_x N(x) - lambda_k D(x),   lambda_{k+1} = N(x_{k+1}) / D(x_{k+1}),

until F_k = N(x_{k+1}) - lambda_k D(x_{k+1}) <= tol * max(1, |N(x_{k+1})|). Each subproblem
is the plain problem with cost curves (:meth:`AllocationProblem.with_costs`)
C_j(n) = lambda_k eta (P_j(n) - n p_idle) [objective units / s] at ``node_counts[j]``: they
share S_j's breakpoints, so every exact backend (dp, cbc, gurobi) solves it exactly; the
constant part of lambda_k D is dropped from the subproblem and added back when computing F.
(Where a curve ends before top_j = min(Jmax_j, N), P_j is flat but n p_idle is not: the
subproblems get an extra curve point at top_j, which changes neither S_j nor f_j.)
F(lambda) = max_x N(x) - lambda D(x) is convex and strictly decreasing in lambda (D > 0 on
the allocations that matter), lambda_k increases strictly until F = 0, and the feasible set
is finite, so the method ends after finitely many solves (usually 2-4) at the optimum ratio.

Conventions: D(x) > 0 for every x that runs a task (validated: P_j > 0 at positive node
counts, p_max > 0); D(x) = 0 only when x runs nothing with eta = 1 and p_idle = 0 (or
N_idle = 0), and such x count with ratio 0. When the throughput optimum earns N(x_0) <= 0
(nothing worth running), it is returned as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from offcut.errors import InvalidArgument

from .problem import AllocationProblem, as_curves, check_curve_shapes, interpolate

DEFAULT_TOL = 1e-9
DEFAULT_MAX_SOLVES = 30


@dataclass
class EnergyTerms:
    """The power model and weight of the energy objective (module docstring).

    Attributes:
        eta: Zeus's weight in [0, 1]: 1 = energy only (samples per joule), 0 = time only
            (the throughput problem).
        idle_node_power_w: p_idle [W], draw of an idle-pool node that no task uses (>= 0).
        node_max_power_w: p_max [W], maximum power of one node (Zeus's MAXPOWER, > 0).
        power_values: per task, P_j [W] at ``node_counts[j]`` (shape (K_j,), finite, >= 0,
            > 0 at every positive node count).
    """

    eta: float
    idle_node_power_w: float
    node_max_power_w: float
    power_values: list[np.ndarray] = field(repr=False)

    def __post_init__(self) -> None:
        self.power_values = as_curves(self.power_values, "power_values")

    def validate(self, problem: AllocationProblem) -> None:
        """Check the terms against ``problem``; raises :class:`InvalidArgument` naming the
        field (``eta``, ``idle_node_power_w``, ``node_max_power_w``, ``power_values``)."""
        if not _real(self.eta) or not 0.0 <= self.eta <= 1.0:
            raise InvalidArgument("must be a number in [0, 1]", "eta")
        if not _real(self.idle_node_power_w) or self.idle_node_power_w < 0:
            raise InvalidArgument("must be a finite number of watts >= 0", "idle_node_power_w")
        if not _real(self.node_max_power_w) or self.node_max_power_w <= 0:
            raise InvalidArgument("must be a finite number of watts > 0", "node_max_power_w")
        check_curve_shapes(problem.node_counts, self.power_values, "power_values")
        for j, (ns, pw) in enumerate(zip(problem.node_counts, self.power_values)):
            if not np.isfinite(pw).all() or (pw < 0).any():
                raise InvalidArgument(f"task {j}: must be finite and >= 0", "power_values")
            if (pw[ns > 0] <= 0).any():
                raise InvalidArgument(f"task {j}: must be > 0 at positive node counts",
                                      "power_values")


def _real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) \
        and math.isfinite(float(x))


@dataclass
class RatioResult:
    """The answer of :func:`solve_ratio`.

    Attributes:
        counts: (J,) int64 node counts of the best ratio found.
        ratio: N / D of ``counts`` [samples per J of zeus_cost] (0 when D == 0).
        samples: N(counts) (:func:`samples`).
        energy_j: D(counts) [J] (:func:`energy_j`).
        iterations: number of ``solve`` calls made.
        answers: what ``solve`` returned, in call order (the first one is the throughput
            optimum).
        converged: Dinkelbach's stopping test passed (False: the solve cap was reached;
            ``counts`` is then the best ratio seen).
    """

    counts: np.ndarray
    ratio: float
    samples: float
    energy_j: float
    iterations: int
    answers: list[Any]
    converged: bool


def _plain(problem: AllocationProblem) -> AllocationProblem:
    return problem if problem.cost_values is None else problem.with_costs(None)


def _power(problem: AllocationProblem, terms: EnergyTerms, j: int, n: int) -> float:
    """P_j(n) [W]: 0 below Jmin_j (and at 0), else the interpolated power curve."""
    if n < problem.min_nodes[j]:
        return 0.0
    return float(interpolate(problem.node_counts[j], terms.power_values[j], n))


def samples(problem: AllocationProblem, counts: Sequence[int]) -> float:
    """N(x): the plain problem's objective of ``counts`` (shape (J,)) [samples over Tfwd,
    net of rescale losses; objective units]. Costs of ``problem`` are ignored. Raises
    ``ValueError`` when ``counts`` is infeasible."""
    return _plain(problem).evaluate(counts)


def energy_j(problem: AllocationProblem, terms: EnergyTerms, counts: Sequence[int]) -> float:
    """D(x) [J]: the zeus_cost of the pool over the look-ahead Tfwd for ``counts`` (shape
    (J,)); see the module docstring. Raises ``ValueError`` when ``counts`` is infeasible
    (terms are assumed validated)."""
    problem.check_admissible(counts)
    eta, p_idle = float(terms.eta), float(terms.idle_node_power_w)
    n_idle = problem.idle_nodes
    task_w = sum(_power(problem, terms, j, int(n)) - int(n) * p_idle
                 for j, n in enumerate(counts))
    return problem.tfwd_s * (eta * (task_w + n_idle * p_idle)
                             + (1.0 - eta) * n_idle * float(terms.node_max_power_w))


def _ratio(n: float, d: float) -> float:
    return n / d if d > 0 else 0.0


def _extend_to_top(plain: AllocationProblem, power_values: list[np.ndarray]
                   ) -> tuple[AllocationProblem, list[np.ndarray]]:
    """``plain`` (and the power curves) with a point at top_j = min(Jmax_j, N) added to every
    curve that ends before it, the values repeated (the curves are flat there anyway).

    Needed because n p_idle keeps growing where P_j is flat: C_j(n) = lambda eta (P_j(n) -
    n p_idle) is then linear, not flat, beyond the last point, and a cost curve is only
    given at the curve's points. The extended problem has the same S_j, f_j and
    breakpoints, so it is the same problem for every backend.
    """
    tops = np.minimum(plain.max_nodes, plain.idle_nodes)
    short = [j for j in range(plain.num_tasks) if tops[j] > plain.node_counts[j][-1]]
    if not short:
        return plain, power_values
    ns, os_, pw = list(plain.node_counts), list(plain.objective_values), list(power_values)
    for j in short:
        ns[j] = np.append(ns[j], float(tops[j]))
        os_[j] = np.append(os_[j], os_[j][-1])
        pw[j] = np.append(pw[j], pw[j][-1])
    ext = AllocationProblem(
        idle_nodes=plain.idle_nodes, current_nodes=plain.current_nodes,
        min_nodes=plain.min_nodes, max_nodes=plain.max_nodes, node_counts=ns,
        objective_values=os_, tfwd_s=plain.tfwd_s, rescale_up_s=plain.rescale_up_s,
        rescale_down_s=plain.rescale_down_s, objective_tables=plain.objective_tables,
        check=False)
    return ext, pw


def solve_ratio(problem: AllocationProblem, terms: EnergyTerms,
                solve: Callable[[AllocationProblem], Any], *, tol: float = DEFAULT_TOL,
                max_solves: int = DEFAULT_MAX_SOLVES) -> RatioResult:
    """Maximise N(x) / D(x) exactly by Dinkelbach's method (module docstring).

    ``solve``: an exact solver of :class:`AllocationProblem` (with cost curves), returning
    anything with ``.counts`` of shape (J,) (a :class:`~.problem.Solution`, the daemon
    core's ``SolveRecord``); its answers are re-scored here. It is called first on the plain
    problem (the throughput optimum), then on Dinkelbach subproblems, at most ``max_solves``
    times in all; the subproblems may carry an extra curve point at min(Jmax_j, N) (module
    docstring). ``tol``: relative stopping tolerance on F. ``problem``'s own cost curves
    are ignored.

    Deterministic for a deterministic ``solve``: among the allocations seen, the first with
    the largest ratio (D > 0) is returned. With eta == 0 one solve answers it; when the
    throughput optimum earns N <= 0 it is returned as is.

    Returns a :class:`RatioResult`. Raises :class:`InvalidArgument` naming the field of
    ``terms`` that is malformed (or ``max_solves``), ``ValueError`` when ``solve`` returns
    infeasible counts, and whatever ``solve`` raises.
    """
    terms.validate(problem)
    if not isinstance(max_solves, int) or max_solves < 1:
        raise InvalidArgument("must be an integer >= 1", "max_solves")
    plain = _plain(problem)
    answers: list[Any] = []

    def run(p: AllocationProblem) -> tuple[np.ndarray, float, float]:
        ans = solve(p)
        answers.append(ans)
        counts = np.asarray(ans.counts, dtype=np.int64).copy()
        return counts, plain.evaluate(counts), energy_j(plain, terms, counts)

    counts, n, d = run(plain)
    best = (counts, n, d, _ratio(n, d))

    def result(converged: bool) -> RatioResult:
        c, bn, bd, br = best
        return RatioResult(counts=c, ratio=br, samples=bn, energy_j=bd,
                           iterations=len(answers), answers=answers, converged=converged)

    if terms.eta == 0 or n <= 0 or d <= 0:
        # eta = 0: D is constant; N <= 0: nothing worth running (d <= 0 implies n <= 0)
        return result(True)
    eta, p_idle = float(terms.eta), float(terms.idle_node_power_w)
    base, power = _extend_to_top(plain, terms.power_values)
    marginal = [pw - ns * p_idle for ns, pw in zip(base.node_counts, power)]
    lam = best[3]
    while len(answers) < max_solves:
        sub = base.with_costs([lam * eta * m for m in marginal])
        counts, n, d = run(sub)
        r = _ratio(n, d)
        if d > 0 and r > best[3]:
            best = (counts, n, d, r)
        if n - lam * d <= tol * max(1.0, abs(n)):
            return result(True)
        if d <= 0:  # cannot happen with validated terms and an exact solve (F > 0 needs D > 0)
            break
        lam = r
    return result(False)

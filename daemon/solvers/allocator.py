"""One entry point for all allocation backends, with fallback (docs/architecture.md §4)."""

from __future__ import annotations

import math
import time

import numpy as np

from offcut.errors import InvalidArgument

from .base import SOLVER_NAMES, SolverFailed
from .dp import solve_dp
from .greedy import solve_greedy
from .problem import AllocationProblem, Solution

_MILP = ("gurobi", "cbc")


class Allocator:
    """Solve allocation problems with the configured backend, falling back to exact ``dp``.

    Args:
        solver: one of :data:`SOLVER_NAMES`. ``auto`` = gurobi when gurobipy is importable
            and the model fits its licence, else cbc (decided per problem).
        time_limit_s: MILP time limit [s]; with ``isolate`` it is also enforced as a hard
            wall-clock limit (+2 s margin) by killing the worker.
        isolate: run MILP backends in a :class:`~.guard.GuardedWorker` child process so
            that a native crash or hang cannot take this process down.

    Attributes:
        solves_by_backend: {backend name: number of answers it produced}.
        fallbacks: number of solves that fell back to ``dp``.

    Raises :class:`InvalidArgument` (field ``solver``/``time_limit_s``) on bad settings.
    """

    def __init__(self, solver: str = "auto", time_limit_s: float = 10.0, isolate: bool = True,
                 margin_s: float = 2.0):
        if solver not in SOLVER_NAMES:
            raise InvalidArgument(f"unknown solver {solver!r}; choose one of {', '.join(SOLVER_NAMES)}",
                                  "solver")
        if not (isinstance(time_limit_s, (int, float)) and math.isfinite(time_limit_s)
                and time_limit_s > 0):
            raise InvalidArgument("must be a positive number of seconds", "time_limit_s")
        self.solver = solver
        self.time_limit_s = float(time_limit_s)
        self.isolate = bool(isolate)
        self.margin_s = float(margin_s)
        self._worker = None
        self.solves_by_backend: dict[str, int] = {}
        self.fallbacks = 0

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop the worker process, if any. The allocator stays usable (restarts lazily)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __enter__(self) -> "Allocator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- solving
    def backend_for(self, problem: AllocationProblem) -> str:
        """The backend ``solver`` resolves to for ``problem`` (``auto`` -> gurobi or cbc)."""
        if self.solver != "auto":
            return self.solver
        from .gurobi import fits

        return "gurobi" if fits(problem) else "cbc"

    def solve(self, problem: AllocationProblem) -> tuple[Solution, str | None]:
        """Solve ``problem``; returns (solution, fallback reason or None).

        The solution's ``objective`` is re-scored by :meth:`AllocationProblem.evaluate`,
        ``solve_ms`` is the wall time of the whole call [ms] (IPC and any fallback
        included), ``solver`` the backend that produced the counts (``trivial`` for J == 0
        or N == 0). Any backend failure (:class:`SolverFailed`, :class:`SolverUnavailable`,
        an infeasible answer) falls back to the exact ``dp``; the reason is returned. Raises
        nothing for a valid problem.
        """
        t0 = time.perf_counter()
        if problem.num_tasks == 0 or problem.idle_nodes == 0:
            counts = problem.keep_current()
            obj = problem.evaluate(counts)
            sol = Solution(counts=counts, objective=obj, bound=obj, solve_ms=0.0,
                           solver="trivial", status="optimal")
            return self._done(sol, t0), None
        reason = None
        try:
            backend = self.backend_for(problem)
            sol = self._run(backend, problem)
        except SolverFailed as exc:  # SolverUnavailable included
            reason = str(exc) or type(exc).__name__
            self.fallbacks += 1
            sol = solve_dp(problem)
        return self._done(sol, t0), reason

    def _done(self, sol: Solution, t0: float) -> Solution:
        sol.solve_ms = (time.perf_counter() - t0) * 1e3
        self.solves_by_backend[sol.solver] = self.solves_by_backend.get(sol.solver, 0) + 1
        return sol

    def _run(self, backend: str, problem: AllocationProblem) -> Solution:
        if backend == "dp":
            return solve_dp(problem)
        if backend == "greedy":
            return solve_greedy(problem)
        if self.isolate:
            if self._worker is None:
                from .guard import GuardedWorker

                self._worker = GuardedWorker(margin_s=self.margin_s)
            out = self._worker.solve(backend, problem, self.time_limit_s)
            counts = np.asarray(out["counts"], dtype=np.int64)
            bound, status = float(out["bound"]), str(out["status"])
        else:
            try:
                if backend == "cbc":
                    from .cbc import solve_cbc

                    s = solve_cbc(problem, self.time_limit_s)
                elif backend == "gurobi":
                    from .gurobi import solve_gurobi

                    s = solve_gurobi(problem, self.time_limit_s)
                else:
                    from .guard import _run_backend  # test hooks only

                    s = _run_backend(backend, problem, self.time_limit_s)
            except SolverFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - a backend bug must not escape
                raise SolverFailed(f"{backend} raised {type(exc).__name__}: {exc}") from exc
            counts, bound, status = s.counts, s.bound, s.status
        try:
            obj = problem.evaluate(counts)
        except ValueError as exc:
            raise SolverFailed(f"{backend} returned an infeasible assignment: {exc}") from exc
        if status not in ("optimal", "feasible"):
            raise SolverFailed(f"{backend} returned status {status!r}")
        bound = max(bound, obj) if not math.isnan(bound) else obj
        return Solution(counts=counts, objective=obj, bound=bound, solve_ms=0.0,
                        solver=backend, status=status)

"""One entry point for all allocation backends, with fallback (docs/architecture.md,
"Solver backends")."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from offcut.errors import InvalidArgument

from .base import SOLVER_NAMES, SolverFailed
from .dp import solve_dp
from .greedy import solve_greedy
from .problem import AllocationProblem, Solution

_MILP = ("gurobi", "cbc")
#: longest time a tripped backend is skipped before it is tried again [s]
MAX_COOLDOWN_S = 900.0


@dataclass
class Breaker:
    """The circuit breaker of one backend: ``failures`` in a row (timeouts, crashes, bad
    answers), the last ``reason``, and while tripped the monotonic time [s] it is skipped
    until (``open_until``) and the cool-down of the current trip [s]."""

    failures: int = 0
    reason: str = ""
    open_until: float = 0.0
    cooldown_s: float = 0.0

    def is_open(self, now: float) -> bool:
        """True while the backend is skipped (it is tried again once ``now`` passes)."""
        return now < self.open_until


class Allocator:
    """Solve allocation problems with the configured backend, falling back to exact ``dp``.

    Args:
        solver: one of :data:`SOLVER_NAMES`; default ``dp``, the daemon's default
            (``DaemonConfig.solver``). ``auto`` = gurobi when gurobipy is importable and the
            model fits its licence, else cbc (decided per problem).
        time_limit_s: MILP time limit [s]; with ``isolate`` it is also enforced as a hard
            wall-clock limit (+2 s margin) by killing the worker.
        isolate: run MILP backends in a :class:`~.guard.GuardedWorker` child process so
            that a native crash or hang cannot take this process down.
        trip_after: a backend that failed this many solves in a row is *tripped*: skipped
            (exact ``dp`` answers at once, the reason says so) for ``cooldown_s`` [s], then
            tried again; a success closes it, another failure trips it for twice as long (at
            most :data:`MAX_COOLDOWN_S`). A hanging solver then costs ``trip_after`` time limits,
            not one per event.
        on_trip: called as ``on_trip(backend, tripped, reason)`` when a breaker trips or
            closes (the daemon's health service shows it).
        clock: monotonic seconds (tests pass their own).

    Attributes:
        solves_by_backend: {backend name: number of answers it produced}.
        fallbacks: number of solves that fell back to ``dp``.

    Raises :class:`InvalidArgument` (field ``solver``/``time_limit_s``) on bad settings.
    """

    def __init__(self, solver: str = "dp", time_limit_s: float = 10.0, isolate: bool = True,
                 margin_s: float = 2.0, *, trip_after: int = 5, cooldown_s: float = 60.0,
                 on_trip: Callable[[str, bool, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
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
        self.trip_after = max(1, int(trip_after))
        self.cooldown_s = float(cooldown_s)
        self.on_trip = on_trip
        self.clock = clock
        #: backend -> its circuit breaker (MILP backends that have failed)
        self.breakers: dict[str, Breaker] = {}

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
        except SolverFailed as exc:
            self.fallbacks += 1
            return self._done(solve_dp(problem), t0), str(exc) or type(exc).__name__
        breaker = self.breakers.get(backend)
        now = self.clock()
        if breaker is not None and breaker.is_open(now):
            self.fallbacks += 1
            reason = (f"{backend} is tripped after {breaker.failures} failed solves in a row "
                      f"(last: {breaker.reason}); dp answers until it is tried again in "
                      f"{breaker.open_until - now:.0f} s")
            return self._done(solve_dp(problem), t0), reason
        try:
            sol = self._run(backend, problem)
        except SolverFailed as exc:  # SolverUnavailable included
            reason = str(exc) or type(exc).__name__
            self.fallbacks += 1
            self._failed(backend, reason)
            sol = solve_dp(problem)
        else:
            if breaker is not None:
                self._succeeded(backend, breaker)
        return self._done(sol, t0), reason

    def _failed(self, backend: str, reason: str) -> None:
        """Count a failure of ``backend``; trip its breaker at ``trip_after`` in a row."""
        breaker = self.breakers.setdefault(backend, Breaker())
        breaker.failures += 1
        breaker.reason = reason[:300]
        if breaker.failures >= self.trip_after:
            breaker.cooldown_s = min(MAX_COOLDOWN_S, breaker.cooldown_s * 2 or self.cooldown_s)
            breaker.open_until = self.clock() + breaker.cooldown_s  # from the failure's end
            if self.on_trip is not None:
                self.on_trip(backend, True, f"{breaker.failures} failed solves in a row, the "
                                            f"last: {breaker.reason}")

    def _succeeded(self, backend: str, breaker: Breaker) -> None:
        """``backend`` answered: its breaker closes (announced when it had tripped)."""
        tripped = breaker.failures >= self.trip_after
        del self.breakers[backend]
        if tripped and self.on_trip is not None:
            self.on_trip(backend, False, "")

    def tripped(self) -> dict[str, Breaker]:
        """The backends whose breaker has tripped (skipped now, or to be tried again)."""
        return {b: br for b, br in self.breakers.items() if br.failures >= self.trip_after}

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

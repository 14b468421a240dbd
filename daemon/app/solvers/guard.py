"""Run MILP backends in a child process with a hard wall-clock limit (docs/architecture.md,
"Solver backends").

A solver crash (``os.abort`` in native code) or hang must never take the daemon down, and a
solver's own time keeping is not trusted. :class:`GuardedWorker` keeps one persistent child
(multiprocessing ``spawn`` context), sends it ``problem.to_record()`` over a pipe and waits
at most ``time_limit_s + margin_s``; on timeout the child is killed (SIGKILL) and a fresh one
is started lazily on the next call.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any

from .base import SolverFailed, SolverUnavailable
from .problem import AllocationProblem

_STARTUP_TIMEOUT_S = 60.0


def _run_backend(name: str, problem: AllocationProblem, time_limit_s: float):
    if name == "cbc":
        from .cbc import solve_cbc

        return solve_cbc(problem, time_limit_s)
    if name == "gurobi":
        from .gurobi import solve_gurobi

        return solve_gurobi(problem, time_limit_s)
    if name == "dp":
        from .dp import solve_dp

        return solve_dp(problem)
    if name == "greedy":
        from .greedy import solve_greedy

        return solve_greedy(problem)
    if name == "_test_abort":  # test hook: a native crash
        signal.signal(signal.SIGABRT, signal.SIG_DFL)  # skip CBC's crash-handler trace
        os.abort()
    if name == "_test_hang":  # test hook: a solver that never returns
        while True:
            time.sleep(3600)
    raise SolverFailed(f"unknown backend {name!r}")


def _worker_main(conn) -> None:
    """Child loop: receive (backend, record, time_limit_s), answer a result dict."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    except (ValueError, OSError):  # pragma: no cover
        pass
    try:  # warm the imports so the first solve is not charged for them
        from . import cbc, dp, greedy  # noqa: F401
        try:
            import gurobipy  # noqa: F401
        except ImportError:
            pass
    except Exception:  # pragma: no cover
        pass
    conn.send({"ready": True})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        name, record, limit = msg
        try:
            sol = _run_backend(name, AllocationProblem.from_record(record), limit)
            out = {"ok": True, "counts": [int(x) for x in sol.counts], "bound": float(sol.bound),
                   "status": sol.status, "solve_ms": float(sol.solve_ms)}
        except SolverUnavailable as exc:
            out = {"ok": False, "kind": "unavailable", "error": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - everything becomes an error reply
            out = {"ok": False, "kind": "failed", "error": f"{type(exc).__name__}: {exc}"}
        try:
            conn.send(out)
        except (EOFError, OSError):
            return


class GuardedWorker:
    """A persistent child process that runs a named backend under a hard time limit.

    ``margin_s``: seconds allowed beyond the solve's ``time_limit_s`` (IPC, model build).
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, margin_s: float = 2.0):
        self.margin_s = float(margin_s)
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.restarts = 0

    # ---------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child,), daemon=True,
                                 name="offcut-solver")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        if not parent.poll(_STARTUP_TIMEOUT_S):
            self._kill()
            raise SolverFailed(f"solver worker did not start within {_STARTUP_TIMEOUT_S:.0f} s")
        try:
            parent.recv()
        except (EOFError, OSError) as exc:
            code = proc.exitcode
            self._kill()
            raise SolverFailed(f"solver worker died while starting (exit code {code})") from exc

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()  # SIGKILL
            proc.join(5)
            proc.close() if proc.exitcode is not None else None

    def close(self) -> None:
        """Stop the child (politely, then SIGKILL). Safe to call twice."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(1.0)
            except (EOFError, OSError, ValueError):
                pass
        self._kill()

    def __enter__(self) -> "GuardedWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    @property
    def pid(self) -> int | None:
        """The child's process id, or None when no child runs."""
        return self._proc.pid if self._proc is not None else None

    # ---------------------------------------------------------------- solving
    def solve(self, backend: str, problem: AllocationProblem, time_limit_s: float) -> dict:
        """Run ``backend`` (``cbc``, ``gurobi``, ``dp``, ``greedy``) on ``problem`` in the child.

        Returns ``{"counts": list[int] (J,), "bound": float, "status": str,
        "solve_ms": float (backend's own time), "wall_ms": float (incl. IPC)}``; counts are
        NOT yet re-scored (the caller does that).

        Raises :class:`SolverUnavailable` when the backend reports it cannot run, and
        :class:`SolverFailed` for everything else: backend error, child death (reported
        with its exit code; a new child starts on the next call), or no answer within
        ``time_limit_s + margin_s`` (the child is SIGKILLed). Nothing else propagates.
        """
        t0 = time.perf_counter()
        try:
            if self._proc is None or not self._proc.is_alive():
                if self._proc is not None:
                    self._kill()
                    self.restarts += 1
                self._start()
            t0 = time.perf_counter()
            limit = float(time_limit_s)
            self._conn.send((backend, problem.to_record(), limit))
            if not self._conn.poll(limit + self.margin_s):
                self._kill()
                self.restarts += 1
                raise SolverFailed(
                    f"{backend} gave no answer within {limit + self.margin_s:.1f} s; worker killed")
            try:
                out = self._conn.recv()
            except (EOFError, OSError) as exc:
                proc = self._proc
                if proc is not None:
                    proc.join(2)
                code = proc.exitcode if proc is not None else None
                self._kill()
                self.restarts += 1
                raise SolverFailed(f"{backend} worker died (exit code {code})") from exc
        except SolverFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - pipe/pickling/process errors
            self._kill()
            raise SolverFailed(f"solver worker error: {type(exc).__name__}: {exc}") from exc
        if not out.get("ok"):
            if out.get("kind") == "unavailable":
                raise SolverUnavailable(out.get("error", "unavailable"))
            raise SolverFailed(f"{backend}: {out.get('error', 'unknown error')}")
        out["wall_ms"] = (time.perf_counter() - t0) * 1e3
        return out

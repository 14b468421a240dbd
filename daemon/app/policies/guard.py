"""The guard around third-party allocation policies (docs/architecture.md, "Allocation
policies"; docs/security.md, "Round two: allocation policy plug-ins").

A policy is code from another package, called at every re-allocation while the engine holds
its lock. The solver backends run under :class:`~offcut.daemon.app.solvers.guard.GuardedWorker`
(a child process, a hard wall-clock limit, every ``BaseException`` an error reply). A policy
cannot run there: it calls ``solve`` back into the daemon's allocator several times per
decision and reads the request's lazily computed views, so it would need a callback protocol
over the pipe and a pickled request per decision (more than the ~2 ms a decision may take). The
same rules are kept in a thread instead, by :class:`PolicyGuard`:

* **bounded time**: the policy's own time per decision (wall time less the time inside
  ``solve``, which the solver guard bounds) is at most ``time_limit_s``. A thread cannot be
  killed in Python, so a policy over it is *abandoned*: the decision goes on with the
  fallback, the policy's thread is left to run on (a daemon thread: it never holds the
  process at exit), any later ``solve`` call of it raises at once without reaching the
  allocator, and the policy is **disabled until the daemon restarts** (logged at ERROR;
  every later decision uses the fallback at once, counted as ``disabled``);
* **every BaseException caught**: ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``
  raised by a policy end that decision, not the daemon;
* **the answer's size checked** in the policy's thread (:func:`~.base.check_counts` reads at
  most one item past the task count, so an endless generator is refused at once);
* **``solve`` checked**: an argument that is not an :class:`AllocationProblem`, one larger
  than the request (more idle nodes, more than ``2 J + 1`` tasks) or more than
  ``max_solves`` calls in one decision are the policy's errors, never the allocator's.

The built-in policies (``throughput``, ``energy``, ``zeus_cost``, ``fair_share``) are this
repository's code: they run inline, without a thread (the common path stays as fast as
before), with the same ``solve`` checks; an ``Exception`` of theirs falls back too.

Every fallback is counted by ``(policy, kind)`` in :attr:`PolicyGuard.fallbacks` (the metric
``offcut_policy_fallbacks_total``); kinds: ``error`` (the policy raised), ``answer`` (counts
the scheduler cannot apply, or a bad ``solve`` argument), ``timeout``, ``disabled``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Callable

from offcut.daemon.app.solvers.problem import AllocationProblem

from .base import AllocationPolicy, AllocationRequest, PolicyError, check_counts

log = logging.getLogger("offcut.daemon")

#: a policy's own time per decision [s] (time inside ``solve`` not counted)
POLICY_TIME_LIMIT_S = 5.0
#: the most ``solve`` calls a policy may make in one decision
MAX_SOLVES_PER_DECISION = 64
#: the fallback kinds (labels of ``offcut_policy_fallbacks_total``)
FALLBACK_KINDS = ("error", "answer", "timeout", "disabled")


class PolicyFailed(Exception):
    """A policy's decision failed; the caller uses the fallback. ``kind``: one of
    :data:`FALLBACK_KINDS`; the message names the policy and the reason."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


class _Abandoned(BaseException):
    """Raised into a policy's ``solve`` call after its decision was given up (not an
    ``Exception``: a policy's ``except Exception`` does not swallow it)."""


def _describe(name: str, exc: BaseException) -> str:
    """What went wrong, in one bounded line (a hostile ``__str__`` cannot stop it)."""
    if isinstance(exc, PolicyError):
        text = ""
        try:
            text = str(exc)
        except BaseException:  # noqa: BLE001
            pass
        return text[:500] or f"allocation policy {name!r} failed"
    try:
        detail = str(exc)[:300]
    except BaseException:  # noqa: BLE001
        detail = "(its message could not be read)"
    return f"allocation policy {name!r} failed: {type(exc).__name__}: {detail}"


class PolicyGuard:
    """Runs allocation policies with bounded time and answers, and counts their fallbacks.

    One per daemon (the engine keeps it across scheduler reloads, so a disabled policy stays
    disabled until the process restarts); a scheduler without one makes its own.

    Args:
        time_limit_s: a third-party policy's own time per decision [s] (> 0).
        max_solves: the most ``solve`` calls per decision (>= 1).

    Attributes:
        disabled: policy name -> why it is disabled (a timeout), until restart.
        fallbacks: ``(policy name, kind)`` -> decisions that used the fallback (live events
            only; re-applying the journal counts nothing).
        replay_mismatches: decisions whose replayed answer differed from the journaled one.
    """

    def __init__(self, time_limit_s: float = POLICY_TIME_LIMIT_S,
                 max_solves: int = MAX_SOLVES_PER_DECISION):
        if not time_limit_s > 0:
            raise ValueError("time_limit_s must be > 0")
        if max_solves < 1:
            raise ValueError("max_solves must be >= 1")
        self.time_limit_s = float(time_limit_s)
        self.max_solves = int(max_solves)
        self.disabled: dict[str, str] = {}
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        self.replay_mismatches = 0

    def checked_solve(self, name: str, request: AllocationRequest,
                      solve: Callable[[AllocationProblem], object]
                      ) -> Callable[[AllocationProblem], object]:
        """``solve`` as a policy gets it: a :class:`PolicyError` (so the policy's fault, not
        the allocator's) for an argument that is not an :class:`AllocationProblem`, one with
        more idle nodes than the request or more than ``2 J + 1`` tasks, or a call past
        ``max_solves``."""
        base = request.problem
        max_tasks, max_idle = 2 * base.num_tasks + 1, base.idle_nodes
        calls = [0]

        def checked(p: AllocationProblem):
            if type(p) is not AllocationProblem and not isinstance(p, AllocationProblem):
                raise PolicyError(f"allocation policy {name!r} passed a {type(p).__name__} to "
                                  "solve(), not an AllocationProblem")
            if p.num_tasks > max_tasks or p.idle_nodes > max_idle:
                raise PolicyError(
                    f"allocation policy {name!r} passed solve() a problem of {p.num_tasks} "
                    f"tasks on {p.idle_nodes} nodes; the request has {base.num_tasks} tasks "
                    f"on {max_idle} (at most {max_tasks} tasks and {max_idle} nodes)")
            calls[0] += 1
            if calls[0] > self.max_solves:
                raise PolicyError(f"allocation policy {name!r} called solve() more than "
                                  f"{self.max_solves} times in one decision")
            return solve(p)
        return checked

    def run(self, name: str, policy: AllocationPolicy, request: AllocationRequest,
            solve: Callable[[AllocationProblem], object], *, builtin: bool) -> list[int]:
        """The policy's checked counts for ``request`` (one int per task).

        ``solve`` is the allocator as the policy sees it (already :meth:`checked_solve`);
        an exception *it* raises (the allocator's, not the policy's) is raised unchanged.
        Raises :class:`PolicyFailed` when the decision must use the fallback: the policy is
        disabled, raised anything (``BaseException`` for third-party policies), answered
        counts :func:`check_counts` refuses, or ran past ``time_limit_s`` of its own time
        (then it is disabled until restart, logged at ERROR)."""
        problem = request.problem
        if builtin:
            try:
                return check_counts(name, policy.allocate(request, solve), problem)
            except PolicyError as exc:
                raise PolicyFailed("answer", _describe(name, exc)) from exc
        if name in self.disabled:
            raise PolicyFailed("disabled", f"allocation policy {name!r} is disabled until the "
                                           f"daemon restarts ({self.disabled[name]})")
        return self._run_thread(name, policy, request, solve)

    def _run_thread(self, name: str, policy: AllocationPolicy, request: AllocationRequest,
                    solve: Callable[[AllocationProblem], object]) -> list[int]:
        lock = threading.Lock()  # held by the policy's thread inside solve
        done = threading.Event()
        state = {"closed": False, "solve_s": 0.0, "counts": None, "error": None,
                 "solve_error": None, "reason": ""}

        def guarded_solve(p: AllocationProblem):
            with lock:
                if state["closed"]:
                    raise _Abandoned("this decision was given up")
                t = time.perf_counter()
                try:
                    return solve(p)
                except PolicyError:
                    raise
                except BaseException as exc:  # the allocator's own error: the caller's
                    state["solve_error"] = exc
                    raise
                finally:
                    state["solve_s"] += time.perf_counter() - t

        def body() -> None:
            try:
                state["counts"] = check_counts(name, policy.allocate(request, guarded_solve),
                                               request.problem)
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too
                state["error"] = exc
                try:
                    state["reason"] = _describe(name, exc)
                except BaseException:  # noqa: BLE001
                    state["reason"] = f"allocation policy {name!r} failed"
            finally:
                done.set()

        started = time.perf_counter()
        own = lambda: time.perf_counter() - started - state["solve_s"]  # noqa: E731
        thread = threading.Thread(target=body, daemon=True, name=f"offcut-policy-{name}"[:60])
        thread.start()
        while not done.wait(max(1e-3, self.time_limit_s - own())):
            with lock:  # no solve runs while this is held: own() is exact here
                if done.is_set():
                    break
                if own() >= self.time_limit_s:
                    state["closed"] = True
                    reason = (f"gave no answer within {self.time_limit_s:g} s of its own time "
                              "(thread abandoned)")
                    self.disabled[name] = reason
                    log.error("allocation policy %r %s; disabled until the daemon restarts, "
                              "every decision uses 'throughput'", name, reason)
                    raise PolicyFailed("timeout", f"allocation policy {name!r} {reason}, "
                                                  "disabled until the daemon restarts")
        if state["solve_error"] is not None and state["error"] is state["solve_error"]:
            raise state["solve_error"]
        if state["error"] is not None:
            kind = "answer" if isinstance(state["error"], PolicyError) else "error"
            raise PolicyFailed(kind, state["reason"])
        return state["counts"]

    def count(self, name: str, kind: str) -> None:
        """Count one live fallback of policy ``name`` (``kind``: :data:`FALLBACK_KINDS`)."""
        self.fallbacks[(name, kind)] += 1

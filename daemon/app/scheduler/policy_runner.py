"""Asking the allocation policy (docs/architecture.md, "Allocation" and "Allocation policies"): the
admitted tasks' count-level problem and request, the configured
:class:`~offcut.daemon.app.policies.AllocationPolicy` run under its guard, its counts checked, and a
third-party policy's journaled answer replayed."""

from __future__ import annotations

import logging

from offcut.daemon.app.model import Task
from offcut.daemon.app.policies import (BUILTIN_POLICIES, AllocationPolicy, AllocationRequest,
                                    PolicyError, PolicyTask, check_counts, get_policy)
from offcut.daemon.app.policies.guard import PolicyFailed, PolicyGuard
from offcut.daemon.app.scheduler.interfaces import Models, Placement
from offcut.daemon.app.scheduler.outcome import Allocate, Outcome, SolveRecord
from offcut.daemon.app.scheduler.state import SchedulerState
from offcut.daemon.app.solvers.problem import AllocationProblem


log = logging.getLogger("offcut.daemon")


class PolicyRunner:
    """Builds allocation problems, asks the policy, returns its checked counts.

    Reads ``state.pool`` (its size), ``state.objective`` (the policy's name and figures),
    ``state.tasks`` (the owners' node-seconds); writes nothing of the state, only the
    outcome's ``solves`` and ``policy_answers``. Uses the task models (curves, rescale costs,
    power values) and the placement rules' horizon. Owns the policy instance in use and the
    :class:`PolicyGuard` (``guard``: the engine sets its own, kept across scheduler reloads).

    Interface: :meth:`problem`, :meth:`request`, :meth:`counts`, :meth:`policy`,
    :meth:`owner_node_seconds`, :meth:`guard_in_use`.
    """

    def __init__(self, state: SchedulerState, models: Models, rules: Placement) -> None:
        self.state = state
        self.models = models
        self.rules = rules
        #: the guard policies run under (:meth:`guard_in_use`); the engine sets its own
        self.guard: PolicyGuard | None = None
        self._policy: tuple[str, AllocationPolicy] | None = None  # (name, instance) in use

    def problem(self, tasks: list[Task], idle_nodes: int | None = None) -> AllocationProblem:
        """The count-level allocation problem for ``tasks`` on ``idle_nodes`` nodes (None:
        the whole idle pool; docs/architecture.md, "Allocation"), over the placement rules'
        horizon (Tfwd)."""
        models = self.models
        curves = [models.curves(t) for t in tasks]
        costs = [models.rescale_costs(t) for t in tasks]
        return AllocationProblem(
            idle_nodes=len(self.state.pool) if idle_nodes is None else idle_nodes,
            current_nodes=[len(t.nodes) for t in tasks],
            min_nodes=[t.spec.min_nodes for t in tasks],
            max_nodes=[t.spec.max_nodes for t in tasks],
            node_counts=[c[0] for c in curves],
            objective_values=[c[1] for c in curves],
            tfwd_s=self.rules.horizon_s(),
            rescale_up_s=[c[0] for c in costs],
            rescale_down_s=[c[1] for c in costs],
            objective_tables=[c[2] for c in curves],
            check=False,  # specs were validated at submission
        )

    def policy(self) -> AllocationPolicy:
        """The allocation policy named by ``objective.objective`` (one instance per name,
        made on first use). Raises :class:`PolicyError` when it is unknown or cannot load."""
        name = self.state.objective.objective
        if self._policy is None or self._policy[0] != name:
            self._policy = (name, get_policy(name))
        return self._policy[1]

    def owner_node_seconds(self) -> dict[str, float]:
        """Node-seconds used so far per owner, over all their tasks (finished ones included)."""
        used: dict[str, float] = {}
        for task in self.state.tasks.values():
            used[task.owner] = used.get(task.owner, 0.0) + task.node_seconds
        return used

    def request(self, tasks: list[Task], t: float,
                idle_nodes: int | None = None) -> AllocationRequest:
        """The policy's view of re-allocating ``tasks`` (admitted ones) at ``t`` on
        ``idle_nodes`` nodes (None: the pool): their problem (:meth:`problem`), ids, owners,
        submit times and node-seconds, the settings; power values and the owners' usage on
        demand."""
        problem = self.problem(tasks, idle_nodes)
        return AllocationRequest(
            problem, lambda: [PolicyTask(task.task_id, task.owner, task.submit_time,
                                         task.node_seconds) for task in tasks],
            self.state.objective, t,
            power_values=lambda: [self.models.power_values(task, ns)
                                  for task, ns in zip(tasks, problem.node_counts)],
            owner_node_seconds=self.owner_node_seconds)

    def guard_in_use(self) -> PolicyGuard:
        """The :class:`PolicyGuard` the policy runs under: the engine's (one per daemon, kept
        across scheduler reloads), else one of this runner's own, made on first use."""
        if self.guard is None:
            self.guard = PolicyGuard()
        return self.guard

    def counts(self, tasks: list[Task], t: float, out: Outcome, allocate: Allocate,
               idle_nodes: int | None = None) -> list[int]:
        """The configured policy's node counts for ``tasks``, checked; every answer of
        ``allocate`` it used is appended to ``out.solves`` (journaled, in order).

        The policy runs under the :class:`PolicyGuard` (:mod:`offcut.daemon.app.policies.guard`:
        a third-party policy in a thread with bounded time, every ``BaseException`` caught,
        its answer's size and its ``solve`` arguments checked). A policy that fails, answers
        counts that cannot be applied, runs out of time or is disabled does not stop the
        event (a node event from Slurm must not be lost to a policy's bug): the decision falls
        back to ``throughput`` on the same request, logged at ERROR and counted by kind
        (``PolicyGuard.fallbacks``, the metric ``offcut_policy_fallbacks_total``), with the
        reason in the last solve's ``fallback_reason`` (the Decision, ``offcut status``).

        A third-party policy's answer (its counts, or the fallback's, and the fallback's kind)
        goes to ``out.policy_answers`` and is journaled after the solves it used. Re-applying
        a journal row that carries one (``allocate.replaying_answers``) runs the policy again
        on the journaled solves and compares: a different answer (or a failure where it had
        answered, or the other way round) is logged at ERROR and counted in
        ``PolicyGuard.replay_mismatches``, and the journaled answer wins. Rows written before
        answers were journaled are re-applied as before (the policy on its journaled solves).
        A policy that cannot be found or loaded is a :class:`PolicyError` (offcutd checks the
        name at start)."""
        policy = self.policy()
        name = self.state.objective.objective
        request = self.request(tasks, t, idle_nodes)
        guard = self.guard_in_use()
        builtin = type(policy) is BUILTIN_POLICIES.get(name)
        replaying = not builtin and getattr(allocate, "replaying_answers", False)
        failed: list[BaseException] = []  # errors of ``allocate`` itself pass unchanged

        def solve(p: AllocationProblem) -> SolveRecord:
            try:
                record = allocate(p)
            except BaseException as exc:
                failed.append(exc)
                raise
            out.solves.append(record)
            return record

        kind, reason, counts = "", "", None
        if not (replaying and name in guard.disabled):
            try:
                counts = guard.run(name, policy, request, guard.checked_solve(name, request, solve),
                                   builtin=builtin)
            except PolicyFailed as exc:
                if name == "throughput" and not replaying:
                    raise PolicyError(str(exc)) from exc
                kind, reason = exc.kind, str(exc)
            except Exception as exc:
                if not replaying and (any(exc is e for e in failed) or name == "throughput"):
                    raise
                kind, reason = "error", (
                    str(exc) if isinstance(exc, PolicyError) else
                    f"allocation policy {name!r} failed: {type(exc).__name__}: {exc}")
        if replaying:
            return self._replayed_answer(name, request, allocate, counts, kind, reason, t)
        if reason:
            reason = f"{reason[:500]}; this decision used 'throughput'"
            log.error("%s", reason)
            guard.count(name, kind)
            record = solve(request.problem)
            if reason not in (record.fallback_reason or ""):  # re-applied: recorded already
                record.fallback_reason = "; ".join(filter(None, [record.fallback_reason, reason]))
            counts = check_counts("throughput", record.counts, request.problem)
        if not builtin:
            out.policy_answers.append((len(out.solves), {"policy": name, "counts": counts,
                                                         "fallback": kind or None}))
        return counts

    def _replayed_answer(self, name: str, request: AllocationRequest, allocate: Allocate,
                         counts: list[int] | None, kind: str, reason: str, t: float) -> list[int]:
        """The journaled answer of a third-party policy's decision being re-applied
        (``allocate.policy_answer()``: its solves not yet handed out are skipped), checked
        against the request; compared with what the policy answered again (``counts``, or
        the failure ``kind``/``reason``; neither when it is disabled): a mismatch is logged
        at ERROR and counted, the journaled answer wins. A journaled answer the request cannot
        take is a :class:`PolicyError` (a damaged journal)."""
        stored = allocate.policy_answer()
        if not isinstance(stored, dict) or stored.get("policy") != name:
            raise PolicyError(f"journal row has no answer of allocation policy {name!r} for "
                              f"the decision at {t}")
        wanted = check_counts(name, stored.get("counts"), request.problem)
        guard = self.guard_in_use()
        if counts is None and not kind:  # disabled: nothing to compare
            return wanted
        was = stored.get("fallback")
        if (counts != wanted and not kind) or bool(kind) != bool(was):
            guard.replay_mismatches += 1
            again = f"counts {counts}" if not kind else f"a fallback ({reason[:300]})"
            first = f"counts {wanted}" if not was else f"the fallback's counts {wanted}"
            log.error("allocation policy %r is not deterministic: re-applying the decision at "
                      "%s from the journal it answered %s, the journal has %s; the journal's "
                      "answer is kept", name, t, again, first)
        return wanted

"""Re-allocation (docs/architecture.md, "Allocation"): the admitted tasks' problem, the configured
:class:`~offcut.daemon.policies.AllocationPolicy`'s counts (checked), and the placement of
node names with the rescale costs."""

from __future__ import annotations

import logging
from typing import Collection

from offcut.daemon import placement
from offcut.daemon.model import PLAIN_NODE, Task, TaskState
from offcut.daemon.policies import (BUILTIN_POLICIES, AllocationPolicy, AllocationRequest,
                                    PolicyError, PolicyTask, check_counts, get_policy)
from offcut.daemon.policies.guard import PolicyFailed, PolicyGuard
from offcut.daemon.solvers.problem import AllocationProblem
from offcut.daemon.scheduler.outcome import Allocate, Outcome, SolveRecord


log = logging.getLogger("offcut.daemon")


class Allocation:
    """Builds allocation problems, asks the policy, applies its counts."""

    #: the guard policies run under (:meth:`policy_guard_in_use`); the engine sets its own
    policy_guard: PolicyGuard | None = None

    def problem(self, tasks: list[Task], idle_nodes: int | None = None) -> AllocationProblem:
        """The count-level allocation problem for ``tasks`` on ``idle_nodes`` nodes (None:
        the whole idle pool; docs/architecture.md, "Allocation"), over the horizon Tfwd."""
        curves = [self._curves(t) for t in tasks]
        costs = [self.rescale_costs(t) for t in tasks]
        return AllocationProblem(
            idle_nodes=len(self.pool) if idle_nodes is None else idle_nodes,
            current_nodes=[len(t.nodes) for t in tasks],
            min_nodes=[t.spec.min_nodes for t in tasks],
            max_nodes=[t.spec.max_nodes for t in tasks],
            node_counts=[c[0] for c in curves],
            objective_values=[c[1] for c in curves],
            tfwd_s=self.tfwd_s,
            rescale_up_s=[c[0] for c in costs],
            rescale_down_s=[c[1] for c in costs],
            objective_tables=[c[2] for c in curves],
            check=False,  # specs were validated at submission
        )

    def policy(self) -> AllocationPolicy:
        """The allocation policy named by ``objective.objective`` (one instance per name,
        made on first use). Raises :class:`PolicyError` when it is unknown or cannot load."""
        name = self.objective.objective
        if self._policy is None or self._policy[0] != name:
            self._policy = (name, get_policy(name))
        return self._policy[1]

    def owner_node_seconds(self) -> dict[str, float]:
        """Node-seconds used so far per owner, over all their tasks (finished ones included)."""
        used: dict[str, float] = {}
        for task in self.tasks.values():
            used[task.owner] = used.get(task.owner, 0.0) + task.node_seconds
        return used

    def allocation_request(self, tasks: list[Task], t: float,
                           idle_nodes: int | None = None) -> AllocationRequest:
        """The policy's view of re-allocating ``tasks`` (admitted ones) at ``t`` on
        ``idle_nodes`` nodes (None: the pool): their problem (:meth:`problem`), ids, owners,
        submit times and node-seconds, the settings; power values and the owners' usage on
        demand."""
        problem = self.problem(tasks, idle_nodes)
        return AllocationRequest(
            problem, lambda: [PolicyTask(task.task_id, task.owner, task.submit_time,
                                         task.node_seconds) for task in tasks], self.objective, t,
            power_values=lambda: [self._power_values(task, ns)
                                  for task, ns in zip(tasks, problem.node_counts)],
            owner_node_seconds=self.owner_node_seconds)

    def policy_guard_in_use(self) -> PolicyGuard:
        """The :class:`PolicyGuard` the policy runs under: the engine's (one per daemon, kept
        across scheduler reloads), else one of this scheduler's own, made on first use."""
        if self.policy_guard is None:
            self.policy_guard = PolicyGuard()
        return self.policy_guard

    def _allocation_counts(self, tasks: list[Task], t: float, out: Outcome,
                           allocate: Allocate, idle_nodes: int | None = None) -> list[int]:
        """The configured policy's node counts for ``tasks``, checked; every answer of
        ``allocate`` it used is appended to ``out.solves`` (journaled, in order).

        The policy runs under the :class:`PolicyGuard` (:mod:`offcut.daemon.policies.guard`:
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
        name = self.objective.objective
        request = self.allocation_request(tasks, t, idle_nodes)
        guard = self.policy_guard_in_use()
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
        guard = self.policy_guard_in_use()
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

    def node_groups(self, tasks: list[Task]) -> list[tuple[Collection[str], list[Task]]]:
        """``tasks`` grouped by the idle nodes they may run on (docs/architecture.md,
        "Node kinds"): ``(nodes in pool order, tasks in the given order)`` per group, the most
        constrained group first (fewest nodes; ties by the requirement). Tasks whose
        requirements (``gpus_per_node``, ``constraint``) select the same nodes share a group;
        while no node kind is known and no task asks for GPUs or features, that is one group
        of the whole pool (the pool itself, not a copy: the common case costs nothing per
        event)."""
        plain = lambda task: not task.spec.gpus_per_node and not task.spec.constraint  # noqa: E731
        if not self.kinds and all(plain(task) for task in tasks):
            return [(self.pool.keys(), tasks)]
        by_need: dict[tuple[int, tuple[str, ...]], list[Task]] = {}
        for task in tasks:
            by_need.setdefault((task.spec.gpus_per_node, task.spec.constraint), []).append(task)
        groups: dict[frozenset[str], tuple[tuple, list[str], list[Task]]] = {}
        for need, members in sorted(by_need.items()):
            spec = members[0].spec
            nodes = [n for n in self.pool if self.kinds.get(n, PLAIN_NODE).fits(spec)]
            key = frozenset(nodes)
            if key in groups:
                groups[key][2].extend(members)
            else:
                groups[key] = (need, nodes, list(members))
        order = sorted(groups.values(), key=lambda g: (len(g[1]), g[0]))
        rank = {task.task_id: i for i, task in enumerate(tasks)}
        return [(nodes, sorted(members, key=lambda task: rank[task.task_id]))
                for _, nodes, members in order]

    def _reallocate(self, t: float, out: Outcome, allocate: Allocate) -> None:
        """Re-allocate the admitted tasks: per node group (:meth:`node_groups`, most
        constrained first) the policy's counts on the group's nodes that no earlier group took;
        a group may take nodes that tasks of later groups hold (they shrink), never the
        other way round. With one group (no node kinds) this is the single BFTrainer problem
        over the whole pool (docs/architecture.md, "Allocation"). A task in its final phase (its work
        reached while its processes finish: docs/execution.md, "Completion") keeps its nodes
        as they are: it is left out, and its nodes with it."""
        tasks = self.admitted()
        for task in tasks:
            if task.state is TaskState.QUEUED:
                task.state = TaskState.ADMITTED
                task.admit_time = t
        finishing = {n for task in tasks if task.work_reached_time is not None
                     for n in task.nodes}
        if finishing:
            tasks = [task for task in tasks if task.work_reached_time is None or not task.nodes]
        if not tasks:
            return
        before = {task.task_id: len(task.nodes) for task in tasks}
        groups = self.node_groups(tasks)
        taken: set[str] = set(finishing)  # nodes of the groups placed so far
        for i, (nodes, group) in enumerate(groups):
            avail = [n for n in nodes if n not in taken] if taken else nodes
            later = {task.task_id for _, g in groups[i + 1:] for task in g}
            self._place_group(group, avail, later, t, out, allocate)
            if i + 1 < len(groups):  # the last group's nodes are nobody else's concern
                taken.update(n for task in group for n in task.nodes)
        for task in tasks:
            c, n = before[task.task_id], len(task.nodes)
            if n == c:
                continue
            lost_rate = self.rate_at(task, c)
            up_s, down_s = self.rescale_costs(task)
            cost = self._chargeable(task, lost_rate * (up_s if n > c else down_s))
            task.work_done -= cost
            out.progress_samples -= cost
            out.rescale_cost_samples += cost
            self.total_samples -= cost
            task.rescales += 1
            self._set_running_state(task)
            kind = "start" if c == 0 else "stop" if n == 0 else "grow" if n > c else "shrink"
            if task.learner is not None:
                task.learner.on_allocation(t, n, kind)
            out.placements.append(self._change(task, kind, c, t))

    def _place_group(self, tasks: list[Task], avail: Collection[str], later: set[str], t: float,
                     out: Outcome, allocate: Allocate) -> None:
        """Counts and node names for one node group: ``tasks`` on ``avail`` (pool order);
        ``later``: ids of tasks of groups placed after this one, whose nodes in ``avail`` this
        group may take. A task's nodes outside ``avail`` (their kind changed, or a more
        constrained group took them) are released first."""
        allowed = set(avail) if len(avail) != len(self.pool) else None
        if allowed is not None:
            for task in tasks:
                if any(n not in allowed for n in task.nodes):
                    for node in task.nodes:
                        if node not in allowed and self.holder.get(node) == task.task_id:
                            del self.holder[node]
                    task.nodes = [n for n in task.nodes if n in allowed]
        counts = (self._allocation_counts(tasks, t, out, allocate, len(avail)) if avail
                  else [0] * len(tasks))
        # shrink first: released nodes become free for growing tasks
        for task, n in zip(tasks, counts):
            if n < len(task.nodes):
                kept, released = self._shrink_nodes(task, n, t)
                for node in released:
                    del self.holder[node]
                task.nodes = kept
        free: list[str] | None = None  # the group's unheld nodes, listed once a task grows
        for task, n in self._growth_order(tasks, counts):
            extra = n - len(task.nodes)
            if extra <= 0:
                continue
            if free is None:
                free = [x for x in avail if x not in self.holder]
            picked = self._pick_free_nodes(task, min(extra, len(free)), free, t)
            if len(picked) < extra:  # the rest from tasks of less constrained groups
                held = [x for x in avail if self.holder.get(x) in later]
                picked += placement.grow(task.nodes + picked, extra - len(picked), held,
                                         self.pool)
                for node in picked:
                    owner = self.holder.get(node)
                    if owner is not None:
                        loser = self.tasks[owner]
                        loser.nodes = [x for x in loser.nodes if x != node]
            taken = set(picked)
            free = [x for x in free if x not in taken]
            for node in picked:
                self.holder[node] = task.task_id
            task.nodes = sorted(task.nodes + picked)

    # Node identities (docs/architecture.md, "Departures from BFTrainer"): the placement rules of
    # :mod:`offcut.daemon.placement`, one method each so that a variant of the scheduler (an
    # experiment, outside the product) can choose otherwise.
    def _shrink_nodes(self, task: Task, keep: int, t: float) -> tuple[list[str], list[str]]:
        """``(kept, released)`` of ``task``'s nodes when it shrinks to ``keep`` at ``t`` [s]:
        whole cabinets kept (:func:`offcut.daemon.placement.shrink`)."""
        return placement.shrink(task.nodes, keep)

    def _growth_order(self, tasks: list[Task], counts: list[int]) -> list[tuple[Task, int]]:
        """The order in which growing tasks pick free nodes: ``(task, new count)`` pairs, the
        tasks' own order (the policy's)."""
        return list(zip(tasks, counts))

    def _pick_free_nodes(self, task: Task, extra: int, free: list[str], t: float) -> list[str]:
        """``extra`` nodes of ``free`` (unheld nodes of the group, ``extra <= len(free)``) for
        ``task`` growing at ``t`` [s], in pick order: its cabinets first, then the
        longest-idle ones (:func:`offcut.daemon.placement.grow`)."""
        return placement.grow(task.nodes, extra, free, self.pool)

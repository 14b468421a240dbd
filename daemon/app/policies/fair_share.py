"""``fair_share``: max-min fair shares of node-hours per user (owner), BFTrainer's objective
inside each share.

Motivation: Slurm's fair-share factor and Dominant Resource Fairness (Ghodsi et al., NSDI '11)
divide a cluster among users rather than jobs, so that a user with many tasks does not crowd
out one with few. Here the single resource is node time, and the quantity equalised is each
owner's *cumulative* usage, projected over the look-ahead.

Algorithm, at every re-allocation (N idle nodes, Tfwd the look-ahead, owners = the owners of
the admitted tasks, in name order):

1. u_o = node-seconds the owner's tasks have used so far, finished tasks included
   (:meth:`AllocationRequest.owner_node_seconds`); cap_o = min(N, sum of the owner's Jmax).
2. Shares by water-filling (max-min fairness, Bertsekas & Gallager, *Data Networks*, 2nd ed.,
   Section 6.5.2): the free nodes are handed out one at a time, each to the owner with the smallest
   projected usage u_o + s_o * Tfwd (ties: owner name) among owners below their cap
   (:func:`water_fill`; computed by bisection on the water level, then one node at a time for
   the last few). The result is the lexicographically max-min fair integer vector of
   projected usages under the caps.
3. Each owner's tasks get the throughput optimum of their own problem
   (:func:`~offcut.daemon.app.policies.base.subproblem` with ``idle_nodes`` = the share), through
   ``solve``: BFTrainer's objective, rescale costs included, within the share. An owner whose
   tasks hold more nodes than its share gets a *blocker* row in its problem: a placeholder task
   that must take exactly the excess (Jmin = Jmax = excess) and is worth more than the owner's
   tasks can ever gain or lose (2 B + 1, B = the sum of their largest |f_j|), so every exact
   optimum keeps it and the owner's tasks shrink to the share at the lowest cost, with their
   true current counts. Its count is dropped from the answer. (Only a heuristic backend,
   ``greedy``, can ignore it; then the owner's last tasks in submit order are cut to fit.)
4. An owner that uses fewer nodes than its share (a share below its tasks' Jmin, or more nodes
   not worth their rescale cost) keeps what it uses and leaves the round; the nodes it left are
   water-filled again among the others, whose problems are solved again when their share
   grew. Repeated until every remaining owner uses its whole share (at most one round per
   owner).

With one owner the policy is exactly ``throughput`` (one solve of the request's problem).

What it guarantees, and what it does not:

* each decision's shares are max-min fair in projected node-seconds under the caps, and
  within its share each owner gets the throughput-optimal allocation of its own tasks;
* over time usage is equalised as far as the owners have work: an owner behind the others
  gets up to everything its tasks can use until it has caught up;
* it does not maximise total throughput (nodes an owner cannot use at its share go to the
  others, but a split between owners is never traded for throughput); usage never decays
  (Slurm's fair-share uses a half-life) and counts from the owner's first task on, so an owner
  that used much long ago waits until the others catch up; owners with no admitted task take
  no share (admission stays submit order, ``max_running_tasks``); tasks of one owner are not
  treated fairly among themselves beyond BFTrainer's objective.
"""

from __future__ import annotations

import heapq
import math
from typing import Mapping

import numpy as np

from offcut.daemon.app.solvers.problem import AllocationProblem, objective_table

from .base import AllocationPolicy, AllocationRequest, Solve, subproblem

#: bisection steps on the water level (the rest, at most one node per owner, goes one by one)
_BISECTION_STEPS = 100


def water_fill(usage: Mapping[str, float], caps: Mapping[str, int], nodes: int,
               step: float) -> dict[str, int]:
    """Max-min fair integer shares of ``nodes`` among the owners of ``caps``.

    Equal to handing the nodes out one at a time, each to the owner with the smallest
    projected usage ``usage[o] + share[o] * step`` (ties: smaller owner name) among the owners
    whose share is below ``caps[o]``; stops when the nodes or the caps run out. ``usage``
    [node-s] and ``step`` [s] (> 0) as floats, ``caps`` >= 0. Returns {owner: share}.
    """
    owners = sorted(caps)
    caps = {o: max(0, int(caps[o])) for o in owners}
    if nodes <= 0 or not owners:
        return {o: 0 for o in owners}
    if sum(caps.values()) <= nodes:
        return dict(caps)

    def value(o: str, s: int) -> float:  # projected usage with s nodes
        return usage[o] + s * step

    def below(o: str, level: float) -> int:  # the owner's nodes with a value < level
        s = min(caps[o], max(0, math.ceil((level - usage[o]) / step)))
        while s > 0 and value(o, s - 1) >= level:
            s -= 1
        while s < caps[o] and value(o, s) < level:
            s += 1
        return s

    lo = min(usage[o] for o in owners)               # nothing below it
    hi = max(usage[o] for o in owners) + (nodes + 1) * step   # more than ``nodes`` below it
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        if sum(below(o, mid) for o in owners) <= nodes:
            lo = mid
        else:
            hi = mid
    share = {o: below(o, lo) for o in owners}
    left = nodes - sum(share.values())
    heap = [(value(o, share[o]), o) for o in owners if share[o] < caps[o]]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, o = heapq.heappop(heap)
        share[o] += 1
        left -= 1
        if share[o] < caps[o]:
            heapq.heappush(heap, (value(o, share[o]), o))
    return share


class FairSharePolicy(AllocationPolicy):
    """Max-min fair node-hours per owner, BFTrainer's objective within each share (module
    docstring)."""

    name = "fair_share"

    def allocate(self, request: AllocationRequest, solve: Solve) -> list[int]:
        """One count per task: the owners' water-filled shares of the idle nodes, each filled
        with its own throughput optimum, nodes an owner cannot use handed on (module
        docstring, steps 1-4)."""
        p = request.problem
        rows: dict[str, list[int]] = {}
        for j, task in enumerate(request.tasks):
            rows.setdefault(task.owner, []).append(j)
        if len(rows) <= 1:
            return [int(c) for c in solve(p).counts]
        used = request.owner_node_seconds()
        usage = {o: float(used.get(o, 0.0)) for o in rows}
        caps = {o: min(p.idle_nodes, int(sum(int(p.max_nodes[j]) for j in r)))
                for o, r in rows.items()}
        answers: dict[str, tuple[int, list[int]]] = {}  # owner -> (share, counts)
        settled = 0  # nodes of owners that left the rounds
        active = sorted(rows)
        while active:
            shares = water_fill({o: usage[o] for o in active}, {o: caps[o] for o in active},
                                p.idle_nodes - settled, p.tfwd_s)
            done = []
            for o in active:
                if o not in answers or answers[o][0] != shares[o]:
                    answers[o] = (shares[o], self._owner_counts(p, rows[o], shares[o], solve))
                if sum(answers[o][1]) < shares[o]:
                    done.append(o)
            if not done:
                break
            settled += sum(sum(answers[o][1]) for o in done)
            active = [o for o in active if o not in done]
        counts = [0] * p.num_tasks
        for o, (_, got) in answers.items():
            for j, n in zip(rows[o], got):
                counts[j] = n
        return counts

    @staticmethod
    def _owner_counts(p: AllocationProblem, rows: list[int], share: int, solve: Solve
                      ) -> list[int]:
        """The owner's tasks' counts within ``share`` nodes (step 3 of the module docstring)."""
        if share <= 0:
            return [0] * len(rows)
        held = int(sum(int(p.current_nodes[j]) for j in rows))
        if held <= share:
            sub = subproblem(p, rows, share)
        else:
            sub = _with_blocker(subproblem(p, rows, held), held - share)
        got = [int(c) for c in solve(sub).counts[:len(rows)]]
        # an exact backend never exceeds the share; a heuristic one may ignore the blocker
        for j in reversed(range(len(rows))):
            excess = sum(got) - share
            if excess <= 0:
                break
            if got[j] > 0:
                keep = got[j] - excess
                got[j] = keep if keep >= int(p.min_nodes[rows[j]]) else 0
        return got


def _with_blocker(sub: AllocationProblem, excess: int) -> AllocationProblem:
    """``sub`` (its pool = the nodes its tasks hold) plus a last task that must take exactly
    ``excess`` nodes and is worth more than the other tasks can gain or lose together, so
    every exact optimum keeps it and leaves the others ``sub.idle_nodes - excess`` nodes."""
    bound = 0.0
    for table in sub.value_tables():
        finite = table[np.isfinite(table)]
        bound += float(np.abs(finite).max()) if len(finite) else 0.0
    worth = 2.0 * bound * (1.0 + 1e-9) + 1.0
    ns = np.array([0.0, float(excess)])
    os_ = np.array([0.0, worth / sub.tfwd_s])
    return AllocationProblem(
        idle_nodes=sub.idle_nodes, current_nodes=[*sub.current_nodes.tolist(), 0],
        min_nodes=[*sub.min_nodes.tolist(), excess], max_nodes=[*sub.max_nodes.tolist(), excess],
        node_counts=[*sub.node_counts, ns], objective_values=[*sub.objective_values, os_],
        tfwd_s=sub.tfwd_s, rescale_up_s=[*sub.rescale_up_s.tolist(), 0.0],
        rescale_down_s=[*sub.rescale_down_s.tolist(), 0.0],
        cost_values=(None if sub.cost_values is None
                     else [*sub.cost_values, np.zeros(2)]),
        objective_tables=(None if sub.objective_tables is None else
                          [*sub.objective_tables, objective_table(ns, os_, excess, excess)]))

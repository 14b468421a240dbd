"""Why a task holds the nodes it holds, in words and numbers (``offcut show``).

The allocation maximises BFTrainer's look-ahead objective (arXiv 2106.12091, Section 3;
docs/architecture.md, "Allocation"): a task at ``c`` nodes moved to ``n`` counts
``Tfwd * S(n)`` minus, when it grows, ``Tcup * S(c)`` (the progress a rescale-up costs; a
start from 0 nodes costs nothing) and, when it shrinks, ``Tcdw * S(c)``. So, competition
aside, growing from ``c`` to ``n`` pays exactly when ``Tfwd * (S(n) - S(c)) > Tcup * S(c)``.
This module states that comparison for the task's own numbers: the idle nodes free now, the
horizon ``Tfwd``, its rescale-up cost, its curve, and what would change the outcome (the
horizon or the cost at which growing starts to pay). Pure: it reads a task's and the status'
views (:mod:`offcut.views`) and returns lines.
"""

from __future__ import annotations

import numpy as np

from offcut.views import StatusView, TaskView

__all__ = ["explain", "curve_of"]


def curve_of(task: TaskView) -> tuple[list[int], list[float]]:
    """The curve the allocation uses for ``task``: node counts and S(n) [samples/s] (the
    learned curve for a learned task, else ``objective_values`` or ``throughputs``)."""
    if task.model is not None and len(task.model.curve_node_counts):
        return list(task.model.curve_node_counts), list(task.model.curve_throughputs)
    s = task.spec
    return list(s.node_counts), list(s.objective_values or s.throughputs)


def _s(counts: list[int], values: list[float], n: int, min_nodes: int) -> float:
    """S(n): the curve at ``n`` nodes by linear interpolation, 0 below ``min_nodes``."""
    if n < min_nodes or not counts:
        return 0.0
    return float(np.interp(n, counts, values))


def explain(task: TaskView, status: StatusView) -> list[str]:
    """Lines that say why ``task`` holds ``len(task.nodes)`` nodes now and what would
    change it (module docstring: the comparison of the throughput policy, BFTrainer, Section 3).
    ``status``: the daemon's status (idle nodes, nodes in use, ``tfwd_s``, the policy)."""
    state = task.state.value
    spec = task.spec
    held = len(task.nodes)
    free = max(status.idle_nodes - status.nodes_in_use, 0)
    pool = (f"{status.idle_nodes} idle node(s), {free} of them free (held by no task)")
    if state in ("completed", "cancelled", "failed"):
        return [f"The task is {state}: it holds no nodes."]
    if state == "queued":
        return [f"Not admitted yet: the daemon runs at most {status.max_running_tasks} tasks "
                f"at once (max_running_tasks; {status.admitted_tasks + status.running_tasks} "
                "admitted now); it is admitted when one ends."]
    lines = [f"Holds {held} of {spec.min_nodes}-{spec.max_nodes} nodes; the pool has {pool}."]
    if spec.gpus_per_node or spec.constraint:
        needs = " and ".join(filter(None, [
            f"{spec.gpus_per_node} GPU(s)" if spec.gpus_per_node else "",
            "the features " + "&".join(spec.constraint) if spec.constraint else ""]))
        lines.append(f"Only nodes with {needs} count for it (free ones of other kinds do not).")
    if status.objective and status.objective != "throughput":
        lines.append(f"The policy is {status.objective!r} (docs/architecture.md, "
                     "\"Allocation policies\"); the numbers below are the throughput "
                     "objective's, which it builds on.")
    if held >= spec.max_nodes:
        lines.append(f"It holds its maximum (max_nodes {spec.max_nodes}).")
        return lines
    counts, values = curve_of(task)
    tfwd = status.tfwd_s
    up = (task.model.rescale_up_s if task.model is not None and task.model.rescale_up_s
          else spec.rescale_up_s)
    if held == 0:
        need = spec.min_nodes
        if free < need:
            lines.append(f"It needs at least {need} node(s) (min_nodes) and {free} are free: "
                         "it starts when enough idle nodes join or other tasks release them.")
        else:
            lines.append(f"{free} free node(s) would let it start; the other tasks earn more "
                         "with them over the horizon (a start costs nothing, so only the "
                         "competition keeps it waiting).")
        return lines
    now = _s(counts, values, held, spec.min_nodes)
    if free == 0:
        lines.append("No idle node is free: every one is held by a task; it may grow when "
                     "nodes join the pool or other tasks end.")
        return lines
    # the cost of a grow does not depend on how far: the best grow is the count of highest S
    top = min(spec.max_nodes, held + free)
    best = max(range(held + 1, top + 1), key=lambda n: (_s(counts, values, n, spec.min_nodes), -n))
    gain = _s(counts, values, best, spec.min_nodes) - now
    cost = up * now
    lines.append(
        f"Growing to {best} node(s) would add {gain:.6g} samples/s; over the horizon Tfwd = "
        f"{tfwd:g} s that is {tfwd * gain:.6g} samples, against a rescale-up cost of Tcup = "
        f"{up:g} s x {now:.6g} samples/s = {cost:.6g} samples of progress.")
    if tfwd * gain > cost:
        lines.append("Growing pays by these numbers, so other tasks earn more with the free "
                     "nodes (or the decision predates them: it changes at the next event).")
    elif gain <= 0:
        lines.append("Its curve does not rise beyond its current count: more nodes add nothing.")
    else:
        lines.append(
            f"Growing does not pay within the horizon. It would at a horizon above "
            f"{cost / gain:.3g} s (tfwd_s, a site setting) or a rescale-up cost below "
            f"{tfwd * gain / now:.3g} s (the task's --rescale-up; learned from its progress "
            "reports when it reports them).")
    return lines

"""How close training on the offcuts comes to the same node-hours on dedicated nodes, and
which part of the gap is whose (docs/replay-and-policies.md, "Efficiency against dedicated
nodes").

BFTrainer (Liu et al., arXiv 2106.12091) rates its scheduler by the samples the tasks trained
on the idle nodes against what dedicated nodes would give for the same node-hours. Offcut's
replay reports it per run as ``dedicated_efficiency``:

    E = sum_j W_j / sum_j (H_j * r*_j),   r*_j = max_{n in [Jmin_j, Jmax_j]} P_j(n) / n

``W_j`` [samples]: what task ``j`` trained on the offcuts, net of the progress its rescales and
preemptions cost (the daemon's ``work_done_samples``); ``H_j`` [node-s]: the node-seconds it
held; ``P_j(n)`` [samples/s]: its throughput curve (linear between the curve's points), so
``r*_j`` is its best rate per node [samples/(node s)] at any count it may run at: dedicated
nodes, each task at its best node count, no preemption, no rescale cost. ``E <= 1`` up to the
curve's interpolation; tasks without a curve (learned online) and tasks that held no node are
left out (counted in ``dedicated_tasks_left_out``).

E is the product of two factors, each against its own baseline, with
``S_j = integral of P_j(n_j(t)) dt`` [samples], what the node counts task ``j`` actually held
would give on dedicated nodes (no rescale or preemption cost):

* ``same_counts_efficiency`` = sum W / sum S: the overhead factor, the samples kept after the
  rescale and preemption costs over what the same node counts give on dedicated nodes;
* ``scaling_factor`` = sum S / sum (H r*): what those node counts give over the best count's
  rate per node for the same node-hours (below 1 when the held counts scale sublinearly);

so ``E = same_counts_efficiency * scaling_factor`` over the same tasks. A fourth figure, the
summary's ``utilisation`` (node-hours used over idle node-hours), says how much of the offcuts
the tasks held at all (fragmentation, too few tasks).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from offcut.taskspec import TaskSpec
from offcut.views import TaskView

__all__ = ["best_rate_per_node", "dedicated_efficiency", "rate_at"]


def _rates(spec: TaskSpec, nodes: np.ndarray) -> np.ndarray | None:
    """P at each of ``nodes`` [samples/s]: the spec's throughput curve interpolated linearly
    between its points; None without a curve (a learned task)."""
    if len(spec.node_counts) < 2:
        return None
    return np.interp(nodes, np.asarray(spec.node_counts, dtype=float),
                     np.asarray(spec.throughputs, dtype=float))


def rate_at(spec: TaskSpec, nodes: int) -> float | None:
    """P(``nodes``) [samples/s] on the spec's curve (linear between its points); None
    without a curve."""
    rate = _rates(spec, np.array([float(nodes)]))
    return None if rate is None else float(rate[0])


def best_rate_per_node(spec: TaskSpec) -> float | None:
    """``r*`` = max over n in [min_nodes, max_nodes] of P(n) / n [samples/(node s)], P
    interpolated linearly on the spec's curve; None without a curve."""
    n = np.arange(max(spec.min_nodes, 1), spec.max_nodes + 1, dtype=float)
    rate = _rates(spec, n)
    return None if rate is None else float(np.max(rate / n))


def dedicated_efficiency(tasks: Iterable[TaskView], node_seconds: dict[str, float],
                         held_samples: dict[str, float] | None = None) -> dict[str, Any]:
    """The efficiency against dedicated nodes and its parts (the module docstring's E, its
    ``same_counts_efficiency`` and ``scaling_factor``) for ``tasks`` (the daemon's, with
    ``work_done_samples``), ``node_seconds`` [node-s] held per task id and ``held_samples``
    [samples] per task id (S_j: the integral of P_j over the counts it held; None: the parts
    are not computed).

    Returns ``dedicated_efficiency``, ``dedicated_samples`` [samples] (sum H r*),
    ``dedicated_tasks_left_out`` and, with ``held_samples``, ``held_count_samples`` [samples]
    (sum S), ``same_counts_efficiency`` and ``scaling_factor``; a ratio is None when its
    denominator is 0 (no task counts)."""
    trained = dedicated = held = 0.0
    left_out = 0
    for task in tasks:
        seconds = node_seconds.get(task.task_id, 0.0)
        best = best_rate_per_node(task.spec)
        if best is None or seconds <= 0:
            left_out += 1
            continue
        trained += task.work_done_samples
        dedicated += seconds * best
        if held_samples is not None:
            held += held_samples.get(task.task_id, 0.0)
    out: dict[str, Any] = {
        "dedicated_efficiency": trained / dedicated if dedicated > 0 else None,
        "dedicated_samples": dedicated, "dedicated_tasks_left_out": left_out}
    if held_samples is not None:
        out.update(held_count_samples=held,
                   same_counts_efficiency=trained / held if held > 0 else None,
                   scaling_factor=held / dedicated if dedicated > 0 and held > 0 else None)
    return out

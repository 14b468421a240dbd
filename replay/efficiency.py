"""How close training on the offcuts comes to the same node-hours on dedicated nodes.

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
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from offcut.taskspec import TaskSpec
from offcut.views import TaskView

__all__ = ["best_rate_per_node", "dedicated_efficiency"]


def best_rate_per_node(spec: TaskSpec) -> float | None:
    """``r*`` = max over n in [min_nodes, max_nodes] of P(n) / n [samples/(node s)], P
    interpolated linearly on the spec's curve; None without a curve."""
    if len(spec.node_counts) < 2:
        return None
    n = np.arange(max(spec.min_nodes, 1), spec.max_nodes + 1, dtype=float)
    rate = np.interp(n, np.asarray(spec.node_counts, dtype=float),
                     np.asarray(spec.throughputs, dtype=float))
    return float(np.max(rate / n))


def dedicated_efficiency(tasks: Iterable[TaskView],
                         node_seconds: dict[str, float]) -> dict:
    """``dedicated_efficiency`` (E of the module docstring; None when no task counts),
    ``dedicated_samples`` [samples] (its denominator) and ``dedicated_tasks_left_out``, for
    ``tasks`` (the daemon's, with ``work_done_samples``) and ``node_seconds`` [node-s] held
    per task id."""
    trained = dedicated = 0.0
    left_out = 0
    for task in tasks:
        held = node_seconds.get(task.task_id, 0.0)
        best = best_rate_per_node(task.spec)
        if best is None or held <= 0:
            left_out += 1
            continue
        trained += task.work_done_samples
        dedicated += held * best
    return {"dedicated_efficiency": trained / dedicated if dedicated > 0 else None,
            "dedicated_samples": dedicated, "dedicated_tasks_left_out": left_out}

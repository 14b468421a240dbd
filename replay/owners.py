"""Task owners for policy evaluation, and node-hours per owner.

The BFTrainer logs have no users. ``offcut replay bftrainer --owners N`` gives the tasks N
owners ``user1`` .. ``userN`` with a deterministic, skewed split (:func:`assign_owners`), so
per-user policies (``--policy fair_share``) can be compared with the others; the replay
summary then reports node-hours, samples and energy per owner and two fairness figures
(:func:`fairness`).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

#: owner of every task when the replay is not given owners (``--owners 0``)
SINGLE_OWNER = "replay"


def owner_names(count: int) -> list[str]:
    """``user1`` .. ``user<count>``."""
    return [f"user{k}" for k in range(1, count + 1)]


def assign_owners(task_names: Sequence[str], count: int) -> dict[str, str]:
    """Owners of the tasks named ``task_names`` (in submit order): with ``count`` <= 0 all are
    :data:`SINGLE_OWNER`; else owner ``user<k>`` has weight 1/k (Zipf: user1 owns the most
    tasks, about twice user2's, three times user3's ...) and the tasks are dealt in submit
    order by smooth weighted round-robin (as nginx's upstream balancer: each turn every owner
    gains its weight, the owner with the most credit, first by number on ties, takes the task
    and pays the total weight), so each owner's tasks are spread over the submission period
    and the split is within one task of the weights. Deterministic; raises ``ValueError`` when
    there are more owners than tasks (an owner without a task measures nothing)."""
    if count <= 0:
        return {name: SINGLE_OWNER for name in task_names}
    if count > len(task_names):
        raise ValueError(f"--owners {count}: more owners than the {len(task_names)} tasks")
    names = owner_names(count)
    weights = [1.0 / k for k in range(1, count + 1)]
    total = sum(weights)
    credit = [0.0] * count
    out = {}
    for task in task_names:
        for k in range(count):
            credit[k] += weights[k]
        k = max(range(count), key=lambda i: (credit[i], -i))
        credit[k] -= total
        out[task] = names[k]
    return out


class NodeTime:
    """Node-seconds per task from its placement changes: the node count a change leaves in
    force holds until the task's next change (how the daemon accrues ``Task.node_seconds``)."""

    def __init__(self) -> None:
        self._changes: dict[str, list[tuple[float, int]]] = {}  # task -> [(time, nodes)]

    def change(self, task_id: str, time: float, nodes: int) -> None:
        """Task ``task_id`` holds ``nodes`` nodes from ``time`` [s since epoch] on (changes
        arrive in time order per task)."""
        self._changes.setdefault(task_id, []).append((float(time), int(nodes)))

    def seconds(self, until: float) -> dict[str, float]:
        """Node-seconds [node-s] of every task seen, up to ``until`` [s since epoch]."""
        return self.integral(until, lambda task, n: float(n))

    def integral(self, until: float, value: Callable[[str, int], float]) -> dict[str, float]:
        """Per task seen, the integral up to ``until`` [s since epoch] of ``value(task, n)``
        over the time it held ``n`` nodes (``value`` per second: nodes gives node-seconds,
        the task's throughput P(n) [samples/s] gives the samples its held counts give)."""
        out = {}
        for task, changes in self._changes.items():
            total = 0.0
            for (t0, n), (t1, _) in zip(changes, changes[1:] + [(math.inf, 0)]):
                if t0 >= until:
                    break
                if n:
                    total += value(task, n) * (min(t1, until) - t0)
            out[task] = total
        return out


def by_owner(values: Mapping[str, float], owners: Mapping[str, str],
             everyone: Iterable[str] = ()) -> dict[str, float]:
    """Sums of per-task ``values`` per owner (``owners``: task -> owner), every owner of
    ``everyone`` present (0 when none of its tasks has a value); owners in name order."""
    out = {o: 0.0 for o in everyone}
    for task, v in values.items():
        owner = owners.get(task)
        if owner is not None:
            out[owner] = out.get(owner, 0.0) + v
    return dict(sorted(out.items()))


def fairness(values: Sequence[float]) -> dict[str, float | None]:
    """Fairness of per-owner amounts: ``jain`` = Jain's index (sum x)^2 / (n sum x^2), 1 when
    all are equal, 1/n when one owner has everything (Jain, Chiu, Hawe, DEC-TR-301, 1984);
    ``min_max`` = smallest / largest. None when there is nothing to compare."""
    xs = [float(v) for v in values]
    if not xs or max(xs) <= 0:
        return {"jain": None, "min_max": None}
    return {"jain": sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)),
            "min_max": min(xs) / max(xs)}

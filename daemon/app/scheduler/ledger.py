"""The energy ledger of a task (docs/execution.md, "Energy"): what its processes measured, per
generation and rank. Plain data kept in the task (``Task.energy``: snapshots, the archive),
written by the energy reports (:class:`~offcut.daemon.app.scheduler.energy.EnergyReports`) and
started per generation by the task lifecycle
(:class:`~offcut.daemon.app.scheduler.lifecycle.TaskLifecycle`).

The ledger keeps:

* the **world size** of each generation when it starts (nodes x processes per node,
  ``TaskSpec.local_world_size``): a report's rank must be below it;
* per (generation, rank) the **largest** figure reported: reports are cumulative, so a repeat,
  a retry or a late lower figure changes nothing (idempotent without a request id);
* the sums per generation and per task.

Retention: the world sizes and per-rank figures of the newest :data:`KEPT_GENERATIONS`
generations that ran processes are kept (at most that many times the world size entries per
task), so that the last reports of a generation that was just replaced (a rescale: the
daemon starts generation g + 1 before the processes of g checkpoint and exit) still count.
When an older generation leaves the window its sum moves into :attr:`EnergyLedger.closed_j`
and a report for it is refused (FAILED_PRECONDITION). The ledger lives in the task and goes
with it.
"""

from __future__ import annotations

from typing import Any

from offcut.daemon.app.model import Task

#: generations whose world size and per-rank figures a task keeps (the newest that ran processes)
KEPT_GENERATIONS = 4


class EnergyLedger:
    """The measured energy of one task's processes (module docstring: rules and retention).

    Attributes:
        sizes: generation -> its world size [processes], the newest :data:`KEPT_GENERATIONS`
            generations that ran processes.
        ranks: generation -> rank -> the largest figure reported [J] (kept generations only).
        closed_j: the sums of the generations no longer kept [J].
        total_j: every reported figure summed [J] (closed and kept).
        generations: generations with at least one report (all time).
    """

    __slots__ = ("sizes", "ranks", "closed_j", "total_j", "generations")

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.ranks: dict[int, dict[int, float]] = {}
        self.closed_j = 0.0
        self.total_j = 0.0
        self.generations = 0

    def start_generation(self, generation: int, world_size: int) -> None:
        """Generation ``generation`` starts with ``world_size`` processes (none: not
        recorded); the oldest kept generation past :data:`KEPT_GENERATIONS` is closed."""
        if world_size <= 0:
            return
        self.sizes[generation] = world_size
        while len(self.sizes) > KEPT_GENERATIONS:
            oldest = min(self.sizes)
            del self.sizes[oldest]
            self.closed_j += sum(self.ranks.pop(oldest, {}).values())

    def world_size(self, generation: int) -> int | None:
        """The world size of a kept generation, else None."""
        return self.sizes.get(generation)

    def record(self, generation: int, rank: int, joules: float) -> bool:
        """Take a checked report; returns whether it raised the rank's figure."""
        ranks = self.ranks.get(generation)
        if ranks is None:
            ranks = self.ranks[generation] = {}
            self.generations += 1
        old = ranks.get(rank)
        if old is not None and joules <= old:
            return False
        ranks[rank] = float(joules)
        self.total_j += float(joules) - (old or 0.0)
        return True

    @property
    def measured(self) -> bool:
        """True once any report was taken."""
        return self.generations > 0

    def last(self) -> tuple[int, float, int, int]:
        """(generation, its sum [J], ranks that reported, world size) of the newest kept
        generation with a report; zeros when there is none."""
        if not self.ranks:
            return 0, 0.0, 0, 0
        g = max(self.ranks)
        ranks = self.ranks[g]
        return g, float(sum(ranks.values())), len(ranks), self.sizes.get(g, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (snapshots, the archive): integer keys as pairs."""
        return {"sizes": [[g, n] for g, n in sorted(self.sizes.items())],
                "ranks": [[g, [[r, j] for r, j in sorted(rs.items())]]
                          for g, rs in sorted(self.ranks.items())],
                "closed_j": self.closed_j, "total_j": self.total_j,
                "generations": self.generations}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EnergyLedger":
        """Inverse of :meth:`to_dict`."""
        ledger = cls()
        ledger.sizes = {int(g): int(n) for g, n in d["sizes"]}
        ledger.ranks = {int(g): {int(r): float(j) for r, j in rs} for g, rs in d["ranks"]}
        ledger.closed_j = float(d["closed_j"])
        ledger.total_j = float(d["total_j"])
        ledger.generations = int(d["generations"])
        return ledger


def ledger_of(task: Task) -> EnergyLedger:
    """The task's ledger (made on first use)."""
    if task.energy is None:
        task.energy = EnergyLedger()
    return task.energy


def generation_world_size(task: Task, generation: int) -> int | None:
    """The world size of ``generation`` of ``task``: the one recorded when it started, else
    (the current generation of a task placed before ledgers existed) its nodes x processes
    per node; None when unknown (never ran processes, or no longer kept)."""
    if task.energy is not None:
        size = task.energy.world_size(generation)
        if size is not None:
            return size
    if generation == task.generation and task.nodes:
        return len(task.nodes) * task.spec.local_world_size
    return None

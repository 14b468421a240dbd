"""Measured energy of a task's processes (docs/execution.md, "Energy"; ``Tasks.ReportEnergy``).

Every process of a generation measures the GPUs it uses (``offcut.client.elastic.energy``:
ZeusMonitor, else NVML's energy counters) and reports the joules they drew since it started,
at every checkpoint and right before it exits. The daemon keeps, per task, an
:class:`EnergyLedger`:

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
and a report for it is refused (FAILED_PRECONDITION). The ledger lives in the task (snapshots,
the archive) and goes with it.

Bounds (INVALID_ARGUMENT naming the field): ``joules`` finite, 0 to :data:`MAX_RANK_ENERGY_J`;
``generation`` >= 1; ``rank`` below the generation's world size. FAILED_PRECONDITION:
``generation`` after the task's current one, or no longer (or never) kept.
"""

from __future__ import annotations

import math
from typing import Any

from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.daemon.model import EnergyEvent, Task
from offcut.daemon.scheduler.outcome import Outcome

#: generations whose world size and per-rank figures a task keeps (the newest that ran processes)
KEPT_GENERATIONS = 4
#: largest figure of one report [J]: 64 GPUs drawing 5 kW each for a year (1.01e13 J)
MAX_RANK_ENERGY_J = 1e13
#: longest request id [characters] (as the other events')
MAX_REQUEST_ID_LEN = 200


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


class EnergyReports:
    """Checks and applies ``ReportEnergy`` events (a part of the scheduler)."""

    def _validate_energy(self, event: EnergyEvent) -> None:
        """Raise (module docstring) when ``event`` cannot be applied; never changes state."""
        if len(event.request_id) > MAX_REQUEST_ID_LEN:
            raise InvalidArgument(f"must be at most {MAX_REQUEST_ID_LEN} characters",
                                  "request_id")
        j = event.joules
        if isinstance(j, bool) or not isinstance(j, (int, float)) or not math.isfinite(j) \
                or not 0 <= j <= MAX_RANK_ENERGY_J:
            raise InvalidArgument(f"must be a finite number of joules from 0 to "
                                  f"{MAX_RANK_ENERGY_J:g}, got {j!r}", "joules")
        if event.generation < 1:
            raise InvalidArgument("must be >= 1 (the process's OFFCUT_GENERATION)", "generation")
        if event.rank < 0:
            raise InvalidArgument(f"must be >= 0, got {event.rank}", "rank")
        task = self.tasks.get(event.task_id)
        if task is None:
            raise NotFound(f"no task {event.task_id!r}", "task_id")
        if event.generation > task.generation:
            raise FailedPrecondition(f"{event.generation} is after the current generation "
                                     f"{task.generation} of task {task.task_id}", "generation")
        size = generation_world_size(task, event.generation)
        if size is None:
            raise FailedPrecondition(
                f"generation {event.generation} of task {task.task_id} ran no processes or "
                f"is older than the newest {KEPT_GENERATIONS} that did (their energy is "
                "taken)", "generation")
        if event.rank >= size:
            raise InvalidArgument(f"{event.rank} is not below the world size {size} of "
                                  f"generation {event.generation}", "rank")

    def _apply_energy(self, event: EnergyEvent, t: float, out: Outcome) -> bool:
        """Take a validated report into the task's ledger; never re-allocates."""
        task = self.tasks[event.task_id]
        out.task_id = task.task_id
        ledger = ledger_of(task)
        if ledger.world_size(event.generation) is None:  # a task placed before ledgers
            ledger.start_generation(event.generation,
                                    generation_world_size(task, event.generation) or 0)
        ledger.record(event.generation, event.rank, event.joules)
        return False

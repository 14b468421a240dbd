"""Measured energy of a task's processes (docs/execution.md, "Energy"; ``Tasks.ReportEnergy``).

Every process of a generation measures the GPUs it uses (``offcut.client.elastic.energy``:
ZeusMonitor, else NVML's energy counters) and reports the joules they drew since it started,
at every checkpoint and right before it exits. The daemon keeps them per task in an
:class:`~offcut.daemon.app.scheduler.ledger.EnergyLedger` (its rules and retention: that module).

Bounds (INVALID_ARGUMENT naming the field): ``joules`` finite, 0 to :data:`MAX_RANK_ENERGY_J`;
``generation`` >= 1; ``rank`` below the generation's world size. FAILED_PRECONDITION:
``generation`` after the task's current one, or no longer (or never) kept.
"""

from __future__ import annotations

import math

from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.daemon.app.model import EnergyEvent
from offcut.daemon.app.scheduler.ledger import (KEPT_GENERATIONS, EnergyLedger,
                                            generation_world_size, ledger_of)
from offcut.daemon.app.scheduler.outcome import Outcome
from offcut.daemon.app.scheduler.state import SchedulerState

__all__ = ["KEPT_GENERATIONS", "MAX_RANK_ENERGY_J", "MAX_REQUEST_ID_LEN", "EnergyLedger",
           "EnergyReports"]

#: largest figure of one report [J]: 64 GPUs drawing 5 kW each for a year (1.01e13 J)
MAX_RANK_ENERGY_J = 1e13
#: longest request id [characters] (as the other events')
MAX_REQUEST_ID_LEN = 200


class EnergyReports:
    """Checks and applies ``ReportEnergy`` events (module docstring: the bounds).

    Reads ``state.tasks``; writes only the reported task's ledger (``Task.energy``). Never
    re-allocates: measured energy changes no node count.

    Interface: :meth:`validate` (pure), :meth:`apply` (an event :meth:`validate` accepted).
    """

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def validate(self, event: EnergyEvent) -> None:
        """Raise InvalidArgument / FailedPrecondition / NotFound (module docstring) when
        ``event`` cannot be applied; never changes state."""
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
        state = self.state
        task = state.tasks.get(event.task_id)
        if task is None:
            raise NotFound(f"no task {event.task_id!r}", "task_id")
        if task.state.finished and task.finish_time is not None \
                and task.finish_time <= state.retirement_horizon(state.event_time(event.time)):
            # the event would retire it before taking the report (TaskLifecycle.retire_finished)
            raise FailedPrecondition(
                f"task {task.task_id} finished more than finished_task_retention_s "
                f"({state.finished_task_retention_s:g} s) before this report: its energy is "
                "no longer taken", "task_id")
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

    def apply(self, event: EnergyEvent, t: float, out: Outcome) -> bool:
        """Take a validated report (at event time ``t`` [s]) into the task's ledger; returns
        False (never re-allocates)."""
        task = self.state.tasks[event.task_id]
        out.task_id = task.task_id
        ledger = ledger_of(task)
        if ledger.world_size(event.generation) is None:  # a task placed before ledgers
            ledger.start_generation(event.generation,
                                    generation_world_size(task, event.generation) or 0)
        ledger.record(event.generation, event.rank, event.joules)
        return False

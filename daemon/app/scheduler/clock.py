"""The event clock and BFTrainer's progress model between events (arXiv 2106.12091, Sections 3-4;
docs/architecture.md, "Tasks and the progress model"): accrual of samples, energy and node-seconds,
exact completions."""

from __future__ import annotations

import math

from offcut.daemon.app.model import Task
from offcut.views import TaskState
from offcut.daemon.app.scheduler.interfaces import Lifecycle, Reallocate
from offcut.daemon.app.scheduler.outcome import Allocate, Outcome
from offcut.daemon.app.scheduler.state import SchedulerState
from offcut.daemon.app.scheduler.waste import FINAL_GRACE, note_warning


class ProgressModel:
    """Moves the event clock forward, accruing progress and completing tasks on the way.

    Reads ``state.admitted()``, ``final_grace_s``, the pool and holder sizes; writes
    ``state.clock``, ``total_samples``, ``task_energy_j``, ``idle_node_seconds``,
    ``used_node_seconds`` and the admitted tasks' work, energy and node-seconds. Uses the task
    lifecycle to complete a task, and the re-allocation (``reallocate``, given) after each
    completion on the way.

    Interface: :meth:`advance` ``(t, out, allocate)``; :meth:`accrue` ``(dt, out)``.
    """

    def __init__(self, state: SchedulerState, lifecycle: Lifecycle,
                 reallocate: Reallocate) -> None:
        self.state = state
        self.lifecycle = lifecycle
        self.reallocate = reallocate

    def advance(self, t: float, out: Outcome, allocate: Allocate) -> None:
        """Accrue progress up to ``t`` [s], completing tasks (and re-allocating) on the way:
        a modelled task when its work is done, a task in its final phase ``final_grace_s``
        after its work was reached (stopped, with a ``final-grace`` warning;
        docs/execution.md, "Completion"). The first event only sets the clock."""
        state = self.state
        if state.clock is None:
            state.clock = t
            return
        while True:
            soonest, soonest_task = self._next_completion()
            if soonest_task is None or soonest > t:
                break
            self.accrue(soonest - state.clock, out)
            state.clock = max(state.clock, soonest)
            self._complete(soonest, soonest_task, out)
            self.reallocate(soonest, out, allocate)
        self.accrue(t - state.clock, out)
        state.clock = t

    def _next_completion(self) -> tuple[float, Task | None]:
        """``(time [s], task)`` of the admitted task that completes first (its work done at
        its rate, or its final phase over); ``(inf, None)`` when none will."""
        state = self.state
        soonest, soonest_task = math.inf, None
        for task in state.admitted():  # only admitted tasks can hold nodes
            if task.work_reached_time is not None:
                at = task.work_reached_time + state.final_grace_s
            elif task.rate > 0 and task.state is TaskState.RUNNING and task.learner is None:
                left = task.spec.total_work_samples - task.work_done
                at = state.clock + max(left, 0.0) / task.rate
            else:
                continue
            if at < soonest:
                soonest, soonest_task = at, task
        return soonest, soonest_task

    def _complete(self, soonest: float, soonest_task: Task, out: Outcome) -> None:
        """Complete, at the clock reached (``soonest`` [s]), ``soonest_task`` and every other
        admitted task done by then: modelled tasks at their work, tasks whose final phase is
        over (a ``final-grace`` warning)."""
        state = self.state
        for task in state.admitted():
            if task.work_reached_time is not None:
                if task.work_reached_time + state.final_grace_s <= state.clock:
                    note_warning(task, FINAL_GRACE, (
                        f"its processes still ran {state.final_grace_s:g} s (final_grace_s) "
                        f"after a report reached the work: COMPLETED, its processes "
                        f"stopped (a final evaluation longer than that needs a larger "
                        f"final_grace_s)"), state.clock, out)
                    self.lifecycle.finish(task, TaskState.COMPLETED, state.clock, out)
                    out.completed_task_ids.append(task.task_id)
            elif task.state is TaskState.RUNNING and task.learner is None and (
                    task is soonest_task or
                    task.work_done >= task.spec.total_work_samples * (1 - 1e-12)):
                out.progress_samples += task.spec.total_work_samples - task.work_done
                state.total_samples += task.spec.total_work_samples - task.work_done
                task.work_done = task.spec.total_work_samples
                self.lifecycle.finish(task, TaskState.COMPLETED, soonest, out)
                out.completed_task_ids.append(task.task_id)

    def accrue(self, dt: float, out: Outcome) -> None:
        """Accrue ``dt`` [s] (nothing when <= 0) at the admitted tasks' rates and powers: their
        work (a learned task's stays below its total: only a report completes it), energy and
        node-seconds, and the pool's idle and used node-seconds."""
        if dt <= 0:
            return
        state = self.state
        for task in state.admitted():
            if task.rate > 0:
                gained = task.rate * dt
                if task.learner is not None:  # completed only by a report: stay below the total
                    gained = min(gained, max(0.0, task.spec.total_work_samples * (1 - 1e-9)
                                             - task.work_done))
                task.work_done += gained
                out.progress_samples += gained
                state.total_samples += gained
            if task.power > 0:
                task.energy_j += task.power * dt
                state.task_energy_j += task.power * dt
            if task.nodes:
                task.node_seconds += len(task.nodes) * dt
        state.idle_node_seconds += len(state.pool) * dt
        state.used_node_seconds += len(state.holder) * dt

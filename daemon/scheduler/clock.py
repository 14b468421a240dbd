"""The event clock and BFTrainer's progress model between events (arXiv 2106.12091, Sections 3-4;
docs/architecture.md, "Tasks and the progress model"): accrual of samples, energy and node-seconds,
exact completions."""

from __future__ import annotations

import math

from offcut.daemon.model import TaskState
from offcut.daemon.scheduler.outcome import Allocate, Outcome
from offcut.daemon.scheduler.waste import FINAL_GRACE, note_warning


class ProgressClock:
    """Moves the event clock forward, accruing progress and completing tasks on the way."""

    def _advance(self, t: float, out: Outcome, allocate: Allocate) -> None:
        """Accrue progress up to ``t``, completing tasks (and re-allocating) on the way: a
        modelled task when its work is done, a task in its final phase ``final_grace_s`` after
        its work was reached (stopped, with a ``final-grace`` warning; docs/execution.md,
        "Completion")."""
        if self.clock is None:
            self.clock = t
            return
        while True:
            soonest, soonest_task = math.inf, None
            for task in self.admitted():  # only admitted tasks can hold nodes
                if task.work_reached_time is not None:
                    at = task.work_reached_time + self.final_grace_s
                elif task.rate > 0 and task.state is TaskState.RUNNING and task.learner is None:
                    left = task.spec.total_work_samples - task.work_done
                    at = self.clock + max(left, 0.0) / task.rate
                else:
                    continue
                if at < soonest:
                    soonest, soonest_task = at, task
            if soonest_task is None or soonest > t:
                break
            self._accrue(soonest - self.clock, out)
            self.clock = max(self.clock, soonest)
            for task in self.admitted():
                if task.work_reached_time is not None:
                    if task.work_reached_time + self.final_grace_s <= self.clock:
                        note_warning(task, FINAL_GRACE, (
                            f"its processes still ran {self.final_grace_s:g} s (final_grace_s) "
                            f"after a report reached the work: COMPLETED, its processes "
                            f"stopped (a final evaluation longer than that needs a larger "
                            f"final_grace_s)"), self.clock, out)
                        self._finish(task, TaskState.COMPLETED, self.clock, out)
                        out.completed_task_ids.append(task.task_id)
                elif task.state is TaskState.RUNNING and task.learner is None and (
                        task is soonest_task or
                        task.work_done >= task.spec.total_work_samples * (1 - 1e-12)):
                    out.progress_samples += task.spec.total_work_samples - task.work_done
                    self.total_samples += task.spec.total_work_samples - task.work_done
                    task.work_done = task.spec.total_work_samples
                    self._finish(task, TaskState.COMPLETED, soonest, out)
                    out.completed_task_ids.append(task.task_id)
            self._reallocate(soonest, out, allocate)
        self._accrue(t - self.clock, out)
        self.clock = t

    def _accrue(self, dt: float, out: Outcome) -> None:
        if dt <= 0:
            return
        for task in self.admitted():
            if task.rate > 0:
                gained = task.rate * dt
                if task.learner is not None:  # completed only by a report: stay below the total
                    gained = min(gained, max(0.0, task.spec.total_work_samples * (1 - 1e-9)
                                             - task.work_done))
                task.work_done += gained
                out.progress_samples += gained
                self.total_samples += gained
            if task.power > 0:
                task.energy_j += task.power * dt
                self.task_energy_j += task.power * dt
            if task.nodes:
                task.node_seconds += len(task.nodes) * dt
        self.idle_node_seconds += len(self.pool) * dt
        self.used_node_seconds += len(self.holder) * dt

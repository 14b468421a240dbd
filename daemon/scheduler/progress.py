"""Progress reports of running tasks (issue "Learn scalability online"): each replaces the
task's progress and energy and feeds its learner; one reaching the total work completes it."""

from __future__ import annotations

from offcut.daemon.model import ProgressEvent, TaskState
from offcut.daemon.scheduler.outcome import Outcome


class ProgressReports:
    """Applies ``ReportProgress`` events."""

    def _apply_progress(self, event: ProgressEvent, t: float, out: Outcome) -> bool:
        """Apply validated reports: each feeds the task's learner and replaces its progress
        (and energy, when reported); a report reaching ``total_work`` completes the task.
        Returns whether the allocation must be re-solved (a completion, or a learner that
        measured a node count for the first time)."""
        changed = False
        for r in event.reports:
            task = self.tasks[r.task_id]
            if task.state.finished:
                continue
            task.failed_runs = 0  # it runs: failures so far were not in a row
            version = task.learner.version
            if task.learner.observe(r.report):
                changed = True
            if task.learner.version != version:
                self._learn_version += 1  # the population prior may have moved
            total = task.spec.total_work_samples
            report = r.report
            delta = min(report.samples_done, total) - task.work_done
            task.work_done += delta
            out.progress_samples += delta
            self.total_samples += delta
            if report.energy_j is not None:
                self.task_energy_j += report.energy_j - task.energy_j
                task.energy_j = float(report.energy_j)
            if report.samples_done >= total:
                self._finish(task, TaskState.COMPLETED, t, out)
                out.completed_task_ids.append(task.task_id)
                changed = True
            else:
                self._set_running_state(task)  # the learned rate may have moved
        return changed

"""Progress reports of running tasks (issue "Learn scalability online"): each replaces the
task's progress and energy and feeds its learner; one reaching the total work completes it,
or, for a task a launcher runs, starts its final phase (docs/execution.md, "Completion")."""

from __future__ import annotations

from offcut.daemon.model import ProgressEvent, TaskState
from offcut.daemon.scheduler.outcome import Outcome
from offcut.daemon.scheduler.waste import note_report


class ProgressReports:
    """Applies ``ReportProgress`` events."""

    def _apply_progress(self, event: ProgressEvent, t: float, out: Outcome) -> bool:
        """Apply validated reports: each feeds the task's learner and replaces its progress
        (and energy, when reported), and counts samples trained again after a restart
        (:func:`~offcut.daemon.scheduler.waste.note_report`). A report reaching
        ``total_work`` completes the task, unless a launcher runs it (a run was reported
        started) and ``final_grace_s`` > 0: then the task keeps its nodes until its processes
        exit 0 (the launcher's ``finished``), at most ``final_grace_s`` (docs/execution.md,
        "Completion"). Returns whether the allocation must be re-solved (a completion, a
        final phase begun, or a learner that measured a node count for the first time)."""
        changed = False
        for r in event.reports:
            task = self.tasks[r.task_id]
            if task.state.finished:
                continue
            version = task.learner.version
            if task.learner.observe(r.report):
                changed = True
            if task.learner.version != version:
                self._learn_version += 1  # the population prior may have moved
            total = task.spec.total_work_samples
            report = r.report
            note_report(task, report.samples_done, t, out)
            delta = min(report.samples_done, total) - task.work_done
            task.work_done += delta
            out.progress_samples += delta
            self.total_samples += delta
            if report.energy_j is not None:
                self.task_energy_j += report.energy_j - task.energy_j
                task.energy_j = float(report.energy_j)
            if report.samples_done >= total and task.launches and self.final_grace_s > 0 \
                    and task.nodes:
                if task.work_reached_time is None:  # its processes finish (an evaluation)
                    task.work_reached_time = t
                    changed = True
            elif report.samples_done >= total:
                self._finish(task, TaskState.COMPLETED, t, out)
                out.completed_task_ids.append(task.task_id)
                changed = True
            else:
                self._set_running_state(task)  # the learned rate may have moved
        return changed

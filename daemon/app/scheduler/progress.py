"""Progress reports of running tasks (issue "Learn scalability online"): each replaces the
task's progress and energy and feeds its learner; one reaching the total work completes it,
or, for a task a launcher runs, starts its final phase (docs/execution.md, "Completion")."""

from __future__ import annotations

from offcut.daemon.app.model import ProgressEvent
from offcut.views import TaskState
from offcut.daemon.app.scheduler.interfaces import Lifecycle, Models
from offcut.daemon.app.scheduler.outcome import Outcome
from offcut.daemon.app.scheduler.state import SchedulerState
from offcut.daemon.app.scheduler.waste import note_report


class ProgressReports:
    """Applies ``ReportProgress`` events.

    Reads ``state.tasks`` and ``final_grace_s``; writes the reported tasks (progress, energy,
    learner, wasted-work figures, ``work_reached_time``), ``state.total_samples`` and
    ``task_energy_j``. Uses the task lifecycle (complete a task, set its running state) and
    tells the task models when a learner's model moved.

    Interface: :meth:`apply` ``(event, t, out) -> whether to re-allocate``.
    """

    def __init__(self, state: SchedulerState, models: Models, lifecycle: Lifecycle) -> None:
        self.state = state
        self.models = models
        self.lifecycle = lifecycle

    def apply(self, event: ProgressEvent, t: float, out: Outcome) -> bool:
        """Apply validated reports: each feeds the task's learner and replaces its progress
        (and energy, when reported), and counts samples trained again after a restart
        (:func:`~offcut.daemon.app.scheduler.waste.note_report`). A report reaching
        ``total_work`` completes the task, unless a launcher runs it (a run was reported
        started) and ``final_grace_s`` > 0: then the task keeps its nodes until its processes
        exit 0 (the launcher's ``finished``), at most ``final_grace_s`` (docs/execution.md,
        "Completion"). Returns whether the allocation must be re-solved (a completion, a
        final phase begun, or a learner that measured a node count for the first time)."""
        state = self.state
        changed = False
        for r in event.reports:
            task = state.tasks[r.task_id]
            if task.state.finished:
                continue
            version = task.learner.version
            if task.learner.observe(r.report):
                changed = True
            if task.learner.version != version:
                self.models.learners_moved()  # the population prior may have moved
            total = task.spec.total_work_samples
            report = r.report
            note_report(task, report.samples_done, t, out)
            delta = min(report.samples_done, total) - task.work_done
            task.work_done += delta
            out.progress_samples += delta
            state.total_samples += delta
            if report.energy_j is not None:
                state.task_energy_j += report.energy_j - task.energy_j
                task.energy_j = float(report.energy_j)
            if report.samples_done >= total and task.launches and state.final_grace_s > 0 \
                    and task.nodes:
                if task.work_reached_time is None:  # its processes finish (an evaluation)
                    task.work_reached_time = t
                    changed = True
            elif report.samples_done >= total:
                self.lifecycle.finish(task, TaskState.COMPLETED, t, out)
                out.completed_task_ids.append(task.task_id)
                changed = True
            else:
                self.lifecycle.set_running_state(task)  # the learned rate may have moved
        return changed

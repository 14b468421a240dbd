"""A task's life (docs/execution.md): submission, cancellation, run reports (restarts,
failures), the finish, the placement changes that start generations, and the rule that
charges rescale and preemption costs."""

from __future__ import annotations

from offcut.daemon.learning import TaskLearner
from offcut.daemon.model import CancelEvent, SubmitEvent, Task, TaskRunEvent, TaskState
from offcut.daemon.scheduler.energy import ledger_of
from offcut.daemon.scheduler.outcome import Outcome, PlacementChange
from offcut.daemon.scheduler.waste import STOP_IGNORED, note_failure, note_warning


class TaskLifecycle:
    """Submit, cancel, run reports, finishing and generations of tasks."""

    def _apply_submit(self, event: SubmitEvent, t: float, out: Outcome) -> bool:
        """Queue a new task (id ``t<number>``, a learner when it reports progress)."""
        task = Task(task_id=f"t{self.next_task_number:06d}", spec=event.spec,
                    owner=event.owner, submit_time=event.time, request_id=event.request_id)
        self.next_task_number += 1
        self.tasks[task.task_id] = task
        self.active[task.task_id] = task
        self.active_owners[task.owner] += 1
        self._retain(task)
        if event.spec.reports:
            task.learner = TaskLearner()
        out.task_id = task.task_id
        return True

    def _apply_cancel(self, event: CancelEvent, t: float, out: Outcome) -> bool:
        """Cancel a task, releasing its nodes (it may have completed on the way to ``t``)."""
        task = self.tasks[event.task_id]
        out.task_id = task.task_id
        if task.state.finished:
            return False
        self._finish(task, TaskState.CANCELLED, t, out)
        return True

    def _apply_run_event(self, event: TaskRunEvent, t: float, out: Outcome) -> bool:
        """A launcher's run report of a task (:meth:`_apply_run`)."""
        task = self.tasks[event.task_id]
        out.task_id = task.task_id
        return self._apply_run(task, event, t, out)

    def _apply_run(self, task: Task, event: TaskRunEvent, t: float, out: Outcome) -> bool:
        """Record a run report (docs/execution.md). ``finished`` completes the task (its
        program says the work is done: the model's progress is replaced by ``total_work``).
        With a generation, ``failed`` / ``interrupted`` of the current generation restart the
        task on its nodes as a new generation (a ``restart`` placement change); every
        ``failed`` counts in ``failed_runs``, and the task fails when
        ``max_failed_generations`` of them in a row made no progress beyond the previous
        failure's (:func:`~offcut.daemon.scheduler.waste.note_failure`); reports of earlier
        generations are only recorded. A run that ignored the stop signal (``stop_ignored``,
        any generation) is noted as a ``stop-ignored`` warning. Without a generation,
        ``failed`` fails the task at once. Returns whether the allocation must be
        re-solved."""
        task.last_run = event.describe()
        if event.state == "started":
            task.launches += 1
            if event.generation is not None:
                task.started_generation = max(task.started_generation, event.generation)
        if task.state.finished:  # it may have completed on the way to ``t``
            return False
        if event.stop_ignored:
            note_warning(task, STOP_IGNORED,
                         f"its processes ignored the stop signal and were killed after the "
                         f"grace time ({task.last_run}): save a checkpoint and exit 75 when "
                         f"OFFCUT_STOP_SIGNAL arrives (docs/execution.md)", t, out)
        if event.state == "finished":
            gained = task.spec.total_work_samples - task.work_done
            task.work_done = task.spec.total_work_samples
            out.progress_samples += gained
            self.total_samples += gained
            self._finish(task, TaskState.COMPLETED, t, out)
            out.completed_task_ids.append(task.task_id)
            return True
        if event.generation is None:
            if event.state == "failed":
                task.failure_reason = task.last_run
                self._finish(task, TaskState.FAILED, t, out)
                return True
            return False
        if event.generation != task.generation or event.state == "started":
            return False  # superseded: a run stopped while its generation was replaced
        if task.learner is not None:
            task.learner.on_pause(t)  # the current generation's processes stopped
        if event.state == "preempted":
            return False  # the node event that takes the node decides
        if event.state == "failed":
            task.failure_reason = task.last_run
            in_a_row = note_failure(task, t, self.max_failed_generations, out)
            if in_a_row >= self.max_failed_generations:
                task.failure_reason = (
                    f"{in_a_row} runs in a row failed without progress beyond "
                    f"{task.failure_progress:,.0f} reported samples ({task.failed_runs} failed "
                    f"runs in all); the last: {task.last_run}")
                self._finish(task, TaskState.FAILED, t, out)
                return True
        if task.nodes:
            out.placements.append(self._change(task, "restart", len(task.nodes), t))
        return False

    @staticmethod
    def _chargeable(task: Task, cost: float) -> float:
        """The part of a rescale or preemption cost [samples] charged to ``task``'s progress:
        all of it, except that a task that reports its progress never drops below its last
        reported samples (a measured fact; its next report tells the real loss)."""
        if task.learner is None:
            return cost
        last = task.learner.last_report
        floor = last[1] if last is not None else 0.0
        return max(0.0, min(cost, task.work_done - floor))

    def _set_running_state(self, task: Task) -> None:
        n = len(task.nodes)
        task.rate = self.rate_at(task, n)
        task.power = self.power_at(task, n)
        if not task.state.finished:
            task.state = TaskState.RUNNING if task.nodes else TaskState.ADMITTED

    def _finish(self, task: Task, state: TaskState, t: float, out: Outcome) -> None:
        before = len(task.nodes)
        for n in task.nodes:
            self.holder.pop(n, None)
        task.nodes = []
        task.rate = 0.0
        task.power = 0.0
        task.state = state
        task.finish_time = t
        del self.active[task.task_id]
        left = self.active_owners[task.owner] - 1
        if left > 0:
            self.active_owners[task.owner] = left
        else:
            del self.active_owners[task.owner]
        self.finished.append((t, task.task_id))
        self._objective.pop(task.task_id, None)
        out.placements.append(self._change(task, state.value, before, t))

    def _change(self, task: Task, change: str, before: int, t: float) -> PlacementChange:
        """The placement change of ``task`` (node set already updated); every change but a
        finish starts a new generation (docs/execution.md)."""
        if not task.state.finished:
            task.generation += 1
            task.generation_time = t
            task.work_reached_time = None  # a new generation finishes again (its own report)
            ledger_of(task).start_generation(task.generation,
                                             len(task.nodes) * task.spec.local_world_size)
        return PlacementChange(task.task_id, task.spec.name, change, list(task.nodes), before,
                               task.rate, task.work_done, task.spec.total_work_samples, t,
                               task.generation)

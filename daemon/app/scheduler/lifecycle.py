"""A task's life (docs/execution.md): submission, cancellation, run reports (restarts,
failures), the finish, retirement, the placement changes that start generations, and the rule
that charges rescale and preemption costs."""

from __future__ import annotations

from offcut.daemon.app.learning import TaskLearner
from offcut.daemon.app.model import CancelEvent, SubmitEvent, Task, TaskRunEvent
from offcut.views import TaskState
from offcut.daemon.app.scheduler.interfaces import Models
from offcut.daemon.app.scheduler.ledger import ledger_of
from offcut.daemon.app.scheduler.outcome import Outcome
from offcut.views import PlacementChange
from offcut.daemon.app.scheduler.state import SchedulerState
from offcut.daemon.app.scheduler.waste import STOP_IGNORED, note_failure, note_warning


class TaskLifecycle:
    """Submit, cancel, run reports, finishing, retirement and generations of tasks.

    Reads and writes ``state.tasks``, ``active``, ``active_owners``, ``retained_owners``
    (through :meth:`SchedulerState.retain` / ``release``), ``finished``, ``holder`` (a
    finished task's nodes), ``next_task_number``, ``total_samples``; the tasks' own fields.
    Uses the task models (rate and power at a node count; their cache of a finished task).

    Interface: the event handlers :meth:`submit`, :meth:`cancel`, :meth:`run` (each
    ``(event, t, out) -> whether to re-allocate``), :meth:`retire_finished`, and the steps the
    other collaborators take (:class:`~offcut.daemon.app.scheduler.interfaces.Lifecycle`):
    :meth:`finish`, :meth:`change`, :meth:`set_running_state`, :meth:`charge`.
    """

    def __init__(self, state: SchedulerState, models: Models) -> None:
        self.state = state
        self.models = models

    def submit(self, event: SubmitEvent, t: float, out: Outcome) -> bool:
        """Queue a new task (id ``t<number>``, a learner when it reports progress)."""
        state = self.state
        task = Task(task_id=f"t{state.next_task_number:06d}", spec=event.spec,
                    owner=event.owner, submit_time=event.time, request_id=event.request_id)
        state.next_task_number += 1
        state.tasks[task.task_id] = task
        state.active[task.task_id] = task
        state.active_owners[task.owner] += 1
        state.retain(task)
        if event.spec.reports:
            task.learner = TaskLearner()
        out.task_id = task.task_id
        return True

    def cancel(self, event: CancelEvent, t: float, out: Outcome) -> bool:
        """Cancel a task, releasing its nodes (it may have completed on the way to ``t``)."""
        task = self.state.tasks[event.task_id]
        out.task_id = task.task_id
        if task.state.finished:
            return False
        self.finish(task, TaskState.CANCELLED, t, out)
        return True

    def run(self, event: TaskRunEvent, t: float, out: Outcome) -> bool:
        """A launcher's run report of a task (:meth:`apply_run`)."""
        task = self.state.tasks[event.task_id]
        out.task_id = task.task_id
        return self.apply_run(task, event, t, out)

    def apply_run(self, task: Task, event: TaskRunEvent, t: float, out: Outcome) -> bool:
        """Record a run report (docs/execution.md). ``finished`` completes the task (its
        program says the work is done: the model's progress is replaced by ``total_work``).
        With a generation, ``failed`` / ``interrupted`` of the current generation restart the
        task on its nodes as a new generation (a ``restart`` placement change); every
        ``failed`` counts in ``failed_runs``, and the task fails when
        ``max_failed_generations`` of them in a row made no progress beyond the previous
        failure's (:func:`~offcut.daemon.app.scheduler.waste.note_failure`); reports of earlier
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
            self.state.total_samples += gained
            self.finish(task, TaskState.COMPLETED, t, out)
            out.completed_task_ids.append(task.task_id)
            return True
        if event.generation is None:
            if event.state == "failed":
                task.failure_reason = task.last_run
                self.finish(task, TaskState.FAILED, t, out)
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
            limit = self.state.max_failed_generations
            in_a_row = note_failure(task, t, limit, out)
            if in_a_row >= limit:
                task.failure_reason = (
                    f"{in_a_row} runs in a row failed without progress beyond "
                    f"{task.failure_progress:,.0f} reported samples ({task.failed_runs} failed "
                    f"runs in all); the last: {task.last_run}")
                self.finish(task, TaskState.FAILED, t, out)
                return True
        if task.nodes:
            out.placements.append(self.change(task, "restart", len(task.nodes), t))
        return False

    @staticmethod
    def chargeable(task: Task, cost: float) -> float:
        """The part of a rescale or preemption cost [samples] charged to ``task``'s progress:
        all of it, except that a task that reports its progress never drops below its last
        reported samples (a measured fact; its next report tells the real loss)."""
        if task.learner is None:
            return cost
        last = task.learner.last_report
        floor = last[1] if last is not None else 0.0
        return max(0.0, min(cost, task.work_done - floor))

    def charge(self, task: Task, cost: float, out: Outcome) -> float:
        """Charge a rescale or preemption ``cost`` [samples] to ``task`` (its
        :meth:`chargeable` part): off its progress, the event's progress and the state's
        samples; returns the part charged (the caller counts it as a rescale or a preemption
        cost)."""
        cost = self.chargeable(task, cost)
        task.work_done -= cost
        out.progress_samples -= cost
        self.state.total_samples -= cost
        return cost

    def set_running_state(self, task: Task) -> None:
        """Set ``task``'s modelled rate and power at its node count, and its state (RUNNING
        with nodes, else ADMITTED; a finished task stays finished)."""
        n = len(task.nodes)
        task.rate = self.models.rate_at(task, n)
        task.power = self.models.power_at(task, n)
        if not task.state.finished:
            task.state = TaskState.RUNNING if task.nodes else TaskState.ADMITTED

    def finish(self, task: Task, state: TaskState, t: float, out: Outcome) -> None:
        """End ``task`` in ``state`` (COMPLETED, CANCELLED, FAILED) at ``t`` [s]: its nodes
        released, out of ``active``, queued for retirement; its placement change in ``out``."""
        before = len(task.nodes)
        holder = self.state.holder
        for n in task.nodes:
            holder.pop(n, None)
        task.nodes = []
        task.rate = 0.0
        task.power = 0.0
        task.state = state
        task.finish_time = t
        active_owners = self.state.active_owners
        del self.state.active[task.task_id]
        left = active_owners[task.owner] - 1
        if left > 0:
            active_owners[task.owner] = left
        else:
            del active_owners[task.owner]
        self.state.finished.append((t, task.task_id))
        self.models.forget(task.task_id)
        out.placements.append(self.change(task, state.value, before, t))

    def retire_finished(self, t: float, out: Outcome) -> None:
        """Take the tasks that finished ``finished_task_retention_s`` or longer before ``t``
        (the event's time [s]) out of the state, into ``out.retired`` (oldest first; the
        engine archives them in the same transaction as the event). Runs before the event is
        applied: a task the event finishes is not retired by it, and an event naming a
        finished task was refused by validation."""
        state = self.state
        horizon = state.retirement_horizon(t)
        while state.finished and state.finished[0][0] <= horizon:
            _, task_id = state.finished.popleft()
            task = state.tasks.pop(task_id, None)
            if task is not None:
                state.release(task)
                out.retired.append(task)

    def change(self, task: Task, change: str, before: int, t: float) -> PlacementChange:
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

"""The engine's read-only views: one task, a page of tasks, the state in figures.

Each function reads the scheduler's state (and the state file's archive of finished tasks)
and returns copies (:mod:`offcut.daemon.app.replies`), so the gRPC edge converts them to messages
after the engine's lock is released. Which ones run under that lock is the engine's rule
(:class:`offcut.daemon.app.engine.Engine`, docs/architecture.md, "Threads"): every function here
says whether it needs it; none takes it.
"""

from __future__ import annotations

from offcut.daemon.app.model import Task, task_number
from offcut.views import TaskState
from offcut.daemon.app.replies import task_view
from offcut.daemon.app.scheduler import Scheduler
from offcut.daemon.app.store import Store
from offcut.views import Decision, SnapshotStatistics, SolverStatistics, StatusView, TaskView


def task_or_archived(scheduler: Scheduler, store: Store, task_id: str) -> Task | None:
    """Task ``task_id`` from the scheduler's state, else from the state file's archive, else
    None (call under the engine's lock: the state may not change meanwhile)."""
    task = scheduler.tasks.get(task_id)
    if task is None:
        stored = store.archived_task(task_id)
        task = Task.from_dict(stored) if stored is not None else None
    return task


def live_task_views(scheduler: Scheduler, states: set[TaskState] | None, owner: str, *,
                    after: int, limit: int | None) -> list[TaskView]:
    """Views of the tasks in the scheduler's state, in submit order: those in ``states``
    (None or empty: all) of ``owner`` (empty: every owner) with a submit number above
    ``after``, at most ``limit + 1`` (None: all; the one past ``limit`` tells there are more).
    Call under the engine's lock."""
    matching = sorted((t for t in scheduler.tasks.values()
                       if task_number(t.task_id) > after
                       and (not states or t.state in states)
                       and (not owner or t.owner == owner)),
                      key=lambda t: task_number(t.task_id))
    return [task_view(t, scheduler) for t in (matching if limit is None else matching[:limit + 1])]


def with_archived(views: list[TaskView], scheduler: Scheduler, store: Store,
                  states: set[TaskState] | None, owner: str, *, after: int,
                  limit: int | None) -> tuple[list[TaskView], bool]:
    """``(views, more)``: the page of :func:`live_task_views`'s ``views`` with the archived
    finished tasks that match too (when finished states are asked for), in submit order, at
    most ``limit`` (None: all); ``more`` is True when tasks past the last one returned match.
    Call after the engine's lock is released: the archive's committed rows are read
    (:meth:`Store.archived_tasks`), so a long list never holds up an event; a task retired
    since ``views`` were made is in both and answered once."""
    finished = [s.value for s in (states or TaskState) if s.finished]
    if finished:
        seen = {v.task_id for v in views}
        archived = [task_view(Task.from_dict(d), scheduler)  # finished: no engine state
                    for d in store.archived_tasks(
                        finished, owner, after=after,
                        limit=None if limit is None else limit + 1)
                    if d["task_id"] not in seen]
        views += archived
    views.sort(key=lambda v: task_number(v.task_id))
    if limit is None or len(views) <= limit:
        return views, False
    return views[:limit], True


def status_view(scheduler: Scheduler, archived_counts: dict[TaskState, int], *,
                include_idle: bool, solver: SolverStatistics | None,
                last_decision: Decision | None, snapshots: SnapshotStatistics) -> StatusView:
    """The state in figures: tasks per state (those in the state plus ``archived_counts``),
    nodes idle, in use and awaiting their launch, the clock, the totals [samples, node-s, J]
    and the settings; idle node names only when ``include_idle``. Call under the engine's
    lock."""
    counts = {s: archived_counts.get(s, 0) for s in TaskState}
    for task in scheduler.tasks.values():
        counts[task.state] += 1
    awaiting = sum(len(t.nodes) for t in scheduler.active.values() if t.awaiting_launch)
    return StatusView(
        clock=scheduler.clock, revision=scheduler.revision, idle_nodes=len(scheduler.pool),
        nodes_in_use=len(scheduler.holder),
        idle_node_names=sorted(scheduler.pool) if include_idle else [],
        tasks_by_state=counts, solver=solver,
        last_seq=dict(scheduler.last_seq), total_samples=scheduler.total_samples,
        idle_node_seconds=scheduler.idle_node_seconds,
        used_node_seconds=scheduler.used_node_seconds, tfwd_s=scheduler.tfwd_s,
        max_running_tasks=scheduler.max_running_tasks, objective=scheduler.objective.objective,
        eta=scheduler.objective.effective_eta, task_energy_j=scheduler.task_energy_j,
        energy_j=scheduler.energy_j, last_decision=last_decision,
        snapshots=snapshots, nodes_awaiting_launch=awaiting)

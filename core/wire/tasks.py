"""The one conversion between the views of :mod:`offcut.views` (tasks, decisions, placement
updates, status, history) and their ``offcut.v1`` messages, both ways (docs/architecture.md,
"Layers"): the daemon's gRPC edge turns its answers into messages (``*_to_pb``), the client
turns the messages it receives back into views (``*_from_pb``).

Times: a view's float seconds since the epoch (None: unset) is a ``google.protobuf.Timestamp``
(unset: all zero) on the wire. A task's spec goes through :mod:`offcut.wire.specs`.
Only shapes are converted here; the daemon validates requests (:mod:`offcut.daemon.edge.protocol`).
"""

from __future__ import annotations

import math
from dataclasses import asdict

from google.protobuf.timestamp_pb2 import Timestamp

from offcut.errors import InvalidArgument
from offcut.v1 import decision_pb2, status_pb2, tasks_pb2
from offcut.views import (Decision, EnergyView, EventFigures, HistoryEntry, MeasuredCount,
                          ModelView, PlacementChange, PlacementUpdate, ProgressReply,
                          SnapshotStatistics, SolverStatistics, SolveSummary, StatusView,
                          TaskReply, TaskState, TaskView, TaskWarning)
from offcut.wire.specs import spec_to_pb, spec_view_from_pb

#: a placement change's name (``PlacementChange.change``) -> ``offcut.v1.PlacementChange``
CHANGE_TO_PB = {
    "start": decision_pb2.PLACEMENT_CHANGE_START,
    "grow": decision_pb2.PLACEMENT_CHANGE_GROW,
    "shrink": decision_pb2.PLACEMENT_CHANGE_SHRINK,
    "stop": decision_pb2.PLACEMENT_CHANGE_STOP,
    "preempted": decision_pb2.PLACEMENT_CHANGE_PREEMPTED,
    "completed": decision_pb2.PLACEMENT_CHANGE_COMPLETED,
    "cancelled": decision_pb2.PLACEMENT_CHANGE_CANCELLED,
    "failed": decision_pb2.PLACEMENT_CHANGE_FAILED,
    "restart": decision_pb2.PLACEMENT_CHANGE_RESTART,
}
CHANGE_FROM_PB = {v: k for k, v in CHANGE_TO_PB.items()}
#: :class:`TaskState` -> ``offcut.v1.TaskState``
STATE_TO_PB = {
    TaskState.QUEUED: tasks_pb2.TASK_STATE_QUEUED,
    TaskState.ADMITTED: tasks_pb2.TASK_STATE_ADMITTED,
    TaskState.RUNNING: tasks_pb2.TASK_STATE_RUNNING,
    TaskState.COMPLETED: tasks_pb2.TASK_STATE_COMPLETED,
    TaskState.CANCELLED: tasks_pb2.TASK_STATE_CANCELLED,
    TaskState.FAILED: tasks_pb2.TASK_STATE_FAILED,
}
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}


def _change_name(change: int) -> str:
    """The name of an ``offcut.v1.PlacementChange`` number (``unspecified`` or its number
    when this release does not know it)."""
    return CHANGE_FROM_PB.get(change, "unspecified" if change == 0 else str(change))


def time_to_pb(t: float | None) -> Timestamp:
    """A Timestamp of ``t`` [s since epoch] (unset for None)."""
    ts = Timestamp()
    if t is not None:
        seconds = math.floor(t)
        ts.seconds = int(seconds)
        ts.nanos = min(999_999_999, int(round((t - seconds) * 1e9)))
    return ts


def time_from_pb(ts: Timestamp) -> float | None:
    """Seconds since the epoch of a Timestamp; None when unset (all zero)."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.seconds + ts.nanos / 1e9


def _time_or_zero(ts: Timestamp) -> float:
    """Seconds since the epoch of a Timestamp that is always set in a reply (0.0 unset)."""
    return ts.seconds + ts.nanos / 1e9


def energy_to_pb(view: EnergyView | None) -> tasks_pb2.TaskEnergy | None:
    """The ``offcut.v1.TaskEnergy`` of a task's shown energy (None: unset)."""
    return tasks_pb2.TaskEnergy(**asdict(view)) if view is not None else None


def energy_from_pb(msg: tasks_pb2.TaskEnergy) -> EnergyView:
    """The view of an ``offcut.v1.TaskEnergy`` (same field names)."""
    return EnergyView(
        source=msg.source, joules=msg.joules, samples_per_joule=msg.samples_per_joule,
        generations_reported=msg.generations_reported, last_generation=msg.last_generation,
        last_generation_joules=msg.last_generation_joules,
        last_generation_ranks=msg.last_generation_ranks,
        last_generation_world_size=msg.last_generation_world_size)


def model_to_pb(model: ModelView | None) -> tasks_pb2.LearnedModel | None:
    """The ``offcut.v1.LearnedModel`` of a learned model (None for a task without reports)."""
    if model is None:
        return None
    msg = tasks_pb2.LearnedModel(
        rescale_up_s=model.rescale_up_s, rescale_down_s=model.rescale_down_s,
        curve_node_counts=model.curve_node_counts, curve_throughputs=model.curve_throughputs,
        curve_low=model.curve_low, curve_high=model.curve_high,
        measured_rescale_lost_s=model.measured_rescale_lost_s,
        measured_rescales=model.measured_rescales)
    if model.measured_rescale_up_s is not None:
        msg.measured_rescale_up_s = model.measured_rescale_up_s
    if model.measured_rescale_down_s is not None:
        msg.measured_rescale_down_s = model.measured_rescale_down_s
    for m in model.measured:
        msg.measured.add(nodes=m.nodes, samples_per_s=m.samples_per_s, seconds=m.seconds,
                         power_w=m.power_w)
    if model.last_report_time is not None:
        msg.has_report = True
        msg.last_report_time.CopyFrom(time_to_pb(model.last_report_time))
        msg.last_samples_done = model.last_samples_done
        if model.last_energy_j is not None:
            msg.last_energy_j = model.last_energy_j
    return msg


def model_from_pb(msg: tasks_pb2.LearnedModel) -> ModelView:
    """The view of an ``offcut.v1.LearnedModel`` (``last_report_time`` None without
    ``has_report``; the optional figures None when absent)."""
    view = ModelView(
        rescale_up_s=msg.rescale_up_s, rescale_down_s=msg.rescale_down_s,
        measured_rescale_up_s=(msg.measured_rescale_up_s
                               if msg.HasField("measured_rescale_up_s") else None),
        measured_rescale_down_s=(msg.measured_rescale_down_s
                                 if msg.HasField("measured_rescale_down_s") else None),
        measured=[MeasuredCount(nodes=m.nodes, samples_per_s=m.samples_per_s,
                                seconds=m.seconds, power_w=m.power_w) for m in msg.measured],
        curve_node_counts=list(msg.curve_node_counts),
        curve_throughputs=list(msg.curve_throughputs), curve_low=list(msg.curve_low),
        curve_high=list(msg.curve_high), measured_rescale_lost_s=msg.measured_rescale_lost_s,
        measured_rescales=msg.measured_rescales)
    if msg.has_report:
        view.last_report_time = _time_or_zero(msg.last_report_time)
        view.last_samples_done = msg.last_samples_done
        view.last_energy_j = msg.last_energy_j if msg.HasField("last_energy_j") else None
    return view


def warning_to_pb(w: TaskWarning) -> decision_pb2.TaskWarning:
    """The ``offcut.v1.TaskWarning`` of a warning."""
    return decision_pb2.TaskWarning(kind=w.kind, message=w.message, time=time_to_pb(w.time),
                                    generation=w.generation, task_id=w.task_id)


def warning_from_pb(msg: decision_pb2.TaskWarning) -> TaskWarning:
    """The view of an ``offcut.v1.TaskWarning``."""
    return TaskWarning(kind=msg.kind, message=msg.message, time=_time_or_zero(msg.time),
                       generation=msg.generation, task_id=msg.task_id)


def task_to_pb(task: TaskView) -> tasks_pb2.Task:
    """The ``offcut.v1.Task`` of a task view (``work_reached_time``, ``generation_time``
    present only when set)."""
    msg = tasks_pb2.Task(
        energy_j=task.energy_j, power_w=task.power_w, model=model_to_pb(task.model),
        task_id=task.task_id, spec=spec_to_pb(task.spec), owner=task.owner,
        state=STATE_TO_PB[task.state], submit_time=time_to_pb(task.submit_time),
        admit_time=time_to_pb(task.admit_time), finish_time=time_to_pb(task.finish_time),
        nodes=task.nodes, work_done_samples=task.work_done_samples,
        rate_samples_per_s=task.rate_samples_per_s, rescales=task.rescales,
        preemptions=task.preemptions, launches=task.launches, last_run=task.last_run,
        generation=task.generation, failed_runs=task.failed_runs,
        failure_reason=task.failure_reason, energy=energy_to_pb(task.energy),
        samples_redone=task.samples_redone,
        failures_without_progress=task.failures_without_progress,
        warnings=[warning_to_pb(w) for w in task.warnings],
        started_generation=task.started_generation)
    if task.work_reached_time is not None:
        msg.work_reached_time.CopyFrom(time_to_pb(task.work_reached_time))
    if task.generation_time is not None:
        msg.generation_time.CopyFrom(time_to_pb(task.generation_time))
    return msg


def task_from_pb(msg: tasks_pb2.Task) -> TaskView:
    """The view of an ``offcut.v1.Task``: times [s since epoch] None where unset, the model
    None when absent, the spec as answered (unchecked: :func:`offcut.wire.specs.spec_view_from_pb`).

    Raises:
        InvalidArgument: an unknown task state (``state``).
    """
    if msg.state not in STATE_FROM_PB:
        raise InvalidArgument(f"unknown task state {msg.state}", "state")
    return TaskView(
        task_id=msg.task_id, spec=spec_view_from_pb(msg.spec), owner=msg.owner,
        state=STATE_FROM_PB[msg.state], submit_time=time_from_pb(msg.submit_time),
        admit_time=time_from_pb(msg.admit_time), finish_time=time_from_pb(msg.finish_time),
        nodes=list(msg.nodes), work_done_samples=msg.work_done_samples,
        rate_samples_per_s=msg.rate_samples_per_s, rescales=msg.rescales,
        preemptions=msg.preemptions, launches=msg.launches, last_run=msg.last_run,
        generation=msg.generation, failed_runs=msg.failed_runs,
        failure_reason=msg.failure_reason, energy_j=msg.energy_j, power_w=msg.power_w,
        model=model_from_pb(msg.model) if msg.HasField("model") else None,
        energy=energy_from_pb(msg.energy) if msg.HasField("energy") else None,
        samples_redone=msg.samples_redone,
        failures_without_progress=msg.failures_without_progress,
        warnings=[warning_from_pb(w) for w in msg.warnings],
        work_reached_time=time_from_pb(msg.work_reached_time),
        started_generation=msg.started_generation,
        generation_time=time_from_pb(msg.generation_time))


def placement_to_pb(p: PlacementChange) -> decision_pb2.Placement:
    """The ``offcut.v1.Placement`` of one placement change."""
    return decision_pb2.Placement(
        task_id=p.task_id, task_name=p.task_name, change=CHANGE_TO_PB[p.change], nodes=p.nodes,
        previous_node_count=p.previous_count, rate_samples_per_s=p.rate,
        work_done_samples=p.work_done, total_work_samples=p.total_work, time=time_to_pb(p.time),
        generation=p.generation)


def placement_from_pb(msg: decision_pb2.Placement) -> PlacementChange:
    """The view of an ``offcut.v1.Placement`` (``change`` by name)."""
    return PlacementChange(
        task_id=msg.task_id, task_name=msg.task_name, change=_change_name(msg.change),
        nodes=list(msg.nodes), previous_count=msg.previous_node_count,
        rate=msg.rate_samples_per_s, work_done=msg.work_done_samples,
        total_work=msg.total_work_samples, time=_time_or_zero(msg.time),
        generation=msg.generation)


def decision_to_pb(d: Decision, duplicate: bool = False) -> decision_pb2.Decision:
    """The ``offcut.v1.Decision`` of a decision (``sent_time`` absent when the sender gave
    none); ``duplicate`` (or the decision's own flag): answered from the journal."""
    msg = decision_pb2.Decision(
        time=time_to_pb(d.time), source=d.source, seq=d.seq, revision=d.revision,
        duplicate=duplicate or d.duplicate,
        placements=[placement_to_pb(p) for p in d.placements],
        stats=decision_pb2.EventStats(**vars(d.stats)),  # (flat dataclasses: no asdict copy)
        solve=decision_pb2.SolveStats(**vars(d.solve)),
        ignored_nodes=d.ignored_nodes, completed_task_ids=d.completed_task_ids,
        warnings=[warning_to_pb(w) for w in d.warnings])
    if d.sent_time is not None:
        msg.sent_time.CopyFrom(time_to_pb(d.sent_time))
    return msg


def decision_from_pb(msg: decision_pb2.Decision) -> Decision:
    """The view of an ``offcut.v1.Decision`` (``sent_time`` None when absent)."""
    s, v = msg.stats, msg.solve
    return Decision(
        time=_time_or_zero(msg.time), source=msg.source, seq=msg.seq, revision=msg.revision,
        placements=[placement_from_pb(p) for p in msg.placements],
        stats=EventFigures(
            interval_s=s.interval_s, progress_samples=s.progress_samples,
            rate_samples_per_s=s.rate_samples_per_s, rescale_cost_samples=s.rescale_cost_samples,
            nodes_left=s.nodes_left, tasks_preempted=s.tasks_preempted,
            nodes_joined=s.nodes_joined, admitted_tasks=s.admitted_tasks,
            idle_nodes=s.idle_nodes, running_tasks=s.running_tasks,
            nodes_in_use=s.nodes_in_use, preemption_cost_samples=s.preemption_cost_samples,
            tasks_completed=s.tasks_completed),
        solve=SolveSummary(
            requested_solver=v.requested_solver, solver=v.solver, status=v.status,
            objective=v.objective, bound=v.bound, solve_ms=v.solve_ms,
            fallback_reason=v.fallback_reason, solves=v.solves),
        ignored_nodes=list(msg.ignored_nodes), completed_task_ids=list(msg.completed_task_ids),
        sent_time=time_from_pb(msg.sent_time),
        warnings=[warning_from_pb(w) for w in msg.warnings], duplicate=msg.duplicate)


def task_reply_from_pb(msg: tasks_pb2.SubmitTaskResponse | tasks_pb2.CancelTaskResponse
                       | tasks_pb2.ReportTaskRunResponse | tasks_pb2.ReportEnergyResponse
                       ) -> TaskReply:
    """The view of an answer about one task (its ``task`` and ``decision``)."""
    return TaskReply(task=task_from_pb(msg.task), decision=decision_from_pb(msg.decision))


def progress_reply_from_pb(msg: tasks_pb2.ReportProgressResponse) -> ProgressReply:
    """The view of an answer to a progress report (its ``decision`` and ``tasks``)."""
    return ProgressReply(decision=decision_from_pb(msg.decision),
                         tasks=[task_from_pb(t) for t in msg.tasks])


def update_to_pb(u: PlacementUpdate) -> tasks_pb2.PlacementUpdate:
    """The ``offcut.v1.PlacementUpdate`` of one revision's changes and warnings (``owners``
    stays in the daemon)."""
    return tasks_pb2.PlacementUpdate(revision=u.revision, time=time_to_pb(u.time), cause=u.cause,
                                     placements=[placement_to_pb(p) for p in u.placements],
                                     warnings=[warning_to_pb(w) for w in u.warnings])


def update_from_pb(msg: tasks_pb2.PlacementUpdate) -> PlacementUpdate:
    """The view of an ``offcut.v1.PlacementUpdate`` (``owners`` empty)."""
    return PlacementUpdate(revision=msg.revision, time=_time_or_zero(msg.time), cause=msg.cause,
                           placements=[placement_from_pb(p) for p in msg.placements],
                           warnings=[warning_from_pb(w) for w in msg.warnings])


def history_entry_to_pb(entry: HistoryEntry) -> status_pb2.HistoryEntry:
    """The ``offcut.v1.HistoryEntry`` of one journal entry."""
    msg = status_pb2.HistoryEntry(revision=entry.revision, kind=entry.kind)
    if entry.decision is not None:
        msg.decision.CopyFrom(decision_to_pb(entry.decision))
    if entry.task is not None:
        msg.task.CopyFrom(task_to_pb(entry.task))
    return msg


def history_entry_from_pb(msg: status_pb2.HistoryEntry) -> HistoryEntry:
    """The view of an ``offcut.v1.HistoryEntry`` (``decision``, ``task`` None when absent)."""
    return HistoryEntry(revision=msg.revision, kind=msg.kind,
                        decision=(decision_from_pb(msg.decision)
                                  if msg.HasField("decision") else None),
                        task=task_from_pb(msg.task) if msg.HasField("task") else None)


def solver_statistics_to_pb(s: SolverStatistics) -> status_pb2.SolverStatistics:
    """The ``offcut.v1.SolverStatistics`` of the solver statistics (same field names)."""
    return status_pb2.SolverStatistics(**asdict(s))


def solver_statistics_from_pb(msg: status_pb2.SolverStatistics) -> SolverStatistics:
    """The view of an ``offcut.v1.SolverStatistics``."""
    return SolverStatistics(
        configured_solver=msg.configured_solver, decisions=msg.decisions,
        decision_ms_p50=msg.decision_ms_p50, decision_ms_p95=msg.decision_ms_p95,
        decision_ms_p99=msg.decision_ms_p99, decision_ms_max=msg.decision_ms_max,
        fallbacks=msg.fallbacks, solves_by_backend=dict(msg.solves_by_backend),
        last_fallback_reason=msg.last_fallback_reason)


def status_to_pb(v: StatusView) -> status_pb2.StatusResponse:
    """The ``offcut.v1.StatusResponse`` of the daemon's status."""
    counts = v.tasks_by_state
    resp = status_pb2.StatusResponse(
        clock=time_to_pb(v.clock), revision=v.revision, idle_nodes=v.idle_nodes,
        nodes_in_use=v.nodes_in_use, idle_node_names=v.idle_node_names,
        queued_tasks=counts[TaskState.QUEUED], admitted_tasks=counts[TaskState.ADMITTED],
        running_tasks=counts[TaskState.RUNNING], completed_tasks=counts[TaskState.COMPLETED],
        cancelled_tasks=counts[TaskState.CANCELLED], failed_tasks=counts[TaskState.FAILED],
        solver=solver_statistics_to_pb(v.solver) if v.solver is not None else None,
        last_seq=v.last_seq,
        total_samples=v.total_samples, idle_node_seconds=v.idle_node_seconds,
        used_node_seconds=v.used_node_seconds, tfwd_s=v.tfwd_s,
        max_running_tasks=v.max_running_tasks, objective=v.objective, eta=v.eta,
        task_energy_j=v.task_energy_j, energy_j=v.energy_j,
        nodes_awaiting_launch=v.nodes_awaiting_launch, clock_mode=v.clock_mode)
    if v.last_decision is not None:
        resp.last_decision.CopyFrom(decision_to_pb(v.last_decision))
    if v.snapshots is not None:
        resp.snapshots.CopyFrom(status_pb2.SnapshotStatistics(**asdict(v.snapshots)))
    return resp


def status_from_pb(msg: status_pb2.StatusResponse) -> StatusView:
    """The view of an ``offcut.v1.StatusResponse`` (``clock`` None before any event; the
    last decision, solver and snapshot statistics None when absent)."""
    snap = msg.snapshots
    return StatusView(
        clock=time_from_pb(msg.clock), revision=msg.revision, idle_nodes=msg.idle_nodes,
        nodes_in_use=msg.nodes_in_use, idle_node_names=list(msg.idle_node_names),
        tasks_by_state={TaskState.QUEUED: msg.queued_tasks,
                        TaskState.ADMITTED: msg.admitted_tasks,
                        TaskState.RUNNING: msg.running_tasks,
                        TaskState.COMPLETED: msg.completed_tasks,
                        TaskState.CANCELLED: msg.cancelled_tasks,
                        TaskState.FAILED: msg.failed_tasks},
        solver=solver_statistics_from_pb(msg.solver) if msg.HasField("solver") else None,
        last_seq=dict(msg.last_seq), total_samples=msg.total_samples,
        idle_node_seconds=msg.idle_node_seconds, used_node_seconds=msg.used_node_seconds,
        tfwd_s=msg.tfwd_s, max_running_tasks=msg.max_running_tasks, objective=msg.objective,
        eta=msg.eta, task_energy_j=msg.task_energy_j, energy_j=msg.energy_j,
        last_decision=(decision_from_pb(msg.last_decision)
                       if msg.HasField("last_decision") else None),
        snapshots=(SnapshotStatistics(count=snap.count, ms_p50=snap.ms_p50, ms_p99=snap.ms_p99,
                                      ms_max=snap.ms_max, last_ms=snap.last_ms,
                                      last_revision=snap.last_revision)
                   if msg.HasField("snapshots") else None),
        nodes_awaiting_launch=msg.nodes_awaiting_launch, clock_mode=msg.clock_mode)

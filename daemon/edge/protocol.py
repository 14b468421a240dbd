"""Translation between ``offcut.v1`` messages and the application's types (events in,
:mod:`offcut.daemon.app.replies` out): the gRPC edge's only knowledge of the wire format.

Only shapes are checked here (types, required fields); the core validates values.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from google.protobuf.timestamp_pb2 import Timestamp

from offcut.errors import InvalidArgument
from offcut.daemon.app.model import (CancelEvent, EnergyEvent, Limits, NodeEvent, NodeKind,
                                 ProgressEvent, ProgressItem, ProgressReport, SubmitEvent,
                                 TaskRunEvent, TaskSpec, TaskState)
from offcut.daemon.app.replies import (Decision, EnergyView, ModelView, PlacementUpdate,
                                   SolverStatistics, StatusView, TaskView)
from offcut.daemon.app.scheduler import PlacementChange
from offcut.v1 import decision_pb2, nodes_pb2, status_pb2, tasks_pb2

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
STATE_TO_PB = {
    TaskState.QUEUED: tasks_pb2.TASK_STATE_QUEUED,
    TaskState.ADMITTED: tasks_pb2.TASK_STATE_ADMITTED,
    TaskState.RUNNING: tasks_pb2.TASK_STATE_RUNNING,
    TaskState.COMPLETED: tasks_pb2.TASK_STATE_COMPLETED,
    TaskState.CANCELLED: tasks_pb2.TASK_STATE_CANCELLED,
    TaskState.FAILED: tasks_pb2.TASK_STATE_FAILED,
}
RUN_STATE_FROM_PB = {
    tasks_pb2.RUN_STATE_STARTED: "started",
    tasks_pb2.RUN_STATE_PREEMPTED: "preempted",
    tasks_pb2.RUN_STATE_FINISHED: "finished",
    tasks_pb2.RUN_STATE_FAILED: "failed",
    tasks_pb2.RUN_STATE_INTERRUPTED: "interrupted",
}
PB_TO_STATE = {v: k for k, v in STATE_TO_PB.items()}

#: the last second a ``google.protobuf.Timestamp`` may hold (9999-12-31T23:59:59Z)
MAX_TIMESTAMP_SECONDS = 253_402_300_799
#: sequence numbers are stored as SQLite integers (signed 64-bit)
MAX_SEQ = 2**63 - 1


def time_from_pb(ts: Timestamp, field: str, *, required: bool, default: float | None = None) -> float:
    """Seconds since the epoch from a Timestamp; unset -> ``default`` or InvalidArgument.
    Times before 1970 or after 9999-12-31 (outside Timestamp's range) are InvalidArgument."""
    if ts.seconds == 0 and ts.nanos == 0:
        if required or default is None:
            raise InvalidArgument("is required", field)
        return default
    if not 0 <= ts.nanos < 1_000_000_000 or not 0 <= ts.seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(f"is not a valid timestamp between 1970 and 9999 (seconds "
                              f"{ts.seconds}, nanos {ts.nanos})", field)
    return ts.seconds + ts.nanos / 1e9


def time_to_pb(t: float | None) -> Timestamp:
    """A Timestamp from seconds since the epoch (unset for None)."""
    ts = Timestamp()
    if t is not None:
        seconds = math.floor(t)
        ts.seconds = int(seconds)
        ts.nanos = min(999_999_999, int(round((t - seconds) * 1e9)))
    return ts


def sent_time_from_pb(ts: Timestamp, field: str) -> float | None:
    """The time [s since epoch] a sender stamped in ``field``; None when unset. Outside
    Timestamp's range (before 1970, after 9999) is InvalidArgument naming ``field``."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return time_from_pb(ts, field, required=True)


def node_event_from_pb(msg: nodes_pb2.NodeEvent | nodes_pb2.NodeSnapshot, now: float, *,
                       snapshot: bool) -> NodeEvent:
    """A core NodeEvent from ReportNodes / SyncNodes at the sender's ``time`` (``now`` [s
    since epoch] when unset; which time is applied is :mod:`offcut.daemon.edge.event_times`'
    choice); InvalidArgument when ``seq`` does not fit a signed 64-bit integer."""
    if msg.seq > MAX_SEQ:
        raise InvalidArgument(f"must be at most 2^63 - 1, got {msg.seq}", "seq")
    sent = sent_time_from_pb(msg.time, "time")
    return NodeEvent(
        time=now if sent is None else sent, source=msg.source, seq=msg.seq,
        idle=tuple(msg.idle), preempted=() if snapshot else tuple(msg.preempted),
        snapshot=snapshot, sent_time=sent,
        kinds=tuple((k.node, NodeKind(k.gpus, tuple(sorted(set(k.features)))))
                    for k in msg.kinds) if snapshot else ())


def spec_from_pb(spec: tasks_pb2.TaskSpec, limits: Limits | None = None) -> TaskSpec:
    """A validated :class:`TaskSpec` (within ``limits`` when given); raises InvalidArgument
    naming ``spec.<field>``."""
    return TaskSpec.create(
        limits=limits, name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
        node_counts=list(spec.node_counts), throughputs=list(spec.throughputs),
        objective_values=list(spec.objective_values), rescale_up_s=spec.rescale_up_s,
        rescale_down_s=spec.rescale_down_s, total_work_samples=spec.total_work_samples,
        command=list(spec.command), reports_progress=spec.reports_progress,
        power_w=list(spec.power_w), zeus_job_id=spec.zeus_job_id,
        gpus_per_node=spec.gpus_per_node, constraint=list(spec.constraint),
        procs_per_node=spec.procs_per_node)


def spec_to_pb(spec: TaskSpec) -> tasks_pb2.TaskSpec:
    """The protocol form of a spec."""
    return tasks_pb2.TaskSpec(
        name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
        node_counts=spec.node_counts, throughputs=spec.throughputs,
        objective_values=spec.objective_values, rescale_up_s=spec.rescale_up_s,
        rescale_down_s=spec.rescale_down_s, total_work_samples=spec.total_work_samples,
        command=spec.command, reports_progress=spec.reports_progress, power_w=spec.power_w,
        zeus_job_id=spec.zeus_job_id, gpus_per_node=spec.gpus_per_node,
        constraint=spec.constraint, procs_per_node=spec.procs_per_node)


def submit_from_pb(req: tasks_pb2.SubmitTaskRequest, now: float,
                   limits: Limits | None = None) -> SubmitEvent:
    """A SubmitEvent at the sender's ``submit_time`` (``now`` [s since epoch] when unset);
    the spec is checked against ``limits`` when given."""
    if not req.HasField("spec"):
        raise InvalidArgument("is required", "spec")
    sent = sent_time_from_pb(req.submit_time, "submit_time")
    return SubmitEvent(time=now if sent is None else sent, spec=spec_from_pb(req.spec, limits),
                       owner=req.owner or "anonymous", request_id=req.request_id,
                       sent_time=sent)


def cancel_from_pb(req: tasks_pb2.CancelTaskRequest, now: float) -> CancelEvent:
    """A CancelEvent at the sender's ``time`` (``now`` [s since epoch] when unset)."""
    if not req.task_id:
        raise InvalidArgument("is required", "task_id")
    sent = sent_time_from_pb(req.time, "time")
    return CancelEvent(time=now if sent is None else sent, task_id=req.task_id, sent_time=sent,
                       request_id=req.request_id)


#: how far [s] a report's time may lie ahead of the daemon's wall clock (clock skew)
MAX_REPORT_SKEW_S = 300.0


def _not_ahead(t: float, now: float, field: str) -> float:
    """``t`` [s since epoch], unless it lies more than :data:`MAX_REPORT_SKEW_S` after ``now``
    (the daemon's wall clock): then InvalidArgument naming ``field``. A report's time moves the
    event clock; one from the future would make every later node event "older"."""
    if t > now + MAX_REPORT_SKEW_S:
        raise InvalidArgument(f"{t:.3f} is {t - now:.0f} s after the daemon's clock "
                              f"({now:.3f}); reports carry the time they were measured", field)
    return t


def task_run_from_pb(req: tasks_pb2.TaskRunReport, now: float) -> TaskRunEvent:
    """A TaskRunEvent at the sender's ``time`` (``now`` [s since epoch] when unset; one more
    than :data:`MAX_REPORT_SKEW_S` after ``now`` is InvalidArgument)."""
    if not req.task_id:
        raise InvalidArgument("is required", "task_id")
    if req.state not in RUN_STATE_FROM_PB:
        raise InvalidArgument(f"must be one of {', '.join(RUN_STATE_FROM_PB.values())}", "state")
    sent = sent_time_from_pb(req.time, "time")
    if sent is not None:
        _not_ahead(sent, now, "time")
    generation = req.generation if req.HasField("generation") else None
    if generation is not None and generation > MAX_SEQ:
        raise InvalidArgument(f"must be at most 2^63 - 1, got {generation}", "generation")
    return TaskRunEvent(time=now if sent is None else sent, task_id=req.task_id,
                        state=RUN_STATE_FROM_PB[req.state], node=req.node, job_id=req.job_id,
                        exit_code=req.exit_code, message=req.message,
                        request_id=req.request_id, generation=generation, sent_time=sent,
                        stop_ignored=req.stop_ignored)


def progress_from_pb(req: tasks_pb2.ReportProgressRequest, now: float) -> ProgressEvent:
    """A ProgressEvent at the latest report's time (``now`` [s since epoch] when there is no
    report); raises InvalidArgument naming ``reports[i].<field>`` for a missing task id or
    time, or a time more than :data:`MAX_REPORT_SKEW_S` after ``now`` (it would move the
    daemon's event clock into the future and make every later node event "older"). The
    figures are checked by the core against each task's history."""
    items = []
    for i, r in enumerate(req.reports):
        where = f"reports[{i}]."
        if not r.task_id:
            raise InvalidArgument("is required", where + "task_id")
        t = _not_ahead(time_from_pb(r.time, where + "time", required=True), now,
                       where + "time")
        items.append(ProgressItem(r.task_id, ProgressReport(
            time=t, samples_done=r.samples_done, nodes=r.nodes,
            energy_j=r.energy_j if r.HasField("energy_j") else None)))
    # the figures are checked by the core, against each task's history (TaskLearner.check);
    # an empty request is refused there too
    return ProgressEvent(time=max((r.report.time for r in items), default=now), reports=tuple(items),
                         request_id=req.request_id)


def energy_from_pb(req: tasks_pb2.EnergyReport, now: float) -> EnergyEvent:
    """An EnergyEvent at ``now`` [s since epoch] (the report carries no time); InvalidArgument
    naming ``task_id`` when it is missing, ``generation`` beyond a signed 64-bit integer. The
    figures are checked by the core (``offcut.daemon.app.scheduler.energy``)."""
    if not req.task_id:
        raise InvalidArgument("is required", "task_id")
    if req.generation > MAX_SEQ:
        raise InvalidArgument(f"must be at most 2^63 - 1, got {req.generation}", "generation")
    return EnergyEvent(time=now, task_id=req.task_id, generation=req.generation,
                       rank=req.rank, joules=req.joules, request_id=req.request_id)


def energy_to_pb(view: EnergyView | None) -> tasks_pb2.TaskEnergy | None:
    """The protocol form of a task's shown energy (None: unset)."""
    return tasks_pb2.TaskEnergy(**asdict(view)) if view is not None else None


def model_to_pb(model: ModelView | None) -> tasks_pb2.LearnedModel | None:
    """The protocol form of a learned model (None for a task without reports)."""
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


def task_to_pb(task: TaskView) -> tasks_pb2.Task:
    """The protocol form of a task view (``work_reached_time``, ``generation_time`` present
    only when set)."""
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
        warnings=[warning_to_pb(task.task_id, w) for w in task.warnings],
        started_generation=task.started_generation)
    if task.work_reached_time is not None:
        msg.work_reached_time.CopyFrom(time_to_pb(task.work_reached_time))
    if task.generation_time is not None:
        msg.generation_time.CopyFrom(time_to_pb(task.generation_time))
    return msg


def decision_to_pb(d: Decision, duplicate: bool = False) -> decision_pb2.Decision:
    """The protocol form of a decision (``sent_time`` absent when the sender gave none)."""
    msg = decision_pb2.Decision(
        time=time_to_pb(d.time), source=d.source, seq=d.seq, revision=d.revision,
        duplicate=duplicate, placements=[placement_to_pb(p) for p in d.placements],
        stats=decision_pb2.EventStats(**vars(d.stats)),  # (flat dataclasses: no asdict copy)
        solve=decision_pb2.SolveStats(**vars(d.solve)),
        ignored_nodes=d.ignored_nodes, completed_task_ids=d.completed_task_ids,
        warnings=[warning_to_pb(w["task_id"], w) for w in d.warnings])
    if d.sent_time is not None:
        msg.sent_time.CopyFrom(time_to_pb(d.sent_time))
    return msg


def placement_to_pb(p: PlacementChange) -> decision_pb2.Placement:
    """The protocol form of one placement change."""
    return decision_pb2.Placement(
        task_id=p.task_id, task_name=p.task_name, change=CHANGE_TO_PB[p.change], nodes=p.nodes,
        previous_node_count=p.previous_count, rate_samples_per_s=p.rate,
        work_done_samples=p.work_done, total_work_samples=p.total_work, time=time_to_pb(p.time),
        generation=p.generation)


def warning_to_pb(task_id: str, w: dict) -> decision_pb2.TaskWarning:
    """The protocol form of one ``Task.warnings`` entry of task ``task_id``."""
    return decision_pb2.TaskWarning(kind=w["kind"], message=w["message"],
                                    time=time_to_pb(w["time"]), generation=w["generation"],
                                    task_id=task_id)


def update_to_pb(u: PlacementUpdate) -> tasks_pb2.PlacementUpdate:
    """The protocol form of one revision's placement changes and warnings."""
    return tasks_pb2.PlacementUpdate(revision=u.revision, time=time_to_pb(u.time), cause=u.cause,
                                     placements=[placement_to_pb(p) for p in u.placements],
                                     warnings=[warning_to_pb(t, w) for t, w in u.warnings])


def solver_statistics_to_pb(s: SolverStatistics) -> status_pb2.SolverStatistics:
    """The protocol form of the solver statistics (the same field names)."""
    return status_pb2.SolverStatistics(**asdict(s))


def status_to_pb(v: StatusView) -> status_pb2.StatusResponse:
    """The Status reply."""
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
        nodes_awaiting_launch=v.nodes_awaiting_launch)
    if v.last_decision is not None:
        resp.last_decision.CopyFrom(decision_to_pb(v.last_decision))
    if v.snapshots is not None:
        resp.snapshots.CopyFrom(status_pb2.SnapshotStatistics(**asdict(v.snapshots)))
    return resp

"""Translation between ``offcut.v1`` messages and the core's domain types.

Only shapes are checked here (types, required fields); the core validates values.
"""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

from offcut.errors import InvalidArgument
from offcut.daemon.core import Core, Outcome, PlacementChange
from offcut.daemon.model import (CancelEvent, Limits, NodeEvent, ProgressEvent, ProgressItem,
                                 ProgressReport,
                                 SubmitEvent, Task, TaskRunEvent,
                                 TaskSpec, TaskState)
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


def node_event_from_pb(msg: nodes_pb2.NodeEvent | nodes_pb2.NodeSnapshot, *, snapshot: bool) -> NodeEvent:
    """A core NodeEvent from ReportNodes / SyncNodes; InvalidArgument when ``time`` is unset
    or ``seq`` does not fit a signed 64-bit integer."""
    if msg.seq > MAX_SEQ:
        raise InvalidArgument(f"must be at most 2^63 - 1, got {msg.seq}", "seq")
    return NodeEvent(
        time=time_from_pb(msg.time, "time", required=True),
        source=msg.source, seq=msg.seq, idle=tuple(msg.idle),
        preempted=() if snapshot else tuple(msg.preempted), snapshot=snapshot)


def spec_from_pb(spec: tasks_pb2.TaskSpec, limits: Limits | None = None) -> TaskSpec:
    """A validated :class:`TaskSpec` (within ``limits`` when given); raises InvalidArgument
    naming ``spec.<field>``."""
    return TaskSpec.create(
        limits=limits, name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
        node_counts=list(spec.node_counts), throughputs=list(spec.throughputs),
        objective_values=list(spec.objective_values), rescale_up_s=spec.rescale_up_s,
        rescale_down_s=spec.rescale_down_s, total_work_samples=spec.total_work_samples,
        command=list(spec.command), reports_progress=spec.reports_progress,
        power_w=list(spec.power_w), zeus_job_id=spec.zeus_job_id)


def spec_to_pb(spec: TaskSpec) -> tasks_pb2.TaskSpec:
    """The protocol form of a spec."""
    return tasks_pb2.TaskSpec(
        name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
        node_counts=spec.node_counts, throughputs=spec.throughputs,
        objective_values=spec.objective_values, rescale_up_s=spec.rescale_up_s,
        rescale_down_s=spec.rescale_down_s, total_work_samples=spec.total_work_samples,
        command=spec.command, reports_progress=spec.reports_progress, power_w=spec.power_w,
        zeus_job_id=spec.zeus_job_id)


def submit_from_pb(req: tasks_pb2.SubmitTaskRequest, clock: float | None, now: float,
                   limits: Limits | None = None) -> SubmitEvent:
    """A SubmitEvent; an unset submit_time means max(now, clock) [s since epoch]; the spec
    is checked against ``limits`` when given."""
    if not req.HasField("spec"):
        raise InvalidArgument("is required", "spec")
    t = time_from_pb(req.submit_time, "submit_time", required=False,
                     default=now if clock is None else max(now, clock))
    return SubmitEvent(time=t, spec=spec_from_pb(req.spec, limits), owner=req.owner or "anonymous",
                       request_id=req.request_id)


def cancel_from_pb(req: tasks_pb2.CancelTaskRequest, clock: float | None, now: float) -> CancelEvent:
    """A CancelEvent; an unset time means max(now, clock) [s since epoch]."""
    if not req.task_id:
        raise InvalidArgument("is required", "task_id")
    t = time_from_pb(req.time, "time", required=False,
                     default=now if clock is None else max(now, clock))
    return CancelEvent(time=t, task_id=req.task_id)


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


def task_run_from_pb(req: tasks_pb2.TaskRunReport, clock: float | None, now: float) -> TaskRunEvent:
    """A TaskRunEvent; an unset time means max(now, clock) [s since epoch]; a time before
    the clock is moved to the clock (run reports are not ordered with node events)."""
    if not req.task_id:
        raise InvalidArgument("is required", "task_id")
    if req.state not in RUN_STATE_FROM_PB:
        raise InvalidArgument(f"must be one of {', '.join(RUN_STATE_FROM_PB.values())}", "state")
    default = now if clock is None else max(now, clock)
    t = time_from_pb(req.time, "time", required=False, default=default)
    if req.HasField("time"):
        _not_ahead(t, now, "time")
    generation = req.generation if req.HasField("generation") else None
    if generation is not None and generation > MAX_SEQ:
        raise InvalidArgument(f"must be at most 2^63 - 1, got {generation}", "generation")
    return TaskRunEvent(time=t, task_id=req.task_id, state=RUN_STATE_FROM_PB[req.state],
                        node=req.node, job_id=req.job_id, exit_code=req.exit_code,
                        message=req.message, request_id=req.request_id, generation=generation)


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


def model_to_pb(task: Task, core: Core) -> tasks_pb2.LearnedModel | None:
    """What the task's learner knows (None for a task without reports)."""
    if task.learner is None:
        return None
    up, down = core.rescale_costs(task)
    msg = tasks_pb2.LearnedModel(rescale_up_s=up, rescale_down_s=down)
    measured_up, measured_down = task.learner.measured_rescale_s()
    if measured_up is not None:
        msg.measured_rescale_up_s = measured_up
    if measured_down is not None:
        msg.measured_rescale_down_s = measured_down
    for n, m in sorted(task.learner.measured().items()):
        msg.measured.add(nodes=n, samples_per_s=m["rate"], seconds=m["seconds"],
                         power_w=m["power_w"] or 0.0)
    last = task.learner.last_report
    if last is not None:
        msg.has_report = True
        msg.last_report_time.CopyFrom(time_to_pb(last[0]))
        msg.last_samples_done = last[1]
        if last[2] is not None:
            msg.last_energy_j = last[2]
    if task.spec.learned and not task.state.finished:
        ns, ps = core.learned_curve(task)
        msg.curve_node_counts.extend(int(n) for n in ns)
        msg.curve_throughputs.extend(float(p) for p in ps)
        prior = core.prior_rate()
        bands = [task.learner.band(int(n), prior) for n in ns]
        msg.curve_low.extend(b[0] for b in bands)
        msg.curve_high.extend(b[2] for b in bands)
    return msg


def task_to_pb(task: Task, core: Core) -> tasks_pb2.Task:
    """A task with its progress projected to the core's clock."""
    return tasks_pb2.Task(
        energy_j=task.energy_j, power_w=task.power, model=model_to_pb(task, core),
        task_id=task.task_id, spec=spec_to_pb(task.spec), owner=task.owner,
        state=STATE_TO_PB[task.state], submit_time=time_to_pb(task.submit_time),
        admit_time=time_to_pb(task.admit_time), finish_time=time_to_pb(task.finish_time),
        nodes=task.nodes, work_done_samples=task.work_done, rate_samples_per_s=task.rate,
        rescales=task.rescales, preemptions=task.preemptions, launches=task.launches,
        last_run=task.last_run, generation=task.generation, failed_runs=task.failed_runs,
        failure_reason=task.failure_reason)


def decision_to_pb(out: Outcome, requested_solver: str) -> decision_pb2.Decision:
    """The reply for an applied event."""
    solve = decision_pb2.SolveStats(requested_solver=requested_solver, solves=len(out.solves),
                                    solve_ms=sum(s.solve_ms for s in out.solves))
    if out.solves:
        last = out.solves[-1]
        solve.solver, solve.objective, solve.bound = last.solver, last.objective, last.bound
        solve.status = "fallback" if any(s.fallback_reason for s in out.solves) else last.status
        reasons = [s.fallback_reason for s in out.solves if s.fallback_reason]
        solve.fallback_reason = reasons[-1] if reasons else ""
    else:
        solve.status = "skipped"
    return decision_pb2.Decision(
        time=time_to_pb(out.time), source=out.source, seq=out.seq, revision=out.revision,
        placements=[placement_to_pb(p) for p in out.placements],
        stats=decision_pb2.EventStats(
            interval_s=out.interval_s, progress_samples=out.progress_samples,
            rate_samples_per_s=out.rate_samples_per_s,
            rescale_cost_samples=out.rescale_cost_samples, nodes_left=out.nodes_left,
            tasks_preempted=out.tasks_preempted, nodes_joined=out.nodes_joined,
            admitted_tasks=out.admitted_tasks, idle_nodes=out.idle_nodes,
            running_tasks=out.running_tasks, nodes_in_use=out.nodes_in_use,
            preemption_cost_samples=out.preemption_cost_samples,
            tasks_completed=len(out.completed_task_ids)),
        solve=solve, ignored_nodes=out.ignored_nodes,
        completed_task_ids=out.completed_task_ids)


def placement_to_pb(p: PlacementChange) -> decision_pb2.Placement:
    """The protocol form of one placement change."""
    return decision_pb2.Placement(
        task_id=p.task_id, task_name=p.task_name, change=CHANGE_TO_PB[p.change], nodes=p.nodes,
        previous_node_count=p.previous_count, rate_samples_per_s=p.rate,
        work_done_samples=p.work_done, total_work_samples=p.total_work, time=time_to_pb(p.time),
        generation=p.generation)


def status_to_pb(core: Core, last: decision_pb2.Decision | None, solver: status_pb2.SolverStatistics,
                 include_idle: bool) -> status_pb2.StatusResponse:
    """The Status reply (idle node names only when ``include_idle``)."""
    counts = {s: 0 for s in TaskState}
    for task in core.tasks.values():
        counts[task.state] += 1
    resp = status_pb2.StatusResponse(
        clock=time_to_pb(core.clock), revision=core.revision, idle_nodes=len(core.pool),
        nodes_in_use=len(core.holder),
        idle_node_names=sorted(core.pool) if include_idle else [],
        queued_tasks=counts[TaskState.QUEUED], admitted_tasks=counts[TaskState.ADMITTED],
        running_tasks=counts[TaskState.RUNNING], completed_tasks=counts[TaskState.COMPLETED],
        cancelled_tasks=counts[TaskState.CANCELLED], failed_tasks=counts[TaskState.FAILED],
        solver=solver,
        last_seq=core.last_seq, total_samples=core.total_samples,
        idle_node_seconds=core.idle_node_seconds, used_node_seconds=core.used_node_seconds,
        tfwd_s=core.tfwd_s, max_running_tasks=core.max_running_tasks,
        objective=core.objective.objective, eta=core.objective.effective_eta,
        task_energy_j=core.task_energy_j, energy_j=core.energy_j)
    if last is not None:
        resp.last_decision.CopyFrom(last)
    return resp

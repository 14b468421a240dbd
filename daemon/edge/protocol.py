"""Translation of ``offcut.v1`` requests into the application's events, with the checks of
their shapes (the answers go out through :mod:`offcut.wire.tasks`, the one conversion of the
views shared with the client).

Only shapes are checked here (types, required fields); the core validates values.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from offcut.errors import InvalidArgument
from offcut.daemon.app.model import (CancelEvent, EnergyEvent, NodeEvent, NodeKind, ProgressEvent, ProgressItem, ProgressReport, SubmitEvent, TaskRunEvent)
from offcut.taskspec import Limits
from offcut.v1 import nodes_pb2, tasks_pb2
from offcut.wire.specs import spec_from_pb

RUN_STATE_FROM_PB = {
    tasks_pb2.RUN_STATE_STARTED: "started",
    tasks_pb2.RUN_STATE_PREEMPTED: "preempted",
    tasks_pb2.RUN_STATE_FINISHED: "finished",
    tasks_pb2.RUN_STATE_FAILED: "failed",
    tasks_pb2.RUN_STATE_INTERRUPTED: "interrupted",
}

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

"""Python API of the daemon: ``Client`` wraps the generated ``offcut.v1`` stubs.

Example::

    from offcut.client import Client
    with Client() as c:                      # default unix socket
        print(c.status().idle_nodes)

gRPC errors are raised as :mod:`offcut.errors` exceptions (``InvalidArgument``, ``NotFound``,
``FailedPrecondition``, ``Unavailable`` ...), whose message names the offending field.
"""

from __future__ import annotations

import functools
import os
import queue
import uuid
from datetime import datetime, timezone
from typing import Iterable, Mapping

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from offcut.addresses import default_socket, normalize_address
from offcut.channel import open_channel, resolve_token
from offcut.client.retry import RetryPolicy
from offcut.errors import (DAEMON_SAYS, InvalidArgument, OffcutError, Unavailable,
                           from_rpc_error)
from offcut.taskspec import TaskSpec
from offcut.v1 import (nodes_pb2, nodes_pb2_grpc, status_pb2, status_pb2_grpc,
                       tasks_pb2, tasks_pb2_grpc, zeus_pb2, zeus_pb2_grpc)
from offcut.wire.specs import spec_to_pb
from offcut.wire import tasks as tasks_wire
from offcut.views import Decision, ProgressReply, StatusView, TaskReply, TaskState, TaskView
from offcut.wire import zeus as zeus_wire
from offcut.zeus_views import (BatchSizeJobSpec, PowerLimitSpec, PowerPlan, PowerProfile,
                               Prediction, Verdict, ZeusJob, ZeusTrial)
from grpc_health.v1 import health_pb2, health_pb2_grpc


def to_timestamp(t: float | datetime) -> Timestamp:
    """A Timestamp from seconds since the epoch (the one conversion,
    :func:`offcut.wire.tasks.time_to_pb`) or a datetime (naive = UTC)."""
    if not isinstance(t, datetime):
        return tasks_wire.time_to_pb(t)
    ts = Timestamp()
    ts.FromDatetime(t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc))
    return ts


#: ``Client.report_task_run``'s ``state`` -> ``offcut.v1.RunState`` (the daemon's
#: ``protocol.RUN_STATE_FROM_PB`` the other way round)
_RUN_STATES = {"started": tasks_pb2.RUN_STATE_STARTED, "preempted": tasks_pb2.RUN_STATE_PREEMPTED,
               "finished": tasks_pb2.RUN_STATE_FINISHED, "failed": tasks_pb2.RUN_STATE_FAILED,
               "interrupted": tasks_pb2.RUN_STATE_INTERRUPTED}


def _translate(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        retry = getattr(self, "retry", None)
        if retry is not None:  # retries idempotent calls on UNAVAILABLE, see offcut.client.retry
            return retry.call(self, method, args, kwargs)
        try:
            return method(self, *args, **kwargs)
        except grpc.RpcError as err:
            raise self._error(err) from None
    return wrapper


def _fresh_request_id(method):
    """Outside :func:`_translate`: a call whose ``request_id`` is None gets a fresh one
    (uuid4) before its first attempt, so every retry of this one logical call (the retry
    policy, :mod:`offcut.client.retry`) sends the same id and the daemon answers it from its
    stored reply; ``""`` sends none."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if kwargs.get("request_id") is None:
            kwargs["request_id"] = str(uuid.uuid4())
        return method(self, *args, **kwargs)
    return wrapper


class Stream:
    """A server stream of the daemon: iterate it for its items (the views of its messages,
    :mod:`offcut.views`); ``cancel()`` (from any
    thread) ends the iteration quietly, and so does the stream's own time limit
    (``timed=True``: a ``timeout_s`` the caller gave). Other gRPC errors are raised while
    iterating as :mod:`offcut.errors` exceptions."""

    def __init__(self, client: "Client", call, timed: bool = False, view=None):
        self._client = client
        self._call = call
        self._cancelled = False
        self._timed = timed
        self._view = view  # message -> the view yielded (None: the message itself)

    def __iter__(self):
        try:
            if self._view is None:
                yield from self._call
            else:
                for message in self._call:
                    yield self._view(message)
        except grpc.RpcError as err:
            if self._cancelled and err.code() == grpc.StatusCode.CANCELLED:
                return
            if self._timed and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return  # the time asked for is over
            raise self._client._error(err) from None
        finally:
            self._call.cancel()

    def cancel(self) -> None:
        """Stop the stream; an iteration in progress ends without an error."""
        self._cancelled = True
        self._call.cancel()


def node_event(time: float | datetime, source: str, seq: int, idle: Iterable[str] = (),
               preempted: Iterable[str] = ()) -> nodes_pb2.NodeEvent:
    """An ``offcut.v1.NodeEvent``: nodes of ``source`` that became idle / idle nodes taken
    back at ``time`` (seconds since the epoch or a datetime), its per-source ``seq`` >= 1."""
    return nodes_pb2.NodeEvent(time=to_timestamp(time), source=source, seq=seq,
                               idle=list(idle), preempted=list(preempted))


class NodeStream:
    """An open ``NodeEvents.StreamNodes`` call (:meth:`Client.stream_nodes`): :meth:`send`
    queues a node event without waiting, :meth:`receive` returns the Decision of the oldest
    unanswered one (the daemon applies and answers them in the order sent). One thread sends
    and receives; ``pending`` counts the events sent and not yet answered.

    A refused event ends the stream: :meth:`receive` raises its error (as ``report_nodes``
    would) once the Decisions before it were received; a lost daemon raises
    :class:`Unavailable`. Events sent after a refused one are not applied.
    """

    def __init__(self, client: "Client"):
        self._client = client
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._call = client.nodes.StreamNodes(self._messages())
        #: events sent and not yet answered
        self.pending = 0

    def _messages(self):
        """The request stream gRPC reads from its own thread: what :meth:`send` queued,
        until :meth:`close` queues None."""
        while True:
            message = self._outbox.get()
            if message is None:
                return
            yield message

    def send(self, time: float | datetime, source: str, seq: int, *,
             idle: Iterable[str] = (), preempted: Iterable[str] = ()) -> None:
        """Queue one node event (:func:`node_event`'s arguments); returns at once."""
        self._outbox.put(node_event(time, source, seq, idle, preempted))
        self.pending += 1

    def receive(self) -> Decision:
        """The :class:`~offcut.views.Decision` of the oldest event sent and not answered
        (blocks until it comes).

        Raises:
            InvalidArgument: nothing sent is unanswered.
            OffcutError: that event was refused (the subclass of its status), or the daemon
                went away (:class:`Unavailable`); the stream is over.
        """
        if self.pending <= 0:
            raise InvalidArgument("every event sent on this stream is answered", "receive")
        try:
            decision = next(self._call)
        except grpc.RpcError as err:
            raise self._client._error(err) from None
        except StopIteration:
            raise Unavailable(f"offcutd at {self._client.address} ended the node event "
                              "stream") from None
        self.pending -= 1
        return tasks_wire.decision_from_pb(decision)

    def close(self) -> None:
        """End the stream: at once when every event sent was answered, else cancelled (the
        events not answered may or may not have been applied)."""
        self._outbox.put(None)
        if self.pending:
            self._call.cancel()


class Client:
    """Synchronous client of one daemon.

    Args:
        address: ``unix:///path.sock`` or ``HOST:PORT``; default: ``$OFFCUT_ADDRESS``, else
            the daemon's default socket.
        timeout_s: deadline per call [s].
        token: bearer token; default ``$OFFCUT_TOKEN``, else the first line of ``token_file``
            / ``$OFFCUT_TOKEN_FILE`` (see :mod:`offcut.channel`).
        tls_ca: PEM file of the CA to trust for TCP with TLS; default ``$OFFCUT_TLS_CA``.
        munge_socket: munged's socket; without a token every call carries a MUNGE credential
            when munged runs (default ``$OFFCUT_MUNGE_SOCKET``, else
            ``/run/munge/munge.socket.2``; :func:`offcut.channel.open_channel`).
        insecure_token: send the token to a TCP address without TLS all the same (default
            ``$OFFCUT_INSECURE_TOKEN``; without it such a token is refused:
            :func:`offcut.channel.insecure_token_refusal`).
        retry: retry idempotent calls while the daemon is unavailable (restarting), see
            :mod:`offcut.client.retry` for which calls, the backoff and the deadline; None
            (default): every failure is raised at once.

    Raises:
        InvalidArgument: an unreadable or shared token file, an unreadable CA file; a token
            for a TCP address without TLS (field ``address``, unless ``insecure_token``); a
            socket folder others could write.
    """

    def __init__(self, address: str | None = None, timeout_s: float = 60.0, *,
                 token: str | None = None, token_file: str | None = None,
                 tls_ca: str | None = None, tls_server_name: str | None = None,
                 retry: RetryPolicy | None = None, munge_socket: str | None = None,
                 insecure_token: bool | None = None):
        self.retry = retry
        self.address = normalize_address(address or os.environ.get("OFFCUT_ADDRESS")
                                         or default_socket())
        self.timeout_s = timeout_s
        limit = 64 * 1024 * 1024
        token = resolve_token(token, token_file)
        self.authenticated = token is not None  # (the token itself is not kept)
        self.channel = open_channel(self.address, token=token, tls_ca=tls_ca,
                                    tls_server_name=tls_server_name, munge_socket=munge_socket,
                                    insecure_token=insecure_token,
                                    options=[
                                        ("grpc.max_receive_message_length", limit),
                                        ("grpc.max_send_message_length", limit)]
                                    + (retry.channel_options() if retry else []))
        self.nodes = nodes_pb2_grpc.NodeEventsStub(self.channel)
        self.tasks = tasks_pb2_grpc.TasksStub(self.channel)
        self.status_stub = status_pb2_grpc.StatusStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.bso = zeus_pb2_grpc.BatchSizeOptimizerStub(self.channel)
        self.plo = zeus_pb2_grpc.PowerLimitOptimizerStub(self.channel)

    def _error(self, err: grpc.RpcError) -> OffcutError:
        """The :mod:`offcut.errors` exception for a failed call (UNAVAILABLE says how to
        start the daemon at this address)."""
        if (err.code() == grpc.StatusCode.UNAVAILABLE
                and not (err.details() or "").startswith(DAEMON_SAYS)):  # (the daemon's reason)
            exc = Unavailable(
                f"cannot reach offcutd at {self.address} ({err.details()}); start it with "
                f"`offcutd --listen {self.address}` or pass the right address (--address or "
                f"$OFFCUT_ADDRESS)")
            exc.code = err.code()
            return exc
        return from_rpc_error(err)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    # ------------------------------------------------------------------ health
    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the daemon answers SERVING; raises :class:`Unavailable` after
        ``timeout_s`` seconds."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
            resp = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            raise Unavailable(f"offcutd at {self.address} did not become ready in {timeout_s:.0f} s "
                              f"({exc.__class__.__name__})") from None
        if resp.status != health_pb2.HealthCheckResponse.SERVING:
            raise Unavailable(f"offcutd at {self.address} is not serving")

    # ------------------------------------------------------------------ nodes
    @_translate
    def report_nodes(self, time: float | datetime, source: str, seq: int, *,
                     idle: Iterable[str] = (), preempted: Iterable[str] = ()) -> Decision:
        """Report nodes that became idle / idle nodes taken back; returns the
        :class:`~offcut.views.Decision` (``duplicate`` when this ``(source, seq)`` was applied
        before)."""
        return tasks_wire.decision_from_pb(self.nodes.ReportNodes(
            node_event(time, source, seq, idle, preempted), timeout=self.timeout_s))

    def stream_nodes(self) -> NodeStream:
        """Open a ``StreamNodes`` call for many node events in a row (the replay): send them
        ahead without waiting, receive their Decisions in order (:class:`NodeStream`). Per
        event it costs the daemon about half of what a ``report_nodes`` call does."""
        return NodeStream(self)

    @_translate
    def sync_nodes(self, time: float | datetime, source: str, seq: int, idle: Iterable[str],
                   kinds: Mapping[str, tuple[int, Iterable[str]]] | None = None) -> Decision:
        """Send the full idle set; the daemon diffs it. ``kinds``: node -> (GPUs, features)
        of every node known (replaces the daemon's table of node kinds; None: unchanged).
        Returns the :class:`~offcut.views.Decision`."""
        return tasks_wire.decision_from_pb(self.nodes.SyncNodes(nodes_pb2.NodeSnapshot(
            time=to_timestamp(time), source=source, seq=seq, idle=list(idle),
            kinds=[nodes_pb2.NodeKind(node=n, gpus=g, features=list(f))
                   for n, (g, f) in (kinds or {}).items()]),
            timeout=self.timeout_s))

    # ------------------------------------------------------------------ tasks
    @_translate
    def submit(self, spec: TaskSpec | tasks_pb2.TaskSpec, *,
               submit_time: float | datetime | None = None,
               owner: str = "", request_id: str = "") -> TaskReply:
        """Submit a task; ``request_id`` makes retries idempotent.

        ``spec``: a core :class:`offcut.taskspec.TaskSpec` (as :func:`make_task_spec` builds
        it, validated once), sent in its wire form (:func:`offcut.wire.specs.spec_to_pb`); or
        an ``offcut.v1.TaskSpec`` message, sent as is, unchecked (the daemon checks it: a test
        of the daemon's own rules, a replay's recorded spec). Returns the task as submitted
        and the decision (:class:`~offcut.views.TaskReply`; times [s since epoch])."""
        if isinstance(spec, TaskSpec):
            spec = spec_to_pb(spec)
        req = tasks_pb2.SubmitTaskRequest(spec=spec, owner=owner, request_id=request_id)
        if submit_time is not None:
            req.submit_time.CopyFrom(to_timestamp(submit_time))
        return tasks_wire.task_reply_from_pb(self.tasks.SubmitTask(req, timeout=self.timeout_s))

    @_translate
    def get_task(self, task_id: str) -> TaskView:
        """One task by id (:class:`~offcut.views.TaskView`: times [s since epoch], work
        [samples], rates [samples/s], energy [J]); raises NotFound for an unknown id."""
        return tasks_wire.task_from_pb(self.tasks.GetTask(tasks_pb2.GetTaskRequest(
            task_id=task_id), timeout=self.timeout_s))

    @_translate
    def list_tasks(self, states: Iterable[TaskState | int] = (), owner: str = "",
                   page_size: int = 0) -> list[TaskView]:
        """Tasks in submit order (:class:`~offcut.views.TaskView`), optionally filtered by
        state (:class:`~offcut.views.TaskState` or ``offcut.v1.TaskState`` numbers) and
        owner: every page of ListTasks (``page_size`` tasks a call; 0: the daemon's default,
        1,000), read one after the other."""
        request = tasks_pb2.ListTasksRequest(
            states=[tasks_wire.STATE_TO_PB[s] if isinstance(s, TaskState) else s
                    for s in states], owner=owner, page_size=page_size)
        tasks: list[TaskView] = []
        while True:
            page = self.tasks.ListTasks(request, timeout=self.timeout_s)
            tasks.extend(tasks_wire.task_from_pb(t) for t in page.tasks)
            if not page.next_page_token:
                return tasks
            request.page_token = page.next_page_token

    @_fresh_request_id
    @_translate
    def cancel(self, task_id: str, time: float | datetime | None = None, *,
               request_id: str | None = None) -> TaskReply:
        """Cancel a task (releases its nodes); NotFound / FailedPrecondition for unknown or
        finished tasks. ``request_id`` (None: a fresh one; "": none) makes a retry of this
        call return the stored reply (and lets a retry policy repeat it), while a second
        call finds the task cancelled. Returns the task after it and the decision."""
        req = tasks_pb2.CancelTaskRequest(task_id=task_id, request_id=request_id)
        if time is not None:
            req.time.CopyFrom(to_timestamp(time))
        return tasks_wire.task_reply_from_pb(self.tasks.CancelTask(req, timeout=self.timeout_s))

    @_translate
    def report_task_run(self, task_id: str, state: str, *, node: str = "", job_id: str = "",
                        exit_code: int = 0, message: str = "",
                        time: float | datetime | None = None, request_id: str = "",
                        generation: int | None = None,
                        stop_ignored: bool = False) -> TaskReply:
        """Report what happened to a run of a task (launchers): ``state`` is ``started``,
        ``preempted``, ``finished`` (completes the task), ``interrupted`` (checkpointed, exit
        75) or ``failed``. ``generation`` is the run's generation (docs/execution.md): with it,
        ``failed``/``interrupted`` of the current generation restart the task as a new one
        (``failed`` fails it after ``max_failed_generations`` in a row) and reports of
        earlier generations are only recorded; without it, ``failed`` fails the task.
        ``stop_ignored``: the run was killed after the grace time (a warning on the task).
        ``request_id`` makes a retry return the stored reply. Returns the task after it and the
        decision. Raises NotFound (unknown task), FailedPrecondition (task already finished,
        or a generation it never had), InvalidArgument."""
        if state not in _RUN_STATES:
            raise InvalidArgument(f"{state!r} is not one of {', '.join(_RUN_STATES)}", "state")
        req = tasks_pb2.TaskRunReport(task_id=task_id, state=_RUN_STATES[state], node=node,
                                      job_id=job_id, exit_code=exit_code, message=message,
                                      request_id=request_id, generation=generation,
                                      stop_ignored=stop_ignored)
        if time is not None:
            req.time.CopyFrom(to_timestamp(time))
        return tasks_wire.task_reply_from_pb(self.tasks.ReportTaskRun(req,
                                                                      timeout=self.timeout_s))

    @_translate
    def report_progress(self, reports: list[dict], *, request_id: str = ""
                        ) -> ProgressReply:
        """Report measured progress of running tasks, applied together. Each report is a
        dict: ``task_id``, ``time`` (s since epoch or datetime), ``samples_done`` (cumulative
        samples, never decreasing), ``nodes`` (count it ran on since its previous report),
        optional ``energy_j`` (cumulative J). A report reaching the task's total work completes
        it. ``request_id`` makes a retry return the stored reply. Returns the decision and the
        reported tasks after it (:class:`~offcut.views.ProgressReply`). Raises NotFound (unknown task),
        FailedPrecondition (finished task, task without reports_progress, figures that go
        backwards, a node count it never held), InvalidArgument (malformed figures)."""
        req = tasks_pb2.ReportProgressRequest(request_id=request_id)
        for r in reports:
            msg = req.reports.add(task_id=r["task_id"], samples_done=float(r["samples_done"]),
                                  nodes=int(r["nodes"]))
            msg.time.CopyFrom(to_timestamp(r["time"]))
            if r.get("energy_j") is not None:
                msg.energy_j = float(r["energy_j"])
        return tasks_wire.progress_reply_from_pb(self.tasks.ReportProgress(
            req, timeout=self.timeout_s))

    @_fresh_request_id
    @_translate
    def report_energy(self, task_id: str, generation: int, rank: int, joules: float, *,
                      request_id: str | None = None) -> TaskReply:
        """Report what the GPUs of process ``rank`` of ``generation`` of a task drew since it
        started, ``joules`` [J] (cumulative; docs/execution.md, "Energy"). The largest figure
        per (generation, rank) counts, so a repeat changes nothing; ``request_id`` (None: a
        fresh one, the same on every retry of this call; "": none) answers a retry from the
        stored reply. Returns the task after it (``task.energy``). Raises NotFound (unknown
        task, or another user's), FailedPrecondition (a generation after the current one or
        no longer kept), InvalidArgument (``joules`` not finite or outside 0 .. 1e13,
        ``generation`` 0, ``rank`` not below the generation's world size)."""
        return tasks_wire.task_reply_from_pb(self.tasks.ReportEnergy(tasks_pb2.EnergyReport(
            task_id=task_id, generation=generation, rank=rank, joules=joules,
            request_id=request_id), timeout=self.timeout_s))

    def watch(self, task_id: str = "", after_revision: int = 0,
              timeout_s: float | None = None) -> "Stream":
        """Placement updates as they are decided (retained ones after ``after_revision``
        first), each a :class:`~offcut.views.PlacementUpdate` (time [s since epoch], the
        changes and warnings): a blocking iterable :class:`Stream` that ends, without an error, after
        ``timeout_s`` seconds (None: never) or when ``.cancel()`` is called (from any thread).

        Raises, while iterating: :class:`NotFound` (unknown ``task_id``), :class:`Unavailable`.
        """
        return Stream(self, self.tasks.WatchPlacements(tasks_pb2.WatchPlacementsRequest(
            task_id=task_id, after_revision=after_revision), timeout=timeout_s),
            timed=timeout_s is not None, view=tasks_wire.update_from_pb)

    # ------------------------------------------------------------------ status
    @_translate
    def status(self, include_idle_nodes: bool = False) -> StatusView:
        """The daemon status (:class:`~offcut.views.StatusView`): clock [s since epoch; None
        before any event], idle pool, tasks by state, solver statistics [ms], node-seconds,
        energy [J]."""
        return tasks_wire.status_from_pb(self.status_stub.GetStatus(status_pb2.GetStatusRequest(
            include_idle_nodes=include_idle_nodes), timeout=self.timeout_s))

    # ------------------------------------------------------------------ Zeus optimizers
    @_translate
    def register_zeus_job(self, spec: BatchSizeJobSpec | zeus_pb2.BatchSizeJobSpec,
                          owner: str = "", *, power: PowerLimitSpec | None = None) -> ZeusJob:
        """Register a recurring job with the batch-size optimizer (idempotent for the same
        spec; AlreadyExists for a different one, or a job id another user's job holds). It
        belongs to ``owner``, "" = the caller (only admins may name another user). ``spec``: a
        :class:`~offcut.zeus_views.BatchSizeJobSpec` with its ``power`` spec (None: the job
        does not use the power-limit optimizer), or an ``offcut.v1.BatchSizeJobSpec`` message
        (its ``power`` field; then ``power`` must be None). Returns the stored job (defaults
        and seed filled in) as a :class:`~offcut.zeus_views.ZeusJob`."""
        if isinstance(spec, BatchSizeJobSpec):
            spec = zeus_wire.job_spec_to_pb(spec, power)
        elif power is not None:
            raise InvalidArgument("is given twice: as the message's field and as power=",
                                  "spec.power")
        return zeus_wire.job_from_pb(self.bso.RegisterJob(
            zeus_pb2.RegisterJobRequest(spec=spec, owner=owner), timeout=self.timeout_s))

    @_translate
    def predict_batch_size(self, job_id: str, request_id: str = "") -> Prediction:
        """Batch size and trial number of the next run (its cost bound [J]); ``request_id``
        makes a retry return the same trial."""
        return zeus_wire.prediction_from_pb(self.bso.Predict(
            zeus_pb2.PredictRequest(job_id=job_id, request_id=request_id), timeout=self.timeout_s))

    @_translate
    def report_epoch(self, job_id: str, trial_number: int, epoch: int, time_s: float,
                     energy_j: float, metric: float, batch_size: int = 0) -> Verdict:
        """Cumulative time [s] and energy [J] of the trial after ``epoch``, with the
        validation metric; the :class:`~offcut.trial_verdict.Verdict` says whether to stop.
        ``batch_size`` (optional) is checked against the trial's (FailedPrecondition if it
        differs)."""
        return zeus_wire.verdict_from_pb(self.bso.ReportEpoch(zeus_pb2.ReportEpochRequest(
            job_id=job_id, trial_number=trial_number, epoch=epoch, time_s=time_s,
            energy_j=energy_j, metric=metric, batch_size=batch_size), timeout=self.timeout_s))

    @_translate
    def end_trial(self, job_id: str, trial_number: int) -> Verdict:
        """Close a trial that ended without a stopping verdict; its final
        :class:`~offcut.trial_verdict.Verdict`."""
        return zeus_wire.verdict_from_pb(self.bso.EndTrial(
            zeus_pb2.EndTrialRequest(job_id=job_id, trial_number=trial_number),
            timeout=self.timeout_s))

    @_translate
    def get_zeus_job(self, job_id: str, page_size: int = 0,
                     before_trial_number: int = 0) -> ZeusJob:
        """The job's spec, owner and optimizer state with one page of trials: the newest
        ``page_size`` (0 = 100, at most 1000) numbered below ``before_trial_number`` (0 = from
        the newest); the reply's ``next_before_trial_number`` asks for the next older page (0:
        none). NotFound if unknown or another user's."""
        return zeus_wire.job_from_pb(self.bso.GetJob(zeus_pb2.GetJobRequest(
            job_id=job_id, page_size=page_size, before_trial_number=before_trial_number),
            timeout=self.timeout_s))

    def zeus_trials(self, job_id: str, page_size: int = 1000) -> Iterable[ZeusTrial]:
        """Every kept trial of the job (:class:`~offcut.zeus_views.ZeusTrial`), newest page
        first (each page ascending), reading page by page (GetJob)."""
        before = 0
        while True:
            page = self.get_zeus_job(job_id, page_size=page_size, before_trial_number=before)
            yield from page.trials
            before = page.next_before_trial_number
            if not before:
                return

    @_fresh_request_id
    @_translate
    def delete_zeus_job(self, job_id: str, *, request_id: str | None = None) -> None:
        """Forget a job and its power profiles; NotFound if unknown. ``request_id`` (None: a
        fresh one; "": none) makes a retry of this call return again instead of NotFound."""
        self.bso.DeleteJob(zeus_pb2.DeleteJobRequest(job_id=job_id, request_id=request_id),
                           timeout=self.timeout_s)

    @_translate
    def power_plan(self, job_id: str, batch_size: int) -> PowerPlan:
        """The power limit [W] to use, or the next window to profile."""
        return zeus_wire.plan_from_pb(self.plo.GetPowerPlan(
            zeus_pb2.PowerPlanRequest(job_id=job_id, batch_size=batch_size),
            timeout=self.timeout_s))

    @_fresh_request_id
    @_translate
    def report_power_window(self, job_id: str, batch_size: int, power_limit_w: float,
                            time_s: float, energy_j: float, *, request_id: str | None = None
                            ) -> PowerPlan:
        """A measured profiling window (time [s], energy [J]); returns the next plan.
        ``request_id`` (None: a fresh one; "": none) makes a retry of this call get the same
        plan without recording the window twice."""
        return zeus_wire.plan_from_pb(self.plo.ReportWindow(zeus_pb2.ReportWindowRequest(
            job_id=job_id, batch_size=batch_size, power_limit_w=power_limit_w, time_s=time_s,
            energy_j=energy_j, request_id=request_id), timeout=self.timeout_s))

    @_fresh_request_id
    @_translate
    def interrupt_power_window(self, job_id: str, batch_size: int, power_limit_w: float, *,
                               request_id: str | None = None) -> PowerPlan:
        """The window at ``power_limit_w`` [W] was cut short; it is planned again; returns
        the next plan. ``request_id`` as for :meth:`report_power_window` (a retry is not a
        second interruption)."""
        return zeus_wire.plan_from_pb(self.plo.InterruptWindow(zeus_pb2.InterruptWindowRequest(
            job_id=job_id, batch_size=batch_size, power_limit_w=power_limit_w,
            request_id=request_id), timeout=self.timeout_s))

    @_translate
    def power_profile(self, job_id: str, batch_size: int) -> PowerProfile:
        """Measurements and chosen limit [W] (0 until done) of a job's batch size."""
        return zeus_wire.profile_from_pb(self.plo.GetProfile(
            zeus_pb2.GetProfileRequest(job_id=job_id, batch_size=batch_size),
            timeout=self.timeout_s))

    # ------------------------------------------------------------------ history
    def export_history(self, after_revision: int = 0, limit: int = 0,
                       timeout_s: float | None = None) -> "Stream":
        """The daemon's journal, oldest first: one :class:`~offcut.views.HistoryEntry`
        (revision, kind ``nodes | snapshot | submit | cancel | run | progress | energy``, the
        decision, the task of an event about one task, else None) per applied event with revision > ``after_revision``, at most ``limit``
        entries (0: all), up to the revision current when the export began. A blocking
        iterable :class:`Stream`; ``timeout_s`` bounds the whole export [s] (None: no limit).

        Raises, while iterating: :class:`Unavailable`, and an :class:`OffcutError` with code
        ``DEADLINE_EXCEEDED`` when ``timeout_s`` passes.
        """
        return Stream(self, self.status_stub.ExportHistory(status_pb2.ExportHistoryRequest(
            after_revision=after_revision, limit=limit), timeout=timeout_s),
            view=tasks_wire.history_entry_from_pb)

"""gRPC servicers of ``offcut.v1.BatchSizeOptimizer`` and ``offcut.v1.PowerLimitOptimizer``:
proto <-> the registry's domain types, through the one conversion :mod:`offcut.wire.zeus`. The
optimizers decide; nothing is decided here. Each call passes its caller
(:meth:`Authenticator.of`) to the registry, which keeps a user to their own jobs (docs/zeus.md,
"Owners and request ids")."""

from __future__ import annotations

from offcut.daemon.edge.auth import Authenticator
from offcut.daemon.edge.service import _rpc, _rpc_async
from offcut.daemon.zeus.registry import DEFAULT_TRIAL_PAGE, MAX_TRIAL_PAGE, ZeusRegistry
from offcut.errors import InvalidArgument, PermissionDenied
from offcut.v1 import zeus_pb2, zeus_pb2_grpc
from offcut.wire.zeus import (job_spec_from_pb, job_to_pb, plan_to_pb, power_spec_from_pb,
                              prediction_to_pb, profile_to_pb, resumed_to_pb, verdict_to_pb)

#: longest job id and request id, characters (they are keys of the state file)
MAX_ID_LEN = 200


def _short_id(value: str, field: str) -> str:
    """``value``, at most :data:`MAX_ID_LEN` characters (empty allowed); else InvalidArgument
    naming ``field``."""
    if len(value) > MAX_ID_LEN:
        raise InvalidArgument(f"must be at most {MAX_ID_LEN} characters, has {len(value)}", field)
    return value


def _job_id(value: str, field: str = "job_id") -> str:
    """``value``, non-empty and at most :data:`MAX_ID_LEN` characters; else InvalidArgument
    naming ``field``."""
    if not value:
        raise InvalidArgument("is required", field)
    return _short_id(value, field)


class BatchSizeOptimizerService(zeus_pb2_grpc.BatchSizeOptimizerServicer):
    """``offcut.v1.BatchSizeOptimizer`` over a :class:`ZeusRegistry`; ``auth`` resolves the
    callers (default: no tokens, every caller the local admin)."""

    def __init__(self, registry: ZeusRegistry, auth: Authenticator | None = None):
        self.registry = registry
        self.auth = auth or Authenticator(None)

    @_rpc
    def RegisterJob(self, request, context):
        """Validate (INVALID_ARGUMENT naming ``spec.<field>``) and register, owned by
        ``owner`` or else the caller (without tokens: no owner); a user may name only
        themselves (PERMISSION_DENIED). ALREADY_EXISTS for a different spec under the same
        id, or an id held by a job the caller may not act on."""
        who = self.auth.of(context)
        if request.owner and request.owner != who.user and not who.is_admin:
            raise PermissionDenied(f"users register jobs as themselves ({who.user!r})", "owner")
        if not _short_id(request.owner, "owner").isprintable():
            raise InvalidArgument("must be printable", "owner")
        limits = self.registry.limits
        spec = job_spec_from_pb(request.spec, limits.max_batch_sizes, MAX_ID_LEN)
        power = (power_spec_from_pb(request.spec.power, spec.eta_knob, limits.max_power_limits)
                 if request.spec.HasField("power") else None)
        owner = request.owner or (who.user if self.auth.enabled else "")
        job, _, _ = self.registry.register(spec, power, who, owner, assign=bool(request.owner))
        # (the reply shows the newest page of trials, as GetJob's first page)
        return job_to_pb(self.registry.job_view(job.spec.job_id, who))

    @_rpc_async
    async def Predict(self, request, context):
        """The next run's batch size; FAILED_PRECONDITION when every batch size failed;
        INVALID_ARGUMENT for a ``generation`` of 2^63 or more (checked by
        :meth:`BatchSizeJob.predict`)."""
        return prediction_to_pb(await self.registry.predict_async(
            _job_id(request.job_id), _short_id(request.request_id, "request_id"),
            self.auth.of(context), generation=request.generation))

    @_rpc_async
    async def ReportEpoch(self, request, context):
        """Cumulative time/energy and the metric after an epoch -> stop / converged."""
        return verdict_to_pb(await self.registry.report_async(
            _job_id(request.job_id), request.trial_number, request.epoch, request.time_s,
            request.energy_j, request.metric, self.auth.of(context), request.batch_size,
            request.generation))

    @_rpc
    def EndTrial(self, request, context):
        """Close a trial (a failure), or suspend it (``interrupted``: the trial's
        cumulative ``time_s`` [s] and ``energy_j`` [J] when the process stopped, optional)."""
        return verdict_to_pb(self.registry.end_trial(
            _job_id(request.job_id), request.trial_number, self.auth.of(context),
            request.interrupted,
            request.time_s if request.HasField("time_s") else None,
            request.energy_j if request.HasField("energy_j") else None, request.generation))

    @_rpc
    def ResumeTrial(self, request, context):
        """Reopen an open trial for a new process; its stored totals come back. NOT_FOUND
        for an unknown job or trial, FAILED_PRECONDITION for an ended trial or one still held,
        INVALID_ARGUMENT for a ``generation`` of 2^63 or more (checked by
        :meth:`BatchSizeJob.resume`)."""
        return resumed_to_pb(self.registry.resume(
            _job_id(request.job_id), request.trial_number,
            _short_id(request.request_id, "request_id"), self.auth.of(context),
            request.generation))

    @_rpc
    def DeleteJob(self, request, context):
        """Forget the job, its power profiles and its remembered replies; NOT_FOUND if unknown
        (a repeated ``request_id`` of the same caller and job gets the stored empty reply)."""
        self.registry.delete(_job_id(request.job_id), self.auth.of(context),
                             _short_id(request.request_id, "request_id"))
        return zeus_pb2.DeleteJobResponse()

    @_rpc
    def GetJob(self, request, context):
        """The job's spec, owner, phase and one page of its trials: the newest ``page_size``
        (0 = 100, at most 1000) numbered below ``before_trial_number`` (0 = from the newest),
        with ``next_before_trial_number`` for the next older page; NOT_FOUND if unknown,
        INVALID_ARGUMENT naming ``page_size`` or ``before_trial_number`` for a bad value."""
        page_size = request.page_size
        if not 0 <= page_size <= MAX_TRIAL_PAGE:
            raise InvalidArgument(f"must be 0 (= {DEFAULT_TRIAL_PAGE}) to {MAX_TRIAL_PAGE}, "
                                  f"got {page_size}", "page_size")
        if request.before_trial_number < 0:
            raise InvalidArgument(f"must be >= 0 (0 = from the newest trial), got "
                                  f"{request.before_trial_number}", "before_trial_number")
        return job_to_pb(self.registry.job_view(
            _job_id(request.job_id), self.auth.of(context), page_size or DEFAULT_TRIAL_PAGE,
            request.before_trial_number))


class PowerLimitOptimizerService(zeus_pb2_grpc.PowerLimitOptimizerServicer):
    """``offcut.v1.PowerLimitOptimizer`` over a :class:`ZeusRegistry` (a job's profiles are its
    owner's: another user's job is NOT_FOUND); ``auth`` as for
    :class:`BatchSizeOptimizerService`."""

    def __init__(self, registry: ZeusRegistry, auth: Authenticator | None = None):
        self.registry = registry
        self.auth = auth or Authenticator(None)

    @_rpc
    def GetPowerPlan(self, request, context):
        """What the training loop does next for ``(job_id, batch_size)`` (limit [W])."""
        return plan_to_pb(self.registry.power.power_plan(_job_id(request.job_id), request.batch_size,
                                                   self.auth.of(context)))

    @_rpc
    def ReportWindow(self, request, context):
        """A profiling window's ``time_s`` [s] and ``energy_j`` [J] at ``power_limit_w`` [W]
        -> the next plan; a repeated ``request_id`` (at most 200 characters) gets the stored
        plan, with other arguments INVALID_ARGUMENT."""
        return plan_to_pb(self.registry.power.report_window(
            _job_id(request.job_id), request.batch_size, request.power_limit_w, request.time_s,
            request.energy_j, self.auth.of(context),
            _short_id(request.request_id, "request_id")))

    @_rpc
    def InterruptWindow(self, request, context):
        """A profiling window at ``power_limit_w`` [W] was cut short -> the next plan; a
        repeated ``request_id`` as for ReportWindow."""
        return plan_to_pb(self.registry.power.interrupt_window(
            _job_id(request.job_id), request.batch_size, request.power_limit_w,
            self.auth.of(context), _short_id(request.request_id, "request_id")))

    @_rpc
    def GetProfile(self, request, context):
        """The power profile of ``(job_id, batch_size)``."""
        job_id = _job_id(request.job_id)
        return profile_to_pb(self.registry.power.profile(job_id, request.batch_size,
                                                         self.auth.of(context)))

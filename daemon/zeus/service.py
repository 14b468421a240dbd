"""gRPC servicers of ``offcut.v1.BatchSizeOptimizer`` and ``offcut.v1.PowerLimitOptimizer``:
proto <-> the registry's domain types. The optimizers decide; nothing is decided here. Each
call passes its caller (:meth:`Authenticator.of`) to the registry, which keeps a user to their
own jobs (docs/zeus.md, "Owners and request ids")."""

from __future__ import annotations

import json
import math

from offcut.daemon.edge.auth import Authenticator
from offcut.daemon.edge.service import _rpc, _rpc_async
from offcut.daemon.zeus.bso import BatchSizeJobSpec, Prediction, Resumed, Verdict
from offcut.daemon.zeus.plo import PowerLimitProfile, PowerLimitSpec, PowerPlan
from offcut.daemon.zeus.registry import (DEFAULT_TRIAL_PAGE, MAX_TRIAL_PAGE, JobView,
                                         ZeusRegistry)
from offcut.daemon.app.model import Limits
from offcut.errors import InvalidArgument, PermissionDenied
from offcut.v1 import zeus_pb2, zeus_pb2_grpc

#: longest job id and request id, characters (they are keys of the state file)
MAX_ID_LEN = 200

_OPTIONAL_JOB_FIELDS = ("beta_knob", "num_pruning_rounds", "window_size", "mab_prior_mean",
                        "mab_prior_precision", "mab_num_explorations", "seed",
                        "suspended_trial_timeout_s")
_OPTIONAL_POWER_FIELDS = ("step_w", "warmup_steps", "profile_steps", "max_slowdown_factor")


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


def power_spec_from_pb(pb: zeus_pb2.PowerLimitSpec, eta_knob: float,
                       limits: Limits | None = None) -> PowerLimitSpec:
    """``spec.power`` -> :class:`PowerLimitSpec` (unset options take their defaults; the
    selector's eta defaults to the job's; at most ``limits.max_power_limits`` limits to
    profile). Raises InvalidArgument naming ``spec.power.<field>``."""
    fields = {"min_power_limit_w": pb.min_power_limit_w, "max_power_limit_w": pb.max_power_limit_w,
              "eta_knob": pb.eta_knob if pb.HasField("eta_knob") else eta_knob}
    if pb.selector:
        fields["selector"] = pb.selector
    fields.update({name: getattr(pb, name) for name in _OPTIONAL_POWER_FIELDS if pb.HasField(name)})
    try:
        return PowerLimitSpec.create(
            **fields, max_power_limits=(limits or Limits()).max_power_limits)
    except InvalidArgument as exc:
        name = (exc.field or "").removeprefix("spec.")
        message = str(exc).split(": ", 1)[-1]
        raise InvalidArgument(message, f"spec.power.{name}") from None


def job_spec_from_pb(pb: zeus_pb2.BatchSizeJobSpec, limits: Limits | None = None
                     ) -> BatchSizeJobSpec:
    """``spec`` -> validated :class:`BatchSizeJobSpec` (unset options take their defaults;
    no seed = None, drawn by the registry; at most ``limits.max_batch_sizes`` batch sizes).
    Raises InvalidArgument naming ``spec.<field>``."""
    limit = (limits or Limits()).max_batch_sizes
    if len(pb.batch_sizes) > limit:
        raise InvalidArgument(f"has {len(pb.batch_sizes)} batch sizes, more than "
                              f"max_batch_sizes ({limit})", "spec.batch_sizes")
    _job_id(pb.job_id, "spec.job_id")
    fields = {"job_id": pb.job_id, "batch_sizes": tuple(pb.batch_sizes),
              "default_batch_size": pb.default_batch_size, "eta_knob": pb.eta_knob,
              "max_epochs": pb.max_epochs, "target_metric": pb.target_metric,
              "higher_is_better": pb.higher_is_better, "max_power_w": pb.max_power_w,
              "beta_knob": None, "seed": None}
    fields.update({name: getattr(pb, name) for name in _OPTIONAL_JOB_FIELDS if pb.HasField(name)})
    return BatchSizeJobSpec.create(**fields)


def job_to_pb(job: JobView, power: PowerLimitSpec | None, owner: str = ""
              ) -> zeus_pb2.ZeusJob:
    """The stored spec (defaults filled in), the owner and a view of the optimizer's state
    with one page of trials (:meth:`ZeusRegistry.job_view`)."""
    spec = job.spec
    pb_spec = zeus_pb2.BatchSizeJobSpec(
        job_id=spec.job_id, batch_sizes=list(spec.batch_sizes),
        default_batch_size=spec.default_batch_size, eta_knob=spec.eta_knob,
        max_epochs=spec.max_epochs, target_metric=spec.target_metric,
        higher_is_better=spec.higher_is_better, max_power_w=spec.max_power_w,
        num_pruning_rounds=spec.num_pruning_rounds, window_size=spec.window_size,
        mab_prior_mean=spec.mab_prior_mean, mab_prior_precision=spec.mab_prior_precision,
        mab_num_explorations=spec.mab_num_explorations, seed=spec.seed,
        suspended_trial_timeout_s=spec.suspended_trial_timeout_s)
    if spec.beta_knob is not None and math.isfinite(spec.beta_knob):
        pb_spec.beta_knob = spec.beta_knob
    if power is not None:
        pb_spec.power.CopyFrom(zeus_pb2.PowerLimitSpec(
            min_power_limit_w=power.min_power_limit_w, max_power_limit_w=power.max_power_limit_w,
            step_w=power.step_w, warmup_steps=power.warmup_steps,
            profile_steps=power.profile_steps, selector=power.selector, eta_knob=power.eta_knob,
            max_slowdown_factor=power.max_slowdown_factor))
    state = job.state()
    trials = [zeus_pb2.ZeusTrial(
        trial_number=t["trial_number"], batch_size=t["batch_size"], status=t["status"],
        epochs=t["epochs"], time_s=t["time_s"], energy_j=t["energy_j"], cost_j=t["cost_j"],
        generation=t["generation"], interruptions=t["interruptions"])
        for t in state["trials"]]
    min_cost = state["min_cost_j"]
    return zeus_pb2.ZeusJob(spec=pb_spec, phase=state["phase"],
                            best_batch_size=state["best_batch_size"],
                            min_cost_j=math.inf if min_cost is None else min_cost,
                            trials=trials, state_json=json.dumps(state), owner=owner,
                            next_before_trial_number=job.next_before,
                            trial_count=job.trial_count)


def prediction_to_pb(p: Prediction) -> zeus_pb2.Prediction:
    """A :class:`Prediction` as its message (``cost_bound_j`` [J])."""
    return zeus_pb2.Prediction(batch_size=p.batch_size, trial_number=p.trial_number,
                               cost_bound_j=p.cost_bound_j, exploration=p.exploration)


def resumed_to_pb(r: Resumed) -> zeus_pb2.ResumedTrial:
    """A :class:`Resumed` as its message (``time_s`` [s], ``energy_j``/``cost_j``/
    ``cost_bound_j`` [J])."""
    return zeus_pb2.ResumedTrial(
        trial_number=r.trial_number, batch_size=r.batch_size, epochs=r.epochs, time_s=r.time_s,
        energy_j=r.energy_j, cost_j=r.cost_j, cost_bound_j=r.cost_bound_j,
        exploration=r.exploration, generation=r.generation, taken_over=r.taken_over)


def verdict_to_pb(v: Verdict) -> zeus_pb2.TrialVerdict:
    """A :class:`Verdict` as its message (``cost_j`` [J])."""
    return zeus_pb2.TrialVerdict(stop=v.stop, converged=v.converged, cost_j=v.cost_j,
                                 message=v.message, finished=v.finished, suspended=v.suspended)


def plan_to_pb(p: PowerPlan) -> zeus_pb2.PowerPlan:
    """A :class:`PowerPlan` as its message (``power_limit_w`` [W])."""
    return zeus_pb2.PowerPlan(action=p.action, power_limit_w=p.power_limit_w,
                              warmup_steps=p.warmup_steps, profile_steps=p.profile_steps)


def profile_to_pb(job_id: str, batch_size: int, p: PowerLimitProfile) -> zeus_pb2.PowerProfile:
    """The power profile of ``(job_id, batch_size)`` as its message (chosen limit [W], 0 while
    profiling; the measured windows, highest limit first)."""
    return zeus_pb2.PowerProfile(
        job_id=job_id, batch_size=batch_size, done=p.done,
        chosen_power_limit_w=p.chosen_power_limit_w or 0.0,
        measurements=[zeus_pb2.PowerMeasurement(**m) for m in p.measurements()])


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
        spec = job_spec_from_pb(request.spec, limits)
        power = (power_spec_from_pb(request.spec.power, spec.eta_knob, limits)
                 if request.spec.HasField("power") else None)
        owner = request.owner or (who.user if self.auth.enabled else "")
        job, _, _ = self.registry.register(spec, power, who, owner, assign=bool(request.owner))
        # (the reply shows the newest page of trials, as GetJob's first page)
        return job_to_pb(*self.registry.job_view(job.spec.job_id, who))

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
        return job_to_pb(*self.registry.job_view(
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
        return profile_to_pb(job_id, request.batch_size, self.registry.power.profile(
            job_id, request.batch_size, self.auth.of(context)))

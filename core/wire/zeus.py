"""The one conversion between Zeus's forms (:mod:`offcut.zeus_views`, the verdict of
:mod:`offcut.trial_verdict`) and the ``offcut.v1`` Zeus messages (protos/offcut/v1/zeus.proto):
``*_to_pb`` for the daemon's servicer (:mod:`offcut.daemon.zeus.service`) and the client's
requests, ``*_from_pb`` for the client's replies and the servicer's requests
(docs/architecture.md, "Layers")."""

from __future__ import annotations

import math

from offcut.errors import InvalidArgument
from offcut.trial_verdict import Verdict
from offcut.v1 import zeus_pb2
from offcut.wire.flat import flat_from_pb, flat_to_pb
from offcut.zeus_views import (DEFAULT_MAX_POWER_LIMITS, BatchSizeJobSpec, PowerLimitSpec,
                               PowerMeasurement, PowerPlan, PowerProfile, Prediction, Resumed,
                               ZeusJob, ZeusTrial)

_OPTIONAL_JOB_FIELDS = ("beta_knob", "num_pruning_rounds", "window_size", "mab_prior_mean",
                        "mab_prior_precision", "mab_num_explorations", "seed",
                        "suspended_trial_timeout_s")
_OPTIONAL_POWER_FIELDS = ("step_w", "warmup_steps", "profile_steps", "max_slowdown_factor")


# ----------------------------------------------------------------------------- specs
def power_spec_from_pb(pb: zeus_pb2.PowerLimitSpec, eta_knob: float,
                       max_power_limits: float = DEFAULT_MAX_POWER_LIMITS) -> PowerLimitSpec:
    """``spec.power`` -> validated :class:`PowerLimitSpec` (unset options take their defaults;
    the selector's eta defaults to the job's ``eta_knob``; at most ``max_power_limits`` limits
    to profile). Raises InvalidArgument naming ``spec.power.<field>``."""
    fields = {"min_power_limit_w": pb.min_power_limit_w, "max_power_limit_w": pb.max_power_limit_w,
              "eta_knob": pb.eta_knob if pb.HasField("eta_knob") else eta_knob}
    if pb.selector:
        fields["selector"] = pb.selector
    fields.update({name: getattr(pb, name) for name in _OPTIONAL_POWER_FIELDS if pb.HasField(name)})
    try:
        return PowerLimitSpec.create(**fields, max_power_limits=max_power_limits)
    except InvalidArgument as exc:
        name = (exc.field or "").removeprefix("spec.")
        message = str(exc).split(": ", 1)[-1]
        raise InvalidArgument(message, f"spec.power.{name}") from None


def job_spec_from_pb(pb: zeus_pb2.BatchSizeJobSpec, max_batch_sizes: int | None = None,
                     max_id_len: int | None = None) -> BatchSizeJobSpec:
    """``spec`` -> validated :class:`BatchSizeJobSpec` (unset options take their defaults;
    no seed = None, drawn by the registry; at most ``max_batch_sizes`` batch sizes and a job id
    of at most ``max_id_len`` characters, None: unbounded). Its ``power`` is
    :func:`power_spec_from_pb`'s. Raises InvalidArgument naming ``spec.<field>``."""
    if max_batch_sizes is not None and len(pb.batch_sizes) > max_batch_sizes:
        raise InvalidArgument(f"has {len(pb.batch_sizes)} batch sizes, more than "
                              f"max_batch_sizes ({max_batch_sizes})", "spec.batch_sizes")
    if not pb.job_id:
        raise InvalidArgument("is required", "spec.job_id")
    if max_id_len is not None and len(pb.job_id) > max_id_len:
        raise InvalidArgument(f"must be at most {max_id_len} characters, has {len(pb.job_id)}",
                              "spec.job_id")
    fields = {"job_id": pb.job_id, "batch_sizes": tuple(pb.batch_sizes),
              "default_batch_size": pb.default_batch_size, "eta_knob": pb.eta_knob,
              "max_epochs": pb.max_epochs, "target_metric": pb.target_metric,
              "higher_is_better": pb.higher_is_better, "max_power_w": pb.max_power_w,
              "beta_knob": None, "seed": None}
    fields.update({name: getattr(pb, name) for name in _OPTIONAL_JOB_FIELDS if pb.HasField(name)})
    return BatchSizeJobSpec.create(**fields)


def power_spec_to_pb(power: PowerLimitSpec) -> zeus_pb2.PowerLimitSpec:
    """A :class:`PowerLimitSpec` as its message, every option set (limits [W])."""
    return zeus_pb2.PowerLimitSpec(
        min_power_limit_w=power.min_power_limit_w, max_power_limit_w=power.max_power_limit_w,
        step_w=power.step_w, warmup_steps=power.warmup_steps, profile_steps=power.profile_steps,
        selector=power.selector, eta_knob=power.eta_knob,
        max_slowdown_factor=power.max_slowdown_factor)


def job_spec_to_pb(spec: BatchSizeJobSpec, power: PowerLimitSpec | None = None
                   ) -> zeus_pb2.BatchSizeJobSpec:
    """A :class:`BatchSizeJobSpec` (and its power spec, None: none) as its message: every
    option set, but ``beta_knob`` only when it is finite and ``seed`` only when drawn."""
    pb = zeus_pb2.BatchSizeJobSpec(
        job_id=spec.job_id, batch_sizes=list(spec.batch_sizes),
        default_batch_size=spec.default_batch_size, eta_knob=spec.eta_knob,
        max_epochs=spec.max_epochs, target_metric=spec.target_metric,
        higher_is_better=spec.higher_is_better, max_power_w=spec.max_power_w,
        num_pruning_rounds=spec.num_pruning_rounds, window_size=spec.window_size,
        mab_prior_mean=spec.mab_prior_mean, mab_prior_precision=spec.mab_prior_precision,
        mab_num_explorations=spec.mab_num_explorations,
        suspended_trial_timeout_s=spec.suspended_trial_timeout_s)
    if spec.seed is not None:
        pb.seed = spec.seed
    if spec.beta_knob is not None and math.isfinite(spec.beta_knob):
        pb.beta_knob = spec.beta_knob
    if power is not None:
        pb.power.CopyFrom(power_spec_to_pb(power))
    return pb


# ----------------------------------------------------------------------------- jobs
def trial_to_pb(t: ZeusTrial) -> zeus_pb2.ZeusTrial:
    """A :class:`ZeusTrial` as its message (``time_s`` [s], ``energy_j``/``cost_j`` [J])."""
    return flat_to_pb(t, zeus_pb2.ZeusTrial)


def trial_from_pb(pb: zeus_pb2.ZeusTrial) -> ZeusTrial:
    """Inverse of :func:`trial_to_pb`."""
    return flat_from_pb(pb, ZeusTrial)


def job_to_pb(job: ZeusJob) -> zeus_pb2.ZeusJob:
    """A :class:`ZeusJob` as its message (``min_cost_j`` [J], +inf when none)."""
    return zeus_pb2.ZeusJob(spec=job_spec_to_pb(job.spec, job.power), phase=job.phase,
                            best_batch_size=job.best_batch_size, min_cost_j=job.min_cost_j,
                            trials=[trial_to_pb(t) for t in job.trials],
                            state_json=job.state_json, owner=job.owner,
                            next_before_trial_number=job.next_before_trial_number,
                            trial_count=job.trial_count)


def job_from_pb(pb: zeus_pb2.ZeusJob) -> ZeusJob:
    """The :class:`ZeusJob` of a RegisterJob or GetJob reply (its spec validated as
    :func:`job_spec_from_pb`, without the daemon's size limits, which the reply met;
    InvalidArgument naming ``spec.<field>`` for a damaged one)."""
    spec = job_spec_from_pb(pb.spec)
    power = (power_spec_from_pb(pb.spec.power, spec.eta_knob, max_power_limits=math.inf)
             if pb.spec.HasField("power") else None)
    return ZeusJob(spec=spec, power=power, phase=pb.phase, best_batch_size=pb.best_batch_size,
                   min_cost_j=pb.min_cost_j, trials=tuple(trial_from_pb(t) for t in pb.trials),
                   state_json=pb.state_json, owner=pb.owner,
                   next_before_trial_number=pb.next_before_trial_number,
                   trial_count=pb.trial_count)


# ----------------------------------------------------------------------------- answers
def prediction_to_pb(p: Prediction) -> zeus_pb2.Prediction:
    """A :class:`Prediction` as its message (``cost_bound_j`` [J])."""
    return flat_to_pb(p, zeus_pb2.Prediction)


def prediction_from_pb(pb: zeus_pb2.Prediction) -> Prediction:
    """Inverse of :func:`prediction_to_pb`."""
    return flat_from_pb(pb, Prediction)


def resumed_to_pb(r: Resumed) -> zeus_pb2.ResumedTrial:
    """A :class:`Resumed` as its message (``time_s`` [s], ``energy_j``/``cost_j``/
    ``cost_bound_j`` [J])."""
    return flat_to_pb(r, zeus_pb2.ResumedTrial)


def resumed_from_pb(pb: zeus_pb2.ResumedTrial) -> Resumed:
    """Inverse of :func:`resumed_to_pb`."""
    return flat_from_pb(pb, Resumed)


def verdict_to_pb(v: Verdict) -> zeus_pb2.TrialVerdict:
    """A :class:`Verdict` as its message (``cost_j`` [J])."""
    return flat_to_pb(v, zeus_pb2.TrialVerdict)


def verdict_from_pb(pb: zeus_pb2.TrialVerdict) -> Verdict:
    """Inverse of :func:`verdict_to_pb`."""
    return flat_from_pb(pb, Verdict)


def plan_to_pb(p: PowerPlan) -> zeus_pb2.PowerPlan:
    """A :class:`PowerPlan` as its message (``power_limit_w`` [W])."""
    return flat_to_pb(p, zeus_pb2.PowerPlan)


def plan_from_pb(pb: zeus_pb2.PowerPlan) -> PowerPlan:
    """Inverse of :func:`plan_to_pb`."""
    return flat_from_pb(pb, PowerPlan)


def profile_to_pb(p: PowerProfile) -> zeus_pb2.PowerProfile:
    """A :class:`PowerProfile` as its message (chosen limit [W], 0 while profiling; the
    measured windows, highest limit first)."""
    return zeus_pb2.PowerProfile(
        job_id=p.job_id, batch_size=p.batch_size, done=p.done,
        chosen_power_limit_w=p.chosen_power_limit_w,
        measurements=[flat_to_pb(m, zeus_pb2.PowerMeasurement) for m in p.measurements])


def profile_from_pb(pb: zeus_pb2.PowerProfile) -> PowerProfile:
    """Inverse of :func:`profile_to_pb`."""
    return PowerProfile(pb.job_id, pb.batch_size, pb.done, pb.chosen_power_limit_w,
                        tuple(flat_from_pb(m, PowerMeasurement) for m in pb.measurements))

"""Zeus's concepts in one form each, shared by the daemon's Zeus subsystem
(:mod:`offcut.daemon.zeus`), which decides them, and the client (:class:`offcut.client.api.Client`),
which returns them: a recurring job's spec and its power spec, the optimizers' answers
(prediction, resumed trial, power plan; the verdict is :class:`offcut.trial_verdict.Verdict`) and
what GetJob and GetProfile show (docs/zeus.md, "The batch-size optimizer" and "The power-limit
optimizer"). Frozen dataclasses with units in their names; no protobuf: the one conversion to
and from ``offcut.v1`` messages is :mod:`offcut.wire.zeus`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from offcut.errors import InvalidArgument
from offcut.taskspec import check_finite
from offcut.trial_verdict import Verdict

__all__ = ["BatchSizeJobSpec", "PowerLimitSpec", "Prediction", "Resumed", "Verdict", "PowerPlan",
           "ZeusTrial", "ZeusJob", "PowerMeasurement", "PowerProfile", "zeus_cost", "SELECTORS",
           "DEFAULT_MAX_POWER_LIMITS", "DEFAULT_SUSPENDED_TRIAL_TIMEOUT_S",
           "MAX_SUSPENDED_TRIAL_TIMEOUT_S"]


def zeus_cost(energy_j: float, time_s: float, eta_knob: float, max_power_w: float) -> float:
    """``zeus_cost = eta * energy + (1 - eta) * MaxPower * time`` [J] (Zeus, NSDI '23,
    Section 3.1, Eq. 2).

    Args:
        energy_j: energy to accuracy [J].
        time_s: time to accuracy [s].
        eta_knob: weight of energy, in [0, 1] (0 = time only, 1 = energy only).
        max_power_w: MaxPower [W]: the maximum power limit times the number of GPUs, so that
            both terms are in joules.

    Returns:
        The cost [J]. Inputs are not validated here; callers validate them at the boundary.
    """
    return eta_knob * energy_j + (1.0 - eta_knob) * max_power_w * time_s


#: default and largest ``suspended_trial_timeout_s`` [s]
DEFAULT_SUSPENDED_TRIAL_TIMEOUT_S = 86400.0
MAX_SUSPENDED_TRIAL_TIMEOUT_S = 1e9


@dataclass(frozen=True)
class BatchSizeJobSpec:
    """A recurring job as registered (all options filled in).

    ``batch_sizes`` sorted ascending, positive, distinct; ``default_batch_size`` one of them;
    ``eta_knob`` in [0, 1]; ``beta_knob`` > 0 or None (no early stopping); ``max_epochs`` >= 1;
    ``target_metric`` reached when ``metric >= target`` (``higher_is_better``) or
    ``metric <= target``; ``max_power_w`` [W] is zeus_cost's MaxPower (max power limit x GPUs);
    ``window_size`` 0 = whole history; ``seed`` None only before the registry draws one;
    ``suspended_trial_timeout_s`` [s] in [0, 1e9]: a trial suspended for longer when a
    Predict comes is abandoned (:mod:`offcut.daemon.zeus.bso`, "Abandoned trials").
    """

    job_id: str
    batch_sizes: tuple[int, ...]
    default_batch_size: int
    eta_knob: float
    beta_knob: float | None
    max_epochs: int
    target_metric: float
    higher_is_better: bool
    max_power_w: float
    num_pruning_rounds: int = 2
    window_size: int = 0
    mab_prior_mean: float = 0.0
    mab_prior_precision: float = 0.0
    mab_num_explorations: int = 2
    seed: int | None = None
    suspended_trial_timeout_s: float = DEFAULT_SUSPENDED_TRIAL_TIMEOUT_S

    @classmethod
    def create(cls, **fields: Any) -> "BatchSizeJobSpec":
        """Validate and normalise the fields (batch sizes sorted).

        Raises:
            InvalidArgument: naming ``spec.<field>`` (e.g. ``num_pruning_rounds`` < 1, a default
                batch size not among ``batch_sizes``, ``eta_knob`` outside [0, 1] or NaN).
        """
        f = dict(fields)
        f.setdefault("beta_knob", None)  # (unset: no early stopping, as on the wire)
        if not f.get("job_id"):
            raise InvalidArgument("is required", "spec.job_id")
        sizes = [int(b) for b in f.get("batch_sizes", ())]
        if not sizes:
            raise InvalidArgument("must list at least one batch size", "spec.batch_sizes")
        if min(sizes) <= 0 or len(set(sizes)) != len(sizes):
            shown = ", ".join(str(b) for b in sizes[:20]) + (", ..." if len(sizes) > 20 else "")
            raise InvalidArgument(f"must be distinct positive integers, got [{shown}]",
                                  "spec.batch_sizes")
        f["batch_sizes"] = tuple(sorted(sizes))
        if f.get("default_batch_size") not in f["batch_sizes"]:
            raise InvalidArgument(f"{f.get('default_batch_size')} is not one of the batch sizes "
                                  f"{list(f['batch_sizes'])}", "spec.default_batch_size")
        eta = check_finite(f.get("eta_knob", math.nan), "spec.eta_knob")
        if not 0.0 <= eta <= 1.0:
            raise InvalidArgument(f"must be in [0, 1], got {eta}", "spec.eta_knob")
        if f.get("beta_knob") is not None:
            f["beta_knob"] = check_finite(f["beta_knob"], "spec.beta_knob", positive=True)
        if int(f.get("max_epochs", 0)) < 1:
            raise InvalidArgument(f"must be >= 1, got {f.get('max_epochs')}", "spec.max_epochs")
        check_finite(f.get("target_metric", math.nan), "spec.target_metric")
        check_finite(f.get("max_power_w", math.nan), "spec.max_power_w", positive=True)
        if int(f.get("num_pruning_rounds", 2)) < 1:
            raise InvalidArgument(f"must be >= 1, got {f['num_pruning_rounds']}",
                                  "spec.num_pruning_rounds")
        if int(f.get("window_size", 0)) < 0:
            raise InvalidArgument(f"must be >= 0, got {f['window_size']}", "spec.window_size")
        check_finite(f.get("mab_prior_mean", 0.0), "spec.mab_prior_mean")
        check_finite(f.get("mab_prior_precision", 0.0), "spec.mab_prior_precision",
                     non_negative=True)
        if int(f.get("mab_num_explorations", 2)) < 1:
            raise InvalidArgument(f"must be >= 1, got {f['mab_num_explorations']}",
                                  "spec.mab_num_explorations")
        if f.get("seed") is not None and not 0 <= int(f["seed"]) < 2**63:
            raise InvalidArgument(f"must be in [0, 2^63), got {f['seed']}", "spec.seed")
        if "suspended_trial_timeout_s" in f:
            timeout = check_finite(f["suspended_trial_timeout_s"],
                                   "spec.suspended_trial_timeout_s", non_negative=True)
            if timeout > MAX_SUSPENDED_TRIAL_TIMEOUT_S:
                raise InvalidArgument(f"must be at most {MAX_SUSPENDED_TRIAL_TIMEOUT_S:g} s, got "
                                      f"{timeout:g}", "spec.suspended_trial_timeout_s")
            f["suspended_trial_timeout_s"] = timeout
        try:
            return cls(**f)
        except TypeError as exc:  # an unknown field: a programming error of the caller
            raise InvalidArgument(str(exc), "spec") from None

    def with_seed(self, seed: int) -> "BatchSizeJobSpec":
        """The same spec with ``seed`` filled in."""
        return dataclasses.replace(self, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        d = dataclasses.asdict(self)
        d["batch_sizes"] = list(self.batch_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BatchSizeJobSpec":
        """Inverse of :meth:`to_dict` (trusted input: the state file)."""
        return cls(**{**d, "batch_sizes": tuple(d["batch_sizes"])})

    def converged(self, metric: float) -> bool:
        """Whether ``metric`` reaches the target."""
        return metric >= self.target_metric if self.higher_is_better else metric <= self.target_metric

    def cost(self, energy_j: float, time_s: float) -> float:
        """zeus_cost [J] of a run with this job's eta_knob and MaxPower."""
        return zeus_cost(energy_j, time_s, self.eta_knob, self.max_power_w)


@dataclass(frozen=True)
class Prediction:
    """The answer to predict: the batch size and trial number of the next run; its cost bound
    [J] (``beta_knob * min_cost``, +inf when there is none); ``exploration`` False for a
    concurrent run given the best known batch size."""

    batch_size: int
    trial_number: int
    cost_bound_j: float
    exploration: bool


@dataclass(frozen=True)
class Resumed:
    """The answer to resume: the trial, its totals so far (``epochs``, ``time_s`` [s],
    ``energy_j`` [J], ``cost_j`` [J]) that the resumed process adds its own figures to, the
    current cost bound [J], ``generation`` now holding it, and ``taken_over`` (the trial was
    running, its holder's generation replaced)."""

    trial_number: int
    batch_size: int
    epochs: int
    time_s: float
    energy_j: float
    cost_j: float
    cost_bound_j: float
    exploration: bool
    generation: int
    taken_over: bool


SELECTORS = ("zeus_cost", "energy", "time", "max_slowdown")
#: most power limits one profile walks through, unless the caller says otherwise
#: (the daemon passes its ``max_power_limits`` setting)
DEFAULT_MAX_POWER_LIMITS = 1000


@dataclass(frozen=True)
class PowerLimitSpec:
    """How to profile: the device's range [W] (per GPU, as pynvml reports it), the stride
    ``step_w`` [W], steps per window, the selector and its parameters."""

    min_power_limit_w: float
    max_power_limit_w: float
    eta_knob: float
    selector: str = "zeus_cost"
    step_w: float = 25.0
    warmup_steps: int = 10
    profile_steps: int = 40
    max_slowdown_factor: float = 1.1

    @classmethod
    def create(cls, max_power_limits: int = DEFAULT_MAX_POWER_LIMITS, **fields: Any
               ) -> "PowerLimitSpec":
        """Validate the fields.

        Raises:
            InvalidArgument: naming the field (a range with min > max or min <= 0, a step
                <= 0, more than ``max_power_limits`` limits to profile,
                ``profile_steps`` < 1, ``warmup_steps`` < 0, an unknown selector,
                ``eta_knob`` outside [0, 1], ``max_slowdown_factor`` < 1).
        """
        lo = check_finite(fields.get("min_power_limit_w", math.nan), "min_power_limit_w",
                          positive=True)
        hi = check_finite(fields.get("max_power_limit_w", math.nan), "max_power_limit_w",
                          positive=True)
        if lo > hi:
            raise InvalidArgument(f"{lo} W is above max_power_limit_w {hi} W", "min_power_limit_w")
        step = check_finite(fields.get("step_w", 25.0), "step_w", positive=True)
        steps = (hi - lo) / step  # may overflow to inf for a tiny step
        if not steps + 1 <= max_power_limits:
            raise InvalidArgument(f"walks {steps + 1:.6g} power limits from {hi} W down to "
                                  f"{lo} W, more than max_power_limits ({max_power_limits})",
                                  "step_w")
        if int(fields.get("warmup_steps", 10)) < 0:
            raise InvalidArgument(f"must be >= 0, got {fields['warmup_steps']}", "warmup_steps")
        if int(fields.get("profile_steps", 40)) < 1:
            raise InvalidArgument(f"must be >= 1, got {fields['profile_steps']}", "profile_steps")
        if fields.get("selector", "zeus_cost") not in SELECTORS:
            raise InvalidArgument(f"{fields['selector']!r} is not one of {list(SELECTORS)}",
                                  "selector")
        eta = check_finite(fields.get("eta_knob", math.nan), "eta_knob")
        if not 0.0 <= eta <= 1.0:
            raise InvalidArgument(f"must be in [0, 1], got {eta}", "eta_knob")
        factor = check_finite(fields.get("max_slowdown_factor", 1.1), "max_slowdown_factor")
        if factor < 1.0:
            raise InvalidArgument(f"must be >= 1, got {factor}", "max_slowdown_factor")
        return cls(**fields)

    def power_limits(self) -> list[float]:
        """The limits to profile [W], from the maximum down to the minimum in ``step_w``
        steps (the minimum itself only when it lies on the grid, as in Zeus)."""
        count = int(math.floor((self.max_power_limit_w - self.min_power_limit_w) / self.step_w
                               + 1e-9))
        return [self.max_power_limit_w - i * self.step_w for i in range(count + 1)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PowerLimitSpec":
        """Inverse of :meth:`to_dict` (trusted input: the state file)."""
        return cls(**d)


@dataclass(frozen=True)
class PowerPlan:
    """What the training side does next: ``action`` ``profile`` (set ``power_limit_w``, run
    ``warmup_steps``, then measure ``profile_steps`` steps) or ``use`` (run at
    ``power_limit_w``)."""

    action: str
    power_limit_w: float
    warmup_steps: int = 0
    profile_steps: int = 0


@dataclass(frozen=True)
class ZeusTrial:
    """One trial as GetJob shows it: ``status`` running | suspended | converged | failed |
    abandoned; ``epochs``, ``time_s`` [s], ``energy_j`` [J] and ``cost_j`` [J] cumulative across
    its generations; ``generation`` holding it (or that last held it; 0 = none given);
    ``interruptions``: times it was suspended or taken over by a later generation."""

    trial_number: int
    batch_size: int
    status: str
    epochs: int
    time_s: float
    energy_j: float
    cost_j: float
    generation: int = 0
    interruptions: int = 0


@dataclass(frozen=True)
class ZeusJob:
    """A registered job as RegisterJob and GetJob answer: its stored ``spec`` (defaults and
    seed filled in) and ``power`` spec (None: the job does not use the power-limit optimizer),
    its ``owner`` ("" = none), the optimizer's ``phase`` (pruning | mab),
    ``best_batch_size``, ``min_cost_j`` [J] (lowest cost of a converged run; +inf if none),
    one page of ``trials`` (ascending), ``state_json`` (the optimizer's whole state, for
    debugging: :meth:`state`), ``next_before_trial_number`` (the next older page; 0: none) and
    ``trial_count`` (trials ever opened)."""

    spec: BatchSizeJobSpec
    power: PowerLimitSpec | None
    phase: str
    best_batch_size: int
    min_cost_j: float
    trials: tuple[ZeusTrial, ...] = ()
    state_json: str = "{}"
    owner: str = ""
    next_before_trial_number: int = 0
    trial_count: int = 0

    def state(self) -> dict[str, Any]:
        """``state_json`` decoded (ValueError if it is not JSON)."""
        return json.loads(self.state_json)


@dataclass(frozen=True)
class PowerMeasurement:
    """A measured profiling window: at ``power_limit_w`` [W], ``time_s`` [s] and ``energy_j``
    [J]; ``cost``, the selector's score (lower is better)."""

    power_limit_w: float
    time_s: float
    energy_j: float
    cost: float


@dataclass(frozen=True)
class PowerProfile:
    """The power profile of one (job, batch size): ``done`` once every limit is measured,
    ``chosen_power_limit_w`` [W] (0 until done), the ``measurements`` (highest limit first)."""

    job_id: str
    batch_size: int
    done: bool
    chosen_power_limit_w: float
    measurements: tuple[PowerMeasurement, ...] = ()

"""Zeus's batch-size optimizer for one recurring job (Zeus, NSDI '23, §4; DESIGN §5).

A deterministic state machine with no I/O: the registry persists :meth:`BatchSizeJob.to_dict`
after every call, including the seeded RNG's state, so a restarted daemon continues the same
batch-size sequence exactly.

1. **Pruning** (§4.2), ``num_pruning_rounds`` rounds: from the default batch size b0 walk down
   through smaller sizes, then up through larger ones; a size that does not converge ends that
   direction; the sizes that converged survive, and the cheapest of them is the next round's b0.
2. **Gaussian Thompson sampling** (§4.3) over the survivors, reward = -cost: per arm, mean and
   precision are refitted from its (windowed) history with a Gaussian prior and reward
   precision 1/variance (infinite when the variance is 0); arms with fewer than
   ``mab_num_explorations`` observations are tried first in random order; otherwise each arm's
   posterior is sampled and the best sample wins. The draw order follows Zeus's ``GaussianTS``.
3. **Early stopping** (§4.4): a run stops once its cost exceeds ``beta_knob * min_cost``, where
   ``min_cost`` is the lowest cost of a *converged* run (Zeus's server also lowers it with runs
   that did not converge, which can lock a job out for good). A run stopped by the bound counts
   as not converged.

Concurrency: while a pruning run is in flight, further predictions get the best batch size known
so far (flagged ``exploration=False``) and their results never advance pruning; Thompson
sampling needs no such rule (every prediction is a fresh posterior sample).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from offcut.daemon.model import check_finite
from offcut.daemon.zeus.cost import zeus_cost
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound

RUNNING, CONVERGED, FAILED, ABANDONED = "running", "converged", "failed", "abandoned"
PRUNING, MAB, EXHAUSTED = "pruning", "mab", "exhausted"
#: largest zeus_cost [J] a report may reach: Thompson sampling squares rewards (-cost), so
#: costs beyond ~1e154 J overflow its variance to inf and its posterior to NaN
MAX_COST_J = 1e100


@dataclass(frozen=True)
class BatchSizeJobSpec:
    """A recurring job as registered (all options filled in).

    ``batch_sizes`` sorted ascending, positive, distinct; ``default_batch_size`` one of them;
    ``eta_knob`` in [0, 1]; ``beta_knob`` > 0 or None (no early stopping); ``max_epochs`` >= 1;
    ``target_metric`` reached when ``metric >= target`` (``higher_is_better``) or
    ``metric <= target``; ``max_power_w`` [W] is zeus_cost's MaxPower (max power limit x GPUs);
    ``window_size`` 0 = whole history; ``seed`` None only before the registry draws one.
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

    @classmethod
    def create(cls, **fields: Any) -> "BatchSizeJobSpec":
        """Validate and normalise the fields (batch sizes sorted).

        Raises:
            InvalidArgument: naming ``spec.<field>`` (e.g. ``num_pruning_rounds`` < 1, a default
                batch size not among ``batch_sizes``, ``eta_knob`` outside [0, 1] or NaN).
        """
        f = dict(fields)
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
class Verdict:
    """The answer to a report: ``stop`` training; ``converged`` (only meaningful once
    ``finished``); the run's cost [J] so far; a human-readable ``message``."""

    stop: bool
    converged: bool
    cost_j: float
    message: str
    finished: bool


class BatchSizeJob:
    """The batch-size optimizer of one recurring job (see the module docstring).

    Every method either raises before changing anything or completes its change, so the
    registry can run it on a copy and persist that copy.
    """

    def __init__(self, spec: BatchSizeJobSpec):
        if spec.seed is None:
            raise ValueError("a BatchSizeJob needs a seeded spec")
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self.trials: list[dict[str, Any]] = []
        # (batch size, reward = -cost) of every finished run that was observed, in order
        self.observations: list[tuple[int, float]] = []
        self.min_cost: float | None = None
        self.best_batch_size = spec.default_batch_size
        self.phase = PRUNING
        self.arms: list[int] = []
        self.pruning: dict[str, Any] = {}
        self._start_round(0, list(spec.batch_sizes), spec.default_batch_size)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The whole state, JSON-ready (the RNG's state included)."""
        return {"spec": self.spec.to_dict(), "rng": self.rng.bit_generator.state,
                "trials": self.trials, "observations": self.observations,
                "min_cost": self.min_cost, "best_batch_size": self.best_batch_size,
                "phase": self.phase, "arms": self.arms, "pruning": self.pruning}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BatchSizeJob":
        """Inverse of :meth:`to_dict` (a deep copy: nothing is shared with ``d``)."""
        job = cls(BatchSizeJobSpec.from_dict(d["spec"]))
        job.rng.bit_generator.state = d["rng"]
        job.trials = [dict(t) for t in d["trials"]]
        job.observations = [(int(b), float(r)) for b, r in d["observations"]]
        job.min_cost = d["min_cost"]
        job.best_batch_size = d["best_batch_size"]
        job.phase = d["phase"]
        job.arms = list(d["arms"])
        p = d["pruning"]
        job.pruning = {**p, "sizes": list(p["sizes"]), "plan": [list(x) for x in p["plan"]],
                       "good": list(p["good"])}
        return job

    def state(self) -> dict[str, Any]:
        """A readable view: phase, best batch size, min cost [J] (None if no run converged),
        surviving arms, pruning progress and the trials."""
        return {"phase": self.phase, "best_batch_size": self.best_batch_size,
                "min_cost_j": self.min_cost, "arms": self.arms,
                "pruning_round": self.pruning["round"], "trials": self.trials}

    # ------------------------------------------------------------------ pruning
    def _start_round(self, number: int, sizes: list[int], default: int) -> None:
        i = sizes.index(default)
        down, up = sizes[: i + 1][::-1], sizes[i + 1:]
        self.pruning = {"round": number, "sizes": sizes, "default": default,
                        "plan": [d for d in (down, up) if d], "good": [],
                        "best_cost": None, "trial": None}

    def _expected_size(self) -> int:
        return self.pruning["plan"][0][0]

    def _advance_pruning(self, batch_size: int, cost: float, converged: bool) -> None:
        p = self.pruning
        direction = p["plan"][0]
        if converged:
            p["good"].append(batch_size)
            if p["best_cost"] is None or cost < p["best_cost"]:
                p["best_cost"], p["default"] = cost, batch_size
            direction.pop(0)
        else:
            direction.clear()  # a size that does not converge ends this direction
        p["plan"] = [d for d in p["plan"] if d]
        p["trial"] = None
        if p["plan"]:
            return
        survivors = sorted(p["good"])
        if survivors and p["round"] + 1 < self.spec.num_pruning_rounds:
            self._start_round(p["round"] + 1, survivors, p["default"])
        else:
            self.phase = MAB if survivors else EXHAUSTED
            self.arms = survivors

    # ------------------------------------------------------------------ Thompson sampling
    def _arm_rewards(self, arm: int) -> np.ndarray:
        rewards = [r for b, r in self.observations if b == arm]
        if self.spec.window_size:
            rewards = rewards[-self.spec.window_size:]
        return np.asarray(rewards, dtype=float)

    def _posterior(self, rewards: np.ndarray) -> tuple[float, float]:
        """(mean, precision) of an arm's expected reward: the conjugate Gaussian update with
        known reward precision 1/var(rewards) (infinite for zero variance)."""
        s = self.spec
        variance = float(np.var(rewards))
        if variance == 0.0:
            return float(rewards.mean()), math.inf
        reward_precision = 1.0 / variance
        precision = s.mab_prior_precision + len(rewards) * reward_precision
        mean = (s.mab_prior_precision * s.mab_prior_mean
                + reward_precision * float(rewards.sum())) / precision
        return mean, precision

    def _thompson_sample(self) -> int:
        rewards = {arm: self._arm_rewards(arm) for arm in self.arms}
        runs = {arm: sum(1 for b, _ in self.observations if b == arm) for arm in self.arms}
        # Exploration counts every run of the arm, not only those in the window (Zeus counts
        # the window, so a window smaller than mab_num_explorations would explore forever).
        for arm in self.rng.choice(np.asarray(self.arms), len(self.arms), replace=False):
            if runs[int(arm)] < self.spec.mab_num_explorations:
                return int(arm)
        best, best_sample = self.arms[0], -math.inf
        for arm in self.arms:
            mean, precision = self._posterior(rewards[arm])
            sample = float(self.rng.normal(mean, math.sqrt(1.0 / precision)))
            if sample > best_sample:
                best, best_sample = arm, sample
        return best

    # ------------------------------------------------------------------ API
    def cost_bound(self) -> float:
        """``beta_knob * min_cost`` [J]; +inf without early stopping or a converged run."""
        if self.spec.beta_knob is None or self.min_cost is None:
            return math.inf
        return self.spec.beta_knob * self.min_cost

    def predict(self) -> Prediction:
        """Open a trial and say its batch size.

        Raises:
            FailedPrecondition: (field ``job_id``) every batch size failed to converge in
                pruning, so there is nothing left to try.
        """
        exploration = True
        if self.phase == EXHAUSTED:
            raise FailedPrecondition(
                f"every batch size of job {self.spec.job_id!r} failed to reach the target "
                f"metric during pruning ({list(self.spec.batch_sizes)}); check target_metric and "
                "max_epochs, then delete and register the job again", "job_id")
        if self.phase == PRUNING:
            in_flight = self.pruning["trial"] is not None
            batch_size = self.best_batch_size if in_flight else self._expected_size()
            exploration = not in_flight
        else:
            batch_size = self._thompson_sample()
        number = len(self.trials) + 1
        if self.phase == PRUNING and exploration:
            self.pruning["trial"] = number
        self.trials.append({"trial_number": number, "batch_size": batch_size, "status": RUNNING,
                            "exploration": exploration, "epochs": 0, "time_s": 0.0,
                            "energy_j": 0.0, "cost_j": 0.0, "metric": None})
        return Prediction(batch_size, number, self.cost_bound(), exploration)

    def _trial(self, trial_number: int) -> dict[str, Any]:
        if not 1 <= trial_number <= len(self.trials):
            raise NotFound(f"job {self.spec.job_id!r} has no trial {trial_number}", "trial_number")
        return self.trials[trial_number - 1]

    @staticmethod
    def _stored_verdict(trial: dict[str, Any]) -> Verdict:
        return Verdict(True, trial["status"] == CONVERGED, trial["cost_j"],
                       f"trial {trial['trial_number']} already ended ({trial['status']})", True)

    def report(self, trial_number: int, epoch: int, time_s: float, energy_j: float,
               metric: float, batch_size: int = 0) -> Verdict:
        """Cumulative time [s] and energy [J] of a trial after ``epoch`` (>= 1), with the
        validation metric. Stops the run when it converged, crossed the cost bound, or reached
        ``max_epochs``. A report on an ended trial returns its stored verdict.

        Raises:
            NotFound: unknown ``trial_number``.
            InvalidArgument: ``epoch`` < 1, NaN/inf/negative ``time_s`` or ``energy_j``, NaN
                ``metric``, a zeus_cost above :data:`MAX_COST_J` (field ``time_s``).
            FailedPrecondition: ``epoch``, ``time_s`` or ``energy_j`` below the trial's last
                report (epochs must increase, cumulative figures may not shrink), or a
                ``batch_size`` (0 = not checked) other than the one predicted for the trial.
        """
        trial = self._trial(trial_number)
        if batch_size and batch_size != trial["batch_size"]:
            raise FailedPrecondition(f"trial {trial_number} was predicted with batch size "
                                     f"{trial['batch_size']}, not {batch_size}", "batch_size")
        if epoch < 1:
            raise InvalidArgument(f"must be >= 1, got {epoch}", "epoch")
        check_finite(time_s, "time_s", non_negative=True)
        check_finite(energy_j, "energy_j", non_negative=True)
        check_finite(metric, "metric")
        if trial["status"] != RUNNING:
            return self._stored_verdict(trial)
        if epoch <= trial["epochs"]:
            raise FailedPrecondition(f"{epoch} is not after the last reported epoch "
                                     f"{trial['epochs']} of trial {trial_number}", "epoch")
        for name, value in (("time_s", time_s), ("energy_j", energy_j)):
            if value < trial[name]:
                raise FailedPrecondition(f"cumulative {name} went backwards: {value} < "
                                         f"{trial[name]}", name)
        cost = self.spec.cost(energy_j, time_s)
        if not cost <= MAX_COST_J:  # the bandit's variances would overflow (inf, then NaN)
            raise InvalidArgument(f"with energy_j {energy_j} the run's zeus_cost is {cost:.6g} J,"
                                  f" above {MAX_COST_J:g} J", "time_s")
        trial.update(epochs=epoch, time_s=time_s, energy_j=energy_j, cost_j=cost, metric=metric)
        reached = self.spec.converged(metric)
        bound = self.cost_bound()
        within = cost <= bound
        if within and not reached and epoch < self.spec.max_epochs:
            return Verdict(False, False, cost, "keep training", False)
        if reached and within:
            message = "reached the target metric"
        elif not within:
            message = (f"cost {cost:.6g} J exceeded beta_knob x min_cost = {bound:.6g} J; "
                       "stopped early")
        else:
            message = f"did not reach the target metric in max_epochs = {self.spec.max_epochs}"
        return self._finish(trial, reached and within, message)

    def end_trial(self, trial_number: int) -> Verdict:
        """Close a trial that ended without a stopping verdict. With at least one epoch
        reported it counts as a run that did not converge (its cost is observed); without any
        it is abandoned (nothing observed, and a pruning step is planned again). An ended trial
        returns its stored verdict.

        Raises:
            NotFound: unknown ``trial_number``.
        """
        trial = self._trial(trial_number)
        if trial["status"] != RUNNING:
            return self._stored_verdict(trial)
        if trial["epochs"] == 0:
            trial["status"] = ABANDONED
            if self.phase == PRUNING and self.pruning["trial"] == trial_number:
                self.pruning["trial"] = None
            return Verdict(True, False, 0.0, "abandoned before any epoch was reported", True)
        return self._finish(trial, False, "ended before reaching the target metric")

    def _finish(self, trial: dict[str, Any], converged: bool, message: str) -> Verdict:
        trial["status"] = CONVERGED if converged else FAILED
        cost, batch_size = trial["cost_j"], trial["batch_size"]
        self.observations.append((batch_size, -cost))
        if converged and (self.min_cost is None or cost < self.min_cost):
            self.min_cost, self.best_batch_size = cost, batch_size
        if self.phase == PRUNING and self.pruning["trial"] == trial["trial_number"]:
            self._advance_pruning(batch_size, cost, converged)
        return Verdict(True, converged, cost, message, True)

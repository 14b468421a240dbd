"""Zeus's batch-size optimizer for one recurring job (Zeus, NSDI '23, §4;
docs/architecture.md §5).

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

Generations (docs/execution.md): a placed task's processes are stopped and restarted at every
grow, shrink or preemption. Zeus (§4) assumes a run either reaches the target or does not; an
interruption is neither, so it is not an outcome:

- :meth:`BatchSizeJob.end_trial` with ``interrupted`` *suspends* the trial: its cumulative
  time and energy (including the epoch cut short) are stored, nothing is observed, pruning
  does not advance, no arm is pruned; a pruning trial stays in flight.
- :meth:`BatchSizeJob.resume` reopens it for the next generation: epochs continue their
  numbering and the new process's figures add to the stored totals, so the trial's cost is
  zeus_cost of the sums over all its generations (§3.1, Eq. 2).
- Only a real failure (``end_trial`` without ``interrupted``) or a miss of the target
  (``max_epochs``, the cost bound) ends a trial as not converged, as before.
- **Abandoned trials**: a trial suspended for longer than the spec's
  ``suspended_trial_timeout_s`` (default one day) when a :meth:`BatchSizeJob.predict` of the
  job comes is ended as ``abandoned``, without a verdict on its batch size: nothing is
  observed, and if it was pruning's trial in flight that pruning step is planned again (the
  same batch size is tried again). Until such a Predict comes it can still be resumed.
- **Fencing** (optional, 0 = not checked): a trial remembers the ``generation`` holding it.
  Reports and ends from another generation are refused; a suspended trial is resumed by any
  generation not older than its holder, a running one only by a *later* generation (its
  holder's generation was replaced without suspending: a kill without grace; what it did not
  report is lost), so two processes can never resume the same trial at once.
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
SUSPENDED = "suspended"
#: statuses of a trial that has no final verdict yet
OPEN = (RUNNING, SUSPENDED)
PRUNING, MAB, EXHAUSTED = "pruning", "mab", "exhausted"
#: largest zeus_cost [J] a report may reach: Thompson sampling squares rewards (-cost), so
#: costs beyond ~1e154 J overflow its variance to inf and its posterior to NaN
MAX_COST_J = 1e100
#: generations are uint64 on the wire; above this they are refused (they are SQLite/JSON keys)
MAX_GENERATION = 2**63 - 1
#: default and largest ``suspended_trial_timeout_s`` [s]
DEFAULT_SUSPENDED_TRIAL_TIMEOUT_S = 86400.0
MAX_SUSPENDED_TRIAL_TIMEOUT_S = 1e9


def check_generation(generation: int, field: str = "generation") -> int:
    """``generation`` as an int in [0, :data:`MAX_GENERATION`] (0 = not given); else
    InvalidArgument naming ``field``."""
    generation = int(generation)
    if not 0 <= generation <= MAX_GENERATION:
        raise InvalidArgument(f"must be in [0, 2^63), got {generation}", field)
    return generation


@dataclass(frozen=True)
class BatchSizeJobSpec:
    """A recurring job as registered (all options filled in).

    ``batch_sizes`` sorted ascending, positive, distinct; ``default_batch_size`` one of them;
    ``eta_knob`` in [0, 1]; ``beta_knob`` > 0 or None (no early stopping); ``max_epochs`` >= 1;
    ``target_metric`` reached when ``metric >= target`` (``higher_is_better``) or
    ``metric <= target``; ``max_power_w`` [W] is zeus_cost's MaxPower (max power limit x GPUs);
    ``window_size`` 0 = whole history; ``seed`` None only before the registry draws one;
    ``suspended_trial_timeout_s`` [s] in [0, 1e9]: a trial suspended for longer when a
    Predict comes is abandoned (module docstring).
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


@dataclass(frozen=True)
class Verdict:
    """The answer to a report: ``stop`` training; ``converged`` (only meaningful once
    ``finished``); the run's cost [J] so far; a human-readable ``message``; ``suspended``:
    the trial stays open for :meth:`BatchSizeJob.resume` (an interruption)."""

    stop: bool
    converged: bool
    cost_j: float
    message: str
    finished: bool
    suspended: bool = False


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
        # (trials stored before generations existed lack the last three keys)
        job.trials = [{"generation": 0, "interruptions": 0, "suspended_at": None, **t}
                      for t in d["trials"]]
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

    def _abandon_stale(self, now: float) -> None:
        """End every trial suspended for at least ``suspended_trial_timeout_s`` before ``now``
        [s] as abandoned, without a verdict on its batch size (module docstring)."""
        for trial in self.trials:
            if (trial["status"] == SUSPENDED and trial["suspended_at"] is not None
                    and now - trial["suspended_at"] >= self.spec.suspended_trial_timeout_s):
                self._abandon(trial)

    def _abandon(self, trial: dict[str, Any]) -> None:
        """End ``trial`` without a verdict on its batch size; pruning's step is planned again."""
        trial["status"], trial["suspended_at"] = ABANDONED, None
        if self.phase == PRUNING and self.pruning["trial"] == trial["trial_number"]:
            self.pruning["trial"] = None  # planned again

    def predict(self, generation: int = 0, now: float = 0.0) -> Prediction:
        """Open a trial and say its batch size. First, trials suspended for at least
        ``suspended_trial_timeout_s`` before ``now`` [s, wall clock] are abandoned.

        Args:
            generation: the caller's generation (0 = not given), recorded as the trial's holder.
            now: the current time [s] (the registry passes the wall clock).

        Raises:
            InvalidArgument: ``generation`` outside [0, 2^63).
            FailedPrecondition: (field ``job_id``) every batch size failed to converge in
                pruning, so there is nothing left to try.
        """
        generation = check_generation(generation)
        self._abandon_stale(now)
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
                            "energy_j": 0.0, "cost_j": 0.0, "metric": None,
                            "generation": generation, "interruptions": 0, "suspended_at": None})
        return Prediction(batch_size, number, self.cost_bound(), exploration)

    def _trial(self, trial_number: int) -> dict[str, Any]:
        if not 1 <= trial_number <= len(self.trials):
            raise NotFound(f"job {self.spec.job_id!r} has no trial {trial_number}", "trial_number")
        return self.trials[trial_number - 1]

    @staticmethod
    def _stored_verdict(trial: dict[str, Any]) -> Verdict:
        return Verdict(True, trial["status"] == CONVERGED, trial["cost_j"],
                       f"trial {trial['trial_number']} already ended ({trial['status']})", True)

    @staticmethod
    def _check_holder(trial: dict[str, Any], generation: int) -> None:
        """A call from ``generation`` (0 = not checked) on a trial held by another one is
        refused (FailedPrecondition naming ``generation``)."""
        holder = trial["generation"]
        if not generation or not holder or generation == holder:
            return
        if generation < holder:
            raise FailedPrecondition(
                f"trial {trial['trial_number']} is held by generation {holder}; generation "
                f"{generation} was replaced and may no longer report on it", "generation")
        raise FailedPrecondition(
            f"trial {trial['trial_number']} is held by generation {holder}, not {generation}: "
            "resume it first (ResumeTrial)", "generation")

    def report(self, trial_number: int, epoch: int, time_s: float, energy_j: float,
               metric: float, batch_size: int = 0, generation: int = 0) -> Verdict:
        """Cumulative time [s] and energy [J] of a trial after ``epoch`` (>= 1), with the
        validation metric; both cumulative since the trial began, across generations (a
        resumed process adds its own figures to the totals :meth:`resume` returned). Stops the
        run when it converged, crossed the cost bound, or reached ``max_epochs``. A report on
        an ended trial returns its stored verdict.

        Raises:
            NotFound: unknown ``trial_number``.
            InvalidArgument: ``epoch`` < 1, NaN/inf/negative ``time_s`` or ``energy_j``, NaN
                ``metric``, a zeus_cost above :data:`MAX_COST_J` (field ``time_s``),
                ``generation`` outside [0, 2^63).
            FailedPrecondition: ``epoch``, ``time_s`` or ``energy_j`` below the trial's last
                report (epochs must increase, cumulative figures may not shrink), a
                ``batch_size`` (0 = not checked) other than the one predicted for the trial,
                a suspended trial (``trial_number``: resume it first), or a ``generation``
                other than the trial's holder.
        """
        generation = check_generation(generation)
        trial = self._trial(trial_number)
        if batch_size and batch_size != trial["batch_size"]:
            raise FailedPrecondition(f"trial {trial_number} was predicted with batch size "
                                     f"{trial['batch_size']}, not {batch_size}", "batch_size")
        if epoch < 1:
            raise InvalidArgument(f"must be >= 1, got {epoch}", "epoch")
        check_finite(time_s, "time_s", non_negative=True)
        check_finite(energy_j, "energy_j", non_negative=True)
        check_finite(metric, "metric")
        if trial["status"] not in OPEN:
            return self._stored_verdict(trial)
        if trial["status"] == SUSPENDED:
            raise FailedPrecondition(f"trial {trial_number} is suspended (its run was "
                                     "interrupted); resume it first (ResumeTrial)",
                                     "trial_number")
        self._check_holder(trial, generation)
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

    def end_trial(self, trial_number: int, interrupted: bool = False,
                  time_s: float | None = None, energy_j: float | None = None,
                  generation: int = 0, now: float = 0.0) -> Verdict:
        """Close a trial that ended without a stopping verdict, or suspend an interrupted one.

        Without ``interrupted`` (a real failure; as before generations existed): with at least
        one epoch reported it counts as a run that did not converge (its cost is observed);
        without any it is abandoned (nothing observed, and a pruning step is planned again).
        This also applies to a suspended trial (e.g. its task gave up).

        With ``interrupted`` (preemption, rescale): the trial is suspended: ``time_s`` [s] and
        ``energy_j`` [J], the trial's cumulative figures when the process stopped (None = the
        stored ones), replace the stored totals; ``now`` [s, wall clock] is kept for the
        abandoned-trial rule; nothing is observed, pruning does not advance, no arm is pruned.
        The verdict says ``stop`` (this process stops), not ``finished``, and ``suspended``.
        Suspending a suspended trial again only updates its totals (a retried call with the
        same figures changes nothing).

        An ended trial returns its stored verdict.

        Raises:
            NotFound: unknown ``trial_number``.
            InvalidArgument: ``time_s``/``energy_j`` given without ``interrupted``, NaN,
                infinite or negative; a zeus_cost above :data:`MAX_COST_J` (field
                ``time_s``); ``generation`` outside [0, 2^63).
            FailedPrecondition: ``time_s``/``energy_j`` below the stored totals (cumulative
                figures may not shrink), or a ``generation`` other than the trial's holder.
        """
        generation = check_generation(generation)
        for name, value in (("time_s", time_s), ("energy_j", energy_j)):
            if value is None:
                continue
            if not interrupted:
                raise InvalidArgument("is only accepted with interrupted (the trial's totals "
                                      "when an interrupted process stopped)", name)
            check_finite(value, name, non_negative=True)
        trial = self._trial(trial_number)
        if trial["status"] not in OPEN:
            return self._stored_verdict(trial)
        self._check_holder(trial, generation)
        if interrupted:
            return self._suspend(trial, time_s, energy_j, now)
        if trial["epochs"] == 0:
            self._abandon(trial)
            return Verdict(True, False, 0.0, "abandoned before any epoch was reported", True)
        trial["suspended_at"] = None
        return self._finish(trial, False, "ended before reaching the target metric")

    def _suspend(self, trial: dict[str, Any], time_s: float | None, energy_j: float | None,
                 now: float) -> Verdict:
        """Suspend an open ``trial`` (see :meth:`end_trial`): ``time_s`` [s] / ``energy_j`` [J]
        (None = stored) replace its totals; ``now`` [s] stamps a first suspension."""
        totals = {"time_s": trial["time_s"] if time_s is None else float(time_s),
                  "energy_j": trial["energy_j"] if energy_j is None else float(energy_j)}
        for name, value in totals.items():
            if value < trial[name]:
                raise FailedPrecondition(f"cumulative {name} went backwards: {value} < "
                                         f"{trial[name]} stored for trial "
                                         f"{trial['trial_number']}", name)
        cost = self.spec.cost(totals["energy_j"], totals["time_s"])
        if not cost <= MAX_COST_J:
            raise InvalidArgument(f"with energy_j {totals['energy_j']} the run's zeus_cost is "
                                  f"{cost:.6g} J, above {MAX_COST_J:g} J", "time_s")
        if trial["status"] == RUNNING:
            trial["interruptions"] += 1
            trial["suspended_at"] = float(now)
        trial.update(status=SUSPENDED, cost_j=cost, **totals)
        return Verdict(True, False, cost, f"trial {trial['trial_number']} suspended after epoch "
                       f"{trial['epochs']} (interrupted); the next generation resumes it "
                       "(ResumeTrial)", False, suspended=True)

    def resume(self, trial_number: int, generation: int = 0) -> Resumed:
        """Reopen an open trial for a new process (the next generation of a placed task).

        A suspended trial is resumed by a ``generation`` not older than its holder (or 0, not
        checked). A running trial is taken over only by a later generation than its holder
        (the holder's generation was replaced without suspending the trial, e.g. killed
        without grace; what it had not reported is lost); otherwise it is still held, so of two
        processes resuming the same trial at once only the first gets it. The trial keeps its
        batch size, epochs, time and energy: the resumed process numbers its epochs from
        ``epochs + 1`` and reports ``time_s``/``energy_j`` plus its own measurements.

        Raises:
            NotFound: unknown ``trial_number``.
            InvalidArgument: ``generation`` outside [0, 2^63).
            FailedPrecondition: the trial has ended (field ``trial_number``: converged, failed
                or abandoned: Predict a new one); it is running and not held by an older
                generation (``trial_number``); ``generation`` older than its holder.
        """
        generation = check_generation(generation)
        trial = self._trial(trial_number)
        if trial["status"] not in OPEN:
            raise FailedPrecondition(f"trial {trial_number} of job {self.spec.job_id!r} already "
                                     f"ended ({trial['status']}); only an open trial can be "
                                     "resumed: Predict a new one", "trial_number")
        holder = trial["generation"]
        if generation and holder and generation < holder:
            raise FailedPrecondition(f"trial {trial_number} is held by generation {holder}; "
                                     f"generation {generation} is older", "generation")
        taken_over = trial["status"] == RUNNING
        if taken_over and not (generation and generation > holder):
            held = f"generation {holder}" if holder else "a process that gave no generation"
            raise FailedPrecondition(
                f"trial {trial_number} is running, held by {held}: a trial is resumed after "
                "EndTrial with interrupted, or by a later generation than its holder",
                "trial_number")
        if taken_over:
            trial["interruptions"] += 1
        trial.update(status=RUNNING, suspended_at=None, generation=generation or holder)
        return Resumed(trial_number, trial["batch_size"], trial["epochs"], trial["time_s"],
                       trial["energy_j"], trial["cost_j"], self.cost_bound(),
                       trial["exploration"], trial["generation"], taken_over)

    def _finish(self, trial: dict[str, Any], converged: bool, message: str) -> Verdict:
        trial["status"] = CONVERGED if converged else FAILED
        cost, batch_size = trial["cost_j"], trial["batch_size"]
        self.observations.append((batch_size, -cost))
        if converged and (self.min_cost is None or cost < self.min_cost):
            self.min_cost, self.best_batch_size = cost, batch_size
        if self.phase == PRUNING and self.pruning["trial"] == trial["trial_number"]:
            self._advance_pruning(batch_size, cost, converged)
        return Verdict(True, converged, cost, message, True)

"""Which batch size a recurring Zeus job tries next, and when a run stops early (Zeus, NSDI '23:
pruning §4.2, Gaussian Thompson sampling §4.3, early stopping §4.4; the rules are in the
docstring of :mod:`offcut.daemon.zeus.bso`, items 1-3).

:class:`BatchSizePolicy` holds the seeded RNG, the observed runs (batch size, reward = -cost
[J]), the lowest converged cost, the phase (``pruning``, ``mab``, ``exhausted``), the surviving
arms and pruning's progress. It knows nothing of trials' records: the job tells it which trial
pruning waits for (:meth:`BatchSizePolicy.claim`, :meth:`BatchSizePolicy.release`) and what a
finished run cost (:meth:`BatchSizePolicy.observe`).

Units: costs and rewards in J (zeus_cost), batch sizes in samples.
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from offcut.errors import FailedPrecondition

if TYPE_CHECKING:  # (bso imports this module)
    from offcut.daemon.zeus.bso import BatchSizeJobSpec

PRUNING, MAB, EXHAUSTED = "pruning", "mab", "exhausted"


class BatchSizePolicy:
    """Pruning, Thompson sampling and the early-stopping bound of one job.

    Attributes (persisted by :class:`offcut.daemon.zeus.bso.BatchSizeJob`): ``rng`` (seeded
    from ``spec.seed``), ``observations`` [(batch size, reward = -cost [J])] of every finished
    run observed, in order (kept as packed arrays, 24 bytes per run, with each batch size's
    rewards apart, so a Thompson sample costs O(arms + that arm's history) and never scans
    every run: the same numbers in the same order as filtering the list, so the same floats); ``min_cost`` [J] the lowest cost of a converged run (None: none);
    ``best_batch_size`` its batch size (the default before); ``phase``; ``arms`` the survivors
    of pruning; ``pruning`` the current round: ``{"round", "sizes", "default", "plan"
    (directions still to walk), "good" (sizes that converged), "best_cost", "trial" (the
    trial it waits for, or None)}``.
    """

    def __init__(self, spec: "BatchSizeJobSpec"):
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self._sizes = array("q")  # every observed run's batch size, in order
        self._rewards = array("d")  # ... and its reward (-cost [J])
        self._by_arm: dict[int, array] = {}  # batch size -> its rewards, in order
        self._posteriors: dict[int, tuple[float, float]] = {}  # arm -> cached _posterior
        self.min_cost: float | None = None
        self.best_batch_size = spec.default_batch_size
        self.phase = PRUNING
        self.arms: list[int] = []
        self.pruning: dict[str, Any] = {}
        self._start_round(0, list(spec.batch_sizes), spec.default_batch_size)

    # ------------------------------------------------------------------ observed runs
    @property
    def observations(self) -> list[tuple[int, float]]:
        """(batch size, reward = -cost [J]) of every observed run, in order (a new list)."""
        return list(zip(map(int, self._sizes), map(float, self._rewards)))

    @property
    def observed(self) -> int:
        """How many runs were observed."""
        return len(self._sizes)

    def observations_since(self, start: int) -> list[tuple[int, float]]:
        """The observed runs from index ``start`` on (what a call added)."""
        return list(zip(map(int, self._sizes[start:]), map(float, self._rewards[start:])))

    def _record(self, batch_size: int, reward: float) -> None:
        self._sizes.append(int(batch_size))
        self._rewards.append(float(reward))
        self._by_arm.setdefault(int(batch_size), array("d")).append(float(reward))
        self._posteriors.pop(int(batch_size), None)

    # ------------------------------------------------------------------ choosing
    def choose(self) -> tuple[int, bool]:
        """(batch size, exploration) of the next run: pruning's next size, or the best known
        one while pruning's run is in flight (``exploration`` False); a Thompson sample in
        ``mab``. FailedPrecondition (field ``job_id``) when pruning left nothing to try."""
        if self.phase == EXHAUSTED:
            raise FailedPrecondition(
                f"every batch size of job {self.spec.job_id!r} failed to reach the target "
                f"metric during pruning ({list(self.spec.batch_sizes)}); check target_metric and "
                "max_epochs, then delete and register the job again", "job_id")
        if self.phase == PRUNING:
            in_flight = self.pruning["trial"] is not None
            return (self.best_batch_size if in_flight else self._expected_size()), not in_flight
        return self._thompson_sample(), True

    def claim(self, trial_number: int, exploration: bool) -> None:
        """Pruning waits for ``trial_number`` when it is pruning's exploration run."""
        if self.phase == PRUNING and exploration:
            self.pruning["trial"] = trial_number

    def release(self, trial_number: int) -> None:
        """``trial_number`` ended without a verdict: if pruning waited for it, its step is
        planned again."""
        if self.phase == PRUNING and self.pruning["trial"] == trial_number:
            self.pruning["trial"] = None  # planned again

    # ------------------------------------------------------------------ early stopping
    def cost_bound(self) -> float:
        """``beta_knob * min_cost`` [J]; +inf without early stopping or a converged run."""
        if self.spec.beta_knob is None or self.min_cost is None:
            return math.inf
        return self.spec.beta_knob * self.min_cost

    def judge(self, cost: float, reached: bool, epoch: int) -> tuple[bool, bool, str]:
        """(stop, converged, message) after ``epoch`` of a run that cost ``cost`` [J] so far
        and did (``reached``) or did not reach the target: it stops when it converged,
        crossed the cost bound (not converged), or reached ``max_epochs``."""
        bound = self.cost_bound()
        within = cost <= bound
        if within and not reached and epoch < self.spec.max_epochs:
            return False, False, "keep training"
        if reached and within:
            message = "reached the target metric"
        elif not within:
            message = (f"cost {cost:.6g} J exceeded beta_knob x min_cost = {bound:.6g} J; "
                       "stopped early")
        else:
            message = f"did not reach the target metric in max_epochs = {self.spec.max_epochs}"
        return True, reached and within, message

    def observe(self, trial_number: int, batch_size: int, cost: float, converged: bool) -> None:
        """A finished run of ``batch_size`` cost ``cost`` [J]: record reward -cost, lower
        ``min_cost`` if it converged, and advance pruning if it waited for this trial."""
        self._record(batch_size, -cost)
        if converged and (self.min_cost is None or cost < self.min_cost):
            self.min_cost, self.best_batch_size = cost, batch_size
        if self.phase == PRUNING and self.pruning["trial"] == trial_number:
            self._advance_pruning(batch_size, cost, converged)

    # ------------------------------------------------------------------ pruning
    def _start_round(self, number: int, sizes: list[int], default: int) -> None:
        """Round ``number`` over ``sizes``: down from ``default``, then up."""
        i = sizes.index(default)
        down, up = sizes[: i + 1][::-1], sizes[i + 1:]
        self.pruning = {"round": number, "sizes": sizes, "default": default,
                        "plan": [d for d in (down, up) if d], "good": [],
                        "best_cost": None, "trial": None}

    def _expected_size(self) -> int:
        return self.pruning["plan"][0][0]

    def _advance_pruning(self, batch_size: int, cost: float, converged: bool) -> None:
        """Pruning's run of ``batch_size`` ended: walk on, or end the round (then the next
        round from the cheapest survivor, or the bandit over the survivors)."""
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
    def arm_rewards(self, arm: int) -> np.ndarray:
        """Rewards (-cost [J]) of ``arm``'s runs, the last ``window_size`` when windowed (a
        new array, float64, in the order observed)."""
        rewards = self._by_arm.get(int(arm))
        if rewards is None:
            return np.asarray([], dtype=float)
        if self.spec.window_size:
            rewards = rewards[-self.spec.window_size:]
        return np.frombuffer(rewards, dtype=float).copy() if len(rewards) else \
            np.asarray([], dtype=float)

    def arm_runs(self, arm: int) -> int:
        """How many runs of ``arm`` were observed (all, not only the window)."""
        rewards = self._by_arm.get(int(arm))
        return 0 if rewards is None else len(rewards)

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
        """An arm under exploration (fewer than ``mab_num_explorations`` runs) in random
        order, else the arm whose posterior sample is highest (Zeus's ``GaussianTS`` order)."""
        runs = {arm: self.arm_runs(arm) for arm in self.arms}
        # Exploration counts every run of the arm, not only those in the window (Zeus counts
        # the window, so a window smaller than mab_num_explorations would explore forever).
        for arm in self.rng.choice(np.asarray(self.arms), len(self.arms), replace=False):
            if runs[int(arm)] < self.spec.mab_num_explorations:
                return int(arm)
        best, best_sample = self.arms[0], -math.inf
        for arm in self.arms:
            posterior = self._posteriors.get(arm)
            if posterior is None:  # (an arm's posterior changes only when it is observed)
                posterior = self._posteriors[arm] = self._posterior(self.arm_rewards(arm))
            mean, precision = posterior
            sample = float(self.rng.normal(mean, math.sqrt(1.0 / precision)))
            if sample > best_sample:
                best, best_sample = arm, sample
        return best

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The fields of :meth:`offcut.daemon.zeus.bso.BatchSizeJob.to_dict` this holds but
        ``rng`` and ``trials``, in that order (the lists are this policy's own, not copies)."""
        return {"observations": self.observations, **self.summary()}

    def summary(self) -> dict[str, Any]:
        """:meth:`to_dict` without the observed runs: O(number of batch sizes) (the lists are
        this policy's own, not copies)."""
        return {"min_cost": self.min_cost, "best_batch_size": self.best_batch_size,
                "phase": self.phase, "arms": self.arms, "pruning": self.pruning}

    def restore(self, d: dict[str, Any]) -> None:
        """Take the fields of :meth:`to_dict` from ``d``, as copies (the RNG's state is the
        job's to restore: it comes first in the stored form)."""
        self._sizes, self._rewards, self._by_arm = array("q"), array("d"), {}
        self._posteriors = {}
        for b, r in d["observations"]:
            self._record(int(b), float(r))
        self.min_cost = d["min_cost"]
        self.best_batch_size = d["best_batch_size"]
        self.phase = d["phase"]
        self.arms = list(d["arms"])
        p = d["pruning"]
        self.pruning = {**p, "sizes": list(p["sizes"]), "plan": [list(x) for x in p["plan"]],
                        "good": list(p["good"])}

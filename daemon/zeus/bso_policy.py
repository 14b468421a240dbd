"""Which batch size a recurring Zeus job tries next, and when a run stops early (Zeus, NSDI '23:
pruning (Section 4.2), Gaussian Thompson sampling (Section 4.3), early stopping (Section 4.4); the
rules are in the docstring of :mod:`offcut.daemon.zeus.bso`, items 1-3).

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
    from offcut.zeus_views import BatchSizeJobSpec

PRUNING, MAB, EXHAUSTED = "pruning", "mab", "exhausted"
#: an arm's runs beyond its retention are dropped from memory (and their rows from the state
#: file) once this many more have accumulated: amortised, in batches of this size
TRIM_BATCH = 1000


class BatchSizePolicy:
    """Pruning, Thompson sampling and the early-stopping bound of one job.

    Attributes (persisted by :class:`offcut.daemon.zeus.bso.BatchSizeJob`): ``rng`` (seeded
    from ``spec.seed``), ``observations`` [(batch size, reward = -cost [J])] of the finished
    runs observed, in order (kept as packed arrays per batch size, seq and reward, 16 bytes per
    run, so a Thompson sample costs O(arms + that arm's history) and never scans every run:
    the same numbers in the same order as filtering the list, so the same floats; with a
    ``retention`` only each arm's newest :meth:`keep` runs are read, and older ones dropped); ``min_cost`` [J] the lowest cost of a converged run (None: none);
    ``best_batch_size`` its batch size (the default before); ``phase``; ``arms`` the survivors
    of pruning; ``pruning`` the current round: ``{"round", "sizes", "default", "plan"
    (directions still to walk), "good" (sizes that converged), "best_cost", "trial" (the
    trial it waits for, or None)}``.
    """

    def __init__(self, spec: "BatchSizeJobSpec", retention: int | None = None):
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        #: runs kept per arm (None: all): never fewer than the window and the explorations,
        #: so a windowed job's decisions never depend on it (:meth:`keep`)
        self.retention = retention
        self._count = 0  # runs ever observed (the next run's seq)
        self._by_arm: dict[int, array] = {}  # batch size -> its kept rewards, in order
        self._seqs: dict[int, array] = {}  # batch size -> the seqs of those rewards
        #: seqs of runs dropped from memory whose rows are not deleted yet (the registry
        #: takes them into its next write: :meth:`take_dropped`)
        self.dropped: list[int] = []
        self._posteriors: dict[int, tuple[float, float]] = {}  # arm -> cached _posterior
        self.min_cost: float | None = None
        self.best_batch_size = spec.default_batch_size
        self.phase = PRUNING
        self.arms: list[int] = []
        self.pruning: dict[str, Any] = {}
        self._start_round(0, list(spec.batch_sizes), spec.default_batch_size)

    # ------------------------------------------------------------------ observed runs
    def keep(self) -> int | None:
        """Runs of an arm that Thompson sampling reads: ``retention``, at least the window and
        ``mab_num_explorations`` (None: every run)."""
        if self.retention is None:
            return None
        return max(int(self.retention), self.spec.window_size or 0,
                   self.spec.mab_num_explorations)

    def _kept(self) -> list[tuple[int, int, float]]:
        """(seq, batch size, reward) of every run in memory, by seq."""
        rows = [(int(s), arm, float(r)) for arm, rewards in self._by_arm.items()
                for s, r in zip(self._seqs[arm], rewards)]
        return sorted(rows)

    @property
    def observations(self) -> list[tuple[int, float]]:
        """(batch size, reward = -cost [J]) of every observed run still kept (all of them
        unless an arm has more than :meth:`keep`), in order (a new list)."""
        return [(b, r) for _, b, r in self._kept()]

    @property
    def observed(self) -> int:
        """How many runs were observed (ever)."""
        return self._count

    def observations_since(self, start: int) -> list[tuple[int, int, float]]:
        """``(seq, batch size, reward)`` of the runs observed from seq ``start`` on (what a
        call added; O(arms + those runs))."""
        if start >= self._count:  # (nothing observed since: a Predict)
            return []
        rows = []
        for arm, seqs in self._seqs.items():
            i = len(seqs)
            while i and seqs[i - 1] >= start:
                i -= 1
            rewards = self._by_arm[arm]
            rows.extend((int(seqs[j]), arm, float(rewards[j])) for j in range(i, len(seqs)))
        return sorted(rows)

    def take_dropped(self, limit: int) -> list[int]:
        """Up to ``limit`` seqs of dropped runs whose rows are to be deleted (removed from
        :attr:`dropped`)."""
        taken, self.dropped = self.dropped[:limit], self.dropped[limit:]
        return taken

    def _record(self, batch_size: int, reward: float, seq: int | None = None) -> None:
        arm = int(batch_size)
        seq = self._count if seq is None else int(seq)
        self._count = max(self._count, seq + 1)
        self._by_arm.setdefault(arm, array("d")).append(float(reward))
        seqs = self._seqs.setdefault(arm, array("q"))
        seqs.append(seq)
        self._posteriors.pop(arm, None)
        keep = self.keep()
        if keep is not None and len(seqs) >= keep + TRIM_BATCH:
            cut = len(seqs) - keep  # (only runs no decision reads any more: arm_rewards)
            self.dropped.extend(seqs[:cut])
            del seqs[:cut]
            del self._by_arm[arm][:cut]

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
        """Rewards (-cost [J]) of ``arm``'s runs, the last ``window_size`` when windowed, else
        the last :meth:`keep` (a new array, float64, in the order observed)."""
        rewards = self._by_arm.get(int(arm))
        if rewards is None:
            return np.asarray([], dtype=float)
        window = self.spec.window_size or self.keep()
        if window:
            rewards = rewards[-window:]
        return np.frombuffer(rewards, dtype=float).copy() if len(rewards) else \
            np.asarray([], dtype=float)

    def arm_runs(self, arm: int) -> int:
        """How many runs of ``arm`` were observed (all, not only the window), counted up to
        :meth:`keep` (>= ``mab_num_explorations``, the only number it is compared with)."""
        rewards = self._by_arm.get(int(arm))
        n = 0 if rewards is None else len(rewards)
        keep = self.keep()
        return n if keep is None else min(n, keep)

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
        order, else the arm whose posterior sample is highest (Zeus's ``GaussianTS`` order:
        one shuffle of the arms, then one normal draw per arm in the arms' order, drawn here
        as one block of standard normals scaled by each posterior, the same floats as a
        ``normal(mean, sd)`` per arm)."""
        arms, explorations = self.arms, self.spec.mab_num_explorations
        # Exploration counts every run of the arm, not only those in the window (Zeus counts
        # the window, so a window smaller than mab_num_explorations would explore forever).
        for arm in self.rng.choice(np.asarray(arms), len(arms), replace=False).tolist():
            if self.arm_runs(arm) < explorations:
                return arm
        draws = self.rng.standard_normal(len(arms)).tolist()
        best, best_sample = arms[0], -math.inf
        for arm, draw in zip(arms, draws):
            posterior = self._posteriors.get(arm)
            if posterior is None:  # (an arm's posterior changes only when it is observed)
                posterior = self._posteriors[arm] = self._posterior(self.arm_rewards(arm))
            mean, precision = posterior
            sample = mean + math.sqrt(1.0 / precision) * draw
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
        job's to restore: it comes first in the stored form). ``d["observations"]`` holds
        ``(batch size, reward)`` pairs (seqs 0, 1, ...) or the state file's ``(seq, batch
        size, reward)`` rows."""
        self._count, self._by_arm, self._seqs, self.dropped = 0, {}, {}, []
        self._posteriors = {}
        for i, row in enumerate(d["observations"]):
            if len(row) == 3:
                self._record(int(row[1]), float(row[2]), int(row[0]))
            else:
                self._record(int(row[0]), float(row[1]), i)
        self.min_cost = d["min_cost"]
        self.best_batch_size = d["best_batch_size"]
        self.phase = d["phase"]
        self.arms = list(d["arms"])
        p = d["pruning"]
        self.pruning = {**p, "sizes": list(p["sizes"]), "plan": [list(x) for x in p["plan"]],
                        "good": list(p["good"])}

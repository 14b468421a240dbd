"""Zeus's batch-size optimizer for one recurring job (Zeus, NSDI '23, Section 4;
docs/zeus.md, "The batch-size optimizer").

A deterministic state machine with no I/O: the registry persists :meth:`BatchSizeJob.to_dict`
after every call, including the seeded RNG's state, so a restarted daemon continues the same
batch-size sequence exactly.

1. **Pruning** (Section 4.2), ``num_pruning_rounds`` rounds: from the default batch size b0 walk
   down through smaller sizes, then up through larger ones; a size that does not converge ends that
   direction; the sizes that converged survive, and the cheapest of them is the next round's b0.
2. **Gaussian Thompson sampling** (Section 4.3) over the survivors, reward = -cost: per arm, mean
   and precision are refitted from its (windowed) history with a Gaussian prior and reward
   precision 1/variance (infinite when the variance is 0); arms with fewer than
   ``mab_num_explorations`` observations are tried first in random order; otherwise each arm's
   posterior is sampled and the best sample wins. The draw order follows Zeus's ``GaussianTS``.
3. **Early stopping** (Section 4.4): a run stops once its cost exceeds ``beta_knob * min_cost``,
   where ``min_cost`` is the lowest cost of a *converged* run (Zeus's server also lowers it with
   runs that did not converge, which can lock a job out for good). A run stopped by the bound counts
   as not converged.

Concurrency: while a pruning run is in flight, further predictions get the best batch size known
so far (flagged ``exploration=False``) and their results never advance pruning; Thompson
sampling needs no such rule (every prediction is a fresh posterior sample).

Generations (docs/execution.md): a placed task's processes are stopped and restarted at every
grow, shrink or preemption. Zeus (Section 4) assumes a run either reaches the target or does not; an
interruption is neither, so it is not an outcome:

- :meth:`BatchSizeJob.end_trial` with ``interrupted`` *suspends* the trial: its cumulative
  time and energy (including the epoch cut short) are stored, nothing is observed, pruning
  does not advance, no arm is pruned; a pruning trial stays in flight.
- :meth:`BatchSizeJob.resume` reopens it for the next generation: epochs continue their
  numbering and the new process's figures add to the stored totals, so the trial's cost is
  zeus_cost of the sums over all its generations (Section 3.1, Eq. 2).
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

Parts: :mod:`offcut.daemon.zeus.bso_trials` keeps the trials (records, reports, suspension,
resumption, fencing, abandonment), :mod:`offcut.daemon.zeus.bso_policy` chooses batch sizes
and stops runs early (pruning, Thompson sampling, the cost bound); :class:`BatchSizeJob`
composes them behind one API and one persisted form.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from offcut.daemon.zeus.bso_policy import EXHAUSTED, BatchSizePolicy
from offcut.daemon.zeus.bso_trials import OPEN, TrialLedger, check_generation
from offcut.trial_verdict import Verdict
from offcut.zeus_views import BatchSizeJobSpec, Prediction, Resumed



def _part(part: str, name: str, doc: str) -> property:
    """A read-only property of :class:`BatchSizeJob` that reads ``name`` of its ``part``
    (``ledger`` or ``policy``): the object itself, not a copy."""
    return property(lambda job: getattr(getattr(job, part), name), doc=doc)


class BatchSizeJob:
    """The batch-size optimizer of one recurring job (see the module docstring).

    Composes a :class:`~offcut.daemon.zeus.bso_trials.TrialLedger` (the trials: records,
    reports, suspension, resumption, fencing) and a
    :class:`~offcut.daemon.zeus.bso_policy.BatchSizePolicy` (pruning, Thompson sampling, the
    early-stopping bound); ``spec``, ``trials``, ``rng``, ``observations``, ``min_cost``,
    ``best_batch_size``, ``phase``, ``arms`` and ``pruning`` read their state.

    Every method either raises before changing anything or completes its change, so the
    registry can run it on a copy and persist that copy.
    """

    def __init__(self, spec: BatchSizeJobSpec):
        if spec.seed is None:
            raise ValueError("a BatchSizeJob needs a seeded spec")
        self.spec = spec
        self.ledger = TrialLedger(spec)
        self.policy = BatchSizePolicy(spec)

    # ------------------------------------------------------------------ state (read-only)
    trials = _part("ledger", "trials",
                   "The trial records in memory (list of dicts, ascending): every trial until the "
                   "registry evicts old finished ones (``trials[i]`` is then trial number i + 1).")
    rng = _part("policy", "rng", "The seeded RNG of Thompson sampling (numpy Generator).")
    observations = _part("policy", "observations", "(batch size, reward = -cost [J]) of every "
                         "finished run that was observed, in order.")
    min_cost = _part("policy", "min_cost", "The lowest cost [J] of a converged run; None "
                     "before one.")
    best_batch_size = _part("policy", "best_batch_size", "The batch size of ``min_cost`` (the "
                            "default before a run converged).")
    phase = _part("policy", "phase", "``pruning``, ``mab`` or ``exhausted``.")
    arms = _part("policy", "arms", "The batch sizes that survived pruning (Thompson sampling's "
                 "arms).")
    pruning = _part("policy", "pruning", "Pruning's current round (a dict, see "
                    ":class:`~offcut.daemon.zeus.bso_policy.BatchSizePolicy`).")

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The whole state, JSON-ready (the RNG's state included)."""
        return {"spec": self.spec.to_dict(), "rng": self.rng.bit_generator.state,
                "trials": self.trials, **self.policy.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BatchSizeJob":
        """Inverse of :meth:`to_dict` (a deep copy: nothing is shared with ``d``)."""
        job = cls(BatchSizeJobSpec.from_dict(d["spec"]))
        job.rng.bit_generator.state = d["rng"]
        # (trials stored before generations existed lack the last three keys)
        job.ledger.trials = TrialLedger.restore(d["trials"])
        job.policy.restore(d)
        return job

    def summary(self) -> dict[str, Any]:
        """The state without the trials and the observed runs, JSON-ready: O(number of batch
        sizes) whatever the job's history (spec, RNG, min cost, best batch size, phase, arms,
        pruning; ``trial_count`` = trials ever opened). The registry stores it in place and the
        trials and observations as rows (:meth:`from_parts` is its inverse)."""
        return {"spec": self._spec_fields, **self._changing()}

    @functools.cached_property
    def _spec_fields(self) -> dict[str, Any]:
        """``spec.to_dict()``, made once (the spec is frozen)."""
        return self.spec.to_dict()

    @functools.cached_property
    def _spec_text(self) -> str:
        """:attr:`_spec_fields` as compact JSON text, encoded once."""
        return json.dumps(self._spec_fields, separators=(",", ":"))

    def _changing(self) -> dict[str, Any]:
        """:meth:`summary` without the spec (what a call can change)."""
        return {"rng": self.rng.bit_generator.state, "trial_count": self.ledger.count,
                "predicted": sorted(self.ledger.predicted), **self.policy.summary()}

    def summary_json(self) -> str:
        """:meth:`summary` as compact JSON text (the spec's text encoded once: the registry
        writes this on every call, docs/zeus.md, "Storage")."""
        return ('{"spec":' + self._spec_text + ","
                + json.dumps(self._changing(), separators=(",", ":"))[1:])

    @classmethod
    def from_parts(cls, summary: dict[str, Any], observations: list[tuple[int, float]],
                   trials: list[dict[str, Any]]) -> "BatchSizeJob":
        """The job of a :meth:`summary`, its observed runs (``(batch size, reward = -cost
        [J])`` in order, or the state file's ``(seq, batch size, reward)`` rows) and the trial
        records to hold in memory (any subset that includes
        every open trial)."""
        job = cls.from_dict({**summary, "observations": observations, "trials": trials})
        job.ledger.count = max(job.ledger.count, int(summary["trial_count"]))
        job.ledger.predicted.update(int(b) for b in summary.get("predicted", ()))
        return job

    def state(self) -> dict[str, Any]:
        """A readable view: phase, best batch size, min cost [J] (None if no run converged),
        surviving arms, pruning progress and the trials."""
        return {"phase": self.phase, "best_batch_size": self.best_batch_size,
                "min_cost_j": self.min_cost, "arms": self.arms,
                "pruning_round": self.pruning["round"], "trials": self.trials}

    # ------------------------------------------------------------------ API
    def cost_bound(self) -> float:
        """``beta_knob * min_cost`` [J]; +inf without early stopping or a converged run."""
        return self.policy.cost_bound()

    def _arm_rewards(self, arm: int) -> np.ndarray:
        """Rewards (-cost [J]) of ``arm``'s runs in Thompson sampling's window."""
        return self.policy.arm_rewards(arm)

    _stored_verdict = staticmethod(TrialLedger.stored_verdict)

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
        if self.phase == EXHAUSTED:
            self.policy.choose()  # raises before stale trials are abandoned (nothing changes)
        for trial in self.ledger.stale(now):
            self._abandon(trial)
        batch_size, exploration = self.policy.choose()
        number = self.ledger.open(batch_size, exploration, generation)
        self.policy.claim(number, exploration)
        return Prediction(batch_size, number, self.cost_bound(), exploration)

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
        trial = self.ledger.get(trial_number)
        stored = self.ledger.record_epoch(trial, epoch, time_s, energy_j, metric, batch_size,
                                          generation)
        if stored is not None:
            return stored
        cost = trial["cost_j"]
        stop, converged, message = self.policy.judge(cost, self.spec.converged(metric), epoch)
        if not stop:
            return Verdict(False, False, cost, message, False)
        return self._finish(trial, converged, message)

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
        self.ledger.check_end_figures(interrupted, time_s, energy_j)
        trial = self.ledger.get(trial_number)
        if trial["status"] not in OPEN:
            return self.ledger.stored_verdict(trial)
        self.ledger.check_holder(trial, generation)
        if interrupted:
            return self.ledger.suspend(trial, time_s, energy_j, now)
        if trial["epochs"] == 0:
            self._abandon(trial)
            return Verdict(True, False, 0.0, "abandoned before any epoch was reported", True)
        trial["suspended_at"] = None
        return self._finish(trial, False, "ended before reaching the target metric")

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
        return self.ledger.resume(trial_number, generation, self.cost_bound())

    def _abandon(self, trial: dict[str, Any]) -> None:
        """End ``trial`` without a verdict on its batch size; pruning's step is planned again."""
        self.ledger.abandon(trial)
        self.policy.release(trial["trial_number"])

    def _finish(self, trial: dict[str, Any], converged: bool, message: str) -> Verdict:
        """Give ``trial`` its verdict and let the policy observe its cost."""
        self.ledger.conclude(trial, converged)
        cost = trial["cost_j"]
        self.policy.observe(trial["trial_number"], trial["batch_size"], cost, converged)
        return Verdict(True, converged, cost, message, True)

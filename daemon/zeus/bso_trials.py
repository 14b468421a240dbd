"""The trials of one recurring Zeus job: their records, epoch reports, suspension across
generations, resumption, fencing and abandonment (Zeus, NSDI '23, Sections 3.1 and 4; the rules are
in the docstring of :mod:`offcut.daemon.zeus.bso`, "Generations").

:class:`TrialLedger` keeps every trial as a JSON-ready dict (the persisted form, see
:meth:`TrialLedger.open`) and checks every call on a trial before it changes anything. It
decides nothing about batch sizes: what a finished trial means for pruning, Thompson sampling
and the cost bound is :class:`offcut.daemon.zeus.bso_policy.BatchSizePolicy`'s.

Units: time [s], energy [J], zeus_cost [J] (``BatchSizeJobSpec.cost``), wall-clock [s].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from offcut.taskspec import check_finite
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.trial_verdict import Verdict
from offcut.zeus_views import Resumed

if TYPE_CHECKING:  # (bso imports this module)
    from offcut.zeus_views import BatchSizeJobSpec

RUNNING, CONVERGED, FAILED, ABANDONED = "running", "converged", "failed", "abandoned"
SUSPENDED = "suspended"
#: statuses of a trial that has no final verdict yet
OPEN = (RUNNING, SUSPENDED)
#: largest zeus_cost [J] a report may reach: Thompson sampling squares rewards (-cost), so
#: costs beyond ~1e154 J overflow its variance to inf and its posterior to NaN
MAX_COST_J = 1e100
#: generations are uint64 on the wire; above this they are refused (they are SQLite/JSON keys)
MAX_GENERATION = 2**63 - 1


def check_generation(generation: int, field: str = "generation") -> int:
    """``generation`` as an int in [0, :data:`MAX_GENERATION`] (0 = not given); else
    InvalidArgument naming ``field``."""
    generation = int(generation)
    if not 0 <= generation <= MAX_GENERATION:
        raise InvalidArgument(f"must be in [0, 2^63), got {generation}", field)
    return generation


class TrialLedger:
    """The trials of one job, as persisted dicts, numbered from 1.

    In memory (``held``: trial number -> record, ascending): every open trial and the finished
    ones not yet evicted (:meth:`evict`). ``count`` is the number of trials ever opened. A
    finished trial that left memory is read through ``loader`` (trial number -> its record or
    None; set by the registry, which reads the state file): finished trials never change, so
    such a record is only read. ``touched`` collects the numbers of the records a call may have
    changed (the registry writes those rows, then clears it).
    """

    def __init__(self, spec: "BatchSizeJobSpec"):
        self.spec = spec
        self.held: dict[int, dict[str, Any]] = {}
        self.count = 0
        self._suspended: set[int] = set()  # (may hold numbers no longer suspended: stale())
        self.touched: set[int] = set()
        self.loader: Callable[[int], dict[str, Any] | None] | None = None
        #: batch sizes ever predicted (a power profile may only be asked for one of them)
        self.predicted: set[int] = set()

    @property
    def trials(self) -> list[dict[str, Any]]:
        """The records in memory, ascending by trial number (all of them until :meth:`evict`
        ran: ``trials[i]`` is then trial number i + 1)."""
        return list(self.held.values())

    @trials.setter
    def trials(self, records: list[dict[str, Any]]) -> None:
        self.held = {int(t["trial_number"]): t for t in records}
        self.count = max(self.held, default=0)
        self.predicted = {int(t["batch_size"]) for t in records}
        self._suspended = {n for n, t in self.held.items() if t["status"] == SUSPENDED}

    # ------------------------------------------------------------------ records
    def open(self, batch_size: int, exploration: bool, generation: int) -> int:
        """Append a running trial of ``batch_size`` held by ``generation``; its number."""
        number = self.count + 1
        self.held[number] = {"trial_number": number, "batch_size": batch_size,
                             "status": RUNNING, "exploration": exploration, "epochs": 0,
                             "time_s": 0.0, "energy_j": 0.0, "cost_j": 0.0, "metric": None,
                             "generation": generation, "interruptions": 0, "suspended_at": None}
        self.count = number
        self.touched.add(number)
        self.predicted.add(int(batch_size))
        return number

    def get(self, trial_number: int) -> dict[str, Any]:
        """The trial's record; NotFound (field ``trial_number``) for an unknown number. A
        record no longer in memory is read through ``loader`` (a finished trial: a copy that
        no call changes)."""
        trial = self.held.get(trial_number)
        if trial is not None:
            self.touched.add(trial_number)
            return trial
        if 1 <= trial_number <= self.count and self.loader is not None:
            trial = self.loader(trial_number)
            if trial is not None:
                return self.restore([trial])[0]
            raise NotFound(f"trial {trial_number} of job {self.spec.job_id!r} ended and its "
                           "record is no longer kept (zeus_trial_rows_retention)",
                           "trial_number")
        raise NotFound(f"job {self.spec.job_id!r} has no trial {trial_number}", "trial_number")

    def evict(self, keep: int, durable: Callable[[int], bool] | None = None) -> list[int]:
        """Drop the oldest finished trials from memory until at most ``keep`` (>= 0) records
        remain, or only open ones (open trials always stay); the numbers dropped, ascending.
        Only records whose final state is durable may go: ``durable(number)`` (None = all
        are) says which; the walk stops at the first one that is not. Amortised O(1) per call
        unless many open trials are older than the finished ones."""
        excess = len(self.held) - max(0, keep)
        if excess <= 0:
            return []
        dropped = []
        for n, t in self.held.items():
            if t["status"] not in OPEN:
                if durable is not None and not durable(n):
                    break
                dropped.append(n)
                if len(dropped) == excess:
                    break
        for n in dropped:
            del self.held[n]
        return dropped

    @staticmethod
    def stored_verdict(trial: dict[str, Any]) -> Verdict:
        """The verdict an ended ``trial`` answers every later call with."""
        return Verdict(True, trial["status"] == CONVERGED, trial["cost_j"],
                       f"trial {trial['trial_number']} already ended ({trial['status']})", True)

    @staticmethod
    def check_holder(trial: dict[str, Any], generation: int) -> None:
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

    def _cost(self, energy_j: float, time_s: float) -> float:
        """zeus_cost [J] of the totals; InvalidArgument (field ``time_s``) above
        :data:`MAX_COST_J` (the bandit's variances would overflow: inf, then NaN)."""
        cost = self.spec.cost(energy_j, time_s)
        if not cost <= MAX_COST_J:
            raise InvalidArgument(f"with energy_j {energy_j} the run's zeus_cost is {cost:.6g} J,"
                                  f" above {MAX_COST_J:g} J", "time_s")
        return cost

    # ------------------------------------------------------------------ calls on a trial
    def record_epoch(self, trial: dict[str, Any], epoch: int, time_s: float, energy_j: float,
                     metric: float, batch_size: int, generation: int) -> Verdict | None:
        """Check and store an epoch report (cumulative ``time_s`` [s], ``energy_j`` [J]) on
        ``trial`` (see :meth:`offcut.daemon.zeus.bso.BatchSizeJob.report` for the errors);
        the stored verdict of an ended trial, else None (its ``cost_j`` is updated)."""
        number = trial["trial_number"]
        if batch_size and batch_size != trial["batch_size"]:
            raise FailedPrecondition(f"trial {number} was predicted with batch size "
                                     f"{trial['batch_size']}, not {batch_size}", "batch_size")
        if epoch < 1:
            raise InvalidArgument(f"must be >= 1, got {epoch}", "epoch")
        check_finite(time_s, "time_s", non_negative=True)
        check_finite(energy_j, "energy_j", non_negative=True)
        check_finite(metric, "metric")
        if trial["status"] not in OPEN:
            return self.stored_verdict(trial)
        if trial["status"] == SUSPENDED:
            raise FailedPrecondition(f"trial {number} is suspended (its run was "
                                     "interrupted); resume it first (ResumeTrial)",
                                     "trial_number")
        self.check_holder(trial, generation)
        if epoch <= trial["epochs"]:
            raise FailedPrecondition(f"{epoch} is not after the last reported epoch "
                                     f"{trial['epochs']} of trial {number}", "epoch")
        for name, value in (("time_s", time_s), ("energy_j", energy_j)):
            if value < trial[name]:
                raise FailedPrecondition(f"cumulative {name} went backwards: {value} < "
                                         f"{trial[name]}", name)
        cost = self._cost(energy_j, time_s)
        trial.update(epochs=epoch, time_s=time_s, energy_j=energy_j, cost_j=cost, metric=metric)
        return None

    @staticmethod
    def check_end_figures(interrupted: bool, time_s: float | None,
                          energy_j: float | None) -> None:
        """The totals an end call may carry: only with ``interrupted``, finite, >= 0."""
        for name, value in (("time_s", time_s), ("energy_j", energy_j)):
            if value is None:
                continue
            if not interrupted:
                raise InvalidArgument("is only accepted with interrupted (the trial's totals "
                                      "when an interrupted process stopped)", name)
            check_finite(value, name, non_negative=True)

    def suspend(self, trial: dict[str, Any], time_s: float | None, energy_j: float | None,
                now: float) -> Verdict:
        """Suspend an open ``trial``: ``time_s`` [s] / ``energy_j`` [J] (None = stored) replace
        its totals; ``now`` [s] stamps a first suspension."""
        totals = {"time_s": trial["time_s"] if time_s is None else float(time_s),
                  "energy_j": trial["energy_j"] if energy_j is None else float(energy_j)}
        for name, value in totals.items():
            if value < trial[name]:
                raise FailedPrecondition(f"cumulative {name} went backwards: {value} < "
                                         f"{trial[name]} stored for trial "
                                         f"{trial['trial_number']}", name)
        cost = self._cost(totals["energy_j"], totals["time_s"])
        if trial["status"] == RUNNING:
            trial["interruptions"] += 1
            trial["suspended_at"] = float(now)
        trial.update(status=SUSPENDED, cost_j=cost, **totals)
        self._suspended.add(trial["trial_number"])
        return Verdict(True, False, cost, f"trial {trial['trial_number']} suspended after epoch "
                       f"{trial['epochs']} (interrupted); the next generation resumes it "
                       "(ResumeTrial)", False, suspended=True)

    def resume(self, trial_number: int, generation: int, cost_bound_j: float) -> Resumed:
        """Reopen an open trial for ``generation`` (see
        :meth:`offcut.daemon.zeus.bso.BatchSizeJob.resume` for the rules and errors);
        ``cost_bound_j`` [J] is passed through to the answer."""
        trial = self.get(trial_number)
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
                       trial["energy_j"], trial["cost_j"], cost_bound_j,
                       trial["exploration"], trial["generation"], taken_over)

    # ------------------------------------------------------------------ endings
    @staticmethod
    def conclude(trial: dict[str, Any], converged: bool) -> None:
        """Give ``trial`` its final verdict (converged or failed)."""
        trial["status"] = CONVERGED if converged else FAILED

    @staticmethod
    def abandon(trial: dict[str, Any]) -> None:
        """End ``trial`` without a verdict on its batch size."""
        trial["status"], trial["suspended_at"] = ABANDONED, None

    def stale(self, now: float) -> list[dict[str, Any]]:
        """The trials suspended for at least ``suspended_trial_timeout_s`` before ``now`` [s]."""
        suspended = []
        for n in sorted(self._suspended):  # (numbers suspended once; O(those), not O(trials))
            trial = self.held.get(n)
            if trial is None or trial["status"] != SUSPENDED:
                self._suspended.discard(n)
            else:
                suspended.append(trial)
        stale = [trial for trial in suspended if trial["suspended_at"] is not None
                 and now - trial["suspended_at"] >= self.spec.suspended_trial_timeout_s]
        self.touched.update(t["trial_number"] for t in stale)
        return stale

    # ------------------------------------------------------------------ persistence
    @staticmethod
    def restore(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Fresh copies of stored trial records; records stored before generations existed
        get the three keys they lack."""
        defaults = {"generation": 0, "interruptions": 0, "suspended_at": None}
        return [{**t, **{k: v for k, v in defaults.items() if k not in t}} for t in trials]

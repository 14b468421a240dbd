"""The daemon's Zeus optimizers: every registered job's batch-size optimizer and its power
profiles, kept durable in the state file (docs/architecture.md §5, §6).

Each mutating call works on a copy of the object (``from_dict(to_dict())``), writes the copy's
state in one SQLite transaction and only then swaps it in: a rejected call (an error raised
before the write) leaves memory and disk as they were, and a committed answer survives
``kill -9``. The objects carry their seeded RNG state, so a restarted daemon continues each
job's batch-size sequence exactly.

The registry's ``clock`` (wall-clock seconds, :func:`time.time` by default; it must survive a
restart) stamps suspended trials and decides, at each Predict, which of them are stale
(:mod:`offcut.daemon.zeus.bso`, abandoned trials).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, TypeVar

from offcut.daemon.model import Limits
from offcut.daemon.store import Store
from offcut.daemon.zeus.bso import BatchSizeJob, BatchSizeJobSpec, Prediction, Resumed, Verdict
from offcut.daemon.zeus.plo import PowerLimitProfile, PowerLimitSpec, PowerPlan
from offcut.errors import AlreadyExists, FailedPrecondition, NotFound

T = TypeVar("T")

_BSO = "bso"
_PLO = "plo"
#: prefix of the idempotency keys of ResumeTrial in the state file's ``zeus_requests`` (with
#: the job and the trial: a request id reused for another trial or for Predict never replays
#: an answer of the wrong kind)
#: prefix of the stored-answer key of a ResumeTrial request (other keys are Predict's)
RESUME_KEY = "ResumeTrial:"
#: the version of a stored answer (``zeus_requests.response``) written by this release:
#: ``{"format": 2, <the answer's fields>}``; format 1 stored the ``offcut.v1`` message
#: (converted by :mod:`offcut.daemon.migrations`)
ANSWER_FORMAT = 2


def stored_answer(answer: Prediction | Resumed) -> bytes:
    """The stored form of an answer to a request with an id (format :data:`ANSWER_FORMAT`)."""
    return json.dumps({"format": ANSWER_FORMAT, **asdict(answer)},
                      separators=(",", ":")).encode()


def _stored_fields(stored: bytes) -> dict:
    """The answer's fields of :func:`stored_answer` (ValueError for another format)."""
    d = json.loads(bytes(stored).decode())
    if d.pop("format", None) != ANSWER_FORMAT:
        raise ValueError(f"stored Zeus answer is not of format {ANSWER_FORMAT}")
    return d


@dataclass
class _Entry:
    job: BatchSizeJob
    power: PowerLimitSpec | None
    seed_given: bool

    def to_dict(self) -> dict:
        return {"job": self.job.to_dict(), "power": self.power.to_dict() if self.power else None,
                "seed_given": self.seed_given}

    @classmethod
    def from_dict(cls, d: dict) -> "_Entry":
        return cls(BatchSizeJob.from_dict(d["job"]),
                   PowerLimitSpec.from_dict(d["power"]) if d["power"] else None,
                   bool(d["seed_given"]))


class ZeusRegistry:
    """Registered jobs and power profiles, durable in ``store`` (thread-safe).

    Raises (from its methods): :class:`offcut.errors.NotFound` for unknown jobs,
    :class:`AlreadyExists` for a second, different spec under a job id,
    :class:`FailedPrecondition` for power calls on a job registered without a power spec,
    and whatever the optimizers raise for bad values (``InvalidArgument``), all before any
    state changes. ``limits`` (default: :class:`Limits`'s defaults) bound what the service
    accepts at registration (``max_batch_sizes``, ``max_power_limits``). ``clock``: wall-clock
    seconds for suspended trials (module docstring).
    """

    def __init__(self, store: Store, limits: Limits | None = None,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock
        self.limits = limits if limits is not None else Limits()
        self.lock = threading.RLock()
        self.jobs: dict[str, _Entry] = {}
        self.profiles: dict[tuple[str, int], PowerLimitProfile] = {}
        for kind, job_id, batch_size, state in store.zeus_load():
            if kind == _BSO:
                self.jobs[job_id] = _Entry.from_dict(state)
            elif kind == _PLO:
                self.profiles[(job_id, batch_size)] = PowerLimitProfile.from_dict(state)

    # ------------------------------------------------------------------ batch size
    def register(self, spec: BatchSizeJobSpec, power: PowerLimitSpec | None
                 ) -> tuple[BatchSizeJob, PowerLimitSpec | None]:
        """Register a validated job (``spec.seed`` None = draw one and store it). The
        identical spec again returns the stored job (idempotent).

        Raises:
            AlreadyExists: ``spec.job_id`` is registered with a different spec.
        """
        seed_given = spec.seed is not None
        with self.lock:
            existing = self.jobs.get(spec.job_id)
            if not seed_given:
                spec = spec.with_seed(existing.job.spec.seed if existing else secrets.randbits(63))
            if existing is not None:
                if (existing.job.spec == spec and existing.power == power
                        and existing.seed_given == seed_given):
                    return existing.job, existing.power
                raise AlreadyExists(f"job {spec.job_id!r} is registered with a different spec "
                                    "(delete it first to change it)", "spec.job_id")
            entry = _Entry(BatchSizeJob(spec), power, seed_given)
            self.store.zeus_put(_BSO, spec.job_id, 0, entry.to_dict())
            self.jobs[spec.job_id] = entry
            return entry.job, entry.power

    def _entry(self, job_id: str) -> _Entry:
        entry = self.jobs.get(job_id)
        if entry is None:
            raise NotFound(f"no Zeus job {job_id!r}", "job_id")
        return entry

    def job(self, job_id: str) -> tuple[BatchSizeJob, PowerLimitSpec | None]:
        """The job's optimizer and power spec (NOT_FOUND if unknown)."""
        with self.lock:
            entry = self._entry(job_id)
            return entry.job, entry.power

    def _mutate_job(self, job_id: str, op: Callable[[BatchSizeJob], T], *,
                    request_id: str | None = None) -> T:
        entry = self._entry(job_id)
        copy = _Entry.from_dict(entry.to_dict())
        result = op(copy.job)  # raises before anything is written
        response = stored_answer(result) if request_id else None
        self.store.zeus_put(_BSO, job_id, 0, copy.to_dict(), request_id=request_id or None,
                            response=response)
        self.jobs[job_id] = copy
        return result

    def predict(self, job_id: str, request_id: str, generation: int = 0) -> Prediction:
        """Open a trial (abandoning stale suspended ones first, see
        :meth:`BatchSizeJob.predict`). A repeated ``request_id`` returns the first answer."""
        with self.lock:
            if request_id:
                stored = self.store.zeus_response(request_id)
                if stored is not None:
                    return Prediction(**_stored_fields(stored))
            now = self.clock()
            return self._mutate_job(job_id, lambda job: job.predict(generation, now),
                                    request_id=request_id)

    def report(self, job_id: str, trial_number: int, epoch: int, time_s: float, energy_j: float,
               metric: float, batch_size: int = 0, generation: int = 0) -> Verdict:
        """Record an epoch of a trial (see :meth:`BatchSizeJob.report`)."""
        with self.lock:
            return self._mutate_job(job_id, lambda job: job.report(
                trial_number, epoch, time_s, energy_j, metric, batch_size, generation))

    def end_trial(self, job_id: str, trial_number: int, interrupted: bool = False,
                  time_s: float | None = None, energy_j: float | None = None,
                  generation: int = 0) -> Verdict:
        """Close a trial, or suspend an interrupted one (see :meth:`BatchSizeJob.end_trial`)."""
        with self.lock:
            now = self.clock()
            return self._mutate_job(job_id, lambda job: job.end_trial(
                trial_number, interrupted, time_s, energy_j, generation, now))

    def resume(self, job_id: str, trial_number: int, request_id: str,
               generation: int) -> Resumed:
        """Reopen an open trial for a new process (see :meth:`BatchSizeJob.resume`). A
        repeated ``request_id`` (for the same job and trial) returns the first answer."""
        key = (RESUME_KEY + json.dumps([job_id, trial_number, request_id])) if request_id else ""
        with self.lock:
            if key:
                stored = self.store.zeus_response(key)
                if stored is not None:
                    return Resumed(**_stored_fields(stored))
            return self._mutate_job(job_id, lambda job: job.resume(trial_number, generation),
                                    request_id=key)

    def delete(self, job_id: str) -> None:
        """Forget a job and its power profiles."""
        with self.lock:
            self._entry(job_id)
            self.store.zeus_delete_job(job_id)
            del self.jobs[job_id]
            for key in [k for k in self.profiles if k[0] == job_id]:
                del self.profiles[key]

    # ------------------------------------------------------------------ power limit
    def _profile(self, job_id: str, batch_size: int) -> PowerLimitProfile:
        entry = self._entry(job_id)
        if entry.power is None:
            raise FailedPrecondition(f"job {job_id!r} was registered without a power spec",
                                     "job_id")
        if batch_size not in entry.job.spec.batch_sizes:
            raise NotFound(f"batch size {batch_size} is not one of job {job_id!r}'s "
                           f"{list(entry.job.spec.batch_sizes)}", "batch_size")
        if not any(t["batch_size"] == batch_size for t in entry.job.trials):
            raise FailedPrecondition(f"batch size {batch_size} was never predicted for job "
                                     f"{job_id!r}; call Predict first", "batch_size")
        return (self.profiles.get((job_id, batch_size))
                or PowerLimitProfile(entry.power, entry.job.spec.max_power_w))

    def _mutate_profile(self, job_id: str, batch_size: int,
                        op: Callable[[PowerLimitProfile], PowerPlan]) -> PowerPlan:
        copy = PowerLimitProfile.from_dict(self._profile(job_id, batch_size).to_dict())
        plan = op(copy)
        self.store.zeus_put(_PLO, job_id, batch_size, copy.to_dict())
        self.profiles[(job_id, batch_size)] = copy
        return plan

    def power_plan(self, job_id: str, batch_size: int) -> PowerPlan:
        """What to run next at this batch size: a window to profile, or the chosen limit."""
        with self.lock:
            return self._profile(job_id, batch_size).plan()

    def report_window(self, job_id: str, batch_size: int, power_limit_w: float, time_s: float,
                      energy_j: float) -> PowerPlan:
        """Record a measured profiling window; returns the next plan."""
        with self.lock:
            return self._mutate_profile(job_id, batch_size, lambda p: p.report_window(
                power_limit_w, time_s, energy_j))

    def interrupt_window(self, job_id: str, batch_size: int, power_limit_w: float) -> PowerPlan:
        """The window at ``power_limit_w`` was cut short: plan it again."""
        with self.lock:
            return self._mutate_profile(job_id, batch_size, lambda p: p.interrupt(power_limit_w))

    def profile(self, job_id: str, batch_size: int) -> PowerLimitProfile:
        """The (possibly unfinished) profile of a job's batch size."""
        with self.lock:
            return self._profile(job_id, batch_size)

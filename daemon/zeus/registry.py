"""The daemon's Zeus optimizers: every registered job's batch-size optimizer and its power
profiles, kept durable in the state file (docs/zeus.md, "The batch-size optimizer" and
"The power-limit optimizer"; docs/architecture.md, "Durability").

A mutating call changes the job in memory (the optimizers raise before changing anything), then
writes only the rows it changed (docs/zeus.md, "Storage"): the job's small summary
(:meth:`BatchSizeJob.summary`, O(batch sizes)), the trial records it touched and the runs it
observed, through the Zeus storage's one commit path (:mod:`offcut.daemon.zeus.storage`, a
group commit: the writes of concurrent calls share one transaction and one fsync); it answers
only once its write is durable, so a committed answer survives ``kill -9`` (and power loss with durability ``full``).
A call that raises, and a failed commit, reload the job(s) from the file. The objects carry
their seeded RNG state, so a restarted daemon continues each job's batch-size sequence exactly.

Bounded memory: a job holds its open trials and at most ``trial_retention`` trial records in
memory (the newest; a finished trial leaves once its record is durable); older records are read
from the file when a call names them (a report on an ended trial) or GetJob pages them
(:meth:`ZeusRegistry.job_view`). Bounded file: finished trials beyond ``trial_rows_retention``
lose their rows, in bounded ranges within a later call's own transaction. The observed runs
(seq, reward) stay in memory per batch size, the newest ``observation_retention`` of each
(:meth:`BatchSizePolicy.keep`): Thompson sampling refits each arm from them or its window
(Zeus NSDI '23, Section 4.3); older ones leave memory and the file together. Stored answers to
request ids are kept ``request_retention_s`` seconds (a retry within that window gets the
first answer; after it, the request is a new one). Caps: a user registers at most
``max_jobs_per_owner`` jobs (RESOURCE_EXHAUSTED beyond; admins are not capped).

The registry's ``clock`` (wall-clock seconds, :func:`time.time` by default; it must survive a
restart) stamps suspended trials and decides, at each Predict, which of them are stale
(:mod:`offcut.daemon.zeus.bso`, abandoned trials).

Owners (docs/zeus.md, "Owners and request ids"): every job has an ``owner``, the user who registered
it, stored with its state; ``""`` = none (registered before jobs had owners, or on a daemon
without tokens). Every method takes the caller (a :class:`Caller`): a caller acts on the jobs
it owns, an admin on all; any other job, and its power profiles, is NOT_FOUND, checked before
anything is read or written. The stored answer to a request id of Predict / ResumeTrial /
DeleteJob / ReportWindow / InterruptWindow is bound to (method, caller, job[, trial or batch
size], request id): see :mod:`offcut.daemon.zeus.answers`. The power-limit calls are those of
the registry's collaborator :class:`~offcut.daemon.zeus.power_profiles.PowerProfiles`
(:attr:`ZeusRegistry.power`).

Not checked here: a task's ``zeus_job_id`` (a task spec field, offcut.v1.TaskSpec) names a
job by id only. The binding holds where the job is used, since the task's training process
calls these methods as its own caller; a check at submission (a user's task naming another
user's job) belongs to ``SubmitTask`` (offcut.daemon.edge.service), which has no registry.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from offcut.taskspec import Limits
from offcut.daemon.zeus.answers import Caller, request_key, stored_answer
from offcut.daemon.zeus.bso import BatchSizeJob
from offcut.zeus_views import BatchSizeJobSpec, Prediction, Resumed
from offcut.trial_verdict import Verdict
from offcut.daemon.zeus.bso_trials import OPEN
from offcut.daemon.zeus.group_commit import CommitFailed, GroupCommit
from offcut.daemon.zeus.plo import PowerLimitProfile
from offcut.zeus_views import PowerLimitSpec
from offcut.daemon.zeus.power_profiles import PLO, PowerProfiles
from offcut.daemon.zeus.storage import ZeusStorage, ZeusWrite
from offcut.errors import AlreadyExists, NotFound, OffcutError, ResourceExhausted
from offcut.zeus_views import ZeusJob, ZeusTrial

T = TypeVar("T")

_BSO = "bso"
#: defaults of ``trial_retention`` (trial records a job holds in memory) and of
#: ``request_retention_s`` [s] (how long a stored answer to a request id is kept); their
#: bounds are the settings' (``DaemonConfig.zeus_trial_retention``, ``zeus_request_retention_s``)
DEFAULT_TRIAL_RETENTION = 1000
DEFAULT_REQUEST_RETENTION_S = 7 * 86400.0
#: defaults of ``trial_rows_retention`` (trial records a job keeps in the state file: its open
#: trials and the finished ones among its newest this many) and ``observation_retention``
#: (observed runs kept per batch size; :meth:`BatchSizePolicy.keep`); docs/operations.md
DEFAULT_TRIAL_ROWS_RETENTION = 10_000
DEFAULT_OBSERVATION_RETENTION = 10_000
#: trial rows are pruned once this many are beyond the retention, at most PRUNE_BATCH per call
PRUNE_MIN = 100
PRUNE_BATCH = 1000
#: most rows of dropped observed runs deleted by one call
DROP_BATCH = 1000
#: GetJob's trials per page: default and largest page_size
DEFAULT_TRIAL_PAGE = 100
MAX_TRIAL_PAGE = 1000


@dataclass
class _Entry:
    job: BatchSizeJob
    power: PowerLimitSpec | None
    seed_given: bool
    owner: str = ""  # "" = none (registered without tokens)
    #: finished trials numbered up to this have no row any more (retention; memory only,
    #: rebuilt from the file at load)
    pruned_through: int = 0
    #: (owner, text) of :meth:`stored_json` after the job's summary, for that owner
    _tail_json: tuple[str, str] | None = field(default=None, init=False, repr=False,
                                               compare=False)
    #: the summary text last queued for writing (a call that leaves it as it was writes none)
    _queued_state: str | None = field(default=None, init=False, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {"job": self.job.to_dict(), "power": self.power.to_dict() if self.power else None,
                "seed_given": self.seed_given, "owner": self.owner}

    @classmethod
    def from_dict(cls, d: dict) -> "_Entry":
        return cls(BatchSizeJob.from_dict(d["job"]),
                   PowerLimitSpec.from_dict(d["power"]) if d["power"] else None,
                   bool(d["seed_given"]), str(d.get("owner", "")))

    def stored_json(self) -> str:
        """The stored summary (``zeus_state.state`` of kind ``bso``) as compact JSON text:
        :meth:`to_dict` with the job's :meth:`BatchSizeJob.summary` (no trials, no observed
        runs), written per call: the job's :meth:`BatchSizeJob.summary_json` joined with the
        text of the other fields (encoded once per owner)."""
        if self._tail_json is None or self._tail_json[0] != self.owner:
            rest = {"power": self.power.to_dict() if self.power is not None else None,
                    "seed_given": self.seed_given, "owner": self.owner}
            self._tail_json = (self.owner, "," + json.dumps(rest, separators=(",", ":"))[1:])
        return '{"job":' + self.job.summary_json() + self._tail_json[1]

    def acted_on_by(self, who: Caller) -> bool:
        """Whether ``who`` may see and act on this job (admins: every job; users: their own)."""
        return who.is_admin or (bool(self.owner) and self.owner == who.user)


def _retention(entry: _Entry, trials: list[dict], rows_retention: int
               ) -> tuple[list[dict], tuple[int, int] | None, list[int], set[int]]:
    """The rows a call's retention changes (docs/operations.md): a trial that ends after its
    number was pruned loses its row now; finished trials beyond ``rows_retention`` are
    deleted in a bounded range (:data:`PRUNE_MIN`, :data:`PRUNE_BATCH`). Returns ``(trials
    to write, range to prune or None, trials to drop, numbers that left memory)``; updates
    ``entry.pruned_through`` and the ledger's records in memory."""
    ledger = entry.job.ledger
    drop_trials = [t["trial_number"] for t in trials if t["trial_number"]
                   <= entry.pruned_through and t["status"] not in OPEN]
    prune = None
    limit = ledger.count - rows_retention
    if limit - entry.pruned_through >= PRUNE_MIN:
        prune = (entry.pruned_through + 1, min(limit, entry.pruned_through + PRUNE_BATCH))
        entry.pruned_through = prune[1]
    gone: set[int] = set()  # (the common case: nothing to prune)
    if drop_trials or prune:
        gone = set(drop_trials) | {n for n, t in ledger.held.items() if n
                                   <= entry.pruned_through and t["status"] not in OPEN}
        trials = [t for t in trials if t["trial_number"] not in gone]
        for n in gone:
            ledger.held.pop(n, None)
    return trials, prune, drop_trials, gone


def _job_answer(spec: BatchSizeJobSpec, power: PowerLimitSpec | None, owner: str, state: dict,
                count: int, next_before: int) -> ZeusJob:
    """The :class:`ZeusJob` GetJob shows of ``state`` (:meth:`BatchSizeJob.state` with one
    page of trial records; ``min_cost_j`` None = +inf [J])."""
    min_cost = state["min_cost_j"]
    return ZeusJob(
        spec=spec, power=power, phase=state["phase"], best_batch_size=state["best_batch_size"],
        min_cost_j=math.inf if min_cost is None else min_cost,
        trials=tuple(ZeusTrial(t["trial_number"], t["batch_size"], t["status"], t["epochs"],
                               t["time_s"], t["energy_j"], t["cost_j"], t["generation"],
                               t["interruptions"]) for t in state["trials"]),
        state_json=json.dumps(state), owner=owner, next_before_trial_number=next_before,
        trial_count=count)


class ZeusRegistry:
    """Registered jobs and their power profiles (:attr:`power`), durable in ``storage``
    (thread-safe).

    Args:
        storage: the Zeus tables (:class:`ZeusStorage`; the caller closes it).
        limits: bound what the service accepts at registration (``max_batch_sizes``,
            ``max_power_limits``; default: :class:`Limits`'s defaults).
        clock: wall-clock seconds for suspended trials and stored answers (module docstring).
        trial_retention, request_retention_s, trial_rows_retention, observation_retention,
        max_jobs_per_owner: the bounds of the module docstring.

    Raises (from its methods): :class:`offcut.errors.NotFound` for unknown jobs and for jobs
    the caller may not act on (module docstring, owners), :class:`AlreadyExists` for a
    second, different spec under a job id or an id held by another user's job, and whatever
    the optimizers raise for bad values (``InvalidArgument``), all before any state changes;
    the storage's errors for a write that failed (``StateReadOnly``, ``StateFull``, else
    :class:`CommitFailed`), after memory was reloaded from the file.
    """

    def __init__(self, storage: ZeusStorage, limits: Limits | None = None,
                 clock: Callable[[], float] = time.time, *,
                 trial_retention: int = DEFAULT_TRIAL_RETENTION,
                 request_retention_s: float = DEFAULT_REQUEST_RETENTION_S,
                 trial_rows_retention: int = DEFAULT_TRIAL_ROWS_RETENTION,
                 observation_retention: int | None = DEFAULT_OBSERVATION_RETENTION,
                 max_jobs_per_owner: int | None = None):
        self.storage = storage
        self.clock = clock
        self.limits = limits if limits is not None else Limits()
        self.trial_retention = max(0, int(trial_retention))
        #: records in memory stay in the file: at least ``trial_retention``
        self.trial_rows_retention = max(self.trial_retention, int(trial_rows_retention))
        self.observation_retention = observation_retention
        #: jobs one owner may have registered when a user registers one (None: no cap)
        self.max_jobs_per_owner = max_jobs_per_owner
        self.request_retention_s = float(request_retention_s)
        storage.retain_answers(self.request_retention_s, clock)
        self.lock = threading.RLock()
        self.jobs: dict[str, _Entry] = {}
        #: the power-limit calls (the PowerLimitOptimizer service's)
        self.power = PowerProfiles(storage, self.lock, clock, self._entry, self._recover)
        self._load()

    @property
    def commits(self) -> GroupCommit:
        """The storage's group commit (its counts; the daemon's stop closes it)."""
        return self.storage.commits

    @property
    def profiles(self) -> dict[tuple[str, int], PowerLimitProfile]:
        """The power profiles in memory: (job id, batch size) -> profile (:attr:`power`)."""
        return self.power.profiles

    def _load(self) -> None:
        """(Re)build memory from the state file (call with no write pending)."""
        self.jobs = {}
        self.power.profiles.clear()
        self.storage.forget_writes()
        for kind, job_id, batch_size, state in self.storage.load():
            if kind == _BSO:
                self.jobs[job_id] = self._entry_from(job_id, state)
            elif kind == PLO:
                self.power.profiles[(job_id, batch_size)] = PowerLimitProfile.from_dict(state)

    def _new_job(self, job: BatchSizeJob) -> BatchSizeJob:
        """``job`` with the registry's retention and its evicted records read from the file."""
        job.policy.retention = self.observation_retention
        job_id = job.spec.job_id
        job.ledger.loader = lambda n: self.storage.trial_record(job_id, n)
        return job

    def _entry_from(self, job_id: str, stored: dict) -> _Entry:
        """A job from its stored summary, observed runs and newest trial records."""
        job = self._new_job(BatchSizeJob.from_parts(
            stored["job"], self.storage.observation_rows(job_id),
            self.storage.trial_records(job_id, last=self.trial_retention)))
        job.ledger.evict(self.trial_retention)
        first = self.storage.first_finished_trial(job_id)
        return _Entry(job, PowerLimitSpec.from_dict(stored["power"]) if stored["power"] else None,
                      bool(stored["seed_given"]), str(stored.get("owner", "")),
                      pruned_through=max(0, (first or 1) - 1))

    def _reload_job(self, job_id: str) -> None:
        """Make the job's memory the file's again, after a call that raised part-way (call
        under the lock)."""
        self.storage.flush()
        self.storage.forget_rows(job_id)
        row = [state for kind, j, _, state in self.storage.load() if kind == _BSO and j == job_id]
        if row:
            self.jobs[job_id] = self._entry_from(job_id, row[0])
        else:
            self.jobs.pop(job_id, None)

    # ------------------------------------------------------------------ commits
    def _commit_now(self, write: ZeusWrite) -> None:
        """Write and wait until durable, holding the lock (rare calls: register, delete)."""
        self._recover()
        ticket = self.storage.submit(write)
        self._await(ticket, write.request_id or "")

    def _recover(self) -> None:
        """After a failed commit (the storage ``broken``; nothing otherwise): every pending
        write is settled, memory reloaded from the file, writes accepted again."""
        if not self.storage.commits.broken:  # (the common case, without the lock)
            return
        with self.lock:
            if self.storage.broken:
                self.storage.flush()
                self._load()
                self.storage.reset()

    def _await(self, ticket: int, key: str = "") -> None:
        """Wait, outside the lock, until the write ``ticket`` is durable; its error (after
        reloading memory) if it failed."""
        try:
            self.storage.wait(ticket, key)
        except Exception:
            self._recover()
            raise

    async def _await_async(self, ticket: int, key: str = "") -> None:
        """:meth:`_await` on the event loop: the commit runs on the storage's committer thread
        (:meth:`GroupCommit.wait_async`, awaited here without a coroutine of its own: the
        round trip's path), the loop never waits for an fsync (only a failed commit's
        reload, rare, reads the file on it)."""
        try:
            await self.storage.commits.wait_async(ticket)
        except Exception:
            self._recover()
            raise
        finally:
            self.storage.settled(ticket, key)

    # ------------------------------------------------------------------ jobs
    def register(self, spec: BatchSizeJobSpec, power: PowerLimitSpec | None, who: Caller,
                 owner: str, *, assign: bool = False
                 ) -> tuple[BatchSizeJob, PowerLimitSpec | None, str]:
        """Register a validated job owned by ``owner`` (``spec.seed`` None = draw one and
        store it); returns the job, its power spec and its owner. The identical spec again
        returns the stored job (idempotent), its owner unchanged, except that with ``assign``
        (the request named ``owner``) a job without an owner is given to ``owner``. Who may
        name which owner is the caller's business (the service: users only themselves).

        Raises:
            AlreadyExists: ``spec.job_id`` is registered with a different spec, is held by a
                job ``who`` may not act on (its spec and owner are not told), or (``assign``)
                is owned by another user than ``owner``.
            ResourceExhausted: a user's ``owner`` has ``max_jobs_per_owner`` jobs.
        """
        seed_given = spec.seed is not None
        with self.lock:
            existing = self.jobs.get(spec.job_id)
            if existing is not None and not existing.acted_on_by(who):
                raise AlreadyExists(f"job id {spec.job_id!r} is taken by a job of another user "
                                    "(job ids are shared by all users); choose another",
                                    "spec.job_id")
            if not seed_given:
                spec = spec.with_seed(existing.job.spec.seed if existing else secrets.randbits(63))
            if existing is not None:
                if not (existing.job.spec == spec and existing.power == power
                        and existing.seed_given == seed_given):
                    raise AlreadyExists(f"job {spec.job_id!r} is registered with a different "
                                        "spec (delete it first to change it)", "spec.job_id")
                if not assign or existing.owner == owner:
                    return existing.job, existing.power, existing.owner
                if existing.owner:
                    raise AlreadyExists(f"job {spec.job_id!r} is registered for "
                                        f"{existing.owner!r}, not {owner!r}", "owner")
                given = dataclasses.replace(existing, owner=owner)  # (stored, then kept)
                self._commit_now(ZeusWrite(_BSO, spec.job_id, 0, given.stored_json()))
                existing.owner = owner  # an admin hands a job without an owner to its user
                return existing.job, existing.power, existing.owner
            cap = self.max_jobs_per_owner
            if cap is not None and not who.is_admin:
                held = sum(1 for e in self.jobs.values() if e.owner == owner)
                if held >= cap:
                    raise ResourceExhausted(
                        f"owner {owner!r} has {held} Zeus jobs, the most this daemon allows "
                        f"({cap}); delete one first (DeleteJob)", "max_zeus_jobs_per_owner")
            entry = _Entry(self._new_job(BatchSizeJob(spec)), power, seed_given, owner)
            self._commit_now(ZeusWrite(_BSO, spec.job_id, 0, entry.stored_json()))
            self.jobs[spec.job_id] = entry
            return entry.job, entry.power, entry.owner

    def _entry(self, job_id: str, who: Caller) -> _Entry:
        """The job, if ``who`` may act on it; else NOT_FOUND (as for an unknown id)."""
        entry = self.jobs.get(job_id)
        if entry is None or not entry.acted_on_by(who):
            raise NotFound(f"no Zeus job {job_id!r}", "job_id")
        return entry

    def job(self, job_id: str, who: Caller) -> tuple[BatchSizeJob, PowerLimitSpec | None, str]:
        """The job's optimizer, power spec and owner (NOT_FOUND if unknown or not ``who``'s)."""
        with self.lock:
            entry = self._entry(job_id, who)
            return entry.job, entry.power, entry.owner

    def job_view(self, job_id: str, who: Caller, page_size: int = DEFAULT_TRIAL_PAGE,
                 before: int = 0) -> ZeusJob:
        """What GetJob shows: a copy of the job's readable state (:meth:`BatchSizeJob.state`)
        that later calls do not change, with one page of trial records: the newest
        ``page_size`` (1 to :data:`MAX_TRIAL_PAGE`) numbered below ``before`` (0: from the
        newest), ascending, and ``next_before_trial_number`` for the next older page (0: no
        older trial is kept); its spec, power spec and owner; NOT_FOUND if unknown or not
        ``who``'s.
        The records in memory are copied under the lock; older ones are read from the file
        after it (O(page_size) by primary key), so a long history never holds the lock."""
        page_size = min(max(1, int(page_size)), MAX_TRIAL_PAGE)
        with self.lock:
            entry = self._entry(job_id, who)
            count = entry.job.ledger.count
            bound = count + 1 if not before else min(int(before), count + 1)
            state = {k: v for k, v in entry.job.state().items() if k != "trials"}
            state = json.loads(json.dumps(state))
            held = {n: dict(t) for n, t in entry.job.ledger.held.items() if n < bound}
            spec, power, owner = entry.job.spec, entry.power, entry.owner
        merged = {t["trial_number"]: t for t in self.storage.trial_page(
            job_id, bound, page_size + 1)}
        merged.update(held)  # (memory's records are at least as new as the file's)
        numbers = sorted(merged, reverse=True)[:page_size + 1]
        page = sorted(numbers[:page_size])
        next_before = page[0] if len(numbers) > page_size else 0
        return _job_answer(spec, power, owner, {**state, "trials": [merged[n] for n in page]},
                           count, next_before)

    def trial_records(self, job_id: str, who: Caller) -> list[dict]:
        """Every kept trial record of the job, ascending (the file's, with memory's newer
        ones; up to ``trial_rows_retention`` and the open ones, so for tests and tools: GetJob
        pages, :meth:`job_view`); NOT_FOUND if unknown or not ``who``'s."""
        with self.lock:
            entry = self._entry(job_id, who)
            held = {n: dict(t) for n, t in entry.job.ledger.held.items()}
            stored = self.storage.trial_records(job_id)
        merged = {t["trial_number"]: t for t in stored}
        merged.update(held)
        return [merged[n] for n in sorted(merged)]

    def _mutate_job(self, job_id: str, who: Caller, op: Callable[[BatchSizeJob], T], *,
                    request_key: str = "") -> tuple[T, int]:
        """Run ``op`` on the job and queue the rows it changed; (its result, the write's
        ticket for :meth:`_await`). Call under the lock."""
        self._recover()  # a failed commit first reloads what it left in memory
        entry = self._entry(job_id, who)
        job = entry.job
        ledger = job.ledger
        # (a record leaves memory once its row is durable; a failed write leaves the storage
        # broken: no eviction then)
        evicted = ledger.evict(self.trial_retention, self.storage.row_durable(job_id))
        if evicted:
            self.storage.forget_rows(job_id, evicted)
        ledger.touched.clear()
        seen = job.policy.observed
        try:
            result = op(job)  # the optimizers raise their errors before changing anything
        except OffcutError:
            ledger.touched.clear()
            if job.policy.observed != seen:  # (defensive: never after an optimizer's error)
                self._reload_job(job_id)
            raise
        except BaseException:
            self._reload_job(job_id)  # (defensive: a bug may have raised after a change)
            raise
        trials = [dict(ledger.held[n]) for n in sorted(ledger.touched) if n in ledger.held]
        ledger.touched.clear()
        observed = job.policy.observations_since(seen)
        trials, prune, drop_trials, gone = _retention(entry, trials, self.trial_rows_retention)
        if gone:
            self.storage.forget_rows(job_id, gone)
        drop_observations = job.policy.take_dropped(DROP_BATCH)
        state = entry.stored_json()
        unchanged = state == entry._queued_state  # (e.g. a report mid-run)
        entry._queued_state = state
        write = ZeusWrite(_BSO, job_id, 0, None if unchanged else state,
                          trials, observed, request_key or None,
                          stored_answer(result) if request_key else None, self.clock(),
                          prune, drop_trials, drop_observations)
        try:
            ticket = self.storage.submit(write, result)
        except CommitFailed:  # a commit failed meanwhile: drop this call's change too
            self._recover()
            raise
        return result, ticket

    # ------------------------------------------------------------------ batch size calls
    def predict(self, job_id: str, request_id: str, who: Caller, generation: int = 0
                ) -> Prediction:
        """Open a trial (abandoning stale suspended ones first, see
        :meth:`BatchSizeJob.predict`). A repeated ``request_id`` of the same caller for the
        same job returns the first answer (within ``request_retention_s``)."""
        result, ticket, key = self._begin_predict(job_id, request_id, who, generation)
        if ticket:
            self._await(ticket, key)
        return result

    async def predict_async(self, job_id: str, request_id: str, who: Caller,
                            generation: int = 0) -> Prediction:
        """:meth:`predict` for a caller on the event loop: the same work under the lock, and
        the wait for its commit on the storage's committer thread."""
        result, ticket, key = self._begin_predict(job_id, request_id, who, generation)
        if ticket:
            await self._await_async(ticket, key)
        return result

    def _begin_predict(self, job_id: str, request_id: str, who: Caller, generation: int
                       ) -> tuple[Prediction, int, str]:
        """:meth:`predict` up to its commit: ``(answer, ticket to wait for (0: a stored
        answer, nothing to wait for), request key)``."""
        with self.lock:
            self._entry(job_id, who)
            key = request_key("Predict", who, job_id, request_id) if request_id else ""
            first = self.storage.answer(key, job_id)
            if first is not None:
                ticket, answer = first
                return (Prediction(**answer) if not ticket else answer), ticket, key
            now = self.clock()
            result, ticket = self._mutate_job(job_id, who, lambda job: job.predict(
                generation, now), request_key=key)
            return result, ticket, key

    def report(self, job_id: str, trial_number: int, epoch: int, time_s: float, energy_j: float,
               metric: float, who: Caller, batch_size: int = 0, generation: int = 0) -> Verdict:
        """Record an epoch of a trial (see :meth:`BatchSizeJob.report`)."""
        result, ticket = self._begin_report(job_id, trial_number, epoch, time_s, energy_j,
                                            metric, who, batch_size, generation)
        self._await(ticket)
        return result

    def _begin_report(self, job_id: str, trial_number: int, epoch: int, time_s: float,
                      energy_j: float, metric: float, who: Caller, batch_size: int,
                      generation: int) -> tuple[Verdict, int]:
        """:meth:`report` up to its commit: ``(verdict, ticket to wait for)``."""
        with self.lock:
            return self._mutate_job(job_id, who, lambda job: job.report(
                trial_number, epoch, time_s, energy_j, metric, batch_size, generation))

    async def report_async(self, job_id: str, trial_number: int, epoch: int, time_s: float,
                           energy_j: float, metric: float, who: Caller, batch_size: int = 0,
                           generation: int = 0) -> Verdict:
        """:meth:`report` for a caller on the event loop (see :meth:`predict_async`)."""
        result, ticket = self._begin_report(job_id, trial_number, epoch, time_s, energy_j,
                                            metric, who, batch_size, generation)
        await self._await_async(ticket)
        return result

    def end_trial(self, job_id: str, trial_number: int, who: Caller, interrupted: bool = False,
                  time_s: float | None = None, energy_j: float | None = None,
                  generation: int = 0) -> Verdict:
        """Close a trial, or suspend an interrupted one (see :meth:`BatchSizeJob.end_trial`)."""
        with self.lock:
            now = self.clock()
            result, ticket = self._mutate_job(job_id, who, lambda job: job.end_trial(
                trial_number, interrupted, time_s, energy_j, generation, now))
        self._await(ticket)
        return result

    def resume(self, job_id: str, trial_number: int, request_id: str, who: Caller,
               generation: int) -> Resumed:
        """Reopen an open trial for a new process (see :meth:`BatchSizeJob.resume`). A
        repeated ``request_id`` of the same caller for the same job and trial returns the
        first answer (within ``request_retention_s``)."""
        with self.lock:
            self._entry(job_id, who)
            key = (request_key("ResumeTrial", who, job_id, trial_number, request_id)
                   if request_id else "")
            first = self.storage.answer(key, job_id)
            if first is not None and not first[0]:
                return Resumed(**first[1])
            if first is not None:
                ticket, result = first
            else:
                result, ticket = self._mutate_job(
                    job_id, who, lambda job: job.resume(trial_number, generation),
                    request_key=key)
        self._await(ticket, key)
        return result

    def delete(self, job_id: str, who: Caller, request_id: str = "") -> None:
        """Forget a job, its power profiles and the answers stored for it; NOT_FOUND if
        unknown or not ``who``'s. With ``request_id``, the answer is stored in the same
        transaction (after the job's are deleted): a repeat of the same caller for the same
        job id returns again (within ``request_retention_s``, until the id is deleted again)
        instead of NOT_FOUND."""
        with self.lock:
            key = request_key("DeleteJob", who, job_id, request_id) if request_id else ""
            if key and self.storage.response(key, job_id) is not None:
                return  # (a retry: the job, if registered again since, is another one)
            self._entry(job_id, who)
            self._commit_now(ZeusWrite(_BSO, job_id, 0, None, request_id=key or None,
                                       response=stored_answer(None) if key else None,
                                       created_at=self.clock(), delete_job=True))
            del self.jobs[job_id]
            self.storage.forget_job(job_id)  # (its writes are durable, then deleted)
            self.power.forget_job(job_id)

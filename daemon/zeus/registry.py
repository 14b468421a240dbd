"""The daemon's Zeus optimizers: every registered job's batch-size optimizer and its power
profiles, kept durable in the state file (docs/zeus.md, "The batch-size optimizer" and
"The power-limit optimizer"; docs/architecture.md, "Durability").

A mutating call changes the job in memory (the optimizers raise before changing anything), then
writes only the rows it changed (docs/zeus.md, "Storage"): the job's small summary
(:meth:`BatchSizeJob.summary`, O(batch sizes)), the trial records it touched and the runs it
observed, through a group commit (:mod:`offcut.daemon.zeus.group_commit`: the writes of
concurrent calls share one transaction and one fsync); it answers only once its write is
durable, so a committed answer survives ``kill -9`` (and power loss with durability ``full``).
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
size], request id): see :func:`request_key`; a power-window call's id repeated with other
arguments is refused (:func:`check_repeat`).

Not checked here: a task's ``zeus_job_id`` (a task spec field, offcut.v1.TaskSpec) names a
job by id only. The binding holds where the job is used, since the task's training process
calls these methods as its own caller; a check at submission (a user's task naming another
user's job) belongs to ``SubmitTask`` (offcut.daemon.service), which has no registry.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, TypeVar

from offcut.daemon.model import Limits
from offcut.daemon.store import Store, ZeusWrite
from offcut.daemon.zeus.bso import BatchSizeJob, BatchSizeJobSpec, Prediction, Resumed, Verdict
from offcut.daemon.zeus.group_commit import CommitFailed, GroupCommit
from offcut.daemon.zeus.plo import PowerLimitProfile, PowerLimitSpec, PowerPlan
from offcut.daemon.zeus.bso_trials import OPEN
from offcut.errors import (AlreadyExists, FailedPrecondition, InvalidArgument, NotFound,
                           OffcutError, ResourceExhausted)

T = TypeVar("T")

_BSO = "bso"
_PLO = "plo"
#: the version of a stored answer (``zeus_requests.response``) written by this release:
#: ``{"format": 2, <the answer's fields>}`` (state-file format 4, the first released one)
ANSWER_FORMAT = 2
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
#: seconds between two expiries of stored answers (each a DELETE in a group commit)
EXPIRY_INTERVAL_S = 60.0


def stored_answer(answer: Prediction | Resumed | PowerPlan | None,
                  request: dict | None = None) -> bytes:
    """The stored form of an answer to a request with an id (format :data:`ANSWER_FORMAT`):
    the answer's fields (None: an empty answer, DeleteJob's) and, for the power-window calls,
    ``request``, the call's arguments outside its key (checked by :func:`check_repeat`)."""
    # (the answers' fields are scalars: their __dict__ is asdict's result, without its copying)
    fields = {} if answer is None else vars(answer)
    if request is not None:
        fields = {**fields, "request": request}
    return json.dumps({"format": ANSWER_FORMAT, **fields}, separators=(",", ":")).encode()


def _stored_fields(stored: bytes) -> dict:
    """The answer's fields of :func:`stored_answer` (ValueError for another format)."""
    d = json.loads(bytes(stored).decode())
    if d.pop("format", None) != ANSWER_FORMAT:
        raise ValueError(f"stored Zeus answer is not of format {ANSWER_FORMAT}")
    return d


def check_repeat(method: str, stored: dict | None, request: dict) -> None:
    """A repeated request id must come with the arguments it was first used with
    (``stored``: those of :func:`stored_answer`; None: stored without, nothing to check).

    Raises:
        InvalidArgument: naming ``request_id``, with the first call's arguments.
    """
    if stored is not None and stored != request:
        first = ", ".join(f"{k} {v!r}" for k, v in stored.items())
        raise InvalidArgument(f"was used for another {method} ({first}); a new call needs a "
                              "new request id", "request_id")


class Caller(Protocol):
    """Who calls the registry (:class:`offcut.daemon.auth.Principal` is one)."""

    @property
    def user(self) -> str: ...

    @property
    def is_admin(self) -> bool: ...


def request_key(method: str, who: Caller, job_id: str, *parts) -> str:
    """The key of a stored answer: JSON ``[method, caller's user, job, *parts]`` (``parts``:
    ResumeTrial's trial number or the power-window calls' batch size, then the request id).
    So the same request id from another caller, for another method, job, trial or batch size
    is another request, never the first answer."""
    return json.dumps([method, who.user, job_id, *parts], separators=(",", ":"))


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


@dataclass(frozen=True)
class JobView:
    """A copy of a job's readable state (:meth:`BatchSizeJob.state`, with one page of trials)
    that later calls do not change: what GetJob shows. ``trial_count``: trials ever opened;
    ``next_before``: the ``before`` of the next, older page (0: no older trial is kept)."""

    spec: BatchSizeJobSpec
    view: dict
    trial_count: int = 0
    next_before: int = 0

    def state(self) -> dict:
        """The state, as :meth:`BatchSizeJob.state`."""
        return self.view


class ZeusRegistry:
    """Registered jobs and power profiles, durable in ``store`` (thread-safe).

    Raises (from its methods): :class:`offcut.errors.NotFound` for unknown jobs and for jobs
    the caller may not act on (module docstring, owners), :class:`AlreadyExists` for a
    second, different spec under a job id or an id held by another user's job,
    :class:`FailedPrecondition` for power calls on a job registered without a power spec,
    and whatever the optimizers raise for bad values (``InvalidArgument``), all before any
    state changes. ``limits`` (default: :class:`Limits`'s defaults) bound what the service
    accepts at registration (``max_batch_sizes``, ``max_power_limits``). ``clock``: wall-clock
    seconds for suspended trials (module docstring).
    """

    def __init__(self, store: Store, limits: Limits | None = None,
                 clock: Callable[[], float] = time.time, *,
                 trial_retention: int = DEFAULT_TRIAL_RETENTION,
                 request_retention_s: float = DEFAULT_REQUEST_RETENTION_S,
                 trial_rows_retention: int = DEFAULT_TRIAL_ROWS_RETENTION,
                 observation_retention: int | None = DEFAULT_OBSERVATION_RETENTION,
                 max_jobs_per_owner: int | None = None):
        self.store = store
        self.clock = clock
        self.limits = limits if limits is not None else Limits()
        self.trial_retention = max(0, int(trial_retention))
        #: records in memory stay in the file: at least ``trial_retention``
        self.trial_rows_retention = max(self.trial_retention, int(trial_rows_retention))
        self.observation_retention = observation_retention
        #: jobs one owner may have registered when a user registers one (None: no cap)
        self.max_jobs_per_owner = max_jobs_per_owner
        self.request_retention_s = float(request_retention_s)
        self.lock = threading.RLock()
        self.commits = GroupCommit(store, self._expiry)
        self._last_expiry = -float("inf")
        #: answers to request ids whose writes are not durable yet: key -> (ticket, answer)
        self._pending: dict[str, tuple[int, Any]] = {}
        #: (job, trial number) -> ticket of the latest write of that trial's record
        self._row_ticket: dict[tuple[str, int], int] = {}
        self.jobs: dict[str, _Entry] = {}
        self.profiles: dict[tuple[str, int], PowerLimitProfile] = {}
        self._load()

    def _load(self) -> None:
        """(Re)build memory from the state file (call with no write pending)."""
        self.jobs, self.profiles = {}, {}
        self._pending.clear()
        self._row_ticket.clear()
        for kind, job_id, batch_size, state in self.store.zeus_load():
            if kind == _BSO:
                self.jobs[job_id] = self._entry_from(job_id, state)
            elif kind == _PLO:
                self.profiles[(job_id, batch_size)] = PowerLimitProfile.from_dict(state)

    def _entry_from(self, job_id: str, stored: dict) -> _Entry:
        """A job from its stored summary, observed runs and newest trial records."""
        job = BatchSizeJob.from_parts(
            stored["job"], self.store.zeus_observation_rows(job_id),
            self.store.zeus_trial_records(job_id, last=self.trial_retention))
        job.policy.retention = self.observation_retention
        job.ledger.loader = functools.partial(self.store.zeus_trial_record, job_id)
        job.ledger.evict(self.trial_retention)
        first = self.store.zeus_first_finished_trial(job_id)
        return _Entry(job, PowerLimitSpec.from_dict(stored["power"]) if stored["power"] else None,
                      bool(stored["seed_given"]), str(stored.get("owner", "")),
                      pruned_through=max(0, (first or 1) - 1))

    def _reload_job(self, job_id: str) -> None:
        """Make the job's memory the file's again, after a call that raised part-way (call
        under the lock)."""
        self.commits.flush()
        for key in [k for k in self._row_ticket if k[0] == job_id]:
            del self._row_ticket[key]
        row = [state for kind, j, _, state in self.store.zeus_load() if kind == _BSO and j == job_id]
        if row:
            self.jobs[job_id] = self._entry_from(job_id, row[0])
        else:
            self.jobs.pop(job_id, None)

    def _expiry(self) -> float | None:
        """For a group commit's leader: forget answers stored before this [s], at most every
        :data:`EXPIRY_INTERVAL_S` (None otherwise)."""
        now = self.clock()
        if now - self._last_expiry < EXPIRY_INTERVAL_S:
            return None
        self._last_expiry = now
        return now - self.request_retention_s

    def _commit_now(self, write: ZeusWrite) -> None:
        """Write and wait until durable, holding the lock (rare calls: register, delete)."""
        self._recover()
        ticket = self.commits.submit(write)
        try:
            self.commits.wait(ticket)
        except Exception:
            self._recover()
            raise

    def _recover(self) -> None:
        """After a failed commit (``commits.broken``; nothing otherwise): every pending write
        is settled, memory reloaded from the file, writes accepted again."""
        with self.lock:
            if self.commits.broken:
                self.commits.flush()
                self._load()
                self.commits.reset()

    def _await(self, ticket: int, key: str = "") -> None:
        """Wait, outside the lock, until the write ``ticket`` is durable; CommitFailed (after
        reloading memory) if it failed."""
        try:
            self.commits.wait(ticket)
        except Exception:
            self._recover()
            raise
        finally:
            self._settled(ticket, key)

    async def _await_async(self, ticket: int, key: str = "") -> None:
        """:meth:`_await` on the event loop: the commit runs on the committer thread
        (:meth:`GroupCommit.wait_async`), the loop never waits for an fsync (only a failed
        commit's reload, rare, reads the file on it)."""
        try:
            await self.commits.wait_async(ticket)
        except Exception:
            self._recover()
            raise
        finally:
            self._settled(ticket, key)

    def _settled(self, ticket: int, key: str) -> None:
        """Forget the pending answer to ``key`` once its write ``ticket`` settled."""
        if key:
            with self.lock:
                if self._pending.get(key, (None,))[0] == ticket:
                    del self._pending[key]

    # ------------------------------------------------------------------ batch size
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
            entry = _Entry(BatchSizeJob(spec), power, seed_given, owner)
            entry.job.policy.retention = self.observation_retention
            entry.job.ledger.loader = functools.partial(self.store.zeus_trial_record,
                                                        spec.job_id)
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
                 before: int = 0) -> tuple["JobView", PowerLimitSpec | None, str]:
        """A copy of the job's readable state with one page of trial records: the newest
        ``page_size`` (1 to :data:`MAX_TRIAL_PAGE`) numbered below ``before`` (0: from the
        newest), ascending; its power spec and owner; NOT_FOUND if unknown or not ``who``'s.
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
        merged = {t["trial_number"]: t for t in self.store.zeus_trial_page(
            job_id, bound, page_size + 1)}
        merged.update(held)  # (memory's records are at least as new as the file's)
        numbers = sorted(merged, reverse=True)[:page_size + 1]
        page = sorted(numbers[:page_size])
        next_before = page[0] if len(numbers) > page_size else 0
        view = {**state, "trials": [merged[n] for n in page]}
        return JobView(spec, view, count, next_before), power, owner

    def trial_records(self, job_id: str, who: Caller) -> list[dict]:
        """Every kept trial record of the job, ascending (the file's, with memory's newer
        ones; up to ``trial_rows_retention`` and the open ones, so for tests and tools: GetJob
        pages, :meth:`job_view`); NOT_FOUND if unknown or not ``who``'s."""
        with self.lock:
            entry = self._entry(job_id, who)
            held = {n: dict(t) for n, t in entry.job.ledger.held.items()}
            stored = self.store.zeus_trial_records(job_id)
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
        durable = self.commits.settled  # (a failed ticket leaves broken set: no eviction then)
        for n in ledger.evict(self.trial_retention, lambda n: self._row_ticket.get(
                (job_id, n), 0) <= durable):
            self._row_ticket.pop((job_id, n), None)
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
        # retention (docs/operations.md): a trial that ends after its number was pruned loses
        # its row now; finished trials beyond trial_rows_retention are deleted in a bounded
        # range; observed runs no decision reads any more (BatchSizePolicy.keep) likewise
        drop_trials = [t["trial_number"] for t in trials if t["trial_number"]
                       <= entry.pruned_through and t["status"] not in OPEN]
        prune = None
        limit = ledger.count - self.trial_rows_retention
        if limit - entry.pruned_through >= PRUNE_MIN:
            prune = (entry.pruned_through + 1, min(limit, entry.pruned_through + PRUNE_BATCH))
            entry.pruned_through = prune[1]
        if drop_trials or prune:
            gone = set(drop_trials) | {n for n, t in ledger.held.items() if n
                                       <= entry.pruned_through and t["status"] not in OPEN}
            trials = [t for t in trials if t["trial_number"] not in gone]
            for n in gone:
                ledger.held.pop(n, None)
                self._row_ticket.pop((job_id, n), None)
        drop_observations = job.policy.take_dropped(DROP_BATCH)
        state = entry.stored_json()
        unchanged = state == entry._queued_state  # (e.g. a report mid-run)
        entry._queued_state = state
        write = ZeusWrite(_BSO, job_id, 0, None if unchanged else state,
                          trials, observed, request_key or None,
                          stored_answer(result) if request_key else None, self.clock(),
                          prune, drop_trials, drop_observations)
        try:
            ticket = self.commits.submit(write)
        except CommitFailed:  # a commit failed meanwhile: drop this call's change too
            self._recover()
            raise
        for t in trials:
            self._row_ticket[(job_id, t["trial_number"])] = ticket
        if request_key:
            self._pending[request_key] = (ticket, result)
        return result, ticket

    def _replay(self, job_id: str, key: str) -> dict | None:
        """The stored answer's fields under ``key`` (:func:`request_key`); answers stored for
        another job are never returned. Call under the lock, after :meth:`_entry` allowed the
        caller on the job."""
        stored = self.store.zeus_response(key, job_id)
        return None if stored is None else _stored_fields(stored)

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
        the wait for its commit on :class:`GroupCommit`'s committer thread."""
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
            if key in self._pending:
                ticket, result = self._pending[key]
                return result, ticket, key
            if key:
                stored = self._replay(job_id, key)
                if stored is not None:
                    return Prediction(**stored), 0, key
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
            if key in self._pending:
                ticket, result = self._pending[key]
            else:
                if key:
                    stored = self._replay(job_id, key)
                    if stored is not None:
                        return Resumed(**stored)
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
            if key and self.store.zeus_response(key, job_id) is not None:
                return  # (a retry: the job, if registered again since, is another one)
            self._entry(job_id, who)
            self.commits.flush()
            self.store.zeus_delete_job(job_id, ZeusWrite(
                _BSO, job_id, 0, None, request_id=key, response=stored_answer(None),
                created_at=self.clock()) if key else None)
            del self.jobs[job_id]
            self._pending = {k: v for k, v in self._pending.items()
                             if json.loads(k)[2] != job_id}  # (durable, then deleted)
            for key in [k for k in self._row_ticket if k[0] == job_id]:
                del self._row_ticket[key]
            for key in [k for k in self.profiles if k[0] == job_id]:
                del self.profiles[key]

    # ------------------------------------------------------------------ power limit
    def _profile(self, job_id: str, batch_size: int, who: Caller) -> PowerLimitProfile:
        entry = self._entry(job_id, who)  # a job's profiles are its owner's
        if entry.power is None:
            raise FailedPrecondition(f"job {job_id!r} was registered without a power spec",
                                     "job_id")
        if batch_size not in entry.job.spec.batch_sizes:
            raise NotFound(f"batch size {batch_size} is not one of job {job_id!r}'s "
                           f"{list(entry.job.spec.batch_sizes)}", "batch_size")
        if batch_size not in entry.job.ledger.predicted:
            raise FailedPrecondition(f"batch size {batch_size} was never predicted for job "
                                     f"{job_id!r}; call Predict first", "batch_size")
        return (self.profiles.get((job_id, batch_size))
                or PowerLimitProfile(entry.power, entry.job.spec.max_power_w))

    def _mutate_profile(self, job_id: str, batch_size: int, who: Caller,
                        op: Callable[[PowerLimitProfile], PowerPlan], *, request_key: str = "",
                        request: dict | None = None) -> tuple[PowerPlan, int]:
        """Run ``op`` on a copy of the profile, swap it in and queue its row (with the answer
        to ``request_key`` and the call's ``request`` arguments, :func:`stored_answer`); (the
        plan, the write's ticket for :meth:`_await`). Call under the lock."""
        self._recover()
        copy = PowerLimitProfile.from_dict(self._profile(job_id, batch_size, who).to_dict())
        plan = op(copy)
        ticket = self.commits.submit(ZeusWrite(
            _PLO, job_id, batch_size, copy.to_dict(), request_id=request_key or None,
            response=stored_answer(plan, request) if request_key else None,
            created_at=self.clock()))
        self.profiles[(job_id, batch_size)] = copy
        if request_key:
            self._pending[request_key] = (ticket, (plan, request))
        return plan, ticket

    def _window_call(self, method: str, job_id: str, batch_size: int, who: Caller,
                     request_id: str, request: dict,
                     op: Callable[[PowerLimitProfile], PowerPlan]) -> PowerPlan:
        """A power-window call (``method`` ReportWindow / InterruptWindow, its arguments
        outside the key ``request``): a repeated ``request_id`` of the same caller for the
        same job and batch size returns the first plan and changes nothing (within
        ``request_retention_s``); with other arguments it is InvalidArgument
        (:func:`check_repeat`)."""
        with self.lock:
            self._entry(job_id, who)
            key = request_key(method, who, job_id, batch_size, request_id) if request_id else ""
            if key in self._pending:
                ticket, (plan, asked) = self._pending[key]
                check_repeat(method, asked, request)
            else:
                stored = self._replay(job_id, key) if key else None
                if stored is not None:
                    check_repeat(method, stored.pop("request", None), request)
                    return PowerPlan(**stored)
                plan, ticket = self._mutate_profile(job_id, batch_size, who, op,
                                                    request_key=key, request=request)
        self._await(ticket, key)
        return plan

    def power_plan(self, job_id: str, batch_size: int, who: Caller) -> PowerPlan:
        """What to run next at this batch size: a window to profile, or the chosen limit."""
        with self.lock:
            return self._profile(job_id, batch_size, who).plan()

    def report_window(self, job_id: str, batch_size: int, power_limit_w: float, time_s: float,
                      energy_j: float, who: Caller, request_id: str = "") -> PowerPlan:
        """Record a measured profiling window; returns the next plan. ``request_id``: see
        :meth:`_window_call`."""
        return self._window_call(
            "ReportWindow", job_id, batch_size, who, request_id,
            {"power_limit_w": power_limit_w, "time_s": time_s, "energy_j": energy_j},
            lambda p: p.report_window(power_limit_w, time_s, energy_j))

    def interrupt_window(self, job_id: str, batch_size: int, power_limit_w: float,
                         who: Caller, request_id: str = "") -> PowerPlan:
        """The window at ``power_limit_w`` was cut short: plan it again. ``request_id``: see
        :meth:`_window_call` (a retry is not counted as another interruption)."""
        return self._window_call("InterruptWindow", job_id, batch_size, who, request_id,
                                 {"power_limit_w": power_limit_w},
                                 lambda p: p.interrupt(power_limit_w))

    def profile(self, job_id: str, batch_size: int, who: Caller) -> PowerLimitProfile:
        """The (possibly unfinished) profile of a job's batch size."""
        with self.lock:
            return self._profile(job_id, batch_size, who)

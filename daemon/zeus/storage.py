"""The Zeus optimizers' storage: their tables in the state file, their reads, and their one
commit path (docs/zeus.md, "Storage").

A Zeus job is stored as rows: its small summary (spec, RNG, pruning and bandit state:
O(batch sizes)) replaced in ``zeus_state``, one row per trial in ``zeus_trials`` (written when
the trial changes) and one per observed run in ``zeus_observations`` (appended); a power
profile is one ``zeus_state`` row; the answer to a request id is one ``zeus_requests`` row,
kept ``request_retention_s`` (:meth:`ZeusStorage.retain_answers`). So a call writes O(1) rows
whatever the job's history.

The tables live in the daemon's state file (one file to back up, check and restore; format 4
unchanged: docs/architecture.md, "Durability"), on a connection of their own: the engine's
transactions (:class:`offcut.daemon.app.store.Store`) and these never interleave on one
connection, and SQLite serialises the two writers. Every write, a job's registration and
deletion included, goes through one :class:`~offcut.daemon.zeus.group_commit.GroupCommit`:
a call queues its :class:`ZeusWrite` (:meth:`ZeusStorage.submit`) and answers once it is
durable (:meth:`ZeusStorage.wait`; on the event loop ``commits.wait_async``, then
:meth:`ZeusStorage.settled`); until then the storage remembers the answer to its request id
(:meth:`ZeusStorage.answer`) and which trial rows are not durable yet
(:meth:`ZeusStorage.row_durable`: a record leaves memory only once its row is). Reads go
through a read-only connection (committed rows; no writer's lock).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from offcut.daemon.app.state_file import (ReadOnlyConnection, StoreError, WriteTransactions,
                                         open_state_file)
from offcut.daemon.zeus.answers import stored_fields
from offcut.daemon.zeus.group_commit import GroupCommit

#: the Zeus optimizers' tables (each must be named in :data:`offcut.daemon.app.state_file.TABLES`, the
#: tables an Offcut state file may hold: tests/test_zeus_rows.py checks it)
ZEUS_TABLES = frozenset({"zeus_state", "zeus_trials", "zeus_observations", "zeus_requests"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS zeus_state (
    kind TEXT NOT NULL,
    job_id TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (kind, job_id, batch_size)
);
CREATE TABLE IF NOT EXISTS zeus_requests (
    request_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    response BLOB NOT NULL,
    created_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS zeus_requests_created ON zeus_requests(created_at);
CREATE TABLE IF NOT EXISTS zeus_trials (
    job_id TEXT NOT NULL,
    trial_number INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    status TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (job_id, trial_number)
);
CREATE INDEX IF NOT EXISTS zeus_trials_open ON zeus_trials(job_id, trial_number)
    WHERE status IN ('running', 'suspended');
CREATE TABLE IF NOT EXISTS zeus_observations (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    reward REAL NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"""

#: seconds between two expiries of stored answers (each a DELETE in a group commit)
EXPIRY_INTERVAL_S = 60.0


@dataclass
class ZeusWrite:
    """The rows one Zeus call changes (:meth:`ZeusStorage.write`): the object's summary
    (``state``, a dict or its JSON text; None = unchanged) under ``(kind, job_id,
    batch_size)``, the job's trial records that changed (each replaces its row), its newly
    observed runs ``(seq, batch size, reward = -cost [J])``, the answer to ``request_id``
    stored at ``created_at`` [s, wall clock], and the rows its retention deletes (in the same
    transaction). ``delete_job``: first remove the job, its trials, observed runs, power
    profiles and stored answers (DeleteJob; its own answer is then stored)."""

    kind: str
    job_id: str
    batch_size: int
    state: dict[str, Any] | str | None
    trials: list[dict[str, Any]] = field(default_factory=list)
    observations: list[tuple[int, int, float]] = field(default_factory=list)
    request_id: str | None = None
    response: bytes | None = None
    created_at: float = 0.0
    #: retention (docs/operations.md): delete the finished trials numbered in this inclusive
    #: range, the trials numbered here, and the observed runs of these seqs
    prune_trials: tuple[int, int] | None = None
    drop_trials: list[int] = field(default_factory=list)
    drop_observations: list[int] = field(default_factory=list)
    delete_job: bool = False


def put_zeus_trials(db: sqlite3.Connection, job_id: str, trials: Iterable[dict[str, Any]]
                    ) -> None:
    """Write (insert or replace) ``zeus_trials`` rows of ``job_id``'s trial records: the one
    row format (:meth:`ZeusStorage.write`; an upgrade to a later format may write it too)."""
    db.executemany("INSERT OR REPLACE INTO zeus_trials VALUES (?, ?, ?, ?, ?)",
                   [(job_id, int(t["trial_number"]), int(t["batch_size"]), t["status"],
                     json.dumps(t, separators=(",", ":"))) for t in trials])


def put_zeus_observations(db: sqlite3.Connection, job_id: str,
                          observations: Iterable[tuple[int, int, float]]) -> None:
    """Write (insert or replace) ``zeus_observations`` rows of ``job_id``'s observed runs
    ``(seq, batch size, reward = -cost [J])``: the one row format, as :func:`put_zeus_trials`."""
    db.executemany("INSERT OR REPLACE INTO zeus_observations VALUES (?, ?, ?, ?)",
                   [(job_id, int(seq), int(b), float(r)) for seq, b, r in observations])


def bad_zeus_rows(db: sqlite3.Connection, limit: int = 20
                  ) -> list[tuple[str, str, int, str]]:
    """Up to ``limit`` damaged ``zeus_state`` rows as ``(kind, job id, batch size, why)``:
    a summary that is not a JSON object (the daemon's start refuses them:
    :meth:`ZeusStorage.load`; shared with ``offcutd check``). A file whose Zeus tables were
    never created (no daemon ran on it) has none."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'zeus_state'"
                  ).fetchone() is None:
        return []
    bad = []
    for kind, job_id, size, text in db.execute(
            "SELECT kind, job_id, batch_size, state FROM zeus_state"):
        try:
            ok = isinstance(json.loads(text), dict)
            why = "not a JSON object"
        except (ValueError, TypeError) as exc:
            ok, why = False, f"not JSON: {exc}"
        if not ok:
            bad.append((str(kind)[:40], str(job_id)[:80], size, why))
            if len(bad) >= limit:
                break
    return bad


class ZeusStorage:
    """The Zeus tables of the state file at ``path`` (module docstring), on a connection of
    their own with ``durability`` (``full``: every commit fsynced; ``normal``: survives
    ``kill -9`` only). Thread-safe.

    Raises:
        StoreError, StateNotWritable: as :class:`offcut.daemon.app.store.Store` (the file is
            checked and opened by :func:`offcut.daemon.app.state_file.open_state_file`; a file of an
            older format is refused here: the engine's store upgrades it first).
    """

    def __init__(self, path: str | Path, durability: str = "full"):
        self.path = Path(path)
        self.durability = durability
        self.db = open_state_file(self.path, durability, _SCHEMA)
        self._transactions = WriteTransactions(self.db, self.path)
        self._reader = ReadOnlyConnection(self.path)
        #: the one commit path: the queue of writes not yet durable (the registry reads its
        #: ``transactions`` and ``writes`` counts; the daemon's stop closes it)
        self.commits = GroupCommit(self.write, self._expiry)
        self._lock = threading.Lock()
        #: answers to request ids whose writes are not durable yet:
        #: key -> (ticket, answer, job id)
        self._pending: dict[str, tuple[int, Any, str]] = {}
        #: (job, trial number) -> ticket of the latest write of that trial's record
        self._row_ticket: dict[tuple[str, int], int] = {}
        self._retention_s: float | None = None
        self._clock: Callable[[], float] = time.time
        self._last_expiry = -float("inf")

    # ------------------------------------------------------------------ settings
    @property
    def on_storage(self) -> Callable[[str | None], None] | None:
        """Called with the reason when a write fails for lack of writable storage, and with
        None at the next write that succeeds (:class:`offcut.daemon.app.state_file.WriteTransactions`)."""
        return self._transactions.on_storage

    @on_storage.setter
    def on_storage(self, callback: Callable[[str | None], None] | None) -> None:
        self._transactions.on_storage = callback

    def retain_answers(self, seconds: float, clock: Callable[[], float]) -> None:
        """Keep stored answers to request ids ``seconds`` after ``clock()`` [s, wall clock]
        stamped them (``ZeusWrite.created_at``): a group commit's leader deletes older ones,
        at most every :data:`EXPIRY_INTERVAL_S`."""
        self._retention_s, self._clock = float(seconds), clock

    def _expiry(self) -> float | None:
        """For a group commit's leader: forget answers stored before this [s], at most every
        :data:`EXPIRY_INTERVAL_S` (None otherwise, and without a retention)."""
        if self._retention_s is None:
            return None
        now = self._clock()
        if now - self._last_expiry < EXPIRY_INTERVAL_S:
            return None
        self._last_expiry = now
        return now - self._retention_s

    # ------------------------------------------------------------------ reading
    def load(self) -> list[tuple[str, str, int, dict[str, Any]]]:
        """Every stored optimizer object's summary as ``(kind, job_id, batch_size, state)``
        (a job's trials and observed runs: :meth:`trial_records`, :meth:`observation_rows`).

        Raises:
            StoreError: a damaged summary (:func:`bad_zeus_rows`)."""
        bad = bad_zeus_rows(self.db, limit=1)
        if bad:
            kind, job_id, size, why = bad[0]
            raise StoreError(f"{self.path}: zeus_state row ({kind}, {job_id}, {size}) is "
                             f"damaged ({why}); restore a backup (docs/operations.md)")
        return [(kind, job_id, bs, json.loads(state)) for kind, job_id, bs, state in
                self.db.execute("SELECT kind, job_id, batch_size, state FROM zeus_state")]

    def observation_rows(self, job_id: str) -> list[tuple[int, int, float]]:
        """The job's kept observed runs ``(seq, batch size, reward = -cost [J])`` by seq."""
        return [(int(s), int(b), float(r)) for s, b, r in self._reader.rows(
            "SELECT seq, batch_size, reward FROM zeus_observations WHERE job_id = ? "
            "ORDER BY seq", (job_id,))]

    def trial_page(self, job_id: str, before: int, limit: int) -> list[dict[str, Any]]:
        """The stored records of the job's ``limit`` newest trials numbered below ``before``,
        newest first (by primary key: O(limit))."""
        return [json.loads(r) for r, in self._reader.rows(
            "SELECT record FROM zeus_trials WHERE job_id = ? AND trial_number < ? "
            "ORDER BY trial_number DESC LIMIT ?", (job_id, int(before), max(0, int(limit))))]

    def first_finished_trial(self, job_id: str) -> int | None:
        """The lowest number of the job's stored finished trials (None: none)."""
        rows = self._reader.rows("SELECT trial_number FROM zeus_trials WHERE job_id = ? AND "
                                 "status NOT IN ('running', 'suspended') ORDER BY "
                                 "trial_number LIMIT 1", (job_id,))
        return int(rows[0][0]) if rows else None

    def trial_records(self, job_id: str, last: int | None = None) -> list[dict[str, Any]]:
        """The job's trial records ascending by number: all (``last`` None), or the open ones
        and the ``last`` newest."""
        if last is None:
            rows = self._reader.rows("SELECT record FROM zeus_trials WHERE job_id = ? "
                                     "ORDER BY trial_number", (job_id,))
            return [json.loads(r) for r, in rows]
        rows = self._reader.rows(
            "SELECT record FROM (SELECT trial_number, record FROM zeus_trials "
            "WHERE job_id = ? ORDER BY trial_number DESC LIMIT ?) UNION "
            # literal states: the partial index zeus_trials_open is used only for them
            "SELECT record FROM zeus_trials WHERE job_id = ? AND "
            "status IN ('running', 'suspended')", (job_id, max(0, int(last)), job_id))
        return sorted((json.loads(r) for r, in rows), key=lambda t: t["trial_number"])

    def trial_record(self, job_id: str, trial_number: int) -> dict[str, Any] | None:
        """One trial's stored record, or None."""
        rows = self._reader.rows("SELECT record FROM zeus_trials WHERE job_id = ? AND "
                                 "trial_number = ?", (job_id, int(trial_number)))
        return json.loads(rows[0][0]) if rows else None

    def response(self, request_id: str, job_id: str) -> bytes | None:
        """The durable answer about ``job_id`` stored under ``request_id`` (a key of
        :func:`offcut.daemon.zeus.registry.request_key`), or None; one query."""
        rows = self._reader.rows("SELECT response FROM zeus_requests WHERE request_id = ? AND "
                                 "job_id = ?", (request_id, job_id))
        return rows[0][0] if rows else None

    # ------------------------------------------------------------------ the commit path
    def submit(self, write: ZeusWrite, answer: Any = None) -> int:
        """Queue ``write`` for the next group commit; its ticket (for :meth:`wait`). Until
        the write settles, ``answer`` is the :meth:`answer` to its request id and its trial
        rows are not :meth:`row_durable`. Call in the order the calls changed memory (under
        the registry's lock).

        Raises:
            CommitFailed: an earlier write failed and the registry has not reloaded yet."""
        ticket = self.commits.submit(write)
        with self._lock:
            for t in write.trials:
                self._row_ticket[(write.job_id, t["trial_number"])] = ticket
            if write.request_id:
                self._pending[write.request_id] = (ticket, answer, write.job_id)
        return ticket

    def answer(self, key: str, job_id: str) -> tuple[int, Any] | None:
        """The first answer about ``job_id`` to ``key`` (a request key,
        :func:`offcut.daemon.zeus.answers.request_key`; "": none): ``(ticket, answer)`` of a
        queued write not durable yet (the ``answer`` given to :meth:`submit`; wait for the
        ticket before answering), ``(0, fields)`` of a durable one
        (:func:`~offcut.daemon.zeus.answers.stored_fields`; answers stored for another job are
        never returned), or None. Raises ValueError for a stored answer of another format."""
        if not key:
            return None
        with self._lock:
            hit = self._pending.get(key)
        if hit is not None:
            ticket, answer, job = hit
            return (ticket, answer) if job == job_id else None
        stored = self.response(key, job_id)
        return None if stored is None else (0, stored_fields(stored))

    def wait(self, ticket: int, key: str = "") -> None:
        """Return once the write ``ticket`` is durable (the transaction's OffcutError, else
        CommitFailed, if it failed), then forget the pending answer to ``key``."""
        try:
            self.commits.wait(ticket)
        finally:
            self.settled(ticket, key)

    def settled(self, ticket: int, key: str) -> None:
        """Forget the pending answer to ``key`` once its write ``ticket`` settled (a caller
        on the event loop awaits ``commits.wait_async(ticket)``, then calls this)."""
        if key:
            with self._lock:
                if self._pending.get(key, (None,))[0] == ticket:
                    del self._pending[key]

    def row_durable(self, job_id: str) -> Callable[[int], bool]:
        """Whether the job's trial record of a number is durable as of now (its latest write
        settled; a failed one leaves ``broken`` set: the registry reloads before any use)."""
        settled, tickets = self.commits.settled, self._row_ticket
        return lambda n: tickets.get((job_id, n), 0) <= settled

    def forget_rows(self, job_id: str, numbers: Iterable[int] | None = None) -> None:
        """Forget the write tickets of the job's trial records that left memory (``numbers``
        None: all of the job's, when its memory is reloaded from the file)."""
        with self._lock:
            if numbers is None:
                numbers = [n for j, n in self._row_ticket if j == job_id]
            for n in numbers:
                self._row_ticket.pop((job_id, n), None)

    def forget_job(self, job_id: str) -> None:
        """Forget what is remembered of a deleted job's writes (they are durable)."""
        with self._lock:
            self._pending = {k: v for k, v in self._pending.items() if v[2] != job_id}
            for key in [k for k in self._row_ticket if k[0] == job_id]:
                del self._row_ticket[key]

    def forget_writes(self) -> None:
        """Forget every pending answer and row ticket (memory is reloaded from the file, with
        no write pending)."""
        with self._lock:
            self._pending.clear()
            self._row_ticket.clear()

    @property
    def broken(self) -> bool:
        """A transaction failed and writes are refused until :meth:`reset`."""
        return self.commits.broken

    def flush(self) -> None:
        """Wait until every write queued so far is settled (failures are the callers')."""
        self.commits.flush()

    def reset(self) -> None:
        """Accept writes again (memory was reloaded from the file after a failure)."""
        self.commits.reset()

    def write(self, writes: list[ZeusWrite], expire_before: float | None = None) -> None:
        """Apply ``writes`` in order in ONE transaction (with ``durability="full"`` one fsync
        for all: the group commit; of several summaries of one object only the last is
        written), and with ``expire_before`` [s, wall clock] forget the stored answers created
        before it (the request-retention window).

        The registry stores a reply only after finding none for ``(request_id, job_id)``
        (its keys name the job: registry, ``request_key``), so a stored reply is never
        replaced by another job's.

        Raises:
            StateReadOnly, StateFull: storage that cannot be written (nothing written)."""
        # a summary that a later write of the batch replaces is not written (the same rows
        # after the transaction, one statement less: group commits batch one job's calls)
        last = {(w.kind, w.job_id, w.batch_size): i for i, w in enumerate(writes)
                if w.state is not None}
        db = self.db
        with self._transactions.writing():
            for i, w in enumerate(writes):
                if w.delete_job:
                    for table in ("zeus_state", "zeus_requests", "zeus_trials",
                                  "zeus_observations"):
                        db.execute(f"DELETE FROM {table} WHERE job_id = ?", (w.job_id,))
                if w.state is not None and last[(w.kind, w.job_id, w.batch_size)] == i:
                    state = (w.state if isinstance(w.state, str)
                             else json.dumps(w.state, separators=(",", ":")))
                    db.execute("INSERT OR REPLACE INTO zeus_state VALUES (?, ?, ?, ?)",
                               (w.kind, w.job_id, w.batch_size, state))
                if w.trials:
                    put_zeus_trials(db, w.job_id, w.trials)
                if w.observations:
                    put_zeus_observations(db, w.job_id, w.observations)
                if w.prune_trials is not None:  # (a bounded range of the primary key)
                    db.execute("DELETE FROM zeus_trials WHERE job_id = ? AND trial_number "
                               "BETWEEN ? AND ? AND status NOT IN ('running', 'suspended')",
                               (w.job_id, *w.prune_trials))
                if w.drop_trials:
                    db.executemany("DELETE FROM zeus_trials WHERE job_id = ? AND "
                                   "trial_number = ?", [(w.job_id, int(n)) for n in w.drop_trials])
                if w.drop_observations:
                    db.executemany("DELETE FROM zeus_observations WHERE job_id = ? AND seq = ?",
                                   [(w.job_id, int(s)) for s in w.drop_observations])
                if w.request_id:
                    db.execute("INSERT OR REPLACE INTO zeus_requests VALUES (?, ?, ?, ?)",
                               (w.request_id, w.job_id, w.response, w.created_at))
            if expire_before is not None:
                db.execute("DELETE FROM zeus_requests WHERE created_at < ?",
                           (float(expire_before),))

    def close(self) -> None:
        """End the committer thread (once no caller on a loop waits), then close the
        connections."""
        self.commits.close()
        self._reader.close()
        self.db.close()

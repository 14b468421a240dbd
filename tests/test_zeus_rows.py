"""Zeus jobs stored as rows (docs/zeus.md, "Storage"):
after thousands of trials the state file grows by rows while the job's stored document stays
the same size, memory holds at most ``zeus_trial_retention`` trial records, the decisions are
those of a fresh in-memory optimizer fed the same reports, retries within the request window
get the first answer (and later ones are new requests), concurrent callers share commits,
and a restarted daemon (real file, real gRPC) lists
every trial and continues the sequence exactly."""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from offcut.daemon.app.store import Store
from offcut.daemon.zeus.bso import BatchSizeJob
from offcut.daemon.zeus.registry import ZeusRegistry
from offcut.daemon.zeus.storage import EXPIRY_INTERVAL_S, ZeusStorage, ZeusWrite
from offcut.errors import FailedPrecondition

from daemon_helpers import Clock, zeus_core_spec

TRIALS = 2000
RETENTION = 50


class Admin:
    user, is_admin = "admin", True


#: this file's job "big": the shared Zeus spec, early stop at 2x the best cost, 3 epochs to 0.5
spec = functools.partial(zeus_core_spec, job_id="big", beta_knob=2.0, max_epochs=3,
                         target_metric=0.5, seed=11)


def drive(registry: ZeusRegistry, twin: BatchSizeJob, job_id: str, n: int, rng, clock: Clock
          ) -> list[tuple]:
    """``n`` trials on the registry's job and on the in-memory ``twin``, the same calls in
    the same order: most converge or fail by epochs, some are suspended and resumed, some
    are reported on again after they ended (reading evicted records); every answer of the two
    is compared. The answers (the predictions)."""
    who, answers = Admin(), []
    for i in range(n):
        rid = uuid.uuid4().hex
        p = registry.predict(job_id, rid, who)
        q = twin.predict(0, clock())
        assert p == q, i
        answers.append((rid, p))
        energy = 1000.0 * (1.0 + 0.5 * rng.random())
        if i % 97 == 5:  # interrupted, then resumed by the next generation
            assert registry.end_trial(job_id, p.trial_number, who, True, 3.0, energy / 3,
                                      generation=0) == twin.end_trial(
                p.trial_number, True, 3.0, energy / 3, 0, clock())
            assert registry.resume(job_id, p.trial_number, "r" + rid, who, 2) == \
                twin.resume(p.trial_number, 2)
        for epoch in (1, 2, 3):
            metric = 0.6 if (i % 3 != 2 and epoch == 2) else 0.1
            gen = 2 if i % 97 == 5 else 0
            v = registry.report(job_id, p.trial_number, epoch, 10.0 * epoch, energy * epoch,
                                metric, who, p.batch_size, gen)
            assert v == twin.report(p.trial_number, epoch, 10.0 * epoch, energy * epoch,
                                    metric, p.batch_size, gen), i
            if v.stop:
                break
        clock.t += 1.0
    # old, evicted trials answer with their stored verdicts, as the twin's kept ones do
    for number in (1, 2, n // 2):
        assert registry.report(job_id, number, 9, 1e3, 1e6, 0.9, who) == \
            twin.report(number, 9, 1e3, 1e6, 0.9)
    return answers


def stored_document(path) -> str:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT state FROM zeus_state WHERE kind = 'bso'").fetchone()[0]


def count(path, table: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_thousands_of_trials_add_rows_keep_memory_bounded_and_decide_as_before(tmp_path):
    path = tmp_path / "state.sqlite"
    clock = Clock(1_000_000.0)  # the registry's wall clock [s]
    registry = ZeusRegistry(ZeusStorage(path, durability="normal"), clock=clock,
                            trial_retention=RETENTION)
    registry.register(spec(), None, Admin(), "")
    twin = BatchSizeJob(spec())
    rng = np.random.default_rng(0)
    drive(registry, twin, "big", 100, rng, clock)
    document_100 = stored_document(path)
    answers = drive(registry, twin, "big", TRIALS - 100, rng, clock)
    document = stored_document(path)

    # the document is the O(batch sizes) summary: the same size (the same keys; numbers
    # differ in digits), no trials, no observed runs
    summary = json.loads(document)["job"]
    assert "trials" not in summary and "observations" not in summary
    assert summary["trial_count"] == TRIALS
    assert abs(len(document) - len(document_100)) < 200 and len(document) < 8000
    # ... while rows grow, one per trial and per observed run
    assert count(path, "zeus_trials") == TRIALS
    assert count(path, "zeus_observations") == len(twin.observations) > TRIALS // 2
    # memory: at most the retention (the open trials always stay; none is open now)
    job = registry.jobs["big"].job
    assert len(job.ledger.held) <= RETENTION
    assert [t["trial_number"] for t in job.trials] == list(range(TRIALS - RETENTION + 1,
                                                                  TRIALS + 1))
    # every record, in the file and in memory, is the twin's (which kept them all)
    records = registry.trial_records("big", Admin())
    assert records == twin.trials
    assert job.observations == twin.observations and job.summary() == twin.summary()

    # a retry within the window, of a trial long evicted, gets the first answer exactly
    rid, first = answers[0]
    assert registry.predict("big", rid, Admin()) == first
    assert registry.jobs["big"].job.ledger.count == TRIALS  # nothing new was opened

    # restart on the file: everything is back, and the sequence goes on as the twin's
    again = ZeusRegistry(ZeusStorage(path, durability="normal"), clock=clock,
                         trial_retention=RETENTION)
    assert again.trial_records("big", Admin()) == twin.trials
    assert len(again.jobs["big"].job.ledger.held) <= RETENTION
    for _ in range(5):
        assert again.predict("big", "", Admin()) == twin.predict(0, clock())


def test_stored_answers_expire_after_the_window_and_a_later_retry_is_new(tmp_path):
    clock = Clock(1_000_000.0)  # the registry's wall clock [s]
    registry = ZeusRegistry(ZeusStorage(tmp_path / "s.sqlite", durability="normal"), clock=clock,
                            request_retention_s=7200.0)
    registry.register(spec(), None, Admin(), "")
    first = registry.predict("big", "same-id", Admin())
    clock.t += 7000.0  # within the window: the first answer, nothing new opened
    assert registry.predict("big", "same-id", Admin()) == first
    other = registry.predict("big", "other", Admin())  # (a commit that runs the expiry)
    clock.t += 7200.0 + EXPIRY_INTERVAL_S
    registry.predict("big", "", Admin())  # the next commit deletes answers older than 2 h
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        kept = [k for (k,) in db.execute("SELECT request_id FROM zeus_requests")]
    assert kept == []  # both answers were older than the window
    retried = registry.predict("big", "same-id", Admin())
    assert retried.trial_number not in (first.trial_number, other.trial_number)


def test_concurrent_callers_share_commits_and_the_file_holds_every_answer(tmp_path):
    path = tmp_path / "state.sqlite"
    registry = ZeusRegistry(ZeusStorage(path, durability="full"), trial_retention=10)
    registry.register(spec(max_epochs=1), None, Admin(), "")
    errors: list[BaseException] = []
    answers: list = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(60):
                p = registry.predict("big", uuid.uuid4().hex, Admin())
                v = registry.report("big", p.trial_number, 1, 10.0,
                                    1000.0 * (1 + 0.1 * rng.random()), 0.6, Admin())
                answers.append((p, v))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len(answers) == 240
    commits = registry.commits
    assert commits.writes == 1 + 480 and commits.transactions <= commits.writes
    # the file holds what memory holds: a fresh registry on it has the same job
    again = ZeusRegistry(ZeusStorage(path, durability="full"), trial_retention=10)
    mem, disk = registry.jobs["big"].job, again.jobs["big"].job
    assert disk.summary() == mem.summary() and disk.observations == mem.observations
    assert again.trial_records("big", Admin()) == registry.trial_records("big", Admin())
    assert sorted(t["trial_number"] for t in again.trial_records("big", Admin())) == \
        list(range(1, 241))


def test_a_rejected_call_leaves_memory_and_file_as_they_were(tmp_path):
    path = tmp_path / "state.sqlite"
    registry = ZeusRegistry(ZeusStorage(path, durability="normal"))
    registry.register(spec(), None, Admin(), "")
    p = registry.predict("big", "", Admin())
    registry.report("big", p.trial_number, 1, 10.0, 100.0, 0.1, Admin())
    before, document = registry.jobs["big"].job.to_dict(), stored_document(path)
    with pytest.raises(FailedPrecondition, match="epoch"):
        registry.report("big", p.trial_number, 1, 20.0, 200.0, 0.1, Admin())
    assert registry.jobs["big"].job.to_dict() == before and stored_document(path) == document


def test_a_restarted_daemon_lists_every_trial_and_goes_on_exactly(daemons):
    """Real daemon, real file, real gRPC, with a retention of 5: trials evicted from memory
    are listed by GetJob before and after a restart, a retried Predict of an evicted trial
    gets its first answer after the restart, and the batch sizes go on as an in-memory
    optimizer's fed the same reports."""
    from offcut.v1 import zeus_pb2

    pb = zeus_pb2.BatchSizeJobSpec(job_id="big", batch_sizes=[8, 16, 32, 64, 128],
                                   default_batch_size=32, eta_knob=0.5, beta_knob=2.0,
                                   max_epochs=3, target_metric=0.5, higher_is_better=True,
                                   max_power_w=300.0, seed=11)
    twin = BatchSizeJob(spec())
    srv, client = daemons.start("r", zeus_trial_retention=5)
    client.register_zeus_job(pb)
    first_id, first = "first-" + uuid.uuid4().hex, None
    for i in range(40):
        rid = first_id if i == 0 else uuid.uuid4().hex
        p = client.predict_batch_size("big", request_id=rid)
        first = first or p
        assert (p.batch_size, p.trial_number) == (lambda q: (q.batch_size, q.trial_number))(
            twin.predict())
        energy = 1000.0 + 13.0 * i
        v = client.report_epoch("big", p.trial_number, 1, 10.0, energy, 0.6 if i % 3 != 2 else 0.1)
        assert v.stop == twin.report(p.trial_number, 1, 10.0, energy,
                                     0.6 if i % 3 != 2 else 0.1).stop
        if not v.stop:
            client.end_trial("big", p.trial_number)
            twin.end_trial(p.trial_number)
    assert len(srv.zeus.jobs["big"].job.ledger.held) <= 5
    listed = [(t.trial_number, t.status, t.cost_j) for t in client.get_zeus_job("big").trials]
    expected = [(t["trial_number"], t["status"], t["cost_j"]) for t in twin.trials]
    assert listed == expected and len(listed) == 40
    daemons.stop(srv)

    srv, client = daemons.start("r", zeus_trial_retention=5)
    assert [(t.trial_number, t.status, t.cost_j)
            for t in client.get_zeus_job("big").trials] == expected
    again = client.predict_batch_size("big", request_id=first_id)
    assert (again.batch_size, again.trial_number) == (first.batch_size, first.trial_number)
    for _ in range(5):
        p, q = client.predict_batch_size("big"), twin.predict()
        assert (p.batch_size, p.trial_number, p.exploration) == (q.batch_size, q.trial_number,
                                                                 q.exploration)


def test_a_group_commit_writes_only_the_last_summary_of_each_object(tmp_path):
    """Of a batch's summaries of one object (the calls of one job that a group commit
    gathers) only the last is written: the rows are those of writing each in turn, with one
    statement per object; the other rows of every write are written."""
    store = ZeusStorage(tmp_path / "state.sqlite", durability="normal")
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    store.write([
        ZeusWrite("bso", "a", 0, '{"n":1}', observations=[(0, 8, -1.0)]),
        ZeusWrite("plo", "a", 8, {"n": 2}),
        ZeusWrite("bso", "b", 0, '{"n":3}'),
        ZeusWrite("bso", "a", 0, None, observations=[(1, 16, -2.0)]),  # (summary unchanged)
        ZeusWrite("bso", "a", 0, '{"n":4}', observations=[(2, 8, -3.0)]),
        ZeusWrite("plo", "a", 8, {"n": 5}),
    ])
    assert {(k, j, b): json.loads(s) for k, j, b, s in store.db.execute(
        "SELECT kind, job_id, batch_size, state FROM zeus_state")} == {
        ("bso", "a", 0): {"n": 4}, ("bso", "b", 0): {"n": 3}, ("plo", "a", 8): {"n": 5}}
    assert sum("INTO zeus_state" in s for s in statements) == 3
    assert store.db.execute("SELECT seq FROM zeus_observations WHERE job_id = 'a' "
                            "ORDER BY seq").fetchall() == [(0,), (1,), (2,)]
    store.close()


def test_a_failed_commit_fails_the_writes_queued_behind_it_and_keeps_its_error(tmp_path):
    """A write queued behind a failed transaction was built on memory holding the failed
    changes: it fails too (it must never land without them), later writes are refused until
    the registry reloads (reset), and waiters get the storage error itself (UNAVAILABLE for a
    read-only state file), not an INTERNAL one."""
    from offcut.daemon.app.storage_errors import StateReadOnly
    from offcut.daemon.zeus.group_commit import CommitFailed, GroupCommit

    store = ZeusStorage(tmp_path / "state.sqlite")
    commits = GroupCommit(store.write)
    store.db.execute("PRAGMA query_only = ON")  # SQLite refuses every write: read-only
    first = commits.submit(ZeusWrite("plo", "j", 1, {"n": 1}))
    behind = commits.submit(ZeusWrite("plo", "j", 2, {"n": 2}))
    with pytest.raises(StateReadOnly):
        commits.wait(first)
    with pytest.raises(StateReadOnly):
        commits.wait(behind)
    assert commits.broken
    with pytest.raises(CommitFailed):
        commits.submit(ZeusWrite("plo", "j", 3, {"n": 3}))
    store.db.execute("PRAGMA query_only = OFF")
    commits.reset()
    commits.wait(commits.submit(ZeusWrite("plo", "j", 4, {"n": 4})))
    assert [(k, j, b) for k, j, b, _ in store.load()] == [("plo", "j", 4)]
    store.close()


def test_callers_on_an_event_loop_get_their_commit_and_its_failure_from_the_committer(tmp_path):
    """``wait_async`` (the Zeus round trip served on the event loop): the committer thread
    commits and settles the futures; concurrent coroutines share transactions; a failed
    transaction fails its writes and those queued behind with the storage error, and the
    registry's async calls recover as the threaded ones do."""
    import asyncio

    from offcut.daemon.app.storage_errors import StateReadOnly
    from offcut.daemon.zeus.group_commit import CommitFailed

    path = tmp_path / "state.sqlite"
    store = ZeusStorage(path, durability="full")
    registry = ZeusRegistry(store, trial_retention=10)
    registry.register(spec(max_epochs=1), None, Admin(), "")

    async def round_trip(i: int):
        p = await registry.predict_async("big", f"r-{i}", Admin())
        v = await registry.report_async("big", p.trial_number, 1, 10.0, 1000.0 + i, 0.6,
                                        Admin())
        return p, v

    async def many(n: int):
        return await asyncio.gather(*(round_trip(i) for i in range(n)))

    answers = asyncio.run(many(40))
    assert sorted(p.trial_number for p, _ in answers) == list(range(1, 41))
    commits = registry.commits
    assert commits.transactions < commits.writes  # concurrent coroutines shared commits
    assert any(t.name == "offcut-zeus-commit" for t in threading.enumerate())
    again = ZeusRegistry(ZeusStorage(path, durability="full"), trial_retention=10)
    assert again.jobs["big"].job.summary() == registry.jobs["big"].job.summary()
    # a repeated request id is answered with the first answer, from memory or the file
    first = answers[0][0]
    assert asyncio.run(registry.predict_async("big", "r-0", Admin())) == first

    store.db.execute("PRAGMA query_only = ON")  # every write refused: read-only storage

    async def failing():
        return await asyncio.gather(*(registry.predict_async("big", f"x-{i}", Admin())
                                      for i in range(3)), return_exceptions=True)

    results = asyncio.run(failing())
    assert all(isinstance(r, StateReadOnly) for r in results), results
    store.db.execute("PRAGMA query_only = OFF")
    p = asyncio.run(registry.predict_async("big", "after", Admin()))
    assert p.trial_number == 41  # the failed calls left nothing behind
    committer = registry.commits._committer
    assert committer is not None and committer.is_alive()
    registry.commits.close()  # the daemon stops: the committer thread ends
    assert not committer.is_alive()
    with pytest.raises(CommitFailed, match="stopping"):  # a late call is not left waiting
        asyncio.run(registry.predict_async("big", "late", Admin()))


def test_the_zeus_storage_shares_the_state_file_and_keeps_its_format(tmp_path):
    """The Zeus tables live in the daemon's state file on a connection of their own: they are
    tables the file's identity check accepts, and the engine's store and the Zeus storage
    together make a file of exactly the schema of a released format-4 file (the fixture of
    tests/test_released_state.py). A file no Zeus storage opened has no Zeus tables, and
    ``offcutd check``'s Zeus row check finds nothing wrong in it."""
    from offcut.daemon.app.state_file import TABLES
    from offcut.daemon.zeus.storage import ZEUS_TABLES, bad_zeus_rows

    def schema(path) -> list[tuple]:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            return sorted(db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        finally:
            db.close()

    assert ZEUS_TABLES <= TABLES
    path = tmp_path / "state.sqlite"
    Store(path).close()
    assert not {name for _, name, _, _ in schema(path)} & ZEUS_TABLES
    with sqlite3.connect(path) as db:
        assert bad_zeus_rows(db) == []
    ZeusStorage(path).close()
    released = tmp_path / "released.sqlite"  # (a copy: a reader may create -wal/-shm files)
    shutil.copyfile(Path(__file__).parent / "fixtures" / "state_format4" / "state.sqlite",
                    released)
    assert schema(path) == schema(released)


def test_every_zeus_write_takes_the_one_commit_path(tmp_path):
    """Registration, calls and deletion are all writes of the storage's group commit
    (one commit path): DeleteJob removes every row of the job and stores its own answer in one
    write, and its retry is answered from the file without another write."""
    path = tmp_path / "state.sqlite"
    registry = ZeusRegistry(ZeusStorage(path, durability="normal"))
    registry.register(spec(), None, Admin(), "")
    p = registry.predict("big", "p-1", Admin())
    registry.report("big", p.trial_number, 1, 10.0, 100.0, 0.6, Admin())
    assert registry.commits.writes == 3
    registry.delete("big", Admin(), request_id="d-1")
    assert registry.commits.writes == 4
    with sqlite3.connect(path) as db:
        rows = {t: db.execute(f"SELECT COUNT(*) FROM {t} WHERE job_id = 'big'").fetchone()[0]
                for t in ("zeus_state", "zeus_trials", "zeus_observations", "zeus_requests")}
    assert rows == {"zeus_state": 0, "zeus_trials": 0, "zeus_observations": 0,
                    "zeus_requests": 1}  # (the DeleteJob's own answer)
    registry.delete("big", Admin(), request_id="d-1")  # a retry: the first answer
    assert registry.commits.writes == 4 and "big" not in registry.jobs
    registry.storage.close()

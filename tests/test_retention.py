"""Finished tasks leave the daemon's memory and snapshots after ``finished_task_retention_s``
and stay readable from the state file's archive until ``task_archive_retention_s``
(docs/operations.md, "Retention: what is kept, and for how long"): a real daemon, real gRPC, a
real SQLite file, restarts."""

from __future__ import annotations

import json
import sqlite3

import grpc
import pytest

from offcut.errors import FailedPrecondition, NotFound
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from daemon_helpers import T0, make_spec

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

HOUR, DAY = 3600.0, 86400.0


def snapshot_task_ids(srv) -> list[str]:
    """The task ids of the newest snapshot, as a restart would load it."""
    with srv.engine.lock:
        state, _ = srv.engine.store.load()
    return [t["task_id"] for t in state["tasks"]]


def finish(c, tid, t):
    r = c.report_task_run(tid, "finished", node="n1", job_id=f"j{tid}", time=t)
    assert r.task.state == TaskState.COMPLETED


def test_finished_tasks_leave_memory_and_stay_readable(daemons):
    kw = dict(finished_task_retention_s=HOUR, task_archive_retention_s=2 * DAY,
              snapshot_every=1)
    srv, c = daemons.start(**kw)
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    ids = [c.submit(make_spec(f"job{i}", max_nodes=1), submit_time=T0 + i, owner=f"u{i % 2}")
           .task.task_id for i in range(4)]
    finish(c, ids[0], T0 + 10)
    c.cancel(ids[1], time=T0 + 20)
    before = {t.task_id: t for t in c.list_tasks()}
    # an hour later the two finished tasks leave the scheduler's state (not yet at 59 min)
    c.report_nodes(T0 + 10 + HOUR - 60, "slurm", 2, idle=["n1", "n2"])
    assert set(srv.engine.scheduler.tasks) == set(ids)
    c.report_nodes(T0 + 20 + HOUR, "slurm", 3, idle=["n1", "n2"])
    assert set(srv.engine.scheduler.tasks) == set(ids[2:])
    assert set(snapshot_task_ids(srv)) == set(ids[2:])
    # ... and read as before, from the archive: by id, in lists (submit order), per owner,
    # per state, in the status counts
    for tid in ids[:2]:
        assert c.get_task(tid) == before[tid]
    assert [t.task_id for t in c.list_tasks()] == ids
    assert [t.task_id for t in c.list_tasks(owner="u0")] == [ids[0], ids[2]]
    assert [t.task_id for t in c.list_tasks(states=[TaskState.CANCELLED])] == [ids[1]]
    assert [t.task_id for t in c.list_tasks(states=[TaskState.RUNNING])] == ids[2:]
    with pytest.raises(FailedPrecondition, match="task_id: task t000001 is already completed"):
        c.cancel(ids[0], time=T0 + 30 + HOUR)  # as before it left the state, not NOT_FOUND
    st = c.status()
    assert st.completed_tasks == 1 and st.cancelled_tasks == 1
    # a restart (snapshot + journal) keeps it so
    daemons.stop(srv)
    srv, c = daemons.start(**kw)
    assert set(srv.engine.scheduler.tasks) == set(ids[2:])
    assert c.get_task(ids[0]) == before[ids[0]]
    assert c.status().completed_tasks == 1
    # after the archive's retention they are gone for good, and counted no more (marked at
    # the snapshot of the event past it, deleted by the events after it)
    c.report_nodes(T0 + 10 + 2 * DAY + 1, "slurm", 4, idle=["n1", "n2"])
    c.report_nodes(T0 + 10 + 2 * DAY + 2, "slurm", 5, idle=["n1", "n2"])
    with pytest.raises(NotFound):
        c.get_task(ids[0])
    assert [t.task_id for t in c.list_tasks()] == ids[1:]  # ids[1] finished 10 s later
    listed = c.list_tasks()
    assert c.status().completed_tasks == sum(
        t.state == TaskState.COMPLETED for t in listed)


def test_a_crash_before_the_snapshot_loses_no_archived_task(daemons):
    """The archive row is written with the event that retired the task: re-applying the
    journal after a restart (no snapshot in between) finds it in the archive."""
    kw = dict(finished_task_retention_s=HOUR, snapshot_every=1000)
    srv, c = daemons.start(**kw)
    c.report_nodes(T0, "slurm", 1, idle=["n1"])
    tid = c.submit(make_spec("a", max_nodes=1), submit_time=T0).task.task_id
    finish(c, tid, T0 + 5)
    c.report_nodes(T0 + 5 + HOUR, "slurm", 2, idle=["n1"])
    assert tid not in srv.engine.scheduler.tasks
    srv.engine.store.db.close()  # as after kill -9: no snapshot at shutdown
    srv.engine.closed = True
    daemons.stop(srv)
    srv, c = daemons.start(**kw)
    assert tid not in srv.engine.scheduler.tasks
    assert c.get_task(tid).state == TaskState.COMPLETED


def journal_rows(state_file) -> tuple[int, int, int]:
    """(rows, first id, last id) of the journal."""
    db = sqlite3.connect(state_file)
    try:
        return db.execute("SELECT COUNT(*), MIN(id), MAX(id) FROM journal").fetchone()
    finally:
        db.close()


def test_the_journal_keeps_its_retention_window_and_no_more(daemons):
    kw = dict(journal_retention_s=HOUR, snapshot_every=5)
    srv, c = daemons.start(**kw)
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    first = c.submit(make_spec("a", max_nodes=1), submit_time=T0 + 1, request_id="r-1")
    # two simulated days of events, one every 10 minutes
    seq = 1
    for k in range(1, 2 * 24 * 6):
        seq += 1
        c.report_nodes(T0 + 600 * k, "slurm", seq, idle=["n1", "n2"] if k % 2 else ["n1"])
    rows, lo, hi = journal_rows(srv.config.state)
    now = T0 + 600 * (2 * 24 * 6 - 1)
    # an hour of events (6), plus at most the rows since the older kept snapshot (2 x 5)
    assert rows <= 6 + 2 * 5 + 1 and hi == c.status().revision
    # the history starts at the oldest kept row; nothing older is invented
    history = list(c.export_history(after_revision=0))
    assert [e.decision.revision for e in history] == list(range(lo, hi + 1))
    assert all(int(e.decision.time) >= now - HOUR - 10 * 600 for e in history)
    # within the window a repeated request id is a duplicate; the task itself is still there
    recent = c.submit(make_spec("b", max_nodes=1), submit_time=now, request_id="r-2")
    again = c.submit(make_spec("b", max_nodes=1), submit_time=now, request_id="r-2")
    assert again.decision.duplicate and again.task.task_id == recent.task.task_id
    assert c.get_task(first.task.task_id).task_id == first.task.task_id
    # a restart recovers the same state from the kept snapshot and rows
    key = srv.engine.scheduler.fingerprint()
    daemons.stop(srv)
    srv, c = daemons.start(**kw)
    assert srv.engine.scheduler.fingerprint() == key


def test_list_pages_cover_memory_and_archive_once_each_in_submit_order(daemons):
    """ListTasks answers in pages (``page_size``, ``next_page_token``) over the tasks in
    memory and the archive together: every matching task exactly once, in submit order, per
    owner and state; a page size over the bound or a forged token is INVALID_ARGUMENT naming
    the field, and a user's token cannot reach another user's tasks."""
    srv, c = daemons.start(finished_task_retention_s=HOUR, snapshot_every=1)
    c.report_nodes(T0, "slurm", 1, idle=["n1"])
    ids = [c.submit(make_spec(f"job{i}", max_nodes=1), submit_time=T0 + i, owner=f"u{i % 3}")
           .task.task_id for i in range(11)]
    for k, tid in enumerate(ids[:7]):  # finished in turn, then retired to the archive
        if k % 2:
            c.cancel(tid, time=T0 + 20 + k)
        else:
            finish(c, tid, T0 + 20 + k)
    c.report_nodes(T0 + 2 * HOUR, "slurm", 2, idle=["n1"])
    assert set(srv.engine.scheduler.tasks) == set(ids[7:])  # the rest in memory
    for size in (1, 2, 3, 4, 11, 50):
        pages, token = [], ""
        while True:
            page = c.tasks.ListTasks(tasks_pb2.ListTasksRequest(page_size=size, page_token=token))
            assert len(page.tasks) <= size
            pages.append([t.task_id for t in page.tasks])
            token = page.next_page_token
            if not token:
                break
        assert [t for p in pages for t in p] == ids, size
        assert all(pages[:-1]) and len(pages) == -(-len(ids) // size), size
    assert [t.task_id for t in c.list_tasks(owner="u1", page_size=1)] == ids[1::3]
    finished = [TaskState.COMPLETED, TaskState.CANCELLED]
    assert [t.task_id for t in c.list_tasks(states=finished, page_size=2)] == ids[:7]
    assert len(c.list_tasks()) == len(ids)  # the default page holds them all
    for request, field in [(tasks_pb2.ListTasksRequest(page_size=10_001), "page_size")] + [
            (tasks_pb2.ListTasksRequest(page_token=forged), "page_token")
            for forged in ("x12", "t", "t-1", "t²", "t" + "9" * 40)]:
        with pytest.raises(grpc.RpcError) as info:
            c.tasks.ListTasks(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(f"{field}: "), info.value.details()


def test_journal_rows_past_the_window_are_deleted_a_few_per_event(tmp_path):
    """The snapshot's retention step only marks the rows past the journal's retention (no
    deletes in any transaction of its event); each following append deletes at most JOURNAL_DELETES_PER_APPEND of them,
    never a row the older kept snapshot needs, until none is left; a reopened store has
    forgotten the mark (the next snapshot marks again)."""
    from offcut.daemon.app.journal import JOURNAL_DELETES_PER_APPEND as K
    from offcut.daemon.app.store import Store

    def append(store, t, state=None):
        store.append(kind="nodes", event={"kind": "nodes", "time": t}, solves=[],
                     response=b"{}", state=state)

    store = Store(tmp_path / "s.sqlite", snapshot_every=10**9)
    for i in range(100):
        append(store, T0 + i)
    append(store, T0 + 100, state={"tasks": []})   # snapshot at row 101
    for i in range(101, 150):
        append(store, T0 + i)
    append(store, T0 + 150, state={"tasks": []})   # snapshot at row 151: kept are 101, 151
    assert store.retire_journal(T0 + 80) == 80     # events before T0 + 80: rows 1-80
    assert journal_rows(store.path)[:2] == (151, 1)  # marking deletes nothing
    append(store, T0 + 151)
    assert journal_rows(store.path)[:2] == (151 + 1 - K, K + 1)
    for i in range(10):
        append(store, T0 + 152 + i)
    assert journal_rows(store.path)[1] == 81       # caught up: row 81 on are kept
    # the older kept snapshot bounds the deletes, whatever the time says
    assert store.retire_journal(T0 + 10**6) == 101  # up to the older snapshot's own row
    for i in range(5):
        append(store, T0 + 200 + i)
    assert journal_rows(store.path)[1] == 102
    append(store, T0 + 250, state={"tasks": []})   # kept: 151 and this one
    assert store.retire_journal(T0 + 10**6) == 151
    store.close()
    store = Store(tmp_path / "s.sqlite", snapshot_every=10**9)
    append(store, T0 + 300)
    assert journal_rows(store.path)[1] == 102      # the mark is not kept across a reopen
    store.retire_journal(T0 + 10**6)
    append(store, T0 + 301)
    assert journal_rows(store.path)[1] == 102 + K  # marked again, deleted again
    store.close()


def test_marking_the_journal_reads_no_journal_row_but_the_probes(tmp_path):
    """The snapshot's retention step runs under the engine's lock at every snapshot: every
    statement it runs on the journal is a lookup by id (SQLite's query plan: SEARCH), never a
    pass over the whole journal, whose size is a week of events (one select of MIN and MAX
    together is such a pass: it was most of a snapshot's stall in the soak)."""
    from offcut.daemon.app.store import Store

    store = Store(tmp_path / "s.sqlite", snapshot_every=10**9)
    for i in range(300):
        store.append(kind="nodes", event={"kind": "nodes", "time": T0 + i}, solves=[],
                     response=b"{}", state={"tasks": []} if i in (100, 200) else None)
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    try:
        assert store.retire_journal(T0 + 150) == 101  # the older kept snapshot bounds it
    finally:
        store.db.set_trace_callback(None)
    on_journal = [s for s in statements if "FROM journal" in s]
    assert on_journal  # the step did read the journal
    for sql in on_journal:
        plan = " ".join(row[3] for row in store.db.execute(f"EXPLAIN QUERY PLAN {sql}"))
        assert "SCAN journal" not in plan, (sql, plan)
    store.close()


def test_the_archive_is_pruned_a_few_tasks_per_event_after_a_snapshot(tmp_path, monkeypatch):
    """A snapshot marks the archived tasks past their retention and its own transaction
    deletes none; each following event's transaction (one BEGIN, one commit, none of its
    own; a later snapshot's too) deletes up to ARCHIVE_DELETES_PER_APPEND of them, oldest
    first, and says how many of each state went (the engine's counts), until none is left."""
    from offcut.daemon.app import store as store_mod
    from offcut.daemon.app.store import Store

    def done(n: int, t: float, state: str = "completed") -> dict:
        return {"task_id": f"t{n:06d}", "owner": "u", "state": state, "finish_time": t}

    def event(t: float, **kw) -> dict:
        return dict(kind="nodes", event={"kind": "nodes", "time": t}, solves=[],
                    response=b"{}", **kw)

    monkeypatch.setattr(store_mod, "ARCHIVE_DELETES_PER_APPEND", 1)
    store = Store(tmp_path / "s.sqlite", snapshot_every=10**9)
    store.append(**event(T0, archive=[done(1, T0), done(2, T0 + 10, "cancelled"),
                                      done(3, T0 + 100)]))
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    try:
        assert store.append(**event(T0 + 200, state={"tasks": []},
                                    prune_archive_before=T0 + 50)) == {}
        assert not [s for s in statements if "task_archive" in s]  # the snapshot's: none
        assert len(store.archived_tasks()) == 3
        statements.clear()
        assert store.append(**event(T0 + 201)) == {"completed": 1}
        assert sum(s.startswith("BEGIN") for s in statements) == 1
        # a later snapshot deletes too (with a snapshot at every event nothing would else)
        assert store.append(**event(T0 + 202, state={"tasks": []})) == {"cancelled": 1}
    finally:
        store.db.set_trace_callback(None)
    assert [t["task_id"] for t in store.archived_tasks()] == ["t000003"]
    assert store.append(**event(T0 + 203)) == {}  # caught up: the mark is gone
    assert store.append(**event(T0 + 204)) == {}
    assert [t["task_id"] for t in store.archived_tasks()] == ["t000003"]
    store.close()

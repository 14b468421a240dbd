"""The task rows of incremental snapshots that no kept snapshot reads are deleted a bounded
number per snapshot (daemon/app/snapshot_prune.py, docs/architecture.md, "Journal and snapshots"): every
kept snapshot always reads exactly the tasks it was written with, each snapshot walks at most its
budget of rows, the unread rows are gone eventually (also across a reopen), and a row saying a task
left goes only once no older row of that task is left to bring it back."""

from __future__ import annotations

import random
import sqlite3

import pytest

from offcut.daemon.app import snapshot_prune
from offcut.daemon.app.snapshots import SnapshotDelta, snapshots
from offcut.daemon.app.store import Store

#: rows walked per snapshot beyond the rows it writes, in these tests (the daemon's is 256)
BUDGET = 7


@pytest.fixture(autouse=True)
def small_budget(monkeypatch):
    """Walk exactly the rows written plus BUDGET per snapshot (no time-bounded steps)."""
    monkeypatch.setattr(snapshot_prune, "PRUNE_MIN_ROWS", BUDGET)
    monkeypatch.setattr(snapshot_prune, "PRUNE_SECONDS", 0.0)


class Model:
    """A store written with incremental snapshots, and the tasks each snapshot must read."""

    def __init__(self, path):
        self.path = path
        self.store = Store(path, snapshot_every=10**9)
        self.tasks: dict[str, dict] = {}
        self.expected: dict[int, dict[str, dict]] = {}  # journal id -> task id -> task
        self.journal_id = 0
        self.changed: set[str] = set()
        self.removed: set[str] = set()
        self.walked: list[int] = []
        self.submitted = 0

    def submit(self, n: int) -> None:
        for _ in range(n):
            self.submitted += 1
            task_id = f"t{self.submitted:06d}"
            self.tasks[task_id] = {"task_id": task_id, "v": 0}
            self.changed.add(task_id)

    def touch(self, task_ids) -> None:
        for task_id in task_ids:
            self.tasks[task_id] = dict(self.tasks[task_id], v=self.tasks[task_id]["v"] + 1)
            self.changed.add(task_id)

    def retire(self, task_ids) -> None:
        for task_id in task_ids:
            del self.tasks[task_id]
            self.changed.discard(task_id)
            self.removed.add(task_id)

    def snapshot(self, every_task: bool = False) -> None:
        """One journal row and a snapshot of the tasks changed since the last one (every task:
        what the first snapshot after an upgrade or a fallback writes)."""
        self.journal_id += 1
        changed = sorted(self.tasks if every_task else self.changed)
        delta = SnapshotDelta({"revision": self.journal_id, "incremental": True},
                              [self.tasks[i] for i in changed], sorted(self.removed))
        walked = []
        prune = snapshot_prune.prune
        try:  # count the rows the snapshot walks
            snapshot_prune.prune = lambda db, budget, seconds, default: walked.append(
                (prune(db, budget, seconds, default), budget)) or walked[-1][0]
            self.store.append(kind="nodes", event={"time": float(self.journal_id)}, solves=[],
                              response=b"{}", state=delta)
        finally:
            snapshot_prune.prune = prune
        (n, budget), = walked
        assert budget == BUDGET + len(changed) + len(self.removed)
        assert n <= budget or snapshot_prune.PRUNE_SECONDS > 0
        self.walked.append(n)
        self.expected[self.journal_id] = {i: dict(t) for i, t in self.tasks.items()}
        self.changed, self.removed = set(), set()
        self.check()

    def check(self) -> None:
        """Every kept snapshot reads exactly the tasks it was written with."""
        kept = {j: s for j, s, why in snapshots(self.store.db)}
        assert len(kept) == min(2, len(self.expected))
        for journal_id, state in kept.items():
            assert state is not None
            assert {t["task_id"]: t for t in state["tasks"]} == self.expected[journal_id]

    def rows(self) -> int:
        return self.store.db.execute("SELECT COUNT(*) FROM snapshot_tasks").fetchone()[0]

    def needed_rows(self) -> int:
        """The rows the two kept snapshots read: per task its newest row at or before each."""
        return self.store.db.execute(
            "SELECT COUNT(DISTINCT t.rowid) FROM snapshot_tasks t JOIN snapshots s ON "
            "t.journal_id = (SELECT MAX(journal_id) FROM snapshot_tasks u WHERE "
            "u.task_id = t.task_id AND u.journal_id <= s.journal_id) WHERE t.task IS NOT NULL"
        ).fetchone()[0]

    def reopen(self) -> None:
        self.store.close()
        self.store = Store(self.path, snapshot_every=10**9)


def test_a_snapshot_of_every_task_is_pruned_in_bounded_steps_and_never_too_early(tmp_path):
    m = Model(tmp_path / "state.sqlite")
    m.submit(60)
    m.snapshot()
    m.touch(["t000001", "t000002"])
    m.snapshot()
    # what a fallback or an upgrade does: every task written again; two snapshots later it is
    # the oldest kept one and each of its 60 tasks has an older row to delete
    m.snapshot(every_task=True)
    rows_after_full = m.rows()
    assert rows_after_full > 100
    for k in range(3, 30):
        m.touch([f"t{k:06d}"])
        m.snapshot()
    # the walk took several snapshots (bounded), and no unread row is left
    assert max(m.walked[3:]) <= BUDGET + 1
    # every task's row read by the older kept snapshot, and the last touched task's newer row
    assert m.rows() == m.needed_rows() == 60 + 1


def test_offcutd_check_reports_the_rows_still_to_delete(tmp_path):
    """``offcutd check`` tells an operator how many unread snapshot rows wait (disk only),
    and stops telling once the walk has caught up."""
    from offcut.daemon.app.state_admin import check_state

    m = Model(tmp_path / "state.sqlite")
    m.submit(60)
    m.snapshot()
    m.snapshot(every_task=True)
    m.touch(["t000001"])
    m.snapshot()
    m.touch(["t000002"])
    m.snapshot()  # the snapshot of every task is now the oldest kept: 60 rows to walk
    waiting = snapshot_prune.backlog(m.store.db, snapshot_prune.default_cursor(m.store.db))
    assert waiting > 0
    lines, ok = check_state(m.path)
    assert ok and any(f"note: {waiting} task rows of older snapshots" in line for line in lines)
    for k in range(3, 30):
        m.touch([f"t{k:06d}"])
        m.snapshot()
    lines, ok = check_state(m.path)
    assert ok and not any("task rows of older snapshots" in line for line in lines), lines


def test_rows_of_tasks_that_left_go_only_after_their_older_rows(tmp_path):
    m = Model(tmp_path / "state.sqlite")
    m.submit(40)
    m.snapshot()
    m.retire([f"t{k:06d}" for k in range(1, 31)])  # many leave at once: 30 NULL rows
    m.snapshot()
    m.submit(1)
    m.snapshot()
    for _ in range(12):
        m.touch(["t000035"])
        m.snapshot()
    gone = m.store.db.execute("SELECT COUNT(*) FROM snapshot_tasks WHERE task_id <= 't000030'"
                              ).fetchone()[0]
    assert gone == 0
    assert m.rows() == m.needed_rows()


def test_random_histories_keep_every_kept_snapshot_exact_across_reopens(tmp_path):
    rng = random.Random(7)
    m = Model(tmp_path / "state.sqlite")
    m.submit(30)
    m.snapshot()
    for step in range(120):
        alive = sorted(m.tasks)
        r = rng.random()
        if r < 0.1:
            m.submit(rng.randint(1, 20))
        elif r < 0.2 and len(alive) > 5:
            m.retire(rng.sample(alive, rng.randint(1, len(alive) // 3)))
        else:
            m.touch(rng.sample(alive, min(len(alive), rng.randint(0, 4))))
        m.snapshot(every_task=rng.random() < 0.05)
        if rng.random() < 0.1:
            m.reopen()  # the cursor is stored with the snapshot: the walk goes on where it was
            m.check()
    for _ in range(60):  # quiet snapshots: the walk catches up
        m.snapshot()
    assert m.rows() == m.needed_rows()
    assert snapshot_prune.backlog(m.store.db) <= BUDGET


def test_a_file_without_a_cursor_starts_after_its_oldest_kept_snapshot(tmp_path):
    """Files of releases before the cursor were pruned completely at each snapshot: their walk
    starts after the oldest kept snapshot's rows, not over every live row again."""
    m = Model(tmp_path / "state.sqlite")
    m.submit(50)
    m.snapshot()
    m.touch(["t000001"])
    m.snapshot()
    m.store.close()
    with sqlite3.connect(m.path) as db:
        db.execute("DELETE FROM meta WHERE key = ?", (snapshot_prune.CURSOR_KEY,))
        oldest = db.execute("SELECT MIN(journal_id) FROM snapshots").fetchone()[0]
        last = db.execute("SELECT MAX(rowid) FROM snapshot_tasks WHERE journal_id = ?",
                          (oldest,)).fetchone()[0]
    db.close()
    m.store = Store(m.path, snapshot_every=10**9)
    assert snapshot_prune.default_cursor(m.store.db) == (oldest, last)
    m.touch(["t000002"])
    m.snapshot()
    assert m.walked[-1] == 1  # the newer kept snapshot's one row, nothing older
    assert snapshot_prune.cursor(m.store.db)[0] == oldest + 1


def test_time_left_in_a_snapshot_walks_on_in_steps(tmp_path, monkeypatch):
    """Beyond its minimum a snapshot walks on in steps of CHUNK_ROWS while PRUNE_SECONDS last:
    with time enough, the rows of a snapshot of every task go with the next snapshot."""
    monkeypatch.setattr(snapshot_prune, "PRUNE_SECONDS", 60.0)
    monkeypatch.setattr(snapshot_prune, "CHUNK_ROWS", 5)
    m = Model(tmp_path / "state.sqlite")
    m.submit(80)
    m.snapshot()
    m.snapshot(every_task=True)
    m.touch(["t000003"])
    m.snapshot()  # the first snapshot of every task is now the oldest kept one: walked at once
    assert m.walked[-1] == 80  # the snapshot of every task, in steps: each deletes a row
    assert m.rows() == m.needed_rows() == 80 + 1

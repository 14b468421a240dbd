"""The launcher's desired state from one placement stream (slurm_plugin/placements.py): the
merge rules of placements, lists and reads on real protobuf messages, and the watch's
reconnects. The launcher on this state with a real daemon: tests/test_slurm_launcher.py."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from daemon_helpers import DEADLINE_S, wait_until

from offcut.errors import NotFound, Unavailable
from offcut.retry import Backoff
from offcut.slurm_plugin.placements import DesiredState, PlacementWatch, read_unread
from offcut.taskspec import TaskSpec
from offcut.v1 import decision_pb2, status_pb2
from offcut.views import PlacementChange, PlacementUpdate, TaskReply, TaskState, TaskView
from offcut.wire.tasks import decision_from_pb, status_from_pb

RUNNING, COMPLETED = TaskState.RUNNING, TaskState.COMPLETED


def task(task_id: str, generation: int, nodes=("n1",), state=RUNNING) -> TaskView:
    return TaskView(task_id=task_id, spec=TaskSpec(task_id, 1, 1, (), ()), owner="u",
                    state=state, submit_time=None, admit_time=None, finish_time=None,
                    nodes=list(nodes), work_done_samples=0.0, rate_samples_per_s=0.0,
                    rescales=0, preemptions=0, launches=0, last_run="",
                    generation=generation, failed_runs=0, failure_reason="", energy_j=0.0,
                    power_w=0.0)


def placed(task_id: str, generation: int, nodes=("n1",), change="GROW") -> PlacementChange:
    return PlacementChange(task_id=task_id, task_name="", change=change.lower(),
                           nodes=list(nodes), previous_count=0, rate=0.0, work_done=0.0,
                           total_work=0.0, time=0.0, generation=generation)


def view(state: DesiredState) -> dict[str, tuple[int, tuple[str, ...]]]:
    """task id -> (generation, nodes) of the running tasks."""
    return {tid: (g, n) for tid, (_, g, n) in state.running().ready.items()}


def test_not_synced_until_listed_and_after_a_break():
    state = DesiredState()
    with pytest.raises(Unavailable, match="not connected"):
        state.running()
    state.reset([task("t1", 2, ("n2", "n1")), task("t9", 1, state=COMPLETED)], revision=7)
    assert view(state) == {"t1": (2, ("n1", "n2"))} and state.revision == 7
    state.lose()
    with pytest.raises(Unavailable):
        state.running()


def test_placements_newer_than_the_list_apply_and_older_ones_are_skipped():
    state = DesiredState()
    state.reset([task("t1", 3, ("n1", "n2"))])
    version = state.version
    # a replayed update from before the list (generation 2): already in the list
    assert state.apply([placed("t1", 2, ("n1",), "SHRINK")], revision=5) == ""
    assert view(state) == {"t1": (3, ("n1", "n2"))} and state.version == version
    assert state.revision == 5
    state.apply([placed("t1", 4, ("n3", "n1"), "GROW")], revision=6)
    assert view(state) == {"t1": (4, ("n1", "n3"))} and state.version > version
    # a task without nodes (stopped, preempted to none) is not running, but followed
    state.apply([placed("t1", 5, (), "STOP")], revision=7)
    assert view(state) == {}
    state.apply([placed("t1", 6, ("n2",), "START")], revision=8)
    assert view(state) == {"t1": (6, ("n2",))}  # (its spec known from the list: no read)
    # its finish: not running, forgotten
    state.apply([placed("t1", 6, (), "COMPLETED")], revision=9)
    assert view(state) == {} and state.running().unread == []


def test_a_task_placed_after_the_list_is_read_once():
    state = DesiredState()
    state.reset([])
    state.apply([placed("t2", 1, ("n1",), "START")], revision=3)
    snapshot = state.running()
    assert snapshot.ready == {} and snapshot.unread == ["t2"]
    reads = []

    def get_task(task_id):
        reads.append(task_id)
        return task(task_id, 2, ("n1", "n4"))  # newer than the placement that named it

    assert {t: (g, n) for t, (_, g, n) in read_unread(state, get_task).ready.items()} == \
        {"t2": (2, ("n1", "n4"))}
    assert reads == ["t2"]
    read_unread(state, get_task)
    state.apply([placed("t2", 2, ("n1", "n4"), "GROW")], revision=4)  # (the read's news)
    state.apply([placed("t2", 3, ("n4",), "SHRINK")], revision=5)
    assert view(state) == {"t2": (3, ("n4",))} and reads == ["t2"]


def test_a_task_read_finished_stays_finished_until_its_finish_arrives():
    """An old placement of a task that has finished since (replayed after a reconnect):
    the read says finished, so it is not launched, and later old placements of it change
    nothing; its finish on the stream forgets it."""
    state = DesiredState()
    state.reset([])
    state.apply([placed("t3", 1, ("n1",), "START")])
    read_unread(state, lambda tid: task(tid, 2, (), state=COMPLETED))
    assert view(state) == {} and state.running().unread == []
    state.apply([placed("t3", 2, ("n2",), "GROW")])   # still old news
    assert view(state) == {} and state.running().unread == []
    state.apply([placed("t3", 2, (), "COMPLETED")])
    state.apply([placed("t3", 3, ("n2",), "START")])  # (a new task of the same id: read)
    assert state.running().unread == ["t3"]
    # a task the daemon does not know (NotFound) is not launched either
    state.apply([placed("t4", 1, ("n3",), "START")])

    def unknown(task_id):
        raise NotFound(f"no task {task_id!r}", "task_id")

    read_unread(state, lambda tid: task(tid, 3, ("n2",)) if tid == "t3" else unknown(tid))
    assert view(state) == {"t3": (3, ("n2",))}


def test_a_read_does_not_bring_back_a_task_whose_finish_arrived_meanwhile():
    state = DesiredState()
    state.reset([])
    state.apply([placed("t5", 1, ("n1",), "START")])

    def get_task(task_id):  # the read was answered before the finish was applied
        state.apply([placed(task_id, 1, (), "CANCELLED")])
        return task(task_id, 1, ("n1",))

    assert read_unread(state, get_task).ready == {}
    assert state.running().unread == []


def test_a_skipped_generation_on_the_stream_is_a_gap_but_not_in_a_reply():
    state = DesiredState()
    state.reset([task("t1", 1)])
    assert state.apply([placed("t1", 3)], revision=9, ordered=False) == ""  # a reply: newer
    assert view(state) == {"t1": (3, ("n1",))}
    assert state.apply([placed("t1", 2), placed("t1", 3), placed("t1", 4)], revision=10) == ""
    gap = state.apply([placed("t1", 6)], revision=12)
    assert "t1 went from generation 4 to 6 at revision 12" in gap
    assert view(state) == {"t1": (6, ("n1",))}  # (applied all the same: placements are whole)


def test_a_stale_reply_does_not_bring_back_a_task_the_stream_finished():
    """Review: a reply no newer than the stream (its update and the task's finish after it
    were applied already) does not re-create the finished task; a newer reply still adds a
    task the state does not hold, and replies do not move the stream's revision."""
    state = DesiredState()
    state.reset([task("t1", 1)], revision=5)
    state.apply([placed("t1", 1, (), "COMPLETED")], revision=7)  # the stream: its finish
    assert state.apply([placed("t1", 1, ("n1",), "START")], revision=6, ordered=False) == ""
    assert view(state) == {} and state.running().unread == []
    state.apply([placed("t1", 1, ("n1",), "START")], revision=7, ordered=False)
    assert state.running().unread == []  # (as new as the stream: still old news)
    state.apply([placed("t2", 1, ("n2",), "START")], revision=8, ordered=False)
    assert state.running().unread == ["t2"] and state.revision == 7


def test_a_run_reports_reply_fills_its_task():
    """Review: the task a ReportTaskRun reply carries is merged into the state (no GetTask
    for a task placed since the list)."""
    from offcut.daemon.config import SlurmConfig
    from offcut.slurm_plugin.launch_reports import RunReporter
    from offcut.slurm_plugin.launch_types import JobName, PassResult
    from offcut.slurm_plugin.slurm_json import JobInfo

    class Client:
        def report_task_run(self, task_id, state, **kw):
            return TaskReply(task=task(task_id, 2, ("n1", "n3")),
                             decision=decision_from_pb(decision_pb2.Decision(revision=9)))

    state = DesiredState()
    state.reset([], revision=5)
    state.apply([placed("t1", 1, ("n1",), "START")], revision=6)
    assert state.running().unread == ["t1"]
    reporter = RunReporter(Client(), SlurmConfig(), None, lambda: None, state,
                           clock=lambda: 0.0, stopped_by_us=lambda: ((), ()))
    result = PassResult()
    assert reporter.report(JobName("t1", 1, "n1"), JobInfo("41", states=frozenset({"RUNNING"})),
                           "started", result)
    assert state.running().unread == [] and view(state) == {"t1": (2, ("n1", "n3"))}
    assert result.reported == [("t1", "41", "started")]


def test_reread_after_a_refused_report():
    state = DesiredState()
    state.reset([task("t1", 1)])
    state.reread("t1")
    assert state.running().unread == ["t1"]
    assert read_unread(state, lambda tid: task(tid, 1, (), state=COMPLETED)).ready == {}


# ----------------------------------------------------------------------------- the watch
class FakeStream:
    """A WatchPlacements stream the test feeds (``put``; ``end`` ends it); it ends by
    itself after ``timeout_s`` [s] (None: never)."""

    def __init__(self, timeout_s: float | None = None):
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._items: list = []
        self._cond = threading.Condition()
        self.cancelled = False

    def put(self, revision: int, *placements) -> None:
        with self._cond:
            self._items.append(PlacementUpdate(revision=revision, time=0.0, cause="nodes",
                                               placements=list(placements)))
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._items.append(None)
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()

    def __iter__(self):
        while True:
            with self._cond:
                left = None if self._deadline is None else self._deadline - time.monotonic()
                self._cond.wait_for(lambda: self._items or self.cancelled, timeout=left)
                if self.cancelled or not self._items:  # (not items: its time is up)
                    return
                item = self._items.pop(0)
            if item is None:
                return
            yield item


class FakeClient:
    """``status``, ``watch`` and the running tasks of a daemon at ``revision``."""

    def __init__(self):
        self.revision = 10
        self.tasks = [task("t1", 1, ("n1", "n2"))]
        self.streams: list[tuple[int, FakeStream]] = []  # (after_revision, stream)
        self.lists = 0
        self.down = 0  # the next status calls that fail UNAVAILABLE

    def status(self):
        if self.down:
            self.down -= 1
            raise Unavailable("connection refused")
        return status_from_pb(status_pb2.StatusResponse(revision=self.revision))

    def watch(self, after_revision: int = 0, timeout_s: float | None = None):
        stream = FakeStream(timeout_s)
        self.streams.append((after_revision, stream))
        return stream

    def list_running(self):
        self.lists += 1
        return list(self.tasks)


def test_the_watch_lists_once_per_stream_and_reconnects_with_backoff():
    client = FakeClient()
    state = DesiredState()
    waits: list[float] = []
    backoff = Backoff(initial_backoff_s=0.1, max_backoff_s=0.4, jitter=0.0)
    watch = PlacementWatch(client, state, client.list_running, backoff=backoff,
                           wait=waits.append)
    with watch:
        wait_until(lambda: state.synced, "the first list")
        ((after, stream),) = client.streams
        assert after == 10 and client.lists == 1  # the stream from the revision, then the list
        stream.put(11, placed("t1", 2, ("n1",), "SHRINK"))
        stream.put(12, placed("t1", 3, ("n1", "n3")))
        wait_until(lambda: state.revision == 12, "both updates")
        assert view(state) == {"t1": (3, ("n1", "n3"))} and client.lists == 1

        # a gap on the stream (generation 3 -> 5): the stream is closed, the tasks listed again
        client.revision, client.tasks = 14, [task("t1", 5, ("n4",))]
        stream.put(14, placed("t1", 5, ("n4",)))
        wait_until(lambda: len(client.streams) == 2 and state.synced and client.lists == 2,
                   "a new stream and list after the gap")
        assert stream.cancelled and client.streams[1][0] == 14
        assert view(state) == {"t1": (5, ("n4",))}

        # the daemon ends the stream (it stops) and is down for three attempts: not synced
        # meanwhile, the waits back off (0.1, 0.2, 0.4, 0.4), reset once connected again
        client.down = 3
        client.streams[1][1].end()
        wait_until(lambda: len(client.streams) == 3 and state.synced, "the reconnect")
        assert waits[-4:] == [0.1, 0.2, 0.4, 0.4] and client.lists == 3
        client.streams[2][1].end()
        wait_until(lambda: len(client.streams) == 4 and state.synced, "the next reconnect")
        assert waits[-1] == 0.1  # a fresh outage starts from the first wait
    assert client.streams[3][1].cancelled  # closing the watch cancels its stream
    assert watch.connects == 4


def test_the_watch_lists_afresh_every_resync_s_and_stays_synced():
    """Review: while synced, the stream is opened afresh at the daemon's revision and the
    tasks listed again every resync_s (a lost first placement or finish is repaired), with
    no outage: the state never stops being synced, nothing waits."""
    client = FakeClient()
    state = DesiredState()
    waits: list[float] = []
    watch = PlacementWatch(client, state, client.list_running, wait=waits.append,
                           resync_s=0.2)
    unsynced = []

    def watcher():  # any moment the state is not synced after the first list
        version = state.version
        while not stop.is_set():
            version = state.wait(version, 0.05)
            if state.resets and not state.synced:
                unsynced.append(version)

    stop = threading.Event()
    th = threading.Thread(target=watcher, daemon=True)
    with watch:
        wait_until(lambda: state.synced, "the first list")
        th.start()
        client.streams[0][1].put(11, placed("t2", 1, ("n3",), "START"))  # a stream update
        client.revision, client.tasks = 12, [task("t3", 1, ("n4",))]  # (t1's finish lost)
        wait_until(lambda: client.lists >= 3, "two re-lists")
        assert view(state) == {"t3": (1, ("n4",))}  # the list repaired the lost finish
        assert [after for after, _ in client.streams][-1] == 12
        stop.set()
        th.join(DEADLINE_S)
    assert not waits and not unsynced and state.resets >= 3 and watch.connects >= 3


def test_the_watch_lists_afresh_on_a_real_daemon(daemon, caplog):
    """The stream's own time limit (resync_s) ends it quietly on a real daemon: opened
    afresh and listed again, no outage logged, one stream open at a time."""
    srv, client = daemon
    state = DesiredState()
    with PlacementWatch(client, state, lambda: client.list_tasks(states=[RUNNING]),
                        resync_s=0.3) as watch:
        wait_until(lambda: state.resets >= 3, "two re-lists")
        wait_until(lambda: srv.streams.open_streams() == 1, "the old stream's slot back")
        assert state.synced and not watch.refused
    assert "reconnecting" not in caplog.text and watch.connects >= 3


def test_the_state_wakes_waiters_on_changes_only():
    state = DesiredState()
    state.reset([task("t1", 2)])
    version = state.version
    assert state.wait(version, 0.0) == version  # nothing new
    state.apply([placed("t1", 1)])  # old news: no change
    assert state.version == version
    woke = []
    th = threading.Thread(target=lambda: woke.append(state.wait(version, DEADLINE_S)))
    th.start()
    state.apply([placed("t1", 3)])
    th.join(DEADLINE_S)
    assert woke == [version + 1]


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root")
def test_failure_notes_are_read_as_their_owner_while_the_stream_is_open(daemon):
    """A root launcher reads a failed run's note as the job's user while its placement
    stream is open in another thread: the child that switches user must not be made by a
    plain fork() (gRPC's fork handlers, skipped with a call in flight, crashed about one
    such child in three: slurm_plugin/job_failure.py)."""
    from offcut.slurm_plugin.job_failure import read_note
    from offcut.slurm_plugin.node_run import FAILURE_FILE, failure_note
    from offcut.slurm_plugin.owners import Account

    nobody = Account(name="nobody", uid=65534, gid=65534, home="/", switch=True)
    _, client = daemon
    top = Path(tempfile.mkdtemp(prefix="offcut-placements-"))  # (pytest's tmp_path is 0700)
    try:
        top.chmod(0o755)
        note = top / FAILURE_FILE
        note.write_bytes(failure_note("77", 0, 1, ["RuntimeError: boom 42"]))
        os.chown(note, nobody.uid, nobody.gid)
        note.chmod(0o600)
        state = DesiredState()
        with PlacementWatch(client, state, lambda: client.list_tasks(states=[RUNNING])):
            assert state.wait_synced(DEADLINE_S)
            reads = [read_note(note, nobody) for _ in range(40)]
        assert reads == [note.read_bytes()] * 40
    finally:
        shutil.rmtree(top)

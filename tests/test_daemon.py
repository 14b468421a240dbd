"""Tests of the daemon over real gRPC on a unix socket (docs/architecture.md, "Time and events",
"Tasks and the progress model" and "Durability"): task RPCs, input validation, node-event
idempotency and ordering, durability across restarts and ``kill -9``, placement watching, health
checking, reflection, socket permissions, config errors."""

from __future__ import annotations

import math
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from offcut.client import Client
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.v1 import decision_pb2, tasks_pb2
from offcut.views import PlacementUpdate, TaskState

from daemon_helpers import T0, decision_key, make_spec, status_key, wait_until

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

STATES = tasks_pb2


# A deterministic workload: (kind, args). Completion of "a" happens inside an interval.
WORKLOAD = [
    ("submit", dict(spec=make_spec("a", up=2.0, down=3.0, work=2000.0), submit_time=T0,
                    owner="alice", request_id="req-a")),
    ("submit", dict(spec=make_spec("b", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 5.0, 9.0), down=1.0),
                    submit_time=T0 + 1, owner="bob")),
    ("report", dict(time=T0 + 2, source="w", seq=1, idle=["c1n1", "c1n2", "c1n3"])),
    ("report", dict(time=T0 + 20, source="w", seq=2, idle=["c2n1", "c2n2"])),
    ("report", dict(time=T0 + 40, source="w", seq=3, preempted=["c1n1"])),
    ("sync", dict(time=T0 + 60, source="s", seq=1, idle=["c1n2", "c1n3", "c2n1", "c2n2", "c3n1"])),
    ("report", dict(time=T0 + 100, source="w", seq=4, idle=["c3n2"])),
    ("submit", dict(spec=make_spec("c", max_nodes=3, ns=(0, 1, 3), ps=(0.0, 7.0, 15.0)),
                    submit_time=T0 + 120, owner="alice")),
    ("report", dict(time=T0 + 150, source="w", seq=5, preempted=["c2n1", "c3n2"])),
    ("report", dict(time=T0 + 300, source="w", seq=6, idle=["c1n1", "c4n1"])),
]


def run_op(client: Client, op) -> decision_pb2.Decision:
    kind, args = op
    if kind == "submit":
        return client.submit(**args).decision
    if kind == "report":
        return client.report_nodes(**args)
    return client.sync_nodes(**args)


# ----------------------------------------------------------------------------- tasks
def test_submit_get_list_cancel(daemon):
    _, c = daemon
    r1 = c.submit(make_spec("one"), submit_time=T0, owner="alice")
    r2 = c.submit(make_spec("two"), submit_time=T0 + 1, owner="bob")
    r3 = c.submit(make_spec("three"), submit_time=T0 + 2, owner="alice")
    ids = [r.task.task_id for r in (r1, r2, r3)]
    assert len(set(ids)) == 3
    got = c.get_task(ids[1])
    assert got.spec.name == "two" and got.owner == "bob"
    assert got.state == TaskState.ADMITTED
    assert int(got.submit_time) == int(T0 + 1)
    assert [t.task_id for t in c.list_tasks()] == ids
    assert [t.task_id for t in c.list_tasks(owner="alice")] == [ids[0], ids[2]]
    assert c.list_tasks(owner="nobody") == []

    out = c.cancel(ids[0], time=T0 + 3)
    assert out.task.state == TaskState.CANCELLED
    assert int(out.task.finish_time) == int(T0 + 3)
    assert [t.task_id for t in c.list_tasks(states=[TaskState.CANCELLED])] == [ids[0]]
    assert [t.task_id for t in c.list_tasks(states=[TaskState.ADMITTED], owner="alice")] \
        == [ids[2]]
    assert len(c.list_tasks(states=[TaskState.ADMITTED,
                                    TaskState.CANCELLED])) == 3
    st = c.status()
    assert (st.cancelled_tasks, st.admitted_tasks, st.revision) == (1, 2, 4)

    with pytest.raises(NotFound, match="task_id"):
        c.get_task("t424242")
    with pytest.raises(NotFound, match="task_id"):
        c.cancel("t424242", time=T0 + 4)
    with pytest.raises(FailedPrecondition, match="task_id"):
        c.cancel(ids[0], time=T0 + 4)
    assert c.status().revision == 4


def test_cancel_completed_task_is_failed_precondition(daemon):
    _, c = daemon
    # Ps(2) = 18 samples/s on the two idle nodes: 90 samples take 5 s
    tid = c.submit(make_spec("short", work=90.0), submit_time=T0).task.task_id
    c.report_nodes(T0, "w", 1, idle=["n1", "n2"])
    d = c.report_nodes(T0 + 60, "w", 2, idle=["n3"])
    assert list(d.completed_task_ids) == [tid]
    task = c.get_task(tid)
    assert task.state == TaskState.COMPLETED
    assert int(task.finish_time) == int(T0 + 5)
    assert task.work_done_samples == pytest.approx(90.0)
    assert list(task.nodes) == []
    rev = c.status().revision
    with pytest.raises(FailedPrecondition, match="completed"):
        c.cancel(tid, time=T0 + 61)
    assert c.status().revision == rev


@pytest.mark.parametrize("field,kwargs", [
    ("spec.min_nodes", dict(spec=make_spec(min_nodes=-1))),
    ("spec.max_nodes", dict(spec=make_spec(min_nodes=3, max_nodes=2))),
    ("spec.node_counts", dict(spec=make_spec(ns=(0, 2, 2, 4)))),
    ("spec.node_counts", dict(spec=make_spec(ns=(1, 2, 3, 4)))),
    ("spec.throughputs", dict(spec=make_spec(ps=(0.0, math.nan, 18.0, 30.0)))),
    ("spec.throughputs", dict(spec=make_spec(ps=(0.0, 10.0, -1.0, 30.0)))),
    ("spec.total_work_samples", dict(spec=make_spec(work=0.0))),
    ("spec.name", dict(spec=make_spec(name=""))),
    ("spec", dict(spec=None)),
])
def test_bad_submission_is_invalid_argument_and_changes_nothing(daemon, field, kwargs):
    _, c = daemon
    c.submit(make_spec("ok"), submit_time=T0)
    c.report_nodes(T0, "w", 1, idle=["n1"])
    before = status_key(c)
    with pytest.raises(InvalidArgument) as info:
        c.submit(submit_time=T0 + 1, **kwargs)
    assert str(info.value).startswith(f"{field}:")
    assert status_key(c) == before


def test_submit_with_request_id_is_idempotent(daemon):
    _, c = daemon
    first = c.submit(make_spec("x"), submit_time=T0, request_id="r-1")
    again = c.submit(make_spec("x"), submit_time=T0, request_id="r-1")
    assert again.task.task_id == first.task.task_id
    assert again.decision.duplicate and not first.decision.duplicate
    assert again.decision.revision == first.decision.revision
    assert len(c.list_tasks()) == 1
    assert c.status().revision == 1
    other = c.submit(make_spec("x"), submit_time=T0, request_id="r-2")
    assert other.task.task_id != first.task.task_id
    assert len(c.list_tasks()) == 2


# ----------------------------------------------------------------------------- node events
def test_duplicate_event_returns_stored_decision(daemon):
    _, c = daemon
    c.submit(make_spec("j"), submit_time=T0)
    d1 = c.report_nodes(T0 + 1, "w", 1, idle=["n1", "n2"])
    assert not d1.duplicate and len(d1.placements) == 1
    before = status_key(c)
    # same (source, seq), different content: answered from the journal, nothing applied
    d2 = c.report_nodes(T0 + 5, "w", 1, idle=["n3"], preempted=["n1"])
    assert d2.duplicate
    assert decision_key(d2) == decision_key(d1)
    assert status_key(c) == before
    # the next seq still works
    d3 = c.report_nodes(T0 + 6, "w", 2, idle=["n3"])
    assert not d3.duplicate and d3.revision == d1.revision + 1


def test_out_of_order_and_malformed_events(daemon):
    _, c = daemon
    c.report_nodes(T0 + 10, "w", 1, idle=["n1"])
    before = status_key(c)
    with pytest.raises(FailedPrecondition, match="time"):
        c.report_nodes(T0 + 5, "w", 2, idle=["n2"])
    with pytest.raises(FailedPrecondition, match="time"):
        c.sync_nodes(T0 + 5, "other", 1, idle=["n2"])
    with pytest.raises(InvalidArgument, match="idle"):
        c.report_nodes(T0 + 11, "w", 2, idle=["bad name"])
    with pytest.raises(InvalidArgument, match="preempted"):
        c.report_nodes(T0 + 11, "w", 2, preempted=["n1", "n1"])
    with pytest.raises(InvalidArgument, match="idle"):
        c.report_nodes(T0 + 11, "w", 2)
    with pytest.raises(InvalidArgument, match="time"):
        c.report_nodes(0, "w", 2, idle=["n2"])
    with pytest.raises(InvalidArgument, match="source"):
        c.report_nodes(T0 + 11, "", 2, idle=["n2"])
    assert status_key(c) == before
    d = c.report_nodes(T0 + 12, "w", 2, preempted=["ghost"])
    assert list(d.ignored_nodes) == ["ghost"]


# ----------------------------------------------------------------------------- durability
def test_restart_resumes_identically(daemons):
    srv_a, ca = daemons.start("a")
    _, cb = daemons.start("b")  # never restarted
    split = 6
    for op in WORKLOAD[:split]:
        assert decision_key(run_op(ca, op)) == decision_key(run_op(cb, op))
    before = status_key(ca)
    assert before == status_key(cb)
    daemons.stop(srv_a)
    _, ca2 = daemons.start("a")
    assert status_key(ca2) == before
    assert ca2.status().revision == split
    for op in WORKLOAD[split:]:
        da, db = run_op(ca2, op), run_op(cb, op)
        assert decision_key(da) == decision_key(db)
    assert status_key(ca2) == status_key(cb)
    # a repeated event from before the restart is still answered from the journal
    dup = ca2.report_nodes(**WORKLOAD[2][1])
    assert dup.duplicate and dup.revision == 3
    # the workload exercised completion and the admission of later tasks
    final = {t.spec.name: t for t in cb.list_tasks()}
    assert final["a"].state == TaskState.COMPLETED


def _spawn(cfg: DaemonConfig, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "offcut.daemon", "--listen", cfg.listen, "--state", cfg.state,
             "--solver", "dp", "--snapshot-every", "3", "--clock", cfg.clock,
             "--log-level", "warning"],
            stdout=fh, stderr=subprocess.STDOUT)


def test_kill_9_loses_nothing(daemons, tmp_path):
    cfg = daemons.config("crash")
    log = tmp_path / "daemon.log"
    proc = _spawn(cfg, log)
    try:
        c = Client(cfg.listen, timeout_s=10)
        c.wait_ready(30)
        acked = 7
        for op in WORKLOAD[:acked]:
            run_op(c, op)
        c.close()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc = _spawn(cfg, log)
        c = Client(cfg.listen, timeout_s=10)
        c.wait_ready(30)
        st = c.status()
        assert st.revision == acked
        assert dict(st.last_seq) == {"w": 4, "s": 1}
        rest = [run_op(c, op) for op in WORKLOAD[acked:]]
        crashed_final = status_key(c)
        c.close()
    finally:
        proc.kill()
        proc.wait(10)
    _, ref = daemons.start("ref")
    ref_decisions = [run_op(ref, op) for op in WORKLOAD]
    assert [decision_key(d) for d in rest] == [decision_key(d) for d in ref_decisions[acked:]]
    assert crashed_final == status_key(ref)


# ----------------------------------------------------------------------------- watching
def _collect(call, out: queue.Queue) -> None:
    try:
        for update in call:
            out.put(update)
        out.put("ended")
    except Exception as err:  # noqa: BLE001 - handed to the test thread
        out.put(err)


def test_watch_streams_live_updates_and_replays(daemon):
    srv, c = daemon
    tid = c.submit(make_spec("w"), submit_time=T0).task.task_id
    rev = c.status().revision
    call = c.watch(after_revision=rev)
    got: queue.Queue = queue.Queue()
    th = threading.Thread(target=_collect, args=(call, got), daemon=True)
    th.start()
    try:
        # the event comes once the stream is open: the update reaches it live
        wait_until(lambda: srv.streams.open_streams() == 1, "the watch stream to open", 10)
        d = c.report_nodes(T0 + 1, "w", 1, idle=["n1", "n2"])
        update = got.get(timeout=5)
        assert isinstance(update, PlacementUpdate), update
        assert update.revision == d.revision == rev + 1
        assert update.cause == "nodes"
        [p] = update.placements
        assert p.task_id == tid and p.change == "start"
        assert list(p.nodes) == ["n1", "n2"]
    finally:
        call.cancel()
        th.join(5)
    assert not th.is_alive()
    assert got.get(timeout=1) == "ended"  # cancel() ends the iteration without an error

    c.report_nodes(T0 + 2, "w", 2, idle=["n3"])           # grow: revision 3
    c.report_nodes(T0 + 3, "w", 3, idle=["n3"])           # already idle: no placement
    c.report_nodes(T0 + 4, "w", 4, preempted=["n1"])      # preempted (then regrow): revision 5
    expected = [2, 3, 5]
    call = c.watch(after_revision=1)
    got = queue.Queue()
    th = threading.Thread(target=_collect, args=(call, got), daemon=True)
    th.start()
    try:
        revs = [got.get(timeout=5).revision for _ in expected]
        assert revs == expected
        # nothing more after revision 5: the next update the stream carries is the next
        # placement change (revision 6), which comes after anything sent before it
        assert got.empty()
        c.report_nodes(T0 + 5, "w", 5, preempted=["n3"])    # revision 6
        assert got.get(timeout=5).revision == 6
        assert got.empty()
    finally:
        call.cancel()
        th.join(5)
    with pytest.raises(NotFound, match="t999999"):
        next(iter(c.watch(task_id="t999999")))


# ----------------------------------------------------------------------------- plumbing
def test_health_reflection_and_socket_mode(daemon):
    srv, c = daemon
    health = health_pb2_grpc.HealthStub(c.channel)
    for service in ("", "offcut.v1.Tasks", "offcut.v1.NodeEvents", "offcut.v1.Status"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(c.channel)
    [resp] = list(refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    names = {s.name for s in resp.list_services_response.service}
    assert {"offcut.v1.Tasks", "offcut.v1.NodeEvents", "offcut.v1.Status"} <= names
    sock = Path(srv.config.listen[len("unix://"):])
    mode = os.stat(sock).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


@pytest.mark.parametrize("body,key", [
    ("bogus_key = 1\n", "bogus_key"),
    ("tfwd_s = -5\n", "tfwd_s"),
    ('solver = "magic"\n', "solver"),
])
def test_bad_config_exits_with_one_line(tmp_path, body, key):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    res = subprocess.run(
        [sys.executable, "-m", "offcut.daemon", "--config", str(cfg),
         "--listen", f"unix://{tmp_path}/x.sock", "--state", str(tmp_path / "x.sqlite")],
        capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert key in lines[0]
    assert not (tmp_path / "x.sqlite").exists()


def test_tcp_loopback_listener(tmp_path):
    """``listen = HOST:PORT`` serves the same protocol over TCP (port 0 = any free port)."""
    cfg = DaemonConfig(listen="127.0.0.1:0", state=str(tmp_path / "tcp.sqlite"), solver="dp",
                       insecure_local=True)
    srv = OffcutServer(cfg)
    srv.start()
    try:
        assert srv.port > 0
        with Client(f"127.0.0.1:{srv.port}", timeout_s=10) as client:
            client.wait_ready(10)
            client.submit(make_spec(), submit_time=T0)
            d = client.report_nodes(T0 + 1, "tcp", 1, idle=["c01n01", "c01n02"])
            assert [p.task_id for p in d.placements] == ["t000001"]
            assert list(d.placements[0].nodes) == ["c01n01", "c01n02"]
    finally:
        srv.stop(0.2)


def test_a_watch_ends_quietly_when_its_time_is_over(daemon):
    """The user guide's example (docs/user-guide.md, "From Python") iterates
    ``c.watch(task_id, timeout_s=60)``: when the time is over the loop ends, no traceback; an
    unknown task still raises."""
    _, c = daemon
    t0 = time.monotonic()
    assert list(c.watch(timeout_s=0.5)) == []
    assert time.monotonic() - t0 >= 0.4
    with pytest.raises(NotFound):
        list(c.watch(task_id="t999999", timeout_s=0.5))


def test_a_retried_cancel_is_told_from_a_second_one(daemons):
    """CancelTask with a request_id: a repeat gets the stored reply (the retry of a cancel
    whose answer was lost), also after a restart; another id is a second cancel and finds the
    task already cancelled."""
    srv, c = daemons.start()
    c.report_nodes(time.time(), "test", 1, idle=["n1", "n2"])
    tid = c.submit(make_spec("x")).task.task_id
    first = c.cancel(tid, request_id="cancel-1")
    assert first.task.state == TaskState.CANCELLED
    again = c.cancel(tid, request_id="cancel-1")
    assert again.decision.duplicate and again.task.task_id == tid
    with pytest.raises(FailedPrecondition, match="already cancelled"):
        c.cancel(tid, request_id="cancel-2")
    with pytest.raises(InvalidArgument, match="request_id"):
        c.cancel(tid, request_id="x" * 201)
    revision = c.status().revision
    daemons.stop(srv)
    _, c = daemons.start()
    assert c.cancel(tid, request_id="cancel-1").decision.duplicate
    assert c.status().revision == revision

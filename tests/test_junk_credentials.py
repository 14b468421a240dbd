"""Junk credentials (docs/security.md, "Round two: junk credentials"; issue 37, finding 10): a
call that proves nobody is answered after ``refusal_delay_s`` (at most 1024 held at once), and
Slurm's node events may take a socket, an event loop and MUNGE decoding threads of their own
(``node_listen``), so that nothing users send to ``listen`` holds them. Real daemons, real gRPC
over real unix sockets; the MUNGE cases on the test cluster's real munged."""

from __future__ import annotations

import os
import stat
import threading
import time

import grpc
import pytest

from offcut.client import Client
from offcut.daemon.edge.auth import RefusalDelay, add_token
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.event_loop import shared_loop
from offcut.daemon.edge.server import OffcutServer
from offcut.errors import Unavailable
from offcut.v1 import nodes_pb2, nodes_pb2_grpc, tasks_pb2, tasks_pb2_grpc

ALL = ["n1", "n2", "n3", "n4"]


def snapshot(seq: int, idle: list[str]) -> nodes_pb2.NodeSnapshot:
    request = nodes_pb2.NodeSnapshot(source="slurm-watch", seq=seq, idle=idle)
    request.time.FromNanoseconds(time.time_ns())
    return request


@pytest.fixture
def node_daemon(daemons, tmp_path):
    """A daemon with tokens (a slurm and a user token) and ``node_listen``."""
    path = tmp_path / "tokens.toml"
    made = {"slurm": add_token(path, "slurm", "slurm"), "alice": add_token(path, "alice", "user")}
    node = tmp_path / "node" / "node.sock"
    srv, _ = daemons.start("nd", tokens_file=str(path), node_listen=f"unix://{node}")
    return srv, made


def test_the_node_socket_is_0600_and_serves_node_events_only(node_daemon):
    srv, made = node_daemon
    assert srv.node_side is not None
    path = srv.node_side.socket_path
    assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) == 0o600
    slurm = [("authorization", f"Bearer {made['slurm']}")]
    with grpc.insecure_channel(srv.node_side.address) as channel:
        decision = nodes_pb2_grpc.NodeEventsStub(channel).SyncNodes(snapshot(1, ALL),
                                                                    metadata=slurm, timeout=10)
        assert decision.seq == 1 and decision.revision >= 1
        with pytest.raises(grpc.RpcError) as other:  # only NodeEvents lives there
            tasks_pb2_grpc.TasksStub(channel).ListTasks(tasks_pb2.ListTasksRequest(),
                                                        metadata=slurm, timeout=10)
        assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as user:  # roles hold as on listen
            nodes_pb2_grpc.NodeEventsStub(channel).SyncNodes(
                snapshot(2, []), metadata=[("authorization", f"Bearer {made['alice']}")],
                timeout=10)
        assert user.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as nobody:
            nodes_pb2_grpc.NodeEventsStub(channel).SyncNodes(snapshot(3, []), timeout=10)
        assert nobody.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # the event reached the one engine: listen's callers see the idle pool it made
    with Client(srv.address, timeout_s=10, token=made["slurm"]) as client:
        assert client.status().idle_nodes == len(ALL)


def test_a_node_event_is_answered_while_listen_s_event_loop_is_blocked(node_daemon):
    """The node side shares no event loop with ``listen``: with listen's loop held (as a flood
    of junk calls holds it), a node event on the node socket is still applied and answered."""
    srv, made = node_daemon
    slurm = [("authorization", f"Bearer {made['slurm']}")]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # runs on listen's loop thread and keeps it
        held.set()
        release.wait(60)

    shared_loop().call_soon(hold)
    try:
        assert held.wait(10)
        with grpc.insecure_channel(srv.address) as channel:  # listen answers nothing now
            with pytest.raises(grpc.RpcError) as stuck:
                nodes_pb2_grpc.NodeEventsStub(channel).SyncNodes(snapshot(1, ALL),
                                                                 metadata=slurm, timeout=1)
            assert stuck.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with grpc.insecure_channel(srv.node_side.address) as channel:
            decision = nodes_pb2_grpc.NodeEventsStub(channel).SyncNodes(
                snapshot(2, ALL), metadata=slurm, timeout=20)
        assert not decision.duplicate
    finally:
        release.set()
    with Client(srv.address, timeout_s=10, token=made["slurm"]) as client:
        assert client.status().idle_nodes == len(ALL)


def test_stop_removes_the_node_socket_and_a_second_daemon_cannot_take_it(daemons, tmp_path):
    node = tmp_path / "node" / "node.sock"
    srv, _ = daemons.start("one", node_listen=f"unix://{node}")
    assert node.exists()
    with pytest.raises(RuntimeError, match="cannot listen on node_listen"):
        OffcutServer(daemons.config("two", node_listen=f"unix://{node}"))
    assert node.exists() and not (tmp_path / "two" / "s.sock").exists()  # nothing left behind
    daemons.stop(srv)
    assert not node.exists()


def test_node_listen_must_be_a_unix_socket_of_its_own(tmp_path):
    with pytest.raises(ValueError, match="node_listen 127.0.0.1:5000 must be a unix socket"):
        DaemonConfig(listen=f"unix://{tmp_path}/a.sock", node_listen="127.0.0.1:5000")
    with pytest.raises(ValueError, match="is listen's socket"):
        DaemonConfig(listen=f"unix://{tmp_path}/a.sock", node_listen=f"{tmp_path}/a.sock")
    assert DaemonConfig(listen=f"unix://{tmp_path}/a.sock",
                        node_listen=f"{tmp_path}/n.sock").node_listen == f"unix://{tmp_path}/n.sock"


def test_munge_credentials_on_the_node_side_are_decoded_by_threads_of_its_own(
        slurm_cluster, daemons, tmp_path):
    """With every decoding thread of listen's MUNGE identity held, a node event with a real
    credential (root's: admin) is still decoded and applied on the node side."""
    from offcut import munge

    sock = str(slurm_cluster.dir / "munge" / "munge.socket.2")
    node = tmp_path / "node" / "node.sock"
    srv, _ = daemons.start("mg", munge=True, munge_socket=sock, node_listen=f"unix://{node}")
    public = srv.auth.munge
    assert srv.node_side.auth.munge is not public
    held, release = threading.Semaphore(0), threading.Event()
    original = public.principal

    def blocked(credential, method):
        held.release()
        release.wait(60)
        return original(credential, method)

    public.principal = blocked
    method = "/offcut.v1.NodeEvents/SyncNodes"
    try:
        with grpc.insecure_channel(srv.address) as channel:  # fill listen's decoding threads
            stub = nodes_pb2_grpc.NodeEventsStub(channel)
            waiting = [stub.SyncNodes.future(snapshot(1, []), timeout=60, metadata=[(
                "authorization", "MUNGE " + munge.encode(munge.call_payload(method),
                                                         socket=sock))])
                for _ in range(8)]
            deadline = time.monotonic() + 20
            taken = 0
            while taken < 4 and time.monotonic() < deadline:
                taken += held.acquire(timeout=0.2)
            assert taken == 4, "listen's decoding threads were not all held"
            with grpc.insecure_channel(srv.node_side.address) as node_channel:
                decision = nodes_pb2_grpc.NodeEventsStub(node_channel).SyncNodes(
                    snapshot(2, ALL), timeout=20, metadata=[(
                        "authorization", "MUNGE " + munge.encode(munge.call_payload(method),
                                                                 socket=sock))])
            assert not decision.duplicate
            release.set()
            for fut in waiting:
                try:
                    fut.result()
                except grpc.RpcError:
                    pass  # (stale sequence numbers after seq 2: refused, which is fine)
    finally:
        release.set()
        public.principal = original
    client = Client(srv.address, timeout_s=10, munge_socket=sock)
    try:
        assert client.status().idle_nodes == len(ALL)
    except Unavailable:
        pytest.fail("listen does not answer after the decoding threads were released")
    finally:
        client.close()
    assert os.path.exists(node)


def test_a_call_that_proves_nobody_is_answered_after_the_refusal_delay(daemons, tmp_path):
    path = tmp_path / "tokens.toml"
    good = add_token(path, "alice", "user")
    srv, _ = daemons.start("delay", tokens_file=str(path), refusal_delay_s=0.5)
    with grpc.insecure_channel(srv.address) as channel:
        stub = tasks_pb2_grpc.TasksStub(channel)
        stub.ListTasks(tasks_pb2.ListTasksRequest(), timeout=10,
                       metadata=[("authorization", f"Bearer {good}")])  # (connected)
        for metadata in ([("authorization", "Bearer not-a-token")], []):
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListTasks(tasks_pb2.ListTasksRequest(), metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert time.monotonic() - t0 >= 0.45  # never before the delay (a lower bound)


def test_the_refusal_delay_holds_a_bounded_number_of_answers():
    import asyncio

    async def run() -> tuple[list[int], int]:
        delay = RefusalDelay(30.0, max_waiting=2)
        held = [asyncio.ensure_future(delay.hold()) for _ in range(2)]
        await asyncio.sleep(0)  # both started: they wait
        assert delay.waiting == 2 and not any(h.done() for h in held)
        await asyncio.wait_for(delay.hold(), 10)  # a third: answered at once (past the bound)
        for h in held:
            h.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        return [h.cancelled() for h in held], delay.waiting

    cancelled, waiting = asyncio.run(run())
    assert cancelled == [True, True] and waiting == 0  # a cancelled hold gives its place back
    assert RefusalDelay(0.0).delay_s == 0.0


def test_junk_munge_credentials_are_answered_after_the_delay(slurm_cluster, daemons):
    """A credential in MUNGE's armour made of random bytes: munged refuses it, and the
    refusal waits the delay."""
    import base64

    sock = str(slurm_cluster.dir / "munge" / "munge.socket.2")
    srv, _ = daemons.start("mj", munge=True, munge_socket=sock, refusal_delay_s=0.5)
    junk = "MUNGE:" + base64.b64encode(os.urandom(120)).decode() + ":"
    with grpc.insecure_channel(srv.address) as channel:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            tasks_pb2_grpc.TasksStub(channel).ListTasks(
                tasks_pb2.ListTasksRequest(), metadata=[("authorization", f"MUNGE {junk}")],
                timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "MUNGE" in refused.value.details()
    assert time.monotonic() - t0 >= 0.45

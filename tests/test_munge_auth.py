"""Users identified by MUNGE, as Slurm identifies them (docs/security.md, "Threat model").

Everything here is real: the munged of the 4-node test cluster (tests/slurm_cluster.py),
real local users made with ``useradd``, a real daemon with ``munge = true`` on a unix socket
that every user may open, the real ``offcut`` CLI run as those users, and the real
PrologSlurmctld hook with no token on disk. A credential is made in a process of the user it
is to prove (``subprocess`` with ``user=``), exactly as a user's client makes it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import grpc
import pytest

from daemon_helpers import make_spec
from slurm_cluster import idle_set, made_local_user

from offcut import munge
from offcut.client import Client
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.v1 import nodes_pb2, nodes_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from offcut.views import TaskState

LIST = "/offcut.v1.Tasks/ListTasks"
CANCEL = "/offcut.v1.Tasks/CancelTask"
REPORT_NODES = "/offcut.v1.NodeEvents/ReportNodes"


def socket_of(cluster) -> str:
    return str(cluster.dir / "munge" / "munge.socket.2")


def credential_as(user, payload: bytes, socket: str) -> str:
    """A credential made by a process of ``user`` (a ``pwd`` entry, or a bare uid without an
    account) carrying ``payload``, with MUNGE's own ``munge`` command."""
    uid, gid = (user, user) if isinstance(user, int) else (user.pw_uid, user.pw_gid)
    proc = subprocess.run(["munge", "--socket", socket, "--string", payload.decode()],
                          user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                          cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _reachable(path: str) -> bool:
    """Whether any user may run ``path`` (it and every folder above it o+x)."""
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [real, *real.parents])


def user_python() -> list[str]:
    """An interpreter other users may run with this environment's packages: this one, or the
    system's of the same version (this one may live in root's home) given this environment's
    site-packages."""
    if _reachable(sys.executable):
        return [sys.executable]
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(system) or not _reachable(system):
        pytest.skip(f"no interpreter other users may run: {sys.executable} is not, and "
                    f"{system} is missing")
    site_dir = sysconfig.get_paths()["purelib"]
    return [system, "-c", f"import runpy, site, sys; site.addsitedir({site_dir!r}); "
                          "sys.argv[0] = 'offcut'; runpy.run_module('offcut.client.cli', "
                          "run_name='__main__')"]


def offcut_as(user, socket: str, address: str, *argv: str, cluster=None,
              node: str = "") -> subprocess.CompletedProcess:
    """The ``offcut`` CLI run as ``user`` with no token anywhere (MUNGE only); with ``node``,
    as a job step of ``user`` on that node of ``cluster`` (``srun -w NODE``)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "USER": user.pw_name,
           "OFFCUT_MUNGE_SOCKET": socket, "OFFCUT_ADDRESS": address}
    python = user_python()
    command = python + (["-m", "offcut.client.cli"] if len(python) == 1 else []) + list(argv)
    if node:
        env["SLURM_CONF"] = str(cluster.conf)
        command = ["srun", "--quiet", "-N", "1", "-w", node, "--export=ALL", *command]
    return subprocess.run(command, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                          env=env, cwd=user.pw_dir, capture_output=True, text=True, timeout=120)


def raw_call(address: str, method: str, request, metadata):
    """One call with exactly ``metadata`` (no client of ours adding anything)."""
    with grpc.insecure_channel(address) as channel:
        stubs = {LIST: tasks_pb2_grpc.TasksStub(channel).ListTasks,
                 CANCEL: tasks_pb2_grpc.TasksStub(channel).CancelTask,
                 REPORT_NODES: nodes_pb2_grpc.NodeEventsStub(channel).ReportNodes}
        return stubs[method](request, metadata=metadata, timeout=30)


@pytest.fixture
def users(slurm_cluster):
    """Two ordinary local users, a third in the group ``admin_groups`` names, and a fourth to
    be ``slurm_user``."""
    group = "ocadmins"
    subprocess.run(["groupadd", "-f", group], check=True)
    try:
        with made_local_user(slurm_cluster) as alice, made_local_user(slurm_cluster) as bob, \
                made_local_user(slurm_cluster, groups=[group]) as carol, \
                made_local_user(slurm_cluster) as dave:
            yield alice, bob, carol, dave
    finally:
        subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture
def munge_daemon(slurm_cluster, users, tmp_path):
    """A daemon with ``munge = true`` on a socket in a folder every user can pass through;
    ``slurm_user`` is dave (so his credentials carry the slurm role), ``admin_groups`` holds
    carol's group."""
    folder = Path(slurm_cluster.root) / f"munge-daemon-{os.getpid()}"
    folder.mkdir(mode=0o755)
    cfg = DaemonConfig(listen=f"unix://{folder}/offcutd.sock", state=str(tmp_path / "s.sqlite"),
                       solver="dp", munge=True, munge_socket=socket_of(slurm_cluster),
                       slurm_user=users[3].pw_name, admin_groups=["ocadmins"])
    srv = OffcutServer(cfg)
    srv.start()
    try:
        yield srv, cfg.listen
    finally:
        srv.stop(0.2)
        folder.rmdir()


def test_libmunge_round_trip_replay_and_refusals(slurm_cluster):
    socket = socket_of(slurm_cluster)
    cred = munge.encode(munge.call_payload(LIST), socket=socket)
    assert munge.decode(cred, socket=socket) == (os.getuid(), os.getgid(),
                                                 b"offcut:" + LIST.encode())
    with pytest.raises(munge.MungeError) as replayed:
        munge.decode(cred, socket=socket)
    assert replayed.value.code == munge.REPLAYED
    with pytest.raises(munge.MungeError) as forged:
        munge.decode(cred[:-12] + "AAAAAAAAAAA:", socket=socket)
    assert forged.value.code in (munge.CRED_INVALID, munge.BAD_CRED)
    restricted = munge.encode(b"", socket=socket, decoder_uid=os.getuid() + 4242)
    with pytest.raises(munge.MungeError) as other_decoder:
        munge.decode(restricted, socket=socket)
    assert other_decoder.value.code == munge.UNAUTHORIZED
    with pytest.raises(munge.MungeError) as too_long:
        munge.decode("MUNGE:" + "A" * munge.MAX_CREDENTIAL_CHARS, socket=socket)
    assert too_long.value.code == munge.BAD_CRED
    with pytest.raises(munge.MungeError) as down:
        munge.encode(b"", socket=str(slurm_cluster.root / "no-munged.socket"))
    assert down.value.code == munge.SOCKET and "no-munged.socket" in str(down.value)


def test_a_daemon_with_munge_refuses_to_start_when_munged_does_not_answer(tmp_path):
    cfg = DaemonConfig(listen=f"unix://{tmp_path}/s.sock", state=str(tmp_path / "s.sqlite"),
                       solver="dp", munge=True, munge_socket=str(tmp_path / "nothing.socket"))
    with pytest.raises(RuntimeError, match="munge_socket: munged at .*nothing.socket"):
        OffcutServer(cfg)
    assert not (tmp_path / "s.sqlite").exists() or not (tmp_path / "s.sock").exists()


def test_local_users_submit_list_and_cancel_only_their_own_tasks(slurm, users, munge_daemon):
    alice, bob, _, _ = users
    srv, address = munge_daemon
    slurm_cluster = slurm
    socket = socket_of(slurm_cluster)
    assert stat.S_IMODE(os.stat(srv.socket_path).st_mode) == 0o666
    for user in (alice, bob):
        assert not (Path(user.pw_dir) / ".config" / "offcut").exists()  # no token anywhere
    curve = Path(alice.pw_dir) / "curve.csv"
    curve.write_text("nodes,throughput\n1,100\n2,190\n")
    os.chown(curve, alice.pw_uid, alice.pw_gid)
    proc = offcut_as(alice, socket, address, "submit", "--parsable", "-J", "mine", "-N", "1-2",
                     "--work", "1e6", "--scalability", str(curve))
    assert proc.returncode == 0, proc.stderr
    task = proc.stdout.strip()
    with Client(address, timeout_s=10, munge_socket=socket) as root:  # root: admin
        assert root.get_task(task).owner == alice.pw_name
    listed = offcut_as(alice, socket, address, "queue", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [t["task_id"] for t in json.loads(listed.stdout)] == [task]
    from_n3 = offcut_as(alice, socket, address, "queue", "--json", cluster=slurm_cluster,
                        node="n3")  # a job step of hers on another node of the cluster
    assert from_n3.returncode == 0, from_n3.stderr
    assert [t["task_id"] for t in json.loads(from_n3.stdout)] == [task]
    others = offcut_as(bob, socket, address, "queue", "--json")
    assert others.returncode == 0, others.stderr
    assert json.loads(others.stdout) == []
    refused = offcut_as(bob, socket, address, "cancel", task)
    assert refused.returncode != 0 and f"no task {task!r}" in refused.stderr
    cancelled = offcut_as(alice, socket, address, "cancel", task)
    assert cancelled.returncode == 0, cancelled.stderr
    with Client(address, timeout_s=10, munge_socket=socket) as root:
        assert root.get_task(task).state == TaskState.CANCELLED


def test_replayed_foreign_and_unknown_credentials_are_refused(slurm_cluster, users,
                                                              munge_daemon):
    alice, bob, carol, dave = users
    _, address = munge_daemon
    socket = socket_of(slurm_cluster)

    def refused(method, request, metadata) -> str:
        with pytest.raises(grpc.RpcError) as err:
            raw_call(address, method, request, metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        return err.value.details()

    cred = credential_as(alice, munge.call_payload(LIST), socket)
    first = raw_call(address, LIST, tasks_pb2.ListTasksRequest(),
                     [("authorization", f"MUNGE {cred}")])
    assert list(first.tasks) == []
    assert "replayed" in refused(LIST, tasks_pb2.ListTasksRequest(),
                                 [("authorization", f"MUNGE {cred}")])
    for_list = credential_as(alice, munge.call_payload(LIST), socket)
    assert "another call" in refused(CANCEL, tasks_pb2.CancelTaskRequest(task_id="x"),
                                     [("authorization", f"MUNGE {for_list}")])
    nobody = 54321
    assert nobody not in {u.pw_uid for u in (alice, bob, carol, dave)}
    stranger = credential_as(nobody, munge.call_payload(LIST), socket)
    assert f"uid {nobody} has no account" in refused(
        LIST, tasks_pb2.ListTasksRequest(), [("authorization", f"MUNGE {stranger}")])
    assert "MUNGE credential" in refused(LIST, tasks_pb2.ListTasksRequest(), [])
    assert "not a MUNGE credential" in refused(LIST, tasks_pb2.ListTasksRequest(),
                                               [("authorization", "MUNGE not-a-credential")])


def test_roles_come_from_the_uid_slurm_user_and_admin_groups(slurm_cluster, users,
                                                             munge_daemon):
    alice, _, carol, dave = users
    srv, address = munge_daemon
    socket = socket_of(slurm_cluster)
    event = nodes_pb2.NodeEvent(source="munge-test", seq=1, idle=["n1"])
    event.time.GetCurrentTime()
    with pytest.raises(grpc.RpcError) as err:  # an ordinary user may not report nodes
        raw_call(address, REPORT_NODES, event,
                 [("authorization", f"MUNGE {credential_as(alice, munge.call_payload(REPORT_NODES), socket)}")])
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # dave is slurm_user: the slurm role, which reports nodes
    reply = raw_call(address, REPORT_NODES, event,
                     [("authorization", f"MUNGE {credential_as(dave, munge.call_payload(REPORT_NODES), socket)}")])
    assert reply.stats.idle_nodes == 1
    # carol is in an admin group: she sees every task; alice sees only hers
    with Client(address, timeout_s=10, munge_socket=socket) as root:
        root.submit(make_spec("root-task"))
    seen = raw_call(address, LIST, tasks_pb2.ListTasksRequest(),
                    [("authorization", f"MUNGE {credential_as(carol, munge.call_payload(LIST), socket)}")])
    assert [t.spec.name for t in seen.tasks] == ["root-task"]
    own = raw_call(address, LIST, tasks_pb2.ListTasksRequest(),
                   [("authorization", f"MUNGE {credential_as(alice, munge.call_payload(LIST), socket)}")])
    assert list(own.tasks) == []


def test_the_prolog_hook_reports_with_no_token_on_disk(slurm, tmp_path):
    """slurmctld runs the hooks as SlurmUser (root on the test cluster: the admin role); their
    MUNGE credential alone identifies them."""
    cfg = DaemonConfig(listen=slurm.address, state=str(tmp_path / "state.sqlite"), solver="dp",
                       munge=True, munge_socket=socket_of(slurm))
    srv = OffcutServer(cfg)
    srv.start()
    try:
        slurm.install_hooks(munge_socket=socket_of(slurm), token_file=None)
        with Client(slurm.address, timeout_s=10, munge_socket=socket_of(slurm)) as client:
            client.sync_nodes(time.time(), "munge-test", 1, slurm.nodes)
            job = slurm.sbatch("-N", "1", "-w", "n2", wrap="sleep 30")
            slurm.wait_for(lambda: "n2" not in idle_set(client), timeout=30,
                           what="the prolog to report n2 busy")
        assert not any("UNAUTHENTICATED" in line or "PERMISSION_DENIED" in line
                       for line in slurm.hook_lines("prolog", job))
    finally:
        srv.stop(0.2)

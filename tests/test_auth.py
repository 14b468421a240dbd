"""Authentication, roles and TLS (docs/architecture.md, "Security") on real daemons: bearer tokens
from a private tokens file, users limited to their own tasks, admins to everything, refusals that
leak nothing, TLS with a self-signed certificate made here, tokens never logged."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from offcut.client import Client
from offcut.client.cli import app
from offcut.daemon.edge.auth import add_token, load_tokens, TokensFileError
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.errors import (InvalidArgument, NotFound, PermissionDenied, Unauthenticated,
                           Unavailable)
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from daemon_helpers import make_spec, status_key, zeus_spec

ALL = ["n1", "n2", "n3", "n4"]


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.toml"
    made = {"admin": add_token(path, "root-ops", "admin"), "alice": add_token(path, "alice", "user"),
            "bob": add_token(path, "bob", "user")}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    return path, made


@pytest.fixture
def secured(daemons, tokens):
    path, made = tokens
    srv, _ = daemons.start("sec", tokens_file=str(path))
    clients = {who: Client(srv.address, timeout_s=10, token=tok) for who, tok in made.items()}
    clients["anonymous"] = Client(srv.address, timeout_s=10)
    clients["admin"].sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)
    yield srv, clients, made
    for c in clients.values():
        c.close()


def test_tokens_file_must_be_private_and_well_formed(tmp_path, daemons, tokens):
    path, _ = tokens
    path.chmod(0o644)
    with pytest.raises(RuntimeError, match="tokens_file: .*chmod 600"):
        OffcutServer(daemons.config("x", tokens_file=str(path)))
    assert not (tmp_path / "x" / "state.sqlite").exists()  # refused before anything was opened
    path.chmod(0o600)
    assert {p.user for p in load_tokens(path).values()} == {"root-ops", "alice", "bob"}
    bad = tmp_path / "bad.toml"
    for body, needle in (('[[tokens]]\nuser = "a"\nrole = "king"\nsha256 = "' + "0" * 64 + '"\n', "role"),
                         ('[[tokens]]\nuser = "a"\nrole = "user"\nsha256 = "xyz"\n', "sha256"),
                         ("tokens = 3\n", "array")):
        bad.write_text(body)
        bad.chmod(0o600)
        with pytest.raises(TokensFileError, match=needle):
            load_tokens(bad)


def test_unauthenticated_calls_are_refused_and_leak_nothing(secured, caplog):
    srv, c, made = secured
    caplog.set_level(logging.DEBUG)
    anonymous = c["anonymous"]
    with pytest.raises(Unauthenticated, match="bearer token"):
        anonymous.list_tasks()
    with pytest.raises(Unauthenticated):
        anonymous.report_nodes(time.time(), "x", 1, idle=["n9"])
    with Client(srv.address, timeout_s=5, token="not-a-token-" + made["alice"][:8]) as wrong:
        with pytest.raises(Unauthenticated) as info:
            wrong.status()
        assert made["alice"][:8] not in str(info.value)
    # health checking stays open (load balancers, systemd)
    health = health_pb2_grpc.HealthStub(anonymous.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert all(tok not in caplog.text for tok in made.values())
    assert c["admin"].status().idle_nodes == 4  # nothing changed


def test_users_see_and_act_on_their_own_tasks_only(secured):
    srv, c, _ = secured
    alice, bob, admin = c["alice"], c["bob"], c["admin"]
    ta = alice.submit(make_spec("a", work=1e9)).task
    assert ta.owner == "alice"
    with pytest.raises(PermissionDenied, match="owner"):
        alice.submit(make_spec("x"), owner="bob")
    tb = bob.submit(make_spec("b", work=1e9)).task
    assert [t.task_id for t in alice.list_tasks()] == [ta.task_id]
    assert [t.task_id for t in bob.list_tasks()] == [tb.task_id]
    assert {t.task_id for t in admin.list_tasks()} == {ta.task_id, tb.task_id}
    with pytest.raises(PermissionDenied, match="owner"):
        alice.list_tasks(owner="bob")
    # another user's task looks exactly like an unknown one
    with pytest.raises(NotFound) as other:
        alice.get_task(tb.task_id)
    with pytest.raises(NotFound) as unknown:
        alice.get_task("t999999")
    assert str(other.value).replace(tb.task_id, "ID") == str(unknown.value).replace("t999999", "ID")
    key = status_key(admin)
    with pytest.raises(NotFound):
        alice.cancel(tb.task_id)
    with pytest.raises(NotFound):
        next(iter(alice.watch(tb.task_id, timeout_s=2)))
    assert status_key(admin) == key
    # admin-only calls
    for call in (lambda: alice.report_nodes(time.time(), "x", 1, idle=["n9"]),
                 lambda: alice.sync_nodes(time.time(), "x", 1, idle=[]),
                 lambda: alice.report_task_run(ta.task_id, "started"),
                 lambda: next(iter(alice.export_history()))):
        with pytest.raises(PermissionDenied, match="admin role"):
            call()
    assert status_key(admin) == key
    # a user's status is aggregate only
    st = alice.status(include_idle_nodes=True)
    assert st.idle_nodes == 4 and not st.idle_node_names and st.last_decision is None
    assert not st.last_seq
    assert admin.status(include_idle_nodes=True).idle_node_names
    # decisions shown to a user carry only their own placements
    rev = admin.status().revision
    stream = alice.watch(after_revision=0, timeout_s=2)
    seen = []
    try:
        for update in stream:
            seen.extend(p.task_id for p in update.placements)
    except Exception:  # noqa: BLE001 - the deadline ends the stream
        pass
    assert seen and set(seen) == {ta.task_id}
    r = alice.cancel(ta.task_id)
    assert {p.task_id for p in r.decision.placements} <= {ta.task_id}
    assert admin.status().revision == rev + 1
    assert admin.get_task(tb.task_id).state == TaskState.RUNNING


def test_each_call_hashes_its_token_once(secured, monkeypatch):
    # the interceptor resolves the caller; the handler reuses it (no second SHA-256 per call)
    from offcut.daemon.edge import auth

    _, c, _ = secured
    hashed = []
    real = auth.token_digest
    monkeypatch.setattr(auth, "token_digest", lambda token: hashed.append(1) or real(token))
    alice = c["alice"]
    ta = alice.submit(make_spec("a", work=1e9)).task
    assert len(hashed) == 1
    alice.get_task(ta.task_id)
    alice.list_tasks()
    alice.status()
    assert len(hashed) == 4
    assert ta.task_id in {p.task_id for p in next(iter(alice.watch(timeout_s=2))).placements}
    assert len(hashed) == 5


def test_cli_with_token_and_token_command(secured, tmp_path, monkeypatch):
    srv, c, made = secured
    runner = CliRunner()
    path = tmp_path / "new-tokens.toml"
    res = runner.invoke(app, ["token", "new", "--user", "carol", "--role", "user",
                              "--tokens-file", str(path)])
    assert res.exit_code == 0 and len(res.stdout.strip()) >= 40
    assert next(iter(load_tokens(path).values())).user == "carol"
    res = runner.invoke(app, ["token", "new", "--user", "carol", "--role", "king",
                              "--tokens-file", str(path)])
    assert res.exit_code == 2 and "role" in res.stderr
    res = runner.invoke(app, ["queue", "--address", srv.address])
    assert res.exit_code == 1 and "bearer token" in res.stderr
    token_file = tmp_path / "alice.token"
    token_file.write_text(made["alice"] + "\n")
    token_file.chmod(0o644)
    monkeypatch.setenv("OFFCUT_TOKEN_FILE", str(token_file))
    res = runner.invoke(app, ["queue", "--address", srv.address])
    assert res.exit_code == 1 and "chmod 600" in res.stderr
    token_file.chmod(0o600)
    curve = tmp_path / "c.csv"
    curve.write_text("nodes,throughput\n1,10\n2,18\n")
    res = runner.invoke(app, ["submit", "-J", "mine", "-N", "1-2", "--work", "1e9", "--scalability",
                              str(curve), "--parsable", "--address", srv.address])
    assert res.exit_code == 0, res.output
    assert c["admin"].get_task(res.stdout.strip()).owner == "alice"


def test_non_loopback_tcp_needs_tls():
    with pytest.raises(ValueError, match="TCP needs TLS"):
        DaemonConfig(listen="0.0.0.0:50051")
    with pytest.raises(ValueError, match="go together"):
        DaemonConfig(listen="0.0.0.0:50051", tls_cert="/x.pem")
    assert DaemonConfig(listen="0.0.0.0:50051", tls_cert="/c.pem", tls_key="/k.pem",
                        tokens_file="/t.toml").tls_key  # (TCP needs tokens too: test_security)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_a_self_signed_certificate(tmp_path, tokens):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=offcut-test", "-addext", "subjectAltName=DNS:offcut-test,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    key.chmod(0o644)
    path, made = tokens
    cfg = DaemonConfig(listen="127.0.0.1:0", state=str(tmp_path / "s.sqlite"), solver="dp",
                       tls_cert=str(cert), tls_key=str(key), tokens_file=str(path))
    with pytest.raises(RuntimeError, match="tls_key: .*chmod 600"):
        OffcutServer(cfg)
    key.chmod(0o600)
    srv = OffcutServer(cfg)
    srv.start()
    address = f"127.0.0.1:{srv.port}"
    try:
        with Client(address, timeout_s=5, token=made["admin"], tls_ca=str(cert)) as ok:
            ok.wait_ready(10)
            ok.sync_nodes(time.time(), "w", 1, idle=ALL)
            assert ok.status().idle_nodes == 4
        with pytest.raises(InvalidArgument, match="refusing to send the token"):
            Client(address, timeout_s=3, token=made["admin"])  # no TLS: the token stays here
        with Client(address, timeout_s=3, token=made["admin"], insecure_token=True) as plain:
            with pytest.raises(Unavailable):  # sent without TLS all the same: refused
                plain.status()
        # the prolog hook over the same TLS, with a private token file (the channel every
        # client opens: offcut.channel)
        token_file = tmp_path / "hook.token"
        token_file.write_text(made["admin"] + "\n")
        token_file.chmod(0o600)
        log = tmp_path / "hooks.log"
        hook = [sys.executable, "-I", "-m", "offcut.slurm_plugin.hooks", "prolog", "--address",
                address, "--timeout-s", "10", "--log-file", str(log), "--token-file",
                str(token_file), "--tls-ca", str(cert)]
        env = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "batch", "SLURM_JOB_NODELIST": "n1"}
        assert subprocess.run(hook, env=env, timeout=60).returncode == 0
        assert "done (sent)" in log.read_text() and made["admin"] not in log.read_text()
        with Client(address, timeout_s=5, token=made["admin"], tls_ca=str(cert)) as ok:
            assert ok.status().idle_nodes == 3
        other_ca = tmp_path / "other.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=other", "-keyout", str(tmp_path / "ok.pem"), "-out",
                        str(other_ca)], check=True, capture_output=True)
        with Client(address, timeout_s=3, token=made["admin"], tls_ca=str(other_ca)) as wrong:
            with pytest.raises(Unavailable):  # the server's certificate is not trusted
                wrong.status()
    finally:
        srv.stop(0.2)


# ----------------------------------------------------------------------------- the slurm role
@pytest.fixture
def slurm_secured(tokens, request):
    """:func:`secured` with a ``slurm`` token too (``clients["slurm"]``)."""
    path, made = tokens
    made["slurm"] = add_token(path, "slurm", "slurm")
    return request.getfixturevalue("secured")


def offcut_v1_methods() -> dict[str, object]:
    """Full gRPC method name -> MethodDescriptor of every service in the generated offcut.v1
    descriptors (core/v1/*_pb2.py)."""
    import importlib
    import pkgutil

    import offcut.v1

    out = {}
    for info in pkgutil.iter_modules(offcut.v1.__path__):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"offcut.v1.{info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                out[f"/{service.full_name}/{method.name}"] = method
    return out


def unclassified(methods, table) -> list[str]:
    """The methods ``table`` (method -> roles) does not list."""
    return sorted(set(methods) - set(table))


def raw_call(client: Client, name: str):
    """Call the full method ``name`` with an empty request through ``client``'s channel (token
    included) and return the status code: PERMISSION_DENIED means the interceptor refused it,
    since an empty request reaching a handler is answered otherwise (INVALID_ARGUMENT,
    NOT_FOUND, OK)."""
    import grpc
    from google.protobuf import descriptor_pool

    service, _, method_name = name[1:].rpartition("/")
    method = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method_name]
    streams_in, streams_out = method.client_streaming, method.server_streaming
    kind = {(False, False): client.channel.unary_unary, (False, True): client.channel.unary_stream,
            (True, False): client.channel.stream_unary,
            (True, True): client.channel.stream_stream}[(streams_in, streams_out)]
    call = kind(name)
    request = iter([b""]) if streams_in else b""
    try:
        reply = call(request, timeout=5)
        if streams_out:
            list(reply)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def refused_by_interceptor(method: str, role: str) -> bool:
    """Whether :class:`AuthInterceptor` answers a call of a registered ``method`` by a
    ``role`` token with PERMISSION_DENIED (the handler never runs, and the request is never
    read: the refusal takes the request as a stream it does not consume)."""
    import asyncio

    import grpc

    from offcut.daemon.edge.auth import AuthInterceptor, Authenticator, Principal, token_digest

    ran, read = [], []
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: ran.append(1))
    details = type("Details", (), {"method": method,
                                   "invocation_metadata": (("authorization", "Bearer t"),)})()
    auth = Authenticator({token_digest("t"): Principal("someone", role)})

    async def continuation(_):
        return handler

    class Context:  # the asyncio servicer context: abort is a coroutine and raises
        async def abort(self, code, message):
            self.code = code
            raise RuntimeError(message)

    async def requests():
        read.append(1)
        yield b""

    async def call():
        chosen = await AuthInterceptor(auth).intercept_service(continuation, details)
        context = Context()
        try:
            if chosen.request_streaming:
                await chosen.stream_unary(requests(), context)
            else:
                chosen.unary_unary(b"", context)
        except RuntimeError:
            pass
        return getattr(context, "code", None)

    code = asyncio.run(call())
    return code == grpc.StatusCode.PERMISSION_DENIED and not ran and not read


def test_every_offcut_v1_method_is_classified():
    from offcut.daemon.edge.auth import ADMIN, METHOD_ROLES, ROLES, Principal

    methods = offcut_v1_methods()
    assert len(methods) >= 22 and "/offcut.v1.Tasks/ReportTaskRun" in methods
    missing = unclassified(methods, METHOD_ROLES)
    assert not missing, f"not in auth.METHOD_ROLES (who may call them?): {missing}"
    # the check does fail for an unlisted method
    table = {m: r for m, r in METHOD_ROLES.items() if m != "/offcut.v1.Tasks/GetTask"}
    assert unclassified(methods, table) == ["/offcut.v1.Tasks/GetTask"]
    # no stale entries: every listed method exists (offcut.v1, or the reflection service)
    stale = {m for m in set(METHOD_ROLES) - set(methods) if not m.startswith("/grpc.reflection.")}
    assert not stale, f"listed but not served: {sorted(stale)}"
    for method, roles in METHOD_ROLES.items():
        assert ADMIN in roles and roles <= set(ROLES), method
    # an unlisted (new) method: admins only, refused to the others by the interceptor
    new = "/offcut.v1.Tasks/SomeNewRpc"
    assert Principal("root-ops", "admin").may_call(new)
    assert not Principal("slurm", "slurm").may_call(new)
    assert not Principal("alice", "user").may_call(new)
    assert refused_by_interceptor(new, "slurm") and refused_by_interceptor(new, "user")
    assert not refused_by_interceptor(new, "admin")
    assert not refused_by_interceptor("/offcut.v1.Tasks/ReportTaskRun", "slurm")


def test_every_served_method_is_classified_or_open(slurm_secured):
    # what the running daemon serves (reflection), not only offcut.v1: nothing is left to a
    # default
    from google.protobuf import descriptor_pool
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from offcut.daemon.edge.auth import METHOD_ROLES, OPEN_PREFIXES

    _, c, _ = slurm_secured
    refl = reflection_pb2_grpc.ServerReflectionStub(c["admin"].channel)
    [resp] = list(refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    services = [s.name for s in resp.list_services_response.service]
    assert "offcut.v1.Tasks" in services and "grpc.health.v1.Health" in services
    pool = descriptor_pool.Default()
    for name in services:
        for method in pool.FindServiceByName(name).methods:
            full = f"/{name}/{method.name}"
            assert full in METHOD_ROLES or full.startswith(OPEN_PREFIXES), full


def test_slurm_role_reports_nodes_and_runs_and_reads_every_task(slurm_secured, tmp_path):
    from offcut.slurm_plugin.rpc import NodeEventSender

    srv, c, made = slurm_secured
    alice, bob, admin, slurm = c["alice"], c["bob"], c["admin"], c["slurm"]
    ta = alice.submit(make_spec("a", work=1e9, max_nodes=2)).task
    tb = bob.submit(make_spec("b", work=1e9, max_nodes=2)).task
    # node events: the prolog hook's ReportNodes (the real hook, with a slurm token file) ...
    token_file = tmp_path / "slurm.token"
    token_file.write_text(made["slurm"] + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "hooks.log"
    hook = [sys.executable, "-I", "-m", "offcut.slurm_plugin.hooks", "prolog", "--address",
            srv.address, "--timeout-s", "10", "--log-file", str(log), "--token-file",
            str(token_file)]
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "batch", "SLURM_JOB_NODELIST": "n4"}
    assert subprocess.run(hook, env=env, timeout=60).returncode == 0
    assert "done (sent)" in log.read_text() and made["slurm"] not in log.read_text()
    assert admin.status().idle_nodes == 3
    # ... and the watcher's SyncNodes (its sender), and the Python API's
    with NodeEventSender(srv.address, timeout_s=10, token=made["slurm"]) as watcher:
        assert watcher.sync(time_ns=time.time_ns(), source="slurm-watch", seq=2,
                            idle=ALL).idle_nodes == 4
    slurm.report_nodes(time.time(), "slurm-epilog", 1, idle=["n4"])
    assert admin.status().idle_nodes == 4
    # reads of every user's tasks
    assert {t.task_id for t in slurm.list_tasks()} == {ta.task_id, tb.task_id}
    assert [t.task_id for t in slurm.list_tasks(owner="bob")] == [tb.task_id]
    assert slurm.get_task(ta.task_id).owner == "alice" and slurm.get_task(tb.task_id).nodes
    seen = set()
    try:
        for update in slurm.watch(after_revision=0, timeout_s=2):
            seen.update(p.task_id for p in update.placements)
    except Exception:  # noqa: BLE001 - the deadline ends the stream
        pass
    assert seen == {ta.task_id, tb.task_id}
    assert next(iter(slurm.watch(tb.task_id, timeout_s=2))).placements
    st = slurm.status(include_idle_nodes=True)  # the launcher's revision; the full view
    assert st.revision == admin.status().revision and st.idle_node_names and st.last_seq
    # run reports of any user's task
    node = slurm.get_task(tb.task_id).nodes[0]
    r = slurm.report_task_run(tb.task_id, "started", node=node, job_id="41",
                              request_id="41:started")
    assert r.task.task_id == tb.task_id and admin.get_task(tb.task_id).launches == 1


def test_the_launcher_runs_with_a_slurm_token(slurm_secured, tmp_path):
    # every call the launcher makes (ListTasks, GetTask, ReportTaskRun, GetStatus,
    # WatchPlacements) passes with the slurm role, on a fake Slurm (tests/test_slurm_launcher.py)
    from test_slurm_launcher import FakeSlurm, fake_users, passwd

    from offcut.daemon.config import SlurmConfig
    from offcut.slurm_plugin.launcher import Launcher
    from offcut.slurm_plugin.owners import OwnerAccounts, RunAsPolicy

    _, c, _ = slurm_secured
    ta = c["alice"].submit(make_spec("a", work=1e9, max_nodes=2, command=["true"])).task
    tb = c["bob"].submit(make_spec("b", work=1e9, max_nodes=2, command=["true"])).task
    fake = FakeSlurm()
    # a root launcher whose user database knows alice and bob: their jobs run as them
    owners = OwnerAccounts(RunAsPolicy(), uid=0,
                           getpwnam=fake_users(passwd("alice", 1500), passwd("bob", 1501)))
    launcher = Launcher(c["slurm"], SlurmConfig(checkpoint_root=str(tmp_path / "ckpt")), fake,
                        accounts=owners)
    r = launcher.reconcile()
    assert {t for t, _, _ in r.submitted} == {ta.task_id, tb.task_id} and len(r.submitted) == 4
    r = launcher.reconcile()  # the starts are reported
    assert len(r.reported) == 4
    assert {c["admin"].get_task(t).launches for t in (ta.task_id, tb.task_id)} == {2}
    with launcher.watching():  # the placement stream (GetStatus, WatchPlacements, ListTasks)
        assert launcher.state.wait_synced(10)
        revision, seen = c["admin"].status().revision, launcher.state.version
        c["alice"].cancel(ta.task_id)
        assert launcher.state.wait(seen, 10) != seen  # woken by the placement update
        assert launcher.state.revision > revision and ta.task_id not in launcher.desired()


def test_slurm_role_may_do_nothing_else(slurm_secured):
    from offcut.daemon.edge.auth import METHOD_ROLES
    import grpc

    _, c, _ = slurm_secured
    alice, admin, slurm = c["alice"], c["admin"], c["slurm"]
    ta = alice.submit(make_spec("a", work=1e9)).task
    zeus = alice.register_zeus_job(zeus_spec("zj")).spec.job_id
    assert zeus == "zj"

    def state():
        return status_key(admin), admin.get_zeus_job(zeus)  # (a frozen ZeusJob: every field)

    before = state()
    for call in (lambda: slurm.submit(make_spec("x")),
                 lambda: slurm.submit(make_spec("x"), owner="alice"),
                 lambda: slurm.cancel(ta.task_id),
                 lambda: slurm.report_progress([{"task_id": ta.task_id, "time": time.time(),
                                                 "samples_done": 5.0, "nodes": 4}]),
                 lambda: next(iter(slurm.export_history())),
                 lambda: slurm.register_zeus_job(zeus_spec("mine")),
                 lambda: slurm.predict_batch_size(zeus),
                 lambda: slurm.get_zeus_job(zeus),
                 lambda: slurm.delete_zeus_job(zeus),
                 lambda: slurm.power_plan(zeus, 64)):
        with pytest.raises(PermissionDenied, match="needs the (user role or the )?admin role"):
            call()
        assert state() == before
    # every method not listed for the role, whatever it is: refused before any handler runs
    refused = {m for m, roles in METHOD_ROLES.items() if "slurm" not in roles}
    zeus_methods = {m for m in offcut_v1_methods()
                    if m.startswith(("/offcut.v1.BatchSizeOptimizer/",
                                     "/offcut.v1.PowerLimitOptimizer/"))}
    assert len(zeus_methods) == 11 and zeus_methods <= refused
    assert {"/offcut.v1.Tasks/SubmitTask", "/offcut.v1.Tasks/CancelTask",
            "/offcut.v1.Tasks/ReportProgress", "/offcut.v1.Status/ExportHistory"} <= refused
    for name in sorted(refused):
        assert raw_call(slurm, name) == grpc.StatusCode.PERMISSION_DENIED, name
        assert state() == before


def test_users_may_not_send_node_events_or_run_reports(slurm_secured):
    from offcut.daemon.edge.auth import METHOD_ROLES
    import grpc

    _, c, _ = slurm_secured
    alice, admin = c["alice"], c["admin"]
    ta = alice.submit(make_spec("a", work=1e9)).task
    key = status_key(admin)
    def stream_one():
        stream = alice.stream_nodes()
        stream.send(time.time(), "slurm-prolog", 1, preempted=["n1"])
        try:
            stream.receive()
        finally:
            stream.close()

    for call in (lambda: alice.report_nodes(time.time(), "slurm-prolog", 1, preempted=["n1"]),
                 lambda: alice.sync_nodes(time.time(), "slurm-watch", 9, idle=[]),
                 stream_one,
                 lambda: alice.report_task_run(ta.task_id, "finished", node="n1")):
        with pytest.raises(PermissionDenied, match="needs the slurm role or the admin role"):
            call()
    refused = {m for m, roles in METHOD_ROLES.items() if "user" not in roles}
    assert refused == {"/offcut.v1.NodeEvents/ReportNodes", "/offcut.v1.NodeEvents/SyncNodes",
                       "/offcut.v1.NodeEvents/StreamNodes", "/offcut.v1.Tasks/ReportTaskRun",
                       "/offcut.v1.Status/ExportHistory"}
    for name in sorted(refused):
        assert raw_call(alice, name) == grpc.StatusCode.PERMISSION_DENIED, name
    assert status_key(admin) == key
    assert admin.get_task(ta.task_id).state == TaskState.RUNNING


def test_token_new_mints_a_slurm_token(tmp_path):
    path = tmp_path / "tokens.toml"
    res = CliRunner().invoke(app, ["token", "new", "--user", "slurm", "--role", "slurm",
                                   "--tokens-file", str(path)])
    assert res.exit_code == 0, res.output
    [who] = load_tokens(path).values()
    assert (who.user, who.role) == ("slurm", "slurm")
    assert who.sees_all_tasks and not who.is_admin

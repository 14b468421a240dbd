"""Authentication, roles and TLS (docs/architecture.md §8) on real daemons: bearer tokens from a
private tokens file, users limited to their own tasks, admins to everything, refusals that leak
nothing, TLS with a self-signed certificate made here, tokens never logged."""

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
from offcut.daemon.auth import add_token, load_tokens, TokensFileError
from offcut.daemon.config import DaemonConfig
from offcut.daemon.server import OffcutServer
from offcut.errors import NotFound, PermissionDenied, Unauthenticated, Unavailable
from offcut.v1 import tasks_pb2

from daemon_helpers import make_spec, status_key

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
    assert st.idle_nodes == 4 and not st.idle_node_names and not st.last_decision.revision
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
    assert admin.get_task(tb.task_id).state == tasks_pb2.TASK_STATE_RUNNING


def test_each_call_hashes_its_token_once(secured, monkeypatch):
    # the interceptor resolves the caller; the handler reuses it (no second SHA-256 per call)
    from offcut.daemon import auth

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
    assert DaemonConfig(listen="0.0.0.0:50051", tls_cert="/c.pem", tls_key="/k.pem").tls_key


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
        with Client(address, timeout_s=3, token=made["admin"]) as plain:  # no TLS: refused
            with pytest.raises(Unavailable):
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

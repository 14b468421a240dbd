"""Issue 37, findings 5 and 6 (docs/security.md, "Round two: sockets and tokens").

5. A unix socket path is one server's for its lifetime (``offcut.unix_socket``): a server
   stopping never removes a successor's socket, and a second server cannot slip in between
   another's check of the path and its bind. Real daemons (``OffcutServer``) and real power
   helpers (``PowerHelperServer``) on real sockets.
6. A bearer token goes only where only the daemon can listen (a unix socket in a trusted
   folder, or TLS): a real gRPC server that took a loopback port receives no token from the
   API client, the hooks' sender or the CLI; a client config file that others could write is
   refused.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from offcut.client import Client
from offcut.client.settings import SettingsError, load_client_settings
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.errors import InvalidArgument, OffcutError
from offcut.slurm_plugin import hooks
from offcut.slurm_plugin.power_helper import PowerHelperServer
from offcut.slurm_plugin.rpc import NodeEventSender

from test_cli_tasks import one_line_error, run
from test_slurm_hooks import job_env
from test_power_helper import FakeJobs, shared_dir, start_helper  # noqa: F401 - a fixture

TOKEN = "s3cret-t0ken-of-the-launcher"


# ----------------------------------------------------------------------------- helpers
def _config(tmp_path: Path, name: str, socket_path: Path) -> DaemonConfig:
    folder = tmp_path / name
    folder.mkdir(mode=0o700, exist_ok=True)
    return DaemonConfig(listen=f"unix://{socket_path}", state=str(folder / "state.sqlite"),
                        solver="dp")


def _successor_socket(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket put at ``path`` the way a successor server does (bound under another
    name, renamed over the path); returns it and its (device, inode)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temp = path.with_name(".successor")
    sock.bind(str(temp))
    sock.listen(4)
    os.rename(temp, path)
    st = os.lstat(path)
    return sock, (st.st_dev, st.st_ino)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class _Held:
    """``<path>.lock`` held as a server does between its check of the path and its bind."""

    def __init__(self, path: Path):
        self.fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(self.fd, b"pid 4242\n", 0)

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# ----------------------------------------------------------------------------- finding 5
def test_a_stopping_daemon_leaves_a_successors_socket_alone(tmp_path):
    """Was: ``stop()`` unlinked whatever socket was at the path (gRPC's listener too), so a
    daemon stopping after a successor took the path cut the successor off. Now the socket is
    unlinked only while it is still the inode this daemon bound."""
    run_dir = tmp_path / "run"
    path = run_dir / "offcutd.sock"
    srv = OffcutServer(_config(tmp_path, "a", path))
    srv.start()
    successor = None
    try:
        with Client(srv.address, timeout_s=10) as c:
            assert c.status().revision == 0
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600  # the mode came with the rename
        successor, identity = _successor_socket(path)
    finally:
        srv.stop(0)
    try:
        st = os.lstat(path)
        assert (st.st_dev, st.st_ino) == identity, "the successor's socket was removed"
        assert _answers(path)
    finally:
        successor.close()
    # nothing of the stopped daemon's was left behind (its lock file, a bound name)
    assert sorted(p.name for p in run_dir.iterdir()) == ["offcutd.sock"]


def test_a_daemon_removes_its_own_socket_and_leaves_no_bound_name(tmp_path):
    path = tmp_path / "run" / "offcutd.sock"
    srv = OffcutServer(_config(tmp_path, "a", path))
    srv.start()
    srv.stop(0)
    assert not os.path.lexists(path)
    assert list(path.parent.iterdir()) == []  # no lock file, no bound name


def test_a_daemon_between_its_check_and_its_bind_keeps_the_path(tmp_path):
    """Was: the start checked the path (nothing answers) and then bound it, so two daemons
    starting together both passed the check and the later one replaced the other's socket.
    Now the check and the bind happen under ``<socket>.lock``: while another daemon holds it
    (here: one that has checked the path and not yet bound it), a start is refused naming the
    holder, and the path is untouched."""
    path = tmp_path / "run" / "offcutd.sock"
    path.parent.mkdir(mode=0o700)
    held = _Held(path)
    try:
        with pytest.raises(RuntimeError) as info:
            OffcutServer(_config(tmp_path, "b", path))
        message = str(info.value)
        assert "another process is listening on it" in message and "pid 4242" in message
        assert f"{path}.lock" in message and "\n" not in message
        assert not os.path.lexists(path)
    finally:
        held.release()
    srv = OffcutServer(_config(tmp_path, "b", path))  # the lock released: the start goes on
    try:
        srv.start()
        with Client(srv.address, timeout_s=10) as c:
            assert c.status().revision == 0
        # and a second daemon (its own state) is refused by the first one's lock
        with pytest.raises(RuntimeError, match="another process is listening on it"):
            OffcutServer(_config(tmp_path, "c", path))
        with Client(srv.address, timeout_s=10) as c:
            assert c.status().revision == 0  # the first still serves its socket
    finally:
        srv.stop(0)


def test_servers_starting_together_never_share_the_path(tmp_path):
    """The check-then-bind race itself, many times over: 6 threads, each in turn claiming
    the path, binding, publishing and releasing as a server does (``SocketPathClaim``, the
    daemon's and the power helper's). At no moment do two hold the path, every published
    socket is the one at the path while its server holds it, and each refusal names the
    holder."""
    import threading

    from offcut.unix_socket import SocketPathClaim, SocketPathError

    path = tmp_path / "run" / "s.sock"
    path.parent.mkdir(mode=0o700)
    holders, wins, refusals, problems = [], [0], [0], []
    guard = threading.Lock()

    def server(n: int) -> None:
        for _ in range(40):
            try:
                claim = SocketPathClaim(str(path))
            except SocketPathError as exc:
                with guard:
                    refusals[0] += 1
                    if "another process is listening" not in str(exc):
                        problems.append(str(exc))
                continue
            with guard:
                holders.append(n)
                if len(holders) > 1:
                    problems.append(f"two servers hold the path: {holders}")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(claim.bind_path)
                sock.listen(1)
                claim.publish(0o600)
                if not claim.owns_path():
                    problems.append("a published socket is not the one at the path")
            finally:
                with guard:
                    holders.remove(n)
                    wins[0] += 1
                sock.close()
                claim.release()

    threads = [threading.Thread(target=server, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert problems == [] and wins[0] > 0 and wins[0] + refusals[0] == 6 * 40
    assert list(path.parent.iterdir()) == []  # every server removed its own socket and lock


def test_a_stopping_power_helper_leaves_a_successors_socket_alone(shared_dir):  # noqa: F811
    """The node power helper's socket follows the same rule (one shared helper,
    ``offcut.unix_socket``): its stop leaves a successor's socket in place, and a helper
    holding the path's lock refuses a second one."""
    server, _, _ = start_helper(shared_dir, jobs=FakeJobs())
    path = Path(server.socket_path)
    successor = None
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o666
        with pytest.raises(OSError, match="--socket: .*another process is listening"):
            PowerHelperServer(server._server.helper, str(path))
        successor, identity = _successor_socket(path)
    finally:
        server.stop()
    try:
        st = os.lstat(path)
        assert (st.st_dev, st.st_ino) == identity, "the successor's socket was removed"
        assert _answers(path)
    finally:
        successor.close()
    held = _Held(path)  # a helper between its check and its bind
    try:
        with pytest.raises(OSError, match="pid 4242"):
            PowerHelperServer(server._server.helper, str(path))
        st = os.lstat(path)
        assert (st.st_dev, st.st_ino) == identity
    finally:
        held.release()


# ----------------------------------------------------------------------------- finding 6
class _Squatter:
    """A gRPC server that took a loopback port (as any local process can while offcutd
    restarts): it answers every method UNIMPLEMENTED and records each call's
    ``authorization`` metadata."""

    def __init__(self):
        self.seen: list[str] = []
        outer = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                outer.seen.extend(v for k, v in details.invocation_metadata
                                  if k == "authorization")
                return None  # UNIMPLEMENTED

        self.server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[Handler()])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def squatter():
    s = _Squatter()
    yield s
    s.stop()


def _status_error(address: str, **kw) -> OffcutError | None:
    """The error of a ``GetStatus`` call (construction included) with ``kw``, None if none."""
    try:
        with Client(address, timeout_s=5, **kw) as c:
            c.status()
    except OffcutError as exc:
        return exc
    return None


def test_a_token_is_not_sent_over_tcp_without_tls(squatter, tmp_path, monkeypatch):
    """Was: a client with a token and a loopback TCP address sent ``Bearer TOKEN`` to whatever
    listened there. Now the API client, the hooks' and watcher's sender and the CLI refuse
    before connecting, naming the address and the ways out; the squatter receives nothing.
    With ``insecure_token`` (or ``$OFFCUT_INSECURE_TOKEN=1``) the token is sent, which shows
    that the squatter would have received it."""
    monkeypatch.delenv("OFFCUT_INSECURE_TOKEN", raising=False)
    err = _status_error(squatter.address, token=TOKEN)
    assert isinstance(err, InvalidArgument), err
    message = str(err)
    assert f"refusing to send the token to {squatter.address}" in message
    assert "tls_ca" in message and "insecure_token" in message and "unix socket" in message
    assert TOKEN not in message and "\n" not in message

    with pytest.raises(InvalidArgument, match="refusing to send the token"):
        NodeEventSender(squatter.address, token=TOKEN)       # the hooks', watcher's sender

    token_file = tmp_path / "slurm.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "hooks.log"
    assert hooks.main(["prolog", "--address", squatter.address, "--token-file",
                       str(token_file), "--log-file", str(log), "--timeout-s", "2"],
                      env=job_env("n1")) == 0
    assert "refusing to send the token" in log.read_text() and TOKEN not in log.read_text()

    monkeypatch.setenv("OFFCUT_TOKEN", TOKEN)                 # the CLI, token from the env
    one_line_error(run("status", "--address", squatter.address), 1,
                   "refusing to send the token", "--insecure-token")

    # an abstract unix socket has no owner either: anyone may bind its name
    err = _status_error("unix-abstract:offcut-test-squatter", token=TOKEN)
    assert isinstance(err, InvalidArgument) and "abstract unix socket" in str(err)
    assert squatter.seen == []

    # the documented way out: the token goes, and the squatter gets it
    assert run("status", "--address", squatter.address, "--insecure-token").exit_code == 1
    monkeypatch.delenv("OFFCUT_TOKEN")
    assert squatter.seen == [f"Bearer {TOKEN}"]
    monkeypatch.setenv("OFFCUT_INSECURE_TOKEN", "1")
    err = _status_error(squatter.address, token=TOKEN)
    assert not isinstance(err, InvalidArgument)
    assert squatter.seen == [f"Bearer {TOKEN}"] * 2
    monkeypatch.delenv("OFFCUT_INSECURE_TOKEN")
    # without a token nothing secret travels: a plain TCP client is still allowed
    assert not isinstance(_status_error(squatter.address), InvalidArgument)


def test_a_token_goes_over_a_unix_socket(daemon, tmp_path):
    """The refusal is about TCP only: a token over the daemon's unix socket is sent."""
    srv, _ = daemon
    with Client(srv.address, timeout_s=10, token=TOKEN) as c:
        assert c.status().revision >= 0


def test_a_missing_socket_in_a_folder_others_can_write_is_refused(tmp_path):
    """Was: a socket that did not exist (the daemon restarting) was not judged, so a client
    retrying would send its token to whatever another user put there later. Now the folder
    is judged: one others can write is refused before anything is sent."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InvalidArgument, match="refusing to connect to .*writable by its owner"):
        Client(f"unix://{shared}/offcutd.sock", token=TOKEN, timeout_s=5)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    Client(f"unix://{private}/offcutd.sock", token=TOKEN, timeout_s=5).close()  # fine


@pytest.mark.parametrize("file_mode,folder_mode,needle", [
    (0o666, 0o700, "client.toml is writable by group or others (mode 0666)"),
    (0o620, 0o700, "client.toml is writable by group or others (mode 0620)"),
    (0o644, 0o777, "offcut is writable by group or others (mode 0777)"),
    (0o644, 0o775, "offcut is writable by group or others (mode 0775)"),
], ids=["file-0666", "file-0620", "folder-0777", "folder-0775"])
def test_a_client_config_others_can_write_is_refused(tmp_path, monkeypatch, file_mode,
                                                     folder_mode, needle):
    """Was: a world-writable ``client.toml`` naming a squatter's address was honoured. Now a
    config file that another user could write (the file or its folder writable by group or
    others) is refused with one line naming it, as the default file and as ``--config``."""
    folder = tmp_path / "xdg" / "offcut"
    folder.mkdir(parents=True)
    config = folder / "client.toml"
    config.write_text('address = "127.0.0.1:1"\n')
    config.chmod(file_mode)
    folder.chmod(folder_mode)
    with pytest.raises(SettingsError) as info:
        load_client_settings({}, config)
    assert str(info.value).startswith(f"config {config}: refused: ") and needle in str(info.value)
    one_line_error(run("queue", "--config", str(config)), 2, f"config {config}: refused", needle)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # the default file likewise
    one_line_error(run("queue"), 2, f"config {config}: refused", needle)
    config.chmod(0o644)
    folder.chmod(0o755)
    assert load_client_settings({}).address == "127.0.0.1:1"


def test_a_client_config_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("making a file another user's needs root")
    config = tmp_path / "client.toml"
    config.write_text('address = "127.0.0.1:1"\n')
    config.chmod(0o644)
    os.chown(config, 54321, 54321)
    with pytest.raises(SettingsError, match=r"client.toml is owned by uid 54321, neither yours"):
        load_client_settings({}, config)
    linked = tmp_path / "link.toml"  # a link of the user's to it: the file itself is judged
    linked.symlink_to(config)
    with pytest.raises(SettingsError, match="owned by uid 54321"):
        load_client_settings({}, linked)
    os.chown(config, 0, 0)
    assert load_client_settings({}, linked).address == "127.0.0.1:1"

"""The state file is owned by one daemon and trusted only when it checks out
(docs/operations.md): the lock, permissions, damaged files, read-only and full storage, and the
``offcutd check`` / ``offcutd backup`` commands. Real SQLite files, real ``OffcutServer``s and
``offcutd`` subprocesses, real gRPC."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from offcut.client import Client
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import STATE_HEALTH, OffcutServer
from offcut.daemon.app.state_lock import StateOwnershipError
from offcut.daemon.app.state_file import APPLICATION_ID, SCHEMA_VERSION, StoreError
from offcut.daemon.app.store import Store
from offcut.errors import ResourceExhausted, Unavailable

from daemon_helpers import T0, make_spec, wait_until

OFFCUTD = [sys.executable, "-m", "offcut.daemon"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _config(folder: Path, **kw) -> DaemonConfig:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    kw.setdefault("snapshot_every", 1000)
    return DaemonConfig(listen=f"unix://{folder}/s.sock", state=str(folder / "state.sqlite"),
                        solver="dp", clock="live", **kw)


class Running:
    """An ``OffcutServer`` with a client, stopped at the end of the ``with``."""

    def __init__(self, cfg: DaemonConfig, init: bool = False):
        self.cfg = cfg
        self.srv = OffcutServer(cfg, init=init)
        self.srv.start()
        self.client = Client(cfg.listen, timeout_s=10)
        self.client.wait_ready(10)
        self.seq = 0

    def report(self) -> int:
        """One node event (one journal row); its revision."""
        self.seq += 1
        return self.client.report_nodes(time=T0 + self.seq, source="w", seq=self.seq,
                                        idle=[f"n{self.seq}"]).revision

    def health(self, service: str = "") -> int:
        with grpc.insecure_channel(self.cfg.listen) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.srv.stop(0.2)


def _refusal(cfg: DaemonConfig, init: bool = False) -> str:
    """The message ``OffcutServer`` refuses ``cfg`` with."""
    with pytest.raises((StoreError, StateOwnershipError, RuntimeError)) as info:
        OffcutServer(cfg, init=init)
    return str(info.value)


def _offcutd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(OFFCUTD + list(args), capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- ownership
def test_a_second_daemon_on_the_same_state_or_socket_is_refused(tmp_path):
    cfg = _config(tmp_path / "a")
    with Running(cfg) as d:
        d.report()
        other = _offcutd("--state", cfg.state, "--listen", f"unix://{tmp_path}/a/other.sock",
                         "--solver", "dp")
        assert other.returncode == 1, other.stderr
        assert f"in use by another offcutd (pid {os.getpid()}" in other.stderr
        assert "Traceback" not in other.stderr
        # another state, the same socket: the live daemon's socket is not taken over
        elsewhere = _config(tmp_path / "b")
        other = _offcutd("--state", elsewhere.state, "--listen", cfg.listen, "--solver", "dp")
        assert other.returncode == 1, other.stderr
        assert "another process is listening on it" in other.stderr
        assert "Traceback" not in other.stderr
        assert d.report() == 2  # the first daemon still serves its socket
        assert Path(cfg.state + ".lock").read_text().startswith(f"pid {os.getpid()}\n")
    # stopped: the lock is free again, and a stale socket of a dead daemon would be replaced
    with Running(cfg) as d:
        assert d.client.status().revision == 2


# ----------------------------------------------------------------------------- permissions
def test_a_start_that_fails_after_the_state_was_opened_releases_it(tmp_path):
    """A start that fails once the state is locked and open (here: the solver-instance record
    file cannot be created) closes what it opened and releases the lock: the next start in
    the same process is not refused as "in use by another offcutd"."""
    with pytest.raises(OSError):
        OffcutServer(_config(tmp_path, record_instances=str(tmp_path / "missing" / "x.jsonl")))
    srv = OffcutServer(_config(tmp_path))
    srv.stop(0.1)


def test_new_state_is_private_and_an_open_folder_is_refused(tmp_path):
    folder = tmp_path / "new" / "deeper"
    cfg = DaemonConfig(listen=f"unix://{tmp_path}/s.sock", state=str(folder / "state.sqlite"),
                       solver="dp")
    with Running(cfg) as d:
        d.report()
        for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm", "state.sqlite.lock"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
        backup = tmp_path / "copy.sqlite"
        out = _offcutd("backup", "--state", cfg.state, "--to", str(backup))
        assert out.returncode == 0, out.stderr
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    os.chmod(folder, 0o770)
    msg = _refusal(cfg)
    assert "writable by group or others" in msg and f"chmod 0700 {folder}" in msg
    os.chmod(folder, 0o700)
    os.chown(folder, 4242, 4242)  # tests run as root
    msg = _refusal(cfg)
    assert "owned by uid 4242" in msg


# ----------------------------------------------------------------------------- damaged files
def test_an_empty_file_is_refused_unless_init(tmp_path):
    cfg = _config(tmp_path / "a")
    Path(cfg.state).touch(mode=0o600)
    out = _offcutd("--state", cfg.state, "--listen", cfg.listen)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "empty (0-byte) file" in out.stderr and "--init" in out.stderr
    assert Path(cfg.state).stat().st_size == 0  # left as it was
    with Running(cfg, init=True) as d:
        assert d.report() == 1


def test_a_file_that_is_not_sqlite_or_not_offcuts_is_refused(tmp_path):
    cfg = _config(tmp_path / "a")
    state = Path(cfg.state)
    state.write_text("# my notes\n")
    assert "is not a SQLite file" in _refusal(cfg)
    assert state.read_text() == "# my notes\n"
    state.unlink()
    with sqlite3.connect(state) as db:  # another program's database
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('ann')")
    db.close()
    assert "not an Offcut state (tables users)" in _refusal(cfg)
    with sqlite3.connect(state) as db:
        db.execute("PRAGMA application_id = 1234")
    db.close()
    assert "another application (application_id 0x4d2" in _refusal(cfg)
    state.unlink()
    with sqlite3.connect(state) as db:  # a SQLite file without tables: taken only with --init
        db.execute("CREATE TABLE t (x)")
        db.execute("DROP TABLE t")
    db.close()
    assert state.stat().st_size > 0
    assert "an empty SQLite file without Offcut's application_id" in _refusal(cfg)
    with Running(cfg, init=True) as d:
        assert d.report() == 1


def test_a_newer_format_is_refused_and_a_new_file_carries_offcuts_marks(tmp_path):
    cfg = _config(tmp_path / "a")
    with Running(cfg) as d:
        d.report()
    with sqlite3.connect(cfg.state) as db:
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    assert f"format {SCHEMA_VERSION + 1} is newer" in _refusal(cfg)


def test_a_failing_integrity_check_is_refused(tmp_path):
    cfg = _config(tmp_path / "a")
    with Running(cfg) as d:
        for _ in range(30):
            d.report()
    with sqlite3.connect(cfg.state) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'journal'").fetchone()[0]
        page = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(cfg.state, "r+b") as f:  # scribble over the journal table's root page
        f.seek((root - 1) * page + 8)
        f.write(b"\xff" * 64)
    msg = _refusal(cfg)
    assert "integrity check failed" in msg or "not a usable Offcut state file" in msg
    assert _offcutd("check", "--state", cfg.state).returncode == 1


def _crash_copy(cfg: DaemonConfig, into: Path, wal_bytes: int | None) -> DaemonConfig:
    """The files a ``kill -9`` of the running daemon of ``cfg`` would leave, copied to
    ``into``: the main file and the lock file, with the ``-wal`` deleted (``wal_bytes`` None)
    or cut to ``wal_bytes`` bytes."""
    copy = _config(into)
    shutil.copy(cfg.state, copy.state)
    shutil.copy(cfg.state + ".lock", copy.state + ".lock")
    if wal_bytes is not None:
        with open(cfg.state + "-wal", "rb") as f:
            Path(copy.state + "-wal").write_bytes(f.read(wal_bytes))
    return copy


def test_a_deleted_or_truncated_wal_is_noticed(tmp_path):
    cfg = _config(tmp_path / "a")
    with Running(cfg) as d:
        for _ in range(5):
            d.report()
        wal = Path(cfg.state + "-wal").stat().st_size
        assert wal > 0
        deleted = _crash_copy(cfg, tmp_path / "deleted", None)
        truncated = _crash_copy(cfg, tmp_path / "truncated", wal // 2)
        intact = _crash_copy(cfg, tmp_path / "intact", wal)
    msg = _refusal(deleted)
    assert "journal rows 1..5 were acknowledged by the previous daemon but are gone" in msg
    msg = _refusal(truncated)
    assert "were acknowledged by the previous daemon but are gone" in msg
    assert _offcutd("check", "--state", truncated.state).returncode == 1
    with Running(intact) as d:  # the whole -wal: nothing lost, starts
        assert d.client.status().revision == 5
    # the operator accepts the loss by removing the lock file (docs/operations.md)
    os.unlink(deleted.state + ".lock")
    with Running(deleted) as d:
        assert d.client.status().revision == 0


def test_a_corrupt_snapshot_falls_back_to_the_previous_one_and_the_journal(tmp_path, caplog):
    cfg = _config(tmp_path / "a", snapshot_every=2)
    with Running(cfg) as d:
        for _ in range(7):
            d.report()
        before = d.client.status()
    with sqlite3.connect(cfg.state) as db:
        ids = [r[0] for r in db.execute("SELECT journal_id FROM snapshots ORDER BY 1")]
        assert len(ids) == 2 and ids[-1] == 7
        db.execute("UPDATE snapshots SET state = replace(state, '\"revision\":7', "
                   "'\"revision\":8') WHERE journal_id = 7")
    db.close()
    caplog.set_level(logging.WARNING, logger="offcut.daemon")
    with Running(cfg) as d:
        st = d.client.status()
        assert st.revision == 7 and dict(st.last_seq) == dict(before.last_seq)
        assert st.idle_nodes == before.idle_nodes
    assert "snapshot at journal row 7 is corrupt" in caplog.text
    # every snapshot corrupt: the journal is complete, so it is replayed from its start
    with sqlite3.connect(cfg.state) as db:
        db.execute("UPDATE snapshots SET state = state || ' '")
    db.close()
    with Running(cfg) as d:
        assert d.client.status().revision == 7
    # ... and with the journal's first rows gone too, the start is refused
    with sqlite3.connect(cfg.state) as db:
        db.execute("UPDATE snapshots SET state = state || ' '")
        db.execute("DELETE FROM journal WHERE id = 1")
    db.close()
    os.unlink(cfg.state + ".lock")  # the deleted row is not a lost -wal here
    assert "every snapshot is corrupt" in _refusal(cfg)


def test_a_corrupt_task_row_is_a_corrupt_snapshot_for_the_daemon_and_for_check(tmp_path, caplog):
    """Snapshots keep their tasks as rows with their own sha256 (docs/architecture.md,
    "Journal and snapshots"): a changed row makes its snapshot corrupt at start (the daemon falls
    back to the older one and the journal) and in ``offcutd check`` alike."""
    cfg = _config(tmp_path / "a", snapshot_every=2)
    with Running(cfg) as d:
        d.report()
        task_id = d.client.submit(make_spec("x"), owner="u").task.task_id
        for _ in range(3):
            d.report()
    with sqlite3.connect(cfg.state) as db:
        changed = db.execute(
            "UPDATE snapshot_tasks SET task = replace(task, '\"owner\":\"u\"', "
            "'\"owner\":\"v\"') WHERE journal_id = (SELECT MAX(journal_id) FROM snapshots)"
            ).rowcount
        newest = db.execute("SELECT MAX(journal_id) FROM snapshots").fetchone()[0]
    db.close()
    assert changed == 1
    out = _offcutd("check", "--state", cfg.state)
    assert (f"snapshot at journal row {newest} is corrupt (sha256 mismatch of task {task_id})"
            in out.stdout), out.stdout
    caplog.set_level(logging.WARNING, logger="offcut.daemon")
    with Running(cfg) as d:
        assert d.client.get_task(task_id).owner == "u"
    assert f"snapshot at journal row {newest} is corrupt" in caplog.text


# ----------------------------------------------------------------------------- storage
def test_read_only_storage_is_unavailable_and_recovers(tmp_path, caplog):
    cfg = _config(tmp_path / "a")
    caplog.set_level(logging.WARNING, logger="offcut")
    with Running(cfg) as d:
        d.report()
        # the engine's connection can no longer write (SQLite's own SQLITE_READONLY; root
        # ignores file modes, so no chmod)
        d.srv.engine.store.db.execute("PRAGMA query_only = 1")
        with pytest.raises(Unavailable) as info:
            d.report()
        assert "cannot be written" in str(info.value) and cfg.state in str(info.value)
        assert d.srv.storage_problem is not None
        wait_until(lambda: d.health() == NOT_SERVING and d.health(STATE_HEALTH) == NOT_SERVING,
                   "health NOT_SERVING", 10)
        assert d.client.status().revision == 1  # reads still answer
        # the problem is logged once, in words; the engine adds one line, no traceback
        assert caplog.text.count("cannot be written") == 1, caplog.text
        assert "revision 2 not committed (StateReadOnly)" in caplog.text
        assert "Traceback" not in caplog.text
        d.srv.engine.store.db.execute("PRAGMA query_only = 0")
        assert d.report() == 2  # the retried event (same seq) is applied now
        wait_until(lambda: d.health() == SERVING and d.health(STATE_HEALTH) == SERVING,
                   "health SERVING again", 10)
    with Running(cfg) as d:
        assert d.client.status().revision == 2


def test_full_storage_is_resource_exhausted_and_nothing_acknowledged_is_lost(tmp_path):
    cfg = _config(tmp_path / "a")
    with Running(cfg) as d:
        d.report()
        db = d.srv.engine.store.db
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite answers SQLITE_FULL past it
        acked = 1
        with pytest.raises(ResourceExhausted) as info:
            for _ in range(10_000):  # until the file's pages are full
                acked = d.report()
        assert "storage is full" in str(info.value)
        wait_until(lambda: d.health() == NOT_SERVING, "health NOT_SERVING", 10)
        db.execute("PRAGMA max_page_count = 1073741823")
        assert d.report() == acked + 1
        wait_until(lambda: d.health() == SERVING, "health SERVING again", 10)
        acked += 1
    with Running(cfg) as d:
        assert d.client.status().revision == acked


# ----------------------------------------------------------------------------- commands
def test_check_and_backup_while_the_daemon_runs(tmp_path):
    cfg = _config(tmp_path / "a", snapshot_every=2)
    with Running(cfg) as d:
        for _ in range(5):
            d.report()
        out = _offcutd("check", "--state", cfg.state)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "ok: quick_check" in out.stdout and f"in use by offcutd pid {os.getpid()}" in out.stdout
        copy = tmp_path / "backup.sqlite"
        out = _offcutd("backup", "--state", cfg.state, "--to", str(copy))
        assert out.returncode == 0, out.stderr
        again = _offcutd("backup", "--state", cfg.state, "--to", str(copy))
        assert again.returncode == 1 and "exists; refusing to overwrite" in again.stderr
    # restore: the copy in the state's place, in a new folder
    restored = _config(tmp_path / "restored")
    shutil.copy(copy, restored.state)
    os.chmod(restored.state, 0o600)
    with Running(restored) as d:
        assert d.client.status().revision == 5
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    out = _offcutd("check", "--state", str(empty))
    assert out.returncode == 1 and "FAIL" in out.stdout and "0-byte" in out.stdout
    assert "check" in _offcutd("--help").stdout and "backup" in _offcutd("--help").stdout


def test_a_damaged_lock_file_is_read_as_no_mark(tmp_path):
    """A lock file with non-ASCII digits or bytes that are not text is no mark, not a
    start-up traceback."""
    from offcut.daemon.app.state_lock import lock_path, read_mark

    state = tmp_path / "state.sqlite"
    lock_path(state).write_bytes("pid ²\nlast_journal_id 7\xb2\n".encode() + b"\xff\xfe\n")
    assert read_mark(state) == (None, None)
    lock_path(state).write_bytes(b"pid 42\nlast_journal_id 7\n")
    assert read_mark(state) == (42, 7)


def test_a_linked_lock_file_is_refused_and_direct_stores_make_private_folders(tmp_path):
    """A symbolic link planted as the lock file is refused with its name, never written
    through; a Store opened directly (replay, tools) makes its missing folders 0700."""
    from offcut.daemon.app.state_lock import StateLock, lock_path

    state = tmp_path / "state.sqlite"
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    lock_path(state).symlink_to(target)
    with pytest.raises(StateOwnershipError) as info:
        StateLock(state)
    assert "symbolic link" in str(info.value) and str(lock_path(state)) in str(info.value)
    assert target.read_text() == "keep"
    store = Store(tmp_path / "new" / "deeper" / "s.sqlite")
    store.close()
    for folder in (tmp_path / "new", tmp_path / "new" / "deeper"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder

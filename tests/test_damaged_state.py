"""Damaged or read-only state (issue 37, finding 8; docs/operations.md, "Read-only or full
storage" and "`offcutd check`"): a state offcutd cannot write is refused at start in one
line with the fix, ``offcutd check`` fails on what the daemon refuses, one damaged archive
row never fails every listing, and a storage failure reaches the client with its reason.
Real SQLite files, real ``OffcutServer`` and ``offcutd`` subprocesses, real gRPC.

offcutd runs as root here, and root ignores file modes: the read-only cases run offcutd
without CAP_DAC_OVERRIDE (``setpriv``), so the kernel applies a 0400 mode to it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.errors import Unavailable

from daemon_helpers import T0, make_spec

OFFCUTD = [sys.executable, "-m", "offcut.daemon"]
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
          "--inh-caps=-dac_override,-dac_read_search"]


def _config(folder: Path) -> DaemonConfig:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return DaemonConfig(listen=f"unix://{folder}/s.sock", state=str(folder / "state.sqlite"),
                        solver="dp", clock="live")


def _offcutd(*args: str, no_dac: bool = False) -> subprocess.CompletedProcess:
    prefix = NO_DAC if no_dac and os.geteuid() == 0 else []
    return subprocess.run(prefix + OFFCUTD + list(args), capture_output=True, text=True,
                          timeout=120)


def _made_state(cfg: DaemonConfig, events: int = 1) -> None:
    srv = OffcutServer(cfg)
    srv.start()
    from offcut.client import Client
    with Client(cfg.listen, timeout_s=10) as c:
        for i in range(1, events + 1):
            c.report_nodes(time=T0 + i, source="w", seq=i, idle=[f"n{i}"])
    srv.stop(0.1)


class Running:
    """An ``OffcutServer`` on ``cfg`` with a client (``with``: the client)."""

    def __init__(self, cfg: DaemonConfig):
        from offcut.client import Client
        self.srv = OffcutServer(cfg)
        self.srv.start()
        self.client = Client(cfg.listen, timeout_s=10)

    def __enter__(self):
        return self.client

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.srv.stop(0.1)


needs_setpriv = pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None,
                                   reason="root without setpriv ignores file modes")


@needs_setpriv
def test_a_read_only_state_file_or_folder_is_refused_in_one_line(tmp_path):
    cfg = _config(tmp_path / "a")
    _made_state(cfg)
    os.chmod(cfg.state, 0o400)
    args = ["--state", cfg.state, "--listen", cfg.listen, "--solver", "dp"]
    out = _offcutd(*args, no_dac=True)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and "│" not in out.stderr, out.stderr
    line = [l for l in out.stderr.splitlines() if l.startswith("offcutd:")]
    assert len(line) == 1, out.stderr
    assert cfg.state in line[0] and "cannot be written" in line[0] and "chmod" in line[0]
    check = _offcutd("check", "--state", cfg.state, no_dac=True)
    assert check.returncode == 1, check.stdout
    assert f"FAIL: {cfg.state}: the state cannot be written" in check.stdout
    # the folder read-only, the file writable: refused as well, naming the folder
    os.chmod(cfg.state, 0o600)
    folder = str(tmp_path / "a")
    os.chmod(folder, 0o500)
    try:
        out = _offcutd(*args, no_dac=True)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert f"{folder}: the state's folder cannot be written" in out.stderr
        assert _offcutd("check", "--state", cfg.state, no_dac=True).returncode == 1
    finally:
        os.chmod(folder, 0o700)
    # writable again (no -wal/-shm of its 0400 mode left behind): check passes
    assert not Path(cfg.state + "-shm").exists() or os.access(cfg.state + "-shm", os.W_OK)
    assert _offcutd("check", "--state", cfg.state, no_dac=True).returncode == 0


def test_a_damaged_archive_row_is_skipped_and_counted_not_internal(tmp_path, caplog):
    cfg = _config(tmp_path / "a")
    _made_state(cfg)
    db = sqlite3.connect(cfg.state)
    with db:
        db.execute("INSERT INTO task_archive VALUES ('t000099', 99, 'u', 'completed', 1.0, "
                   "'{garbage')")
    db.close()
    srv = OffcutServer(cfg)
    srv.start()
    from offcut.client import Client
    try:
        with Client(cfg.listen, timeout_s=10) as c:
            assert c.list_tasks() == []  # before: INTERNAL for every listing
            assert c.list_tasks() == []
        assert srv.engine.store.bad_archive_rows_skipped == 2
        assert caplog.text.count("archived task 't000099' is damaged") == 1, caplog.text
    finally:
        srv.stop(0.1)


def test_check_fails_on_what_the_daemon_refuses_a_journal_gap_and_a_damaged_zeus_row(tmp_path):
    cfg = _config(tmp_path / "a")
    _made_state(cfg, events=3)
    db = sqlite3.connect(cfg.state)
    with db:
        db.execute("DELETE FROM snapshots")  # replayed from row 1, so row 2 is needed
        db.execute("DELETE FROM journal WHERE id = 2")
    db.close()
    out = _offcutd("check", "--state", cfg.state)
    assert out.returncode == 1 and "have gaps: 2 of 3 present" in out.stdout, out.stdout
    start = _offcutd("--state", cfg.state, "--listen", cfg.listen, "--solver", "dp")
    assert start.returncode == 1 and "have gaps" in start.stderr, start.stderr
    assert "Traceback" not in start.stderr

    cfg = _config(tmp_path / "b")
    _made_state(cfg)
    db = sqlite3.connect(cfg.state)
    with db:
        db.execute("INSERT INTO zeus_state VALUES ('bso', 'j1', 0, 'garbage')")
    db.close()
    out = _offcutd("check", "--state", cfg.state)
    assert out.returncode == 1 and "zeus_state row (bso, j1, 0) is damaged" in out.stdout
    start = _offcutd("--state", cfg.state, "--listen", cfg.listen, "--solver", "dp")
    assert start.returncode == 1 and "is damaged" in start.stderr, start.stderr
    assert "Traceback" not in start.stderr


def test_a_storage_failure_reaches_the_client_as_unavailable_with_its_reason(tmp_path, caplog):
    cfg = _config(tmp_path / "a")
    srv = OffcutServer(cfg)
    srv.start()
    from offcut.client import Client
    try:
        with Client(cfg.listen, timeout_s=10) as c:
            task_id = c.submit(make_spec("x"), owner="u").task.task_id
            srv.engine.store.db.execute("PRAGMA query_only = 1")  # SQLITE_READONLY for writes
            with pytest.raises(Unavailable) as info:
                c.report_nodes(time=T0 + 1, source="w", seq=1, idle=["n1"])
        text = str(info.value)
        assert "cannot be written" in text and cfg.state in text, text
        assert "cannot reach" not in text and "start it" not in text, text
        # the CLI prints the daemon's reason in one line
        from typer.testing import CliRunner
        from offcut.client.cli import app
        res = CliRunner().invoke(app, ["cancel", task_id, "--address", cfg.listen],
                                 catch_exceptions=False)
        err = res.stderr.strip()
        assert res.exit_code == 1 and err.count("\n") == 0, (res.exit_code, res.output)
        assert "cannot be written" in err and "start it" not in err, err
    finally:
        srv.stop(0.1)  # the final snapshot cannot be written: one log line, no exception
    assert "stopped without the final snapshot" in caplog.text
    with Running(cfg) as again:  # the lock was released, the file closed
        assert again.status().revision == 1  # the submission; nothing else was acknowledged


def test_check_of_a_state_not_yet_created_passes_as_the_start_does(tmp_path):
    """``offcutd check`` on a path with no file (issue 38; docs/operations.md, "`offcutd
    check`"): the start creates a new state there, so check notes it and exits 0 when the
    folder passes the start's checks (also a folder still to be created), and FAILs, exit 1,
    where the start refuses (a folder writable by others)."""
    cfg = _config(tmp_path / "a")
    check = _offcutd("check", "--state", cfg.state)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"note: {cfg.state}: no such file; offcutd creates a new, empty state" in check.stdout
    assert "FAIL" not in check.stdout and not Path(cfg.state).exists()  # read-only: nothing made
    with Running(cfg) as c:  # and the start does create it
        assert c.status().revision == 0
    assert Path(cfg.state).is_file()

    # a folder that does not exist yet: the start creates it, 0700
    deep = tmp_path / "b" / "c" / "state.sqlite"
    check = _offcutd("check", "--state", str(deep))
    assert check.returncode == 0, check.stdout
    assert f"ok: {deep.parent} does not exist; offcutd creates it" in check.stdout
    assert not (tmp_path / "b").exists()
    cfg_deep = DaemonConfig(listen=f"unix://{tmp_path}/d.sock", state=str(deep), solver="dp",
                            clock="live")
    with Running(cfg_deep):
        pass
    assert deep.is_file() and (deep.parent.stat().st_mode & 0o777) == 0o700

    # a folder writable by others: the start refuses, so does check
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    state = shared / "state.sqlite"
    check = _offcutd("check", "--state", str(state))
    assert check.returncode == 1, check.stdout
    assert "FAIL: state folder" in check.stdout and "writable by group or others" in check.stdout
    start = _offcutd("--state", str(state), "--listen", f"unix://{tmp_path}/e.sock",
                     "--solver", "dp")
    assert start.returncode == 1 and "writable by group or others" in start.stderr, start.stderr
    assert not state.exists()


@needs_setpriv
def test_a_damaged_format_number_is_refused_in_one_line(tmp_path):
    """``meta``'s schema_version that is not a number (an edited or damaged file): the start
    and ``offcutd check`` refuse it in one line naming it, no traceback."""
    cfg = _config(tmp_path / "a")
    _made_state(cfg)
    db = sqlite3.connect(cfg.state)
    with db:
        db.execute("UPDATE meta SET value = '4x' WHERE key = 'schema_version'")
    db.close()
    out = _offcutd("check", "--state", cfg.state)
    assert out.returncode == 1 and "meta schema_version '4x' is not a format number" in \
        out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    start = _offcutd("--state", cfg.state, "--listen", cfg.listen, "--solver", "dp")
    assert start.returncode == 1 and "is not a format number" in start.stderr, start.stderr
    assert "Traceback" not in start.stderr

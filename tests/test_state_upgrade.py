"""State-file formats (CHANGELOG.md; offcut.daemon.app.migrations, offcut.daemon.app.state_file): format 4
is the first released one; a state file of a later released format is upgraded in place
through the registry of upgrades (one per format step, each in its own transaction, after a
copy), shown here with a synthetic format 5; a file of a pre-release format (1-3) is refused
in one line naming its format and what to do, and left as it was. Real SQLite files written
by a real daemon (``conftest.Daemons``), real ``offcutd`` subprocesses."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from offcut.daemon.app import migrations, state_file
from offcut.daemon.edge.server import OffcutServer
from offcut.daemon.app.state_file import (FIRST_RELEASED_FORMAT, SCHEMA_VERSION, StoreError,
                                         format_refusal)
from offcut.daemon.app.store import Store

from daemon_helpers import T0, make_spec

OFFCUTD = [sys.executable, "-m", "offcut.daemon"]

pytestmark = pytest.mark.replay_clock


def _offcutd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(OFFCUTD + list(args), capture_output=True, text=True, timeout=120)


def _written_by_a_daemon(daemons, name: str = "a") -> tuple[Path, dict]:
    """A state file written by a real daemon of this tree (node events, a submission, rows
    after the stop's snapshot are none: a clean stop), and what it answered about it."""
    srv, client = daemons.start(name, snapshot_every=3)
    client.report_nodes(time=T0, source="w", seq=1, idle=["n1", "n2", "n3"])
    task = client.submit(make_spec("t", max_nodes=3), submit_time=T0 + 1).task
    client.report_nodes(time=T0 + 10, source="w", seq=2, preempted=["n1"])
    client.report_nodes(time=T0 + 20, source="w", seq=3, idle=["n4"])
    seen = {"revision": client.status().revision,
            "task": (task.task_id, list(client.get_task(task.task_id).nodes))}
    path = Path(srv.config.state)
    daemons.stop(srv)
    return path, seen


def _meta(path: Path) -> tuple[str, int]:
    """``(meta schema_version, PRAGMA user_version)`` of the file."""
    db = sqlite3.connect(path)
    try:
        return (db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0],
                db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- the mechanism
def test_a_next_format_registered_as_an_upgrade_is_applied_once_after_a_copy(
        daemons, monkeypatch, caplog):
    """A synthetic format 5 (``SCHEMA_VERSION`` 5, ``UPGRADES[4]`` registered): the daemon
    opening a format-4 file written by a real daemon runs the upgrade once, in place, after
    saving the file as it was (``state.sqlite.format4.bak``, 0600), stamps format 5 and loads
    the same state; a second start finds format 5 and upgrades nothing."""
    path, seen = _written_by_a_daemon(daemons)
    assert _meta(path) == (str(FIRST_RELEASED_FORMAT), FIRST_RELEASED_FORMAT) == ("4", 4)
    calls = []

    def upgrade_4_to_5(db: sqlite3.Connection) -> None:
        calls.append(db.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                                ).fetchone()[0])
        db.execute("ALTER TABLE task_archive ADD COLUMN note TEXT")
        db.execute("INSERT INTO meta VALUES ('synthetic', 'format 5')")

    monkeypatch.setattr(state_file, "SCHEMA_VERSION", 5)
    monkeypatch.setitem(migrations.UPGRADES, 4, upgrade_4_to_5)  # offcutd's own registry
    caplog.set_level(logging.INFO, logger="offcut.daemon")
    srv, client = daemons.start("a")
    assert calls == ["4"]  # run once, on the format-4 file
    assert client.status().revision == seen["revision"]
    task_id, nodes = seen["task"]
    assert list(client.get_task(task_id).nodes) == nodes
    assert any("upgraded from format 4 to 5" in r.getMessage() for r in caplog.records)
    daemons.stop(srv)

    assert _meta(path) == ("5", 5)
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'synthetic'").fetchone() == (
            "format 5",)
        assert "note" in [r[1] for r in db.execute("PRAGMA table_info(task_archive)")]
    finally:
        db.close()
    backup = path.with_name("state.sqlite.format4.bak")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert _meta(backup) == ("4", 4)

    _, client = daemons.start("a")  # format 5 now: nothing to upgrade
    assert calls == ["4"] and client.status().revision == seen["revision"]


def test_a_failing_upgrade_leaves_the_file_as_it_was(daemons, monkeypatch):
    """An upgrade that raises half-way is rolled back: the daemon does not start, the file
    is still format 4 without the upgrade's change, and it loads again without the upgrade."""
    path, seen = _written_by_a_daemon(daemons)

    def broken(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO meta VALUES ('synthetic', 'half-way')")
        raise RuntimeError("the upgrade found something it cannot convert")

    monkeypatch.setattr(state_file, "SCHEMA_VERSION", 5)
    with pytest.raises(RuntimeError, match="cannot convert"):
        Store(path, upgrades={4: broken})
    assert _meta(path) == ("4", 4)
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'synthetic'").fetchone() is None
    finally:
        db.close()
    monkeypatch.setattr(state_file, "SCHEMA_VERSION", 4)
    _, client = daemons.start("a")
    assert client.status().revision == seen["revision"]


def test_a_released_format_without_its_upgrade_is_refused(daemons, monkeypatch):
    path, _ = _written_by_a_daemon(daemons)
    monkeypatch.setattr(state_file, "SCHEMA_VERSION", 5)
    with pytest.raises(StoreError, match="state-file format 4, this offcutd writes 5"):
        Store(path, upgrades={})
    assert _meta(path) == ("4", 4)


def test_offcutd_registers_no_upgrade_while_format_4_is_the_newest():
    assert SCHEMA_VERSION == FIRST_RELEASED_FORMAT == 4
    assert migrations.UPGRADES == {}


# ----------------------------------------------------------------------------- pre-release
def _as_pre_release(path: Path, version: int) -> None:
    """Mark a state file as pre-release format ``version`` (1-3: what a pre-release build
    wrote has no ``journal.sha256``; the refusal reads only the format)."""
    db = sqlite3.connect(path)
    try:
        with db:
            db.execute("ALTER TABLE journal DROP COLUMN sha256")
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
        db.execute(f"PRAGMA user_version = {version}")
    finally:
        db.close()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_pre_release_format_is_refused_in_one_line_and_left_as_it_was(daemons, version):
    """The daemon's start, ``offcutd`` and ``offcutd check`` refuse a pre-release file in one
    line naming its format, the first released one and what to do; nothing is written to it
    (no upgrade, no copy, the same bytes)."""
    path, _ = _written_by_a_daemon(daemons)
    _as_pre_release(path, version)
    before = _digest(path)
    line = format_refusal(path, version)
    assert line and "\n" not in line
    assert f"state-file format {version} was written by a pre-release Offcut" in line
    assert "before 0.1.0, whose state format is 4" in line
    assert "move it aside and start offcutd on a new state file" in line

    with pytest.raises(StoreError) as err:
        OffcutServer(daemons.config("a"))
    assert str(err.value) == line

    folder = path.parent
    res = _offcutd("--state", str(path), "--listen", f"unix://{folder}/s.sock")
    assert res.returncode != 0 and line in res.stderr and "Traceback" not in res.stderr
    check = _offcutd("check", "--state", str(path))
    assert check.returncode != 0 and f"FAIL: {line}" in check.stdout, check.stdout

    assert _digest(path) == before
    assert not list(folder.glob("*.bak"))
    assert _meta(path) == (str(version), version)

"""Journal rows carry a sha256 (issue 37, finding 8; docs/architecture.md, "Journal and snapshots";
docs/operations.md, "Start-up checks and refusals"): a row edited after it was written is never
re-applied (the daemon's start refuses in one line naming the row, ``offcutd check`` FAILs
naming it), and untouched rows load. Real SQLite files, real ``Store``, real ``OffcutServer``
and ``offcutd`` subprocesses."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.daemon.app.store import Store
from offcut.daemon.app.state_file import StoreError
from offcut.daemon.app.journal import journal_checksum

from daemon_helpers import T0

OFFCUTD = [sys.executable, "-m", "offcut.daemon"]


def _config(folder: Path) -> DaemonConfig:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return DaemonConfig(listen=f"unix://{folder}/s.sock", state=str(folder / "state.sqlite"),
                        solver="dp", clock="live")


def _offcutd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(OFFCUTD + list(args), capture_output=True, text=True, timeout=120)


def _made_state(cfg: DaemonConfig, events: int = 3) -> None:
    """A state file written by a real daemon: ``events`` node events (journal rows 1..N), then
    the stop's snapshot at row N."""
    from offcut.client import Client
    srv = OffcutServer(cfg)
    srv.start()
    try:
        with Client(cfg.listen, timeout_s=10) as c:
            for i in range(1, events + 1):
                c.report_nodes(time=T0 + i, source="w", seq=i, idle=[f"n{i}"])
    finally:
        srv.stop(0.1)


def _sql(path: str | Path, *statements: tuple) -> None:
    db = sqlite3.connect(path)
    try:
        with db:
            for statement in statements:
                db.execute(*statement)
    finally:
        db.close()


def _store_with_rows(path: Path, n: int = 5) -> None:
    """``n`` journal rows appended by a real ``Store`` (no snapshot), closed."""
    store = Store(path, durability="normal")
    try:
        for i in range(1, n + 1):
            store.append(kind="nodes", event={"kind": "nodes", "time": T0 + i, "seq": i},
                         solves=[{"counts": [i]}], response=b'{"format":2,"n":%d}' % i,
                         source="w", seq=i)
    finally:
        store.close()


def _replay(store: Store) -> list[tuple[dict, list[dict]]]:
    state, rows = store.load()
    return list(rows)


# ----------------------------------------------------------------------------- edited rows
def test_the_daemon_and_offcutd_check_refuse_an_edited_row_replayed_after_a_fallback(tmp_path):
    """The finding's case: the newest snapshot is corrupt, so the start falls back to the
    journal, and row 2 was edited with sqlite3 (another node made idle): refused, in one
    line naming row 2 and the recovery step, by the daemon and by ``offcutd check``."""
    cfg = _config(tmp_path / "a")
    _made_state(cfg)
    _sql(cfg.state, ("UPDATE snapshots SET state = '{\"broken\": true}' WHERE journal_id = "
                     "(SELECT MAX(journal_id) FROM snapshots)",),  # its sha256 no longer matches
         ("UPDATE journal SET event = replace(event, '\"n2\"', '\"evil\"') WHERE id = 2",))
    with pytest.raises(StoreError) as info:
        OffcutServer(cfg)
    assert "journal row 2 is damaged" in str(info.value), info.value
    assert "restore a backup" in str(info.value)

    start = _offcutd("--state", cfg.state, "--listen", cfg.listen, "--solver", "dp")
    lines = [line for line in start.stderr.splitlines() if line.startswith("offcutd:")]
    assert start.returncode == 1, start.stderr
    assert len(lines) == 1 and "journal row 2 is damaged" in lines[0], start.stderr
    assert "sha256 does not match" in lines[0] and "restore a backup" in lines[0]
    assert "Traceback" not in start.stderr

    check = _offcutd("check", "--state", cfg.state)
    assert check.returncode == 1, check.stdout
    fails = [line for line in check.stdout.splitlines() if line.startswith("FAIL:")]
    assert fails == [f for f in fails if "journal row 2 is damaged" in f] and fails, check.stdout


@pytest.mark.parametrize("column, edit", [
    ("event", "replace(event, '\"seq\":3', '\"seq\":30')"),
    ("solves", "'[{\"counts\":[99]}]'"),
    ("response", "CAST('{\"format\":2,\"n\":42}' AS BLOB)"),
])
def test_a_store_refuses_to_replay_a_row_edited_in_any_column(tmp_path, column, edit):
    """Every content column is covered: an edit that is still valid JSON (so nothing but the
    checksum can tell) stops the replay at that row with a StoreError naming it."""
    path = tmp_path / "s" / "state.sqlite"
    _store_with_rows(path)
    _sql(path, (f"UPDATE journal SET {column} = {edit} WHERE id = 3",))
    store = Store(path)
    try:
        with pytest.raises(StoreError, match=r"journal row 3 is damaged \(its sha256 does not "
                                             r"match its content"):
            _replay(store)
    finally:
        store.close()


def test_a_rows_checksum_covers_its_id(tmp_path):
    """The sum is over the row's id too: the same content under another id does not match
    (a row copied or moved over another is refused)."""
    content = ("nodes", "w", 1, None, '{"a":1}', "[]", b"{}")
    assert journal_checksum(1, *content) != journal_checksum(2, *content)
    assert journal_checksum(1, *content) != journal_checksum(1, "nodes", "w", 1, "",
                                                           '{"a":1}', "[]", b"{}")  # NULL != ""
    path = tmp_path / "s" / "state.sqlite"
    _store_with_rows(path, n=3)
    db = sqlite3.connect(path)
    try:
        with db:  # rows 2 and 3 swapped, each with its own (once right) sum
            two, three = db.execute("SELECT kind, source, seq, request_id, event, solves, "
                                    "response, sha256 FROM journal WHERE id IN (2, 3) "
                                    "ORDER BY id").fetchall()
            db.execute("DELETE FROM journal WHERE id IN (2, 3)")
            db.execute("INSERT INTO journal VALUES (2, ?, ?, ?, ?, ?, ?, ?, ?)", three)
            db.execute("INSERT INTO journal VALUES (3, ?, ?, ?, ?, ?, ?, ?, ?)", two)
    finally:
        db.close()
    store = Store(path)
    try:
        with pytest.raises(StoreError, match=r"journal row 2 is damaged"):
            _replay(store)
    finally:
        store.close()


def test_an_edited_row_before_the_start_snapshot_is_a_note_and_the_daemon_starts(tmp_path):
    """A row the daemon does not re-apply (before the snapshot it starts from) does not stop
    the start; ``offcutd check`` names it in a note and exits 0."""
    cfg = _config(tmp_path / "a")
    _made_state(cfg)
    _sql(cfg.state, ("UPDATE journal SET response = CAST('{}' AS BLOB) WHERE id = 1",))
    check = _offcutd("check", "--state", cfg.state)
    assert check.returncode == 0, check.stdout
    assert "note: 1 journal rows up to row 3 are damaged" in check.stdout, check.stdout
    assert "rows 1)" in check.stdout
    srv = OffcutServer(cfg)
    try:
        assert srv.engine.scheduler.revision == 3
    finally:
        srv.stop(0.1)


# ----------------------------------------------------------------------------- untouched rows
def test_untouched_rows_carry_their_checksum_and_load(tmp_path):
    """Every row a real daemon writes has the sha256 of its id and columns; with the
    snapshots gone the whole journal is re-applied to the same revision, and ``offcutd
    check`` says the re-applied rows check out."""
    cfg = _config(tmp_path / "a")
    _made_state(cfg, events=4)
    db = sqlite3.connect(cfg.state)
    try:
        rows = db.execute("SELECT id, kind, source, seq, request_id, event, solves, response, "
                          "sha256 FROM journal ORDER BY id").fetchall()
    finally:
        db.close()
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert all(r[-1] == journal_checksum(*r[:-1]) for r in rows), rows
    _sql(cfg.state, ("DELETE FROM snapshots",))  # replayed from row 1
    check = _offcutd("check", "--state", cfg.state)
    assert check.returncode == 0 and "ok: journal rows after row 0" in check.stdout, check.stdout
    srv = OffcutServer(cfg)
    try:
        assert srv.engine.scheduler.revision == 4
        assert sorted(srv.engine.scheduler.pool) == ["n1", "n2", "n3", "n4"]
    finally:
        srv.stop(0.1)

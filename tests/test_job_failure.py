"""The last lines of a failed run's stderr in the launcher's report
(offcut.slurm_plugin.job_failure; docs/execution.md, "Wasted work"): bounded, safe for a
terminal, only the reported job's, and read with the rights of the job's user, never root's
(a link or a FIFO planted in the owner's checkpoint folder reveals nothing and hangs nothing).
The real cluster: tests/test_slurm_user_mistakes.py."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.job_failure import (MAX_TAIL_CHARS, SEPARATOR, read_note,
                                             stderr_tail, tail_of)
from offcut.slurm_plugin.job_submission import batch_script, job_environment
from offcut.slurm_plugin.launch_types import Generation
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.node_run import FAILURE_FILE, failure_note
from offcut.slurm_plugin.owners import Account

NOBODY = Account(name="nobody", uid=65534, gid=65534, home="/", switch=True)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root")


def test_only_the_reported_jobs_note_counts():
    note = failure_note("12", 0, 127, ["bash: /nonexistent/python3: No such file or directory"])
    assert tail_of(note, "12") == "bash: /nonexistent/python3: No such file or directory"
    assert tail_of(note, "1") == "" and tail_of(note, "123") == ""
    assert tail_of(b"job 12 and more\nline", "12") == ""   # not a note's first line
    assert tail_of(b"", "12") == "" and tail_of(failure_note("12", 0, 1, []), "12") == ""


def test_the_tail_is_the_last_lines_within_the_bound_and_safe_for_a_terminal():
    lines = [f"line {i}" for i in range(200)] + ["\x1b]0;pwned\x07 RuntimeError: boom 42"]
    tail = tail_of(failure_note("5", 1, 1, lines), "5")
    assert len(tail) <= MAX_TAIL_CHARS
    parts = tail.split(SEPARATOR)
    assert parts[-1] == "\\x1b]0;pwned\\x07 RuntimeError: boom 42" and "\x1b" not in tail
    assert parts[:-1] == [f"line {i}" for i in range(200 - len(parts) + 1, 200)]
    assert len(tail + SEPARATOR + "line 0") > MAX_TAIL_CHARS - 10  # as many as fit
    # one escaped line longer than the bound alone: its start
    long = tail_of(failure_note("5", 0, 1, ["\x07" * 300]), "5")
    assert len(long) == MAX_TAIL_CHARS and long.startswith("\\x07") and long.endswith("...")


@pytest.fixture
def owners_folder():
    """A checkpoint folder of ``nobody`` (0700) below a folder everyone may pass."""
    top = Path(tempfile.mkdtemp(prefix="offcut-job-failure-"))
    top.chmod(0o755)
    folder = top / "t000001-abc"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY.uid, NOBODY.gid)
    yield folder
    shutil.rmtree(top)


@as_root
def test_the_owners_note_is_read_as_the_owner(owners_folder):
    note = owners_folder / FAILURE_FILE
    note.write_bytes(failure_note("77", 0, 1, ["Traceback (most recent call last):",
                                              "RuntimeError: boom 42"]))
    os.chown(note, NOBODY.uid, NOBODY.gid)
    note.chmod(0o600)
    assert stderr_tail(owners_folder, "77", NOBODY) == \
        "Traceback (most recent call last): | RuntimeError: boom 42"


@as_root
def test_a_planted_link_or_a_file_only_root_may_read_reveals_nothing(owners_folder):
    secret = owners_folder.parent / "secret"   # root's, 0600: as /etc/shadow
    secret.write_bytes(failure_note("77", 0, 1, ["root:$6$secret-hash"]))
    secret.chmod(0o600)
    note = owners_folder / FAILURE_FILE
    note.symlink_to(secret)
    assert stderr_tail(owners_folder, "77", NOBODY) == ""
    note.unlink()
    shutil.copy(secret, note)                   # a note root could read, but the owner not
    note.chmod(0o600)
    assert read_note(note, None) != b""         # (root can)
    assert stderr_tail(owners_folder, "77", NOBODY) == ""


@as_root
def test_a_fifo_or_a_device_as_the_note_hangs_nothing(owners_folder):
    note = owners_folder / FAILURE_FILE
    os.mkfifo(note, 0o600)
    os.chown(note, NOBODY.uid, NOBODY.gid)
    t0 = time.monotonic()
    assert stderr_tail(owners_folder, "77", NOBODY) == ""
    fd = os.open(note, os.O_RDWR | os.O_NONBLOCK)  # a writer that never writes
    try:
        assert stderr_tail(owners_folder, "77", NOBODY) == ""
    finally:
        os.close(fd)
    assert time.monotonic() - t0 < 20
    assert read_note("/dev/zero", NOBODY) == b"\0" * 8192  # bounded: one block
    assert read_note("/dev/zero", NOBODY, timeout_s=0.0) == b""


def test_no_secret_of_the_launcher_is_in_a_jobs_environment(tmp_path):
    """What the note can hold is what the owner's processes could see: the job's environment
    (its batch script's exports and the variables sbatch passes) has no token, no launcher
    key path and no MUNGE key."""
    key_path = tmp_path / "launcher.key"
    cfg = SlurmConfig(launcher_key=str(key_path), checkpoint_root=str(tmp_path / "ckpt"))
    key = LauncherKey.load(str(key_path))
    environ = {"PATH": "/usr/bin", "OFFCUT_TOKEN": "tok-secret", "OFFCUT_TOKEN_FILE": "/t",
               "OFFCUT_TOKEN_X": "tok2", "MUNGE_KEY": "/etc/munge/munge.key",
               "OFFCUT_LAUNCHER_KEY": str(key_path)}
    gen = Generation("t000001", "job", 3, ("n1", "n2"), ("python", "train.py"), owner="u")
    account = Account(name="u", uid=1000, gid=1000, home="/home/u", switch=True)
    script = batch_script(cfg, gen, "n1", address="unix:///run/offcut.sock",
                          master_addr="n1", account=account, key=key)
    env = job_environment(cfg, environ, account)
    text = script + "\n".join(f"{k}={v}" for k, v in env.items())
    assert "OFFCUT_TOKEN" not in text and "tok-secret" not in text and "tok2" not in text
    assert "MUNGE" not in text and "munge.key" not in text
    assert str(key_path) not in text and key_path.read_text().strip() not in text

"""Checkpoint folders cannot be steered (issue 37, finding 4; docs/execution.md, "Whose job it
is"): the job makes its task's folder along the whole path with no link and no other user's
folder on it (offcut.slurm_plugin.node_run.make_private_dir), and the folder's name carries
16 hex characters of the launcher's key, so another user cannot pre-create it. Real files
(the tests run as root, so other users' folders are made with chown); the real cluster with a
real local user at the end."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemon_helpers import make_spec
from slurm_cluster import made_local_user

from offcut.client import Client
from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin import node_run
from offcut.slurm_plugin.job_submission import checkpoint_dir
from offcut.slurm_plugin.launcher import Launcher
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.node_run import UnsafeFolder, make_private_dir
from offcut.slurm_plugin.owners import Account
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

OWNER, OTHER = 1500, 1600
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes folders of other users (root)")


def test_missing_folders_are_made_private_and_an_existing_one_is_made_0700(tmp_path):
    target = tmp_path / "scratch" / "u" / "ck" / "t1-abc"
    make_private_dir(str(target))
    for p in (target, target.parent, target.parent.parent):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    target.chmod(0o755)
    make_private_dir(str(target))  # again: fine, and private once more
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_a_link_anywhere_on_the_path_is_refused(tmp_path):
    """The finding: a link planted at ``/scratch/USER`` passed ``[ ! -L ]`` (which looks at
    the last component only) and the checkpoints landed in the attacker's tree."""
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    (tmp_path / "scratch").mkdir()
    os.symlink(attacker, tmp_path / "scratch" / "alice")
    with pytest.raises(UnsafeFolder, match=r"scratch/alice is a link"):
        make_private_dir(str(tmp_path / "scratch" / "alice" / "offcut" / "ckpt" / "t1-x"))
    assert not any(attacker.iterdir())  # nothing made in the attacker's tree
    os.symlink(attacker, tmp_path / "last")
    with pytest.raises(UnsafeFolder, match="is a link"):
        make_private_dir(str(tmp_path / "last"))
    with pytest.raises(UnsafeFolder, match="not an absolute"):
        make_private_dir("relative/t1")
    with pytest.raises(UnsafeFolder, match=r"'\.\.'"):
        make_private_dir(str(tmp_path / "a" / ".." / "b"))


@needs_root
def test_folders_of_other_users_are_refused(tmp_path):
    root = tmp_path / "shared"
    root.mkdir(mode=0o755)
    # another user's folder above the task's: they could swap what is below it
    theirs = root / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(UnsafeFolder, match="belongs to uid 1600, neither root nor"):
        make_private_dir(str(theirs / "t1-x"), uid=OWNER)
    # the task's folder pre-created by another user
    planted = root / "t000042"
    planted.mkdir()
    os.chown(planted, OTHER, OTHER)
    with pytest.raises(UnsafeFolder, match="belongs to uid 1600, not to the task's owner"):
        make_private_dir(str(planted), uid=OWNER)
    # a folder others may write into that is not sticky
    loose = root / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(UnsafeFolder, match="writable by group or others and not sticky"):
        make_private_dir(str(loose / "t1-x"), uid=OWNER)
    # a sticky shared root (like /tmp) is fine
    sticky = root / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    make_private_dir(str(sticky / "t1-x"), uid=0)


def test_the_supervisor_refuses_an_unsafe_folder_and_runs_nothing(tmp_path):
    """The batch script runs ``node_run.py --checkpoint-dir PATH``: exit 1 with one line."""
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    os.symlink(attacker, tmp_path / "u")
    marker = tmp_path / "ran"
    proc = subprocess.run(
        [sys.executable, "-I", str(Path(node_run.__file__)), "--procs", "1", "--node-rank", "0",
         "--num-nodes", "1", "--checkpoint-dir", str(tmp_path / "u" / "ck" / "t1-x"), "--",
         f"touch {marker}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("offcut: cannot use the checkpoint folder:")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not any(attacker.iterdir())


def test_checkpoint_folder_names_cannot_be_guessed_and_stay_the_task_s(tmp_path):
    """``t000042`` pre-created by another user in a shared root no longer blocks the task:
    the folder is ``t000042-<16 hex of the launcher key>``, the same for every generation
    and launcher restart (same key file), different for another key or owner."""
    cfg = SlurmConfig(checkpoint_root=str(tmp_path / "shared"))
    alice = Account("alice", OWNER, OWNER, "/home/alice", True)
    key = LauncherKey.load(tmp_path / "k1")
    path = checkpoint_dir(cfg, "t000042", alice, key)
    assert path.parent == tmp_path / "shared" and path.name.startswith("t000042-")
    assert len(path.name) == len("t000042-") + 16
    assert checkpoint_dir(cfg, "t000042", alice, LauncherKey.load(tmp_path / "k1")) == path
    assert checkpoint_dir(cfg, "t000042", alice, LauncherKey.load(tmp_path / "k2")) != path
    bob = Account("bob", 1501, 1501, "/home/bob", True)
    assert checkpoint_dir(cfg, "t000042", bob, key) != path


# ----------------------------------------------------------------------------- real Slurm
def planted(tree: Path) -> list[Path]:
    """Checkpoint folders or files of a task in ``tree``."""
    return [p for p in tree.rglob("*") if p.name.startswith(("offcut-checkpoints", "ckpt-"))]


@pytest.mark.slow
def test_a_link_planted_at_the_owners_scratch_folder_does_not_get_the_checkpoints(
        slurm, cluster_daemon, tmp_path):
    """The finding on the real cluster, as the docs' example sets it up (``workdir =
    /scratch/%u/offcut``, the owner's ``/scratch/USER`` not made yet): another user plants a
    link there to a tree of theirs. Was: the job's ``mkdir -p`` followed it and the task's
    checkpoints landed in that tree. Now the job refuses the folder (exit 1), writes nothing
    there, and the task fails its generations instead."""
    srv, client = cluster_daemon
    with made_local_user(slurm) as owner:
        scratch = Path(f"/tmp/offcut-scratch-{os.getpid()}-{time.monotonic_ns()}")
        scratch.mkdir(mode=0o755)
        try:
            attacker = scratch / "attacker-tree"
            (attacker / "offcut").mkdir(parents=True)
            for p in (attacker, attacker / "offcut"):
                os.chown(p, 64999, 64999)  # another user's
                p.chmod(0o777)
            os.symlink(attacker, scratch / owner.pw_name)
            client.sync_nodes(time.time(), "slurm-watch", 1, idle=["n1", "n2", "n3", "n4"])
            tid = client.submit(
                make_spec("steered", max_nodes=1, ns=(0, 1), ps=(0.0, 1.0),
                          command=["bash", "-c", 'touch "$OFFCUT_CHECKPOINT_DIR/ckpt-1.pt"; '
                                                 'exit 75']),
                owner=owner.pw_name).task.task_id
            cfg = SlurmConfig(workdir=str(scratch / "%u" / "offcut"), rescale_grace_s=5)
            with Client(client.address, timeout_s=10) as launcher_client:
                launcher = Launcher(launcher_client, cfg, SlurmCLI(slurm_conf=str(slurm.conf)))
                stop = threading.Event()
                th = threading.Thread(target=launcher.run, args=(0.5, stop), daemon=True)
                th.start()
                try:
                    slurm.wait_for(lambda: client.get_task(tid).failed_runs >= 1
                                   or planted(attacker), timeout=90,
                                   what="the steered task's run to fail")
                finally:
                    stop.set()
                    th.join(10)
            found = planted(attacker)
            assert not found, found  # no checkpoint folder or file in the attacker's tree
            task = client.get_task(tid)
            assert task.state != TaskState.COMPLETED
            outs = "".join(p.read_text(errors="replace") for p in attacker.rglob("*.out"))
            assert "cannot use the checkpoint folder" in outs and "is a link" in outs
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(scratch)], check=False)

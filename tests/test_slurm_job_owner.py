"""Whose job it is (issue 37, finding 1; docs/execution.md, "Whose job it is"): a job named
like one of Offcut's counts for a task only if Slurm says it runs as the task's owner and the
launcher submitted it (its job id, or its key's tag in the comment). Fake Slurm JSON with a
real daemon; the real cluster: tests/test_slurm_run_as_owner.py. And the launcher's key file
(offcut.slurm_plugin.launcher_key)."""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest

from test_slurm_launcher import ALL, CFG, OWNERS, FakeSlurm, spec
from test_slurm_launcher import placed  # noqa: F401 - a fixture

from offcut.slurm_plugin.launcher import Launcher
from offcut.slurm_plugin.launcher_key import LauncherKey, LauncherKeyError, default_key_path
from offcut.slurm_plugin.owners import OwnerAccounts, RunAsPolicy
from offcut.slurm_plugin.slurm_json import parse_sacct
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

MALLORY = 1600  # another user of the cluster (the task's owner "test" is uid 1500)


def lookalike(slurm: FakeSlurm, name: str, *, uid: int = MALLORY, comment: str = "",
              state: str = "COMPLETED", node: str = "n1") -> str:
    """Another user's own job in the partition, named like one of Offcut's."""
    slurm.next_id += 1
    jid = str(slurm.next_id)
    slurm.jobs[jid] = {"job_id": int(jid), "name": name, "partition": CFG.partition,
                       "job_state": state, "nodes": node, "exit_code": 0, "user_id": uid,
                       "user_name": "mallory", "comment": comment,
                       "submit_time": int(time.time())}
    return jid


@pytest.fixture
def running(placed):
    """The task runs on its four nodes, its starts reported."""
    client, tid = placed
    slurm = FakeSlurm()
    launcher = Launcher(client, CFG, slurm, accounts=OWNERS)
    launcher.reconcile()
    launcher.reconcile()
    assert client.get_task(tid).launches == 4
    return client, tid, slurm, launcher


def test_another_users_ended_lookalike_does_not_complete_the_task(running, caplog):
    """The finding: mallory's own job ``offcut-t000001.1-n1`` that ended COMPLETED made the
    owner's running task COMPLETED while its four jobs still ran."""
    client, tid, slurm, launcher = running
    real = dict(slurm.active())
    fake = lookalike(slurm, f"offcut-{tid}.1-n1")
    # even with the real job's comment copied: the tag binds the uid
    copied = lookalike(slurm, f"offcut-{tid}.1-n2",
                       comment=slurm.jobs[real["n2"]]["comment"], state="RUNNING", node="n2")
    with caplog.at_level(logging.WARNING, "offcut.slurm.launcher"):
        r = launcher.reconcile()
        launcher.reconcile()
    task = client.get_task(tid)
    assert task.state == TaskState.RUNNING and task.generation == 1
    assert not r.reported and not r.cancelled and not r.signalled and not r.submitted
    assert all(slurm.jobs[j]["job_state"] == "RUNNING" for j in real.values())
    assert not slurm.signals  # neither is stopped nor cancelled by the launcher
    assert slurm.jobs[copied]["job_state"] == "RUNNING"
    warnings = [m for m in caplog.messages if "not this launcher's" in m]
    assert len(warnings) == 2  # logged once each, not every pass
    assert any(fake in m and "uid 1600" in m for m in warnings)


def test_a_restarted_launcher_adopts_only_its_own_tagged_jobs(running):
    """After a restart the ids are gone: the key's tag tells its jobs from the owner's own
    look-alike (no tag) and from another user's job carrying a copied tag."""
    client, tid, slurm, _ = running
    real = dict(slurm.active())
    mine_untagged = lookalike(slurm, f"offcut-{tid}.1-n3", uid=1500, state="RUNNING", node="n3")
    copied = lookalike(slurm, f"offcut-{tid}.1-n4", comment=slurm.jobs[real["n4"]]["comment"],
                       state="RUNNING", node="n4")
    again = Launcher(client, CFG, slurm, accounts=OWNERS)
    r = again.reconcile()
    assert r.adopted == 4 and not r.submitted and not r.cancelled
    assert set(again.ownership.mine) == set(real.values())
    assert {mine_untagged, copied} <= again.ownership.ignored
    # a job of a task that no longer runs is stopped only when it is the launcher's
    client.cancel(tid)
    r = again.reconcile()
    assert sorted(j for _, _, j in r.signalled + r.cancelled) == sorted(real.values())
    assert slurm.jobs[copied]["job_state"] == "RUNNING"
    assert slurm.jobs[mine_untagged]["job_state"] == "RUNNING"
    assert not any(j in (copied, mine_untagged) for j, _ in slurm.signals)


def test_accounting_records_of_another_user_are_ignored(placed):
    """A restarted launcher looks up in sacct the jobs squeue no longer shows: mallory's
    ended look-alike there (UID 1600) is neither reported nor taken as submitted."""
    client, tid = placed
    slurm = FakeSlurm()
    lookalike(slurm, f"offcut-{tid}.1-n1")
    slurm.forget_ended()
    launcher = Launcher(client, CFG, slurm, accounts=OWNERS)
    r = launcher.reconcile()
    assert slurm.sacct_calls  # it asked
    assert not r.reported and sorted(n for _, n, _ in r.submitted) == ALL
    assert client.get_task(tid).state == TaskState.RUNNING


def test_an_accounting_record_without_a_user_id_is_not_the_tasks(placed):
    client, tid = placed
    slurm = FakeSlurm()
    jid = lookalike(slurm, f"offcut-{tid}.1-n1", uid=1500)
    slurm.jobs[jid].pop("user_id")
    slurm.forget_ended()
    r = Launcher(client, CFG, slurm, accounts=OWNERS).reconcile()
    assert not r.reported and len(r.submitted) == 4


def test_as_the_launchers_account_only_its_uid_counts(daemon):
    """``run_as_owner = false``: the jobs run as the launcher's account, so a job of another
    uid is not the task's even with the launcher's tag of its name."""
    srv, client = daemon
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tid = client.submit(spec(), owner="test").task.task_id
    slurm = FakeSlurm()
    launcher = Launcher(client, CFG, slurm, accounts=OwnerAccounts(RunAsPolicy(run_as_owner=False)))
    launcher.reconcile()
    name = f"offcut-{tid}.1-n1"
    lookalike(slurm, name, comment=launcher.key.job_tag(name, MALLORY))
    r = launcher.reconcile()
    assert {s for _, _, s in r.reported} == {"started"}
    assert client.get_task(tid).state == TaskState.RUNNING


def test_parse_sacct_reads_the_uid_and_the_former_columns():
    rows = parse_sacct("7|offcut-t1.1-n1|scavenger|COMPLETED|0:0|n1|1795753338|1500\n"
                       "8|offcut-t1.1-n2|scavenger|COMPLETED|0:0|n2|1795753338\n")
    assert [r.uid for r in rows] == [1500, None]


# ----------------------------------------------------------------------------- the key file
def test_the_key_is_made_private_once_and_read_back(tmp_path):
    path = tmp_path / "state" / "launcher.key"
    key = LauncherKey.load(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = LauncherKey.load(path)
    assert again.job_tag("offcut-t1.1-n1", 1500) == key.job_tag("offcut-t1.1-n1", 1500)
    assert again.is_tag(key.job_tag("offcut-t1.1-n1", 1500), "offcut-t1.1-n1", 1500)
    assert not again.is_tag(key.job_tag("offcut-t1.1-n1", 1500), "offcut-t1.1-n1", 1600)
    assert not again.is_tag(key.job_tag("offcut-t1.1-n1", 1500), "offcut-t1.1-n2", 1500)
    other = LauncherKey.load(tmp_path / "other.key")
    assert not other.is_tag(key.job_tag("offcut-t1.1-n1", 1500), "offcut-t1.1-n1", 1500)
    assert default_key_path() == default_key_path()  # (under the tests' $XDG_STATE_HOME)


def test_an_unsafe_key_file_is_refused(tmp_path):
    path = tmp_path / "launcher.key"
    LauncherKey.load(path)
    path.chmod(0o644)
    with pytest.raises(LauncherKeyError, match="mode 0644"):
        LauncherKey.load(path)
    link = tmp_path / "link.key"
    os.symlink(path, link)
    with pytest.raises(LauncherKeyError, match="link"):
        LauncherKey.load(link)
    bad = tmp_path / "bad.key"
    bad.write_text("not hex\n")
    bad.chmod(0o600)
    with pytest.raises(LauncherKeyError, match="hex"):
        LauncherKey.load(bad)

"""Tasks run as their owners (docs/security.md, "Tasks run as their owners"). Was: the launcher ran every user's command as
its own account (``User=slurm`` in the shipped unit). Now it maps a task's owner to a local
account and submits the task's jobs with ``sbatch --uid/--gid`` (docs/security.md); tasks of
owners without a local account, of root, of system and service accounts are not launched and
FAIL with the reason; the job gets the owner's ``HOME``/``USER``, works in the owner's home,
creates its files private to the owner, and gets nothing of the launcher's.

Unit tests on a fake Slurm and a fake user database with a real daemon, and the real 4-node
Slurm 22.05 cluster of tests/slurm_cluster.py with a real local user made for the test
(``useradd``, uid >= 1000; removed at the end)."""

from __future__ import annotations

import os
import pwd
import secrets
import shlex
import stat
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from daemon_helpers import make_spec
from slurm_cluster import made_local_user
from test_slurm_launcher import ALL, FakeSlurm, fake_users, offcut_jobs, passwd

from offcut.client import Client
from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.job_submission import checkpoint_dir, job_workdir
from offcut.slurm_plugin.launcher import Launcher
from offcut.slurm_plugin.owners import Account, OwnerAccounts, OwnerRefused, RunAsPolicy
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

USERS_ACCOUNT = Account("alice", 1500, 1500, "/home/alice", True)
USERS = fake_users(passwd("alice", 1500), passwd("bob", 1501), passwd("carol", 600),
                   passwd("root", 0), passwd("svc", 64030, shell="/usr/sbin/nologin"),
                   passwd("grp0", 1600, gid=0))


def by_uid(uid: int) -> pwd.struct_passwd:
    """The fake database's ``getpwuid`` (alice is 1500)."""
    if uid == 1500:
        return passwd("alice", 1500)
    raise KeyError(uid)


def one_node(name: str, command=("true",)) -> tasks_pb2.TaskSpec:
    return make_spec(name, max_nodes=1, ns=(0, 1), ps=(0.0, 1.0), command=list(command))


# ----------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("owner,policy,launcher_uid,expected", [
    ("alice", RunAsPolicy(), 0, Account("alice", 1500, 1500, "/home/alice", True)),
    ("nosuch", RunAsPolicy(), 0, "task owner 'nosuch' has no local account"),
    ("", RunAsPolicy(), 0, "the task has no owner"),
    ("root", RunAsPolicy(), 0, "task owner 'root' is root (uid 0)"),
    ("carol", RunAsPolicy(), 0, "task owner 'carol' is a system account (uid 600 < [slurm] "
                                "min_uid 1000)"),
    ("carol", RunAsPolicy(min_uid=500), 0, Account("carol", 600, 600, "/home/carol", True)),
    ("svc", RunAsPolicy(), 0, "task owner 'svc' is a service account (login shell "
                              "/usr/sbin/nologin)"),
    ("grp0", RunAsPolicy(), 0, "task owner 'grp0' has root's group as primary group"),
    # an unprivileged launcher (alice's): its own tasks without --uid, nobody else's
    ("alice", RunAsPolicy(), 1500, Account("alice", 1500, 1500, "/home/alice", False)),
    ("bob", RunAsPolicy(), 1500, "task owner 'bob' is not the launcher's own account 'alice', "
                                 "and only root may submit jobs as another user"),
    # run_as_owner = false: the launcher's own account for everyone
    ("nosuch", RunAsPolicy(run_as_owner=False), 0, None),
])
def test_which_account_runs_a_task(owner, policy, launcher_uid, expected):
    accounts = OwnerAccounts(policy, uid=launcher_uid, getpwnam=USERS, getpwuid=by_uid)
    if isinstance(expected, str):
        with pytest.raises(OwnerRefused) as err:
            accounts.account(owner)
        assert str(err.value).startswith(expected)
    else:
        assert accounts.account(owner) == expected
    if isinstance(expected, Account):
        assert expected.sbatch_options() == (["--uid=%d" % expected.uid, "--gid=%d" % expected.gid]
                                             if launcher_uid == 0 else [])


def test_the_real_user_database_refuses_root_system_and_service_accounts():
    """This host's own accounts (Debian: root 0, daemon 1, nobody 65534 with nologin)."""
    accounts = OwnerAccounts(RunAsPolicy(), uid=0)
    for owner, why in (("root", "is root"), ("daemon", "is a system account"),
                       ("nobody", "is a service account"), ("a\0b", "has no local account"),
                       (f"no-such-{secrets.token_hex(4)}", "has no local account")):
        with pytest.raises(OwnerRefused, match=why):
            accounts.account(owner)
    assert OwnerAccounts(RunAsPolicy(), uid=0).privileged
    assert "tasks run as their owners" in OwnerAccounts(RunAsPolicy(), uid=0).describe()[1]
    assert OwnerAccounts(RunAsPolicy(run_as_owner=False), uid=0).describe()[0] is False


def test_the_policy_comes_from_the_slurm_section():
    assert RunAsPolicy.of(SlurmConfig()) == RunAsPolicy(run_as_owner=True, min_uid=1000)
    section = SimpleNamespace(partition="scavenger", run_as_owner=False, min_uid=500)
    assert RunAsPolicy.of(section) == RunAsPolicy(run_as_owner=False, min_uid=500)
    for bad in ({"min_uid": -1}, {"min_uid": 2**32}, {"run_as": True}):
        with pytest.raises(ValidationError):
            RunAsPolicy(**bad)


def test_workdir_and_checkpoints_of_an_owner(tmp_path):
    alice = Account("alice", 1500, 1500, "/home/alice", True)
    assert job_workdir(SlurmConfig(), alice) == "/home/alice"
    assert job_workdir(SlurmConfig(), None) is None
    assert checkpoint_dir(SlurmConfig(), "t1", alice) == Path("/home/alice/offcut-checkpoints/t1")
    cfg = SlurmConfig(workdir="/scratch/%u/offcut", checkpoint_root="/shared/ckpt/%u")
    assert job_workdir(cfg, alice) == "/scratch/alice/offcut"
    assert checkpoint_dir(cfg, "t1", alice) == Path("/shared/ckpt/alice/t1")


# ----------------------------------------------------------------------------- fake Slurm
def test_jobs_run_as_their_owners_and_other_tasks_fail(daemon, tmp_path, monkeypatch):
    """A root launcher: alice's task is submitted with --uid/--gid, in her working folder, with
    her HOME/USER and none of the launcher's secrets; the tasks of an owner without an
    account, of root and of a service account are not launched and FAIL at once with the
    reason (reported once); the launcher creates no folder for alice."""
    srv, client = daemon
    monkeypatch.setenv("OFFCUT_TOKEN", "launcher-secret-token")
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("USER", "root")
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tids = {owner: client.submit(one_node(f"of-{owner}"), owner=owner).task.task_id
            for owner in ("alice", "nosuch", "root", "svc")}
    assert all(client.get_task(t).nodes for t in tids.values())
    cfg = SlurmConfig(workdir=str(tmp_path / "work" / "%u"))
    slurm = FakeSlurm()
    launcher = Launcher(client, cfg, slurm,
                        accounts=OwnerAccounts(RunAsPolicy(), uid=0, getpwnam=USERS))
    r = launcher.reconcile()

    assert [t for t, _, _ in r.submitted] == [tids["alice"]]
    (job,) = slurm.jobs
    opts, env, script = slurm.options[job], slurm.envs[job], slurm.scripts[job]
    assert opts[-2:] == ["--uid=1500", "--gid=1500"]
    workdir = tmp_path / "work" / "alice"
    assert f"--chdir={workdir}" in opts
    assert {k: env.get(k) for k in ("HOME", "USER", "LOGNAME", "SLURM_UMASK")} == {
        "HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "SLURM_UMASK": "0077"}
    assert "OFFCUT_TOKEN" not in env and "launcher-secret-token" not in script
    ckpt = checkpoint_dir(cfg, tids["alice"], USERS_ACCOUNT, launcher.key)
    assert ckpt.parent == workdir / "offcut-checkpoints"
    assert ckpt.name.startswith(tids["alice"] + "-") and len(ckpt.name) == len(tids["alice"]) + 17
    assert f"export OFFCUT_CHECKPOINT_DIR={ckpt}" in script
    assert shlex.join(["--checkpoint-dir", str(ckpt)]) in script  # made by the job, as alice
    assert not (tmp_path / "work").exists()  # root made nothing in alice's folder

    why = {"nosuch": "task owner 'nosuch' has no local account",
           "root": "task owner 'root' is root (uid 0)",
           "svc": "task owner 'svc' is a service account"}
    assert sorted(t for t, _ in r.refused) == sorted(tids[o] for o in why)
    for owner, text in why.items():
        task = client.get_task(tids[owner])
        assert task.state == TaskState.FAILED and not task.nodes
        assert task.failure_reason.startswith(f"failed - not launched: {text}")  # no exit code
    r = launcher.reconcile()  # reported once; alice's task goes on
    assert not r.refused and not r.submitted
    assert client.get_task(tids["alice"]).state == TaskState.RUNNING


def test_an_unprivileged_launcher_runs_only_its_own_tasks(daemon):
    srv, client = daemon
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    mine = client.submit(one_node("mine"), owner="alice").task.task_id
    other = client.submit(one_node("other"), owner="bob").task.task_id
    slurm = FakeSlurm()
    launcher = Launcher(client, SlurmConfig(), slurm,
                        accounts=OwnerAccounts(RunAsPolicy(), uid=1500, getpwnam=USERS,
                                               getpwuid=by_uid))
    r = launcher.reconcile()
    assert [t for t, _, _ in r.submitted] == [mine]
    (job,) = slurm.jobs
    assert not [o for o in slurm.options[job] if o.startswith(("--uid", "--gid"))]
    assert "--chdir=/home/alice" in slurm.options[job]
    task = client.get_task(other)
    assert task.state == TaskState.FAILED
    assert "task owner 'bob' is not the launcher's own account 'alice'" in task.failure_reason


def test_without_run_as_owner_tasks_run_as_the_launcher(daemon, tmp_path, monkeypatch):
    """``run_as_owner = false`` (single-user sites, tests): no --uid, the launcher's HOME, the
    launcher makes the checkpoint folder, as before."""
    srv, client = daemon
    monkeypatch.setenv("HOME", "/root")
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tid = client.submit(one_node("legacy"), owner="nosuch").task.task_id
    slurm = FakeSlurm()
    cfg = SlurmConfig(checkpoint_root=str(tmp_path / "ckpt"))
    r = Launcher(client, cfg, slurm,
                 accounts=OwnerAccounts(RunAsPolicy(run_as_owner=False))).reconcile()
    assert [t for t, _, _ in r.submitted] == [tid] and not r.refused
    (job,) = slurm.jobs
    assert not [o for o in slurm.options[job] if o.startswith(("--uid", "--gid", "--chdir"))]
    assert slurm.envs[job]["HOME"] == "/root" and slurm.envs[job]["SLURM_UMASK"] == "0077"
    (ckpt,) = (tmp_path / "ckpt").glob(f"{tid}-*")
    assert ckpt.is_dir() and stat.S_IMODE(ckpt.stat().st_mode) == 0o700


# ----------------------------------------------------------------------------- real Slurm
@pytest.fixture
def local_user(slurm_cluster):
    """A real local user made for the test (:func:`slurm_cluster.made_local_user`)."""
    with made_local_user(slurm_cluster) as user:
        yield user


def jobs_since(slurm, tid: str, t0: float) -> list[dict]:
    """The task's jobs (squeue records) submitted at ``t0`` [s since epoch] or later: an earlier
    test's daemon numbered its tasks from t000001 too, and Slurm shows its ended jobs for
    MinJobAge."""
    def submitted(job: dict) -> float:
        value = job.get("submit_time", 0)
        return float(value.get("number", 0) if isinstance(value, dict) else value or 0)
    return [j for j in offcut_jobs(slurm, tid, active_only=False).values()
            if submitted(j) >= int(t0)]


def _private_file(path: Path, text: str, owner: pwd.struct_passwd | None = None) -> None:
    """Write ``text`` to ``path`` (mode 0600; folders 0700), owned by ``owner`` (else root)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(text)
    path.chmod(0o600)
    if owner is not None:
        for p in (path, *path.relative_to(owner.pw_dir).parents):
            os.chown(Path(owner.pw_dir) / p, owner.pw_uid, owner.pw_gid)


@pytest.mark.slow
def test_a_task_runs_as_its_owner_on_real_slurm(slurm, cluster_daemon, local_user, monkeypatch):
    """On the real cluster, with a launcher run as root with the default settings: the task of
    a real user runs as that user (uid, gid, Slurm's record), in their home, with their HOME
    and USER, umask 0077 (its output file and checkpoint folder are theirs only), with their
    own token file readable and the launcher's neither readable nor named, and none of the
    launcher's variables; it finishes and the task completes. Tasks of an owner without an
    account, of root and of a system account (daemon, uid 1) FAIL with the reason and never
    reach Slurm."""
    srv, client = cluster_daemon
    t0 = time.time()
    owner = local_user
    home = Path(owner.pw_dir)
    assert owner.pw_uid >= 1000 and home.is_dir()
    own_token = home / ".config" / "offcut" / "token"
    _private_file(own_token, "owner-token\n", owner)
    launcher_token = slurm.root / f"launcher-{secrets.token_hex(4)}.token"
    _private_file(launcher_token, "launcher-secret-token\n")
    monkeypatch.setenv("OFFCUT_TOKEN", "launcher-secret-token")
    monkeypatch.setenv("OFFCUT_TOKEN_FILE", str(launcher_token))
    monkeypatch.setenv("SOME_LAUNCHER_SETTING", "not-for-tasks")
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)
    program = (
        'out="$HOME/result"; mkdir -p "$out"; id -u > "$out/uid"; id -g > "$out/gid"; '
        'umask > "$out/umask"; pwd > "$out/pwd"; env > "$out/env"; '
        f'cat {shlex.quote(str(launcher_token))} > "$out/launcher-token" '
        '2> "$out/launcher-token.err"; echo $? > "$out/launcher-token.rc"; '
        'cat "$HOME/.config/offcut/token" > "$out/own-token"; touch "$out/done"')
    mine = client.submit(one_node("mine", ["bash", "-c", program]),
                         owner=owner.pw_name).task.task_id
    no_account = f"nosuch{secrets.token_hex(4)}"
    refused = {o: client.submit(one_node(f"of-{o}"), owner=o).task.task_id
               for o in (no_account, "root", "daemon")}

    cfg = SlurmConfig(rescale_grace_s=20)  # no workdir: the owner's home
    with Client(client.address, timeout_s=10) as launcher_client:
        launcher = Launcher(launcher_client, cfg, SlurmCLI(slurm_conf=str(slurm.conf)))
        stop = threading.Event()
        th = threading.Thread(target=launcher.run, args=(0.5, stop), daemon=True)
        th.start()
        try:
            slurm.wait_for(lambda: client.get_task(mine).state == TaskState.COMPLETED,
                           timeout=90, what=f"{owner.pw_name}'s task to run and complete")
            slurm.wait_for(lambda: all(client.get_task(t).state == TaskState.FAILED
                                       for t in refused.values()),
                           timeout=30, what="the refused tasks to fail")
        finally:
            stop.set()
            th.join(10)

    # the job ran as the owner, as Slurm records it too
    out = home / "result"
    assert (out / "done").exists()
    assert int((out / "uid").read_text()) == owner.pw_uid
    assert int((out / "gid").read_text()) == owner.pw_gid
    (job,) = jobs_since(slurm, mine, t0)
    assert job["user_name"] == owner.pw_name and job["user_id"] == owner.pw_uid
    assert (out / "pwd").read_text().strip() == str(home)
    assert (out / "umask").read_text().strip() == "0077"
    env = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines() if "=" in line)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (str(home), owner.pw_name, owner.pw_name)
    assert env["OFFCUT_TASK_ID"] == mine and env["SLURM_JOB_USER"] == owner.pw_name
    # nothing of the launcher's: neither its variables nor its token (by value or file)
    assert not {"OFFCUT_TOKEN", "OFFCUT_TOKEN_FILE", "SOME_LAUNCHER_SETTING"} & env.keys()
    assert "launcher-secret-token" not in (out / "env").read_text()
    assert str(launcher_token) not in (out / "env").read_text()
    assert int((out / "launcher-token.rc").read_text()) != 0
    assert "Permission denied" in (out / "launcher-token.err").read_text()
    assert (out / "launcher-token").read_text() == ""
    # the owner's own token is there for the training side (OFFCUT_TOKEN_FILE of theirs)
    assert (out / "own-token").read_text() == "owner-token\n"
    # the output file and the checkpoint folder are the owner's, private
    (log,) = home.glob(f"offcut-{mine}.*.out")  # output = "%x-%j.out": no doubled prefix
    (ckpt,) = (home / "offcut-checkpoints").glob(f"{mine}-*")
    for path, mode in ((log, 0o600), (ckpt, 0o700)):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid), path
        assert st.st_mode & 0o777 == mode, (path, oct(st.st_mode))

    # the refused tasks failed with the reason and never reached Slurm
    reasons = {no_account: f"task owner '{no_account}' has no local account",
               "root": "task owner 'root' is root (uid 0)",
               "daemon": "task owner 'daemon' is a system account (uid 1 < [slurm] min_uid 1000)"}
    for o, tid in refused.items():
        assert f"not launched: {reasons[o]}" in client.get_task(tid).failure_reason
        assert not jobs_since(slurm, tid, t0)

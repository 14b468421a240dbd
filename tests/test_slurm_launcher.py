"""The Slurm launcher (``offcut-slurm launch``): unit tests on a fake Slurm with a real daemon,
and the end-to-end scenario of issue 4 on the real 4-node Slurm 22.05 cluster of
tests/slurm_cluster.py (skipped with the reason when Slurm is not installed or not root).
Running tasks as their owners: tests/test_slurm_run_as_owner.py."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import stat
import sys
from pathlib import Path
import threading
import time

import hostlist
import pytest

from daemon_helpers import DEADLINE_S, Clock, wait_until
from slurm_cluster import idle_set

from offcut.client import Client, make_task_spec
from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.job_ownership import JobOwnership
from offcut.slurm_plugin.job_stops import JobStopper
from offcut.slurm_plugin.job_submission import (NODE_RUN, SYSTEM_PYTHON, _everyone_may,
                                                batch_script, checkpoint_dir, master_port,
                                                sbatch_options, supervisor_python)
from offcut.slurm_plugin.launch_reports import run_state
from offcut.slurm_plugin.launch_types import (Generation, OnceLog, PassResult, job_name,
                                              parse_job_name)
from offcut.slurm_plugin.launcher import Launcher
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.owners import OwnerAccounts, RunAsPolicy
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import JobInfo, SlurmCommandError, SlurmError
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

ALL = ["n1", "n2", "n3", "n4"]
CFG = SlurmConfig()


def passwd(name: str, uid: int, gid: int | None = None, home: str | None = None,
           shell: str = "/bin/bash") -> pwd.struct_passwd:
    """A user database entry (``pwd.struct_passwd``)."""
    return pwd.struct_passwd((name, "x", uid, uid if gid is None else gid, "",
                              home or f"/home/{name}", shell))


def fake_users(*entries: pwd.struct_passwd):
    """A ``getpwnam`` over ``entries`` (KeyError for any other name, like :func:`pwd.getpwnam`)."""
    db = {e.pw_name: e for e in entries}

    def getpwnam(name: str) -> pwd.struct_passwd:
        if name not in db:
            raise KeyError(f"getpwnam(): name not found: {name!r}")
        return db[name]
    return getpwnam


#: a root launcher whose user database knows the tests' task owner ``test`` (uid 1500): the
#: fake-Slurm tests run tasks as their owner, the default
OWNERS = OwnerAccounts(RunAsPolicy(), uid=0, getpwnam=fake_users(passwd("test", 1500)))
#: every task as the launcher's own account (``run_as_owner = false``): the real-Slurm
#: scenario below, whose owner ``test`` has no account (real owners: test_slurm_run_as_owner.py)
AS_LAUNCHER = OwnerAccounts(RunAsPolicy(run_as_owner=False))


def spec(name="elastic", command=("python", "train.py", "--epochs", "3")):
    return make_task_spec(name, nodes="1-4", work_samples=1e12,
                          scalability=([1, 2, 3, 4], [10.0, 19.0, 27.0, 34.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0, command=list(command))


# ----------------------------------------------------------------------------- pure parts
def test_job_names_round_trip():
    assert job_name(CFG, "t000001", 3, "n1") == "offcut-t000001.3-n1"
    assert parse_job_name(CFG, "offcut-t000001.3-node-7.x") == ("t000001", 3, "node-7.x")
    # a job named before generations existed (adopted after an upgrade): generation 0
    assert parse_job_name(CFG, "offcut-t000001-n1") == ("t000001", 0, "n1")
    for other in ("wrap", "offcut-", "offcut-t1", "other-t000001.1-n1", "offcut-t1.x-n1",
                  "offcut-t1.-n1"):
        assert parse_job_name(CFG, other) is None


def _env(script: str) -> dict[str, str]:
    lines = script.splitlines()
    return {k: shlex.split(v)[0] for k, v in
            (line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))}


def test_batch_script_quotes_and_exports(tmp_path):
    cfg = SlurmConfig(command_template="srun --ntasks=1 {command} --rank {rank} --of {num_nodes} "
                                       "--gen {generation} --at {master_addr}:{master_port}",
                      checkpoint_root=str(tmp_path / "ckpt"), master_ports="30000-30009")
    gen = Generation("t000002", "it's", 7, ("n1", "n3"), ("python", "-c", "print('a b')"), "zj",
                     total_work=1.5e6)
    script = batch_script(cfg, gen, "n3", address="unix:///run/o.sock", master_addr="10.0.0.1")
    env = _env(script)
    port = master_port(cfg, "t000002", 7)
    assert 30000 <= port <= 30009
    assert env == {
        "OFFCUT_TASK_ID": "t000002", "OFFCUT_TASK_NAME": "it's", "OFFCUT_NODE": "n3",
        "OFFCUT_NODE_RANK": "1", "OFFCUT_NODELIST": "n[1,3]", "OFFCUT_NUM_NODES": "2",
        "OFFCUT_ADDRESS": "unix:///run/o.sock", "OFFCUT_GENERATION": "7",
        "OFFCUT_CHECKPOINT_DIR": str(tmp_path / "ckpt" / "t000002"), "OFFCUT_STOP_SIGNAL": "USR1",
        "OFFCUT_PEER_TIMEOUT_S": "60", "OFFCUT_TOTAL_WORK": "1500000",
        "OFFCUT_ZEUS_JOB_ID": "zj", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(port),
        "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    # the batch shell execs the per-node supervisor, which runs the filled template once
    # per process (RANK and LOCAL_RANK are its to set: offcut.slurm_plugin.node_run)
    run = shlex.split(script.splitlines()[-1])
    assert run[:4] == ["exec", supervisor_python(cfg), "-I", str(NODE_RUN)]
    assert run[4:run.index("--")] == ["--procs", "1", "--node-rank", "1", "--num-nodes", "2",
                                      "--gpus-per-proc", "0", "--stop-signal", "USR1",
                                      "--checkpoint-dir", str(tmp_path / "ckpt" / "t000002")]
    assert shlex.split(run[-1]) == [
        "srun", "--ntasks=1", "python", "-c", "print('a b')", "--rank", "1", "--of", "2",
        "--gen", "7", "--at", f"10.0.0.1:{port}"]
    # two processes per node on 4 GPUs: world size 4, two GPUs each; the power helper's
    # socket reaches GPU jobs only
    gpu_cfg = SlurmConfig(power_socket="/run/offcut/power.sock", node_python="/opt/o/bin/python",
                          peer_timeout_s=30)
    gpu_gen = Generation("t3", "g", 2, ("n1", "n3"), ("python", "t.py"), gpus_per_node=4,
                         procs_per_node=2)
    gpu_script = batch_script(gpu_cfg, gpu_gen, "n1", address="a", master_addr="n1")
    genv = _env(gpu_script)
    assert (genv["WORLD_SIZE"], genv["LOCAL_WORLD_SIZE"], genv["OFFCUT_NODE_RANK"]) == ("4", "2", "0")
    assert genv["ZEUSD_SOCK_PATH"] == "/run/offcut/power.sock"
    assert genv["OFFCUT_PEER_TIMEOUT_S"] == "30"
    grun = shlex.split(gpu_script.splitlines()[-1])
    assert grun[1:3] == ["/opt/o/bin/python", "-I"] and grun[grun.index("--procs") + 1] == "2"
    assert grun[grun.index("--gpus-per-proc") + 1] == "2"
    assert "ZEUSD_SOCK_PATH" not in _env(batch_script(gpu_cfg, gen, "n3", address="a",
                                                      master_addr="n1"))
    # consecutive generations draw different ports (deterministic by task and generation)
    assert len({master_port(cfg, "t000002", g) for g in range(1, 6)}) > 1
    assert master_port(cfg, "t000002", 7) == port
    with pytest.raises(ValueError, match="no command"):
        batch_script(CFG, Generation("t1", "x", 1, ("n1",), ()), "n1", address="a",
                     master_addr="n1")
    opts = sbatch_options(SlurmConfig(account="acct", sbatch_args=["--qos=low"]), "offcut-t1.1-n1", "n1")
    assert opts[:7] == ["-p", "scavenger", "-w", "n1", "-N", "1", "--exclusive"]
    assert "--no-requeue" in opts and "--signal=B:USR1@60" in opts
    assert "--account=acct" in opts and opts[-1] == "--qos=low"
    assert not [o for o in opts if o.startswith(("--gres", "--constraint"))]
    gpu = Generation("t1", "x", 1, ("n1",), ("true",), gpus_per_node=2, constraint=("a100", "ib"))
    opts = sbatch_options(CFG, "offcut-t1.1-n1", "n1", gen=gpu)
    assert "--gres=gpu:2" in opts and "--constraint=a100&ib" in opts


def test_the_supervisor_runs_with_an_interpreter_every_owner_may_run(tmp_path):
    """The jobs run as the tasks' owners: a launcher whose interpreter lives in a private
    folder (a virtual environment of an interpreter in root's 0700 home) gives the
    supervisor, one file of the standard library, the system's python3 instead."""
    private = tmp_path / "home"
    (private / "bin").mkdir(parents=True)
    exe = private / "bin" / "python"
    exe.write_text("")
    exe.chmod(0o755)
    private.chmod(0o700)
    assert not _everyone_may(str(exe), stat.S_IXOTH)
    private.chmod(0o755)
    tmp_path.chmod(0o755)
    assert _everyone_may(str(exe), stat.S_IXOTH) == all(
        p.stat().st_mode & stat.S_IXOTH for p in exe.parents)
    assert supervisor_python(SlurmConfig(node_python="/opt/o/bin/python")) == "/opt/o/bin/python"
    chosen = supervisor_python(SlurmConfig())
    assert chosen in (sys.executable, SYSTEM_PYTHON)
    assert _everyone_may(chosen, stat.S_IXOTH) or chosen == sys.executable
    assert NODE_RUN.name == "node_run.py" and _everyone_may(str(NODE_RUN), stat.S_IROTH)


def test_checkpoint_dir_is_taken_from_workdir_when_relative(tmp_path):
    assert checkpoint_dir(SlurmConfig(workdir=str(tmp_path)), "t9") == \
        tmp_path / "offcut-checkpoints" / "t9"
    assert checkpoint_dir(SlurmConfig(checkpoint_root="/shared/ck"), "t9") == Path("/shared/ck/t9")


@pytest.mark.parametrize("states,code,sig,preempting,ours,signalled,expected", [
    ({"PENDING"}, 0, 0, False, False, False, None),
    ({"RUNNING"}, 0, 0, False, False, False, "started"),
    ({"COMPLETED"}, 0, 0, False, False, False, "finished"),
    ({"FAILED"}, 1, 0, False, False, False, "failed"),
    ({"FAILED"}, 75, 0, False, False, False, "interrupted"),
    ({"FAILED"}, 75, 0, True, False, False, "interrupted"),   # checkpointed in Slurm's grace
    ({"FAILED"}, 0, 10, False, False, True, "interrupted"),   # our stop signal killed it
    ({"FAILED"}, 1, 0, False, False, True, "failed"),         # its own crash, after our stop
    ({"FAILED"}, 0, 10, True, False, False, "preempted"),     # Slurm's signal killed it
    ({"FAILED"}, 0, 9, False, False, False, "failed"),
    ({"OUT_OF_MEMORY"}, 0, 0, False, False, False, "failed"),
    ({"PREEMPTED"}, 0, 0, False, False, False, "preempted"),
    ({"CANCELLED"}, 0, 15, False, True, False, None),           # cancelled before it ran
    ({"CANCELLED"}, 0, 15, False, True, True, "interrupted"),   # ignored our stop signal
    ({"CANCELLED"}, 0, 15, False, False, False, "preempted"),
])
def test_run_state_of_slurm_states(states, code, sig, preempting, ours, signalled, expected):
    job = JobInfo("1", states=frozenset(states), exit_code=code, signal=sig,
                  preempt_time=1.0 if preempting else 0.0)
    assert run_state(job, cancelled_by_us=ours, signalled_by_us=signalled) == expected


def test_exit_status_of_both_squeue_generations():
    from offcut.slurm_plugin.slurm_json import _exit_status

    assert _exit_status(19200) == (75, 0)        # 22.05: the wait status (measured)
    assert _exit_status(9) == (0, 9)
    assert _exit_status({"return_code": {"set": True, "number": 75},
                         "signal": {"id": {"set": True, "number": 0}}}) == (75, 0)
    assert _exit_status({"return_code": 2, "signal": {"id": 15}}) == (2, 15)
    assert _exit_status(None) == (0, 0) and _exit_status("x") == (0, 0)


# ----------------------------------------------------------------------------- fake Slurm
class FakeSlurm(SlurmCLI):
    """squeue/sbatch/scancel/sinfo in memory: jobs submitted run at once on their -w node;
    a stop signal is recorded (the test decides how the job ends)."""

    def __init__(self):
        super().__init__()
        self.jobs: dict[str, dict] = {}
        self.next_id = 100
        self.fail_squeue = False
        self.scripts: dict[str, str] = {}
        self.options: dict[str, list[str]] = {}   # job id -> its sbatch options
        self.envs: dict[str, dict[str, str]] = {}  # job id -> sbatch's environment
        self.signals: list[tuple[str, str]] = []  # (job id, signal)
        self.forgotten: dict[str, dict] = {}      # ended jobs squeue no longer shows
        self.accounting = True                    # False: sacct fails as without slurmdbd
        self.sacct_calls: list[list[str]] = []    # the job names each sacct call asked for

    def forget_ended(self) -> None:
        """Slurm purges ended jobs from squeue (MinJobAge); accounting keeps them."""
        for jid in [j for j, job in self.jobs.items() if job["job_state"] not in
                    ("RUNNING", "PENDING")]:
            self.forgotten[jid] = self.jobs.pop(jid)

    def sacct(self, names, since) -> str:
        self.sacct_calls.append(list(names))
        if not self.accounting:
            raise SlurmCommandError("sacct exited with status 1: Slurm accounting storage "
                                    "is disabled")
        return "".join(f"{j['job_id']}|{j['name']}|{j['partition']}|{j['job_state']}|"
                       f"{j['exit_code'] >> 8}:0|{j['nodes']}|{j.get('submit_time', 0)}|"
                       f"{j.get('user_id', '')}\n"
                       for j in [*self.forgotten.values(), *self.jobs.values()]
                       if j["name"] in names)

    def squeue_json(self) -> dict:
        if self.fail_squeue:
            raise SlurmCommandError("squeue exited with status 1: slurm_load_jobs error")
        return {"jobs": [dict(j) for j in self.jobs.values()]}

    def sinfo_json(self) -> dict:
        return {"nodes": [{"name": n, "state": "IDLE", "address": f"10.0.0.{n[1:]}"}
                          for n in ALL]}

    def submit(self, options=(), *, wrap=None, script=None, env=None) -> str:
        opts = list(options)
        self.next_id += 1
        jid = str(self.next_id)
        uid = next((int(o[len("--uid="):]) for o in opts if o.startswith("--uid=")),
                   os.getuid())  # sbatch's real uid, or root's --uid
        comment = next((o[len("--comment="):] for o in opts if o.startswith("--comment=")), "")
        self.jobs[jid] = {"job_id": int(jid), "name": opts[opts.index("-J") + 1],
                          "partition": opts[opts.index("-p") + 1], "job_state": "RUNNING",
                          "nodes": opts[opts.index("-w") + 1], "exit_code": 0,
                          "user_id": uid, "comment": comment, "submit_time": int(time.time())}
        self.scripts[jid] = script
        self.options[jid] = opts
        self.envs[jid] = dict(env or {})
        return jid

    def cancel(self, job_ids, *, signal=None, options=()) -> None:
        for j in job_ids:
            if signal:
                assert "--batch" in options
                self.signals.append((str(j), signal))
            else:
                self.jobs[str(j)]["job_state"] = "CANCELLED"

    def end(self, node: str, state: str = "FAILED", code: int = 75, **extra) -> str:
        """The running job on ``node`` ends (exit ``code``, as 22.05 reports it)."""
        jid = self.active()[node]
        self.jobs[jid].update(job_state=state, exit_code=code << 8, **extra)
        return jid

    def active(self) -> dict[str, str]:
        """node -> job id of running Offcut jobs."""
        return {j["nodes"]: str(j["job_id"]) for j in self.jobs.values() if j["job_state"] == "RUNNING"}

    def generations(self) -> dict[str, int]:
        """node -> generation of the running job there."""
        return {n: parse_job_name(CFG, self.jobs[j]["name"]).generation
                for n, j in self.active().items()}


@pytest.fixture
def placed(daemon):
    """A daemon with n1..n4 idle and one running task on all four."""
    srv, client = daemon
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tid = client.submit(spec(), owner="test").task.task_id
    assert sorted(client.get_task(tid).nodes) == ALL
    return client, tid


def test_generations_through_preemption_grow_and_shrink_with_fake_slurm(placed):
    client, tid = placed
    slurm, mono = FakeSlurm(), Clock(1000.0)
    launcher = Launcher(client, CFG, slurm, monotonic=mono, accounts=OWNERS)
    r = launcher.reconcile()
    assert sorted(n for _, n, _ in r.submitted) == ALL and not r.cancelled
    assert slurm.generations() == {n: 1 for n in ALL}
    envs = {n: _env(slurm.scripts[j]) for n, j in slurm.active().items()}
    assert {n: (e["OFFCUT_NODE_RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"])
            for n, e in envs.items()} == {n: (str(i), "4", "10.0.0.1") for i, n in enumerate(ALL)}
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    r = launcher.reconcile()  # steady state: nothing to do, starts reported once
    assert not r.submitted and not r.cancelled and len(r.reported) == 4
    assert client.get_task(tid).launches == 4
    assert launcher.reconcile().reported == []
    # a restarted launcher adopts the jobs and submits nothing twice
    again = Launcher(client, CFG, slurm, monotonic=mono, accounts=OWNERS)
    r = again.reconcile()
    assert r.adopted == 4 and not r.submitted and not r.cancelled
    assert client.get_task(tid).launches == 4  # its re-sent reports were duplicates

    # Slurm preempts n3, n4: their ranks checkpoint in the grace time and exit 75 while Slurm
    # is preempting them; the ranks on n1, n2 lose their peers and exit 75 too
    for node in ("n3", "n4"):
        slurm.end(node, preempt_time=time.time())
    for node in ("n1", "n2"):
        slurm.end(node)
    r = again.reconcile()
    assert {s for _, _, s in r.reported} == {"interrupted"}
    # the launcher told the daemon first that Slurm is taking n3, n4 (issue 38: else the
    # daemon's restart would place a generation on them that nothing could start): generation
    # 2 is on n1, n2 at once, submitted in the same pass, and the interruptions of generation 1
    # restart nothing more
    task = client.get_task(tid)
    assert task.generation == 2 and task.state == TaskState.RUNNING
    assert sorted(task.nodes) == ["n1", "n2"] and task.failed_runs == 0
    assert "n3" not in idle_set(client) and "n4" not in idle_set(client)
    assert sorted(n for _, n, _ in r.submitted) == ["n1", "n2"] and not r.held
    assert not again.reconcile().submitted
    assert slurm.generations() == {"n1": 2, "n2": 2}
    assert {_env(slurm.scripts[j])["WORLD_SIZE"] for j in slurm.active().values()} == {"2"}
    client.report_nodes(time.time(), "test", 2, preempted=["n3", "n4"])  # the prolog: no news
    assert client.get_task(tid).generation == 2

    # the nodes come back (the epilog): generation 3 on four nodes; generation 2 first gets
    # the stop signal, and nothing is submitted while it runs
    client.report_nodes(time.time(), "test", 3, idle=["n3", "n4"])
    r = again.reconcile()
    assert sorted(n for _, n, _ in r.signalled) == ["n1", "n2"] and not r.submitted
    assert {sig for _, sig in slurm.signals} == {"USR1"} and r.waiting == [tid]
    assert not again.reconcile().signalled  # signalled once
    for node in ("n1", "n2"):
        slurm.end(node)  # checkpointed: exit 75
    r = again.reconcile()
    assert {s for _, _, s in r.reported} == {"interrupted"}
    assert client.get_task(tid).generation == 3  # a replaced generation's exit restarts nothing
    assert sorted(n for _, n, _ in r.submitted) == ALL
    assert slurm.generations() == {n: 3 for n in ALL}

    # a shrink whose old generation does not stop in time: cancelled after rescale_grace_s
    client.report_nodes(time.time(), "test", 4, preempted=["n1"])
    r = again.reconcile()
    assert len(r.signalled) == 4 and not r.submitted
    mono.t += CFG.rescale_grace_s - 1
    assert not again.reconcile().cancelled
    mono.t += 2
    r = again.reconcile()
    assert sorted(n for _, n, _ in r.cancelled) == ALL
    for jid in list(slurm.jobs):
        if slurm.jobs[jid]["job_state"] == "CANCELLED":
            slurm.jobs[jid]["exit_code"] = 15  # killed by SIGTERM
    r = again.reconcile()
    assert sorted(n for _, n, _ in r.submitted) == ["n2", "n3", "n4"]
    assert client.get_task(tid).state == TaskState.RUNNING  # never a failure

    # the program finishes: the task completes, its other jobs are asked to stop
    done_job = slurm.end("n2", "COMPLETED", 0)
    r = again.reconcile()
    assert (tid, done_job, "finished") in r.reported
    task = client.get_task(tid)
    assert task.state == TaskState.COMPLETED and not task.nodes
    assert sorted(n for _, n, _ in r.signalled) == ["n3", "n4"] and not r.submitted


def test_a_job_pending_too_long_gives_its_node_back_and_the_task_moves_on(placed):
    """A job of the current generation that Slurm does not start within pending_timeout_s
    (its node taken by a job the daemon was not told about) is cancelled and its node
    reported taken back: the daemon re-places the task on the other nodes, and the launcher
    replaces the generation. Not before the limit, and never with the limit 0."""
    client, tid = placed
    slurm, mono = FakeSlurm(), Clock(1000.0)
    limit = 3.0
    launcher = Launcher(client, SlurmConfig(pending_timeout_s=limit, rescale_grace_s=0), slurm,
                        monotonic=mono, accounts=OWNERS)
    unlimited = Launcher(client, SlurmConfig(pending_timeout_s=0), slurm, monotonic=mono,
                         accounts=OWNERS)
    launcher.reconcile()
    unlimited.reconcile()
    stuck = slurm.active()["n2"]
    # pending since now (Slurm's resolution: whole seconds): within the limit
    slurm.jobs[stuck].update(job_state="PENDING", submit_time=int(time.time()))
    assert not launcher.reconcile().given_back
    assert slurm.jobs[stuck]["job_state"] == "PENDING"
    # pending for longer than the limit: Slurm's submit time lies limit + 1 s back (time
    # passing, without waiting for it; still after the task's submission less
    # CLOCK_SLACK_S, so the job is the task's)
    slurm.jobs[stuck]["submit_time"] = int(time.time()) - int(limit) - 1
    assert not unlimited.reconcile().given_back
    assert "n2" in idle_set(client)
    r = launcher.reconcile()
    assert r.given_back == [(tid, "n2", stuck)]
    assert slurm.jobs[stuck]["job_state"] == "CANCELLED"
    assert "n2" not in idle_set(client)
    task = client.get_task(tid)
    assert task.generation == 2 and sorted(task.nodes) == ["n1", "n3", "n4"]
    reported = []
    for _ in range(3):  # the replaced generation is cancelled, then the new one submitted
        reported += launcher.reconcile().reported
    assert slurm.generations() == {"n1": 2, "n3": 2, "n4": 2}
    assert not [r for r in reported if r[2] in ("preempted", "failed")]


def test_a_restarted_launcher_takes_ended_jobs_from_accounting_and_submits_nothing(placed):
    """The launcher is down while the generation's jobs finish and Slurm forgets them
    (MinJobAge): a new launcher finds them in sacct, reports them, and submits nothing; the
    task completes with its four launches counted once."""
    client, tid = placed
    slurm = FakeSlurm()
    first = Launcher(client, CFG, slurm, accounts=OWNERS)
    first.reconcile()
    first.reconcile()  # the starts reported
    assert client.get_task(tid).launches == 4
    for node in ALL:
        slurm.end(node, state="COMPLETED", code=0)
    slurm.forget_ended()
    assert not slurm.jobs
    asked = len(slurm.sacct_calls)  # (the first launcher asked once too, finding nothing)
    second = Launcher(client, CFG, slurm, accounts=OWNERS)
    r = second.reconcile()
    # the first finished run completes the task; the others' reports find it complete
    assert not r.submitted and {s for _, _, s in r.reported} == {"finished"}
    task = client.get_task(tid)
    assert task.state == TaskState.COMPLETED and task.launches == 4
    assert len(slurm.sacct_calls) == asked + 1 and len(slurm.sacct_calls[-1]) == 4
    assert not second.reconcile().submitted and len(slurm.sacct_calls) == asked + 1


def test_without_accounting_a_restarted_launcher_submits_as_before(placed, caplog):
    client, tid = placed
    slurm = FakeSlurm()
    slurm.accounting = False
    first = Launcher(client, CFG, slurm, accounts=OWNERS)
    first.reconcile()
    slurm.jobs.clear()  # gone from squeue with no trace
    second = Launcher(client, CFG, slurm, accounts=OWNERS)
    asked = len(slurm.sacct_calls)
    r = second.reconcile()
    assert sorted(n for _, n, _ in r.submitted) == ALL
    second.reconcile()
    assert len(slurm.sacct_calls) == asked + 1  # asked once per generation, not every pass
    # once per launcher, a warning (no slurmdbd is a site's choice, not an error)
    assert caplog.text.count("Slurm's accounting is off") == 2
    assert "ERROR" not in caplog.text


def test_failed_runs_restart_the_generation_then_fail_the_task(placed):
    client, tid = placed
    slurm, mono = FakeSlurm(), Clock(1000.0)
    launcher = Launcher(client, CFG, slurm, monotonic=mono, accounts=OWNERS)
    launcher.reconcile()
    for attempt in (1, 2, 3):
        assert slurm.generations() == {n: attempt for n in ALL}
        slurm.end("n2", code=1)           # the bug
        for node in ("n1", "n3", "n4"):   # its peers lose it
            slurm.end(node)
        r = launcher.reconcile()
        task = client.get_task(tid)
        assert task.failed_runs == attempt and "exit code 1" in task.failure_reason
        if attempt < 3:
            assert task.state == TaskState.RUNNING and task.generation == attempt + 1
            assert sorted(n for _, n, _ in r.submitted) == ALL
    assert task.state == TaskState.FAILED
    assert task.failure_reason.startswith("3 runs in a row failed without progress")
    assert not launcher.reconcile().submitted and not slurm.active()


def test_slurm_failure_submits_nothing_and_recovers(placed, caplog):
    client, tid = placed
    slurm = FakeSlurm()
    slurm.fail_squeue = True
    launcher = Launcher(client, CFG, slurm, accounts=OWNERS)
    with pytest.raises(SlurmError, match="squeue exited"):
        launcher.reconcile()
    assert not slurm.jobs
    stop = threading.Event()
    passes = []

    def on_pass(result):
        passes.append(result)
        stop.set()

    th = threading.Thread(target=launcher.run, args=(0.2, stop, on_pass), daemon=True)
    th.start()
    # failing passes are logged and retried: two of them ran, and did nothing
    wait_until(lambda: launcher.failed_passes >= 2, "two failed passes")
    assert not passes and th.is_alive() and not slurm.jobs
    assert "reconciliation failed" in caplog.text
    assert caplog.text.count("reconciliation failed") == 1  # logged once per kind
    slurm.fail_squeue = False
    th.join(DEADLINE_S)
    assert passes and len(passes[0].submitted) == 4


def rpcs(srv, method: str) -> int:
    """Finished calls of ``method`` (``Tasks/ListTasks`` ...) the daemon ``srv`` answered OK,
    by its own metrics."""
    value = srv.metrics.registry.get_sample_value(
        "offcut_rpc_requests_total", {"method": f"/offcut.v1.{method}", "code": "OK"})
    return int(value or 0)


def test_the_launcher_follows_one_placement_stream_and_lists_again_after_a_break(daemons):
    """Issue 39: a running launcher keeps one WatchPlacements stream across placement
    changes and lists the running tasks once (not per pass); its passes are woken by the
    stream (the poll is 60 s). When the stream breaks (the daemon restarts) it reconnects,
    lists once more, and follows the new daemon's placements."""
    from offcut.client.retry import RetryPolicy

    srv, client = daemons.start()
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tid = client.submit(spec(), owner="test").task.task_id
    slurm = FakeSlurm()
    stop = threading.Event()
    # the CLI's client: reads retried while the daemon restarts (offcut.client.retry)
    launcher_client = Client(client.address, timeout_s=10, retry=RetryPolicy(deadline_s=10))
    launcher = Launcher(launcher_client, SlurmConfig(rescale_grace_s=0), slurm, accounts=OWNERS)
    th = threading.Thread(target=launcher.run, args=(60.0, stop), daemon=True)
    th.start()
    try:
        wait_until(lambda: slurm.generations() == {n: 1 for n in ALL}, "generation 1 on four")
        # placement changes, each seen through the stream: a shrink, a grow
        client.report_nodes(time.time(), "test", 2, preempted=["n4"])
        wait_until(lambda: slurm.generations() == {"n1": 2, "n2": 2, "n3": 2},
                   "generation 2 on n1-n3")
        client.report_nodes(time.time(), "test", 3, idle=["n4"])
        wait_until(lambda: slurm.generations() == {n: 3 for n in ALL}, "generation 3 on four")
        # many passes, one list, one stream (open: not finished)
        assert launcher.passes >= 4 and rpcs(srv, "Tasks/ListTasks") == 1
        assert srv.streams.open_streams() == 1 and rpcs(srv, "Tasks/WatchPlacements") == 0
        assert launcher.state.resets == 1

        # the daemon restarts: its streams end; the launcher reconnects and lists again
        daemons.stop(srv)
        srv, client = daemons.start()
        wait_until(lambda: launcher.state.synced and rpcs(srv, "Tasks/ListTasks") == 1,
                   "the launcher to list the restarted daemon's tasks")
        client.report_nodes(time.time(), "test", 4, preempted=["n1"])
        wait_until(lambda: slurm.generations() == {"n2": 4, "n3": 4, "n4": 4},
                   "generation 4 on n2-n4, from the new stream")
        assert rpcs(srv, "Tasks/ListTasks") == 1 and srv.streams.open_streams() == 1
        assert launcher.state.resets == 2
        assert client.get_task(tid).generation == 4
    finally:
        stop.set()
        th.join(DEADLINE_S)
        launcher_client.close()
    assert not th.is_alive()


def test_a_launcher_whose_stream_is_refused_lists_each_pass(daemons, caplog):
    """Review: another caller's streams fill the daemon's stream slots (here max_streams = 1,
    one stream open), so the launcher's WatchPlacements is refused (RESOURCE_EXHAUSTED) at
    every reconnect: its passes list the running tasks themselves and go on (the refusal is
    logged once); once a slot is free the stream is accepted and followed."""
    import logging

    caplog.set_level(logging.INFO, logger="offcut.slurm.launcher")
    srv, client = daemons.start(max_streams=1)
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tid = client.submit(spec(), owner="test").task.task_id
    hog = Client(client.address, timeout_s=10)
    held = hog.watch()  # (the call is open at once: it holds the only slot)
    slurm = FakeSlurm()
    launcher = Launcher(client, SlurmConfig(rescale_grace_s=0), slurm, accounts=OWNERS)
    try:
        wait_until(lambda: srv.streams.open_streams() == 1, "the other caller's stream")
        with launcher.watching() as watch:
            wait_until(lambda: watch.connects >= 3 and watch.must_list(), "three refusals")
            assert set(launcher.desired()) == {tid}
            r = launcher.reconcile()
            assert sorted(n for _, n, _ in r.submitted) == ALL
            assert len(launcher.reconcile().reported) == 4  # the starts, reported
            assert caplog.text.count("the daemon refuses the stream") == 1
            assert "max_streams" in caplog.text and srv.streams.open_streams() == 1
            # the slot comes free: the stream is accepted, then followed
            held.cancel()

            def following() -> bool:  # synced, on one stream for a while (not a refusal's list)
                connects = watch.connects
                if not launcher.state.synced:
                    return False
                time.sleep(0.3)
                return launcher.state.synced and watch.connects == connects

            wait_until(following, "the launcher's stream")
            client.report_nodes(time.time(), "test", 2, preempted=["n4"])
            wait_until(lambda: "placement stream accepted" in caplog.text, "the shrink's update")
            assert launcher.desired()[tid].nodes == ("n1", "n2", "n3")
            assert caplog.text.count("the daemon refuses the stream") == 1
    finally:
        hog.close()


def test_task_without_command_is_not_launched(daemon, caplog):
    srv, client = daemon
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    client.submit(spec(command=()), owner="test")
    slurm = FakeSlurm()
    r = Launcher(client, CFG, slurm, accounts=OWNERS).reconcile()
    assert not r.submitted and not slurm.jobs and "has no command" in caplog.text


def test_launch_once_cli_reports_what_it_did(placed, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from offcut.slurm_plugin.cli import app

    client, _ = placed
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm commands: a clear error, exit 1
    res = CliRunner().invoke(app, ["launch", "--once", "--address", client.address])
    assert res.exit_code == 1 and "squeue" in res.output and "Traceback" not in res.output
    bad = tmp_path / "offcut.toml"
    bad.write_text("[slurm]\npartition = ''\n")
    res = CliRunner().invoke(app, ["launch", "--once", "--config", str(bad)])
    assert res.exit_code == 2 and "slurm.partition" in res.output


# ----------------------------------------------------------------------------- real Slurm
def offcut_jobs(slurm, tid: str, active_only: bool = True, cfg: SlurmConfig = CFG
                ) -> dict[tuple[int, str], dict]:
    """(generation, node) -> squeue record of the task's jobs (named as ``cfg`` names them),
    from Slurm's own view."""
    out = {}
    for j in slurm.jobs().values():
        parsed = parse_job_name(cfg, j.get("name", ""))
        if not parsed or parsed.task_id != tid or j.get("partition") != "scavenger":
            continue
        if active_only and j["state"] not in ("PENDING", "CONFIGURING", "RUNNING"):
            continue
        out[(parsed.generation, parsed.node)] = j
    return out


def running_on(slurm, tid, cfg: SlurmConfig = CFG) -> dict[str, int]:
    """node -> generation of the task's running jobs."""
    return {n: g for (g, n), j in offcut_jobs(slurm, tid, cfg=cfg).items()
            if j["state"] == "RUNNING"}


def test_a_node_taken_behind_the_daemons_back_is_given_back_on_real_slurm(
        slurm, cluster_daemon, tmp_path):
    """The daemon was not told that a regular job took n2 (no hooks): the task's job there
    stays PENDING (a scavenger job cannot preempt it); after pending_timeout_s the launcher
    cancels it and reports n2 taken back, and the task runs on the three other nodes."""
    srv, client = cluster_daemon
    slurm.install_hooks(address=f"unix://{tmp_path}/nobody-listens.sock")  # the daemon is blind
    regular = slurm.sbatch("-p", "batch", "-N1", "-w", "n2", wrap="sleep 300")
    slurm.wait_state(regular, {"RUNNING"}, timeout=60)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)  # a stale idle set
    tmp_path.chmod(0o755)
    tid = client.submit(spec(command=["sleep", "600"]), owner="test").task.task_id
    assert sorted(client.get_task(tid).nodes) == ALL
    # (a prefix of its own: this daemon's task ids restart at t000001, and the next test's
    # launcher must not take these cancelled jobs, which squeue shows for MinJobAge, as its own)
    cfg = SlurmConfig(workdir=str(tmp_path), output=str(tmp_path / "%x-%j.out"),
                      rescale_grace_s=0, pending_timeout_s=3, job_name_prefix="offcut_giveback")
    stop = threading.Event()
    with Client(client.address, timeout_s=10) as launcher_client:
        th = threading.Thread(target=Launcher(launcher_client, cfg,
                                              SlurmCLI(slurm_conf=str(slurm.conf)),
                                              accounts=AS_LAUNCHER).run,
                              args=(0.5, stop), daemon=True)
        th.start()
        try:
            pending = slurm.wait_for(
                lambda: [j for (g, n), j in offcut_jobs(slurm, tid, cfg=cfg).items()
                         if n == "n2" and j["state"] == "PENDING"],
                timeout=60, what="the task's job on n2 to be pending")
            slurm.wait_for(lambda: set(client.get_task(tid).nodes) == {"n1", "n3", "n4"},
                           timeout=60, what="the task to be re-placed without n2")
            assert "n2" not in idle_set(client)
            slurm.wait_for(lambda: set(running_on(slurm, tid, cfg)) == {"n1", "n3", "n4"}
                           and len(set(running_on(slurm, tid, cfg).values())) == 1,
                           timeout=60, what="a new generation on n1, n3, n4")
            assert slurm.job_state(pending[0]["job_id"]) == "CANCELLED"
            assert slurm.job_state(regular) == "RUNNING"  # the regular job was never touched
            assert client.get_task(tid).state == TaskState.RUNNING
        finally:
            stop.set()
            th.join(10)


@pytest.mark.slow
def test_end_to_end_on_real_slurm(slurm, cluster_daemon, tmp_path):
    """Issue 4's scenario with generations (docs/execution.md): a 1-4 node task runs as four
    scavenger jobs; a regular sbatch -N2 preempts two of them (they get the signal, exit 75 in
    Slurm's grace time), the other two are asked to stop, and generation 3 runs on the other
    two nodes; when the regular job ends generation 4 runs on four; the program finishes, the
    task completes and its nodes are released. Each step is checked in squeue --json and in
    the daemon; the task never fails."""
    t_start = time.monotonic()
    srv, client = cluster_daemon
    marks = tmp_path / "marks"
    marks.mkdir()
    tmp_path.chmod(0o755)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)  # what `offcut-slurm watch` sends
    program = (f'trap \'touch "{marks}/usr1-$OFFCUT_GENERATION-$OFFCUT_NODE"; exit 75\' USR1; '
               f'echo "$OFFCUT_GENERATION $RANK/$WORLD_SIZE $MASTER_ADDR:$MASTER_PORT"; '
               f'while [ ! -e "{marks}/done" ]; do sleep 0.2 & wait $!; done')
    tid = client.submit(spec(command=["bash", "-c", program]), owner="test").task.task_id
    assert sorted(client.get_task(tid).nodes) == ALL

    cfg = SlurmConfig(workdir=str(tmp_path), output=str(tmp_path / "%x-%j.out"),
                      rescale_grace_s=20)
    cli = SlurmCLI(slurm_conf=str(slurm.conf))
    stop = threading.Event()
    launcher_client = Client(client.address, timeout_s=10)
    th = threading.Thread(target=Launcher(launcher_client, cfg, cli, accounts=AS_LAUNCHER).run,
                          args=(0.5, stop), daemon=True)
    th.start()
    try:
        # 1. placed on all four idle nodes as scavenger jobs, one per node, generation 1
        slurm.wait_for(lambda: running_on(slurm, tid) == {n: 1 for n in ALL}, timeout=60,
                       what="four running Offcut jobs")
        jobs = offcut_jobs(slurm, tid)
        assert {n: j["node_list"] for (_, n), j in jobs.items()} == {n: n for n in ALL}
        (ckpt,) = (tmp_path / "offcut-checkpoints").glob(f"{tid}-*")  # TASKID-SUFFIX
        assert ckpt.is_dir() and stat.S_IMODE(ckpt.stat().st_mode) == 0o700
        t_placed = time.monotonic()

        # a launcher restart while the jobs run: it adopts them and submits nothing
        stop.set()
        th.join(10)
        restarted = Launcher(launcher_client, cfg, cli, accounts=AS_LAUNCHER)
        r = restarted.reconcile()
        assert r.adopted == 4 and not r.submitted and not r.cancelled
        assert {k: j["job_id"] for k, j in offcut_jobs(slurm, tid).items()} == \
            {k: j["job_id"] for k, j in jobs.items()}
        stop = threading.Event()
        th = threading.Thread(target=restarted.run, args=(0.5, stop), daemon=True)
        th.start()

        # 2. a regular job arrives: Slurm preempts two Offcut jobs (they exit 75 on its
        # signal), the launcher stops the other two, the prolog tells the daemon, and a new
        # generation runs on the two nodes left
        regular = slurm.sbatch("-N2", wrap="sleep 4")
        slurm.wait_state(regular, {"RUNNING", "COMPLETING", "COMPLETED"}, timeout=90)
        taken = set(hostlist.expand_hostlist(slurm.jobs()[regular]["node_list"]))
        assert len(taken) == 2
        slurm.wait_for(lambda: set(client.get_task(tid).nodes) == set(ALL) - taken, timeout=30,
                       what="the task to shrink to the other two nodes")
        left = slurm.wait_for(lambda: (r := running_on(slurm, tid)) and set(r) == set(ALL) - taken
                              and len(set(r.values())) == 1 and r, timeout=60,
                              what="a new generation on the two nodes left")
        shrunk_gen = next(iter(left.values()))
        assert shrunk_gen == client.get_task(tid).generation > 1
        usr1 = {p.name.removeprefix("usr1-") for p in marks.glob("usr1-*")}
        assert {u.split("-", 1)[1] for u in usr1 if u.startswith("1-")} == set(ALL)
        assert client.get_task(tid).state == TaskState.RUNNING
        t_shrunk = time.monotonic()

        # 3. the regular job ends: the epilog returns its nodes, the next generation runs on four
        slurm.wait_state(regular, {"COMPLETED"}, timeout=60)
        slurm.wait_for(lambda: sorted(client.get_task(tid).nodes) == ALL, timeout=30,
                       what="the task to grow back to four nodes")
        grown = slurm.wait_for(lambda: (r := running_on(slurm, tid)) and set(r) == set(ALL)
                               and set(r.values()) == {client.get_task(tid).generation} and r,
                               timeout=60, what="four running Offcut jobs again")
        assert next(iter(grown.values())) > shrunk_gen
        assert client.get_task(tid).preemptions >= 1
        assert client.get_task(tid).failed_runs == 0
        t_grown = time.monotonic()

        # 4. the program finishes: the task completes and its nodes are released
        (marks / "done").touch()
        slurm.wait_for(lambda: client.get_task(tid).state == TaskState.COMPLETED,
                       timeout=60, what="the task to complete")
        assert not client.get_task(tid).nodes and client.status().nodes_in_use == 0
        slurm.wait_for(lambda: not offcut_jobs(slurm, tid), timeout=60,
                       what="no active Offcut job")
    finally:
        stop.set()
        th.join(10)
        launcher_client.close()
    total = time.monotonic() - t_start
    print(f"\n[slurm e2e] placed {t_placed - t_start:.1f} s, shrunk {t_shrunk - t_placed:.1f} s "
          f"after the regular job, grown {t_grown - t_shrunk:.1f} s after, completed "
          f"{time.monotonic() - t_grown:.1f} s after; total {total:.1f} s")
    print(json.dumps({"total_s": round(total, 1)}))


# ----------------------------------------------------------------------------- site docs
@pytest.mark.parametrize("unit", ["offcutd.service", "offcut-slurm-watch.service",
                                  "offcut-slurm-launch.service"])
def test_systemd_units_use_existing_options(unit):
    """Every option in a documented unit's ExecStart is one the command accepts."""
    from pathlib import Path

    from typer.testing import CliRunner

    from offcut.daemon.__main__ import app as offcutd
    from offcut.slurm_plugin.cli import app as offcut_slurm

    text = (Path(__file__).resolve().parents[1] / "docs" / "systemd" / unit).read_text()
    exec_line = text.split("ExecStart=", 1)[1].split("\nRestart")[0].replace("\\\n", " ")
    argv = shlex.split(exec_line)
    program = argv[0].rsplit("/", 1)[-1]
    if program == "offcutd":
        app, args = offcutd, argv[1:]
    else:
        app, args = offcut_slurm, argv[2:]
        assert program == "offcut-slurm" and argv[1] in ("watch", "launch")
    help_text = CliRunner().invoke(app, ([] if program == "offcutd" else [argv[1]]) + ["--help"],
                                   terminal_width=200).stdout
    options = [a for a in args if a.startswith("--")]
    assert options
    for opt in options:
        assert opt in help_text, f"{unit}: {program} has no option {opt}"


def test_jobs_older_than_their_task_are_not_its_own(placed):
    """A daemon whose state was reset numbers its tasks from t000001 again while squeue still
    shows the old daemon's jobs (MinJobAge): a job submitted before the task is not the task's."""
    client, tid = placed
    slurm = FakeSlurm()
    submitted = int(client.get_task(tid).submit_time)
    for i, node in enumerate(ALL):
        slurm.jobs[str(50 + i)] = {"job_id": 50 + i, "name": f"offcut-{tid}.1-{node}",
                                   "partition": "scavenger", "job_state": "FAILED",
                                   "nodes": node, "exit_code": 1 << 8,
                                   "submit_time": submitted - 600}
    r = Launcher(client, CFG, slurm, accounts=OWNERS).reconcile()
    assert sorted(n for _, n, _ in r.submitted) == ALL and not r.reported
    assert client.get_task(tid).failed_runs == 0


def test_the_launchers_collaborators_work_alone(caplog):
    """The launcher's collaborators without a Launcher or a daemon (slurm_plugin/job_stops.py,
    job_ownership.py, launch_types.py): the stopper signals a running job, cancels it only
    after rescale_grace_s and once, cancels a pending one at once, and forgets what squeue no
    longer shows; whose job it is: the task's uid and a recorded id or the key's tag; an
    error is logged once per kind until it recovers, and a gone task's kind is forgotten."""
    slurm, mono = FakeSlurm(), Clock(1000.0)
    taken: list[list[str]] = []
    stops = JobStopper(CFG, slurm, clock=lambda: 0.0, monotonic=mono, report_taken=taken.append)
    gen = Generation("t1", "elastic", 2, ("n1", "n2"), ("python", "train.py"), owner="test")
    running = slurm.submit(["-J", job_name(CFG, "t1", 1, "n1"), "-p", CFG.partition, "-w", "n1"])
    pending = slurm.submit(["-J", job_name(CFG, "t1", 1, "n2"), "-p", CFG.partition, "-w", "n2"])
    slurm.jobs[pending]["job_state"] = "PENDING"
    result = PassResult()
    for jid in (running, pending):
        job = JobInfo(jid, states=frozenset({slurm.jobs[jid]["job_state"]}))
        stops.stop(jid, parse_job_name(CFG, slurm.jobs[jid]["name"]), job, result)
    assert slurm.signals == [(running, CFG.signal)] and slurm.jobs[pending]["job_state"] == "CANCELLED"
    assert [r[2] for r in result.signalled] == [running] and [r[2] for r in result.cancelled] == [pending]
    job = JobInfo(running, states=frozenset({"RUNNING"}))
    name = parse_job_name(CFG, slurm.jobs[running]["name"])
    mono.t += CFG.rescale_grace_s - 1
    stops.stop(running, name, job, PassResult())
    assert slurm.jobs[running]["job_state"] == "RUNNING"  # within the grace
    mono.t += 2
    stops.stop(running, name, job, PassResult())
    stops.stop(running, name, job, result)  # once
    assert slurm.jobs[running]["job_state"] == "CANCELLED" and len(result.cancelled) == 1
    stops.forget({running})
    assert stops.cancelled == {running} and set(stops.signalled) == {running}
    assert not taken  # nothing was given back
    # whose job it is
    key = LauncherKey(b"k" * 32)
    rule = JobOwnership(CFG, slurm, OWNERS, lambda: key, started=time.time())
    mine = job_name(CFG, "t1", 2, "n1")
    tagged = JobInfo("7", name=mine, uid=1500, comment=key.job_tag(mine, 1500))
    assert rule.not_ours(tagged, gen) == ""
    assert "uid 1500" in rule.not_ours(JobInfo("8", name=mine, uid=0, comment=tagged.comment), gen)
    untagged = JobInfo("9", name=mine, uid=1500)
    assert "did not submit" in rule.not_ours(untagged, gen)
    rule.record("9")
    assert rule.not_ours(untagged, gen) == ""
    # errors once per kind
    errors = OnceLog()
    with caplog.at_level("ERROR", logger="offcut.slurm.launcher"):
        for _ in range(3):
            errors.error("script-t1", "cannot launch task t1")
        errors.ok("script-t1")
        errors.error("script-t1", "cannot launch task t1")
    assert caplog.text.count("cannot launch task t1") == 2
    errors.retain(lambda kind: kind != "script-t1")
    assert not errors.failing

"""The Slurm launcher (``offcut-slurm launch``): unit tests on a fake Slurm with a real daemon,
and the end-to-end scenario of issue 4 on the real 4-node Slurm 22.05 cluster of
tests/slurm_cluster.py (skipped with the reason when Slurm is not installed or not root)."""

from __future__ import annotations

import json
import shlex
import threading
import time

import hostlist
import pytest

from offcut.client import Client, make_task_spec
from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.launcher import (Launcher, batch_script, job_name, parse_job_name,
                                          run_state, sbatch_options)
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import JobInfo, SlurmCommandError, SlurmError
from offcut.v1 import tasks_pb2

ALL = ["n1", "n2", "n3", "n4"]
CFG = SlurmConfig()


def spec(name="elastic", command=("python", "train.py", "--epochs", "3")):
    return make_task_spec(name, nodes="1-4", work_samples=1e12,
                          scalability=([1, 2, 3, 4], [10.0, 19.0, 27.0, 34.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0, command=list(command))


# ----------------------------------------------------------------------------- pure parts
def test_job_names_round_trip():
    assert job_name(CFG, "t000001", "n1") == "offcut-t000001-n1"
    assert parse_job_name(CFG, "offcut-t000001-node-7.x") == ("t000001", "node-7.x")
    for other in ("wrap", "offcut-", "offcut-t1", "other-t000001-n1"):
        assert parse_job_name(CFG, other) is None


def test_batch_script_quotes_and_exports(tmp_path):
    cfg = SlurmConfig(command_template="srun --ntasks=1 {command} --rank {rank} --of {num_nodes}")
    script = batch_script(cfg, task_id="t000002", task_name="it's", node="n3", rank=1,
                          nodes=["n1", "n3"], command=["python", "-c", "print('a b')"],
                          address="unix:///run/o.sock")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    env = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))
    assert {k: shlex.split(v)[0] for k, v in env.items()} == {
        "OFFCUT_TASK_ID": "t000002", "OFFCUT_TASK_NAME": "it's", "OFFCUT_NODE": "n3",
        "OFFCUT_RANK": "1", "OFFCUT_NODELIST": "n[1,3]", "OFFCUT_NUM_NODES": "2",
        "OFFCUT_ADDRESS": "unix:///run/o.sock"}
    assert shlex.split(lines[-1]) == ["exec", "srun", "--ntasks=1", "python", "-c", "print('a b')",
                                      "--rank", "1", "--of", "2"]
    with pytest.raises(ValueError, match="no command"):
        batch_script(CFG, task_id="t1", task_name="x", node="n1", rank=0, nodes=["n1"],
                     command=[], address="a")
    opts = sbatch_options(SlurmConfig(account="acct", sbatch_args=["--qos=low"]), "offcut-t1-n1", "n1")
    assert opts[:7] == ["-p", "scavenger", "-w", "n1", "-N", "1", "--exclusive"]
    assert "--no-requeue" in opts and "--signal=B:USR1@60" in opts
    assert "--account=acct" in opts and opts[-1] == "--qos=low"


@pytest.mark.parametrize("states,ours,expected", [
    ({"PENDING"}, False, None), ({"RUNNING"}, False, "started"),
    ({"COMPLETED"}, False, "finished"), ({"FAILED"}, False, "failed"),
    ({"OUT_OF_MEMORY"}, False, "failed"), ({"PREEMPTED"}, False, "preempted"),
    ({"CANCELLED"}, True, None), ({"CANCELLED"}, False, "preempted"),
])
def test_run_state_of_slurm_states(states, ours, expected):
    assert run_state(JobInfo("1", states=frozenset(states)), ours) == expected


# ----------------------------------------------------------------------------- fake Slurm
class FakeSlurm(SlurmCLI):
    """squeue/sbatch/scancel in memory: jobs submitted run at once on their -w node."""

    def __init__(self):
        super().__init__()
        self.jobs: dict[str, dict] = {}
        self.next_id = 100
        self.fail_squeue = False
        self.scripts: dict[str, str] = {}

    def squeue_json(self) -> dict:
        if self.fail_squeue:
            raise SlurmCommandError("squeue exited with status 1: slurm_load_jobs error")
        return {"jobs": [dict(j) for j in self.jobs.values()]}

    def submit(self, options=(), *, wrap=None, script=None) -> str:
        opts = list(options)
        self.next_id += 1
        jid = str(self.next_id)
        self.jobs[jid] = {"job_id": int(jid), "name": opts[opts.index("-J") + 1],
                          "partition": opts[opts.index("-p") + 1], "job_state": "RUNNING",
                          "nodes": opts[opts.index("-w") + 1], "exit_code": 0}
        self.scripts[jid] = script
        return jid

    def cancel(self, job_ids, *, signal=None, options=()) -> None:
        for j in job_ids:
            self.jobs[str(j)]["job_state"] = "CANCELLED"

    def active(self) -> dict[str, str]:
        """node -> job id of running Offcut jobs."""
        return {j["nodes"]: str(j["job_id"]) for j in self.jobs.values() if j["job_state"] == "RUNNING"}


@pytest.fixture
def placed(daemon):
    """A daemon with n1..n4 idle and one running task on all four."""
    srv, client = daemon
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    tid = client.submit(spec(), owner="test").task.task_id
    assert sorted(client.get_task(tid).nodes) == ALL
    return client, tid


def test_launch_shrink_grow_finish_with_fake_slurm(placed):
    client, tid = placed
    slurm = FakeSlurm()
    launcher = Launcher(client, CFG, slurm)
    r = launcher.reconcile()
    assert sorted(n for _, n, _ in r.submitted) == ALL and not r.cancelled
    assert sorted(slurm.active()) == ALL
    r = launcher.reconcile()  # steady state: nothing to do, starts reported once
    assert not r.submitted and not r.cancelled and len(r.reported) == 4
    assert client.get_task(tid).launches == 4
    assert launcher.reconcile().reported == []
    # a restarted launcher adopts the jobs and submits nothing twice
    again = Launcher(client, CFG, slurm)
    r = again.reconcile()
    assert r.adopted == 4 and not r.submitted and not r.cancelled
    assert client.get_task(tid).launches == 4  # its re-sent reports were duplicates
    # preemption: Slurm ends the jobs on n3, n4; the launcher holds them until the daemon drops them
    for node in ("n3", "n4"):
        slurm.jobs[slurm.active()[node]]["job_state"] = "PREEMPTED"
    r = again.reconcile()
    assert sorted(r.held) == [(tid, "n3"), (tid, "n4")] and not r.submitted
    assert {s for _, _, s in r.reported} == {"preempted"}
    client.report_nodes(time.time(), "test", 2, preempted=["n3", "n4"])  # the prolog
    r = again.reconcile()
    assert not r.submitted and not r.held and sorted(slurm.active()) == ["n1", "n2"]
    # the nodes come back (the epilog): the task grows, the launcher submits
    client.report_nodes(time.time(), "test", 3, idle=["n3", "n4"])
    r = again.reconcile()
    assert sorted(n for _, n, _ in r.submitted) == ["n3", "n4"]
    # a shrink decided by the daemon cancels the job on the dropped node
    client.report_nodes(time.time(), "test", 4, preempted=["n1"])
    r = again.reconcile()
    assert [n for _, n, _ in r.cancelled] == ["n1"] and "n1" not in slurm.active()
    # the program finishes on one node: the task completes, the other jobs are cancelled
    done_job = slurm.active()["n2"]
    slurm.jobs[done_job]["job_state"] = "COMPLETED"
    r = again.reconcile()
    assert (tid, done_job, "finished") in r.reported
    task = client.get_task(tid)
    assert task.state == tasks_pb2.TASK_STATE_COMPLETED and not task.nodes
    # in the same pass: the completed task holds nothing, its other jobs are cancelled
    assert sorted(n for _, n, _ in r.cancelled) == ["n3", "n4"] and not slurm.active()
    assert not r.submitted
    # the cancelled jobs are not reported as failures or preemptions
    assert not again.reconcile().reported


def test_failed_job_fails_the_task(placed):
    client, tid = placed
    slurm = FakeSlurm()
    launcher = Launcher(client, CFG, slurm)
    launcher.reconcile()
    job = slurm.jobs[slurm.active()["n2"]]
    job.update(job_state="FAILED", exit_code=256)
    launcher.reconcile()
    task = client.get_task(tid)
    assert task.state == tasks_pb2.TASK_STATE_FAILED and "failed on n2" in task.last_run
    launcher.reconcile()
    assert not slurm.active()  # its other jobs were cancelled


def test_slurm_failure_submits_nothing_and_recovers(placed, caplog):
    client, tid = placed
    slurm = FakeSlurm()
    slurm.fail_squeue = True
    launcher = Launcher(client, CFG, slurm)
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
    time.sleep(0.6)
    assert not passes and th.is_alive()  # failing passes are logged and retried
    assert "reconciliation failed" in caplog.text
    slurm.fail_squeue = False
    th.join(10)
    assert passes and len(passes[0].submitted) == 4


def test_task_without_command_is_not_launched(daemon, caplog):
    srv, client = daemon
    client.sync_nodes(time.time(), "test", 1, idle=ALL)
    client.submit(spec(command=()), owner="test")
    slurm = FakeSlurm()
    r = Launcher(client, CFG, slurm).reconcile()
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
def offcut_jobs(slurm, tid: str, active_only: bool = True) -> dict[str, dict]:
    """node -> squeue record of the task's jobs, from Slurm's own view."""
    out = {}
    for j in slurm.jobs().values():
        parsed = parse_job_name(CFG, j.get("name", ""))
        if not parsed or parsed[0] != tid or j.get("partition") != "scavenger":
            continue
        if active_only and j["state"] not in ("PENDING", "CONFIGURING", "RUNNING"):
            continue
        out[parsed[1]] = j
    return out


def running_on(slurm, tid) -> set[str]:
    return {n for n, j in offcut_jobs(slurm, tid).items() if j["state"] == "RUNNING"}


@pytest.mark.slow
def test_end_to_end_on_real_slurm(slurm, cluster_daemon, tmp_path):
    """Issue 4's scenario: a 1-4 node task runs as four scavenger jobs; a regular sbatch -N2
    preempts two of them (they get the signal first), the task shrinks to two, the regular job
    runs; when it ends the task grows back to four; the task completes and its nodes are
    released. Each step is checked in squeue --json and in the daemon."""
    t_start = time.monotonic()
    srv, client = cluster_daemon
    marks = tmp_path / "marks"
    marks.mkdir()
    tmp_path.chmod(0o755)
    client.sync_nodes(time.time(), "slurm-watch", 1, idle=ALL)  # what `offcut-slurm watch` sends
    program = (f'trap \'touch "{marks}/usr1-$OFFCUT_NODE"\' USR1; '
               f'while [ ! -e "{marks}/done" ]; do sleep 0.2 & wait $!; done')
    tid = client.submit(spec(command=["bash", "-c", program]), owner="test").task.task_id
    assert sorted(client.get_task(tid).nodes) == ALL

    cfg = SlurmConfig(workdir=str(tmp_path), output=str(tmp_path / "%x-%j.out"))
    cli = SlurmCLI(slurm_conf=str(slurm.conf))
    stop = threading.Event()
    launcher_client = Client(client.address, timeout_s=10)
    th = threading.Thread(target=Launcher(launcher_client, cfg, cli).run, args=(0.5, stop),
                          daemon=True)
    th.start()
    try:
        # 1. placed on all four idle nodes as scavenger jobs, one per node
        slurm.wait_for(lambda: running_on(slurm, tid) == set(ALL), timeout=60,
                       what="four running Offcut jobs")
        jobs = offcut_jobs(slurm, tid)
        assert {n: j["node_list"] for n, j in jobs.items()} == {n: n for n in ALL}
        t_placed = time.monotonic()

        # a launcher restart while the jobs run: it adopts them and submits nothing
        stop.set()
        th.join(10)
        restarted = Launcher(launcher_client, cfg, cli)
        r = restarted.reconcile()
        assert r.adopted == 4 and not r.submitted and not r.cancelled
        assert {n: j["job_id"] for n, j in offcut_jobs(slurm, tid).items()} == \
            {n: j["job_id"] for n, j in jobs.items()}
        stop = threading.Event()
        th = threading.Thread(target=restarted.run, args=(0.5, stop), daemon=True)
        th.start()

        # 2. a regular job arrives: Slurm preempts two Offcut jobs, the prolog tells the daemon
        regular = slurm.sbatch("-N2", wrap="sleep 4")
        slurm.wait_state(regular, {"RUNNING", "COMPLETING", "COMPLETED"}, timeout=90)
        taken = set(hostlist.expand_hostlist(slurm.jobs()[regular]["node_list"]))
        assert len(taken) == 2
        slurm.wait_for(lambda: set(client.get_task(tid).nodes) == set(ALL) - taken, timeout=30,
                       what="the task to shrink to the other two nodes")
        assert running_on(slurm, tid) == set(ALL) - taken
        assert {p.name.removeprefix("usr1-") for p in marks.glob("usr1-*")} == taken
        t_shrunk = time.monotonic()

        # 3. the regular job ends: the epilog returns its nodes, the task grows back to four
        slurm.wait_state(regular, {"COMPLETED"}, timeout=60)
        slurm.wait_for(lambda: sorted(client.get_task(tid).nodes) == ALL, timeout=30,
                       what="the task to grow back to four nodes")
        slurm.wait_for(lambda: running_on(slurm, tid) == set(ALL), timeout=60,
                       what="four running Offcut jobs again")
        slurm.wait_for(lambda: client.get_task(tid).launches >= 6, timeout=30,
                       what="the launcher to report the new jobs started")
        assert client.get_task(tid).preemptions >= 1
        t_grown = time.monotonic()

        # 4. the program finishes: the task completes and its nodes are released
        (marks / "done").touch()
        slurm.wait_for(lambda: client.get_task(tid).state == tasks_pb2.TASK_STATE_COMPLETED,
                       timeout=60, what="the task to complete")
        assert not client.get_task(tid).nodes and client.status().nodes_in_use == 0
        slurm.wait_for(lambda: not offcut_jobs(slurm, tid), timeout=60,
                       what="no active Offcut job")
        finished = offcut_jobs(slurm, tid, active_only=False)
        assert {j["state"] for j in finished.values()} <= {"COMPLETED", "CANCELLED", "PREEMPTED"}
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

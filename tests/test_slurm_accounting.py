"""State repaired from Slurm's accounting (docs/deployment.md; slurm_plugin/launcher.py,
``Launcher.accounted``): the daemon and the launcher are killed, the task's jobs end and Slurm
forgets them, and after the restart the task's state is what ``sacct`` says, with nothing
submitted or counted twice.

Real parts: a second test cluster with slurmdbd on a private MariaDB and ``MinJobAge=2``
(tests/slurm_cluster.py, ``slurm_site``), ``offcutd`` as a subprocess killed with
SIGKILL, the launcher on the real ``squeue``/``sbatch``/``sacct``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from test_slurm_launcher import AS_LAUNCHER, offcut_jobs, spec

from offcut.client import Client
from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin.launcher import Launcher, parse_job_name
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import parse_sacct
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

NODES = ["n1", "n2"]


def spawn_offcutd(address: str, state: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "offcut.daemon", "--listen", address,
                                 "--state", str(state), "--solver", "dp", "--log-level",
                                 "warning"], stdout=fh, stderr=subprocess.STDOUT)


def test_jobs_that_ended_while_daemon_and_launcher_were_down_are_taken_from_sacct(
        slurm_site, tmp_path):
    cluster = slurm_site
    tmp_path.chmod(0o755)
    go = tmp_path / "go"
    state, log = tmp_path / "state.sqlite", tmp_path / "offcutd.log"
    cli = SlurmCLI(slurm_conf=str(cluster.conf))
    cfg = SlurmConfig(workdir=str(tmp_path), output=str(tmp_path / "%x-%j.out"),
                      checkpoint_root=str(tmp_path / "ckpt"))
    daemon = spawn_offcutd(cluster.address, state, log)
    try:
        with Client(cluster.address, timeout_s=10) as client:
            client.wait_ready(30)
            client.sync_nodes(time.time(), "slurm-watch", 1, idle=NODES)
            program = f'while [ ! -e "{go}" ]; do sleep 0.2; done'
            tid = client.submit(spec(command=["bash", "-c", program]),
                                owner="test").task.task_id
            assert sorted(client.get_task(tid).nodes) == NODES
            stop = threading.Event()
            th = threading.Thread(target=Launcher(client, cfg, cli, accounts=AS_LAUNCHER).run,
                                  args=(0.5, stop), daemon=True)
            th.start()
            try:
                cluster.wait_for(lambda: client.get_task(tid).launches == 2, timeout=60,
                                 what="both jobs running and reported started")
            finally:
                stop.set()
                th.join(10)
        jobs = {str(j["job_id"]) for j in offcut_jobs(cluster, tid).values()}
        assert len(jobs) == 2
        daemon.send_signal(signal.SIGKILL)  # the daemon and the launcher are gone
        daemon.wait(10)
        go.touch()  # the program ends: both jobs complete (exit 0) meanwhile
        cluster.wait_for(lambda: not offcut_jobs(cluster, tid, active_only=False), timeout=90,
                         interval=0.5, what="Slurm to forget the ended jobs (MinJobAge=2)")

        daemon = spawn_offcutd(cluster.address, state, log)
        with Client(cluster.address, timeout_s=10) as client:
            client.wait_ready(30)
            assert client.get_task(tid).state == TaskState.RUNNING  # (it knows no end)
            launcher = Launcher(client, cfg, cli, accounts=AS_LAUNCHER)
            passes = []

            def completed() -> bool:
                passes.append(launcher.reconcile())
                return client.get_task(tid).state == TaskState.COMPLETED

            cluster.wait_for(completed, timeout=60, interval=0.5,
                             what="the task to complete from Slurm's accounting")
            task = client.get_task(tid)
        assert not [p for p in passes if p.submitted]  # nothing submitted again
        assert {r[2] for p in passes for r in p.reported} == {"finished"}
        assert task.launches == 2  # each run counted once, across the restart
        names = [f"offcut-{tid}.1-{n}" for n in NODES]
        accounted = parse_sacct(cli.sacct(names, time.time() - 3600))
        assert {j.job_id for j in accounted} == jobs  # what sacct holds: the two, no more
        assert all(j.states == {"COMPLETED"} and parse_job_name(cfg, j.name) for j in accounted)
    finally:
        daemon.kill()
        daemon.wait(10)

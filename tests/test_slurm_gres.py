"""GPU nodes on real Slurm (docs/architecture.md, "Node kinds"; docs/deployment.md): the
watcher tells the daemon what each node has (from ``sinfo --json``), a task asking for one
GPU per node runs only on the GRES node with Slurm's ``CUDA_VISIBLE_DEVICES``, its jobs carry
the GRES and feature request, and a CPU task uses the other nodes.

Real parts: the ``slurm_site`` cluster (tests/slurm_cluster.py: n3 has one gpu GRES on a
fake device file and the feature a100), an in-process daemon on its address, the real
watcher and launcher on ``sinfo``/``squeue``/``sbatch``.
"""

from __future__ import annotations

import threading

from slurm_cluster import SITE_GPU_NODE
from test_slurm_launcher import AS_LAUNCHER, offcut_jobs

from offcut.client import Client
from offcut.client.taskspec import make_task_spec
from offcut.daemon.config import DaemonConfig, SlurmConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.slurm_plugin.launcher import Launcher
from offcut.slurm_plugin.rpc import NodeEventSender
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.sources import CLISource
from offcut.slurm_plugin.watcher import Watcher
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

CPU_NODES = ["n1", "n2"]


def test_a_gpu_task_runs_on_the_gres_node_and_a_cpu_task_on_the_others(slurm_site, tmp_path):
    cluster = slurm_site
    tmp_path.chmod(0o755)
    go = tmp_path / "go"
    srv = OffcutServer(DaemonConfig(listen=cluster.address, state=str(tmp_path / "s.sqlite"),
                                    solver="dp"))
    srv.start()
    cli = SlurmCLI(slurm_conf=str(cluster.conf))
    stop = threading.Event()
    try:
        with Client(cluster.address, timeout_s=10) as client:
            client.wait_ready(10)
            with NodeEventSender(cluster.address) as sender:
                watcher = Watcher(CLISource(cli), sender)
                assert watcher.step()  # the idle set and what each node has, from sinfo
            assert watcher.last_kinds[SITE_GPU_NODE] == (1, ("a100",))
            assert all(watcher.last_kinds[n] == (0, ()) for n in CPU_NODES)
            assert client.status().idle_nodes == 3

            program = (f'echo "gpus=${{CUDA_VISIBLE_DEVICES-unset}}" > '
                       f'"{tmp_path}/$OFFCUT_TASK_ID-$OFFCUT_NODE.env"; '
                       f'while [ ! -e "{go}" ]; do sleep 0.2; done')
            curve = ([1, 2, 3], [10.0, 19.0, 27.0])
            gpu = client.submit(make_task_spec(
                "gpu", nodes="1-3", work_samples=1e12, scalability=curve, rescale_up_s=0,
                rescale_down_s=0, command=["bash", "-c", program], gpus_per_node=1,
                constraint="a100"), owner="test").task.task_id
            cpu = client.submit(make_task_spec(
                "cpu", nodes="1-3", work_samples=1e12, scalability=curve, rescale_up_s=0,
                rescale_down_s=0, command=["bash", "-c", program]), owner="test").task.task_id
            assert list(client.get_task(gpu).nodes) == [SITE_GPU_NODE]
            assert sorted(client.get_task(cpu).nodes) == CPU_NODES

            cfg = SlurmConfig(workdir=str(tmp_path), output=str(tmp_path / "%x-%j.out"),
                              checkpoint_root=str(tmp_path / "ckpt"))
            th = threading.Thread(target=Launcher(client, cfg, cli, accounts=AS_LAUNCHER).run,
                                  args=(0.5, stop), daemon=True)
            th.start()
            try:
                check_runs(cluster, client, tmp_path, gpu, cpu)
            finally:
                stop.set()
                th.join(10)
    finally:
        go.touch()
        cluster.wait_for(lambda: not [j for j in cluster.jobs().values()
                                      if j["state"] in ("PENDING", "RUNNING", "COMPLETING")],
                         timeout=60, what="the jobs to end")
        srv.stop(0.2)


def check_runs(cluster, client, tmp_path, gpu: str, cpu: str) -> None:
    """The jobs of both tasks start with the GPU environment Slurm gives them, ask Slurm for
    what the tasks need, and the tasks complete when their program ends."""
    envs = {(t, n): tmp_path / f"{t}-{n}.env"
            for t, ns in ((gpu, [SITE_GPU_NODE]), (cpu, CPU_NODES)) for n in ns}
    cluster.wait_for(lambda: all(p.exists() and p.read_text().strip()
                                 for p in envs.values()),
                     timeout=90, what="every job of both tasks to start")
    # Slurm gave the GPU job its device (the fake /dev file of n3) and no GPU to others
    assert envs[(gpu, SITE_GPU_NODE)].read_text().strip() == "gpus=0"
    assert all(envs[(cpu, n)].read_text().strip() == "gpus=unset" for n in CPU_NODES)
    (job,) = offcut_jobs(cluster, gpu).values()  # squeue --json: what the job asked
    assert job["tres_per_node"] == "gres:gpu:1" and job["features"] == "a100"
    assert all(not j["tres_per_node"] and not j["features"]
               for j in offcut_jobs(cluster, cpu).values())

    (tmp_path / "go").touch()
    cluster.wait_for(lambda: {client.get_task(t).state for t in (gpu, cpu)}
                     == {TaskState.COMPLETED}, timeout=60,
                     what="both tasks to complete")

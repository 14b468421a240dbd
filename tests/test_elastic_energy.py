"""The training side of measured energy (offcut.client.elastic.energy; docs/execution.md,
"Energy"): which GPUs a process measures, Zeus's real ``ZeusMonitor`` (and NVML) over
nvidia-ml-py's functions replaced by stand-ins (no GPU here: the counters are the only fake
part), reports that never raise and end in bounded time, and a real 2-process gloo run whose
every rank reports to a real daemon, which sums exactly what they reported."""

from __future__ import annotations

import re
import time

import pytest

from offcut.client.elastic import ElasticEnv
from offcut.client.elastic.energy import (GenerationEnergy, GpuEnergyMeter, open_gpu_meter,
                                          own_gpus, process_gpus, visible_gpu_count)
from offcut.client.training import ManualBackend
from offcut.client.training.errors import BackendUnavailable
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from elastic_helpers import Generation


def env(tmp_path, rank=0, world_size=1, local_rank=0, local_world_size=1, **kw) -> ElasticEnv:
    return ElasticEnv(rank=rank, world_size=world_size, master_addr="127.0.0.1",
                      master_port=29500, checkpoint_dir=tmp_path, local_rank=local_rank,
                      local_world_size=local_world_size, **kw)


# ----------------------------------------------------------------------------- the GPUs
@pytest.mark.parametrize("visible, local_rank, procs, gpus", [
    (4, 0, 4, [0]), (4, 3, 4, [3]),               # one GPU per process: cuda:LOCAL_RANK
    (8, 1, 4, [2, 3]), (8, 0, 1, list(range(8))),  # several each, in blocks
    (6, 1, 4, [1]),                                # 6 // 4 = 1 each, GPUs 4-5 unused
    (2, 1, 4, [1]), (2, 3, 4, []),                 # fewer GPUs than processes: once each
    (0, 0, 1, []), (4, 4, 4, []),
])
def test_each_process_measures_its_own_gpus_once(visible, local_rank, procs, gpus):
    assert process_gpus(visible, local_rank, procs) == gpus


def test_the_launchers_gpus_come_first(tmp_path, caplog):
    e = env(tmp_path, local_rank=1, local_world_size=2)
    assert own_gpus(e, 8, {}) == [4, 5, 6, 7]                      # the rule
    assert own_gpus(e, 8, {"OFFCUT_LOCAL_GPUS": "2,3"}) == [2, 3]   # the launcher's binding
    assert own_gpus(e, 8, {"OFFCUT_LOCAL_GPUS": ""}) == []          # a CPU task
    assert own_gpus(e, 2, {"OFFCUT_LOCAL_GPUS": "1,2"}) == [1]
    assert "names GPUs beyond the 2 visible" in caplog.text
    assert own_gpus(e, 8, {"OFFCUT_LOCAL_GPUS": "x"}) == [4, 5, 6, 7]
    assert "is not a list of GPU positions" in caplog.text


def test_a_meter_reads_the_cumulative_energy_of_its_window():
    counter = {"j": 1000.0}
    meter = GpuEnergyMeter(ManualBackend(energy_j=lambda: counter["j"]), "manual")
    counter["j"] += 40.0
    assert meter.read_j() == pytest.approx(40.0)
    counter["j"] += 2.5
    assert meter.read_j() == pytest.approx(42.5)  # since the meter began, not since the last
    meter.close()


@pytest.fixture
def nvml(monkeypatch):
    """nvidia-ml-py's real module with its device functions replaced: 4 Ampere GPUs whose
    energy counters [mJ] the test moves. Zeus's ``NVIDIAGPUs`` and ``ZeusMonitor`` (and
    offcut's ``NvmlBackend``) run unchanged on top of it."""
    import pynvml
    import zeus.device.gpu as zeus_gpu
    from zeus.device.gpu.nvidia import nvml_is_available

    counters = {i: 1_000_000 * (i + 1) for i in range(4)}

    def not_supported(_handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name, fn in (("nvmlInit", lambda: None), ("nvmlShutdown", lambda: None),
                     ("nvmlDeviceGetCount", lambda: len(counters)),
                     ("nvmlDeviceGetHandleByIndex", lambda i: ("gpu", i)),
                     ("nvmlDeviceGetC2cModeInfoV", not_supported),
                     ("nvmlDeviceGetArchitecture", lambda h: pynvml.NVML_DEVICE_ARCH_AMPERE),
                     ("nvmlDeviceGetTotalEnergyConsumption", lambda h: counters[h[1]])):
        monkeypatch.setattr(pynvml, name, fn)
    for var in ("CUDA_VISIBLE_DEVICES", "ZEUSD_SOCK_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(zeus_gpu, "_gpus", None)  # Zeus's singleton: made again over these
    nvml_is_available.cache_clear()
    yield counters
    nvml_is_available.cache_clear()


def test_zeus_monitor_measures_the_gpus_of_local_rank_1_of_2(nvml, tmp_path):
    from zeus.monitor import ZeusMonitor

    assert visible_gpu_count() == 4
    meter = open_gpu_meter(env(tmp_path, rank=3, world_size=4, local_rank=1,
                               local_world_size=2), {})
    assert meter.name == "zeus" and isinstance(meter.backend.monitor, ZeusMonitor)
    assert meter.backend.gpu_indices == [2, 3] and meter.num_gpus == 2
    nvml[2] += 1_500
    nvml[3] += 2_500
    nvml[0] += 99_000                               # local rank 0's GPU: not ours
    assert meter.read_j() == pytest.approx(4.0)
    nvml[2] += 1_000
    assert meter.read_j() == pytest.approx(5.0)
    meter.close()


def test_nvml_measures_when_zeus_cannot_and_nothing_without_a_gpu(nvml, tmp_path,
                                                                  monkeypatch):
    import pynvml

    from offcut.client.training import backends

    def no_zeus(*args, **kwargs):
        raise BackendUnavailable("zeus is not installed")

    monkeypatch.setattr(backends, "ZeusMonitorBackend", no_zeus)
    meter = open_gpu_meter(env(tmp_path), {})      # one process: every GPU
    assert meter.name == "nvml" and meter.backend.gpu_indices == [0, 1, 2, 3]
    for i in nvml:
        nvml[i] += 250
    assert meter.read_j() == pytest.approx(1.0)

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert visible_gpu_count() == 0 and open_gpu_meter(env(tmp_path), {}) is None


def test_a_report_to_an_unreachable_daemon_is_logged_not_raised(tmp_path, caplog):
    class Meter:
        def read_j(self):
            return 12.5

    energy = GenerationEnergy(env(tmp_path, generation=2, task_id="t000001",
                                  address=f"unix://{tmp_path}/nobody.sock"), Meter())
    energy.start()
    started = time.monotonic()
    assert energy.report(timeout_s=1.0) is False
    energy.close(timeout_s=1.0)                     # the last report: failed too, quietly
    assert time.monotonic() - started < 10
    assert "energy report of 12.5 J (rank 0, generation 2) for t000001 failed" in caplog.text
    # a local run (no task, no daemon) measures and reports nothing
    local = GenerationEnergy(env(tmp_path), Meter())
    local.start()
    assert local.joules() == 12.5 and local.report(1.0) is False
    with pytest.raises(TypeError, match="energy_meter"):
        GenerationEnergy(env(tmp_path), meter=object())


# ----------------------------------------------------------------------------- processes
#: each rank's stand-in meter (no GPU here): 1000 J per step times (rank + 1), plus 7 J
FAKE_METER_RUN = (
    "import logging, os, sys\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
    "from offcut.client.elastic import ElasticRun\n"
    "rank = int(os.environ['RANK'])\n"
    "class Meter:\n"
    "    steps = 0\n"
    "    def read_j(self):\n"
    "        return 1000.0 * self.steps + 7.0\n"
    "meter = Meter()\n"
    "with ElasticRun.from_env(energy_meter=meter, checkpoint_every_steps=3) as run:\n"
    "    run.load_checkpoint()\n"
    "    done = run.samples_done\n"
    "    while done < 80:\n"
    "        done += 10\n"
    "        meter.steps += rank + 1\n"
    "        run.step(done, {'done': done})\n"
    "    run.save_checkpoint({'done': done}, done)\n"
    "    print('energy', run.energy_j, flush=True)\n")
REPORTED_J = re.compile(r"reported (\S+) J of rank (\d+) in generation (\d+) for (t\d+)")


def test_every_rank_reports_and_the_daemon_sums_the_reports(daemon, torch, tmp_path):
    """Two real processes (gloo) of a placed task's generation 1, each with a stand-in
    meter: every rank reports at each checkpoint and at its exit (rank 1's last report
    reaches a task that rank 0's final progress report already completed); the daemon's
    measured joules are the sum of each rank's last report."""
    srv, client = daemon
    client.report_nodes(time.time(), "slurm", 1, idle=["n1", "n2"])
    task = client.submit(tasks_pb2.TaskSpec(name="metered", min_nodes=1, max_nodes=2,
                                            total_work_samples=80,
                                            reports_progress=True)).task
    assert len(task.nodes) == 2 and task.generation == 1
    gen = Generation(2, tmp_path / "ck", tmp_path / "logs", [], generation=1,
                     extra={"OFFCUT_TASK_ID": task.task_id, "OFFCUT_ADDRESS": srv.address},
                     script=["-c", FAKE_METER_RUN])
    try:
        assert gen.wait() == [0, 0], gen.tails()
    finally:
        gen.kill()
    last = {}
    for r in gen.ranks:
        reports = [(float(j), int(rank), int(g), t) for j, rank, g, t in REPORTED_J.findall(r.err)]
        assert len(reports) >= 4, r.tail()       # 8 steps: checkpoints at 3 and 6, the end
        assert {(rank, g, t) for _, rank, g, t in reports} == {
            (int(r.name[-1]), 1, task.task_id)}
        figures = [j for j, *_ in reports]
        assert figures == sorted(figures)
        last[r.name] = figures[-1]
    # rank r: 8 steps of (r + 1) x 1000 J, plus 7 J
    assert last == {"gen1-rank0": 8007.0, "gen1-rank1": 16007.0}
    got = client.get_task(task.task_id)
    assert got.state == TaskState.COMPLETED
    assert (got.energy.source, got.energy.joules) == ("measured", sum(last.values()))
    assert (got.energy.last_generation, got.energy.last_generation_ranks,
            got.energy.last_generation_world_size) == (1, 2, 2)
    assert got.energy.samples_per_joule == pytest.approx(80 / sum(last.values()))
    assert "energy 8007.0" in gen.ranks[0].out

"""The training side of the Zeus optimizers (offcut.client.training) against a real daemon,
with an injected clock and energy (no GPU): cumulative epoch reports and stopping, the
power-limit profiling state machine (Zeus's GlobalPowerLimitOptimizer), interruptions,
restarts on the same trial, the optional-dependency contract and the NVML/Zeus backends'
unit conversions and permission errors (with stand-in libraries)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types

import pytest

from offcut.client import Client
from offcut.client.training import (ENV_ADDRESS, ENV_BATCH_SIZE, ENV_GENERATION, ENV_JOB_ID,
                                    ENV_RESUME_TRIAL, ENV_TASK_ID, ENV_TRIAL, ENV_VARS,
                                    ManualBackend, NvmlBackend, PowerLimitError,
                                    TrainingSetupError, TrialEndedError, ZeusTraining,
                                    per_rank_batch_size)
from offcut.zeus_views import zeus_cost
from offcut.errors import FailedPrecondition, NotFound
from offcut.v1 import zeus_pb2

from daemon_helpers import Clock, zeus_spec

MAX_POWER_W = 250.0


class RecordingBackend(ManualBackend):
    """ManualBackend that logs window events with the test's step counter."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.step = 0
        self.events: list[tuple] = []

    def begin_window(self, name):
        self.events.append(("begin", name, self.step))
        super().begin_window(name)

    def end_window(self, name, cancel=False):
        self.events.append(("cancel" if cancel else "end", name, self.step))
        return super().end_window(name, cancel)


class RecordingClient(Client):
    """Client that logs the power-limit calls."""

    def __init__(self, address):
        super().__init__(address, timeout_s=10)
        self.calls: list[tuple[str, float]] = []

    def interrupt_power_window(self, job_id, batch_size, power_limit_w):
        self.calls.append(("interrupt", power_limit_w))
        return super().interrupt_power_window(job_id, batch_size, power_limit_w)

    def report_power_window(self, job_id, batch_size, power_limit_w, time_s, energy_j):
        self.calls.append(("report", power_limit_w))
        return super().report_power_window(job_id, batch_size, power_limit_w, time_s, energy_j)


def job_spec(job_id="train", power=False, **kw) -> zeus_pb2.BatchSizeJobSpec:
    """The shared Zeus spec with batch sizes 32-128, 10 epochs to 0.9, no early stop, seed 1;
    the power-limit optimizer (100-250 W, 2 warm-up and 3 profiling steps) only with
    ``power``; ``kw`` replaces fields."""
    fields = dict(batch_sizes=[32, 64, 128], beta_knob=None, max_epochs=10, target_metric=0.9,
                  max_power_w=MAX_POWER_W, seed=1, power=zeus_pb2.PowerLimitSpec(
                      min_power_limit_w=100, max_power_limit_w=250, step_w=50, warmup_steps=2,
                      profile_steps=3) if power else None)
    fields.update(kw)
    return zeus_spec(job_id, **fields)


def step_time_s(limit_w: float) -> float:
    """Seconds per step at a power limit (slower at lower limits)."""
    return 0.1 * (250.0 / limit_w) ** 0.5


def draw_w(limit_w: float) -> float:
    """GPU power draw [W] at a power limit."""
    return 0.9 * limit_w


def trial_of(client, job_id, number):
    return next(t for t in client.get_zeus_job(job_id).trials if t.trial_number == number)


def run_steps(zt, backend, clock, steps, expected):
    """``steps`` training steps; adds each step's energy [J] to ``expected['energy']``."""
    for _ in range(steps):
        backend.step += 1
        zt.on_step_begin()
        dt = step_time_s(backend.power_limit_w)
        expected["energy"] += draw_w(backend.power_limit_w) * dt
        clock.t += dt


# ----------------------------------------------------------------------------- epochs
def test_epochs_report_cumulative_time_and_energy_and_stop_when_converged(daemon):
    _, client = daemon
    client.register_zeus_job(job_spec())
    clock = Clock()
    backend = ManualBackend(clock=clock, power_w=200.0, power_limit_range_w=(100.0, 250.0))
    zt = ZeusTraining(client, "train", backend=backend)
    assert (zt.trial_number, zt.batch_size) == (1, 64)
    assert not zt.power_enabled and not zt.should_stop
    for epoch, metric in enumerate([0.5, 0.7, 0.95], start=1):
        zt.on_epoch_begin()
        clock.t += 6.0                       # the epoch: 6 s at 200 W
        if epoch == 2:
            with pytest.raises(ValueError, match="finite"):
                zt.on_epoch_end(math.nan)    # rejected before anything changes
        verdict = zt.on_epoch_end(metric)
        clock.t += 100.0                     # between epochs: not part of any epoch
        trial = trial_of(client, "train", 1)
        assert (trial.epochs, trial.status) == (epoch, "converged" if epoch == 3 else "running")
        assert trial.time_s == pytest.approx(6.0 * epoch)
        assert trial.energy_j == pytest.approx(1200.0 * epoch)
        assert verdict.stop == (epoch == 3) == zt.should_stop
    assert zt.converged and zt.verdict.finished
    assert zt.verdict.cost_j == pytest.approx(zeus_cost(3600.0, 18.0, 0.5, MAX_POWER_W))
    assert "target" in zt.verdict.message
    with pytest.raises(TrialEndedError, match="should_stop"):
        zt.on_epoch_begin()
    zt.close()
    assert trial_of(client, "train", 1).status == "converged"  # EndTrial not needed
    with pytest.raises(RuntimeError, match="closed"):
        zt.on_epoch_begin()


def test_closing_ends_a_trial_without_a_verdict(daemon):
    _, client = daemon
    client.register_zeus_job(job_spec())
    clock = Clock()
    with ZeusTraining(client, "train", backend=ManualBackend(clock=clock, power_w=100.0)) as zt:
        zt.on_epoch_begin()
        clock.t += 5.0
        zt.on_epoch_end(0.1)
        zt.on_epoch_begin()                  # cut short: not reported
        clock.t += 3.0
    assert zt.verdict.finished and not zt.verdict.converged
    trial = trial_of(client, "train", 1)
    assert (trial.status, trial.epochs, trial.time_s) == ("failed", 1, pytest.approx(5.0))

    with pytest.raises(KeyError):            # the training crashes before any epoch
        with ZeusTraining(client, "train", backend=ManualBackend(clock=clock)):
            raise KeyError("boom")
    assert trial_of(client, "train", 2).status == "abandoned"


# ----------------------------------------------------------------------------- power limits
def test_profiling_follows_the_daemons_plan_and_ends_at_the_chosen_limit(daemon):
    _, client = daemon
    client.register_zeus_job(job_spec(power=True, max_epochs=2, target_metric=2.0))
    clock = Clock()
    backend = RecordingBackend(clock=clock, power_w=draw_w, power_limit_range_w=(100.0, 250.0))
    zt = ZeusTraining(client, "train", backend=backend)   # wait_steps=1 as in Zeus
    assert zt.power_enabled
    expected = {"energy": 0.0}
    for _ in range(2):
        zt.on_epoch_begin()
        run_steps(zt, backend, clock, 30, expected)
        zt.on_epoch_end(0.1)

    windows = [(kind, step) for kind, name, step in backend.events if name != zt.EPOCH_WINDOW]
    # wait 1 step, then per limit: 2 warm-up steps, a window over the next 3 steps, closed at
    # the following step_begin, which also starts the next limit's warm-up
    assert windows == [("begin", 4), ("end", 7), ("begin", 9), ("end", 12), ("begin", 14),
                       ("end", 17), ("begin", 19), ("end", 22)]
    profile = client.power_profile("train", 64)
    assert profile.done
    assert [m.power_limit_w for m in profile.measurements] == [250.0, 200.0, 150.0, 100.0]
    for m in profile.measurements:
        assert m.time_s == pytest.approx(3 * step_time_s(m.power_limit_w))
        assert m.energy_j == pytest.approx(m.time_s * draw_w(m.power_limit_w))
    chosen = min((250.0, 200.0, 150.0, 100.0), key=lambda w: zeus_cost(
        3 * step_time_s(w) * draw_w(w), 3 * step_time_s(w), 0.5, MAX_POWER_W))
    assert chosen != 100.0 and profile.chosen_power_limit_w == chosen
    assert backend.limits_set == [250.0, 200.0, 150.0, 100.0, chosen]
    assert backend.power_limit_w == zt.power_limit_w == chosen
    # profiling steps count in the trial's energy
    trial = trial_of(client, "train", 1)
    assert trial.energy_j == pytest.approx(expected["energy"])
    assert trial.status == "failed" and zt.should_stop
    zt.close()
    assert backend.power_limit_w == 250.0    # the maximum again, as Zeus does at exit


def test_an_epoch_ending_mid_window_interrupts_it_and_the_limit_is_profiled_again(daemon):
    _, client = daemon
    client.register_zeus_job(job_spec(power=True, target_metric=2.0))
    recording = RecordingClient(client.address)
    clock = Clock()
    backend = RecordingBackend(clock=clock, power_w=draw_w, power_limit_range_w=(100.0, 250.0))
    zt = ZeusTraining(recording, "train", backend=backend, wait_steps=0)
    expected = {"energy": 0.0}
    for steps in (4, 8, 20):
        zt.on_epoch_begin()
        run_steps(zt, backend, clock, steps, expected)
        zt.on_epoch_end(0.1)
    # epoch 1 (4 steps): warm-up 250 W at steps 1-2, window from step 3, cut at the epoch end;
    # epoch 2 (8 steps): 250 W again, then 200 W warm-up at 6-7, window from 8, cut;
    # epoch 3: 200, 150, 100 W complete
    assert recording.calls == [("interrupt", 250.0), ("report", 250.0), ("interrupt", 200.0),
                               ("report", 200.0), ("report", 150.0), ("report", 100.0)]
    cancelled = [(name, step) for kind, name, step in backend.events if kind == "cancel"]
    assert cancelled == [("offcut.power.250W", 4), ("offcut.power.200W", 12)]
    profile = client.power_profile("train", 64)
    assert profile.done
    for m in profile.measurements:           # no interrupted window counts
        assert m.time_s == pytest.approx(3 * step_time_s(m.power_limit_w))
    # an interruption sets the maximum limit, as Zeus does
    assert backend.limits_set == [250.0, 200.0, 250.0, 200.0, 150.0, 100.0,
                                  profile.chosen_power_limit_w]
    assert trial_of(client, "train", 1).energy_j == pytest.approx(expected["energy"])
    zt.close()
    recording.close()


# ----------------------------------------------------------------------------- restarts
def test_a_restarted_process_continues_the_trial_and_its_profile(daemon, monkeypatch):
    _, client = daemon
    client.register_zeus_job(job_spec(power=True, target_metric=2.0))
    pred = client.predict_batch_size("train")  # what the driver does
    for name, value in ((ENV_ADDRESS, client.address), (ENV_JOB_ID, "train"),
                        (ENV_TRIAL, str(pred.trial_number)),
                        (ENV_BATCH_SIZE, str(pred.batch_size))):
        monkeypatch.setenv(name, value)

    expected = {"energy": 0.0}
    clock = Clock()
    backend = RecordingBackend(clock=clock, power_w=draw_w, power_limit_range_w=(100.0, 250.0))
    first = ZeusTraining.from_env(backend=backend)
    for _ in range(2):                        # 2 epochs, then the process is preempted
        first.on_epoch_begin()
        run_steps(first, backend, clock, 10, expected)
        first.on_epoch_end(0.1)
    first.on_epoch_begin()
    reported = expected["energy"]
    run_steps(first, backend, clock, 5, expected)  # lost work: never reported
    lost = expected["energy"] - reported
    first.close(end_trial=False)
    assert trial_of(client, "train", pred.trial_number).status == "running"
    # 250 and 200 W measured; the 150 W window was open when the process went away
    measured = [m.power_limit_w for m in client.power_profile("train", 64).measurements]
    assert measured == [250.0, 200.0]

    clock = Clock()                           # a new process: a new clock, a new counter
    backend = RecordingBackend(clock=clock, power_w=draw_w, power_limit_range_w=(100.0, 250.0))
    again = ZeusTraining.from_env(backend=backend)
    assert (again.trial_number, again.batch_size, again.epoch) == (pred.trial_number, 64, 2)
    before = trial_of(client, "train", pred.trial_number)
    assert again.time_s == before.time_s and again.energy_j == before.energy_j
    for _ in range(3):
        again.on_epoch_begin()
        run_steps(again, backend, clock, 20, expected)
        again.on_epoch_end(0.1)
    trial = trial_of(client, "train", pred.trial_number)
    assert trial.epochs == 5
    assert trial.energy_j == pytest.approx(expected["energy"] - lost)
    assert trial.time_s > before.time_s
    profile = client.power_profile("train", 64)
    assert [m.power_limit_w for m in profile.measurements] == [250.0, 200.0, 150.0, 100.0]
    again.close()
    assert trial_of(client, "train", pred.trial_number).status == "failed"


def test_from_env_checks_the_contract(daemon, monkeypatch):
    _, client = daemon
    client.register_zeus_job(job_spec())
    for name in (ENV_ADDRESS, ENV_JOB_ID, ENV_TRIAL, ENV_BATCH_SIZE):
        monkeypatch.delenv(name, raising=False)
    backend = ManualBackend()
    with pytest.raises(TrainingSetupError, match=ENV_JOB_ID):
        ZeusTraining.from_env(backend=backend)
    monkeypatch.setenv(ENV_ADDRESS, client.address)
    monkeypatch.setenv(ENV_JOB_ID, "train")
    monkeypatch.setenv(ENV_TRIAL, "x")
    with pytest.raises(TrainingSetupError, match=f"{ENV_TRIAL}='x'"):
        ZeusTraining.from_env(backend=backend)
    pred = client.predict_batch_size("train")
    monkeypatch.setenv(ENV_TRIAL, str(pred.trial_number))
    monkeypatch.setenv(ENV_BATCH_SIZE, "128")
    with pytest.raises(TrainingSetupError, match="runs batch size 64"):
        ZeusTraining.from_env(backend=backend)
    assert trial_of(client, "train", pred.trial_number).status == "running"  # left alone
    monkeypatch.setenv(ENV_TRIAL, "9")
    with pytest.raises(NotFound, match="no trial 9"):
        ZeusTraining.from_env(backend=backend)
    monkeypatch.delenv(ENV_TRIAL)
    monkeypatch.delenv(ENV_BATCH_SIZE)
    with ZeusTraining.from_env(backend=backend) as zt:   # no trial: it predicts one
        assert zt.trial_number == pred.trial_number + 1
    with pytest.raises(TrainingSetupError, match="power spec"):
        ZeusTraining(client, "train", backend=backend, power=True)


def test_a_power_range_outside_the_gpus_is_refused_without_opening_a_trial(daemon):
    _, client = daemon
    client.register_zeus_job(job_spec(power=True))
    with pytest.raises(TrainingSetupError, match="100-250 W but the GPUs accept 150-300 W"):
        ZeusTraining(client, "train", backend=ManualBackend(power_limit_range_w=(150.0, 300.0)))
    assert len(client.get_zeus_job("train").trials) == 0


# ----------------------------------------------------------------------------- backends
def test_import_needs_neither_pynvml_nor_zeus_and_auto_says_what_to_install():
    code = ("import sys\n"
            "sys.modules['pynvml'] = None; sys.modules['zeus'] = None\n"
            "import offcut.client.training as t\n"
            "try:\n    t.default_backend()\n"
            "except t.BackendUnavailable as exc:\n    print('ERROR', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERROR no GPU measurement backend" in out.stdout
    for needle in ("zeus is not installed", "nvidia-ml-py is not installed",
                   "offcut[zeus]", "offcut[gpu]", "ManualBackend"):
        assert needle in out.stdout
    lazy = subprocess.run([sys.executable, "-c", "import sys, offcut.client.training\n"
                           "print(sorted(m for m in ('pynvml', 'zeus') if m in sys.modules))"],
                          capture_output=True, text=True, timeout=60)
    assert lazy.stdout.strip() == "[]", lazy.stderr


def fake_pynvml(root: bool):
    """A stand-in for nvidia-ml-py: 2 GPUs, energy in mJ, limits in mW."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    m.NVMLError, m.NVML_ERROR_NO_PERMISSION = NVMLError, 4
    m.energy_mj = {0: 1_000_000, 1: 5_000_000}
    m.limit_mw = {0: 300_000, 1: 300_000}
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: m.energy_mj[h]
    m.nvmlDeviceGetPowerManagementLimitConstraints = lambda h: (100_000, 300_000)
    m.nvmlDeviceGetPowerManagementLimit = lambda h: m.limit_mw[h]

    def set_limit(h, mw):
        if not root:
            raise NVMLError(4)
        m.limit_mw[h] = mw
    m.nvmlDeviceSetPowerManagementLimit = set_limit
    return m


def test_nvml_backend_converts_units_and_names_gpu_and_limit_on_permission_errors(monkeypatch):
    nvml = fake_pynvml(root=True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    backend = NvmlBackend()
    assert backend.num_gpus == 1 and backend.power_limit_range() == (100.0, 300.0)
    backend.begin_window("w")
    nvml.energy_mj[1] += 2_500                # 2.5 J on the visible GPU
    nvml.energy_mj[0] += 99_000               # an invisible GPU
    _, energy_j = backend.end_window("w")
    assert energy_j == pytest.approx(2.5)
    backend.set_power_limit(212.5)
    assert nvml.limit_mw == {0: 300_000, 1: 212_500}

    nvml = fake_pynvml(root=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    backend = NvmlBackend()
    assert backend.num_gpus == 2
    backend.set_power_limit(300.0)            # already there: needs no permission
    with pytest.raises(PowerLimitError, match=r"GPU 0's power limit to 150 W: permission "
                                              r"denied.*SYS_ADMIN") as err:
        backend.set_power_limit(150.0)
    assert (err.value.gpu_index, err.value.power_limit_w) == (0, 150.0)


def test_zeus_monitor_backend_sums_gpu_energy_and_translates_permission_errors(monkeypatch):
    # zeus is in the dev extra (the README's test command): this runs, it does not skip; the
    # real ZeusMonitor under this backend: tests/test_elastic_energy.py
    import zeus.device
    from zeus.device.gpu import ZeusGPUNoPermissionError
    from zeus.monitor.energy import Measurement

    from offcut.client.training import ZeusMonitorBackend

    class Monitor:
        gpu_indices = [0, 1]

        def begin_window(self, key, sync_execution=True):
            self.begun = (key, sync_execution)

        def end_window(self, key, sync_execution=True, cancel=False):
            if cancel:
                return Measurement(time=0.0, gpu_energy={0: 0.0, 1: 0.0})
            return Measurement(time=2.0, gpu_energy={0: 300.0, 1: 250.0}, cpu_energy={0: 1e6})

    class GPUs:
        def get_power_management_limit_constraints(self, i):
            return (100_000, 250_000)

        def set_power_management_limit(self, i, mw):
            raise ZeusGPUNoPermissionError("no permission")

    monkeypatch.setattr(zeus.device, "get_gpus", lambda *a, **k: GPUs())
    backend = ZeusMonitorBackend(monitor=Monitor(), sync_execution=False)
    backend.begin_window("w")
    assert backend.end_window("w") == (2.0, 550.0)   # GPUs only, summed
    assert backend.end_window("w", cancel=True) == (0.0, 0.0)
    assert backend.num_gpus == 2 and backend.power_limit_range() == (100.0, 250.0)
    with pytest.raises(PowerLimitError, match="GPU 0's power limit to 175 W: permission denied"):
        backend.set_power_limit(175.0)


# ----------------------------------------------------------------------------- generations
def prune_spec(job_id="gen", **kw) -> zeus_pb2.BatchSizeJobSpec:
    """The user's report: batch sizes 16/32/64/128, default 64."""
    fields = dict(batch_sizes=[16, 32, 64, 128], default_batch_size=64, num_pruning_rounds=1,
                  max_epochs=10, target_metric=0.9)
    fields.update(kw)
    return job_spec(job_id, **fields)


#: simulated training per (global) batch size: epochs to the target, seconds per epoch, W drawn
PROFILE = {16: (6, 67.5, 116.0), 32: (4, 36.25, 132.0), 64: (3, 20.625, 164.0),
           128: (5, 12.8125, 228.0)}


def train(zt, clock, backend, preempt_after: int | None = None) -> None:
    """Epochs until the daemon says stop; the metric reaches the target at the batch size's
    epoch (counted across generations). ``preempt_after``: after that many epochs of the
    trial, half an epoch runs, then the stop signal: the process exits 75."""
    epochs, epoch_s, watts = PROFILE[zt.batch_size]
    backend.power_w = watts
    while not zt.should_stop:
        zt.on_epoch_begin()
        if zt.epoch == preempt_after:
            clock.t += epoch_s / 2
            raise SystemExit(75)             # checkpoint written; EX_TEMPFAIL
        clock.t += epoch_s
        zt.on_epoch_end(0.95 if zt.epoch + 1 >= epochs else 0.1)


def test_a_preempted_generation_does_not_prune_its_batch_size(daemon):
    """Reproduction: one reported epoch, then the process is preempted (it checkpoints and
    exits 75); that used to send a plain EndTrial, which counted the run as not converged and
    ended pruning's downward walk: 16, 32 and 64 were pruned for good, leaving only 128."""
    _, client = daemon
    client.register_zeus_job(prune_spec())
    clock = Clock()
    backend = ManualBackend(clock=clock, power_w=100.0)
    with pytest.raises(SystemExit):
        with ZeusTraining(client, "gen", backend=backend, generation=1) as zt:
            assert zt.batch_size == 64
            train(zt, clock, backend, preempt_after=1)
    trial = trial_of(client, "gen", zt.trial_number)
    assert trial.status == "suspended", trial.status
    assert zt.suspended and not zt.verdict.finished
    assert json.loads(client.get_zeus_job("gen").state_json)["phase"] == "pruning"
    # the next generation resumes it from the checkpoint's trial number
    clock = Clock()
    backend = ManualBackend(clock=clock)
    with ZeusTraining(client, "gen", resume_trial=zt.trial_number, generation=2,
                      backend=backend) as again:
        assert (again.trial_number, again.epoch, again.resumed) == (zt.trial_number, 1, True)
        train(again, clock, backend)
    assert again.converged
    while json.loads(client.get_zeus_job("gen").state_json)["phase"] == "pruning":
        clock = Clock()
        backend = ManualBackend(clock=clock)
        with ZeusTraining(client, "gen", backend=backend) as zt:
            train(zt, clock, backend)
    assert json.loads(client.get_zeus_job("gen").state_json)["arms"] == [16, 32, 64, 128]


def _recurrences(client, n: int, preempt: tuple[int, int] | None, world_sizes=(4, 3)):
    """``n`` recurrences of job "gen", each a placed task whose generations run ZeusTraining;
    ``preempt`` = (recurrence, epochs): that recurrence's first generation is preempted after
    that many epochs and half of the next. Returns the batch sizes and, per recurrence, each
    generation's measured (time [s], energy [J]) and per-rank batch sizes."""
    sizes, measured = [], []
    for recurrence in range(1, n + 1):
        generations, trial, generation = [], None, 0
        while True:
            generation += 1
            clock = Clock()                  # every generation is a new process
            backend = ManualBackend(clock=clock)
            world = world_sizes[(generation - 1) % len(world_sizes)]
            preempt_after = preempt[1] if preempt and preempt[0] == recurrence \
                and generation == 1 else None
            try:
                with ZeusTraining(client, "gen", resume_trial=trial, generation=generation,
                                  backend=backend) as zt:
                    base = (zt.time_s, zt.energy_j)
                    ranks = [zt.per_rank_batch_size(world, r) for r in range(world)]
                    assert sum(ranks) == zt.batch_size
                    train(zt, clock, backend, preempt_after)
            except SystemExit as exc:
                assert exc.code == 75
            generations.append((zt.time_s - base[0], zt.energy_j - base[1], ranks))
            if not zt.suspended:
                break
            trial = zt.trial_number          # what the elastic helper keeps in its checkpoint
        sizes.append(zt.batch_size)
        measured.append(generations)
    return sizes, measured


def test_a_preemption_in_the_middle_of_a_trial_continues_it_over_recurrences(daemons):
    """A Zeus job over 6 recurrences, with a preemption in the middle of recurrence 2's trial
    (batch size 32, pruning): the trial continues in a second generation, its cost includes
    both generations (zeus_cost of the summed time and energy, Zeus, Section 3.1, Eq. 2), no arm is
    pruned by the interruption, and the batch sizes chosen are those of the same seeded run
    without the preemption."""
    _, plain = daemons.start("plain")
    plain.register_zeus_job(prune_spec(mab_num_explorations=1))
    expected_sizes, expected_measured = _recurrences(plain, 6, None)
    _, client = daemons.start("preempted")
    client.register_zeus_job(prune_spec(mab_num_explorations=1))
    sizes, measured = _recurrences(client, 6, preempt=(2, 2))

    assert sizes == expected_sizes and sizes[:4] == [64, 32, 16, 128]
    plain_job, job = plain.get_zeus_job("gen"), client.get_zeus_job("gen")
    assert json.loads(job.state_json)["arms"] == json.loads(plain_job.state_json)["arms"] \
        == [16, 32, 64, 128]
    assert job.best_batch_size == plain_job.best_batch_size
    assert [t.status for t in job.trials] == [t.status for t in plain_job.trials] \
        == ["converged"] * 6
    # recurrence 2: two generations, world sizes 4 then 3 (global batch 32 -> 8 or 11/11/10)
    assert [g[2] for g in measured[1]] == [[8, 8, 8, 8], [11, 11, 10]]
    (t1, e1, _), (t2, e2, _) = measured[1]
    epochs, epoch_s, watts = PROFILE[32]
    assert (t1, e1) == pytest.approx((2.5 * epoch_s, 2.5 * epoch_s * watts))
    assert (t2, e2) == pytest.approx((2 * epoch_s, 2 * epoch_s * watts))
    trial = job.trials[1]
    assert (trial.batch_size, trial.epochs, trial.interruptions, trial.generation) == (
        32, epochs, 1, 2)
    assert (trial.time_s, trial.energy_j) == pytest.approx((t1 + t2, e1 + e2))
    assert trial.cost_j == pytest.approx(zeus_cost(e1 + e2, t1 + t2, 0.5, MAX_POWER_W))
    # the half epoch lost to the preemption is what it cost more than without
    assert trial.cost_j - plain_job.trials[1].cost_j == pytest.approx(
        zeus_cost(0.5 * epoch_s * watts, 0.5 * epoch_s, 0.5, MAX_POWER_W))
    others = [t.cost_j for i, t in enumerate(job.trials) if i != 1]
    assert others == pytest.approx([t.cost_j for i, t in enumerate(plain_job.trials) if i != 1])
    assert all(len(m) == 1 for i, m in enumerate(measured) if i != 1)


def test_per_rank_batch_size_splits_the_global_batch_evenly():
    assert [per_rank_batch_size(32, 3, r) for r in range(3)] == [11, 11, 10]
    assert [per_rank_batch_size(64, 4, r, strict=True) for r in range(4)] == [16] * 4
    assert per_rank_batch_size(5, 5, 4) == 1
    for args, kwargs, needle in [((4, 8, 0), {}, "smaller than the world size 8"),
                                 ((32, 0, 0), {}, "world_size"),
                                 ((32, 4, 4), {}, r"rank must be in \[0, 4\)"),
                                 ((32, 4, -1), {}, "rank"),
                                 ((32, 3, 0), dict(strict=True), "does not split evenly")]:
        with pytest.raises(ValueError, match=needle):
            per_rank_batch_size(*args, **kwargs)


def test_from_env_resumes_the_trial_of_the_checkpoint(daemon, monkeypatch):
    _, client = daemon
    client.register_zeus_job(prune_spec())
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in ((ENV_ADDRESS, client.address), (ENV_JOB_ID, "gen"),
                        (ENV_GENERATION, "1"), (ENV_TASK_ID, "t000007")):
        monkeypatch.setenv(name, value)
    clock = Clock()
    backend = ManualBackend(clock=clock, power_w=100.0)
    with pytest.raises(SystemExit):
        with ZeusTraining.from_env(backend=backend) as first:
            train(first, clock, backend, preempt_after=1)
    # Predict's idempotency key came from the task and generation: a retry gets the trial
    assert client.predict_batch_size("gen", "offcut-task:t000007:g1").trial_number == \
        first.trial_number
    monkeypatch.setenv(ENV_GENERATION, "2")
    monkeypatch.setenv(ENV_RESUME_TRIAL, str(first.trial_number))
    monkeypatch.setenv(ENV_BATCH_SIZE, "64")
    backend = ManualBackend(clock=Clock())
    with ZeusTraining.from_env(backend=backend) as again:
        assert (again.trial_number, again.epoch, again.generation) == (first.trial_number, 1, 2)
        assert (again.time_s, again.energy_j) == (first.time_s, first.energy_j)
        assert again.interrupt().suspended
    assert trial_of(client, "gen", first.trial_number).generation == 2
    monkeypatch.setenv(ENV_TRIAL, "1")
    with pytest.raises(TrainingSetupError, match=f"{ENV_TRIAL} and {ENV_RESUME_TRIAL}"):
        ZeusTraining.from_env(backend=backend)
    monkeypatch.delenv(ENV_TRIAL)
    monkeypatch.setenv(ENV_GENERATION, "0")
    with pytest.raises(TrainingSetupError, match=f"{ENV_GENERATION}='0' must be >= 1"):
        ZeusTraining.from_env(backend=backend)
    monkeypatch.setenv(ENV_GENERATION, "3")
    monkeypatch.setenv(ENV_BATCH_SIZE, "128")   # a resumed process is checked as well
    with pytest.raises(TrainingSetupError, match="runs batch size 64"):
        ZeusTraining.from_env(backend=backend)
    # the refused process suspended the trial again: the next one can resume it
    assert trial_of(client, "gen", first.trial_number).status == "suspended"


def test_a_generation_killed_without_grace_is_taken_over_and_fenced_out(daemon):
    _, client = daemon
    client.register_zeus_job(prune_spec())
    clock = Clock()
    old = ZeusTraining(client, "gen", generation=1, backend=ManualBackend(clock=clock))
    old.on_epoch_begin()
    clock.t += 10.0
    old.on_epoch_end(0.1)
    old.on_epoch_begin()                 # SIGKILL here: no suspension
    with pytest.raises(FailedPrecondition, match="trial_number: .*running, held by generation 1"):
        ZeusTraining(client, "gen", resume_trial=old.trial_number, generation=1,
                     backend=ManualBackend())
    new = ZeusTraining(client, "gen", resume_trial=old.trial_number, generation=2,
                       backend=ManualBackend(clock=clock))
    assert new.taken_over and new.epoch == 1 and new.time_s == pytest.approx(10.0)
    clock.t += 10.0
    with pytest.raises(FailedPrecondition, match="generation: .*replaced"):
        old.on_epoch_end(0.1)            # a zombie of the replaced generation
    new.on_epoch_begin()
    clock.t += 5.0
    assert not new.on_epoch_end(0.1).stop
    assert trial_of(client, "gen", new.trial_number).epochs == 2
    new.close()                           # a real failure: ended as not converged
    assert trial_of(client, "gen", new.trial_number).status == "failed"
    with pytest.raises(FailedPrecondition, match="trial_number: .*already ended \\(failed\\)"):
        ZeusTraining(client, "gen", resume_trial=new.trial_number, generation=3,
                     backend=ManualBackend())
    with pytest.raises(TrainingSetupError, match="exclude each other"):
        ZeusTraining(client, "gen", 1, resume_trial=1, backend=ManualBackend())


def test_a_driver_restarted_process_resumes_a_suspended_trial(daemon, monkeypatch):
    """OFFCUT_ZEUS_TRIAL (a trial opened by a driver) of a suspended trial resumes it."""
    _, client = daemon
    client.register_zeus_job(prune_spec())
    pred = client.predict_batch_size("gen")
    clock = Clock()
    zt = ZeusTraining(client, "gen", pred.trial_number, backend=ManualBackend(clock=clock))
    zt.on_epoch_begin()
    clock.t += 4.0
    zt.on_epoch_end(0.1)
    zt.on_epoch_begin()
    clock.t += 1.0
    verdict = zt.interrupt()             # the cut epoch's second counts
    assert verdict.suspended and trial_of(client, "gen", pred.trial_number).time_s == 5.0
    again = ZeusTraining(client, "gen", pred.trial_number, backend=ManualBackend())
    assert again.resumed and again.epoch == 1 and again.time_s == 5.0
    again.close()


def test_suspend_and_resume_are_retried_while_the_daemon_restarts(daemons):
    """With a RetryPolicy, the interrupted EndTrial (cumulative figures: repeating it changes
    nothing) and ResumeTrial with a request id (the daemon replays the first answer) go
    through a daemon restart."""
    from offcut.client.retry import RetryPolicy
    from offcut.client.training import _call, _Calls

    srv, client = daemons.start()
    client.register_zeus_job(prune_spec())
    state = {"srv": srv, "restarts": 0}

    def sleep(wait_s):                       # the policy's wait: restart the daemon once
        if state["srv"] is None:
            state["srv"], _ = daemons.start()
            state["restarts"] += 1
        else:
            time.sleep(wait_s)

    policy = RetryPolicy(deadline_s=30.0, initial_backoff_s=0.05, max_backoff_s=0.2, sleep=sleep)
    with Client(client.address, timeout_s=10, retry=policy) as retrying:
        clock = Clock()
        zt = ZeusTraining(retrying, "gen", generation=1, backend=ManualBackend(clock=clock))
        zt.on_epoch_begin()
        clock.t += 3.0
        zt.on_epoch_end(0.1)
        daemons.stop(state.pop("srv"))
        state["srv"] = None
        assert zt.interrupt().suspended and state["restarts"] == 1
        daemons.stop(state["srv"])
        state["srv"] = None
        resumed = _call(retrying, _Calls.resume_trial, "gen", zt.trial_number, request_id="r1",
                        generation=2)
        assert state["restarts"] == 2 and (resumed.epochs, resumed.time_s) == (1, 3.0)
        again = _call(retrying, _Calls.resume_trial, "gen", zt.trial_number, request_id="r1",
                      generation=2)
        assert again == resumed
    assert policy.retries >= 2


def test_from_env_takes_the_checkpoints_trial_as_an_argument(daemon, monkeypatch):
    _, client = daemon
    client.register_zeus_job(prune_spec())
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_ADDRESS, client.address)
    monkeypatch.setenv(ENV_JOB_ID, "gen")
    monkeypatch.setenv(ENV_GENERATION, "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    with ZeusTraining.from_env(resume_trial=None, backend=ManualBackend()) as first:
        assert (first.batch_size, first.per_rank_batch_size()) == (64, 21)
        first.interrupt()
    monkeypatch.setenv(ENV_GENERATION, "2")
    with ZeusTraining.from_env(resume_trial=first.trial_number, backend=ManualBackend()) as zt:
        assert zt.resumed and zt.generation == 2 and zt.trial_number == first.trial_number

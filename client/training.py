"""Training side of the daemon's Zeus optimizers (Zeus, NSDI '23; DESIGN §5).

A training loop asks the daemon's batch-size optimizer for its batch size, measures each
epoch's time [s] and GPU energy [J], reports the trial's *cumulative* figures with the
validation metric after every epoch, and stops when the daemon says so (target reached, cost
bound ``beta_knob x min_cost`` crossed, or ``max_epochs``). When the job has a power spec, the
step hooks also profile GPU power limits as the daemon's power-limit optimizer plans them
(Zeus's ``GlobalPowerLimitOptimizer`` state machine, with the plan and the choice kept by the
daemon), then run at the chosen limit.

Minimal PyTorch-style loop (under ``offcut recur``, which sets the ``OFFCUT_*`` variables)::

    from offcut.client.training import ZeusTraining

    with ZeusTraining.from_env() as zt:          # backend: zeus, else pynvml
        loader = DataLoader(train_set, batch_size=zt.batch_size, shuffle=True)
        while not zt.should_stop:
            zt.on_epoch_begin()
            model.train()
            for x, y in loader:
                zt.on_step_begin()               # power-limit profiling
                optimizer.zero_grad()
                loss_fn(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            zt.on_epoch_end(validate(model))     # reports; zt.verdict says why it stopped

Without the driver, register the job once (``Client.register_zeus_job``) and construct
``ZeusTraining(address, job_id)``: it predicts a batch size and opens a trial itself.

Environment variables (the contract with ``offcut recur``, :mod:`offcut.client.recur`):

- ``OFFCUT_ADDRESS``: the daemon's address (``unix:///path.sock`` or ``HOST:PORT``); unset =
  the default socket.
- ``OFFCUT_ZEUS_JOB_ID``: the recurring job's id (required by :meth:`ZeusTraining.from_env`).
- ``OFFCUT_ZEUS_TRIAL``: the trial already opened for this run; unset = predict one.
- ``OFFCUT_BATCH_SIZE``: the trial's batch size (checked against the daemon's record).

A process restarted with the same ``OFFCUT_ZEUS_TRIAL`` (preemption, rescaling) continues the
trial: epochs, time and energy continue from what the daemon last recorded, and profiling
continues where the daemon's power profile is. Work done after the last reported epoch of the
previous process is not counted (the protocol reports whole epochs).

Measurement and actuation go through a :class:`MeasurementBackend`: :class:`ZeusMonitorBackend`
(the ``zeus`` package), :class:`NvmlBackend` (``nvidia-ml-py``) or :class:`ManualBackend`
(injected clock and energy, for tests and machines without a GPU). Neither ``zeus`` nor
``pynvml`` is imported until a backend that needs it is created. Setting power limits needs
root or the SYS_ADMIN capability.

Not thread-safe: call the hooks from the training loop's thread. With data parallelism, create
one object (e.g. on local rank 0) whose backend covers all the GPUs of the node, and broadcast
:attr:`ZeusTraining.should_stop` to the other ranks.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from offcut.client.api import Client
from offcut.errors import FailedPrecondition, NotFound
from offcut.v1 import zeus_pb2

logger = logging.getLogger("offcut.training")

# ----------------------------------------------------------------------------- env contract
ENV_ADDRESS = "OFFCUT_ADDRESS"
"""The daemon's address (``unix:///path.sock`` or ``HOST:PORT``)."""
ENV_JOB_ID = "OFFCUT_ZEUS_JOB_ID"
"""The recurring job's id."""
ENV_TRIAL = "OFFCUT_ZEUS_TRIAL"
"""The trial number opened by the driver for this run."""
ENV_BATCH_SIZE = "OFFCUT_BATCH_SIZE"
"""The trial's batch size."""
ENV_VARS = (ENV_ADDRESS, ENV_JOB_ID, ENV_TRIAL, ENV_BATCH_SIZE)

_INSTALL_HINT = ("install zeus (pip install 'offcut[zeus]') or nvidia-ml-py "
                 "(pip install 'offcut[gpu]') on a machine with an NVIDIA GPU, or pass "
                 "backend=ManualBackend(...) to run without GPU measurements")
_PERMISSION_HINT = ("setting GPU power limits needs root or the SYS_ADMIN capability (run as "
                    "root, or e.g. `docker run --cap-add SYS_ADMIN`), or run the job without "
                    "the power-limit optimizer (ZeusTraining(..., power=False))")


# ----------------------------------------------------------------------------- errors
class TrainingSetupError(ValueError):
    """The run cannot start as configured (a missing or malformed ``OFFCUT_*`` variable, a
    batch size that is not the trial's, a power range outside the GPU's); says what to fix."""


class BackendUnavailable(RuntimeError):
    """No measurement backend could be created (library missing, no GPU, no energy counter)."""


class PowerLimitError(RuntimeError):
    """A GPU refused a power limit. ``gpu_index`` (the framework's index) and
    ``power_limit_w`` [W] name what was attempted."""

    def __init__(self, message: str, gpu_index: int, power_limit_w: float):
        super().__init__(message)
        self.gpu_index = gpu_index
        self.power_limit_w = power_limit_w


class TrialEndedError(RuntimeError):
    """An epoch was started on a trial that already has a final verdict (check
    :attr:`ZeusTraining.should_stop` before each epoch)."""


# ----------------------------------------------------------------------------- backends
@runtime_checkable
class MeasurementBackend(Protocol):
    """Measures time and GPU energy over named windows and sets GPU power limits.

    Windows may overlap (the epoch window contains the profiling windows). All power figures
    are per GPU; energy is the sum over the backend's GPUs.
    """

    num_gpus: int
    """GPUs measured and actuated."""

    def begin_window(self, name: str) -> None:
        """Open the window ``name``. Raises ValueError if it is already open."""

    def end_window(self, name: str, cancel: bool = False) -> tuple[float, float]:
        """Close the window ``name``: (elapsed time [s], GPU energy [J]); (0, 0) when
        ``cancel``. Raises ValueError if it is not open."""

    def set_power_limit(self, watts: float) -> None:
        """Set every GPU's power limit to ``watts`` [W]. Raises :class:`PowerLimitError`."""

    def power_limit_range(self) -> tuple[float, float]:
        """The GPUs' (min, max) power limit [W] (the same for all of them)."""


class _CounterWindows:
    """Windows over a (time [s], cumulative energy [J]) reading."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[float, float]] = {}

    def _read(self) -> tuple[float, float]:  # pragma: no cover - overridden
        raise NotImplementedError

    def begin_window(self, name: str) -> None:
        """Open the window ``name`` (ValueError if open)."""
        if name in self._windows:
            raise ValueError(f"measurement window {name!r} is already open")
        self._windows[name] = self._read()

    def end_window(self, name: str, cancel: bool = False) -> tuple[float, float]:
        """(time [s], energy [J]) since ``begin_window(name)``; (0, 0) if ``cancel``
        (ValueError if not open)."""
        try:
            t0, e0 = self._windows.pop(name)
        except KeyError:
            raise ValueError(f"measurement window {name!r} is not open") from None
        if cancel:
            return 0.0, 0.0
        t1, e1 = self._read()
        return t1 - t0, e1 - e0


class ManualBackend(_CounterWindows):
    """A backend without a GPU: time from ``clock``, energy from ``energy_j`` or ``power_w``.

    Args:
        clock: seconds, monotonic (default :func:`time.monotonic`; tests pass a fake clock).
        energy_j: cumulative energy reading [J] of all GPUs (e.g. an external meter); when
            given, ``power_w`` is ignored.
        power_w: draw per GPU [W], a constant or a function of the current power limit [W];
            energy is integrated over the clock, piecewise between limit changes.
        power_limit_range_w: the simulated (min, max) power limit [W]; the limit starts at max.
        num_gpus: GPUs simulated (energy from ``power_w`` is multiplied by it).

    Attributes:
        power_limit_w: the current limit [W].
        limits_set: every limit passed to :meth:`set_power_limit`, in order.

    Raises:
        ValueError: ``num_gpus`` < 1, or an empty/negative range.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 energy_j: Callable[[], float] | None = None,
                 power_w: float | Callable[[float], float] = 0.0,
                 power_limit_range_w: tuple[float, float] = (100.0, 300.0), num_gpus: int = 1):
        super().__init__()
        lo, hi = (float(x) for x in power_limit_range_w)
        if not 0 < lo <= hi:
            raise ValueError(f"power_limit_range_w must satisfy 0 < min <= max, got {lo}, {hi}")
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        self.clock = clock
        self.energy_fn = energy_j
        self.power_w = power_w
        self.range_w = (lo, hi)
        self.num_gpus = num_gpus
        self.power_limit_w = hi
        self.limits_set: list[float] = []
        self._energy = 0.0
        self._last_t = clock()

    def _advance(self) -> tuple[float, float]:
        now = self.clock()
        if self.energy_fn is not None:
            return now, float(self.energy_fn())
        power = self.power_w(self.power_limit_w) if callable(self.power_w) else self.power_w
        self._energy += float(power) * self.num_gpus * (now - self._last_t)
        self._last_t = now
        return now, self._energy

    def _read(self) -> tuple[float, float]:
        return self._advance()

    def set_power_limit(self, watts: float) -> None:
        """Set the simulated limit [W] (ValueError outside the range)."""
        lo, hi = self.range_w
        if not lo - 1e-9 <= watts <= hi + 1e-9:
            raise ValueError(f"{watts} W is outside the power limit range [{lo}, {hi}] W")
        self._advance()  # energy so far at the old limit
        self.power_limit_w = float(watts)
        self.limits_set.append(float(watts))

    def power_limit_range(self) -> tuple[float, float]:
        """The simulated (min, max) limit [W]."""
        return self.range_w


def _import_pynvml():
    try:
        import pynvml  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError:
        raise BackendUnavailable("nvidia-ml-py is not installed "
                                 "(pip install 'offcut[gpu]')") from None
    return pynvml


def _visible_handles(pynvml, gpu_indices: Sequence[int] | None) -> tuple[list[int], list]:
    """NVML handles of ``gpu_indices`` counted in CUDA_VISIBLE_DEVICES order (all visible GPUs
    when None)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    else:
        handles = []
        for entry in (e.strip() for e in visible.split(",") if e.strip()):
            if entry.startswith("MIG"):
                raise BackendUnavailable(f"CUDA_VISIBLE_DEVICES names a MIG slice ({entry}); NVML "
                                         "cannot measure the energy of MIG slices")
            if entry.startswith("GPU-"):
                handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry))
            else:
                try:
                    handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
                except ValueError:
                    raise BackendUnavailable(
                        f"cannot parse CUDA_VISIBLE_DEVICES={visible!r}") from None
    indices = list(range(len(handles))) if gpu_indices is None else [int(i) for i in gpu_indices]
    for i in indices:
        if not 0 <= i < len(handles):
            raise BackendUnavailable(f"GPU index {i} is not among the {len(handles)} visible GPUs")
    if not indices:
        raise BackendUnavailable("NVML sees no GPU")
    return indices, [handles[i] for i in indices]


def _homogeneous_range(ranges_mw: list[tuple[int, int]],
                       indices: Sequence[int]) -> tuple[float, float]:
    if any(r != ranges_mw[0] for r in ranges_mw):
        detail = ", ".join(f"GPU {i}: {lo / 1000:g}-{hi / 1000:g} W"
                           for i, (lo, hi) in zip(indices, ranges_mw))
        raise ValueError(f"the GPUs' power limit ranges differ ({detail}); use GPUs of one model")
    lo, hi = ranges_mw[0]
    return lo / 1000.0, hi / 1000.0


def nvml_power_limit_range(gpu_indices: Sequence[int] | None = None) -> tuple[float, float, int]:
    """(min [W], max [W], number of GPUs) of the visible NVIDIA GPUs, read with pynvml
    (respects ``CUDA_VISIBLE_DEVICES``).

    Raises:
        BackendUnavailable: nvidia-ml-py missing, NVML cannot start, or no GPU.
        ValueError: the GPUs' ranges differ.
    """
    pynvml = _import_pynvml()
    try:
        pynvml.nvmlInit()
        indices, handles = _visible_handles(pynvml, gpu_indices)
        ranges = [tuple(pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)) for h in handles]
    except pynvml.NVMLError as exc:
        raise BackendUnavailable(f"NVML: {exc}") from None
    lo, hi = _homogeneous_range(ranges, indices)
    return lo, hi, len(handles)


class NvmlBackend(_CounterWindows):
    """GPU time and energy from NVML's energy counters (Volta or newer), power limits through
    ``nvmlDeviceSetPowerManagementLimit`` (milliwatts in NVML, watts here).

    Args:
        gpu_indices: GPUs to measure, as the framework counts them (indices into
            ``CUDA_VISIBLE_DEVICES``); default all visible GPUs.
        sync: called before every reading to wait for queued GPU work (e.g.
            ``torch.cuda.synchronize``); without it a window may end before the GPU has run
            the work queued in it.

    Raises:
        BackendUnavailable: nvidia-ml-py is not installed, NVML cannot start (no driver or GPU),
            a GPU lacks an energy counter, or ``CUDA_VISIBLE_DEVICES`` names MIG slices.
    """

    def __init__(self, gpu_indices: Sequence[int] | None = None, *,
                 sync: Callable[[], None] | None = None):
        super().__init__()
        pynvml = _import_pynvml()
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self.gpu_indices, self.handles = _visible_handles(pynvml, gpu_indices)
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML could not start ({exc})") from None
        for i, handle in zip(self.gpu_indices, self.handles):
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            except pynvml.NVMLError as exc:
                raise BackendUnavailable(
                    f"GPU {i} has no readable energy counter ({exc}; needs Volta or newer); the "
                    "zeus backend samples power on older GPUs") from None
        self.num_gpus = len(self.handles)
        self.sync = sync

    def _read(self) -> tuple[float, float]:
        if self.sync is not None:
            self.sync()
        now = time.monotonic()
        energy_mj = sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles)
        return now, energy_mj / 1000.0

    def power_limit_range(self) -> tuple[float, float]:
        """(min, max) power limit [W] of the GPUs (ValueError if they differ)."""
        ranges = [tuple(self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(h))
                  for h in self.handles]
        return _homogeneous_range(ranges, self.gpu_indices)

    def set_power_limit(self, watts: float) -> None:
        """Set every GPU's limit to ``watts`` [W] (skipped where it is already set).

        Raises:
            PowerLimitError: NVML refused (no permission: needs root/SYS_ADMIN; a limit
                outside the GPU's range), naming the GPU and the limit.
        """
        nvml = self.nvml
        milliwatts = int(round(watts * 1000))
        for i, handle in zip(self.gpu_indices, self.handles):
            try:
                if nvml.nvmlDeviceGetPowerManagementLimit(handle) == milliwatts:
                    continue
                nvml.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_NO_PERMISSION:
                    raise PowerLimitError(f"cannot set GPU {i}'s power limit to {watts:g} W: "
                                          f"permission denied; {_PERMISSION_HINT}",
                                          i, watts) from None
                raise PowerLimitError(f"cannot set GPU {i}'s power limit to {watts:g} W: {exc}",
                                      i, watts) from None


class ZeusMonitorBackend:
    """Time and GPU energy from Zeus's ``ZeusMonitor`` (energy counters, or power sampling on
    GPUs older than Volta); power limits through ``zeus.device.get_gpus()``.

    Args:
        gpu_indices: GPUs to measure, as the framework counts them; default all visible.
        monitor: an existing ``ZeusMonitor`` to use instead of creating one (GPU energy only:
            create it with ``cpu_indices=[]``).
        sync_execution: let Zeus wait for queued GPU work at window edges
            (``torch.cuda.synchronize`` by default); None = when the framework named by
            ``sync_execution_with`` is installed.
        sync_execution_with: ``torch`` | ``jax`` | ``cupy``.

    Raises:
        BackendUnavailable: zeus is not installed, or it finds no GPU.
    """

    def __init__(self, gpu_indices: Sequence[int] | None = None, *, monitor=None,
                 sync_execution: bool | None = None, sync_execution_with: str = "torch"):
        if monitor is None:
            try:
                from zeus.monitor import ZeusMonitor  # noqa: PLC0415 - optional dependency
            except ImportError:
                raise BackendUnavailable("zeus is not installed "
                                         "(pip install 'offcut[zeus]')") from None
            try:
                monitor = ZeusMonitor(gpu_indices=list(gpu_indices) if gpu_indices is not None
                                      else None, cpu_indices=[],
                                      sync_execution_with=sync_execution_with)
            except Exception as exc:  # zeus raises assorted errors when it cannot start
                raise BackendUnavailable(f"ZeusMonitor could not start ({exc})") from None
        if not monitor.gpu_indices:
            raise BackendUnavailable("zeus found no GPU")
        self.monitor = monitor
        self.gpu_indices = list(monitor.gpu_indices)
        self.num_gpus = len(self.gpu_indices)
        if sync_execution is None:
            sync_execution = importlib.util.find_spec(sync_execution_with) is not None
            if not sync_execution:
                logger.warning("%s is not installed: measurement windows do not wait for queued "
                               "GPU work", sync_execution_with)
        self.sync_execution = sync_execution

    def begin_window(self, name: str) -> None:
        """Open the window ``name`` (ValueError if open)."""
        self.monitor.begin_window(name, sync_execution=self.sync_execution)

    def end_window(self, name: str, cancel: bool = False) -> tuple[float, float]:
        """(time [s], GPU energy [J]) of the window; (0, 0) if ``cancel``."""
        m = self.monitor.end_window(name, sync_execution=self.sync_execution, cancel=cancel)
        return float(m.time), float(sum(m.gpu_energy.values()))

    def _gpus(self):
        from zeus.device import get_gpus  # noqa: PLC0415 - optional dependency

        return get_gpus()

    def power_limit_range(self) -> tuple[float, float]:
        """(min, max) power limit [W] of the GPUs (ValueError if they differ)."""
        gpus = self._gpus()
        ranges = [tuple(gpus.get_power_management_limit_constraints(i)) for i in self.gpu_indices]
        return _homogeneous_range(ranges, self.gpu_indices)

    def set_power_limit(self, watts: float) -> None:
        """Set every GPU's limit to ``watts`` [W].

        Raises:
            PowerLimitError: Zeus reports no permission (needs root/SYS_ADMIN) or another
                error, naming the GPU and the limit.
        """
        from zeus.device.gpu import ZeusGPUNoPermissionError  # noqa: PLC0415

        gpus = self._gpus()
        for i in self.gpu_indices:
            try:
                gpus.set_power_management_limit(i, int(round(watts * 1000)))
            except ZeusGPUNoPermissionError:
                raise PowerLimitError(f"cannot set GPU {i}'s power limit to {watts:g} W: "
                                      f"permission denied; {_PERMISSION_HINT}", i, watts) from None
            except Exception as exc:  # zeus wraps NVML/AMDSMI errors in its own classes
                raise PowerLimitError(f"cannot set GPU {i}'s power limit to {watts:g} W: {exc}",
                                      i, watts) from None


def default_backend(gpu_indices: Sequence[int] | None = None) -> MeasurementBackend:
    """The first backend that works: :class:`ZeusMonitorBackend`, then :class:`NvmlBackend`.

    Raises:
        BackendUnavailable: neither works; the message gives each one's reason and what to
            install (or to pass ``backend=ManualBackend(...)``).
    """
    reasons = []
    for name, factory in (("zeus", ZeusMonitorBackend), ("pynvml", NvmlBackend)):
        try:
            backend = factory(gpu_indices)
        except BackendUnavailable as exc:
            reasons.append(f"{name}: {exc}")
            continue
        logger.info("measuring with the %s backend (%d GPUs)", name, backend.num_gpus)
        return backend
    raise BackendUnavailable(f"no GPU measurement backend ({'; '.join(reasons)}); {_INSTALL_HINT}")


# ----------------------------------------------------------------------------- verdict
@dataclass(frozen=True)
class Verdict:
    """The daemon's answer to a report: ``stop`` training; ``converged`` (meaningful once
    ``finished``: the trial reached the target within the cost bound); the trial's zeus_cost
    ``cost_j`` [J] so far; a readable ``message``; ``finished`` (the trial is closed)."""

    stop: bool
    converged: bool
    cost_j: float
    message: str
    finished: bool

    @classmethod
    def from_pb(cls, pb: zeus_pb2.TrialVerdict) -> "Verdict":
        """From the ``offcut.v1.TrialVerdict`` message."""
        return cls(pb.stop, pb.converged, pb.cost_j, pb.message, pb.finished)


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise TrainingSetupError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise TrainingSetupError(f"{name}={raw!r} must be >= 1")
    return value


# ----------------------------------------------------------------------------- training
_IDLE, _OFF, _READY, _WARMUP, _WINDOW, _DONE = "idle", "off", "ready", "warmup", "window", "done"


class ZeusTraining:
    """One run (trial) of a recurring job, driven by the daemon's Zeus optimizers.

    Construction resolves the backend, reads the job (GetJob), then opens a trial (Predict)
    or, given ``trial_number``, continues that trial from the daemon's record of its epochs,
    time and energy. Call :meth:`on_epoch_begin` / :meth:`on_epoch_end` around every epoch
    (validation included) and :meth:`on_step_begin` before every training step; stop when
    :attr:`should_stop`. :meth:`close` (or leaving the ``with`` block) ends a trial that has
    no final verdict (EndTrial) and gives the GPUs their maximum power limit back.

    Args:
        client: a :class:`Client`, or the daemon's address (None = default socket); an
            address makes this object own (and close) the client.
        job_id: the registered job.
        trial_number: continue this trial; None = open one with Predict.
        backend: measurement backend; None = :func:`default_backend`.
        request_id: Predict's idempotency key (a retried construction gets the same trial).
        expected_batch_size: if given, must equal the trial's batch size.
        power: profile and set power limits: None = when the job has a power spec; False =
            never; True = required (error if the job has no power spec).
        wait_steps: steps before the first profiling warm-up (Zeus's ``wait_steps``: the
            first iterations are often unrepresentative).
        end_trial_on_close: whether :meth:`close` ends an unfinished trial (set False when a
            supervisor restarts this process on the same trial and ends it itself).
        restore_power_limit: whether :meth:`close` sets the GPUs' maximum limit again.

    Raises:
        NotFound: unknown job or trial (from the daemon).
        FailedPrecondition: Predict found every batch size failed.
        Unavailable: the daemon cannot be reached.
        TrainingSetupError: a batch size that is not the trial's, ``power=True`` without a
            power spec, or a power range outside the GPUs'.
        BackendUnavailable: no backend given and none available.
    """

    EPOCH_WINDOW = "offcut.epoch"

    def __init__(self, client: Client | str | None, job_id: str, trial_number: int | None = None,
                 *, backend: MeasurementBackend | None = None, request_id: str = "",
                 expected_batch_size: int | None = None, power: bool | None = None,
                 wait_steps: int = 1, end_trial_on_close: bool = True,
                 restore_power_limit: bool = True):
        if wait_steps < 0:
            raise ValueError(f"wait_steps must be >= 0, got {wait_steps}")
        self._owns_client = not isinstance(client, Client)
        self.client = client if isinstance(client, Client) else Client(client)
        self.job_id = job_id
        self.wait_steps = wait_steps
        self.end_trial_on_close = end_trial_on_close
        self.restore_power_limit = restore_power_limit
        self._closed = False
        self._in_epoch = False
        self._verdict: Verdict | None = None
        self._phase = _IDLE
        self._plan: zeus_pb2.PowerPlan | None = None
        self._steps_left = 0
        self._current_limit_w: float | None = None
        self._opened_trial = False
        try:
            self.backend = backend if backend is not None else default_backend()
            job = self.client.get_zeus_job(job_id)
            self._setup_power(job, power)
            if trial_number is None:
                pred = self.client.predict_batch_size(job_id, request_id)
                self._opened_trial = True
                self.trial_number, self.batch_size = pred.trial_number, pred.batch_size
                self._epochs, self._time_s, self._energy_j = 0, 0.0, 0.0
                logger.info("job %s: trial %d, batch size %d", job_id, self.trial_number,
                            self.batch_size)
            else:
                self._continue_trial(job, trial_number)
            if expected_batch_size is not None and expected_batch_size != self.batch_size:
                raise TrainingSetupError(
                    f"{ENV_BATCH_SIZE}={expected_batch_size} but trial {self.trial_number} of "
                    f"job {job_id!r} runs batch size {self.batch_size}")
        except BaseException:
            if self._opened_trial:  # do not leave a trial open that will never run
                try:
                    self.client.end_trial(job_id, self.trial_number)
                except Exception:  # noqa: BLE001 - the original error matters more
                    pass
            if self._owns_client:
                self.client.close()
            raise

    def _setup_power(self, job: zeus_pb2.ZeusJob, power: bool | None) -> None:
        has_spec = job.spec.HasField("power")
        if power and not has_spec:
            raise TrainingSetupError(f"power=True but job {self.job_id!r} was registered "
                                     "without a power spec")
        self.power_enabled = has_spec if power is None else bool(power)
        if not self.power_enabled:
            self._phase = _OFF
            return
        spec = job.spec.power
        self._max_limit_w = spec.max_power_limit_w
        lo, hi = self.backend.power_limit_range()
        if spec.min_power_limit_w < lo - 1e-6 or spec.max_power_limit_w > hi + 1e-6:
            raise TrainingSetupError(
                f"job {self.job_id!r} profiles power limits {spec.min_power_limit_w:g}-"
                f"{spec.max_power_limit_w:g} W but the GPUs accept {lo:g}-{hi:g} W")

    def _continue_trial(self, job: zeus_pb2.ZeusJob, trial_number: int) -> None:
        trial = next((t for t in job.trials if t.trial_number == trial_number), None)
        if trial is None:
            raise NotFound(f"job {self.job_id!r} has no trial {trial_number}", "trial_number")
        self.trial_number, self.batch_size = trial.trial_number, trial.batch_size
        self._epochs, self._time_s, self._energy_j = trial.epochs, trial.time_s, trial.energy_j
        if trial.status != "running":
            self._verdict = Verdict(True, trial.status == "converged", trial.cost_j,
                                    f"trial {trial_number} already ended ({trial.status})", True)
        logger.info("job %s: continuing trial %d (batch size %d) after epoch %d, %.1f s, %.1f J",
                    self.job_id, trial_number, self.batch_size, self._epochs, self._time_s,
                    self._energy_j)

    @classmethod
    def from_env(cls, backend: MeasurementBackend | None = None, *,
                 environ: Mapping[str, str] | None = None, **kwargs) -> "ZeusTraining":
        """Construct from the ``OFFCUT_*`` variables set by ``offcut recur`` (see the module
        docstring); ``kwargs`` go to the constructor.

        Raises:
            TrainingSetupError: ``OFFCUT_ZEUS_JOB_ID`` unset, a non-integer (or < 1) trial or
                batch size, ``OFFCUT_BATCH_SIZE`` without ``OFFCUT_ZEUS_TRIAL``; and whatever
                the constructor raises.
        """
        env = os.environ if environ is None else environ
        job_id = env.get(ENV_JOB_ID, "").strip()
        if not job_id:
            raise TrainingSetupError(f"{ENV_JOB_ID} is not set: run under `offcut recur` or "
                                     "construct ZeusTraining(address, job_id)")
        trial = _env_int(env, ENV_TRIAL)
        batch_size = _env_int(env, ENV_BATCH_SIZE)
        if batch_size is not None and trial is None:
            raise TrainingSetupError(f"{ENV_BATCH_SIZE} is set but {ENV_TRIAL} is not: the batch "
                                     "size comes with a trial opened by the driver")
        return cls(env.get(ENV_ADDRESS) or None, job_id, trial, backend=backend,
                   expected_batch_size=batch_size, **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def epoch(self) -> int:
        """Epochs of the trial reported so far (across restarts)."""
        return self._epochs

    @property
    def time_s(self) -> float:
        """Cumulative time of the trial [s]: the daemon's record when this object started plus
        this process's epochs."""
        return self._time_s

    @property
    def energy_j(self) -> float:
        """Cumulative GPU energy of the trial [J]."""
        return self._energy_j

    @property
    def verdict(self) -> Verdict | None:
        """The daemon's last verdict (None before the first report of a new trial)."""
        return self._verdict

    @property
    def should_stop(self) -> bool:
        """Whether the daemon said to stop (converged, cost bound, max_epochs, or ended)."""
        return self._verdict is not None and self._verdict.stop

    @property
    def converged(self) -> bool:
        """Whether the trial finished having reached the target metric."""
        return self._verdict is not None and self._verdict.finished and self._verdict.converged

    @property
    def power_limit_w(self) -> float | None:
        """The power limit [W] this object last set (None if none)."""
        return self._current_limit_w

    # ------------------------------------------------------------------ epoch hooks
    def on_epoch_begin(self) -> None:
        """Start measuring an epoch (and the power plan, on the first call).

        Raises:
            TrialEndedError: the trial already has a final verdict.
            RuntimeError: an epoch is already open, or the object is closed.
        """
        self._check_open()
        if self._verdict is not None and self._verdict.finished:
            raise TrialEndedError(f"trial {self.trial_number} of job {self.job_id!r} already "
                                  f"ended: {self._verdict.message}; check should_stop first")
        if self._in_epoch:
            raise RuntimeError("on_epoch_begin called twice without on_epoch_end")
        if self._phase == _IDLE:
            self._start_power()
        self.backend.begin_window(self.EPOCH_WINDOW)
        self._in_epoch = True

    def on_epoch_end(self, metric: float) -> Verdict:
        """End the epoch: a warm-up or profiling window still open is interrupted
        (InterruptWindow; the limit goes back to the maximum, as in Zeus), the epoch's time
        [s] and energy [J] are added to the trial's, and the cumulative figures are reported
        with ``metric`` (ReportEpoch).

        Returns:
            The verdict (also in :attr:`verdict`, :attr:`should_stop`).

        Raises:
            ValueError: ``metric`` is NaN or infinite (nothing changes; call again).
            RuntimeError: no epoch is open.
            OffcutError: the daemon refused or is unreachable (the epoch stays counted and
                goes into the next report's cumulative figures).
        """
        self._check_open()
        if not self._in_epoch:
            raise RuntimeError("on_epoch_end called without on_epoch_begin")
        metric = float(metric)
        if not math.isfinite(metric):
            raise ValueError(f"metric must be a finite number, got {metric}")
        self._interrupt_power(follow=True)
        dt, de = self.backend.end_window(self.EPOCH_WINDOW)
        self._in_epoch = False
        self._epochs += 1
        self._time_s += dt
        self._energy_j += de
        pb = self.client.report_epoch(self.job_id, self.trial_number, self._epochs, self._time_s,
                                      self._energy_j, metric)
        self._verdict = Verdict.from_pb(pb)
        logger.info("trial %d epoch %d: %.1f s, %.1f J, metric %g -> %s", self.trial_number,
                    self._epochs, self._time_s, self._energy_j, metric, self._verdict.message)
        return self._verdict

    # ------------------------------------------------------------------ power limits
    def on_step_begin(self) -> None:
        """Mark the beginning of a training step: advances power-limit profiling (Zeus's
        ``GlobalPowerLimitOptimizer``): after ``wait_steps`` steps, set the planned limit, run
        ``warmup_steps`` steps, measure ``profile_steps`` steps, report the window
        (ReportWindow) and follow the next plan; at a ``use`` plan, set that limit once.
        Does nothing when power limits are off.

        Raises:
            PowerLimitError: the GPU refused the limit (e.g. no root/SYS_ADMIN).
            OffcutError: the daemon refused or is unreachable.
        """
        self._check_open()
        if self._phase == _IDLE:
            self._start_power()
        if self._phase == _READY:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._begin_warmup(self._plan)
        elif self._phase == _WARMUP:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._begin_profile_window()
        elif self._phase == _WINDOW:
            self._steps_left -= 1
            if self._steps_left <= 0:
                time_s, energy_j = self.backend.end_window(self._window_name())
                self._follow(self._report_window(time_s, energy_j), wait=None)

    def _window_name(self) -> str:
        return f"offcut.power.{self._plan.power_limit_w:g}W"

    def _set_limit(self, watts: float) -> None:
        if self._current_limit_w is not None and abs(self._current_limit_w - watts) < 1e-9:
            return
        logger.info("setting the power limit to %g W", watts)
        self.backend.set_power_limit(watts)
        self._current_limit_w = watts

    def _start_power(self) -> None:
        if not self.power_enabled:
            self._phase = _OFF
            return
        self._follow(self.client.power_plan(self.job_id, self.batch_size),
                     wait=self.wait_steps + 1)

    def _follow(self, plan: zeus_pb2.PowerPlan, wait: int | None) -> None:
        """Act on a plan: ``use`` sets the limit; ``profile`` starts the warm-up now
        (``wait`` None: inside a step) or after ``wait`` more steps at the maximum limit."""
        self._plan = plan
        if plan.action == "use":
            self._set_limit(plan.power_limit_w)
            self._phase = _DONE
            logger.info("power profile of batch size %d done: %g W", self.batch_size,
                        plan.power_limit_w)
        elif plan.action == "profile":
            if wait is None:
                self._begin_warmup(plan)
            else:
                self._set_limit(self._max_limit_w)
                self._phase, self._steps_left = _READY, wait
        else:
            raise RuntimeError(f"the daemon sent an unknown power plan action {plan.action!r}")

    def _begin_warmup(self, plan: zeus_pb2.PowerPlan) -> None:
        self._set_limit(plan.power_limit_w)
        if plan.warmup_steps > 0:
            self._phase, self._steps_left = _WARMUP, plan.warmup_steps
        else:
            self._begin_profile_window()

    def _begin_profile_window(self) -> None:
        self.backend.begin_window(self._window_name())
        self._phase, self._steps_left = _WINDOW, max(1, self._plan.profile_steps)

    def _report_window(self, time_s: float, energy_j: float) -> zeus_pb2.PowerPlan:
        limit = self._plan.power_limit_w
        try:
            if not (math.isfinite(time_s) and math.isfinite(energy_j)
                    and time_s > 0 and energy_j > 0):
                logger.warning("window at %g W measured %.3g s, %.3g J (too short for the "
                               "energy counter?); profiling it again", limit, time_s, energy_j)
                return self.client.interrupt_power_window(self.job_id, self.batch_size, limit)
            logger.info("window at %g W: %.3f s, %.1f J", limit, time_s, energy_j)
            return self.client.report_power_window(self.job_id, self.batch_size, limit, time_s,
                                                   energy_j)
        except FailedPrecondition as exc:
            # another run of this batch size moved the profile on (or finished it)
            logger.info("window at %g W not recorded (%s); following the current plan", limit, exc)
            return self.client.power_plan(self.job_id, self.batch_size)

    def _interrupt_power(self, follow: bool) -> None:
        """A warm-up or window cut short by the end of an epoch (or by close)."""
        if self._phase not in (_WARMUP, _WINDOW):
            return
        limit = self._plan.power_limit_w
        if self._phase == _WINDOW:
            self.backend.end_window(self._window_name(), cancel=True)
        logger.info("%s at %g W interrupted", "window" if self._phase == _WINDOW else "warm-up",
                    limit)
        self._phase = _READY
        try:
            plan = self.client.interrupt_power_window(self.job_id, self.batch_size, limit)
        except FailedPrecondition:
            plan = self.client.power_plan(self.job_id, self.batch_size)
        if follow:
            self._follow(plan, wait=1)

    # ------------------------------------------------------------------ closing
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ZeusTraining is closed")

    def close(self, end_trial: bool | None = None) -> Verdict | None:
        """Finish the run: cancel an open epoch (not reported), interrupt an open profiling
        window, end the trial if it has no final verdict (EndTrial: counted as not converged
        with at least one epoch reported, abandoned without), set the GPUs' maximum limit
        again, and close an owned client. Idempotent.

        Args:
            end_trial: override ``end_trial_on_close`` (False: leave the trial open for a
                restarted process).

        Returns:
            The last verdict (None if the trial was left open without any report).

        Raises:
            OffcutError, PowerLimitError: the first failure of these steps (all are tried).
        """
        if self._closed:
            return self._verdict
        self._closed = True
        end = self.end_trial_on_close if end_trial is None else end_trial
        first_error: BaseException | None = None

        def attempt(step: Callable[[], None]) -> None:
            nonlocal first_error
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - all steps run; the first error is raised
                logger.warning("while closing trial %d: %s", self.trial_number, exc)
                first_error = first_error or exc

        if self._in_epoch:
            self._in_epoch = False
            attempt(lambda: self.backend.end_window(self.EPOCH_WINDOW, cancel=True))
        attempt(lambda: self._interrupt_power(follow=False))
        if end and not (self._verdict is not None and self._verdict.finished):
            def end_trial_step() -> None:
                self._verdict = Verdict.from_pb(self.client.end_trial(self.job_id,
                                                                      self.trial_number))
            attempt(end_trial_step)
        if self.restore_power_limit and self._current_limit_w is not None:
            attempt(lambda: self._set_limit(self.backend.power_limit_range()[1]))
        if self._owns_client:
            attempt(self.client.close)
        if first_error is not None:
            raise first_error
        return self._verdict

    def __enter__(self) -> "ZeusTraining":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:  # noqa: BLE001 - do not hide the original error
            logger.warning("closing after %s failed: %s", exc_type.__name__, close_error)


__all__ = ["ENV_ADDRESS", "ENV_BATCH_SIZE", "ENV_JOB_ID", "ENV_TRIAL", "ENV_VARS",
           "BackendUnavailable", "ManualBackend", "MeasurementBackend", "NvmlBackend",
           "PowerLimitError", "TrainingSetupError", "TrialEndedError", "Verdict",
           "ZeusMonitorBackend", "ZeusTraining", "default_backend", "nvml_power_limit_range"]

"""Training side of the daemon's Zeus optimizers (Zeus, NSDI '23; docs/architecture.md §5).

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
- ``OFFCUT_ZEUS_RESUME_TRIAL``: the trial of a previous generation to resume (ResumeTrial);
  exclusive with ``OFFCUT_ZEUS_TRIAL``. The elastic helper stores :attr:`ZeusTraining.
  trial_number` in its checkpoint and sets this (or passes ``resume_trial=``) when it restarts.
- ``OFFCUT_BATCH_SIZE``: the trial's (global) batch size (checked against the daemon's record).
- ``OFFCUT_GENERATION``: this process's generation (set by the launcher, docs/execution.md);
  sent with every call so that the daemon fences the trial to its current generation.
- ``OFFCUT_TASK_ID``: with ``OFFCUT_GENERATION``, makes Predict's and ResumeTrial's default
  idempotency key ``offcut-task:<task>:g<generation>`` (a retried call gets the same trial).

A process restarted with the same ``OFFCUT_ZEUS_TRIAL`` continues the trial: epochs, time and
energy continue from what the daemon last recorded, and profiling continues where the daemon's
power profile is. Work done after the last reported epoch of the previous process is not
counted unless that process ended with ``interrupted`` (below).

Generations (a placed task, docs/execution.md): every grow, shrink or preemption stops the
processes (they checkpoint and exit 75) and starts a new generation. A Zeus trial spans them:

- On the stop signal, end the run with :meth:`ZeusTraining.interrupt` (or
  ``close(interrupted=True)``, or leave the ``with`` block by ``sys.exit(75)``): the epoch cut
  short is measured and counted, and the trial is *suspended* (EndTrial with interrupted) with
  its cumulative time and energy; it is not a failure and prunes no batch size.
- The next generation passes ``resume_trial=<the checkpoint's trial number>`` (and
  ``generation=``): ResumeTrial returns the trial's stored epochs, time [s] and energy [J], the
  process numbers its epochs on and adds its own measurements to them, so the trial's cost is
  zeus_cost (Zeus §3.1, Eq. 2) of the sums over all its generations.
- A real failure (any other exception leaving the ``with`` block) ends the trial as not
  converged, as before; a later ``resume_trial`` of it raises ``FailedPrecondition``: start a
  new trial (and the training from scratch).
- The batch size of a trial is the *global* batch size; each rank trains
  :func:`per_rank_batch_size` samples per step, which follows the generation's world size.

Sketch of one generation's rank 0 (the other ranks get the batch size and ``should_stop`` by
broadcast)::

    ckpt = latest_checkpoint()                    # None in the task's first generation
    with ZeusTraining.from_env(resume_trial=ckpt["zeus_trial"] if ckpt else None) as zt:
        per_rank = zt.per_rank_batch_size()       # from $WORLD_SIZE, $RANK
        while not zt.should_stop:
            zt.on_epoch_begin()
            if not train_one_epoch(per_rank):     # the stop signal came: checkpoint written
                save_checkpoint(zeus_trial=zt.trial_number)
                sys.exit(75)                      # suspends the trial
            zt.on_epoch_end(validate())

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
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import grpc

from offcut.client.api import Client
from offcut.errors import FailedPrecondition, NotFound, Unavailable
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
"""The trial's (global) batch size."""
ENV_RESUME_TRIAL = "OFFCUT_ZEUS_RESUME_TRIAL"
"""The trial of a previous generation to resume (from the elastic helper's checkpoint)."""
ENV_GENERATION = "OFFCUT_GENERATION"
"""This process's generation (docs/execution.md), an integer >= 1."""
ENV_TASK_ID = "OFFCUT_TASK_ID"
"""The placed task running this process."""
ENV_VARS = (ENV_ADDRESS, ENV_JOB_ID, ENV_TRIAL, ENV_BATCH_SIZE, ENV_RESUME_TRIAL, ENV_GENERATION,
            ENV_TASK_ID)
EXIT_INTERRUPTED = 75
"""The exit status of a process that checkpointed and stops for a new generation
(``EX_TEMPFAIL``, docs/execution.md); ``sys.exit(75)`` inside the ``with`` block suspends the
trial."""

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


# ----------------------------------------------------------------------------- batch size
def per_rank_batch_size(global_batch_size: int, world_size: int, rank: int, *,
                        strict: bool = False) -> int:
    """The samples per step of ``rank`` when a generation of ``world_size`` ranks trains the
    trial's global batch size ``global_batch_size`` (the batch size the daemon's optimizer
    chose; it stays the same across generations, only the split changes).

    Rule: the global batch is split evenly: every rank gets ``B // W`` and the first
    ``B % W`` ranks one more, so the ranks' batches add up to ``B`` exactly. With an uneven
    split, DDP's gradient mean over ranks weighs a sample on a smaller rank slightly more
    (by ``(B // W + 1) / (B // W)`` at most); ``strict=True`` refuses uneven splits instead.

    Raises:
        ValueError: ``world_size`` < 1, ``rank`` not in ``[0, world_size)``,
            ``global_batch_size`` < ``world_size`` (a rank would train on nothing), or with
            ``strict`` a batch that ``world_size`` does not divide.
    """
    b, w, r = int(global_batch_size), int(world_size), int(rank)
    if w < 1:
        raise ValueError(f"world_size must be >= 1, got {w}")
    if not 0 <= r < w:
        raise ValueError(f"rank must be in [0, {w}), got {r}")
    if b < w:
        raise ValueError(f"the global batch size {b} is smaller than the world size {w}: some "
                         "ranks would get no sample; use fewer ranks or a larger batch size")
    if strict and b % w:
        raise ValueError(f"the global batch size {b} does not split evenly over {w} ranks")
    return b // w + (1 if r < b % w else 0)


# ----------------------------------------------------------------------------- verdict
@dataclass(frozen=True)
class Verdict:
    """The daemon's answer to a report: ``stop`` training; ``converged`` (meaningful once
    ``finished``: the trial reached the target within the cost bound); the trial's zeus_cost
    ``cost_j`` [J] so far; a readable ``message``; ``finished`` (the trial is closed);
    ``suspended`` (the run was interrupted and the trial waits for the next generation)."""

    stop: bool
    converged: bool
    cost_j: float
    message: str
    finished: bool
    suspended: bool = False

    @classmethod
    def from_pb(cls, pb: zeus_pb2.TrialVerdict) -> "Verdict":
        """From the ``offcut.v1.TrialVerdict`` message."""
        return cls(pb.stop, pb.converged, pb.cost_j, pb.message, pb.finished, pb.suspended)


# ----------------------------------------------------------------------------- calls
# Calls with the fields Client's methods do not send (generation, interrupted). Their names
# are Client's, so a RetryPolicy treats them alike: predict_batch_size is retried with a
# request id, report_epoch reconciled, end_trial always (an interrupted EndTrial carries
# cumulative figures: repeating it changes nothing).
class _Calls:
    """The calls, named as Client's methods (see above); a namespace, so that they do not
    clash with parameters such as ``close(end_trial=...)``."""

    @staticmethod
    def predict_batch_size(client: Client, job_id: str, request_id: str = "",
                           generation: int = 0) -> zeus_pb2.Prediction:
        return client.bso.Predict(zeus_pb2.PredictRequest(
            job_id=job_id, request_id=request_id, generation=generation),
            timeout=client.timeout_s)

    @staticmethod
    def report_epoch(client: Client, job_id: str, trial_number: int, epoch: int, time_s: float,
                     energy_j: float, metric: float, batch_size: int = 0,
                     generation: int = 0) -> zeus_pb2.TrialVerdict:
        return client.bso.ReportEpoch(zeus_pb2.ReportEpochRequest(
            job_id=job_id, trial_number=trial_number, epoch=epoch, time_s=time_s,
            energy_j=energy_j, metric=metric, batch_size=batch_size, generation=generation),
            timeout=client.timeout_s)

    @staticmethod
    def end_trial(client: Client, job_id: str, trial_number: int, interrupted: bool = False,
                  time_s: float | None = None, energy_j: float | None = None,
                  generation: int = 0) -> zeus_pb2.TrialVerdict:
        request = zeus_pb2.EndTrialRequest(job_id=job_id, trial_number=trial_number,
                                           interrupted=interrupted, generation=generation)
        if time_s is not None:
            request.time_s = time_s
        if energy_j is not None:
            request.energy_j = energy_j
        return client.bso.EndTrial(request, timeout=client.timeout_s)

    @staticmethod
    def resume_trial(client: Client, job_id: str, trial_number: int, request_id: str = "",
                     generation: int = 0) -> zeus_pb2.ResumedTrial:
        return client.bso.ResumeTrial(zeus_pb2.ResumeTrialRequest(
            job_id=job_id, trial_number=trial_number, request_id=request_id,
            generation=generation), timeout=client.timeout_s)


def _call(client: Client, method: Callable, *args: Any, **kwargs: Any) -> Any:
    """``method(client, ...)`` as a ``Client`` method would run it: through the client's
    RetryPolicy when it has one, gRPC errors raised as :mod:`offcut.errors` exceptions. A
    ``resume_trial`` with a request id is retried on UNAVAILABLE too (the daemon replays the
    first answer to a repeated id)."""
    policy = getattr(client, "retry", None)
    if policy is not None and method is not _Calls.resume_trial:
        return policy.call(client, method, args, kwargs)
    waits = policy.backoffs() if policy is not None and kwargs.get("request_id") else None
    started = time.monotonic()
    while True:
        try:
            return method(client, *args, **kwargs)
        except grpc.RpcError as err:
            exc = client._error(err)
            wait = next(waits) if waits is not None and isinstance(exc, Unavailable) else None
            if wait is None or time.monotonic() + wait - started > policy.deadline_s:
                raise exc from None
            policy.sleep(wait)


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

    Construction resolves the backend, reads the job (GetJob), then opens a trial (Predict),
    or, given ``trial_number``, continues that trial from the daemon's record of its epochs,
    time and energy, or, given ``resume_trial``, resumes the trial of a previous generation
    (ResumeTrial). Call :meth:`on_epoch_begin` / :meth:`on_epoch_end` around every epoch
    (validation included) and :meth:`on_step_begin` before every training step; stop when
    :attr:`should_stop`. :meth:`close` (or leaving the ``with`` block) ends a trial that has
    no final verdict (EndTrial) and gives the GPUs their maximum power limit back;
    :meth:`interrupt` (or ``sys.exit(75)`` in the ``with`` block) suspends it for the next
    generation instead.

    Args:
        client: a :class:`Client`, or the daemon's address (None = default socket); an
            address makes this object own (and close) the client.
        job_id: the registered job.
        trial_number: continue this trial (opened by a driver for this run; a suspended one
            is resumed); None = open one with Predict.
        resume_trial: resume this trial of a previous generation (the number the elastic
            helper stored in its checkpoint): it must be open (suspended; or running and held
            by an older ``generation``). Exclusive with ``trial_number``.
        generation: this process's generation (``OFFCUT_GENERATION``, >= 1; 0 = none): sent
            with every call, the daemon refuses calls of a replaced generation.
        backend: measurement backend; None = :func:`default_backend`.
        request_id: the idempotency key of Predict or ResumeTrial (a retried construction
            gets the same trial); empty: Predict has none, ResumeTrial a fresh one.
        expected_batch_size: if given, must equal the trial's (global) batch size.
        power: profile and set power limits: None = when the job has a power spec; False =
            never; True = required (error if the job has no power spec).
        wait_steps: steps before the first profiling warm-up (Zeus's ``wait_steps``: the
            first iterations are often unrepresentative).
        end_trial_on_close: whether :meth:`close` ends an unfinished trial (set False when a
            supervisor restarts this process on the same trial and ends it itself).
        restore_power_limit: whether :meth:`close` sets the GPUs' maximum limit again.

    Raises:
        NotFound: unknown job or trial (from the daemon).
        FailedPrecondition: Predict found every batch size failed; ``resume_trial`` names a
            trial that already ended (converged, failed, abandoned: start a new trial) or
            that another process holds.
        Unavailable: the daemon cannot be reached.
        TrainingSetupError: a batch size that is not the trial's, ``power=True`` without a
            power spec, a power range outside the GPUs', both ``trial_number`` and
            ``resume_trial``, a negative ``generation``.
        BackendUnavailable: no backend given and none available.
    """

    EPOCH_WINDOW = "offcut.epoch"

    def __init__(self, client: Client | str | None, job_id: str, trial_number: int | None = None,
                 *, resume_trial: int | None = None, generation: int = 0,
                 backend: MeasurementBackend | None = None, request_id: str = "",
                 expected_batch_size: int | None = None, power: bool | None = None,
                 wait_steps: int = 1, end_trial_on_close: bool = True,
                 restore_power_limit: bool = True):
        if wait_steps < 0:
            raise ValueError(f"wait_steps must be >= 0, got {wait_steps}")
        if trial_number is not None and resume_trial is not None:
            raise TrainingSetupError(f"trial_number ({ENV_TRIAL}) and resume_trial "
                                     f"({ENV_RESUME_TRIAL}) exclude each other")
        if int(generation) < 0:
            raise TrainingSetupError(f"generation must be >= 0, got {generation}")
        self.generation = int(generation)
        self.resumed = False
        self.taken_over = False
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
            if resume_trial is not None:
                self._resume(resume_trial, request_id)
            elif trial_number is None:
                pred = _call(self.client, _Calls.predict_batch_size, job_id,
                             request_id=request_id, generation=self.generation)
                self._opened_trial = True
                self.trial_number, self.batch_size = pred.trial_number, pred.batch_size
                self._epochs, self._time_s, self._energy_j = 0, 0.0, 0.0
                logger.info("job %s: trial %d, batch size %d", job_id, self.trial_number,
                            self.batch_size)
            else:
                self._continue_trial(job, trial_number, request_id)
            if expected_batch_size is not None and expected_batch_size != self.batch_size:
                raise TrainingSetupError(
                    f"{ENV_BATCH_SIZE}={expected_batch_size} but trial {self.trial_number} of "
                    f"job {job_id!r} runs batch size {self.batch_size}")
        except BaseException:
            # do not leave a trial open that will never run: end one this object opened,
            # suspend again one it resumed (the next attempt can resume it)
            if self._opened_trial or self.resumed:
                try:
                    _call(self.client, _Calls.end_trial, job_id, self.trial_number,
                          interrupted=self.resumed, generation=self.generation)
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

    def _resume(self, trial_number: int, request_id: str) -> None:
        """ResumeTrial: continue the trial from its stored epochs, time and energy."""
        r = _call(self.client, _Calls.resume_trial, self.job_id, trial_number,
                  request_id=request_id or f"zt-{uuid.uuid4().hex}", generation=self.generation)
        self.resumed, self.taken_over = True, r.taken_over
        self.trial_number, self.batch_size = r.trial_number, r.batch_size
        self._epochs, self._time_s, self._energy_j = r.epochs, r.time_s, r.energy_j
        logger.info("job %s: resumed trial %d (batch size %d%s) after epoch %d, %.1f s, %.1f J",
                    self.job_id, r.trial_number, r.batch_size,
                    ", taken over from a replaced generation" if r.taken_over else "",
                    r.epochs, r.time_s, r.energy_j)

    def _continue_trial(self, job: zeus_pb2.ZeusJob, trial_number: int, request_id: str) -> None:
        trial = next((t for t in job.trials if t.trial_number == trial_number), None)
        if trial is None:
            raise NotFound(f"job {self.job_id!r} has no trial {trial_number}", "trial_number")
        if trial.status == "suspended":  # a previous process of this run was interrupted
            self._resume(trial_number, request_id)
            return
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

        ``OFFCUT_ZEUS_RESUME_TRIAL`` resumes that trial (``resume_trial``),
        ``OFFCUT_GENERATION`` gives ``generation`` (``resume_trial=`` and ``generation=``
        given here take precedence, e.g. the trial number of the checkpoint), and with
        ``OFFCUT_TASK_ID`` the default ``request_id`` is ``offcut-task:<task>:g<generation>``.

        Raises:
            TrainingSetupError: ``OFFCUT_ZEUS_JOB_ID`` unset, a non-integer (or < 1) trial,
                resume trial, generation or batch size, ``OFFCUT_BATCH_SIZE`` without
                ``OFFCUT_ZEUS_TRIAL`` or ``OFFCUT_ZEUS_RESUME_TRIAL``, both of these; and
                whatever the constructor raises.
        """
        env = os.environ if environ is None else environ
        job_id = env.get(ENV_JOB_ID, "").strip()
        if not job_id:
            raise TrainingSetupError(f"{ENV_JOB_ID} is not set: run under `offcut recur` or "
                                     "construct ZeusTraining(address, job_id)")
        trial = _env_int(env, ENV_TRIAL)
        resume = kwargs.pop("resume_trial", None)
        resume = _env_int(env, ENV_RESUME_TRIAL) if resume is None else resume
        generation = kwargs.pop("generation", None)
        generation = _env_int(env, ENV_GENERATION) if generation is None else generation
        batch_size = _env_int(env, ENV_BATCH_SIZE)
        if trial is not None and resume is not None:
            raise TrainingSetupError(f"{ENV_TRIAL} and {ENV_RESUME_TRIAL} are both set: a run "
                                     "either continues the trial its driver opened or resumes "
                                     "the one of its checkpoint")
        if batch_size is not None and trial is None and resume is None:
            raise TrainingSetupError(f"{ENV_BATCH_SIZE} is set but {ENV_TRIAL} is not: the batch "
                                     "size comes with a trial opened by the driver")
        task_id = env.get(ENV_TASK_ID, "").strip()
        if generation is not None and task_id and "request_id" not in kwargs:
            kwargs["request_id"] = f"offcut-task:{task_id}:g{generation}"[:200]
        return cls(env.get(ENV_ADDRESS) or None, job_id, trial, resume_trial=resume,
                   generation=generation or 0, backend=backend,
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

    @property
    def suspended(self) -> bool:
        """Whether this run ended interrupted and the trial waits for the next generation."""
        return self._verdict is not None and self._verdict.suspended

    def per_rank_batch_size(self, world_size: int | None = None, rank: int | None = None, *,
                            strict: bool = False) -> int:
        """This rank's samples per step: :func:`per_rank_batch_size` of the trial's global
        :attr:`batch_size` (``world_size``/``rank`` default to ``$WORLD_SIZE``/``$RANK``, else
        1 and 0). Raises ValueError as that function does (e.g. batch size < world size),
        and naming the variable for a malformed ``$WORLD_SIZE``/``$RANK``."""
        from offcut.client.elastic import _int_var  # the launcher's variables, parsed once

        if world_size is None:
            world_size = _int_var(os.environ, "WORLD_SIZE", default=1, minimum=1)
        if rank is None:
            rank = _int_var(os.environ, "RANK", default=0)
        return per_rank_batch_size(self.batch_size, world_size, rank, strict=strict)

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
        pb = _call(self.client, _Calls.report_epoch, self.job_id, self.trial_number,
                   self._epochs, self._time_s, self._energy_j, metric,
                   generation=self.generation)
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

    def interrupt(self) -> Verdict | None:
        """End this process's part of the trial because the run is interrupted (the stop
        signal of a preemption or rescale): ``close(interrupted=True)``. The trial is suspended
        for the next generation (:attr:`suspended`); store :attr:`trial_number` in the
        checkpoint and pass it as ``resume_trial`` there."""
        return self.close(interrupted=True)

    def close(self, end_trial: bool | None = None, *, interrupted: bool = False
              ) -> Verdict | None:
        """Finish the run: cancel an open epoch (not reported), interrupt an open profiling
        window, end the trial if it has no final verdict (EndTrial: counted as not converged
        with at least one epoch reported, abandoned without), set the GPUs' maximum limit
        again, and close an owned client. Idempotent.

        With ``interrupted`` (a preemption or rescale, not a failure) the open epoch is
        measured instead and its time [s] and energy [J] count for the trial (they were spent
        on it, though the epoch is trained again from the checkpoint), and the trial is
        suspended with its cumulative figures (EndTrial with interrupted): it stays open for
        ``resume_trial`` in the next generation and no batch size is pruned.

        Args:
            end_trial: override ``end_trial_on_close`` (False: leave the trial open for a
                restarted process). Ignored with ``interrupted``.
            interrupted: suspend the trial instead of ending it.

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

        def count_cut_epoch() -> None:
            time_s, energy_j = self.backend.end_window(self.EPOCH_WINDOW)
            self._time_s += max(0.0, time_s)
            self._energy_j += max(0.0, energy_j)

        if self._in_epoch:
            self._in_epoch = False
            attempt(count_cut_epoch if interrupted
                    else lambda: self.backend.end_window(self.EPOCH_WINDOW, cancel=True))
        attempt(lambda: self._interrupt_power(follow=False))
        if (interrupted or end) and not (self._verdict is not None and self._verdict.finished):
            def end_trial_step() -> None:
                figures = ({"time_s": self._time_s, "energy_j": self._energy_j}
                           if interrupted else {})
                self._verdict = Verdict.from_pb(_call(
                    self.client, _Calls.end_trial, self.job_id, self.trial_number,
                    interrupted=interrupted, generation=self.generation, **figures))
                if interrupted:
                    logger.info("trial %d suspended after epoch %d: %.1f s, %.1f J so far",
                                self.trial_number, self._epochs, self._time_s, self._energy_j)
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
        """Close; leaving by ``sys.exit(75)`` (:data:`EXIT_INTERRUPTED`) suspends the trial
        (``close(interrupted=True)``), any other exception ends it as a failure."""
        if exc_type is None:
            self.close()
            return
        interrupted = (isinstance(exc, SystemExit) and exc.code == EXIT_INTERRUPTED)
        try:
            self.close(interrupted=interrupted)
        except Exception as close_error:  # noqa: BLE001 - do not hide the original error
            logger.warning("closing after %s failed: %s", exc_type.__name__, close_error)


__all__ = ["ENV_ADDRESS", "ENV_BATCH_SIZE", "ENV_GENERATION", "ENV_JOB_ID", "ENV_RESUME_TRIAL",
           "ENV_TASK_ID", "ENV_TRIAL", "ENV_VARS", "EXIT_INTERRUPTED",
           "BackendUnavailable", "ManualBackend", "MeasurementBackend", "NvmlBackend",
           "PowerLimitError", "TrainingSetupError", "TrialEndedError", "Verdict",
           "ZeusMonitorBackend", "ZeusTraining", "default_backend", "nvml_power_limit_range",
           "per_rank_batch_size"]

"""Measurement and actuation for the training side of the Zeus optimizers
(:mod:`offcut.client.training`, which re-exports the public names): a
:class:`MeasurementBackend` measures time [s] and GPU energy [J] over named windows and sets
GPU power limits [W]. :class:`ZeusMonitorBackend` (the ``zeus`` package), :class:`NvmlBackend`
(``nvidia-ml-py``), :class:`ManualBackend` (injected clock and energy, for tests and machines
without a GPU); :func:`measuring_backend` picks the first of zeus and NVML that works, and
:func:`default_backend` wraps it in :class:`~offcut.client.training.HelperBackend` (limits
through the node's power helper, :mod:`offcut.client.training.zeusd`) when ``ZEUSD_SOCK_PATH``
is set. Neither ``zeus`` nor ``pynvml`` is imported until a backend that needs it is created.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from typing import Callable, Protocol, Sequence, runtime_checkable

from offcut.client.training.errors import BackendUnavailable, PowerLimitError

logger = logging.getLogger("offcut.training")

_INSTALL_HINT = ("install zeus (pip install 'offcut[zeus]') or nvidia-ml-py "
                 "(pip install 'offcut[gpu]') on a machine with an NVIDIA GPU, or pass "
                 "backend=ManualBackend(...) to run without GPU measurements")
_PERMISSION_HINT = ("setting GPU power limits directly needs root or the SYS_ADMIN capability; "
                    "set them through the node's power helper instead (ZEUSD_SOCK_PATH, "
                    "HelperBackend), or run the job without the power-limit optimizer "
                    "(ZeusTraining(..., power=False))")


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


def measuring_backend(gpu_indices: Sequence[int] | None = None) -> MeasurementBackend:
    """The first measuring backend that works for ``gpu_indices``: :class:`ZeusMonitorBackend`,
    then :class:`NvmlBackend` (their power limits set directly, which needs root).

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


def default_backend(gpu_indices: Sequence[int] | None = None) -> MeasurementBackend:
    """This process's backend for ``gpu_indices`` (the framework's GPU indices; one process
    per GPU: ``[LOCAL_RANK]``; None: every visible GPU): :func:`measuring_backend` (zeus, else
    NVML) measures; power limits go through the node's power helper when ``ZEUSD_SOCK_PATH``
    is set (:class:`~offcut.client.training.HelperBackend`: no root needed; the helper is
    reached when a limit is first set or read), else directly through zeus or NVML as
    before (root or ``CAP_SYS_ADMIN``).

    Raises:
        BackendUnavailable: no measuring backend works (the message says what to install),
            or ``gpu_indices`` do not map to the helper's GPU ids.
    """
    measure = measuring_backend(gpu_indices)
    if not os.environ.get("ZEUSD_SOCK_PATH", "").strip():
        return measure
    from offcut.client.training.zeusd import HelperBackend  # noqa: PLC0415 - imports this module

    backend = HelperBackend(gpu_indices, measure=measure)
    logger.info("power limits through the power helper at %s", backend.socket_path)
    return backend

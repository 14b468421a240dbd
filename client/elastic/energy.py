"""Measured energy of one process of an elastic generation (docs/execution.md, "Energy"): the
GPUs this process uses, measured from the moment :class:`~offcut.client.elastic.ElasticRun`
starts, and reported to the daemon (``Tasks.ReportEnergy``) by **every** process at each
checkpoint and when it ends (exit 75, 0, or a failure). Part of :mod:`offcut.client.elastic`.

Which GPUs (:func:`own_gpus`): those the launcher gave the process, ``OFFCUT_LOCAL_GPUS``
(positions among the node's visible GPUs, docs/execution.md, "Processes per node"; empty: a
CPU task, nothing measured). Without it (torchrun, a local run) torchrun's convention
(:func:`process_gpus`): of the ``V`` visible GPUs (``CUDA_VISIBLE_DEVICES``), process
``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE = L`` uses ``V // L`` of them, positions ``LOCAL_RANK *
(V // L)`` onwards (one each when ``V == L``: ``cuda:LOCAL_RANK``); with fewer GPUs than
processes, GPU ``i`` is measured by local rank ``i`` only, so no GPU is counted twice.

How: :class:`~offcut.client.training.ZeusMonitorBackend` (Zeus's ``ZeusMonitor``: energy
counters, or power sampling on GPUs older than Volta) when ``zeus`` is installed, else
:class:`~offcut.client.training.NvmlBackend` (``nvmlDeviceGetTotalEnergyConsumption``); a
process without a GPU (or without either library) measures nothing and reports nothing: its
task's energy stays *modelled* (an estimate) unless other processes measure.

Reports are bounded in time (``report_timeout_s`` of the run, one attempt) and never raise:
a failed report is logged and the next one carries the cumulative figure (the daemon keeps
the largest per generation and rank).
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any, Mapping, Protocol, runtime_checkable

from offcut.client.elastic.env import ElasticEnv

log = logging.getLogger("offcut.client.elastic")

#: the measurement window the meter keeps open (its name in the backend)
WINDOW = "offcut-elastic-energy"


@runtime_checkable
class EnergyMeter(Protocol):
    """Cumulative energy of a process's GPUs.

    ``read_j()`` returns the joules [J] they drew since the meter was created (finite, >= 0,
    never decreasing). ``close()`` (optional) releases it.
    """

    def read_j(self) -> float:
        """Joules [J] since the meter was created."""


class GpuEnergyMeter:
    """An :class:`EnergyMeter` over a :class:`~offcut.client.training.MeasurementBackend`:
    one window kept open, read by closing and reopening it (the counters are read back to
    back: what falls between two readings is microseconds of draw).

    Args:
        backend: the measurement backend (its ``num_gpus`` GPUs are summed).
        name: what measures (``zeus`` | ``nvml``), for the logs.
    """

    def __init__(self, backend: Any, name: str):
        self.backend, self.name = backend, name
        self.num_gpus = int(getattr(backend, "num_gpus", 0))
        self._total = 0.0
        backend.begin_window(WINDOW)

    def read_j(self) -> float:
        """Joules [J] the GPUs drew since the meter was created."""
        with warnings.catch_warnings():  # ZeusMonitor's "measured as zero" for a short
            warnings.filterwarnings("ignore", "The energy consumption of one or more GPUs "
                                    "was measured as zero")  # window: harmless, cumulative
            _, joules = self.backend.end_window(WINDOW)
        self.backend.begin_window(WINDOW)
        self._total += max(0.0, float(joules))
        return self._total

    def close(self) -> None:
        """Close the window (errors ignored: the process is ending)."""
        try:
            self.backend.end_window(WINDOW, cancel=True)
        except Exception:  # noqa: BLE001 - nothing to do about a meter that cannot close
            pass


def process_gpus(visible: int, local_rank: int, local_world_size: int) -> list[int]:
    """The indices, among ``visible`` GPUs, that process ``local_rank`` of
    ``local_world_size`` uses (module docstring); empty when it has none."""
    if visible <= 0 or not 0 <= local_rank < local_world_size:
        return []
    if visible < local_world_size:
        return [local_rank] if local_rank < visible else []
    per = visible // local_world_size
    return list(range(local_rank * per, (local_rank + 1) * per))


def own_gpus(env: ElasticEnv, visible: int, environ: Mapping[str, str] | None = None
             ) -> list[int]:
    """The positions, among ``visible`` GPUs, this process measures (module docstring):
    ``OFFCUT_LOCAL_GPUS`` of ``environ`` (default ``os.environ``) when set, without
    positions outside ``0 .. visible - 1`` (logged); else :func:`process_gpus`. A malformed
    ``OFFCUT_LOCAL_GPUS`` is logged and the rule used."""
    raw = (os.environ if environ is None else environ).get("OFFCUT_LOCAL_GPUS")
    rule = process_gpus(visible, env.local_rank, env.local_world_size)
    if raw is None:
        return rule
    if not raw.strip():
        return []  # the launcher gave this process no GPU (a CPU task)
    try:
        gpus = sorted({int(x) for x in raw.split(",")})
    except ValueError:
        log.warning("rank %d: OFFCUT_LOCAL_GPUS=%r is not a list of GPU positions; measuring "
                    "GPUs %s", env.rank, raw, rule)
        return rule
    mine = [g for g in gpus if 0 <= g < visible]
    if len(mine) < len(gpus):
        log.warning("rank %d: OFFCUT_LOCAL_GPUS=%r names GPUs beyond the %d visible; measuring "
                    "%s", env.rank, raw, visible, mine)
    return mine


def visible_gpu_count() -> int:
    """NVIDIA GPUs this process sees (``CUDA_VISIBLE_DEVICES`` respected), through NVML; 0
    when NVML (nvidia-ml-py, the driver) is missing or sees none."""
    from offcut.client.training.backends import _import_pynvml, _visible_handles
    from offcut.client.training.errors import BackendUnavailable

    try:
        pynvml = _import_pynvml()
        pynvml.nvmlInit()
        return len(_visible_handles(pynvml, None)[1])
    except BackendUnavailable as exc:
        log.debug("no GPU to measure: %s", exc)
    except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError and its kin: no usable NVML
        log.debug("no GPU to measure: NVML: %s", exc)
    return 0


def open_gpu_meter(env: ElasticEnv, environ: Mapping[str, str] | None = None
                   ) -> GpuEnergyMeter | None:
    """A meter of this process's GPUs (:func:`own_gpus`, ``environ`` as there): ZeusMonitor
    when ``zeus`` works, else NVML; None (logged at INFO, with why) when there is none to
    measure."""
    from offcut.client.training.backends import NvmlBackend, ZeusMonitorBackend
    from offcut.client.training.errors import BackendUnavailable

    gpus = own_gpus(env, visible_gpu_count(), environ)
    if not gpus:
        log.info("rank %d: no GPU of its own: its energy is not measured", env.rank)
        return None
    reasons = []
    # no synchronisation at readings: they come at checkpoints (after a state_dict copy) and
    # at exits, where a GPU stuck in a collective of a lost peer must not block the process
    for name, factory in (("zeus", lambda: ZeusMonitorBackend(gpus, sync_execution=False)),
                          ("nvml", lambda: NvmlBackend(gpus))):
        try:
            meter = GpuEnergyMeter(factory(), name)
        except BackendUnavailable as exc:
            reasons.append(f"{name}: {exc}")
            continue
        log.info("rank %d: measuring the energy of GPUs %s with %s", env.rank, gpus, name)
        return meter
    log.info("rank %d: its energy is not measured (%s)", env.rank, "; ".join(reasons))
    return None


class GenerationEnergy:
    """What this process's GPUs drew in its generation, and its reports to the daemon
    (``OFFCUT_ADDRESS``, ``OFFCUT_TASK_ID``, ``OFFCUT_GENERATION``, ``RANK``); the connection
    opens at the first report.

    Args:
        env: the process's environment.
        meter: an :class:`EnergyMeter` to use; None: :func:`open_gpu_meter` at :meth:`start`;
            False: measure nothing.
    """

    def __init__(self, env: ElasticEnv, meter: EnergyMeter | None | bool = None):
        if meter is not None and meter is not False and not isinstance(meter, EnergyMeter):
            raise TypeError(f"energy_meter must have read_j() (an EnergyMeter), None or "
                            f"False, got {meter!r}")
        self.env = env
        self._auto = meter is None
        self.meter: EnergyMeter | None = meter if isinstance(meter, EnergyMeter) else None
        self._client = None
        self._started = self._closed = False
        self.last_reported_j: float | None = None

    def start(self) -> None:
        """Open the GPU meter when none was given (idempotent; a meter that cannot open is
        logged, never raised)."""
        if self._started:
            return
        self._started = True
        if self._auto:
            try:
                self.meter = open_gpu_meter(self.env)
            except Exception as exc:  # noqa: BLE001 - measuring never stops training
                log.warning("rank %d: cannot measure its GPUs' energy: %s", self.env.rank, exc)

    def joules(self) -> float | None:
        """Joules [J] this process's GPUs drew since :meth:`start`; None when not measured
        (no GPU, or the meter failed: logged)."""
        if self.meter is None:
            return None
        try:
            j = float(self.meter.read_j())
        except Exception as exc:  # noqa: BLE001 - measuring never stops training
            log.warning("rank %d: reading the GPUs' energy failed: %s", self.env.rank, exc)
            return None
        if not (math.isfinite(j) and j >= 0):
            log.warning("rank %d: the energy meter read %r J; not reported", self.env.rank, j)
            return None
        return j

    def report(self, timeout_s: float) -> bool:
        """Report the cumulative joules of this process (``timeout_s`` [s]: the deadline of
        the report, set when the connection opens). True when the daemon took it; False when
        nothing is measured, for a local run (no task, daemon or generation) and when the
        report failed (logged, never raised)."""
        env = self.env
        if not (self._started and env.reports_progress and env.generation >= 1):
            return False
        joules = self.joules()
        if joules is None:
            return False
        try:
            if self._client is None:
                from offcut.client.api import Client
                self._client = Client(env.address, timeout_s=timeout_s)
            self._client.report_energy(env.task_id, env.generation, env.rank, joules)
        except Exception as exc:  # OffcutError mostly; a report never stops training
            log.warning("energy report of %.6g J (rank %d, generation %d) for %s failed: %s",
                        joules, env.rank, env.generation, env.task_id, exc)
            return False
        self.last_reported_j = joules
        log.info("reported %.6g J of rank %d in generation %d for %s", joules, env.rank,
                 env.generation, env.task_id)
        return True

    def close(self, timeout_s: float) -> None:
        """The last report (when started), then close the meter and the connection
        (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                self.report(timeout_s)
        finally:
            close = getattr(self.meter, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - the process is ending
                    pass
            if self._client is not None:
                self._client.close()
                self._client = None

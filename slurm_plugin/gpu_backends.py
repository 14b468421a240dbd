"""The GPUs of a node as the power helper (:mod:`~offcut.slurm_plugin.power_helper`) sees
them: NVML on a real GPU node, or a **recording stand-in** for tests and GPU-less development.

Both backends number the GPUs as NVML does (index 0..count-1, the numbering of zeusd's
``/discover`` and of Slurm's GRES indices with ``AutoDetect=nvml`` or ``File=/dev/nvidia[0-N]``
lines in order: docs/deployment.md, "3d. GPU power limits: the power helper") and speak
milliwatts [mW] and millijoules [mJ], NVML's and Zeus's units.

``open_backend("nvml")``
    :class:`NvmlBackend`: nvidia-ml-py (``pip install 'offcut[gpu]'``); setting a limit needs
    root (``CAP_SYS_ADMIN``), which is why the helper exists.

``open_backend("fake:FILE")``
    :class:`StandInBackend`: **a stand-in, not a GPU.** ``FILE`` (JSON, written by whoever
    sets the stand-in up) describes fake GPUs::

        {"gpus": [{"name": "Stand-in GPU", "pci_address": "00000000:01:00.0",
                   "min_power_limit_mw": 100000, "max_power_limit_mw": 400000,
                   "default_power_limit_mw": 300000}, ...],
         "load": 0.75}

    Their current limits live in ``FILE.state`` (so the helper and a separate
    ``offcut-slurm power-restore`` process see the same "GPU", as they would a real one),
    guarded by an ``flock`` on ``FILE.lock``; every set is recorded there too (the last
    :data:`MAX_RECORDED_CALLS`, oldest dropped), which is what tests assert on. A fake GPU
    draws ``load`` x its current limit [mW] (default 0.75) and its energy counter grows by that
    power over time.

Every backend method raises :class:`GpuError` (with the HTTP status the helper answers) when the
GPU refuses or the index does not exist.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

#: bounds of the stand-in's description: GPUs per node, a power limit [mW] (10 kW), a name
MAX_GPUS = 64
MAX_LIMIT_MW = 10_000_000
MAX_NAME_CHARS = 96
#: recorded calls kept in the stand-in's state file (oldest dropped)
MAX_RECORDED_CALLS = 1000
#: largest stand-in description or state file read [bytes]
MAX_FILE_BYTES = 1 << 20


class GpuError(Exception):
    """A GPU operation failed. ``status``: the HTTP status the helper answers (400: invalid
    argument or not supported, 403: no permission, 500: anything else), as zeusd maps NVML's
    errors (zeusd/src/error.rs)."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GpuInfo:
    """What ``/discover`` tells about one GPU."""

    name: str
    pci_address: str
    cumulative_energy_available: bool = True


class GpuBackend(Protocol):
    """The operations the power helper needs, per GPU index ``i`` (0..count()-1). Units: mW,
    mJ. ``by``: who asked, recorded by the stand-in and logged."""

    def count(self) -> int:
        """The node's GPUs (indices 0..count()-1, NVML's order)."""
    def info(self, i: int) -> GpuInfo:
        """GPU ``i``'s name and PCI address (``/discover``)."""
    def constraints(self, i: int) -> tuple[int, int]:
        """GPU ``i``'s (min, max) power limit [mW]."""
    def default_limit(self, i: int) -> int:
        """GPU ``i``'s default power limit [mW] (what the epilog restores)."""
    def get_limit(self, i: int) -> int:
        """GPU ``i``'s power limit now [mW]."""
    def set_limit(self, i: int, power_limit_mw: int, by: str = "") -> None:
        """Set GPU ``i``'s power limit [mW]; raises :class:`GpuError` (its ``status``: the
        HTTP answer)."""
    def energy_mj(self, i: int) -> int:
        """GPU ``i``'s cumulative energy counter [mJ]."""
    def power_mw(self, i: int) -> int:
        """GPU ``i``'s power draw now [mW]."""
    def close(self) -> None:
        """Release the backend (NVML's shutdown)."""


def open_backend(spec: str) -> GpuBackend:
    """The backend ``spec`` names: ``nvml`` or ``fake:FILE``.

    Raises:
        ValueError: an unknown spec, or a stand-in file that is missing or malformed (the
            message names the field).
        GpuError: NVML cannot start (nvidia-ml-py missing, no driver).
    """
    if spec == "nvml":
        return NvmlBackend()
    if spec.startswith("fake:") and len(spec) > len("fake:"):
        return StandInBackend(spec[len("fake:"):])
    raise ValueError(f"--gpus: {spec!r} is neither 'nvml' nor 'fake:FILE'")


# ----------------------------------------------------------------------------- NVML
class NvmlBackend:
    """The node's NVIDIA GPUs through NVML (nvidia-ml-py's ``pynvml``). Calls are serialised
    by one lock (each takes microseconds). Raises GpuError when nvidia-ml-py is missing
    (``pip install 'offcut[gpu]'``) or NVML cannot start."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise GpuError("nvidia-ml-py is not installed: pip install 'offcut[gpu]' "
                           "(or nvidia-ml-py) into the helper's environment") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            self._count = int(pynvml.nvmlDeviceGetCount())
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._count)]
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML could not start: {exc}") from None
        self._lock = threading.Lock()

    def _call(self, what: str, fn, *args):
        nv = self._nvml
        try:
            with self._lock:
                return fn(*args)
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            status = {nv.NVML_ERROR_NO_PERMISSION: 403, nv.NVML_ERROR_INVALID_ARGUMENT: 400,
                      nv.NVML_ERROR_NOT_SUPPORTED: 400}.get(code, 500)
            raise GpuError(f"NVML {what}: {exc}", status) from None

    def _h(self, i: int):
        if not 0 <= i < self._count:
            raise GpuError(f"GPU index {i} does not exist", 400)
        return self._handles[i]

    def count(self) -> int:
        return self._count

    def info(self, i: int) -> GpuInfo:
        nv, h = self._nvml, self._h(i)
        name = self._call("name", nv.nvmlDeviceGetName, h)
        pci = self._call("PCI info", nv.nvmlDeviceGetPciInfo, h)
        bus = getattr(pci, "busIdLegacy", None) or getattr(pci, "busId", "")
        name = name.decode() if isinstance(name, bytes) else str(name)
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        try:
            self._call("energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
            energy = True
        except GpuError:
            energy = False
        return GpuInfo(name=name, pci_address=bus, cumulative_energy_available=energy)

    def constraints(self, i: int) -> tuple[int, int]:
        lo, hi = self._call("power limit constraints",
                            self._nvml.nvmlDeviceGetPowerManagementLimitConstraints, self._h(i))
        return int(lo), int(hi)

    def default_limit(self, i: int) -> int:
        return int(self._call("default power limit",
                              self._nvml.nvmlDeviceGetPowerManagementDefaultLimit, self._h(i)))

    def get_limit(self, i: int) -> int:
        return int(self._call("power limit", self._nvml.nvmlDeviceGetPowerManagementLimit,
                              self._h(i)))

    def set_limit(self, i: int, power_limit_mw: int, by: str = "") -> None:
        self._call("set power limit", self._nvml.nvmlDeviceSetPowerManagementLimit, self._h(i),
                   int(power_limit_mw))

    def energy_mj(self, i: int) -> int:
        return int(self._call("energy", self._nvml.nvmlDeviceGetTotalEnergyConsumption,
                              self._h(i)))

    def power_mw(self, i: int) -> int:
        return int(self._call("power", self._nvml.nvmlDeviceGetPowerUsage, self._h(i)))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


# ----------------------------------------------------------------------------- stand-in
@dataclass(frozen=True)
class FakeGpu:
    """One GPU of the stand-in's description [mW]."""

    name: str
    pci_address: str
    min_mw: int
    max_mw: int
    default_mw: int


def _read_json(path: Path, what: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{what} {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{what} {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {path}: expected a JSON object")
    return doc


def _int_field(d: dict, key: str, where: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{where}.{key}: expected an integer in [{lo}, {hi}] mW, got {v!r}")
    return v


def parse_stand_in(doc: dict, source: str = "stand-in") -> tuple[list[FakeGpu], float]:
    """The fake GPUs and the load fraction of a stand-in description (module docstring).

    Raises:
        ValueError: naming the bad field (``gpus[1].min_power_limit_mw`` ...).
    """
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not 1 <= len(gpus) <= MAX_GPUS:
        raise ValueError(f"{source}: gpus: expected a list of 1..{MAX_GPUS} GPUs")
    out = []
    for k, g in enumerate(gpus):
        where = f"{source}: gpus[{k}]"
        if not isinstance(g, dict):
            raise ValueError(f"{where}: expected an object")
        name = g.get("name", "Offcut stand-in GPU")
        pci = g.get("pci_address", f"00000000:{k + 1:02x}:00.0")
        for key, v in (("name", name), ("pci_address", pci)):
            if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME_CHARS:
                raise ValueError(f"{where}.{key}: expected a string of 1..{MAX_NAME_CHARS} characters")
        lo = _int_field(g, "min_power_limit_mw", where, 1, MAX_LIMIT_MW)
        hi = _int_field(g, "max_power_limit_mw", where, lo, MAX_LIMIT_MW)
        dflt = _int_field(g, "default_power_limit_mw", where, lo, hi)
        out.append(FakeGpu(name, pci, lo, hi, dflt))
    load = doc.get("load", 0.75)
    if isinstance(load, bool) or not isinstance(load, (int, float)) or not 0 <= load <= 1:
        raise ValueError(f"{source}: load: expected a number in [0, 1], got {load!r}")
    return out, float(load)


def write_stand_in(path: str | Path, gpus: list[dict], load: float = 0.75) -> Path:
    """Write a stand-in description (``gpus``: dicts of the module docstring's fields) to
    ``path`` and remove any old state, so that every fake GPU starts at its default limit.
    Returns the path. Raises ValueError as :func:`parse_stand_in`."""
    doc = {"gpus": gpus, "load": load}
    parse_stand_in(doc, str(path))
    p = Path(path)
    p.write_text(json.dumps(doc, indent=1))
    for suffix in (".state",):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(p) + suffix)
    return p


class StandInBackend:
    """The recording stand-in (module docstring): fake GPUs described by ``path``, their limits
    and the record of every set in ``path.state`` (under an ``flock`` on ``path.lock``).

    Raises:
        ValueError: ``path`` missing or malformed (naming the field).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path).absolute()
        self.gpus, self.load = parse_stand_in(_read_json(self.path, "stand-in"), str(self.path))
        self.state_path = Path(str(self.path) + ".state")
        self.lock_path = Path(str(self.path) + ".lock")
        self._tlock = threading.Lock()
        with self._locked(True):  # the "GPUs" exist from now on: their energy counters run
            if not self.state_path.exists():
                self._save(self._fresh())

    # -- the state file
    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        with self._tlock, open(self.lock_path, "a+b") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)

    def _fresh(self) -> dict:
        return {"limits_mw": [g.default_mw for g in self.gpus],
                "energy_mj": [0] * len(self.gpus), "time_ns": time.time_ns(), "calls": []}

    def _load(self) -> dict:
        try:
            doc = _read_json(self.state_path, "stand-in state")
        except ValueError:
            if not self.state_path.exists():
                return self._fresh()
            raise
        n = len(self.gpus)
        lim, en = doc.get("limits_mw"), doc.get("energy_mj")
        if (not isinstance(lim, list) or len(lim) != n or not isinstance(en, list)
                or len(en) != n or not isinstance(doc.get("time_ns"), int)
                or not isinstance(doc.get("calls"), list)):
            raise ValueError(f"stand-in state {self.state_path} does not match {self.path} "
                             "(remove it to start every fake GPU at its default)")
        return doc

    def _advance(self, doc: dict, now_ns: int) -> None:
        dt = max(0, now_ns - doc["time_ns"]) / 1e9
        doc["energy_mj"] = [int(e + self.load * lim * dt)
                            for e, lim in zip(doc["energy_mj"], doc["limits_mw"])]
        doc["time_ns"] = now_ns

    def _save(self, doc: dict) -> None:
        tmp = self.state_path.with_name(self.state_path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.state_path)

    def _read(self) -> dict:
        with self._locked(False):
            doc = self._load()
        self._advance(doc, time.time_ns())
        return doc

    def _g(self, i: int) -> FakeGpu:
        if not 0 <= i < len(self.gpus):
            raise GpuError(f"GPU index {i} does not exist", 400)
        return self.gpus[i]

    # -- the backend
    def count(self) -> int:
        return len(self.gpus)

    def info(self, i: int) -> GpuInfo:
        g = self._g(i)
        return GpuInfo(name=g.name, pci_address=g.pci_address, cumulative_energy_available=True)

    def constraints(self, i: int) -> tuple[int, int]:
        g = self._g(i)
        return g.min_mw, g.max_mw

    def default_limit(self, i: int) -> int:
        return self._g(i).default_mw

    def get_limit(self, i: int) -> int:
        self._g(i)
        return int(self._read()["limits_mw"][i])

    def set_limit(self, i: int, power_limit_mw: int, by: str = "") -> None:
        g = self._g(i)
        if not g.min_mw <= power_limit_mw <= g.max_mw:  # as NVML: NVML_ERROR_INVALID_ARGUMENT
            raise GpuError(f"power limit {power_limit_mw} mW outside [{g.min_mw}, {g.max_mw}] "
                           f"mW of GPU {i}", 400)
        with self._locked(True):
            doc = self._load()
            now = time.time_ns()
            self._advance(doc, now)
            doc["limits_mw"][i] = int(power_limit_mw)
            doc["calls"].append({"time_ns": now, "gpu": i, "power_limit_mw": int(power_limit_mw),
                                 "by": str(by)[:200]})
            del doc["calls"][:-MAX_RECORDED_CALLS]
            self._save(doc)

    def energy_mj(self, i: int) -> int:
        self._g(i)
        return int(self._read()["energy_mj"][i])

    def power_mw(self, i: int) -> int:
        self._g(i)
        return int(self.load * self._read()["limits_mw"][i])

    def close(self) -> None:
        pass

    # -- for tests and inspection
    def limits(self) -> list[int]:
        """Every fake GPU's current limit [mW], by index."""
        return [int(v) for v in self._read()["limits_mw"]]

    def calls(self) -> list[dict]:
        """The recorded sets, oldest first: ``{"time_ns", "gpu", "power_limit_mw", "by"}``."""
        return list(self._read()["calls"])

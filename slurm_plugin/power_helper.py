"""The privileged power helper: sets GPU power limits for Slurm jobs, only on the GPUs Slurm gave
them, and restores every GPU's default limit when a job ends (``offcut-slurm power-helper``,
``offcut-slurm power-restore``; docs/deployment.md, "3d. GPU power limits: the power
helper"; docs/security.md, "GPU power limits").

It speaks zeusd's HTTP API (Zeus's privileged daemon, github.com/ml-energy/zeus ``zeusd/``), so
Zeus's own client (``zeus.utils.zeusd.ZeusdClient``, and Zeus's ``NVIDIAGPUs`` when
``ZEUSD_SOCK_PATH`` names the socket) works with it unchanged. What zeusd lacks and this adds:
a caller may act only on the GPUs its own running Slurm job holds on this node (root on every
GPU), decided from the kernel's ``SO_PEERCRED`` and from Slurm, never from the request; and a
record of the limits it changed per job, which the node ``Epilog`` uses to restore them.

API
---
HTTP/1.1 over a unix socket (default ``/run/offcut/power.sock``, mode 0666: every call is
authorised by the caller's credentials). Parameters are URL query fields, as zeusd's (any body
is ignored; at most :data:`MAX_BODY_BYTES`); answers are JSON. GPUs are identified by their
NVML index (``id`` in ``/discover``), which is Slurm's GRES index with ``AutoDetect=nvml`` or
``File=/dev/nvidia[0-N]`` lines in order. Units: power in **milliwatts** (``power_limit_mw``,
an unsigned 32-bit integer as zeusd's), energy in millijoules, times in ms since the epoch.

=======  ===================================  ==============================================
method   path and query                       200 answer
=======  ===================================  ==============================================
GET      ``/discover``                        ``{"gpus": [{"id": 0, "name": str, "pci_address":
                                              str, "cumulative_energy_available": bool}],
                                              "cpus": [], "enabled_api_groups": ["gpu-control",
                                              "gpu-read"], "auth_required": false}`` (anyone)
GET      ``/time``                            ``{"timestamp_ms": int}`` (anyone)
GET      ``/gpu/get_power_limit``             ``{"0": {"power_limit_mw": int}, ...}``
         ``[?gpu_ids=0,1]``
GET      ``/gpu/get_power_limit_constraints`` ``{"0": {"min_power_limit_mw": int,
         ``[?gpu_ids=...]``                   "max_power_limit_mw": int}, ...}``
GET      ``/gpu/get_cumulative_energy``       ``{"0": {"energy_mj": int}, ...}``
         ``[?gpu_ids=...]``
GET      ``/gpu/get_power[?gpu_ids=...]``     ``{"timestamp_ms": int, "power_mw": {"0": int}}``
POST     ``/gpu/set_power_limit?gpu_ids=0,1`` empty body; the limit is set before the answer
         ``&power_limit_mw=250000&block=true`` (``block`` is required, ``true``/``false``, as
                                              zeusd's; both complete the set first)
GET      ``/offcut/whoami``                   Offcut's own: ``{"pid", "uid", "job_id": str or
                                              null, "node": str, "gpu_ids": [int] (the GPUs the
                                              caller may use), "all_gpus": bool (root)}``
POST     ``/offcut/restore?job_id=J``         Offcut's own, root only (the node epilog):
         ``[&gpu_ids=...]``                   restores the default limit of ``gpu_ids`` and of
                                              every GPU recorded for job J; J may set no limit
                                              afterwards. ``{"job_id": J, "restored": {"0":
                                              default_mw}, "unchanged": [int], "errors": {"1":
                                              str}}``
=======  ===================================  ==============================================

``gpu_ids``: comma-separated indices (at most :data:`MAX_GPU_IDS`), sorted and deduplicated,
each below the node's GPU count; omitted on a read: every GPU the caller may read (root: all;
zeusd: all). Reads and sets follow one rule: root (uid 0) may use every GPU; any other caller
only the GPUs that its own job (the Slurm job of the connecting process, owned by the caller's
uid, ``RUNNING``, not yet restored by the epilog) holds on this node.

Errors are ``{"error": "message"}``: **400** bad input, the message starting with the field
(``gpu_ids: ...``, ``power_limit_mw: ...``, ``block: ...``; an unknown query field is refused, as
zeusd's ``deny_unknown_fields``); **403** not the caller's GPU (the message says why: not in a
job, another user's job, not this job's GPU on this node, the job has ended); **404** unknown
path (``/auth/whoami`` too: no tokens here); **405** wrong method; **413** request head over
:data:`MAX_HEAD_BYTES` or body over :data:`MAX_BODY_BYTES`; **501** a zeusd route not provided
(persistence mode, clocks, CPU, power streams); **503** more than ``max_connections``
connections at once (``max_per_user`` of one uid), or Slurm could not be asked about the caller's job; **500** the GPU failed
(NVML's no-permission is 403, invalid-argument/not-supported 400, as zeusd maps them).

Bounds: connections of users other than root: ``max_connections`` (default 64) in all and
``max_per_user`` (16) per uid (root's, the epilog's, are never refused), each served by a
thread and closed after ``idle_timeout_s`` (10 s) without a request; request head 16 KiB; body 4 KiB; job lookups cached
5 s for 256 jobs (:class:`~offcut.slurm_plugin.job_gpus.JobDirectory`); the limits record holds
one entry per GPU (:class:`PowerRecords`; dropped when restored); ended jobs remembered: the
last :data:`MAX_ENDED_JOBS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import logging
import os
import socket
import socketserver
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Iterable
from urllib.parse import parse_qsl, urlsplit

from offcut.slurm_plugin.gpu_backends import GpuBackend, GpuError, open_backend
from offcut.slurm_plugin.job_gpus import JobDirectory, JobLookupError, parse_index_list

log = logging.getLogger("offcut.slurm.power")

DEFAULT_SOCKET = "/run/offcut/power.sock"
DEFAULT_STATE = "/run/offcut/power-records.json"
MAX_GPU_IDS = 256
MAX_GPU_INDEX = 65535
MAX_U32 = 2**32 - 1
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 4096
MAX_QUERY_FIELDS = 16
MAX_ENDED_JOBS = 4096
MAX_RECORDS_BYTES = 1 << 20
API_GROUPS = ["gpu-control", "gpu-read"]
#: zeusd routes this helper does not provide (answered 501)
NOT_PROVIDED = frozenset({
    "/gpu/set_persistence_mode", "/gpu/get_persistence_mode", "/gpu/set_gpu_locked_clocks",
    "/gpu/reset_gpu_locked_clocks", "/gpu/set_mem_locked_clocks",
    "/gpu/reset_mem_locked_clocks", "/gpu/reset_locked_clocks", "/gpu/stream_power",
    "/cpu/get_cumulative_energy", "/cpu/get_power", "/cpu/stream_power"})


class HelperError(Exception):
    """A request the helper refuses: ``status`` (HTTP) and a message for the caller."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Caller:
    """Who is on the other end of a connection, from the kernel (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"uid {self.uid} pid {self.pid}"


def peer_credentials(sock: socket.socket) -> Caller:
    """``SO_PEERCRED`` of a connected unix socket: the peer's pid, uid and gid at connect time
    (the kernel's, not anything the peer says)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Caller(pid, uid, gid)


# ----------------------------------------------------------------------------- the record
class PowerRecords:
    """Which GPU limits the helper changed, for which job: a JSON file
    ``{"gpus": {"0": {"job_id": "12", "default_mw": int, "set_mw": int, "time_ns": int}}}``
    (mode 0600), read and rewritten under an ``flock`` on ``path.lock`` so that the helper and
    a ``power-restore`` run without it agree. One entry per GPU (the job that set it last), so
    it holds at most the node's GPU count; an entry is dropped when its GPU is restored.
    A missing, unreadable or malformed file counts as empty (logged): the epilog's
    ``SLURM_JOB_GPUS`` still names every GPU of the job."""

    def __init__(self, path: str | Path):
        self.path = Path(path).absolute()
        self.lock_path = Path(str(self.path) + ".lock")
        self._tlock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._tlock:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _load(self) -> dict[str, dict]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_RECORDS_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("limits record %s unreadable (%s): treated as empty", self.path, exc)
            return {}
        try:
            if len(raw) > MAX_RECORDS_BYTES:
                raise ValueError(f"larger than {MAX_RECORDS_BYTES} bytes")
            doc = json.loads(raw)
            gpus = doc["gpus"]
            out = {}
            for k, v in gpus.items():
                if not (k.isdigit() and int(k) <= MAX_GPU_INDEX and isinstance(v, dict)
                        and str(v.get("job_id", "")).isdigit()
                        and isinstance(v.get("default_mw"), int)):
                    raise ValueError(f"entry {k[:20]!r} is malformed")
                out[str(int(k))] = v
            return out
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("limits record %s is malformed (%s): treated as empty", self.path, exc)
            return {}

    def _save(self, gpus: dict[str, dict]) -> None:
        tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"gpus": gpus}, f)
        os.replace(tmp, self.path)

    def record(self, job_id: str, gpu_ids: Iterable[int], defaults_mw: dict[int, int],
               set_mw: int) -> None:
        """Note that ``job_id`` set ``gpu_ids`` to ``set_mw`` [mW] (their defaults:
        ``defaults_mw``)."""
        with self._locked():
            gpus = self._load()
            for i in gpu_ids:
                gpus[str(i)] = {"job_id": str(job_id), "default_mw": int(defaults_mw[i]),
                                "set_mw": int(set_mw), "time_ns": time.time_ns()}
            self._save(gpus)

    def gpus_of(self, job_id: str) -> set[int]:
        """The GPUs whose last set was ``job_id``'s."""
        with self._locked():
            return {int(k) for k, v in self._load().items() if str(v.get("job_id")) == job_id}

    def drop(self, gpu_ids: Iterable[int]) -> None:
        """Forget ``gpu_ids`` (restored)."""
        ids = {str(i) for i in gpu_ids}
        if not ids:
            return
        with self._locked():
            gpus = self._load()
            if ids & gpus.keys():
                self._save({k: v for k, v in gpus.items() if k not in ids})

    def all(self) -> dict[int, dict]:
        """Every entry, by GPU."""
        with self._locked():
            return {int(k): v for k, v in self._load().items()}


@dataclass
class RestoreReport:
    """What a restore did, per GPU: ``restored`` (set back to the default [mW]), ``unchanged``
    (already at its default), ``errors`` (why it could not)."""

    job_id: str
    restored: dict[int, int] = field(default_factory=dict)
    unchanged: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"job_id": self.job_id,
                "restored": {str(k): v for k, v in sorted(self.restored.items())},
                "unchanged": sorted(self.unchanged),
                "errors": {str(k): v for k, v in sorted(self.errors.items())}}


def restore_gpus(backend: GpuBackend, records: PowerRecords, job_id: str,
                 gpu_ids: Iterable[int]) -> RestoreReport:
    """Set every GPU of ``gpu_ids`` and every GPU recorded for ``job_id`` back to its default
    limit (only where it is not already there), and drop their records. Never raises for one
    GPU: its error goes into the report."""
    rep = RestoreReport(job_id)
    ids = set(gpu_ids) | records.gpus_of(job_id)
    done = []
    for i in sorted(ids):
        if not 0 <= i < backend.count():
            rep.errors[i] = f"GPU index {i} does not exist on this node"
            continue
        try:
            default = backend.default_limit(i)
            if backend.get_limit(i) != default:
                backend.set_limit(i, default, by=f"restore job {job_id}")
                rep.restored[i] = default
            else:
                rep.unchanged.append(i)
            done.append(i)
        except GpuError as exc:
            rep.errors[i] = str(exc)
    records.drop(done)
    return rep


# ----------------------------------------------------------------------------- the logic
def _parse_ids(raw: str, count: int) -> list[int]:
    """zeusd's ``gpu_ids`` rule (zeusd/src/routes/mod.rs, ``parse_device_ids``) with bounds."""
    if not raw.strip():
        raise HelperError(400, "gpu_ids: must contain at least one GPU index")
    parts = raw.split(",")
    if len(parts) > MAX_GPU_IDS:
        raise HelperError(400, f"gpu_ids: at most {MAX_GPU_IDS} GPU indices")
    ids = set()
    for p in parts:
        p = p.strip()
        if not p:
            raise HelperError(400, "gpu_ids: contains an empty GPU index")
        if not p.isdigit() or len(p) > 6:
            raise HelperError(400, f"gpu_ids: invalid GPU index {p[:20]!r}")
        ids.add(int(p))
    for i in sorted(ids):
        if i >= count:
            raise HelperError(400, f"gpu_ids: GPU index {i} does not exist (this node has "
                                   f"{count} GPUs, 0-{count - 1})")
    return sorted(ids)


def _parse_bool(q: dict[str, str], name: str) -> bool:
    v = q.get(name)
    if v is None:
        raise HelperError(400, f"{name}: missing (true or false)")
    if v not in ("true", "false"):
        raise HelperError(400, f"{name}: expected true or false, got {v[:20]!r}")
    return v == "true"


class PowerHelper:
    """The helper's decisions, without HTTP (the server below and tests call it).

    Args:
        backend: the node's GPUs (:func:`~offcut.slurm_plugin.gpu_backends.open_backend`).
        jobs: answers "which job is this pid's and what does it hold"
            (:class:`~offcut.slurm_plugin.job_gpus.JobDirectory`); None: only root may use
            the helper (a node without Slurm).
        node: this node's Slurm name (the job's GPUs are looked up for it).
        records: the limits record (:class:`PowerRecords`).
    """

    def __init__(self, backend: GpuBackend, jobs: JobDirectory | None, node: str,
                 records: PowerRecords):
        self.backend, self.jobs, self.node, self.records = backend, jobs, node, records
        self._lock = threading.Lock()  # one set or restore at a time (each is milliseconds)
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._discovery = None

    # -- who may do what
    def caller_gpus(self, caller: Caller) -> tuple[str | None, frozenset[int] | None, str]:
        """``(job_id, gpus, why)``: the caller's job (None: none found), the GPUs it may use
        (None: every GPU, root) and, when it may use none, why.

        Raises:
            HelperError: 503 when Slurm cannot be asked.
        """
        job_id = self.jobs.job_of(caller.pid) if self.jobs is not None else None
        if caller.uid == 0:
            return job_id, None, ""
        if self.jobs is None:
            return None, frozenset(), "this helper serves root only (started without Slurm)"
        if job_id is None:
            return None, frozenset(), (f"process {caller.pid} is not in a Slurm job on this "
                                       "node: only a job's own processes may use its GPUs")
        if job_id in self._ended:
            return job_id, frozenset(), f"job {job_id} has ended (its GPUs were restored)"
        try:
            job = self.jobs.job(job_id)
        except JobLookupError as exc:
            raise HelperError(503, str(exc)) from None
        if job is None:
            return job_id, frozenset(), f"Slurm does not know job {job_id}"
        if job.user_id != caller.uid:
            return job_id, frozenset(), (f"job {job_id} belongs to uid {job.user_id}, not to "
                                         f"the caller (uid {caller.uid})")
        if job.state != "RUNNING":
            return job_id, frozenset(), f"job {job_id} is {job.state}, not RUNNING"
        gpus = job.gpus_on(self.node)
        if gpus is None:
            return job_id, frozenset(), f"job {job_id} has no allocation on node {self.node}"
        return job_id, gpus, "" if gpus else f"job {job_id} holds no GPU on node {self.node}"

    def authorise(self, caller: Caller, ids: list[int] | None) -> tuple[str | None, list[int]]:
        """The caller's job and the GPU ids it acts on (``ids``; None: every GPU it may use).

        Raises:
            HelperError: 403 naming the refused GPUs and why; 503 (Slurm unavailable).
        """
        job_id, allowed, why = self.caller_gpus(caller)
        if allowed is None:
            return job_id, list(range(self.backend.count())) if ids is None else ids
        if ids is None:
            if not allowed:
                raise HelperError(403, why)
            return job_id, sorted(i for i in allowed if i < self.backend.count())
        refused = [i for i in ids if i not in allowed]
        if refused:
            what = ", ".join(map(str, refused))
            reason = why or (f"job {job_id} holds GPU(s) {', '.join(map(str, sorted(allowed)))} "
                             f"on node {self.node}, not GPU {what}")
            log.info("refused %s (job %s) GPU %s: %s", caller, job_id, what, reason)
            raise HelperError(403, f"GPU {what} may not be used by {caller}: {reason}")
        return job_id, ids

    # -- the routes
    def discover(self) -> dict:
        """``GET /discover``: every GPU's id, name, PCI address (anyone; built once)."""
        if self._discovery is None:
            gpus = []
            for i in range(self.backend.count()):
                info = self.backend.info(i)
                gpus.append({"id": i, "name": info.name, "pci_address": info.pci_address,
                             "cumulative_energy_available": info.cumulative_energy_available})
            self._discovery = {"gpus": gpus, "cpus": [], "enabled_api_groups": API_GROUPS,
                               "auth_required": False}
        return self._discovery

    def _read_ids(self, caller: Caller, q: dict[str, str]) -> list[int]:
        _only(q, {"gpu_ids"})
        ids = _parse_ids(q["gpu_ids"], self.backend.count()) if "gpu_ids" in q else None
        return self.authorise(caller, ids)[1]

    def get_power_limit(self, caller: Caller, q: dict[str, str]) -> dict:
        """``GET /gpu/get_power_limit``: the caller's GPUs' limits [mW]; HelperError 400/403."""
        return {str(i): {"power_limit_mw": self.backend.get_limit(i)}
                for i in self._read_ids(caller, q)}

    def get_power_limit_constraints(self, caller: Caller, q: dict[str, str]) -> dict:
        """``GET /gpu/get_power_limit_constraints``: (min, max) limits [mW] of the caller's
        GPUs; HelperError 400/403."""
        out = {}
        for i in self._read_ids(caller, q):
            lo, hi = self.backend.constraints(i)
            out[str(i)] = {"min_power_limit_mw": lo, "max_power_limit_mw": hi}
        return out

    def get_cumulative_energy(self, caller: Caller, q: dict[str, str]) -> dict:
        """``GET /gpu/get_cumulative_energy``: energy counters [mJ] of the caller's GPUs;
        HelperError 400/403."""
        return {str(i): {"energy_mj": self.backend.energy_mj(i)}
                for i in self._read_ids(caller, q)}

    def get_power(self, caller: Caller, q: dict[str, str]) -> dict:
        """``GET /gpu/get_power``: power draw [mW] of the caller's GPUs, stamped [ms since the
        epoch]; HelperError 400/403."""
        ids = self._read_ids(caller, q)
        return {"timestamp_ms": time.time_ns() // 1_000_000,
                "power_mw": {str(i): self.backend.power_mw(i) for i in ids}}

    def set_power_limit(self, caller: Caller, q: dict[str, str]) -> None:
        """``POST /gpu/set_power_limit``: validate, authorise, record, set."""
        _only(q, {"gpu_ids", "power_limit_mw", "block"})
        if "gpu_ids" not in q:
            raise HelperError(400, "gpu_ids: missing")
        ids = _parse_ids(q["gpu_ids"], self.backend.count())
        raw = q.get("power_limit_mw")
        if raw is None:
            raise HelperError(400, "power_limit_mw: missing (milliwatts)")
        if not raw.isdigit() or len(raw) > 10 or int(raw) > MAX_U32:
            raise HelperError(400, f"power_limit_mw: expected milliwatts, an integer in "
                                   f"[0, {MAX_U32}], got {raw[:20]!r}")
        mw = int(raw)
        _parse_bool(q, "block")
        for i in ids:
            lo, hi = self.backend.constraints(i)
            if not lo <= mw <= hi:
                raise HelperError(400, f"power_limit_mw: {mw} mW is outside GPU {i}'s range "
                                       f"[{lo}, {hi}] mW")
        job_id, ids = self.authorise(caller, ids)
        with self._lock:
            if job_id is not None and job_id in self._ended and caller.uid != 0:
                raise HelperError(403, f"job {job_id} has ended (its GPUs were restored)")
            defaults = {i: self.backend.default_limit(i) for i in ids}
            if job_id is not None:
                self.records.record(job_id, ids, defaults, mw)
            for i in ids:
                self.backend.set_limit(i, mw, by=f"{caller} job {job_id}")
        log.info("set GPU %s to %d mW for %s (job %s)", ",".join(map(str, ids)), mw, caller,
                 job_id)

    def whoami(self, caller: Caller, q: dict[str, str]) -> dict:
        """``GET /offcut/whoami``: the caller's pid, uid, job and the GPU ids it may use."""
        _only(q, set())
        job_id, allowed, why = self.caller_gpus(caller)
        ids = list(range(self.backend.count())) if allowed is None else sorted(allowed)
        return {"pid": caller.pid, "uid": caller.uid, "job_id": job_id, "node": self.node,
                "gpu_ids": ids, "all_gpus": allowed is None, "why_none": why or None}

    def restore(self, caller: Caller, q: dict[str, str]) -> dict:
        """``POST /offcut/restore`` (root only): the node epilog's restore of job ``job_id``."""
        _only(q, {"job_id", "gpu_ids"})
        if caller.uid != 0:
            raise HelperError(403, "only root (the node epilog) may restore limits")
        job_id = q.get("job_id", "")
        if not job_id.isdigit() or len(job_id) > 10:
            raise HelperError(400, f"job_id: expected a Slurm job id, got {job_id[:20]!r}")
        # an index this node lacks is reported per GPU, not a refusal of the whole restore
        ids = _parse_ids(q["gpu_ids"], MAX_GPU_INDEX + 1) if "gpu_ids" in q else []
        with self._lock:
            self._ended[job_id] = time.time()
            self._ended.move_to_end(job_id)
            while len(self._ended) > MAX_ENDED_JOBS:
                self._ended.popitem(last=False)
            rep = restore_gpus(self.backend, self.records, job_id, ids)
        if self.jobs is not None:
            self.jobs.forget(job_id)
        log.info("restored job %s: %s", job_id, rep.as_json())
        return rep.as_json()


def _only(q: dict[str, str], allowed: set[str]) -> None:
    extra = sorted(set(q) - allowed)
    if extra:
        raise HelperError(400, f"{extra[0][:40]}: unknown query field (known: "
                               f"{', '.join(sorted(allowed)) or 'none'})")


# ----------------------------------------------------------------------------- HTTP
class _TooLarge(Exception):
    pass


class _BudgetReader:
    """``rfile`` with a byte budget per request head (``readline``) and body (``read``)."""

    def __init__(self, raw):
        self.raw = raw
        self.left = MAX_HEAD_BYTES

    def readline(self, size: int = -1) -> bytes:
        cap = self.left + 1 if size is None or size < 0 else min(size, self.left + 1)
        line = self.raw.readline(cap)
        self.left -= len(line)
        if self.left < 0:
            raise _TooLarge(f"request head over {MAX_HEAD_BYTES} bytes")
        return line

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_BODY_BYTES:
            raise _TooLarge(f"body over {MAX_BODY_BYTES} bytes")
        return self.raw.read(n)

    def __getattr__(self, name):
        return getattr(self.raw, name)


GET_ROUTES = {"/gpu/get_power_limit": "get_power_limit",
              "/gpu/get_power_limit_constraints": "get_power_limit_constraints",
              "/gpu/get_cumulative_energy": "get_cumulative_energy",
              "/gpu/get_power": "get_power", "/offcut/whoami": "whoami"}
POST_ROUTES = {"/gpu/set_power_limit": "set_power_limit", "/offcut/restore": "restore"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "offcut-power-helper"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout_s
        super().setup()
        self.rfile = _BudgetReader(self.rfile)
        try:
            self.caller = peer_credentials(self.request)
        except OSError:
            self.caller = Caller(-1, -1, -1)

    def address_string(self) -> str:
        return str(self.caller)

    def log_message(self, fmt, *args) -> None:
        log.debug("%s: " + fmt, self.caller, *args)

    def handle_one_request(self) -> None:
        self.rfile.left = MAX_HEAD_BYTES
        try:
            super().handle_one_request()
        except _TooLarge as exc:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._answer(413, {"error": str(exc)})

    def _answer(self, status: int, body: dict | None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        helper: PowerHelper = self.server.helper
        try:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise HelperError(400, "Transfer-Encoding: not accepted (send Content-Length)")
            length = self.headers.get("Content-Length", "0").strip()
            if not length.isdigit():
                self.close_connection = True
                raise HelperError(400, "Content-Length: not a number")
            if int(length):
                self.rfile.read(int(length))  # ignored, as zeusd does (bounded: _TooLarge)
            if len(self.path) > 4096:
                raise HelperError(400, "path: longer than 4096 characters")
            url = urlsplit(self.path)
            try:
                pairs = parse_qsl(url.query, keep_blank_values=True,
                                  max_num_fields=MAX_QUERY_FIELDS)
            except ValueError:
                raise HelperError(400, f"query: more than {MAX_QUERY_FIELDS} fields") from None
            q: dict[str, str] = {}
            for k, v in pairs:
                if k in q:
                    raise HelperError(400, f"{k[:40]}: given twice")
                q[k] = v
            path = url.path
            if method == "GET" and path == "/discover":
                body: dict | None = helper.discover()
            elif method == "GET" and path == "/time":
                body = {"timestamp_ms": time.time_ns() // 1_000_000}
            elif method == "GET" and path in GET_ROUTES:
                body = getattr(helper, GET_ROUTES[path])(self.caller, q)
            elif method == "POST" and path in POST_ROUTES:
                body = getattr(helper, POST_ROUTES[path])(self.caller, q)
            elif path in GET_ROUTES or path in POST_ROUTES or path in ("/discover", "/time"):
                raise HelperError(405, f"{path} does not take {method}")
            elif path in NOT_PROVIDED:
                raise HelperError(501, f"{path} is a zeusd route that Offcut's power helper "
                                       "does not provide (it sets power limits only)")
            else:
                raise HelperError(404, f"{path[:200]}: no such route")
            self._answer(200, body)
        except HelperError as exc:
            self._answer(exc.status, {"error": str(exc)})
        except GpuError as exc:
            log.warning("GPU failure for %s on %s: %s", self.caller, self.path[:200], exc)
            self._answer(exc.status, {"error": str(exc)})
        except _TooLarge:
            raise
        except Exception as exc:  # noqa: BLE001 - one request must not kill the helper
            log.exception("request %s of %s failed", self.path[:200], self.caller)
            self._answer(500, {"error": f"internal error: {type(exc).__name__}"})

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """One thread per connection; connections of users other than root are capped in all
    (``max_connections``) and per uid (``max_per_user``), so that no user can take the
    helper from the others; root's (the node epilog's restore) are never refused."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, helper: PowerHelper, max_connections: int,
                 max_per_user: int, idle_timeout_s: float):
        self.helper = helper
        self.idle_timeout_s = idle_timeout_s
        self.max_connections, self.max_per_user = max_connections, max_per_user
        self._count_lock = threading.Lock()
        self._total = 0
        self._per_uid: dict[int, int] = {}  # entries dropped at 0: at most max_connections
        super().__init__(path, _Handler)

    def _refuse(self, request, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        with contextlib.suppress(OSError):
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                            b"application/json\r\nConnection: close\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.shutdown_request(request)

    def _release(self, uid: int) -> None:
        with self._count_lock:
            self._total -= 1
            left = self._per_uid.pop(uid) - 1
            if left:
                self._per_uid[uid] = left

    def process_request(self, request, client_address) -> None:
        try:
            uid = peer_credentials(request).uid
        except OSError:
            self.shutdown_request(request)
            return
        if uid != 0:
            with self._count_lock:
                mine = self._per_uid.get(uid, 0)
                if mine >= self.max_per_user:
                    why = f"more than {self.max_per_user} connections of uid {uid} at once; retry"
                elif self._total >= self.max_connections:
                    why = f"more than {self.max_connections} connections at once; retry"
                else:
                    why = ""
                    self._total += 1
                    self._per_uid[uid] = mine + 1
            if why:
                self._refuse(request, why)
                return
        try:  # (a unix socket's client address is ''; the uid travels in its place)
            super().process_request(request, uid)
        except BaseException:
            if uid != 0:
                self._release(uid)
            raise

    def process_request_thread(self, request, uid) -> None:
        try:
            super().process_request_thread(request, uid)
        finally:
            if uid != 0:
                self._release(uid)

    def handle_error(self, request, client_address) -> None:
        log.debug("connection error", exc_info=True)


def _claim_socket_path(path: str):
    """The socket path claimed for this helper (:class:`offcut.unix_socket.SocketPathClaim`:
    ``<path>.lock`` held for the helper's lifetime, a live socket refused, a stale one (left by
    a killed helper) replaced by an atomic rename, the socket unlinked at stop only while it is
    still this helper's). Its missing folder is made 0755. Raises OSError naming ``--socket``."""
    from offcut.unix_socket import SocketPathClaim, SocketPathError

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(folder):
        os.makedirs(folder, mode=0o755)
    try:
        return SocketPathClaim(path)
    except SocketPathError as exc:
        raise OSError(f"--socket: {exc}") from None


class PowerHelperServer:
    """The helper's HTTP server on a unix socket, in a thread.

    Args:
        helper: the decisions (:class:`PowerHelper`).
        socket_path: where to listen (its folder: root's, writable by root only; made 0755
            when missing); a stale socket is replaced, a live one refused.
        mode: the socket's mode (0666: anyone may connect; every call is authorised by its
            caller's credentials).
        max_connections: connections of users other than root served at once; one more is
            answered 503 and closed (root's, the epilog's, are never refused).
        max_per_user: connections of one uid (not root) served at once; one more: 503.
        idle_timeout_s: a connection without a request for this long is closed [s].

    Raises:
        OSError: the socket cannot be made (the message names ``--socket``).
    """

    def __init__(self, helper: PowerHelper, socket_path: str = DEFAULT_SOCKET,
                 mode: int = 0o666, max_connections: int = 64, max_per_user: int = 16,
                 idle_timeout_s: float = 10.0):
        if max_connections < 1 or max_per_user < 1 or not idle_timeout_s > 0:
            raise ValueError("max_connections and max_per_user must be >= 1, idle_timeout_s > 0")
        self.socket_path = os.path.abspath(socket_path)
        self._claim = _claim_socket_path(self.socket_path)
        try:  # bound under a fresh name, then renamed over socket_path with its mode
            self._server = _Server(self._claim.bind_path, helper, max_connections, max_per_user,
                                   idle_timeout_s)
            self._claim.publish(mode)
        except BaseException:
            if getattr(self, "_server", None) is not None:
                self._server.server_close()
            self._claim.release()
            raise
        self._thread: threading.Thread | None = None

    def start(self) -> "PowerHelperServer":
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,),
                                        name="power-helper", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever(0.2)

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()
        self._claim.release()  # unlinks the socket only while it is still this helper's
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> "PowerHelperServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ----------------------------------------------------------------------------- the epilog
class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def call_helper(socket_path: str, method: str, path: str, timeout_s: float = 5.0
                ) -> tuple[int, dict | None]:
    """One request to the helper: ``(status, JSON body or None)``. Raises OSError (no socket,
    refused, timed out) when the helper cannot be reached."""
    conn = _UnixHTTPConnection(socket_path, timeout_s)
    try:
        conn.request(method, path, headers={"Content-Length": "0"})
        resp = conn.getresponse()
        raw = resp.read(MAX_RECORDS_BYTES)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = {"error": raw[:200].decode("utf-8", "replace")}
        return resp.status, body
    except http.client.HTTPException as exc:
        raise OSError(f"bad answer from {socket_path}: {exc}") from None
    finally:
        conn.close()


def epilog_restore(job_id: str | None, job_gpus: str | None, *, socket_path: str,
                   backend_spec: str | None, state: str, node: str | None = None,
                   this_node: str | None = None, timeout_s: float = 5.0) -> str:
    """The node epilog's restore (``offcut-slurm power-restore``): restore the default limit of
    every GPU of job ``job_id`` (``job_gpus``: ``SLURM_JOB_GPUS``, e.g. ``"0,1"``, plus the
    helper's record) through the helper at ``socket_path``; when the helper cannot be reached,
    directly with ``backend_spec`` (the helper's ``--gpus``) and the record file ``state``.

    ``node``: the helper's node name; when ``this_node`` (``SLURMD_NODENAME``) differs, this
    epilog belongs to another slurmd on the same host and does nothing.

    Never raises: returns one line saying what happened (the caller logs it; errors start with
    ``error:``).
    """
    if not job_id or not job_id.isdigit() or len(job_id) > 10:
        return f"error: no valid job id (SLURM_JOB_ID={str(job_id)[:20]!r}); nothing restored"
    if node and this_node and node != this_node:
        return f"job {job_id}: epilog of node {this_node}, helper of node {node}: skipped"
    try:
        ids = sorted(parse_index_list(job_gpus or ""))
    except ValueError as exc:
        ids = []
        bad = f" (SLURM_JOB_GPUS ignored: {exc})"
    else:
        bad = ""
    q = f"/offcut/restore?job_id={job_id}" + (f"&gpu_ids={','.join(map(str, ids))}" if ids else "")
    try:
        status, body = call_helper(socket_path, "POST", q, timeout_s)
    except OSError as exc:
        reach = f"helper at {socket_path} unreachable ({exc})"
    else:
        if status == 200:
            tag = "error: " if (body or {}).get("errors") else ""
            return f"{tag}job {job_id}: restored through the helper: {json.dumps(body)}{bad}"
        return (f"error: job {job_id}: the helper answered {status}: "
                f"{(body or {}).get('error')}{bad}")
    if not backend_spec:
        return f"error: job {job_id}: {reach}, and no --gpus to restore directly{bad}"
    try:
        backend = open_backend(backend_spec)
    except (ValueError, GpuError) as exc:
        return f"error: job {job_id}: {reach}; --gpus {backend_spec}: {exc}{bad}"
    try:
        rep = restore_gpus(backend, PowerRecords(state), job_id, ids)
    finally:
        backend.close()
    tag = "error: " if rep.errors else ""
    return f"{tag}job {job_id}: {reach}; restored directly: {json.dumps(rep.as_json())}{bad}"

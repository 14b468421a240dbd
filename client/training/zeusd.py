"""GPU power limits without root: through the node's privileged power helper, which speaks
zeusd's HTTP API on a unix socket (:mod:`offcut.client.training`, which re-exports the public
names; docs/execution.md, "Power limits").

Setting a GPU's power limit needs root (or ``CAP_SYS_ADMIN``); a training process never has
it. The site runs a helper per node that does (Zeus's ``zeusd``, or Offcut's own helper that
speaks the same API and lets a job set limits only on the GPUs Slurm gave it), and a job finds
its socket in ``ZEUSD_SOCK_PATH`` (the variable Zeus's own client reads). The API, as Zeus
0.16's client ``zeus.utils.zeusd.ZeusdClient`` uses it (HTTP/1.1 over the unix socket,
parameters in the query string, JSON answers, any status but 200 an error with a text body):

- ``GET /discover`` -> ``{"gpus": [{"id": 0, "name": ...}, ...], "cpus": [...],
  "enabled_api_groups": [...], "auth_required": false}``
- ``POST /gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=250000&block=true``
- ``GET /gpu/get_power_limit?gpu_ids=0,1`` -> ``{"0": {"power_limit_mw": 250000}, ...}``
- ``GET /gpu/get_power_limit_constraints?gpu_ids=0`` -> ``{"0": {"min_power_limit_mw":
  100000, "max_power_limit_mw": 300000}}``

The helper's GPU ids are the node's NVML indices; this process names its GPUs as the
framework does (indices into ``CUDA_VISIBLE_DEVICES``): :func:`node_gpu_ids` translates.

:class:`HelperBackend` is the :class:`~offcut.client.training.MeasurementBackend` that sets
limits through the helper and measures with another backend (zeus or NVML energy counters;
:class:`~offcut.client.training.ManualBackend` without a GPU). With ``zeus`` installed it talks
through Zeus's own ``ZeusdClient``; without, through :class:`ZeusdHttpClient`, a small client
on the standard library.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import os
import socket
import time
from typing import Any, Mapping, Protocol, Sequence
from urllib.parse import urlencode

from offcut.client.training.backends import (ManualBackend, MeasurementBackend,
                                             _CounterWindows, _homogeneous_range,
                                             measuring_backend)
from offcut.client.training.errors import BackendUnavailable, PowerHelperError, PowerLimitError

logger = logging.getLogger("offcut.training")

ENV_SOCKET = "ZEUSD_SOCK_PATH"
"""The power helper's unix socket (set by the launcher from ``[slurm] power_socket``)."""
ENV_TOKEN = "ZEUSD_TOKEN"
"""A bearer token for a zeusd that requires one (sent as ``Authorization: Bearer``)."""
#: the longest answer read from the helper [bytes] (its answers are a few hundred bytes)
MAX_ANSWER_BYTES = 1 << 20
#: the deadline of one request to the helper [s]
DEFAULT_TIMEOUT_S = 10.0
#: the most GPUs one node has that an answer may list
MAX_GPUS = 1024


class HelperClient(Protocol):
    """What :class:`HelperBackend` needs of a client of zeusd's API (the method names and
    arguments of Zeus's ``ZeusdClient``). Errors: :class:`PowerHelperError`."""

    gpu_ids: list[int]
    """The GPU ids the helper offers (``/discover``)."""

    def set_power_limit(self, gpu_ids: list[int], power_limit_mw: int,
                        block: bool = True) -> None:
        """Set the limit [mW] of ``gpu_ids``."""

    def get_power_limit(self, gpu_ids: list[int] | None = None) -> dict[int, int]:
        """The limit [mW] of each GPU."""

    def get_power_limit_constraints(self, gpu_ids: list[int] | None = None
                                    ) -> dict[int, tuple[int, int]]:
        """(min, max) limit [mW] of each GPU."""

    def get_gpu_energy(self, gpu_ids: list[int]) -> dict[int, int]:
        """Each GPU's cumulative energy [mJ] (``/gpu/get_cumulative_energy``)."""


# ----------------------------------------------------------------------------- stdlib client
class _UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over a unix socket (host ``localhost``, as zeusd's clients)."""

    def __init__(self, path: str, timeout_s: float):
        super().__init__("localhost", timeout=timeout_s)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _int_field(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PowerHelperError(f"the power helper answered a non-integer {what}: {value!r}")
    return value


def _per_gpu(data: Any, fields: Sequence[str], what: str) -> dict[int, tuple[int, ...]]:
    """``{"<id>": {field: int, ...}}`` -> ``{id: (ints in fields' order)}``; PowerHelperError
    for any other shape."""
    if not isinstance(data, dict) or len(data) > MAX_GPUS:
        raise PowerHelperError(f"the power helper's {what} answer is not a map of GPUs: "
                               f"{str(data)[:200]}")
    out = {}
    for key, entry in data.items():
        try:
            gpu = int(key)
        except (TypeError, ValueError):
            raise PowerHelperError(f"the power helper's {what} answer names GPU {key!r}") from None
        if not isinstance(entry, dict) or any(f not in entry for f in fields):
            raise PowerHelperError(f"the power helper's {what} answer for GPU {gpu} lacks "
                                   f"{list(fields)}: {str(entry)[:200]}")
        out[gpu] = tuple(_int_field(entry[f], f) for f in fields)
    return out


def _ids_param(gpu_ids: Sequence[int] | None) -> dict[str, str]:
    return {} if gpu_ids is None else {"gpu_ids": ",".join(str(int(i)) for i in gpu_ids)}


class ZeusdHttpClient:
    """A client of zeusd's API (the module docstring) on the standard library: one HTTP/1.1
    request per call over the unix socket ``socket_path``, so it needs neither ``zeus`` nor
    ``httpx``. Same method names and arguments as Zeus's ``ZeusdClient``.

    Args:
        socket_path: the helper's socket (``ZEUSD_SOCK_PATH``).
        timeout_s: deadline of one request [s] (> 0).
        token: sent as ``Authorization: Bearer`` (zeusd with authentication); None: none.

    Attributes:
        gpu_ids: the GPU ids ``/discover`` listed.
        gpus: ``/discover``'s GPU entries (``id``, ``name``, and whatever else the helper says).

    Raises:
        PowerHelperError: the helper cannot be reached, or ``/discover`` failed or answered
            something that is not zeusd's shape.
        ValueError: ``timeout_s`` not > 0.
    """

    def __init__(self, socket_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 token: str | None = None):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.socket_path, self.timeout_s, self.token = str(socket_path), float(timeout_s), token
        data = self._request("GET", "/discover")
        gpus = data.get("gpus") if isinstance(data, dict) else None
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS or not all(
                isinstance(g, dict) and "id" in g for g in gpus):
            raise PowerHelperError(f"the power helper at {self.socket_path} answered /discover "
                                   f"without a list of GPUs: {str(data)[:200]}")
        self.gpus = gpus
        self.gpu_ids = [_int_field(g["id"], "GPU id") for g in gpus]

    def _request(self, method: str, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The JSON answer of one request (None for an empty body); PowerHelperError for a
        connection failure, a status other than 200 (its ``status``) or a body that is not
        JSON or longer than :data:`MAX_ANSWER_BYTES`."""
        target = path + ("?" + urlencode(params) if params else "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        conn = _UnixHTTPConnection(self.socket_path, self.timeout_s)
        try:
            conn.request(method, target, headers=headers)
            response = conn.getresponse()
            body = response.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise PowerHelperError(f"cannot reach the power helper at {self.socket_path} "
                                   f"({method} {path}: {exc})") from None
        finally:
            conn.close()
        text = body[:MAX_ANSWER_BYTES].decode("utf-8", "replace")
        if response.status != 200:
            raise PowerHelperError(f"the power helper refused {method} {path} (HTTP "
                                   f"{response.status}): {text.strip()[:500]}", response.status)
        if len(body) > MAX_ANSWER_BYTES:
            raise PowerHelperError(f"the power helper's answer to {path} is longer than "
                                   f"{MAX_ANSWER_BYTES} bytes")
        if not body.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise PowerHelperError(f"the power helper's answer to {path} is not JSON: "
                                   f"{text[:200]!r}") from None

    def set_power_limit(self, gpu_ids: list[int], power_limit_mw: int,
                        block: bool = True) -> None:
        """``POST /gpu/set_power_limit``: the limit [mW] of ``gpu_ids``. Raises
        :class:`PowerHelperError` (e.g. HTTP 403 for a GPU that is not the job's)."""
        self._request("POST", "/gpu/set_power_limit",
                      {**_ids_param(gpu_ids), "power_limit_mw": str(int(power_limit_mw)),
                       "block": "true" if block else "false"})

    def get_power_limit(self, gpu_ids: list[int] | None = None) -> dict[int, int]:
        """``GET /gpu/get_power_limit``: each GPU's limit [mW] (None: all)."""
        data = self._request("GET", "/gpu/get_power_limit", _ids_param(gpu_ids))
        return {g: v[0] for g, v in _per_gpu(data, ("power_limit_mw",), "get_power_limit").items()}

    def get_power_limit_constraints(self, gpu_ids: list[int] | None = None
                                    ) -> dict[int, tuple[int, int]]:
        """``GET /gpu/get_power_limit_constraints``: each GPU's (min, max) limit [mW]."""
        data = self._request("GET", "/gpu/get_power_limit_constraints", _ids_param(gpu_ids))
        return {g: (v[0], v[1]) for g, v in _per_gpu(
            data, ("min_power_limit_mw", "max_power_limit_mw"),
            "get_power_limit_constraints").items()}

    def get_gpu_energy(self, gpu_ids: list[int]) -> dict[int, int]:
        """``GET /gpu/get_cumulative_energy``: each GPU's energy counter [mJ]."""
        data = self._request("GET", "/gpu/get_cumulative_energy", _ids_param(gpu_ids))
        return {g: v[0] for g, v in _per_gpu(data, ("energy_mj",),
                                             "get_cumulative_energy").items()}


# ----------------------------------------------------------------------------- Zeus's client
class ZeusClientAdapter:
    """Zeus's own ``zeus.utils.zeusd.ZeusdClient`` (``httpx``) behind :class:`HelperClient`,
    its errors (``ZeusdConnectionError``, ``ZeusdError``, ``httpx`` errors) as
    :class:`PowerHelperError`. Its requests keep ``httpx``'s default deadline (5 s);
    ``timeout_s`` is kept for the stdlib client's sake only.

    Raises:
        PowerHelperError: the helper cannot be reached or ``/discover`` failed.
        ImportError: ``zeus`` (or ``httpx``) is not installed.
    """

    def __init__(self, socket_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 token: str | None = None):
        from zeus.utils.zeusd import ZeusdClient, ZeusdConfig  # noqa: PLC0415 - optional

        self.socket_path = str(socket_path)
        try:
            self._client = ZeusdClient(ZeusdConfig.uds(self.socket_path, token=token))
        except Exception as exc:  # ZeusdConnectionError, KeyError of a malformed /discover
            raise PowerHelperError(f"cannot use the power helper at {self.socket_path}: "
                                   f"{type(exc).__name__}: {exc}") from None
        self.gpu_ids = list(self._client.gpu_ids)
        self.timeout_s = timeout_s

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # zeus's ZeusdError (non-200), httpx.HTTPError
            raise PowerHelperError(f"the power helper at {self.socket_path} refused {what}: "
                                   f"{exc}") from None

    def set_power_limit(self, gpu_ids: list[int], power_limit_mw: int,
                        block: bool = True) -> None:
        """As :meth:`ZeusdHttpClient.set_power_limit`."""
        self._call("set_power_limit", self._client.set_power_limit, list(gpu_ids),
                   int(power_limit_mw), block)

    def get_power_limit(self, gpu_ids: list[int] | None = None) -> dict[int, int]:
        """As :meth:`ZeusdHttpClient.get_power_limit`."""
        return self._call("get_power_limit", self._client.get_power_limit, gpu_ids)

    def get_power_limit_constraints(self, gpu_ids: list[int] | None = None
                                    ) -> dict[int, tuple[int, int]]:
        """As :meth:`ZeusdHttpClient.get_power_limit_constraints`."""
        return self._call("get_power_limit_constraints",
                          self._client.get_power_limit_constraints, gpu_ids)

    def get_gpu_energy(self, gpu_ids: list[int]) -> dict[int, int]:
        """As :meth:`ZeusdHttpClient.get_gpu_energy`."""
        return self._call("get_gpu_energy", self._client.get_gpu_energy, list(gpu_ids))


def connect_helper(socket_path: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   use_zeus: bool | None = None) -> HelperClient:
    """A client of the power helper at ``socket_path`` (default ``$ZEUSD_SOCK_PATH``): Zeus's
    ``ZeusdClient`` when ``zeus`` and ``httpx`` are installed (``use_zeus`` None or True),
    else :class:`ZeusdHttpClient`. ``$ZEUSD_TOKEN``, when set, is sent as the bearer token.

    Raises:
        BackendUnavailable: no socket given and ``ZEUSD_SOCK_PATH`` unset or empty;
            ``use_zeus=True`` without zeus.
        PowerHelperError: the helper cannot be reached or its ``/discover`` failed.
    """
    path = socket_path or os.environ.get(ENV_SOCKET, "").strip()
    if not path:
        raise BackendUnavailable(f"{ENV_SOCKET} is not set: no power helper on this node (ask "
                                 "the site to run one, docs/deployment.md)")
    token = os.environ.get(ENV_TOKEN) or None
    zeus_there = all(importlib.util.find_spec(m) is not None for m in ("zeus", "httpx"))
    if use_zeus and not zeus_there:
        raise BackendUnavailable("use_zeus=True but zeus (or httpx) is not installed")
    if zeus_there if use_zeus is None else use_zeus:
        return ZeusClientAdapter(path, timeout_s=timeout_s, token=token)
    return ZeusdHttpClient(path, timeout_s=timeout_s, token=token)


# ----------------------------------------------------------------------------- GPU ids
def node_gpu_ids(gpu_indices: Sequence[int] | None = None,
                 environ: Mapping[str, str] | None = None) -> list[int] | None:
    """The node's GPU ids (NVML indices, the helper's ids) of the framework's GPU indices
    ``gpu_indices`` (indices into ``CUDA_VISIBLE_DEVICES``), Zeus's own mapping
    (``zeus.device.gpu.nvidia.NVIDIAGPUs``): an integer entry of ``CUDA_VISIBLE_DEVICES`` is
    the node's index; a ``GPU-<uuid>`` entry is looked up with NVML (reading needs no root);
    without ``CUDA_VISIBLE_DEVICES`` the indices are the node's. ``gpu_indices`` None: every
    visible GPU (None when ``CUDA_VISIBLE_DEVICES`` is unset: all of the helper's GPUs).

    Raises:
        BackendUnavailable: MIG slices (their power cannot be limited on their own), an entry
            that is neither, a UUID without nvidia-ml-py, an index outside the visible GPUs or
            negative.
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        if gpu_indices is None:
            return None
        ids = [int(i) for i in gpu_indices]
        if any(i < 0 for i in ids):
            raise BackendUnavailable(f"negative GPU index in {ids}")
        return ids
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    indices = list(range(len(entries))) if gpu_indices is None else [int(i) for i in gpu_indices]
    for i in indices:
        if not 0 <= i < len(entries):
            raise BackendUnavailable(f"GPU index {i} is not among the {len(entries)} GPUs of "
                                     f"CUDA_VISIBLE_DEVICES={visible!r}")
    out = []
    for i in indices:
        entry = entries[i]
        if entry.startswith("MIG"):
            raise BackendUnavailable(f"CUDA_VISIBLE_DEVICES names a MIG slice ({entry}): a "
                                     "slice's power limit is its whole GPU's")
        if entry.startswith("GPU-"):
            out.append(_nvml_index_of_uuid(entry))
            continue
        try:
            out.append(int(entry))
        except ValueError:
            raise BackendUnavailable(f"cannot parse CUDA_VISIBLE_DEVICES={visible!r}") from None
    return out


def _nvml_index_of_uuid(uuid: str) -> int:
    from offcut.client.training.backends import _import_pynvml

    pynvml = _import_pynvml()
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    except pynvml.NVMLError as exc:
        raise BackendUnavailable(f"NVML cannot find GPU {uuid}: {exc}") from None


# ----------------------------------------------------------------------------- the backend
class _HelperEnergy(_CounterWindows):
    """Windows over the helper's energy counters (``/gpu/get_cumulative_energy``, summed
    over the backend's GPUs) and :func:`time.monotonic`."""

    def __init__(self, owner: "HelperBackend"):
        super().__init__()
        self.owner = owner
        self.num_gpus = owner.num_gpus

    def _read(self) -> tuple[float, float]:
        now = time.monotonic()
        got = self.owner.client.get_gpu_energy(self.owner.node_ids)  # PowerHelperError
        return now, sum(got.get(i, 0) for i in self.owner.node_ids) / 1000.0


class HelperBackend:
    """A :class:`~offcut.client.training.MeasurementBackend` whose power limits go through the
    node's power helper (no root needed) and whose windows are measured by ``measure``.

    The helper is reached on first use of a power-limit method (so a run that never sets a
    limit never needs it): ``/discover`` must list every GPU of this backend.

    Args:
        gpu_indices: this process's GPUs as the framework counts them (indices into
            ``CUDA_VISIBLE_DEVICES``; one process per GPU: ``[LOCAL_RANK]``); None: every
            visible GPU (all of the helper's when ``CUDA_VISIBLE_DEVICES`` is unset).
        measure: measures the windows (time [s], energy [J]); None: zeus, else NVML, for the
            same GPUs (:func:`~offcut.client.training.backends.measuring_backend`);
            ``"helper"``: the helper's own energy counters of these GPUs
            (``/gpu/get_cumulative_energy``, which zeusd and Offcut's helper serve; its
            stand-in's fake GPUs draw in proportion to their limit). A
            :class:`~offcut.client.training.ManualBackend` also follows every limit set (its
            modelled power may depend on it).
        socket_path: the helper's socket; None: ``$ZEUSD_SOCK_PATH``.
        client: a connected :class:`HelperClient` to use instead (tests).
        node_ids: the helper's ids of these GPUs, when :func:`node_gpu_ids`'s mapping is not
            the site's (e.g. a container that renumbers GPUs).
        timeout_s: deadline of one request to the helper [s].
        use_zeus: as :func:`connect_helper`.

    Attributes:
        num_gpus: GPUs actuated (the measurement's may differ: ``measure.num_gpus``).
        limits_set: every limit [W] the helper accepted from this object, in order (the
            last 1000).

    Raises:
        BackendUnavailable: no socket and ``ZEUSD_SOCK_PATH`` unset, GPU indices that do not
            map (:func:`node_gpu_ids`), or ``measure`` None and no measuring backend works.
        PowerHelperError: ``measure="helper"`` without ``gpu_indices`` and the helper cannot
            be reached (it says how many GPUs there are).
        ValueError: ``measure`` a string other than ``"helper"``.
    """

    MAX_LIMITS_KEPT = 1000

    def __init__(self, gpu_indices: Sequence[int] | None = None, *,
                 measure: MeasurementBackend | str | None = None,
                 socket_path: str | None = None,
                 client: HelperClient | None = None, node_ids: Sequence[int] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, use_zeus: bool | None = None):
        self.socket_path = socket_path or os.environ.get(ENV_SOCKET, "").strip() or None
        if client is None and self.socket_path is None:
            raise BackendUnavailable(f"{ENV_SOCKET} is not set: no power helper on this node")
        self._client = client
        self._timeout_s, self._use_zeus = timeout_s, use_zeus
        ids = list(node_ids) if node_ids is not None else node_gpu_ids(gpu_indices)
        self._node_ids = ids  # None: all of the helper's GPUs (known once connected)
        self.gpu_indices = (list(gpu_indices) if gpu_indices is not None
                            else list(range(len(ids))) if ids is not None else None)
        self.limits_set: list[float] = []
        if measure == "helper":
            if ids is None:  # the windows need the GPUs' count: every one of the helper's
                _ = self.client
            self.num_gpus = len(self._node_ids)
            self.measure: MeasurementBackend = _HelperEnergy(self)
            return
        if isinstance(measure, str):
            raise ValueError(f"measure must be a backend, None or 'helper', got {measure!r}")
        self.measure = measure if measure is not None else measuring_backend(gpu_indices)
        self.num_gpus = len(ids) if ids is not None else self.measure.num_gpus

    # ------------------------------------------------------------------ windows
    def begin_window(self, name: str) -> None:
        """Open the window ``name`` of ``measure`` (ValueError if open)."""
        self.measure.begin_window(name)

    def end_window(self, name: str, cancel: bool = False) -> tuple[float, float]:
        """(time [s], energy [J]) of ``measure``'s window; (0, 0) if ``cancel``. With
        ``measure="helper"`` both raise :class:`PowerHelperError` when the helper fails."""
        return self.measure.end_window(name, cancel=cancel)

    # ------------------------------------------------------------------ limits
    @property
    def client(self) -> HelperClient:
        """The helper's client, connected on first use (:func:`connect_helper`); checks that
        the helper offers every GPU of this backend.

        Raises:
            PowerHelperError: the helper cannot be reached, or does not offer these GPUs.
        """
        if self._client is None:
            self._client = connect_helper(self.socket_path, timeout_s=self._timeout_s,
                                          use_zeus=self._use_zeus)
        if self._node_ids is None:
            self._node_ids = list(self._client.gpu_ids)
            self.gpu_indices = list(range(len(self._node_ids)))
            self.num_gpus = len(self._node_ids)
        missing = sorted(set(self._node_ids) - set(self._client.gpu_ids))
        if missing:
            raise PowerHelperError(f"the power helper at {self.socket_path} does not offer GPU "
                                   f"{missing} (it offers {sorted(self._client.gpu_ids)})")
        return self._client

    @property
    def node_ids(self) -> list[int]:
        """The helper's ids of this backend's GPUs (connects when they are all of them)."""
        if self._node_ids is None:
            _ = self.client
        return list(self._node_ids)

    def power_limit_range(self) -> tuple[float, float]:
        """The GPUs' (min, max) limit [W] as the helper reports them.

        Raises:
            PowerHelperError: the helper failed.
            ValueError: the GPUs' ranges differ.
        """
        client = self.client
        got = client.get_power_limit_constraints(self._node_ids)
        missing = [i for i in self._node_ids if i not in got]
        if missing:
            raise PowerHelperError(f"the power helper reported no constraints of GPU {missing}")
        return _homogeneous_range([tuple(got[i]) for i in self._node_ids], self._node_ids)

    def power_limits_w(self) -> dict[int, float]:
        """The current limit [W] of each GPU, by the helper's id (PowerHelperError)."""
        got = self.client.get_power_limit(self._node_ids)
        return {int(i): mw / 1000.0 for i, mw in got.items()}

    def set_power_limit(self, watts: float) -> None:
        """Set every GPU's limit to ``watts`` [W] through the helper (one request for all of
        them), then let a :class:`ManualBackend` ``measure`` follow it.

        Raises:
            PowerLimitError: the helper refused (a GPU that is not this job's, a limit
                outside the GPU's range) or cannot be reached, naming the first GPU (the
                framework's index) and the limit; the helper's reason is in the message.
        """
        first = self.gpu_indices[0] if self.gpu_indices else 0
        try:
            client = self.client
            client.set_power_limit(list(self._node_ids), int(round(watts * 1000)), True)
        except PowerHelperError as exc:
            raise PowerLimitError(f"cannot set the power limit of GPU {self._node_ids} to "
                                  f"{watts:g} W through the power helper: {exc}",
                                  first, watts) from None
        self.limits_set.append(float(watts))
        del self.limits_set[:-self.MAX_LIMITS_KEPT]
        if isinstance(self.measure, ManualBackend):
            lo, hi = self.measure.power_limit_range()
            self.measure.set_power_limit(min(hi, max(lo, float(watts))))

"""The environment of one process of an elastic generation (docs/execution.md, "What every
process gets"): :class:`ElasticEnv` and the parsers of its variables. Part of
:mod:`offcut.client.elastic`, which re-exports these names; needs no ``torch``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


def parse_signal(value: str, variable: str = "OFFCUT_STOP_SIGNAL") -> signal.Signals:
    """A signal from ``USR1``, ``SIGUSR1`` or a number (``10``); ``ValueError`` naming
    ``variable`` otherwise."""
    text = value.strip()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        name = text.upper()
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise ValueError(f"{variable} must be a signal name (USR1, SIGUSR1) or number, "
                         f"got {value!r}") from None


def _int_var(env: Mapping[str, str], name: str, *, default: int | None = None,
             minimum: int = 0, maximum: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ValueError(f"{name} is not set (an integer >= {minimum}; run under "
                             f"offcut-slurm launch or torchrun, or set it)")
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if v < minimum or (maximum is not None and v > maximum):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {v}")
    return v


#: default of ``OFFCUT_PEER_TIMEOUT_S`` [s] (the launcher's ``[slurm] peer_timeout_s``)
DEFAULT_PEER_TIMEOUT_S = 60.0
#: bounds of ``OFFCUT_PEER_TIMEOUT_S`` [s]
PEER_TIMEOUT_RANGE_S = (1.0, 3600.0)


def _seconds_var(env: Mapping[str, str], name: str, default: float,
                 bounds: tuple[float, float]) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not bounds[0] <= v <= bounds[1]:  # (also refuses nan)
        raise ValueError(f"{name} must be {bounds[0]:g} to {bounds[1]:g} seconds, got {raw}")
    return v


@dataclass(frozen=True)
class ElasticEnv:
    """What one process of a generation gets (docs/execution.md, "What every process gets").

    Attributes:
        rank, world_size: this process's rank in ``0 .. world_size - 1`` and the generation's
            process count (``RANK``, ``WORLD_SIZE``).
        local_rank, local_world_size: the process's index on its node and the count there
            (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; default 0 and 1).
        master_addr, master_port: the generation's rendezvous (``MASTER_ADDR``,
            ``MASTER_PORT``), hosted by rank 0.
        checkpoint_dir: the task's checkpoints (``OFFCUT_CHECKPOINT_DIR``), on storage every
            node sees.
        generation: ``OFFCUT_GENERATION`` (>= 1 under the launcher; 0 for a local run).
        stop_signal: ``OFFCUT_STOP_SIGNAL`` (default ``SIGUSR1``).
        task_id, address: the task and the daemon (``OFFCUT_TASK_ID``, ``OFFCUT_ADDRESS``);
            None for a local run (then nothing is reported).
        num_nodes: the generation's node count (``OFFCUT_NUM_NODES``; default ``world_size //
            local_world_size``): the ``nodes`` of progress reports.
        task_name, node, nodelist: ``OFFCUT_TASK_NAME``, ``OFFCUT_NODE``, ``OFFCUT_NODELIST``
            (informational; None when unset).
        peer_timeout_s: ``OFFCUT_PEER_TIMEOUT_S`` [s] (default :data:`DEFAULT_PEER_TIMEOUT_S`):
            how long a silent peer is waited for before the process exits 75
            (docs/execution.md, "A lost peer").
    """

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    checkpoint_dir: Path
    local_rank: int = 0
    local_world_size: int = 1
    generation: int = 0
    stop_signal: signal.Signals = signal.SIGUSR1
    task_id: str | None = None
    address: str | None = None
    num_nodes: int = 1
    task_name: str | None = None
    node: str | None = None
    nodelist: str | None = None
    peer_timeout_s: float = 60.0

    @property
    def reports_progress(self) -> bool:
        """True when both the task and the daemon are known (``OFFCUT_TASK_ID`` and
        ``OFFCUT_ADDRESS``)."""
        return bool(self.task_id and self.address)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 checkpoint_dir: str | os.PathLike | None = None) -> "ElasticEnv":
        """Read the protocol's variables from ``environ`` (default ``os.environ``).

        Args:
            checkpoint_dir: used when ``OFFCUT_CHECKPOINT_DIR`` is unset or empty (local runs).

        Raises:
            ValueError: naming the first missing or malformed variable: ``RANK``,
                ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the checkpoint directory
                are required; ``RANK`` must be below ``WORLD_SIZE``, ``MASTER_PORT`` in
                1..65535, ``OFFCUT_GENERATION`` >= 1 when set, ``OFFCUT_NUM_NODES`` >= 1,
                ``OFFCUT_STOP_SIGNAL`` a signal, ``OFFCUT_PEER_TIMEOUT_S`` 1 to 3600 s.
        """
        env = os.environ if environ is None else environ
        world_size = _int_var(env, "WORLD_SIZE", minimum=1)
        rank = _int_var(env, "RANK", maximum=world_size - 1)
        master_addr = (env.get("MASTER_ADDR") or "").strip()
        if not master_addr:
            raise ValueError("MASTER_ADDR is not set (the host of rank 0's rendezvous)")
        master_port = _int_var(env, "MASTER_PORT", minimum=1, maximum=65535)
        local_world_size = _int_var(env, "LOCAL_WORLD_SIZE", default=1, minimum=1)
        local_rank = _int_var(env, "LOCAL_RANK", default=0, maximum=local_world_size - 1)
        ckpt = (env.get("OFFCUT_CHECKPOINT_DIR") or "").strip() or checkpoint_dir
        if not ckpt:
            raise ValueError("OFFCUT_CHECKPOINT_DIR is not set (the task's checkpoint "
                             "directory on shared storage; or pass checkpoint_dir=)")
        generation = 0
        if (env.get("OFFCUT_GENERATION") or "").strip():
            generation = _int_var(env, "OFFCUT_GENERATION", minimum=1)
        stop = parse_signal(env.get("OFFCUT_STOP_SIGNAL") or "USR1")
        num_nodes = _int_var(env, "OFFCUT_NUM_NODES",
                             default=max(1, world_size // local_world_size), minimum=1)
        return cls(rank=rank, world_size=world_size, master_addr=master_addr,
                   master_port=master_port, checkpoint_dir=Path(ckpt), local_rank=local_rank,
                   local_world_size=local_world_size, generation=generation, stop_signal=stop,
                   task_id=env.get("OFFCUT_TASK_ID") or None,
                   address=env.get("OFFCUT_ADDRESS") or None, num_nodes=num_nodes,
                   task_name=env.get("OFFCUT_TASK_NAME") or None,
                   node=env.get("OFFCUT_NODE") or None,
                   nodelist=env.get("OFFCUT_NODELIST") or None,
                   peer_timeout_s=_seconds_var(env, "OFFCUT_PEER_TIMEOUT_S",
                                               DEFAULT_PEER_TIMEOUT_S, PEER_TIMEOUT_RANGE_S))


"""The ``torch.distributed`` side of one elastic generation (docs/execution.md): the
backend and device, the rendezvous on ``MASTER_ADDR:MASTER_PORT`` with bounded timeouts, the
default process group, and the two collectives :class:`~offcut.client.elastic.ElasticRun`
needs. Part of :mod:`offcut.client.elastic`; ``torch`` is imported only when used.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Sequence

from offcut.client.elastic.env import ElasticEnv

log = logging.getLogger("offcut.client.elastic")


class ProcessGroup:
    """The default process group of one process of a generation.

    Args:
        env: the process's environment (rank, world size, rendezvous, ``LOCAL_RANK``).
        backend: ``"gloo"``, ``"nccl"`` or None (chosen by :attr:`backend`).
    """

    def __init__(self, env: ElasticEnv, backend: str | None):
        self.env = env
        self._backend = backend
        self._device = None
        self._store = None

    @property
    def backend(self) -> str:
        """``gloo`` or ``nccl``: as given, else nccl when CUDA is available and the
        ``LOCAL_RANK`` device exists, else gloo."""
        if self._backend is None:
            import torch
            cuda = torch.cuda.is_available() and self.env.local_rank < torch.cuda.device_count()
            self._backend = "nccl" if cuda else "gloo"
        return self._backend

    @property
    def device(self):
        """The ``torch.device`` to train on: ``cuda:LOCAL_RANK`` with nccl, else ``cpu``."""
        if self._device is None:
            import torch
            self._device = (torch.device("cuda", self.env.local_rank)
                            if self.backend == "nccl" else torch.device("cpu"))
        return self._device

    @staticmethod
    def check_none_yet() -> None:
        """Raise ``RuntimeError`` when a default process group already exists."""
        import torch.distributed as dist

        if dist.is_initialized():
            raise RuntimeError("a default process group already exists; ElasticRun creates it")

    def join(self, timeout_s: float, rendezvous_timeout_s: float) -> None:
        """The rendezvous, then the default process group: a ``TCPStore`` on
        ``MASTER_ADDR:MASTER_PORT`` hosted by rank 0, a barrier of all ``world_size`` ranks
        (waiting ``rendezvous_timeout_s`` [s]), ``init_process_group`` with the collective
        timeout ``timeout_s`` [s]. Keeps the store
        (rank 0 hosts it) until :meth:`destroy`. Logs the rendezvous and the time it took.

        Raises ``torch.distributed.DistError`` (e.g. ``DistStoreError`` on a rendezvous
        timeout, ``DistNetworkError`` when the port is taken).
        """
        import torch.distributed as dist

        env = self.env
        log.info("rendezvous of generation %d at %s:%d as rank %d of %d (%s)", env.generation,
                 env.master_addr, env.master_port, env.rank, env.world_size, self.backend)
        t0 = time.monotonic()
        rdzv = timedelta(seconds=rendezvous_timeout_s)
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0, timeout=rdzv, wait_for_workers=False)
        key = f"offcut/rendezvous/{env.generation}"
        if store.add(key, 1) == env.world_size:
            store.set(key + "/complete", "1")
        store.wait([key + "/complete"], rdzv)
        if self.backend == "nccl":
            import torch
            torch.cuda.set_device(env.local_rank)
        dist.init_process_group(self.backend, store=store, rank=env.rank,
                                world_size=env.world_size,
                                timeout=timedelta(seconds=timeout_s))
        self._store = store
        log.info("rank %d of %d: generation %d up in %.1f s", env.rank, env.world_size,
                 env.generation, time.monotonic() - t0)

    def destroy(self) -> None:
        """Destroy the default process group (errors of a broken one are ignored) and drop
        the store."""
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:  # a broken group: nothing left to tear down cleanly
            log.debug("destroy_process_group: %s", exc)
        self._store = None

    def broadcast_from_main(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (one ``broadcast`` of an int64; a collective).
        Raises the collective's error when a peer vanished."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=0)
        return int(t[0])

    def max_over_ranks(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values`` (one ``all_reduce`` MAX of an
        int64 tensor, one device-to-host copy; a collective). Raises the collective's error
        when a peer vanished."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

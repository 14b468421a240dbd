"""The ranks of one generation in lockstep for the power-limit optimizer
(:mod:`offcut.client.training`, which re-exports the public names; docs/execution.md, "Power
limits").

With one process per GPU every process sets the limit on its own GPU(s), and a profiling
window's time [s] and energy [J] are those of all of them, as Zeus's
``GlobalPowerLimitOptimizer`` does (zeus/optimizer/power_limit.py: every rank runs the same
state machine at the same steps, and at a window's end one all-reduce takes the maximum of the
ranks' times and the sum of their energies). Offcut's plan is the daemon's: rank 0 asks for it
and shares it (one broadcast) at the steps where it can change; the other ranks follow it.

A :class:`RankSync` is what the power-limit control needs of the ranks: :class:`TorchRankSync`
uses the generation's ``torch.distributed`` process group (the one
:class:`~offcut.client.elastic.ElasticRun` creates). Every rank must call the hooks
(``on_epoch_begin``, ``on_step_begin``, ``on_epoch_end``) at the same steps: the collectives
happen inside them.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class RankSync(Protocol):
    """The collectives of the power-limit control (see the module docstring)."""

    rank: int
    """This process's rank (0: the rank that talks to the daemon)."""
    world_size: int
    """The generation's process count."""

    def share(self, values: Sequence[float] | None, length: int) -> list[float]:
        """Rank 0's ``values`` (``length`` floats) on every rank (a collective; the other
        ranks pass None). Raises the collective's error when a peer vanished."""

    def reduce_window(self, time_s: float, energy_j: float) -> tuple[float, float]:
        """(the maximum of the ranks' ``time_s`` [s], the sum of their ``energy_j`` [J]) on
        every rank (a collective)."""


class TorchRankSync:
    """:class:`RankSync` over the default ``torch.distributed`` process group (the
    generation's, created by :class:`~offcut.client.elastic.ElasticRun`): ``share`` is one
    ``broadcast`` of a float64 tensor, ``reduce_window`` two ``all_reduce`` (MAX of the time,
    SUM of the energy), on ``device`` (``ElasticRun.device``: ``cuda:LOCAL_RANK`` with nccl,
    whose collectives need CUDA tensors; ``cpu`` with gloo).

    Args:
        device: where the tensors live; None: the current CUDA device with nccl, else cpu.

    Raises:
        RuntimeError: no default process group (start the ElasticRun first).
    """

    def __init__(self, device=None):
        import torch  # noqa: PLC0415 - torch only where used
        import torch.distributed as dist  # noqa: PLC0415

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("no torch.distributed process group: start the ElasticRun "
                               "(enter its with block) before creating a TorchRankSync")
        self._torch, self._dist = torch, dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if device is None:
            device = (torch.device("cuda", torch.cuda.current_device())
                      if dist.get_backend() == "nccl" else torch.device("cpu"))
        self.device = device

    def share(self, values: Sequence[float] | None, length: int) -> list[float]:
        """Rank 0's ``values`` on every rank (one broadcast).

        Raises:
            ValueError: rank 0 without ``length`` values.
        """
        torch = self._torch
        if self.rank == 0:
            if values is None or len(values) != length:
                raise ValueError(f"rank 0 shares {length} values, got {values!r}")
            t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        else:
            t = torch.zeros(length, dtype=torch.float64, device=self.device)
        self._dist.broadcast(t, src=0)
        return [float(v) for v in t.tolist()]

    def reduce_window(self, time_s: float, energy_j: float) -> tuple[float, float]:
        """(max of the ranks' times [s], sum of their energies [J]), on every rank."""
        torch, dist = self._torch, self._dist
        t = torch.tensor([float(time_s)], dtype=torch.float64, device=self.device)
        e = torch.tensor([float(energy_j)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(e, op=dist.ReduceOp.SUM)
        return float(t.item()), float(e.item())

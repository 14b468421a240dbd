"""Elastic data-parallel training of a small CNN on scikit-learn's bundled ``digits`` images,
through Offcut's execution protocol (docs/execution.md, :mod:`offcut.client.elastic`).

Data: ``sklearn.datasets.load_digits`` (1,797 8x8 grey images, 10 classes, pixel values
0..16 scaled to 0..1); a fixed, seeded split holds out 297 test images, 1,500 train.

Determinism across restarts: the data order depends only on the global sample index. Sample
``i`` (cumulative since the task began) is train image ``perm_e[i mod 1500]`` of epoch
``e = i // 1500`` with ``perm_e`` a permutation seeded by ``(seed, e)``; global batch ``k`` is
samples ``[k*B, (k+1)*B)``, split into contiguous, near-equal per-rank slices. Each rank's
loss is its *sum* of cross-entropies scaled by ``world_size / B``, so DDP's gradient average
is the mean gradient of the global batch whatever the world size: a run interrupted and
resumed on another world size trains on the same sequence of global batches as an
undisturbed one (up to floating-point summation order).

Exit codes (the protocol): 0 done, 75 checkpointed after a stop signal or a lost peer, 1 a
failure. Prints one line per checkpoint (rank 0) and at the end::

    final test accuracy: 97.64% after 30000 samples

Run ``python train.py --help`` for the options; README.md shows torchrun and Offcut runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from offcut.client.elastic import ElasticRun

N_TEST = 297
SPLIT_SEED = 0  # the train/test split never changes with --seed
DEFAULT_SAMPLES = 30_000


class DigitsCNN(nn.Module):
    """(N, 1, 8, 8) images in [0, 1] -> (N, 10) class logits."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)   # (N, 16, 8, 8)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)  # (N, 32, 8, 8) -> pool (N, 32, 4, 4)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train (1500, 1, 8, 8) float32, y_train (1500,) int64, x_test (297, 1, 8, 8),
    y_test (297,)): the fixed split of ``load_digits``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.int64)
    order = torch.tensor(np.random.default_rng(SPLIT_SEED).permutation(len(y)))
    test, train = order[:N_TEST], order[N_TEST:]
    return x[train], y[train], x[test], y[test]


class GlobalOrder:
    """Train-set indices by global sample index: epoch ``e`` visits a permutation seeded by
    ``(seed, e)``, so the order is the same for every world size and restart."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.n)}
        return self._perms[epoch]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Train-set indices of global samples ``start .. start + count - 1``, shape (count,)."""
        out = np.empty(count, dtype=np.int64)
        for j, i in enumerate(range(start, start + count)):
            out[j] = self._perm(i // self.n)[i % self.n]
        return torch.from_numpy(out)


def rank_slice(batch: int, world_size: int, rank: int) -> slice:
    """This rank's part of a global batch of ``batch`` samples: contiguous slices whose sizes
    differ by at most one (the first ``batch % world_size`` ranks get one more)."""
    base, extra = divmod(batch, world_size)
    lo = rank * base + min(rank, extra)
    return slice(lo, lo + base + (1 if rank < extra else 0))


def task_total_work(address: str, task_id: str) -> int:
    """The task's total work [samples] from the daemon."""
    from offcut.client import Client

    with Client(address, timeout_s=30) as c:
        return int(c.get_task(task_id).spec.total_work_samples)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of ``x`` classified as ``y``."""
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--samples", type=int, default=None,
                   help="total samples to train (default: the task's total work under Offcut, "
                        f"else {DEFAULT_SAMPLES})")
    p.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=1, help="model init and data order")
    p.add_argument("--checkpoint-every-s", type=float, default=60.0,
                   help="checkpoint when this many seconds passed since the last (0: never)")
    p.add_argument("--checkpoint-every-steps", type=int, default=0,
                   help="checkpoint every this many steps of this process (0: never)")
    p.add_argument("--collective-timeout-s", type=float, default=120.0,
                   help="a collective waiting this long for a silent peer fails (exit 75)")
    p.add_argument("--rendezvous-timeout-s", type=float, default=600.0,
                   help="how long the rendezvous waits for every rank")
    p.add_argument("--checkpoint-dir", default=None,
                   help="used when OFFCUT_CHECKPOINT_DIR is unset (local runs)")
    args = p.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        p.error("--samples must be >= 1")
    if args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one process per core: no oversubscription
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s")
    run = ElasticRun.from_env(
        checkpoint_dir=args.checkpoint_dir, timeout_s=args.collective_timeout_s,
        rendezvous_timeout_s=args.rendezvous_timeout_s,
        checkpoint_every_s=args.checkpoint_every_s or None,
        checkpoint_every_steps=args.checkpoint_every_steps or None)
    total = args.samples
    if total is None:
        env = run.env
        total = (task_total_work(env.address, env.task_id) if env.reports_progress
                 else DEFAULT_SAMPLES)
    world, B = run.world_size, args.batch_size
    if B < world:
        raise SystemExit(f"--batch-size {B} is below the world size {world}")

    with run:  # rendezvous; a lost peer exits 75
        x_train, y_train, x_test, y_test = load_data()
        torch.manual_seed(args.seed)
        model = DigitsCNN()
        ddp = DDP(model)  # broadcasts rank 0's parameters
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        ckpt = run.load_checkpoint()
        if ckpt is not None:
            model.load_state_dict(ckpt["state"]["model"])
            opt.load_state_dict(ckpt["state"]["optimizer"])
        done = run.samples_done
        if done >= total and run.is_main:  # finished before the last exit: report again
            run.report_progress(done)
        order = GlobalOrder(len(y_train), args.seed)

        def state():
            return {"model": model.state_dict(), "optimizer": opt.state_dict()}

        loss_sum = 0.0
        steps = 0
        while done < total:
            b = min(B, total - done)          # the last global batch may be partial
            part = rank_slice(b, world, run.rank)
            idx = order.indices(done, b)[part]
            ddp.train()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x_train[idx]), y_train[idx], reduction="sum")
            (loss * (world / b)).backward()   # DDP averages: the global batch's mean gradient
            opt.step()
            done += b
            loss_sum += loss.item() / max(1, len(idx))
            steps += 1
            if run.step(done, state) and run.is_main:
                print(f"checkpoint: {done} samples, generation {run.generation}, world size "
                      f"{world}, mean loss {loss_sum / steps:.4f}", flush=True)
                loss_sum, steps = 0.0, 0
        run.save_checkpoint(state, done)      # the final one: its report completes the task
        acc = accuracy(model, x_test, y_test)
        if run.is_main:
            print(f"final test accuracy: {100 * acc:.2f}% after {done} samples", flush=True)


if __name__ == "__main__":
    main()

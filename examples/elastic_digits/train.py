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

Zeus (``OFFCUT_ZEUS_JOB_ID``, set by the launcher for a task submitted with ``offcut submit
--zeus-job ID``, or ``--zeus-job ID``): the task's run is one trial of the daemon's batch-size
optimizer (:mod:`offcut.client.training`). Rank 0 opens the trial in the task's first
generation and resumes it (``resume_trial=`` the trial number in the checkpoint,
``generation=OFFCUT_GENERATION``) in later ones; the trial's *global* batch size is broadcast
to every rank (``--batch-size`` is ignored) and split by the world size as
:func:`~offcut.client.training.per_rank_batch_size` says (the split above). A Zeus epoch is one
pass over the 1,500 training images: global batches are cut at every multiple of 1,500
samples, where rank 0 reports the epoch with the test accuracy as the metric
(``on_epoch_end``), every rank gets the daemon's verdict by one broadcast and a checkpoint is
written. The verdict's stop (target reached, cost bound, ``max_epochs``) ends the task's run:
the final checkpoint, exit 0. The stop signal and a lost peer suspend the trial
(``interrupt()``, run by ``ElasticRun(on_restart=...)`` before exit 75: the exits skip
``with`` blocks), so its epochs, time and energy continue in the next generation; a real
failure (exit 1) ends it as not converged. Energy without a GPU is modelled
(``--zeus-power-w`` per rank, :class:`~offcut.client.training.ManualBackend`); with CUDA rank 0
measures the GPUs it sees (zeus or pynvml). Rank 0 prints each epoch and, when the
generation ends, what it measured::

    zeus epoch 2 of trial 2 (batch size 32, world size 3): test accuracy 96.63%, ...
    zeus: trial 2 converged after epoch 2: this generation measured 0.4210 s, 126.300 J; ...

Power limits (docs/execution.md, "Power limits"): when the Zeus job has a power spec and the
node runs a power helper (``ZEUSD_SOCK_PATH``), every process sets the limit the daemon's
power-limit optimizer plans on its own GPU(s) through the helper (no root): rank 0's
``ZeusTraining`` asks the daemon and shares each plan, the other ranks'
:class:`~offcut.client.training.PowerLimitFollower` follow it, and every rank calls the step
hook before each training step. Without the helper no limit is set. Without a GPU (tests,
with the helper's stand-in) the fake GPUs named by ``CUDA_VISIBLE_DEVICES`` are limited and
the profiling windows are measured with the helper's energy counters.

Run ``python train.py --help`` for the options; README.md shows torchrun and Offcut runs.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from offcut.client.elastic import ElasticRun, is_peer_loss

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
        """Train-set indices of global samples ``start .. start + count - 1``, shape (count,),
        int64. Vectorized per epoch (a range spans at most a few epochs)."""
        out = np.empty(count, dtype=np.int64)
        i, j = start, 0
        while j < count:
            epoch, pos = divmod(i, self.n)
            take = min(count - j, self.n - pos)  # up to this epoch's end
            out[j:j + take] = self._perm(epoch)[pos:pos + take]
            i, j = i + take, j + take
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


def zeus_trial_status(address: str | None, job_id: str, trial_number: int) -> str:
    """The daemon's status of a trial (running | suspended | converged | failed | abandoned)."""
    from offcut.client import Client

    with Client(address, timeout_s=30) as c:
        for t in c.get_zeus_job(job_id).trials:
            if t.trial_number == trial_number:
                return t.status
    raise ValueError(f"the Zeus job {job_id!r} has no trial {trial_number}")


def power_backend(run: ElasticRun):
    """This process's power-limit backend: its GPUs' limits through the node's power helper
    (``ZEUSD_SOCK_PATH``), measured by zeus or NVML, or (without CUDA: the helper's stand-in)
    by the helper's energy counters; None without a helper (no power limits: setting them
    directly needs root) or without a GPU of its own. Its GPUs: those it measures
    (:func:`offcut.client.elastic.energy.own_gpus`: the launcher's ``OFFCUT_LOCAL_GPUS``, else
    torchrun's binding)."""
    if not os.environ.get("ZEUSD_SOCK_PATH", "").strip():
        return None
    from offcut.client.elastic.energy import own_gpus, visible_gpu_count
    from offcut.client.training import HelperBackend, default_backend

    if run.device.type == "cuda":
        gpus = own_gpus(run.env, visible_gpu_count())
        return default_backend(gpus) if gpus else None
    named = [e for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    gpus = own_gpus(run.env, len(named) or run.env.local_world_size)
    return HelperBackend(gpus, measure="helper") if gpus else None


class ZeusEpochs:
    """The task's Zeus trial: rank 0 holds the :class:`~offcut.client.training.ZeusTraining`;
    every rank gets the trial's global batch size and, at each epoch's end, the daemon's stop
    verdict, by broadcast from rank 0; every other rank follows the power-limit plan with a
    :class:`~offcut.client.training.PowerLimitFollower`. Creating it is a collective (call it
    on every rank).

    Args:
        run: the started run (its ``on_restart`` becomes :meth:`suspend` on rank 0).
        job_id: the Zeus job.
        saved: the checkpoint's ``state["zeus"]`` (None in the task's first generation).
        power_w: modelled draw per rank [W] without a GPU.
    """

    def __init__(self, run: ElasticRun, job_id: str, saved: dict | None, power_w: float):
        self.run, self.job_id = run, job_id
        self.zt = None          # rank 0 only
        self._ended = False     # rank 0 closed zt (suspended, finished or failed)
        self.base = (0.0, 0.0)  # the trial's (time [s], energy [J]) when this generation began
        from offcut.client.training import PowerLimitFollower, TorchRankSync

        self.sync = TorchRankSync(run.device)   # rank 0 shares each power plan with the others
        power_error = None
        try:
            self.power = power_backend(run)     # this process's GPUs' limits (None: no helper)
        except Exception as exc:  # raised below, after the broadcast every rank waits for
            self.power, power_error = None, exc
        self.follower = None if run.is_main else PowerLimitFollower(self.power, self.sync)
        if self.follower is not None:
            run.on_restart = self.suspend       # before every exit 75: the maximum limit back
        # batch size (0: rank 0 failed), trial, done; on the collectives' device (nccl: GPU)
        info = torch.zeros(3, dtype=torch.int64, device=run.device)
        error = None
        if run.is_main:
            try:
                if power_error is not None:
                    raise power_error
                info = torch.tensor(self._open(saved, power_w), dtype=torch.int64,
                                    device=run.device)
            except Exception as exc:  # every rank stops; rank 0 raises the cause
                error = exc
        dist.broadcast(info, src=0)
        if error is not None or power_error is not None:
            raise error or power_error
        if int(info[0]) < 1:
            raise RuntimeError("rank 0 could not open the Zeus trial (see its log)")
        self.batch_size, self.trial, self.finished = int(info[0]), int(info[1]), bool(info[2])

    def _open(self, saved: dict | None, power_w: float) -> list[int]:
        from offcut.client.training import ManualBackend, ZeusTraining, default_backend

        run, job_id = self.run, self.job_id
        if saved is not None:
            if saved["job"] != job_id:
                raise ValueError(f"the checkpoint's Zeus job is {saved['job']!r}, not {job_id!r}")
            if saved["finished"]:  # the trial ended before the last exit: nothing left to do
                return [saved["batch_size"], saved["trial"], 1]
            status = zeus_trial_status(run.env.address, job_id, saved["trial"])
            if status == "converged":
                return [saved["batch_size"], saved["trial"], 1]
            if status not in ("running", "suspended"):
                raise RuntimeError(f"Zeus trial {saved['trial']} of job {job_id!r} already ended "
                                   f"({status}): this task's run is over; submit a new task for "
                                   f"the job's next recurrence")
        if run.device.type == "cpu":
            backend = ManualBackend(power_w=power_w, num_gpus=run.world_size)
        else:
            backend = default_backend()
        environ = {**os.environ, "OFFCUT_ZEUS_JOB_ID": job_id}
        # a driver's OFFCUT_ZEUS_TRIAL is the same trial; ZeusTraining resumes it if suspended
        resume = None if saved is None or environ.get("OFFCUT_ZEUS_TRIAL") else saved["trial"]
        zt = ZeusTraining.from_env(backend, environ=environ, resume_trial=resume,
                                   generation=run.generation or None,
                                   power=None if self.power is not None else False,
                                   power_backend=self.power, sync=self.sync)
        self.zt, self.base = zt, (zt.time_s, zt.energy_j)
        run.on_restart = self.suspend  # before every exit 75 (which skips with/finally)
        if saved is not None and zt.batch_size != saved["batch_size"]:
            self.suspend()
            raise RuntimeError(f"Zeus trial {zt.trial_number} runs batch size {zt.batch_size}, "
                               f"the checkpoint's is {saved['batch_size']}")
        return [zt.batch_size, zt.trial_number, int(zt.should_stop)]

    def state(self) -> dict:
        """What the checkpoint keeps: the job, the trial, its batch size, whether it ended."""
        return {"job": self.job_id, "trial": self.trial, "batch_size": self.batch_size,
                "finished": self.finished}

    def begin_epoch(self) -> None:
        if self.zt is not None:
            self.zt.on_epoch_begin()
        elif self.follower is not None:
            self.follower.on_epoch_begin()

    def begin_step(self) -> None:
        """Before every training step, on every rank: the power-limit profiling's step."""
        if self.zt is not None:
            self.zt.on_step_begin()
        elif self.follower is not None:
            self.follower.on_step_begin()

    def end_epoch(self, metric, world_size: int) -> bool:
        """Report the epoch on rank 0 with ``metric()`` (called there only); every rank
        returns the daemon's stop verdict (one broadcast)."""
        stop = torch.zeros(1, dtype=torch.int64, device=self.run.device)
        if self.zt is not None:
            acc = metric()
            verdict = self.zt.on_epoch_end(acc)
            print(f"zeus epoch {self.zt.epoch} of trial {self.trial} (batch size "
                  f"{self.batch_size}, world size {world_size}): test accuracy {100 * acc:.2f}%, "
                  f"{self.zt.time_s:.4f} s, {self.zt.energy_j:.3f} J so far -> "
                  f"{verdict.message}", flush=True)
            stop[0] = int(verdict.stop)
        elif self.follower is not None:
            self.follower.on_epoch_end()
        dist.broadcast(stop, src=0)
        self.finished = bool(stop[0])
        return self.finished

    def _summary(self, outcome: str) -> None:
        zt = self.zt
        print(f"zeus: trial {self.trial} {outcome} after epoch {zt.epoch}: this generation "
              f"measured {zt.time_s - self.base[0]:.4f} s, {zt.energy_j - self.base[1]:.3f} J; "
              f"the trial {zt.time_s:.4f} s, {zt.energy_j:.3f} J", flush=True)

    def suspend(self) -> None:
        """Rank 0, before exit 75 (stop signal, lost peer): suspend the trial, the epoch cut
        short counted, for the next generation; the other ranks set their maximum limit."""
        if self.follower is not None:
            self.follower.interrupt()
        if self.zt is not None and not self._ended:
            self._ended = True
            self.zt.interrupt()
            self._summary("suspended")

    def finish(self) -> None:
        """The run's end: a trial the daemon did not stop (the samples ran out) ends as not
        converged."""
        self.finished = True
        if self.follower is not None:
            self.follower.close()
        if self.zt is not None and not self._ended:
            self._ended = True
            verdict = self.zt.close()
            self._summary("converged" if verdict is not None and verdict.converged else
                          f"ended ({verdict.message if verdict is not None else 'no verdict'})")

    def fail(self, exc: BaseException) -> None:
        """A real failure of this run: end the trial as not converged."""
        if self.follower is not None:
            try:
                self.follower.close()
            except Exception as close_error:  # the original error matters more
                logging.getLogger(__name__).warning("restoring the power limit after %s "
                                                    "failed: %s", type(exc).__name__, close_error)
        if self.zt is not None and not self._ended:
            self._ended = True
            try:
                self.zt.close()
            except Exception as close_error:  # the original error matters more
                logging.getLogger(__name__).warning("ending Zeus trial %d after %s failed: %s",
                                                    self.trial, type(exc).__name__, close_error)


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
                        f"else {DEFAULT_SAMPLES}; with a Zeus job: no bound, the trial's verdict "
                        "ends the run)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="GLOBAL batch size (ignored with a Zeus job: the trial's batch size)")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=1, help="model init and data order")
    p.add_argument("--checkpoint-every-s", type=float, default=60.0,
                   help="checkpoint when this many seconds passed since the last (0: never)")
    p.add_argument("--checkpoint-every-steps", type=int, default=0,
                   help="checkpoint every this many steps of this process (0: never)")
    p.add_argument("--collective-timeout-s", type=float, default=None,
                   help="a collective waiting this long for a silent peer fails (exit 75); "
                        "default: the peer timeout, $OFFCUT_PEER_TIMEOUT_S or 60 s")
    p.add_argument("--rendezvous-timeout-s", type=float, default=600.0,
                   help="how long the rendezvous waits for every rank")
    p.add_argument("--min-step-s", type=float, default=0.0,
                   help="pace: every step takes at least this long [s] (demos and tests on a "
                        "fast machine: a run long enough to watch it rescale; 0: no pacing)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="used when OFFCUT_CHECKPOINT_DIR is unset (local runs)")
    p.add_argument("--zeus-job", default=os.environ.get("OFFCUT_ZEUS_JOB_ID") or None,
                   help="Zeus batch-size job whose trial this run is (default: "
                        "$OFFCUT_ZEUS_JOB_ID; the daemon: $OFFCUT_ADDRESS): the trial's global "
                        "batch size replaces --batch-size, epochs are reported to the daemon, "
                        "whose verdict ends the run")
    p.add_argument("--zeus-power-w", type=float, default=100.0,
                   help="with a Zeus job and no GPU: the MODELLED power draw of one rank [W] "
                        "(energy = this x ranks x time); with CUDA, rank 0 measures its GPUs "
                        "with zeus or pynvml instead")
    args = p.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        p.error("--samples must be >= 1")
    if args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if not (math.isfinite(args.zeus_power_w) and args.zeus_power_w > 0):
        p.error("--zeus-power-w must be > 0")
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
                 else None if args.zeus_job else DEFAULT_SAMPLES)
    limit = math.inf if total is None else total   # with a Zeus job: the verdict's stop
    world, B = run.world_size, args.batch_size
    if B < world and not args.zeus_job:
        raise SystemExit(f"--batch-size {B} is below the world size {world}")

    with run:  # rendezvous; a lost peer exits 75 (after run.on_restart)
        zeus = None
        try:
            # on this process's device: cuda:LOCAL_RANK with nccl (one process per GPU), else cpu
            x_train, y_train, x_test, y_test = (t.to(run.device) for t in load_data())
            epoch_samples = len(y_train)  # a Zeus epoch: one pass over the train images
            torch.manual_seed(args.seed)
            model = DigitsCNN().to(run.device)
            gpu = [run.device.index] if run.device.type == "cuda" else None
            ddp = DDP(model, device_ids=gpu)  # broadcasts rank 0's parameters
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            ckpt = run.load_checkpoint()
            if ckpt is not None:
                model.load_state_dict(ckpt["state"]["model"])
                opt.load_state_dict(ckpt["state"]["optimizer"])
            done = run.samples_done
            if args.zeus_job:
                if ckpt is not None and "zeus" not in ckpt["state"]:
                    raise ValueError(f"the checkpoint in {run.env.checkpoint_dir} was written "
                                     f"without a Zeus job: start with an empty directory")
                zeus = ZeusEpochs(run, args.zeus_job,
                                  ckpt["state"]["zeus"] if ckpt is not None else None,
                                  args.zeus_power_w)
                B = zeus.batch_size
                if B < world:  # not the batch size's failure: the trial stays suspended
                    zeus.suspend()
                    raise SystemExit(f"Zeus trial {zeus.trial}'s global batch size {B} is below "
                                     f"the world size {world}")
                from offcut.client.training import per_rank_batch_size

                per_rank = per_rank_batch_size(B, world, run.rank)
                assert per_rank == len(range(B)[rank_slice(B, world, run.rank)])
                print(f"zeus trial {zeus.trial}: global batch size {B}, world size {world}: "
                      f"rank {run.rank} trains {per_rank} samples per step", flush=True)
            if done >= limit and run.is_main:  # finished before the last exit: report again
                run.report_progress(done)
            order = GlobalOrder(len(y_train), args.seed)

            def state():
                s = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                if zeus is not None:
                    s["zeus"] = zeus.state()
                return s

            loss_sum = 0.0
            steps = 0
            stopped = zeus is not None and zeus.finished
            if zeus is not None and not stopped:
                zeus.begin_epoch()
            while not stopped and done < limit:
                b = int(min(B, limit - done))     # the last global batch may be partial
                if zeus is not None:              # ... and so may an epoch's last one
                    b = min(b, epoch_samples - done % epoch_samples)
                if zeus is not None:
                    zeus.begin_step()             # power-limit profiling, every rank
                step_started = time.monotonic()
                part = rank_slice(b, world, run.rank)   # only this rank's samples
                idx = order.indices(done + part.start, part.stop - part.start)
                ddp.train()
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(ddp(x_train[idx]), y_train[idx], reduction="sum")
                (loss * (world / b)).backward()   # DDP averages: the global batch's mean gradient
                opt.step()
                pace = args.min_step_s - (time.monotonic() - step_started)
                if pace > 0:
                    time.sleep(pace)
                done += b
                loss_sum += loss.item() / max(1, len(idx))
                steps += 1
                if zeus is not None and done % epoch_samples == 0:   # a Zeus epoch ends
                    stopped = zeus.end_epoch(lambda: accuracy(model, x_test, y_test), world)
                    run.save_checkpoint(state, done)
                    if stopped:
                        break
                    zeus.begin_epoch()
                if run.step(done, state) and run.is_main:
                    print(f"checkpoint: {done} samples, generation {run.generation}, world "
                          f"size {world}, mean loss {loss_sum / steps:.4f}", flush=True)
                    loss_sum, steps = 0.0, 0
            if zeus is not None:
                zeus.finish()                     # the final checkpoint says so
            run.save_checkpoint(state, done)      # the final one: its report completes the task
            acc = accuracy(model, x_test, y_test)
            if run.is_main:
                print(f"final test accuracy: {100 * acc:.2f}% after {done} samples", flush=True)
        except Exception as exc:
            if zeus is not None and not is_peer_loss(exc):  # a lost peer: on_restart suspends
                zeus.fail(exc)
            raise


if __name__ == "__main__":
    main()

"""Trace-driven simulation of a recurring job under the daemon's Zeus optimizers
(docs/zeus.md, "Trace-driven simulation").

Follows the semantics of Zeus's own simulator (NSDI '23, Section 6.1, ``zeus._legacy.simulate``):
per recurrence, up to 20 tries; each try asks the daemon's batch-size optimizer for a batch
size, the power-limit optimizer for a power limit (profiling every limit once per batch size,
in the first epoch, from the power trace), samples one recorded training run (seeded),
stops it before the epoch whose cost would cross ``beta_knob * min_cost``, and reports the
run's cumulative time and energy back. Every optimizer decision goes through the daemon's
gRPC services; this module only plays the GPU.

Inputs: Zeus's ``summary_train.csv`` (epochs to reach each target per run) and
``summary_power_<gpu>.csv`` (time per epoch [s] and average power [W] per power limit).
Outputs in ``out``: ``history.csv`` (one row per run: recurrence, try, batch_size,
power_limit_w, energy_j, time_s, reached, cost), ``summary.json``, ``history.png``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from offcut.client.api import Client
from offcut.zeus_views import zeus_cost
from offcut.text_safety import write_csv_frame
from offcut.v1 import zeus_pb2

MAX_TRIES = 20  # per recurrence, as Zeus's simulator


class ZeusReplayError(ValueError):
    """The traces or the workload cannot be simulated (message says why)."""


@dataclass(frozen=True)
class Workload:
    """A recurring job of Zeus's traces with the paper's defaults (NSDI '23, Table 3)."""

    dataset: str
    network: str
    optimizer: str
    target_metric: float
    higher_is_better: bool
    default_batch_size: int
    max_epochs: int


WORKLOADS: dict[str, Workload] = {w.dataset: w for w in (
    Workload("cifar100", "shufflenetv2", "adadelta", 0.6, True, 1024, 100),
    Workload("imagenet", "resnet50", "adadelta", 0.65, True, 256, 100),
    Workload("librispeech", "deepspeech2", "adamw", 40.0, False, 192, 100),
    Workload("movielens-1m", "ncf", "adam", 0.41, True, 1024, 100),
    Workload("sentiment140", "bert_base_uncased", "adamw", 0.84, True, 128, 10),
    Workload("squad", "bert_base_uncased", "adamw", 84.0, True, 32, 10),
)}


@dataclass
class ZeusReplayOptions:
    """Settings of one simulation: ``recurrences`` of the job, ``eta_knob`` in [0, 1],
    ``beta_knob`` (> 0, None = no early stopping), ``seed`` of both the optimizer and the
    choice of recorded runs, ``max_epochs`` (None = the workload's default)."""

    recurrences: int = 50
    eta_knob: float = 0.5
    beta_knob: float | None = 2.0
    seed: int = 1
    max_epochs: int | None = None


def load_traces(train_csv: Path, power_csv: Path, workload: Workload) -> pd.DataFrame:
    """Join the two traces for one workload (one row per run x batch size x power limit) with
    ``energy_per_epoch`` [J] = ``time_per_epoch`` [s] x ``average_power`` [W].

    Raises:
        ZeusReplayError: a file is missing or lacks columns, or the workload has no rows.
    """
    frames = []
    for path in (train_csv, power_csv):
        path = Path(path)
        if not path.is_file():
            raise ZeusReplayError(f"{path}: no such file")
        frames.append(pd.read_csv(path))
    train, power = frames
    need_train = {"dataset", "network", "batch_size", "optimizer", "run", "target_metric",
                  "target_epoch"}
    need_power = {"dataset", "network", "batch_size", "optimizer", "power_limit",
                  "time_per_epoch", "average_power"}
    for name, df, need in (("train", train, need_train), ("power", power, need_power)):
        missing = need - set(df.columns)
        if missing:
            raise ZeusReplayError(f"the {name} trace lacks columns {sorted(missing)}")
    df = train.merge(power, how="inner")
    w = workload
    df = df.loc[(df.dataset == w.dataset) & (df.network == w.network)
                & (df.optimizer == w.optimizer) & (df.target_metric == w.target_metric)]
    if df.empty:
        raise ZeusReplayError(f"no rows for workload {w.dataset}/{w.network}/{w.optimizer} at "
                              f"target {w.target_metric}")
    if w.default_batch_size not in set(df.batch_size):
        raise ZeusReplayError(f"default batch size {w.default_batch_size} is not in the trace")
    df = df.assign(energy_per_epoch=df.time_per_epoch * df.average_power)
    return df.reset_index(drop=True)


class _Gpu:
    """Plays the training runs from the traces (the part the daemon does not decide)."""

    def __init__(self, df: pd.DataFrame, rng: np.random.Generator, eta: float, max_epochs: int):
        self.df = df
        self.rng = rng
        self.eta = eta
        self.max_epochs = max_epochs
        self.max_power_w = float(df.power_limit.max())

    def profile_window(self, batch_size: int, power_limit_w: float) -> tuple[float, float]:
        """Time [s] and energy [J] of one epoch at this limit, averaged over runs (what the
        power-limit optimizer's window measures, scaled to an epoch)."""
        rows = self.df.loc[(self.df.batch_size == batch_size)
                           & (self.df.power_limit == power_limit_w)]
        if rows.empty:
            raise ZeusReplayError(f"no power trace at batch size {batch_size}, "
                                  f"{power_limit_w:g} W")
        return float(rows.time_per_epoch.mean()), float(rows.energy_per_epoch.mean())

    def run(self, batch_size: int, power_limit_w: float, cost_bound_j: float,
            profiled: bool) -> tuple[int, float, float, bool]:
        """One training run: (epochs, energy [J], time [s], reached). ``epochs`` is 0 when even
        the first epoch would cross the cost bound (Zeus's simulator: the run never starts);
        energy and time are then those of the one epoch it would have cost."""
        at_bs = self.df.loc[self.df.batch_size == batch_size]
        rows = at_bs.loc[at_bs.power_limit == power_limit_w]
        path = rows.iloc[int(self.rng.integers(len(rows)))]
        epoch_energy, epoch_time = float(path.energy_per_epoch), float(path.time_per_epoch)
        max_epochs = self.max_epochs
        if math.isfinite(cost_bound_j):
            per_epoch = self.eta * epoch_energy + (1 - self.eta) * self.max_power_w * epoch_time
            max_epochs = int(min(cost_bound_j // per_epoch, self.max_epochs))
        if max_epochs <= 0:
            return 0, epoch_energy, epoch_time, False
        target = path.target_epoch
        reached = bool(pd.notna(target) and target <= max_epochs)
        epochs = int(target) if reached else max_epochs
        energy, seconds = epoch_energy * epochs, epoch_time * epochs
        if profiled:  # the first epoch is split evenly over every power limit
            energy += float(at_bs.energy_per_epoch.mean()) - epoch_energy
            seconds += float(at_bs.time_per_epoch.mean()) - epoch_time
        return epochs, energy, seconds, reached


def _job_spec(job_id: str, workload: Workload, df: pd.DataFrame, opts: ZeusReplayOptions,
              max_epochs: int) -> zeus_pb2.BatchSizeJobSpec:
    limits = sorted(df.power_limit.unique())
    step = float(np.min(np.diff(limits))) if len(limits) > 1 else 25.0
    spec = zeus_pb2.BatchSizeJobSpec(
        job_id=job_id, batch_sizes=sorted(int(b) for b in df.batch_size.unique()),
        default_batch_size=workload.default_batch_size, eta_knob=opts.eta_knob,
        max_epochs=max_epochs, target_metric=workload.target_metric,
        higher_is_better=workload.higher_is_better, max_power_w=float(limits[-1]),
        seed=opts.seed,
        power=zeus_pb2.PowerLimitSpec(min_power_limit_w=float(limits[0]),
                                      max_power_limit_w=float(limits[-1]), step_w=step,
                                      selector="zeus_cost", eta_knob=opts.eta_knob))
    if opts.beta_knob is not None:
        spec.beta_knob = opts.beta_knob
    return spec


def _not_reached(workload: Workload) -> float:
    """A metric value that misses the target (the traces only say whether it was reached)."""
    return workload.target_metric - 1.0 if workload.higher_is_better else workload.target_metric + 1.0


def simulate(client: Client, df: pd.DataFrame, workload: Workload, opts: ZeusReplayOptions,
             job_id: str) -> list[dict]:
    """Run ``opts.recurrences`` recurrences through the daemon at ``client``; the history
    rows. Raises :class:`ZeusReplayError` if a recurrence does not converge in 20 tries."""
    max_epochs = opts.max_epochs or workload.max_epochs
    client.register_zeus_job(_job_spec(job_id, workload, df, opts, max_epochs))
    gpu = _Gpu(df, np.random.default_rng(opts.seed), opts.eta_knob, max_epochs)
    history: list[dict] = []
    for recurrence in range(1, opts.recurrences + 1):
        for attempt in range(1, MAX_TRIES + 1):
            pred = client.predict_batch_size(job_id, request_id=f"{job_id}:{recurrence}:{attempt}")
            bs = pred.batch_size
            plan = client.power_plan(job_id, bs)
            profiled = plan.action == "profile"
            while plan.action == "profile":
                t, e = gpu.profile_window(bs, plan.power_limit_w)
                plan = client.report_power_window(job_id, bs, plan.power_limit_w, t, e)
            epochs, energy, seconds, reached = gpu.run(bs, plan.power_limit_w,
                                                       pred.cost_bound_j, profiled)
            if epochs == 0:
                # Even one epoch would cross the bound: Zeus's simulator does not run it, but
                # tells its optimizer the batch size failed. Here the daemon is told the cost of
                # that epoch, which it judges over the bound (stopped, not converged); the run
                # adds nothing to the history, as in Zeus.
                client.report_epoch(job_id, pred.trial_number, 1, seconds, energy,
                                    _not_reached(workload), batch_size=bs)
                continue
            metric = workload.target_metric if reached else _not_reached(workload)
            verdict = client.report_epoch(job_id, pred.trial_number, epochs, seconds, energy,
                                          metric, batch_size=bs)
            if not verdict.finished:  # cut by the cost bound before the daemon's own stop
                verdict = client.end_trial(job_id, pred.trial_number)
            history.append({"recurrence": recurrence, "try": attempt, "batch_size": bs,
                            "power_limit_w": plan.power_limit_w, "energy_j": energy,
                            "time_s": seconds, "reached": verdict.converged,
                            "cost": verdict.cost_j, "epochs": epochs})
            if verdict.converged:
                break
        else:
            raise ZeusReplayError(f"recurrence {recurrence} did not reach the target in "
                                  f"{MAX_TRIES} tries")
    return history


def baseline(df: pd.DataFrame, workload: Workload, opts: ZeusReplayOptions) -> list[dict]:
    """The default batch size at the maximum power limit without early stopping (the
    paper's baseline), sampled from the same recorded runs with the same seed."""
    max_epochs = opts.max_epochs or workload.max_epochs
    gpu = _Gpu(df, np.random.default_rng(opts.seed), opts.eta_knob, max_epochs)
    rows = []
    for recurrence in range(1, opts.recurrences + 1):
        for attempt in range(1, MAX_TRIES + 1):
            epochs, energy, seconds, reached = gpu.run(
                workload.default_batch_size, gpu.max_power_w, math.inf, profiled=False)
            rows.append({"recurrence": recurrence, "try": attempt,
                         "batch_size": workload.default_batch_size,
                         "power_limit_w": gpu.max_power_w, "energy_j": energy,
                         "time_s": seconds, "reached": reached, "epochs": epochs,
                         "cost": zeus_cost(energy, seconds, opts.eta_knob, gpu.max_power_w)})
            if reached:
                break
    return rows


def summarize(history: list[dict], base: list[dict], workload: Workload,
              opts: ZeusReplayOptions) -> dict:
    """Totals of both runs and the fractions ``energy_saving`` = 1 - E/E_base and
    ``time_change`` = T/T_base - 1."""
    h, b = pd.DataFrame(history), pd.DataFrame(base)
    energy, seconds = float(h.energy_j.sum()), float(h.time_s.sum())
    base_energy, base_time = float(b.energy_j.sum()), float(b.time_s.sum())
    converged = h.loc[h.reached]
    return {
        "workload": asdict(workload), "options": asdict(opts), "runs": len(h),
        "energy_j": energy, "time_s": seconds, "cost": float(h.cost.sum()),
        "baseline_energy_j": base_energy, "baseline_time_s": base_time,
        "baseline_cost": float(b.cost.sum()),
        "energy_saving": 1.0 - energy / base_energy, "time_change": seconds / base_time - 1.0,
        "final_batch_size": int(converged.batch_size.iloc[-1]) if len(converged) else None,
        "final_power_limit_w": float(converged.power_limit_w.iloc[-1]) if len(converged) else None,
    }


def plot(history: list[dict], base: list[dict], out: Path) -> Path:
    """``history.png``: batch size, power limit and cumulative energy per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, b = pd.DataFrame(history), pd.DataFrame(base)
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    x = np.arange(1, len(h) + 1)
    axes[0].step(x, h.batch_size, where="mid")
    axes[0].set_ylabel("batch size")
    axes[0].set_yscale("log", base=2)
    axes[1].step(x, h.power_limit_w, where="mid")
    axes[1].set_ylabel("power limit [W]")
    axes[2].plot(x, h.energy_j.cumsum() / 3.6e6, label="Offcut (Zeus BSO + PLO)")
    axes[2].plot(np.arange(1, len(b) + 1), b.energy_j.cumsum() / 3.6e6,
                 label="default batch size, max power")
    axes[2].set_ylabel("cumulative energy [kWh]")
    axes[2].set_xlabel("run")
    axes[2].legend()
    failed = h.loc[~h.reached]
    axes[0].scatter(failed.index + 1, failed.batch_size, marker="x", color="red",
                    label="did not converge")
    axes[0].legend()
    fig.tight_layout()
    path = out / "history.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_zeus_replay(train_csv: Path, power_csv: Path, workload: str, opts: ZeusReplayOptions,
                    out: Path, target: str | None = None) -> dict:
    """Simulate ``workload`` through a daemon (``target`` address, or a private one started
    for the run); write ``history.csv``, ``summary.json`` and ``history.png`` to ``out``.

    Raises:
        ZeusReplayError: unknown workload or unusable traces.
        offcut.errors.OffcutError: the daemon rejected a call (e.g. a bad option).
    """
    if workload not in WORKLOADS:
        raise ZeusReplayError(f"unknown workload {workload!r}; choose from {sorted(WORKLOADS)}")
    w = WORKLOADS[workload]
    df = load_traces(train_csv, power_csv, w)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    job_id = f"zeus-replay-{w.dataset}-{opts.seed}-{time.time_ns()}"
    started = time.perf_counter()
    if target is None:
        from offcut.replay.driver import ReplayOptions, private_daemon

        with private_daemon(ReplayOptions(), out, out / "offcutd.log") as (address, _pid):
            with Client(address) as client:
                history = simulate(client, df, w, opts, job_id)
    else:
        with Client(target) as client:
            history = simulate(client, df, w, opts, job_id)
    base = baseline(df, w, opts)
    summary = summarize(history, base, w, opts)
    summary["wall_s"] = time.perf_counter() - started
    write_csv_frame(pd.DataFrame(history), out / "history.csv")  # (no spreadsheet formulas)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(history, base, out)
    return summary

"""Synthetic node-state logs and task sets in the safe replay format, shaped like BFTrainer's.

Figures measured once on the real log (``bftrainer/ndstat-10sdn6-evt.tar.gz``: 23,883 rows x
4,734 nodes, 2021-02-10 to 2021-02-24, 358 h):

* idle-interval length (a node's idle stretch, enclosed intervals only): median **475 s**,
  mean 1,192 s, quartiles 162 s / 1,397 s (423,354 intervals) — close to a log-normal with
  median 475 s and sigma ~1.35 (mean/median = 2.5);
* time between events (rows after de-duplication), whole machine: median **30 s**, mean 54 s,
  10th/90th percentile 10 s / 111 s;
* nodes changing per event, whole machine: median **4**, mean 35 (heavy tail: 33 % of events
  change 1 node, 99th percentile 761); on a 64-node slice (``first_node=0``, ``skip_rows=1000``)
  median 1, mean 3.0 nodes per event, median gap 131 s, median idle interval 476 s;
* idle fraction: 8.7 % of node-time overall, 12 % on the 64-node slice (time-weighted mean
  5.6 idle nodes of 64).

A 64-node log cannot have all of these at once (30 s gaps with 475 s idle stretches need many
idle nodes), so the generator keeps the idle-interval distribution (log-normal, median 475 s,
sigma 1.35) and the event spacing (median ~30 s), and raises the idle fraction to ~30 % so that
a 64-node demo has work for several elastic tasks; that gives ~1-2 nodes per event (median 1,
as on the real 64-node slice). Each node alternates idle / busy stretches; state changes snap
to the next candidate scheduler event (log-normal gaps), so several nodes often change at
once; candidate events without a change are dropped, as the reference's de-duplication did.
With the defaults (64 nodes, 36 h; seeds 0-2) the generated log has: median idle interval
466-503 s (mean ~1,140 s), median gap 32-34 s (mean ~41 s), median 1 / mean 1.4 nodes per
event, 30-32 % idle, ~3,100 events; the bundled demo (seed 0) is 33 KB.

Tasks follow the ``hps-shufflenet`` sets: ``Ns = 0, 1, 2, 4, ..., max_nodes``, near-linear
throughput (~2,800 samples/s per node, 80 % parallel efficiency at 64 nodes), ``Tcup`` 18 s,
``Tcdw`` 12 s, ``Os = Ps``; their total work is ~35 % of (mean idle nodes x duration x per-node
throughput), split unevenly over the tasks; submit times spread over the first third of the
log. Everything is deterministic for a seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .bftrainer_data import NodeChange, NodeLog, TaskRecord, write_node_log, write_task_set

__all__ = ["generate", "demo_data_dir", "log_stats", "IDLE_MEDIAN_S", "IDLE_SIGMA", "EVENT_GAP_MEDIAN_S"]

IDLE_MEDIAN_S = 475.0      # measured median idle interval of the real log
IDLE_SIGMA = 1.35          # log-normal sigma matching mean/median = 2.5
EVENT_GAP_MEDIAN_S = 30.0  # measured median time between events (whole machine)
IDLE_FRACTION = 0.30       # raised from the real 9-12 % so a 64-node demo has room for tasks
_CANDIDATE_GAP_MEDIAN_S = 9.0   # candidate-event gaps; after dropping empty ones ~30 s remain
_CANDIDATE_GAP_SIGMA = 0.8
WORK_FRACTION = 0.35       # total task work / (mean idle nodes x duration x per-node rate)
START = pd.Timestamp("2021-02-10 00:00:00")


def demo_data_dir() -> Path:
    """Directory of the bundled demo data (safe format: ``nodes.csv``, ``events.csv.gz``,
    ``tasks.csv``): 64 nodes, 36 h, 6 tasks, made by ``generate(seed=0)``. Its tasks are sized
    for a replay of the whole log (``skip_rows=0``)."""
    return Path(__file__).resolve().parent / "data" / "demo"


def _node_names(rng: np.random.Generator, n: int) -> list[str]:
    """Real-looking names (``c05n06``: row letter + cabinet + node), unique, in a random
    (log-like) column order."""
    letters = "abcdefgh"
    per_cab = 16
    n_cabs = max(1, math.ceil(n / per_cab))
    cabs = rng.choice(len(letters) * 36, size=n_cabs + 2, replace=False)
    pool = [f"{letters[c // 36]}{c % 36 + 1:02d}n{k:02d}"
            for c in cabs for k in range(1, per_cab + 1)]
    idx = rng.choice(len(pool), size=n, replace=False)
    return [pool[i] for i in idx]


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size=None):
    return rng.lognormal(math.log(median), sigma, size)


def _simulate(rng: np.random.Generator, num_nodes: int, duration_s: float):
    """Return (candidate event times [s, int], initial idle mask, list of (t, up, down))."""
    # candidate scheduler events, integer seconds, >= 1 s apart
    n_guess = int(duration_s / _CANDIDATE_GAP_MEDIAN_S * 1.5) + 16
    gaps = np.maximum(1, np.rint(_lognormal(rng, _CANDIDATE_GAP_MEDIAN_S, _CANDIDATE_GAP_SIGMA,
                                            n_guess))).astype(np.int64)
    grid = np.cumsum(gaps)
    grid = grid[grid < duration_s]
    idle_mean = IDLE_MEDIAN_S * math.exp(IDLE_SIGMA ** 2 / 2)
    busy_mean = idle_mean * (1 - IDLE_FRACTION) / IDLE_FRACTION
    busy_median = busy_mean / math.exp(IDLE_SIGMA ** 2 / 2)

    state = rng.random(num_nodes) < IDLE_FRACTION
    init = state.copy()
    # residual time of the current stretch: a drawn length times a uniform fraction
    first = np.where(state, _lognormal(rng, IDLE_MEDIAN_S, IDLE_SIGMA, num_nodes),
                     _lognormal(rng, busy_median, IDLE_SIGMA, num_nodes))
    due = first * rng.random(num_nodes)
    changes = []
    for t in grid:
        flip = np.flatnonzero(due <= t)
        if flip.size == 0:
            continue
        up = [int(j) for j in flip if not state[j]]
        down = [int(j) for j in flip if state[j]]
        state[flip] = ~state[flip]
        for j in flip:
            med = IDLE_MEDIAN_S if state[j] else busy_median
            due[j] = t + _lognormal(rng, med, IDLE_SIGMA)
        changes.append((int(t), up, down))
    return init, changes


def _mean_idle_nodes(init: np.ndarray, changes, duration_s: float) -> float:
    n_idle = int(init.sum())
    area, last = 0.0, 0.0
    for t, up, down in changes:
        area += n_idle * (t - last)
        n_idle += len(up) - len(down)
        last = t
    area += n_idle * (duration_s - last)
    return area / duration_s


def _tasks(rng: np.random.Generator, num_tasks: int, max_nodes: int, duration_s: float,
           mean_idle: float) -> list[TaskRecord]:
    counts = [0] + [2 ** k for k in range(int(math.log2(max_nodes)) + 1)]
    if counts[-1] != max_nodes:
        counts.append(max_nodes)
    base = 2831.0 * rng.uniform(0.8, 1.2, num_tasks)          # samples/s on one node
    eff_end = rng.uniform(0.75, 0.9, num_tasks)               # efficiency at 64 nodes
    weights = rng.uniform(0.6, 1.4, num_tasks)
    weights /= weights.sum()
    total = WORK_FRACTION * mean_idle * duration_s * float(base.mean())
    submits = np.sort(rng.uniform(0.0, duration_s / 3, num_tasks))
    submits[0] = min(submits[0], 600.0)
    out = []
    for i in range(num_tasks):
        thr = [0.0]
        for n in counts[1:]:
            eff = 1 - (1 - eff_end[i]) * math.log2(n) / 6 if n > 1 else 1.0
            noise = 1.0 if n == 1 else rng.uniform(0.98, 1.02)
            thr.append(round(base[i] * n * eff * noise, 1))
        out.append(TaskRecord(
            name=f"J{i:05d}",
            submit_time=START + pd.Timedelta(seconds=int(submits[i])),
            min_nodes=1, max_nodes=max_nodes, rescale_up_s=18.0, rescale_down_s=12.0,
            total_work_samples=float(round(total * weights[i], -3)),
            node_counts=list(counts), throughputs=thr, objective_values=list(thr)))
    return out


def log_stats(log: NodeLog) -> dict[str, float]:
    """Summary statistics of a :class:`NodeLog` (its selected nodes, from its initial state on).

    Returns ``events``; ``gap_median_s`` / ``gap_mean_s`` (seconds between events);
    ``changes_median`` / ``changes_mean`` (nodes changing per event); ``idle_interval_median_s``
    / ``idle_interval_mean_s`` (enclosed idle stretches, seconds; NaN when none);
    ``idle_fraction`` (time-weighted share of idle nodes, 0..1); ``duration_s``.
    """
    idle_since: dict[str, pd.Timestamp | None] = {n: None for n in log.node_names}
    for n in log.initial_idle:
        idle_since[n] = log.initial_time  # not enclosed: not counted
    open_at_start = set(log.initial_idle)
    n_idle = len(log.initial_idle)
    last = log.initial_time
    area = 0.0
    gaps, counts, intervals = [], [], []
    for ev in log.events():
        dt = (ev.time - last).total_seconds()
        gaps.append(dt)
        area += n_idle * dt
        last = ev.time
        counts.append(len(ev.became_idle) + len(ev.became_busy))
        for n in ev.became_idle:
            idle_since[n] = ev.time
            open_at_start.discard(n)
        for n in ev.became_busy:
            if n not in open_at_start and idle_since[n] is not None:
                intervals.append((ev.time - idle_since[n]).total_seconds())
            open_at_start.discard(n)
            idle_since[n] = None
        n_idle += len(ev.became_idle) - len(ev.became_busy)
    duration = (last - log.initial_time).total_seconds()
    nan = float("nan")
    return {
        "events": float(len(gaps)),
        "gap_median_s": float(np.median(gaps)) if gaps else nan,
        "gap_mean_s": float(np.mean(gaps)) if gaps else nan,
        "changes_median": float(np.median(counts)) if counts else nan,
        "changes_mean": float(np.mean(counts)) if counts else nan,
        "idle_interval_median_s": float(np.median(intervals)) if intervals else nan,
        "idle_interval_mean_s": float(np.mean(intervals)) if intervals else nan,
        "idle_fraction": area / duration / len(log.node_names) if duration > 0 else nan,
        "duration_s": duration,
    }


def generate(out_dir: str | Path, *, num_nodes: int = 64, hours: float = 36, num_tasks: int = 6,
             seed: int = 0) -> Path:
    """Write a synthetic node log (``nodes.csv``, ``events.csv.gz``) and task set
    (``tasks.csv``) in the safe format into ``out_dir``; return ``out_dir``.

    ``num_nodes`` nodes over ``hours`` hours starting 2021-02-10 00:00 (UTC-naive), integer-
    second event times; ``num_tasks`` tasks (``max_nodes = num_nodes``). The statistics are
    those described in the module docstring. Deterministic for a given ``seed``. Raises
    ``ValueError`` for non-positive sizes.
    """
    if num_nodes < 1 or hours <= 0 or num_tasks < 0:
        raise ValueError("num_nodes and hours must be positive, num_tasks non-negative")
    rng = np.random.default_rng(seed)
    duration = float(hours) * 3600.0
    names = _node_names(rng, num_nodes)
    init, changes = _simulate(rng, num_nodes, duration)
    mean_idle = _mean_idle_nodes(init, changes, duration)
    out = Path(out_dir)
    write_node_log(
        out, names, START, [names[j] for j in np.flatnonzero(init)],
        (NodeChange(START + pd.Timedelta(seconds=t), [names[j] for j in sorted(up)],
                    [names[j] for j in sorted(down)], row)
         for row, (t, up, down) in enumerate(changes, start=1)))
    write_task_set(_tasks(rng, num_tasks, num_nodes, duration, mean_idle), out / "tasks.csv")
    return out


if __name__ == "__main__":  # regenerate the bundled demo: python -m offcut.replay.synth
    print(generate(demo_data_dir()))

"""What running tasks would report: the replay's hidden ground truth (issue "Learn scalability
online, and let the allocation optimise energy").

When a replay hides the true scalability curves from the daemon (``curves = hidden`` or
``linear``), the daemon cannot compute progress itself: the replay plays the tasks. This module
keeps, per task, the samples it has processed and the energy its nodes drew, from the **true**
curve of the task set (BFTrainer's JNPs rows) with seeded noise, and the daemon's placements:

* throughput on n nodes in node-event interval k: ``Ps(n) * max(0.05, 1 + noise * z)``, z
  standard normal, drawn per (task, k) from ``seed`` (the same draws in every mode, so runs
  with known, hidden and linear curves see the same luck); 0 below Jmin;
* a rescale from c to n nodes (grow, shrink, preemption) pauses the task for
  ``Ps(c) * Tc / Ps(n)`` seconds (BFTrainer's loss of ``Ps(c) * Tc`` samples, arXiv 2106.12091,
  Section 3, paid as time at the new rate, so the processed-samples counter never decreases);
  Tc = the true Tcup (grow) or Tcdw (shrink, preemption); a start from 0 costs nothing (as in
  BFTrainer);
* power of the task's n nodes: ``n * (p_idle + (p_busy - p_idle) * u(n))`` [W] with
  ``u(n) = (Ps(n) / n) / max_k (Ps(k) / k)`` the parallel efficiency (GPUs waiting on
  communication draw less), drawn during pauses too.

Reports carry the cumulative samples and energy; the report that reaches ``total_work`` is
sent at the exact crossing time (:meth:`ProgressSimulator.next_completion`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from offcut.replay.bftrainer_data import TaskRecord
from offcut.views import Decision

#: node-event intervals of noise drawn per task at once
_NOISE_BLOCK = 1024


def peak_rate_per_node(record: TaskRecord) -> float:
    """max_k Ps(k) / k over ``record``'s curve points with k > 0 [samples/s per node]: the
    denominator of the parallel efficiency u(n) (module docstring); 1.0 when no point has a
    positive rate (u is then computed against 1 sample/s per node)."""
    ns = np.asarray(record.node_counts, dtype=float)
    ps = np.asarray(record.throughputs, dtype=float)
    per_node = ps[ns > 0] / ns[ns > 0]
    return float(per_node.max()) if per_node.size and per_node.max() > 0 else 1.0


@dataclass
class PowerModel:
    """Hidden power truth of the replay's nodes [W]: ``idle_w`` drawn by a node whose GPUs
    wait, ``busy_w`` by a node computing at full efficiency.

    A task on n nodes draws ``n * (idle_w + (busy_w - idle_w) * u(n))`` [W] with
    ``u(n) = (Ps(n) / n) / max_k (Ps(k) / k)`` its parallel efficiency, clipped to [0, 1]
    (Ps interpolated linearly on the task's curve, flat beyond its last point). This linear
    utilisation model is the replay's own assumption, not a measured one.
    """

    idle_w: float = 250.0
    busy_w: float = 1000.0

    def task_power_w(self, record: TaskRecord, n: int, peak: float | None = None) -> float:
        """Power [W] of ``record``'s ``n`` nodes (class docstring); 0 for n <= 0.

        ``peak``: :func:`peak_rate_per_node` of ``record`` when the caller has it already
        (it depends on the record alone); computed when None.
        """
        if n <= 0:
            return 0.0
        if peak is None:
            peak = peak_rate_per_node(record)
        rate = float(np.interp(n, record.node_counts, record.throughputs))
        u = min(1.0, max(0.0, rate / n / peak))
        return n * (self.idle_w + (self.busy_w - self.idle_w) * u)

    def curve_w(self, record: TaskRecord) -> list[float]:
        """Power at each of ``record.node_counts`` [W] (a spec's ``power_w``), shape (K,)."""
        peak = peak_rate_per_node(record)
        return [self.task_power_w(record, int(n), peak) for n in record.node_counts]


@dataclass
class _Truth:
    """The played state of one task; ``noise`` holds its standard-normal draws for node-event
    intervals 0..len-1, extended from ``rng`` a block at a time."""

    record: TaskRecord
    index: int
    nodes: int = 0
    samples: float = 0.0
    energy_j: float = 0.0
    pause_s: float = 0.0
    clock: float | None = None
    done: bool = False
    noise: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rng: np.random.Generator | None = None
    peak: float = field(init=False)

    def __post_init__(self) -> None:
        self.peak = peak_rate_per_node(self.record)


class ProgressSimulator:
    """The true progress and energy of the replay's tasks (module docstring).

    Args:
        tasks: the task set with its true curves and rescale costs.
        noise: relative standard deviation of the throughput per node-event interval
            (finite, >= 0; 0 = no noise).
        seed: seed of the noise.
        power: the hidden power model (default :class:`PowerModel`).

    Raises ``ValueError`` for a negative or non-finite ``noise``.
    """

    def __init__(self, tasks: list[TaskRecord], noise: float = 0.05, seed: int = 0,
                 power: PowerModel | None = None):
        if not math.isfinite(noise) or noise < 0:
            raise ValueError(f"noise must be finite and >= 0, got {noise}")
        self.noise, self.seed = float(noise), int(seed)
        self.power = power or PowerModel()
        self.by_name = {t.name: _Truth(t, i) for i, t in enumerate(tasks)}
        self.by_id: dict[str, _Truth] = {}
        self.interval = 0  # node-event interval index (the noise draw)

    # ------------------------------------------------------------------ bookkeeping
    def submitted(self, name: str, task_id: str) -> None:
        """Bind the daemon's ``task_id`` to the task named ``name``."""
        self.by_id[task_id] = self.by_name[name]

    def set_interval(self, k: int) -> None:
        """The node-event interval now running (the index of the last node event sent)."""
        self.interval = int(k)

    def _multiplier(self, truth: _Truth) -> float:
        """Luck of ``truth`` in the current interval: ``max(0.05, 1 + noise * z)``."""
        if self.noise == 0:
            return 1.0
        k = self.interval
        if k >= truth.noise.size:  # draw this task's noise on up to the block holding k
            if truth.rng is None:
                truth.rng = np.random.default_rng([self.seed, truth.index])
            more = (k // _NOISE_BLOCK + 1) * _NOISE_BLOCK - truth.noise.size
            truth.noise = np.concatenate((truth.noise, truth.rng.standard_normal(more)))
        return max(0.05, 1.0 + self.noise * float(truth.noise[k]))

    @staticmethod
    def _rate(truth: _Truth, n: int) -> float:
        """True throughput Ps(n) [samples/s] of ``truth``'s task on ``n`` nodes, without
        noise: the curve linearly interpolated, 0 below Jmin (as
        :meth:`offcut.taskspec.TaskSpec.throughput_at`)."""
        r = truth.record
        if n < r.min_nodes or n <= 0:
            return 0.0
        return float(np.interp(n, r.node_counts, r.throughputs))

    # ------------------------------------------------------------------ time
    def advance(self, t: float) -> None:
        """Run every placed task up to ``t`` [s since epoch]."""
        for truth in self.by_id.values():
            self._advance_one(truth, t)

    def _advance_one(self, truth: _Truth, t: float) -> None:
        if truth.clock is None or truth.done:
            truth.clock = t if truth.clock is None else max(truth.clock, t)
            return
        dt = t - truth.clock
        if dt <= 0:
            return
        if truth.nodes > 0:
            working = max(0.0, dt - truth.pause_s)
            truth.pause_s = max(0.0, truth.pause_s - dt)
            truth.samples += self._rate(truth, truth.nodes) * self._multiplier(truth) * working
            truth.energy_j += (self.power.task_power_w(truth.record, truth.nodes, truth.peak)
                              * dt)
        truth.clock = t

    def next_completion(self) -> tuple[float, str] | None:
        """(time, task_id) of the earliest task to reach its total work at its current count
        and luck, or None."""
        best: tuple[float, str] | None = None
        for task_id, truth in self.by_id.items():
            if truth.done or truth.nodes <= 0 or truth.clock is None:
                continue
            rate = self._rate(truth, truth.nodes) * self._multiplier(truth)
            if rate <= 0:
                continue
            left = truth.record.total_work_samples - truth.samples
            at = truth.clock + truth.pause_s + max(0.0, left) / rate
            if best is None or at < best[0]:
                best = (at, task_id)
        return best

    # ------------------------------------------------------------------ placements
    def apply(self, d: Decision) -> None:
        """Take the daemon's placement changes of one reply (in order, at their times)."""
        for p in d.placements:
            truth = self.by_id.get(p.task_id)
            if truth is None or truth.done:
                continue
            t = p.time
            self._advance_one(truth, t)
            c, n = truth.nodes, len(p.nodes)
            if p.change in ("completed", "cancelled", "failed"):
                truth.nodes, truth.done = 0, True
                continue
            if c > 0 and n > 0 and n != c:
                cost_s = (truth.record.rescale_up_s if n > c else truth.record.rescale_down_s)
                new_rate = self._rate(truth, n)
                if new_rate > 0:
                    truth.pause_s += self._rate(truth, c) * cost_s / new_rate
            if n == 0:
                truth.pause_s = 0.0
            truth.nodes = n

    # ------------------------------------------------------------------ reports
    def report(self, task_id: str, t: float) -> dict:
        """The report of ``task_id`` at ``t`` [s since epoch] (after :meth:`advance`), as a
        ``ReportProgress`` entry: ``task_id``, ``time``, ``samples_done`` (cumulative, capped at
        the total work: the task stops there), ``nodes`` and ``energy_j`` (cumulative [J]).
        Raises ``KeyError`` for an unknown ``task_id``."""
        truth = self.by_id[task_id]
        samples = min(truth.samples, truth.record.total_work_samples)
        return {"task_id": task_id, "time": t, "samples_done": samples, "nodes": truth.nodes,
                "energy_j": truth.energy_j}

    def finish(self, task_id: str) -> None:
        """Mark ``task_id`` complete (its final report was sent)."""
        truth = self.by_id[task_id]
        truth.samples = truth.record.total_work_samples
        truth.done = True
        truth.nodes = 0

    def running(self) -> list[str]:
        """Ids of placed, unfinished tasks holding nodes."""
        return [k for k, v in self.by_id.items() if not v.done and v.nodes > 0]

    @property
    def total_samples(self) -> float:
        """Samples processed by all tasks [samples]."""
        return float(sum(min(t.samples, t.record.total_work_samples)
                         for t in self.by_name.values()))

    @property
    def task_energy_j(self) -> float:
        """Energy drawn by the tasks' nodes [J]."""
        return float(sum(t.energy_j for t in self.by_name.values()))

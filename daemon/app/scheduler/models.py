"""What the scheduler assumes of a task (docs/architecture.md, "Tasks and the progress model"):
throughput, power and rescale costs from its spec or its learner, the population prior, the curves
the allocation uses (cached)."""

from __future__ import annotations

import numpy as np

from offcut.daemon.app.model import Task
from offcut.daemon.app.scheduler.state import SchedulerState
from offcut.daemon.app.solvers.problem import objective_table


class TaskModels:
    """Modelled throughput, power and rescale costs of tasks.

    Reads ``state.tasks`` (the learners, for the population prior) and ``state.objective``
    (the prior figures); writes nothing of the state. Owns its caches: the curves per task
    (dropped by :meth:`forget` when a task finishes) and the prior (recomputed after
    :meth:`learners_moved`).

    Interface: :meth:`rate_at`, :meth:`power_at`, :meth:`rescale_costs`, :meth:`prior_rate`,
    :meth:`curves`, :meth:`learned_curve`, :meth:`power_values`, :meth:`forget`,
    :meth:`learners_moved`.
    """

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        self._curves: dict[str, tuple] = {}  # task id -> (key, (Ns, Os, S(n)) arrays) (cache)
        self._learn_version = 0                 # bumped when a learner's model changes (caches)
        self._prior_cache: tuple[int, float] | None = None

    def rate_at(self, task: Task, n: int) -> float:
        """Modelled throughput [samples/s] of ``task`` on ``n`` nodes: Ps(n)
        (docs/architecture.md, "Tasks and the progress model"), or the learner's estimate for a
        learned task; 0 below Jmin."""
        if n < task.spec.min_nodes:
            return 0.0
        if task.spec.learned:
            return task.learner.rate_at(n, self.prior_rate())
        return task.spec.throughput_at(n)

    def power_at(self, task: Task, n: int) -> float:
        """Modelled power draw [W] of ``task`` on ``n`` nodes: its spec's ``power_w`` curve,
        else its learner's measurements, else the prior ``node_power_w`` per node."""
        if n <= 0:
            return 0.0
        spec = task.spec
        if spec.power_w:
            return float(np.interp(n, spec.node_counts, spec.power_w))
        if task.learner is not None:
            return float(task.learner.power_at(n, self.state.objective.node_power_w))
        return n * self.state.objective.node_power_w

    def rescale_costs(self, task: Task) -> tuple[float, float]:
        """(Tcup, Tcdw) [s] of ``task``: measured by its learner for a task that reports its
        progress, with or without a curve (the spec's values are the prior until a rescale is
        measured: measured beats declared), else the spec's."""
        spec = task.spec
        if task.learner is not None:
            return (task.learner.rescale_up_s(spec.rescale_up_s),
                    task.learner.rescale_down_s(spec.rescale_down_s))
        return spec.rescale_up_s, spec.rescale_down_s

    def learners_moved(self) -> None:
        """A learner's model changed: the population prior (:meth:`prior_rate`) and the
        learned curves are computed again on next use."""
        self._learn_version += 1

    def prior_rate(self) -> float:
        """Throughput per node [samples/s] assumed for a learned task before its first
        measurement: the median of the other tasks' measured per-node rates (a population
        prior), else ``prior_rate_per_node``."""
        key = self._learn_version
        if self._prior_cache is None or self._prior_cache[0] != key:
            rates = [r for task in self.state.tasks.values() if task.learner is not None
                     for r in [task.learner.per_node_rate()] if r is not None and r > 0]
            prior = (float(np.median(rates)) if rates
                     else self.state.objective.prior_rate_per_node)
            self._prior_cache = (key, prior)
        return self._prior_cache[1]

    def curves(self, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Ns, Os, S(n) for n = 0..Jmax) of a task as float arrays, cached per task (a
        learned task's: its learner's optimistic curve, cached per learner version)."""
        spec = task.spec
        key = (task.learner.version, self.prior_rate()) if spec.learned else None
        cached = self._curves.get(task.task_id)
        if cached is None or cached[0] != key:
            if spec.learned:
                ns_l, ps_l = task.learner.curve(spec.min_nodes, spec.max_nodes, key[1])
                ns, os_ = np.asarray(ns_l, dtype=float), np.asarray(ps_l, dtype=float)
            else:
                ns = np.asarray(spec.node_counts, dtype=float)
                os_ = np.asarray(spec.objective, dtype=float)
            cached = (key, (ns, os_, objective_table(ns, os_, spec.min_nodes, spec.max_nodes)))
            self._curves[task.task_id] = cached
        return cached[1]

    def forget(self, task_id: str) -> None:
        """Drop the cached curves of a task that finished (retention: the cache holds
        unfinished tasks only)."""
        self._curves.pop(task_id, None)

    def learned_curve(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """(Ns, Ps) the allocation uses for a learned task (its learner's optimistic curve)."""
        ns, os_, _ = self.curves(task)
        return ns, os_

    def power_values(self, task: Task, node_counts: np.ndarray) -> np.ndarray:
        """The task's power draw [W] at each of ``node_counts`` (its curve's points); at least
        1 mW per node at positive counts (a task whose energy reports stood still must not
        make the ratio objective's denominator vanish)."""
        return np.array([max(self.power_at(task, int(n)), 1e-3 * n) for n in node_counts])

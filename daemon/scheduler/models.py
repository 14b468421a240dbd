"""What the scheduler assumes of a task (docs/architecture.md, "Tasks and the progress model"):
throughput, power and rescale costs from its spec or its learner, the population prior, the curves
the allocation uses (cached)."""

from __future__ import annotations

import numpy as np

from offcut.daemon.model import Task
from offcut.daemon.solvers.problem import objective_table


class TaskModels:
    """Modelled throughput, power and rescale costs of tasks."""

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
            return float(task.learner.power_at(n, self.objective.node_power_w))
        return n * self.objective.node_power_w

    def rescale_costs(self, task: Task) -> tuple[float, float]:
        """(Tcup, Tcdw) [s] of ``task``: measured by its learner for a task that reports its
        progress, with or without a curve (the spec's values are the prior until a rescale is
        measured: measured beats declared), else the spec's."""
        spec = task.spec
        if task.learner is not None:
            return (task.learner.rescale_up_s(spec.rescale_up_s),
                    task.learner.rescale_down_s(spec.rescale_down_s))
        return spec.rescale_up_s, spec.rescale_down_s

    def prior_rate(self) -> float:
        """Throughput per node [samples/s] assumed for a learned task before its first
        measurement: the median of the other tasks' measured per-node rates (a population
        prior), else ``prior_rate_per_node``."""
        key = self._learn_version
        if self._prior_cache is None or self._prior_cache[0] != key:
            rates = [r for task in self.tasks.values() if task.learner is not None
                     for r in [task.learner.per_node_rate()] if r is not None and r > 0]
            prior = float(np.median(rates)) if rates else self.objective.prior_rate_per_node
            self._prior_cache = (key, prior)
        return self._prior_cache[1]

    def _curves(self, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Ns, Os, S(n) for n = 0..Jmax) of a task as float arrays, cached per task (a
        learned task's: its learner's optimistic curve, cached per learner version)."""
        spec = task.spec
        key = (task.learner.version, self.prior_rate()) if spec.learned else None
        cached = self._objective.get(task.task_id)
        if cached is None or cached[0] != key:
            if spec.learned:
                ns_l, ps_l = task.learner.curve(spec.min_nodes, spec.max_nodes, key[1])
                ns, os_ = np.asarray(ns_l, dtype=float), np.asarray(ps_l, dtype=float)
            else:
                ns = np.asarray(spec.node_counts, dtype=float)
                os_ = np.asarray(spec.objective, dtype=float)
            cached = (key, (ns, os_, objective_table(ns, os_, spec.min_nodes, spec.max_nodes)))
            self._objective[task.task_id] = cached
        return cached[1]

    def learned_curve(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """(Ns, Ps) the allocation uses for a learned task (its learner's optimistic curve)."""
        ns, os_, _ = self._curves(task)
        return ns, os_

    def _power_values(self, task: Task, node_counts: np.ndarray) -> np.ndarray:
        """The task's power draw [W] at each of ``node_counts`` (its curve's points); at least
        1 mW per node at positive counts (a task whose energy reports stood still must not
        make the ratio objective's denominator vanish)."""
        return np.array([max(self.power_at(task, int(n)), 1e-3 * n) for n in node_counts])

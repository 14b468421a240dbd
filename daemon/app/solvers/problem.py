"""The count-level allocation problem of docs/architecture.md, "Allocation" and its exact evaluator.

For admitted tasks j = 1..J choose node counts n_j in {0} U [Jmin_j, Jmax_j] maximising

    sum_j f_j(n_j),  f_j(n) = Tfwd * (S_j(n) - C_j(n)) - [n > c_j] * Tcup_j * R_j
                              - [n < c_j] * Tcdw_j * R_j
    subject to sum_j n_j <= N

with S_j the piecewise-linear objective curve (``Os``; ``Ps`` when no objective is given),
S_j(n) = 0 below Jmin_j, c_j the nodes the task holds (after preemption), and
R_j = S_j(c_j) the value rate it loses per second of rescale. This is BFTrainer's MILP
(Liu et al., arXiv 2106.12091, Section 3, eq. 1-9) at the level of counts: nodes are
interchangeable and any count vector with sum <= N is realisable without migration.

C_j is an optional piecewise-linear *cost rate* (``cost_values``, objective units per
second, any sign) given at the same node counts Ns_j as S_j and, like S_j, linearly
interpolated, flat beyond the last point and 0 below Jmin_j (so C_j(0) = 0). Without costs
C_j = 0 and f_j is BFTrainer's term. Rescale losses stay valued with S_j alone (R_j above).
Because C_j shares S_j's breakpoints, f_j stays linear between consecutive integer
breakpoints, which the exact backends rely on. The costs carry the Dinkelbach subproblems
of the energy objective (:mod:`.fractional`).

Every solver backend returns a :class:`Solution` whose ``objective`` is re-scored here, so
no backend's own arithmetic is trusted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from offcut.errors import InvalidArgument


def interpolate(node_counts: np.ndarray, values: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """Piecewise-linear curve value at ``n`` nodes (``np.interp``; flat beyond the last point).

    ``node_counts``: (K,) strictly increasing, starting at 0; ``values``: (K,).
    """
    return np.interp(n, node_counts, values)


def objective_table(node_counts: np.ndarray, values: np.ndarray, min_nodes: int,
                    max_nodes: int) -> np.ndarray:
    """S(n) for n = 0..max_nodes: the curve by linear interpolation, 0 below ``min_nodes``.

    Shape (max_nodes + 1,), float; the piecewise-linear objective of docs/architecture.md,
    "Tasks and the progress model" and "Allocation".
    """
    s = interpolate(node_counts, values, np.arange(max_nodes + 1))
    s[:min_nodes] = 0.0
    return s


def as_curves(curves: Any, name: str) -> list[np.ndarray]:
    """``curves`` (a sequence of numeric sequences, e.g. per task (K_j,) values) as a list of
    float arrays. Raises :class:`InvalidArgument` naming ``name`` when it is not one."""
    try:
        return [np.asarray(x, dtype=float) for x in curves]
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"not a list of numeric curves: {exc}", name) from exc


def check_curve_shapes(node_counts: Sequence[np.ndarray], curves: Sequence[np.ndarray],
                       name: str) -> None:
    """Check that ``curves`` has one 1-D array per task, each with the shape (K_j,) of the
    task's ``node_counts[j]`` (values at the same points). Raises :class:`InvalidArgument`
    naming ``name``."""
    if len(curves) != len(node_counts):
        raise InvalidArgument(f"has {len(curves)} curves, expected {len(node_counts)}", name)
    for j, (ns, cs) in enumerate(zip(node_counts, curves)):
        if cs.ndim != 1 or len(cs) != len(ns):
            raise InvalidArgument(f"task {j}: has shape {cs.shape}, expected ({len(ns)},) "
                                  "like node_counts", name)


@dataclass
class AllocationProblem:
    """One allocation instance. Arrays are per admitted task, shape (J,).

    Attributes:
        idle_nodes: N, the idle pool size (nodes held by tasks included).
        current_nodes: c_j, nodes each task holds now (after preemption).
        min_nodes, max_nodes: Jmin_j >= 1, Jmax_j >= Jmin_j.
        node_counts: per task, Ns (K_j,) strictly increasing from 0.
        objective_values: per task, Os (K_j,) >= 0 (samples/s for throughput objectives).
        tfwd_s: look-ahead Tfwd [s].
        rescale_up_s, rescale_down_s: Tcup_j, Tcdw_j [s].
        cost_values: optional, per task the cost rate C_j (K_j,) at ``node_counts[j]``, in
            objective units per second (finite, any sign); f_j uses S_j - C_j (module
            docstring). None = no costs.
        objective_tables: optional, per task S_j(n) for n = 0..Jmax_j (0 below Jmin_j),
            precomputed by a caller that builds many problems from the same tasks (the core).
        check: validate on construction (callers passing already-validated data may skip it).
    """

    idle_nodes: int
    current_nodes: np.ndarray
    min_nodes: np.ndarray
    max_nodes: np.ndarray
    node_counts: list[np.ndarray]
    objective_values: list[np.ndarray]
    tfwd_s: float
    rescale_up_s: np.ndarray
    rescale_down_s: np.ndarray
    cost_values: list[np.ndarray] | None = None
    objective_tables: list[np.ndarray] | None = field(default=None, repr=False, compare=False)
    check: bool = field(default=True, repr=False, compare=False)
    _tables: list[np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)
    _flat: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False,
                                                         compare=False)

    def __post_init__(self) -> None:
        self.idle_nodes = int(self.idle_nodes)
        self.current_nodes = np.asarray(self.current_nodes, dtype=np.int64)
        self.min_nodes = np.asarray(self.min_nodes, dtype=np.int64)
        self.max_nodes = np.asarray(self.max_nodes, dtype=np.int64)
        self.rescale_up_s = np.asarray(self.rescale_up_s, dtype=float)
        self.rescale_down_s = np.asarray(self.rescale_down_s, dtype=float)
        self.node_counts = [np.asarray(x, dtype=float) for x in self.node_counts]
        self.objective_values = [np.asarray(x, dtype=float) for x in self.objective_values]
        if self.cost_values is not None:
            self.cost_values = as_curves(self.cost_values, "cost_values")
        self.tfwd_s = float(self.tfwd_s)
        if self.check:
            self.validate()

    # ------------------------------------------------------------------ checks
    @property
    def num_tasks(self) -> int:
        """J, the number of admitted tasks."""
        return len(self.current_nodes)

    def validate(self) -> None:
        """Raise :class:`InvalidArgument` (naming the field) when the instance is malformed."""
        J = self.num_tasks
        for name in ("min_nodes", "max_nodes", "rescale_up_s", "rescale_down_s"):
            if len(getattr(self, name)) != J:
                raise InvalidArgument(f"has {len(getattr(self, name))} entries, expected {J}", name)
        for name in ("node_counts", "objective_values"):
            if len(getattr(self, name)) != J:
                raise InvalidArgument(f"has {len(getattr(self, name))} curves, expected {J}", name)
        if self.idle_nodes < 0:
            raise InvalidArgument("must be >= 0", "idle_nodes")
        if not math.isfinite(self.tfwd_s) or self.tfwd_s <= 0:
            raise InvalidArgument("must be a positive number of seconds", "tfwd_s")
        if J and (self.current_nodes < 0).any():
            raise InvalidArgument("must be >= 0", "current_nodes")
        if int(self.current_nodes.sum()) > self.idle_nodes:
            raise InvalidArgument("tasks hold more nodes than the idle pool has", "current_nodes")
        if J and ((self.min_nodes < 1).any() or (self.max_nodes < self.min_nodes).any()):
            raise InvalidArgument("need 1 <= min_nodes <= max_nodes", "min_nodes")
        for arr, name in ((self.rescale_up_s, "rescale_up_s"), (self.rescale_down_s, "rescale_down_s")):
            if J and (~np.isfinite(arr) | (arr < 0)).any():
                raise InvalidArgument("must be finite and >= 0", name)
        for j, (ns, os_) in enumerate(zip(self.node_counts, self.objective_values)):
            if len(ns) < 2 or len(ns) != len(os_):
                raise InvalidArgument(f"task {j}: need >= 2 points and equal lengths", "node_counts")
            if ns[0] != 0 or (np.diff(ns) <= 0).any():
                raise InvalidArgument(f"task {j}: must start at 0 and strictly increase", "node_counts")
            if (~np.isfinite(os_) | (os_ < 0)).any():
                raise InvalidArgument(f"task {j}: must be finite and >= 0", "objective_values")
        self._validate_costs(self.cost_values)

    def _validate_costs(self, cost_values: list[np.ndarray] | None) -> None:
        """Check cost curves (float arrays) against this problem's tasks; raises
        :class:`InvalidArgument` naming ``cost_values``."""
        if cost_values is None:
            return
        check_curve_shapes(self.node_counts, cost_values, "cost_values")
        for j, cs in enumerate(cost_values):
            if not np.isfinite(cs).all():
                raise InvalidArgument(f"task {j}: must be finite", "cost_values")

    def with_costs(self, cost_values: Sequence[Sequence[float]] | None) -> "AllocationProblem":
        """A copy of this problem with the cost curves C_j replaced by ``cost_values`` (per
        task (K_j,) at ``node_counts[j]``, objective units per second; None = no costs).

        Everything else (arrays, ``objective_tables``) is shared, not copied, and not
        re-validated; the new cost curves are validated. Raises :class:`InvalidArgument`
        naming ``cost_values``.
        """
        costs = None if cost_values is None else as_curves(cost_values, "cost_values")
        self._validate_costs(costs)
        return AllocationProblem(
            idle_nodes=self.idle_nodes, current_nodes=self.current_nodes,
            min_nodes=self.min_nodes, max_nodes=self.max_nodes, node_counts=self.node_counts,
            objective_values=self.objective_values, tfwd_s=self.tfwd_s,
            rescale_up_s=self.rescale_up_s, rescale_down_s=self.rescale_down_s,
            cost_values=costs, objective_tables=self.objective_tables, check=False)

    # ------------------------------------------------------------------ values
    def value_tables(self) -> list[np.ndarray]:
        """f_j(n) for n = 0..min(Jmax_j, N): the objective term of task j at n nodes
        (Tfwd (S_j - C_j) less the rescale losses; module docstring).

        Returns a list of J float arrays (views of :meth:`flat_value_tables`); entries for
        0 < n < Jmin_j are ``-inf`` (not admissible). Cached: the problem is immutable once
        built.
        """
        if self._tables is None:
            flat, offsets = self.flat_value_tables()
            self._tables = [flat[offsets[j]:offsets[j + 1]] for j in range(self.num_tasks)]
        return self._tables

    def flat_value_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Every f_j(n) (:meth:`value_tables`) on one flat array: (values (sum_j (top_j + 1),)
        float64 in objective units, offsets (J+1,) int64: task j's f_j(n) is
        ``values[offsets[j] + n]``, n = 0..top_j, top_j = min(Jmax_j, N)). Built with one
        vectorised pass over all tasks (the per-task part is slicing the cached curves), as
        every allocation of a whole-machine replay builds it (BFTrainer arXiv 2106.12091, Section 3
        eq. 1-9 at count level). Cached.
        """
        if self._flat is None:
            J = self.num_tasks
            tops = np.minimum(self.max_nodes, self.idle_nodes)
            lengths = tops + 1
            offsets = np.zeros(J + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            if J == 0:
                self._flat = (np.zeros(0), offsets)
                return self._flat
            s = np.concatenate([self._objective_table(j)[:top + 1]
                                for j, top in enumerate(tops.tolist())])
            starts = offsets[:-1]
            c = self.current_nodes
            # R_j = S_j(c_j) (current_rate): c_j <= N always, so c_j <= top_j unless c_j > Jmax_j
            inside = c <= tops
            rates = np.where(inside, s[starts + np.where(inside, c, 0)], 0.0)
            rates[c < self.min_nodes] = 0.0
            for j in np.flatnonzero(~inside & (c >= self.min_nodes)).tolist():
                rates[j] = self.current_rate(j)
            if self.cost_values is not None:
                s = s - np.concatenate([self._net_cost_table(j, int(tops[j])) for j in range(J)])
            flat = self.tfwd_s * s
            task = np.repeat(np.arange(J), lengths)
            n = np.arange(len(flat)) - starts[task]
            cur = c[task]
            flat -= np.where(n > cur, (self.rescale_up_s * rates)[task],
                             np.where(n < cur, (self.rescale_down_s * rates)[task], 0.0))
            flat[(n > 0) & (n < self.min_nodes[task])] = -np.inf
            self._flat = (flat, offsets)
        return self._flat

    def _net_cost_table(self, j: int, top: int) -> np.ndarray:
        """C_j(n) for n = 0..top (0 below Jmin_j); shape (top + 1,)."""
        return objective_table(self.node_counts[j], self.cost_values[j],
                               int(self.min_nodes[j]), top)

    def _objective_table(self, j: int) -> np.ndarray:
        """S_j(n) for n = 0..Jmax_j (0 below Jmin_j)."""
        if self.objective_tables is not None:
            return self.objective_tables[j]
        return objective_table(self.node_counts[j], self.objective_values[j],
                               int(self.min_nodes[j]), int(self.max_nodes[j]))

    def current_rate(self, j: int) -> float:
        """R_j = S_j(c_j) if c_j >= Jmin_j else 0 (objective units per second; costs C_j do
        not enter it)."""
        c = int(self.current_nodes[j])
        if c < self.min_nodes[j]:
            return 0.0
        if c <= self.max_nodes[j]:
            return float(self._objective_table(j)[c])
        return float(interpolate(self.node_counts[j], self.objective_values[j], c))

    def admissible(self, counts: Sequence[int]) -> str | None:
        """Why ``counts`` is infeasible, or None when it is feasible."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (self.num_tasks,):
            return f"expected {self.num_tasks} counts, got shape {counts.shape}"
        if int(counts.sum()) > self.idle_nodes:
            return f"uses {int(counts.sum())} nodes, only {self.idle_nodes} idle"
        bad = np.flatnonzero((counts != 0) & ((counts < self.min_nodes) | (counts > self.max_nodes)))
        if len(bad):
            j = int(bad[0])
            return (f"task {j}: {counts[j]} nodes outside {{0}} U [{self.min_nodes[j]}, "
                    f"{self.max_nodes[j]}]")
        return None

    def check_admissible(self, counts: Sequence[int]) -> None:
        """Raise ``ValueError`` ("infeasible allocation: <why>") unless ``counts`` (shape (J,))
        is feasible (:meth:`admissible`)."""
        why = self.admissible(counts)
        if why is not None:
            raise ValueError(f"infeasible allocation: {why}")

    def evaluate(self, counts: Sequence[int]) -> float:
        """Objective of a count vector (shape (J,)); raises ``ValueError`` when infeasible."""
        self.check_admissible(counts)
        flat, offsets = self.flat_value_tables()
        return float(sum(flat[offsets[:-1] + np.asarray(counts, dtype=np.int64)].tolist()))

    def keep_current(self) -> np.ndarray:
        """The no-change answer: every task keeps c_j if that is admissible, else 0 nodes."""
        c = self.current_nodes.copy()
        bad = (c > 0) & ((c < self.min_nodes) | (c > self.max_nodes))
        c[bad] = 0
        return c

    # ------------------------------------------------------------------ records
    def to_record(self) -> dict[str, Any]:
        """The JSONL record format of ``--record-instances`` (issue 2, item 7); the key
        ``cost_values`` is present only when the problem has costs."""
        rec = {
            "idle_nodes": self.idle_nodes,
            "current_nodes": self.current_nodes.tolist(),
            "min_nodes": self.min_nodes.tolist(),
            "max_nodes": self.max_nodes.tolist(),
            # integral points as ints (the usual case); others as floats, not truncated
            "node_counts": [[int(v) if float(v).is_integer() else float(v) for v in x]
                            for x in self.node_counts],
            "objective_values": [x.tolist() for x in self.objective_values],
            "tfwd_s": self.tfwd_s,
            "rescale_up_s": self.rescale_up_s.tolist(),
            "rescale_down_s": self.rescale_down_s.tolist(),
        }
        if self.cost_values is not None:
            rec["cost_values"] = [x.tolist() for x in self.cost_values]
        return rec

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "AllocationProblem":
        """Inverse of :meth:`to_record` (``cost_values`` optional); raises
        :class:`InvalidArgument` naming a missing or malformed field."""
        keys = ("idle_nodes", "current_nodes", "min_nodes", "max_nodes", "node_counts",
                "objective_values", "tfwd_s", "rescale_up_s", "rescale_down_s")
        missing = [k for k in keys if k not in record]
        if missing:
            raise InvalidArgument("missing from record", ", ".join(missing))
        kw = {k: record[k] for k in keys}
        if record.get("cost_values") is not None:
            kw["cost_values"] = record["cost_values"]
        try:
            return cls(**kw)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(str(exc), "record") from exc

    def to_json(self) -> str:
        """:meth:`to_record` as one compact JSON line."""
        return json.dumps(self.to_record(), separators=(",", ":"))


@dataclass
class Solution:
    """A solver's answer.

    Attributes:
        counts: (J,) int node counts n_j.
        objective: value of ``counts`` re-scored by :meth:`AllocationProblem.evaluate`.
        bound: proven upper bound on the optimum (== objective when proven optimal;
            ``inf`` when the backend proves nothing, e.g. greedy).
        solve_ms: wall time of the solve [ms].
        solver: backend name (``gurobi``, ``cbc``, ``dp``, ``greedy``; ``trivial`` when J == 0 or N == 0).
        status: ``optimal`` or ``feasible``.
    """

    counts: np.ndarray
    objective: float
    bound: float
    solve_ms: float
    solver: str
    status: str

    @property
    def gap(self) -> float:
        """Relative optimality gap (bound - objective) / max(1, |objective|)."""
        if not math.isfinite(self.bound):
            return math.inf
        return max(0.0, self.bound - self.objective) / max(1.0, abs(self.objective))

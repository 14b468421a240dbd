"""Task specs and their one validator (docs/architecture.md, "Tasks and the progress model"), shared
by the daemon, the Python API and CLI (:mod:`offcut.client.taskspec`) and the replay: every part
checks a spec by the same rules, naming the field (``spec.<field>``) of the first problem.

Pure: no I/O, no clock, no gRPC message types. Node counts are ints, work is in samples,
throughput in samples/s, times in s, power in W.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np

from offcut.errors import InvalidArgument

#: Node names accepted in events: Slurm-style host names (letters, digits, ``-``, ``_``, ``.``).
MAX_NAME_LEN = 200
#: longest single argument of a task's command, characters (fixed; the total is a setting)
MAX_COMMAND_ARG_LEN = 65536
#: Value bounds of a new spec (checked with the size :class:`Limits`, so a journal written
#: before them still loads). They keep every product the allocation forms (throughput x
#: rescale seconds, power x seconds, sums over tasks) far inside float range: a spec with
#: ``rescale_down_s = 1e308`` made every later decision overflow.
#: largest throughput / objective value at any node count [samples/s]
MAX_THROUGHPUT = 1e12
#: largest Tcup / Tcdw [s] (one day)
MAX_RESCALE_S = 86_400.0
#: largest total work [samples]
MAX_WORK_SAMPLES = 1e18
#: largest power draw of a task at any node count [W]
MAX_TASK_POWER_W = 1e9
#: largest ``spec.gpus_per_node`` (GPUs a task may ask of each node)
MAX_GPUS_PER_NODE = 64
#: largest ``spec.procs_per_node`` (processes the launcher starts on each node)
MAX_PROCS_PER_NODE = 64
#: most features in ``spec.constraint``
MAX_CONSTRAINT_FEATURES = 16
#: a node feature's name, as Slurm spells them (``Features=`` of slurm.conf): 1-64 of these
FEATURE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class Limits:
    """Size limits on what requests may ask the daemon to hold (DaemonConfig options of the
    same names, docs/configuration.md). A request over a limit is INVALID_ARGUMENT naming the
    field and the limit (FAILED_PRECONDITION for ``max_idle_nodes``, which depends on the
    pool); nothing changes.

    Attributes:
        max_event_nodes: node names in one ReportNodes (``idle`` + ``preempted``) or
            SyncNodes (``idle``) request.
        max_idle_nodes: nodes the idle pool may hold.
        max_task_nodes: largest ``spec.max_nodes`` of a task.
        max_curve_points: points of a task's scalability curve (``spec.node_counts``).
        max_command_args: arguments of a task's ``spec.command``.
        max_command_bytes: UTF-8 bytes of all arguments of ``spec.command`` together.
        max_batch_sizes: batch sizes of one Zeus job (``spec.batch_sizes``).
        max_power_limits: power limits one Zeus power profile walks through
            (``(max_power_limit_w - min_power_limit_w) / step_w + 1``).
        max_progress_reports: reports in one ReportProgress request.
    """

    max_event_nodes: int = 200_000
    max_idle_nodes: int = 200_000
    max_task_nodes: int = 200_000
    max_curve_points: int = 100_000
    max_command_args: int = 4096
    max_command_bytes: int = 1_048_576
    max_batch_sizes: int = 1024
    max_power_limits: int = 1000
    max_progress_reports: int = 10_000


def check_finite(value: float, field_name: str, *, positive: bool = False, non_negative: bool = False) -> float:
    """``value`` as a float. Raises InvalidArgument naming ``field_name`` if it is NaN or
    infinite, or not > 0 (``positive``) / not >= 0 (``non_negative``)."""
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgument(f"must be a finite number, got {value}", field_name)
    if positive and value <= 0:
        raise InvalidArgument(f"must be > 0, got {value}", field_name)
    if non_negative and value < 0:
        raise InvalidArgument(f"must be >= 0, got {value}", field_name)
    return value


@dataclass(frozen=True)
class TaskSpec:
    """What a researcher submits (docs/architecture.md, "Tasks and the progress model"; BFTrainer's
    Jbnd + JNPs rows).

    Attributes:
        name: human-readable name (1-200 characters).
        min_nodes, max_nodes: Jmin >= 1 and Jmax >= Jmin; the task runs on 0 or Jmin..Jmax nodes.
        node_counts: Ns, strictly increasing, starting at 0, last >= max_nodes.
        throughputs: Ps [samples/s] at each count, 0 to :data:`MAX_THROUGHPUT`.
        objective_values: Os at each count (what the allocation maximises), 0 to
            :data:`MAX_THROUGHPUT`; empty = Ps.
        rescale_up_s, rescale_down_s: Tcup, Tcdw [s]: seconds of progress lost per grow/shrink,
            0 to :data:`MAX_RESCALE_S`.
        total_work_samples: Pmax [samples], > 0 and at most :data:`MAX_WORK_SAMPLES`.
        command: argv of the task for live runs (may be empty in replays).
        reports_progress: the task reports its own progress (``Tasks.ReportProgress``): the
            reports replace the model's progress and only a report (or a ``finished`` run
            report) completes it. Implied when no curve is given.
        power_w: optional power draw [W] of the task's nodes at each ``node_counts`` point
            (the energy objectives' power model; learned from energy reports when empty), at
            most :data:`MAX_TASK_POWER_W`.
        zeus_job_id: the Zeus batch-size job whose batch size the task's runs use (the
            launcher passes it as ``OFFCUT_ZEUS_JOB_ID``; docs/execution.md); empty: none.
            At most :data:`MAX_NAME_LEN` printable characters.
        gpus_per_node: GPUs every node of the task must have (Slurm's ``--gpus-per-node``),
            0 to :data:`MAX_GPUS_PER_NODE`; 0: a CPU task, placed on nodes without GPUs only
            (docs/architecture.md, "Node kinds").
        constraint: node features every node of the task must have (Slurm's
            ``--constraint``, joined with ``&``), at most :data:`MAX_CONSTRAINT_FEATURES`,
            each matching :data:`FEATURE_RE`; sorted, without repeats.
        procs_per_node: processes the launcher starts on each node (docs/execution.md,
            "Processes per node"), 0 to :data:`MAX_PROCS_PER_NODE`; 0: the default,
            :attr:`local_world_size`. With GPUs, ``gpus_per_node`` must be a multiple of it
            (each process gets ``gpus_per_node / procs_per_node`` GPUs).

    A spec without ``node_counts``/``throughputs`` (both empty) is *learned*: the daemon
    allocates it with the scalability model it fits from the task's progress reports
    (``offcut.daemon.app.learning``), and learns its rescale costs too (``rescale_up_s`` /
    ``rescale_down_s`` are then the prior used until a rescale has been measured).
    """

    name: str
    min_nodes: int
    max_nodes: int
    node_counts: tuple[int, ...]
    throughputs: tuple[float, ...]
    objective_values: tuple[float, ...] = ()
    rescale_up_s: float = 0.0
    rescale_down_s: float = 0.0
    total_work_samples: float = 0.0
    command: tuple[str, ...] = ()
    reports_progress: bool = False
    power_w: tuple[float, ...] = ()
    zeus_job_id: str = ""
    gpus_per_node: int = 0
    constraint: tuple[str, ...] = ()
    procs_per_node: int = 0

    @property
    def local_world_size(self) -> int:
        """Processes on each node of the task: ``procs_per_node`` when set, else
        ``gpus_per_node`` (one process per GPU) when set, else 1."""
        return self.procs_per_node or self.gpus_per_node or 1

    @property
    def learned(self) -> bool:
        """True when the spec gives no scalability curve (the daemon learns it)."""
        return not self.node_counts and not self.throughputs

    @property
    def reports(self) -> bool:
        """True when progress comes from the task's reports (``reports_progress`` or learned)."""
        return self.reports_progress or self.learned

    @classmethod
    def create(cls, limits: Limits | None = None, *, name: str, min_nodes: int, max_nodes: int,
               node_counts: Sequence[int] = (), throughputs: Sequence[float] = (),
               objective_values: Sequence[float] = (), rescale_up_s: float = 0.0,
               rescale_down_s: float = 0.0, total_work_samples: float = 0.0,
               command: Sequence[str] = (), reports_progress: bool = False,
               power_w: Sequence[float] = (), zeus_job_id: str = "",
               gpus_per_node: int = 0, constraint: Sequence[str] = (),
               procs_per_node: int = 0) -> "TaskSpec":
        """Build and validate a spec (against ``limits`` too when given, checked before the
        lists are converted); raises :class:`InvalidArgument` naming the field
        (``spec.<field>``) on the first problem found, ``TypeError`` for a misspelled
        keyword."""
        if limits is not None:
            check_spec_sizes(limits, max_nodes=max_nodes, node_counts=node_counts,
                             command=command)
        spec = cls(
            name=str(name), min_nodes=min_nodes, max_nodes=max_nodes,
            node_counts=tuple(node_counts),
            throughputs=tuple(float(x) for x in throughputs),
            objective_values=tuple(float(x) for x in objective_values),
            rescale_up_s=rescale_up_s, rescale_down_s=rescale_down_s,
            total_work_samples=total_work_samples,
            command=tuple(str(x) for x in command),
            reports_progress=bool(reports_progress),
            power_w=tuple(float(x) for x in power_w),
            zeus_job_id=str(zeus_job_id),
            gpus_per_node=gpus_per_node,
            constraint=tuple(sorted({str(f) for f in constraint}))
            if len(constraint) <= MAX_CONSTRAINT_FEATURES else tuple(constraint),
            procs_per_node=procs_per_node,
        )
        spec.validate(limits)
        return spec

    def validate(self, limits: Limits | None = None) -> None:
        """Raise :class:`InvalidArgument` (field ``spec.<name>``) if the spec is malformed or,
        when ``limits`` are given, larger than they allow (None: no size limits, as when the
        journal is re-applied at start: it was checked against the limits of its time)."""
        if limits is not None:
            check_spec_sizes(limits, max_nodes=self.max_nodes, node_counts=self.node_counts,
                             command=self.command)
            self._check_bounds()
        if not self.name or len(self.name) > MAX_NAME_LEN or not self.name.isprintable():
            raise InvalidArgument(f"must be 1-{MAX_NAME_LEN} printable characters", "spec.name")
        for fname in ("min_nodes", "max_nodes"):
            v = getattr(self, fname)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidArgument(f"must be an integer, got {v!r}", f"spec.{fname}")
        if self.min_nodes < 1:
            raise InvalidArgument(f"must be >= 1, got {self.min_nodes}", "spec.min_nodes")
        if self.max_nodes < self.min_nodes:
            raise InvalidArgument(
                f"must be >= min_nodes ({self.min_nodes}), got {self.max_nodes}", "spec.max_nodes")
        ns, ps = self.node_counts, self.throughputs
        if self.learned:
            for fname in ("objective_values", "power_w"):
                if getattr(self, fname):
                    raise InvalidArgument("needs a scalability curve (node_counts, throughputs);"
                                          " a learned task has none", f"spec.{fname}")
            self._validate_scalars()
            return
        if len(ns) < 2:
            raise InvalidArgument("needs at least two points (0 and one more)", "spec.node_counts")
        if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in ns):
            raise InvalidArgument("must be integers", "spec.node_counts")
        if ns[0] != 0:
            raise InvalidArgument(f"must start at 0, starts at {ns[0]}", "spec.node_counts")
        if any(b <= a for a, b in zip(ns, ns[1:])):
            raise InvalidArgument("must be strictly increasing", "spec.node_counts")
        if ns[-1] < self.max_nodes:
            raise InvalidArgument(
                f"must reach max_nodes ({self.max_nodes}); last point is {ns[-1]}", "spec.node_counts")
        if len(ps) != len(ns):
            raise InvalidArgument(
                f"has {len(ps)} values for {len(ns)} node counts", "spec.throughputs")
        for i, p in enumerate(ps):
            if not math.isfinite(p) or p < 0:
                raise InvalidArgument(f"value {i} is {p}; must be finite and >= 0", "spec.throughputs")
        if self.objective_values:
            if len(self.objective_values) != len(ns):
                raise InvalidArgument(f"has {len(self.objective_values)} values for {len(ns)} node "
                                      "counts", "spec.objective_values")
            for i, o in enumerate(self.objective_values):
                if not math.isfinite(o) or o < 0:
                    raise InvalidArgument(f"value {i} is {o}; must be finite and >= 0",
                                          "spec.objective_values")
        if self.power_w:
            if len(self.power_w) != len(ns):
                raise InvalidArgument(f"has {len(self.power_w)} values for {len(ns)} node counts",
                                      "spec.power_w")
            for i, (n, w) in enumerate(zip(ns, self.power_w)):
                if not math.isfinite(w) or w < 0 or (n > 0 and w == 0):
                    raise InvalidArgument(f"value {i} is {w}; must be finite, >= 0, and > 0 "
                                          "at a positive node count", "spec.power_w")
        self._validate_scalars()

    def _check_bounds(self) -> None:
        """INVALID_ARGUMENT naming the field for a value above its bound (:data:`MAX_THROUGHPUT`,
        :data:`MAX_RESCALE_S`, :data:`MAX_WORK_SAMPLES`, :data:`MAX_TASK_POWER_W`); the other
        rules (finite, signs, shapes) are checked by :meth:`validate`."""
        for fname, bound in (("throughputs", MAX_THROUGHPUT), ("objective_values", MAX_THROUGHPUT),
                             ("power_w", MAX_TASK_POWER_W)):
            for i, v in enumerate(getattr(self, fname)):
                if v > bound:
                    raise InvalidArgument(f"value {i} is {v}; must be at most {bound:g}",
                                          f"spec.{fname}")
        for fname, bound in (("rescale_up_s", MAX_RESCALE_S), ("rescale_down_s", MAX_RESCALE_S),
                             ("total_work_samples", MAX_WORK_SAMPLES)):
            v = getattr(self, fname)
            if v > bound:
                raise InvalidArgument(f"must be at most {bound:g}, got {v}", f"spec.{fname}")

    def _validate_scalars(self) -> None:
        g = self.gpus_per_node
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) \
                or not 0 <= g <= MAX_GPUS_PER_NODE:
            raise InvalidArgument(f"must be an integer from 0 to {MAX_GPUS_PER_NODE}, got {g!r}",
                                  "spec.gpus_per_node")
        k = self.procs_per_node
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k <= MAX_PROCS_PER_NODE:
            raise InvalidArgument(f"must be an integer from 0 to {MAX_PROCS_PER_NODE}, got {k!r}",
                                  "spec.procs_per_node")
        if k and g and g % k:
            raise InvalidArgument(f"{k} processes cannot share {g} GPUs per node evenly "
                                  "(gpus_per_node must be a multiple of it)",
                                  "spec.procs_per_node")
        if len(self.constraint) > MAX_CONSTRAINT_FEATURES:
            raise InvalidArgument(f"has {len(self.constraint)} features, more than "
                                  f"{MAX_CONSTRAINT_FEATURES}", "spec.constraint")
        for i, feature in enumerate(self.constraint):
            if not isinstance(feature, str) or not FEATURE_RE.fullmatch(feature):
                raise InvalidArgument(f"feature {i} ({str(feature)[:70]!r}) must be 1-64 letters, "
                                      "digits, '_', '.' or '-' (a Slurm node feature)",
                                      "spec.constraint")
        if len(self.zeus_job_id) > MAX_NAME_LEN or not self.zeus_job_id.isprintable():
            raise InvalidArgument(f"must be at most {MAX_NAME_LEN} printable characters",
                                  "spec.zeus_job_id")
        check_finite(self.rescale_up_s, "spec.rescale_up_s", non_negative=True)
        check_finite(self.rescale_down_s, "spec.rescale_down_s", non_negative=True)
        check_finite(self.total_work_samples, "spec.total_work_samples", positive=True)
        for i, arg in enumerate(self.command):
            if len(arg) > MAX_COMMAND_ARG_LEN:
                raise InvalidArgument(f"argument {i} has {len(arg)} characters, more than "
                                      f"{MAX_COMMAND_ARG_LEN}", "spec.command")

    @property
    def objective(self) -> tuple[float, ...]:
        """Os, or Ps when no objective curve was given."""
        return self.objective_values or self.throughputs

    def throughput_at(self, nodes: int) -> float:
        """Modelled progress rate [samples/s] on ``nodes`` nodes: Ps(n) by linear
        interpolation if n >= Jmin, else 0 (docs/architecture.md, "Tasks and the progress model"). 0
        for a learned spec (the core asks the task's learner instead)."""
        if nodes < self.min_nodes or self.learned:
            return 0.0
        return float(np.interp(nodes, self.node_counts, self.throughputs))

    def objective_at(self, nodes: int) -> float:
        """S(n): the objective curve at ``nodes`` (0 below Jmin)."""
        if nodes < self.min_nodes:
            return 0.0
        return float(np.interp(nodes, self.node_counts, self.objective))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (lists for the tuples)."""
        # field by field: every field is a number, a string or a tuple of them (asdict's deep
        # copy of each tuple element was most of a snapshot's time per task)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("node_counts", "throughputs", "objective_values", "command", "power_w",
                  "constraint"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskSpec":
        """Inverse of :meth:`to_dict` (no validation: the data was validated when stored)."""
        return cls(**{**d, **{k: tuple(d.get(k, ())) for k in
                              ("node_counts", "throughputs", "objective_values", "command",
                               "power_w", "constraint")}})


def check_spec_sizes(limits: Limits, *, max_nodes: Any, node_counts: Any, command: Any) -> None:
    """Raise :class:`InvalidArgument` naming ``spec.<field>`` and the limit when a spec is
    larger than ``limits`` allow (``max_task_nodes``, ``max_curve_points``,
    ``max_command_args``, ``max_command_bytes``). Only sizes are looked at, so this is cheap
    and runs before the spec's lists are converted or checked point by point."""
    if (isinstance(max_nodes, (int, np.integer)) and not isinstance(max_nodes, bool)
            and max_nodes > limits.max_task_nodes):
        raise InvalidArgument(f"must be at most max_task_nodes ({limits.max_task_nodes}), got "
                              f"{max_nodes}", "spec.max_nodes")
    if len(node_counts) > limits.max_curve_points:
        raise InvalidArgument(f"has {len(node_counts)} points, more than max_curve_points "
                              f"({limits.max_curve_points})", "spec.node_counts")
    if len(command) > limits.max_command_args:
        raise InvalidArgument(f"has {len(command)} arguments, more than max_command_args "
                              f"({limits.max_command_args})", "spec.command")
    size = 0
    for arg in command:
        size += len(arg.encode("utf-8", "surrogatepass")) if isinstance(arg, str) else len(arg)
        if size > limits.max_command_bytes:
            raise InvalidArgument(f"has more than max_command_bytes ({limits.max_command_bytes})"
                                  " bytes of arguments", "spec.command")

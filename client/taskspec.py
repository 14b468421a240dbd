"""Building a task's ``offcut.v1.TaskSpec`` from what a researcher knows.

A task (docs/architecture.md, "Tasks and the progress model") is an elastic training job: a node
range (``sbatch --nodes MIN-MAX`` syntax), its total work in samples, and a scalability curve:
throughput [samples/s] at each node count, read from a CSV file with a ``nodes,throughput`` header::

    nodes,throughput
    1,5218.8
    2,10582.5
    4,20436.0
    8,39584.0

Example::

    from offcut.client import Client
    from offcut.client.taskspec import make_task_spec, read_scalability_csv

    spec = make_task_spec("resnet18", nodes="1-8", work_samples=1.2e9,
                          scalability=read_scalability_csv("resnet18.csv"),
                          command=["python", "train.py"])
    with Client() as c:
        task = c.submit(spec).task

Every error is :class:`offcut.errors.InvalidArgument` naming the field (or the file, line
and column) that is wrong.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Literal, Sequence

from offcut.errors import InvalidArgument
from offcut.taskspec import MAX_GPUS_PER_NODE, MAX_PROCS_PER_NODE, TaskSpec
from offcut.v1 import tasks_pb2

__all__ = ["OBJECTIVES", "Scalability", "check_spec", "make_task_spec", "parse_node_range",
           "read_scalability_csv"]

#: ``throughput``: maximise samples/s (BFTrainer's default, Os = Ps); ``speedup``: maximise
#: the speed-up over the smallest measured count (Os = Ps / Ps(n1)), which weighs tasks of
#: different speeds equally (BFTrainer's ImageNet ``spdup`` sets).
OBJECTIVES = ("throughput", "speedup")

Scalability = tuple[list[int], list[float]]
"""``(node_counts, throughputs)``: counts strictly increasing, >= 1; throughputs [samples/s]."""

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_node_range(text: str, field: str = "nodes") -> tuple[int, int]:
    """``"N"`` or ``"MIN-MAX"`` (``sbatch --nodes`` syntax) -> ``(min_nodes, max_nodes)``.

    Raises:
        InvalidArgument: not of that form, a count below 1, or MIN > MAX.
    """
    m = _RANGE.match(str(text))
    if not m:
        raise InvalidArgument(f"{text!r} is not a node count or range (use N or MIN-MAX, e.g. 1-8)",
                              field)
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) is not None else low
    if low < 1:
        raise InvalidArgument(f"{text!r}: the minimum node count must be >= 1", field)
    if low > high:
        raise InvalidArgument(f"{text!r}: the minimum ({low}) exceeds the maximum ({high})", field)
    return low, high


def read_scalability_csv(path: str | Path) -> Scalability:
    """Read a ``nodes,throughput`` CSV (header required; extra columns ignored).

    Returns ``(node_counts, throughputs)`` sorted as in the file, which must list counts
    >= 1 in strictly increasing order with finite throughputs >= 0 [samples/s]; a row
    ``0,0`` is accepted and dropped (the daemon adds it).

    Raises:
        InvalidArgument: missing or unreadable file, missing column, bad value (the
            message names the file, line and column).
    """
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        raise InvalidArgument(f"{path}: no such file", "scalability") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidArgument(f"{path}: cannot read: {exc}", "scalability") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise InvalidArgument(f"{path}: empty file (expected a header 'nodes,throughput')",
                              "scalability")
    header = [h.strip().lower() for h in rows[0]]
    missing = [c for c in ("nodes", "throughput") if c not in header]
    if missing:
        raise InvalidArgument(f"{path}: line 1: missing column(s) {', '.join(missing)} "
                              f"(header is {','.join(rows[0])!r}; expected 'nodes,throughput')",
                              "scalability")
    ci, ti = header.index("nodes"), header.index("throughput")
    counts: list[int] = []
    rates: list[float] = []
    for line, row in enumerate(rows[1:], start=2):
        where = f"{path}: line {line}"
        if len(row) <= max(ci, ti):
            raise InvalidArgument(f"{where}: expected {len(header)} fields, got {len(row)}",
                                  "scalability")
        try:
            n = int(row[ci].strip())
        except ValueError:
            raise InvalidArgument(f"{where}: column 'nodes': {row[ci]!r} is not an integer",
                                  "scalability") from None
        try:
            p = float(row[ti].strip())
        except ValueError:
            raise InvalidArgument(f"{where}: column 'throughput': {row[ti]!r} is not a number",
                                  "scalability") from None
        if not math.isfinite(p) or p < 0:
            raise InvalidArgument(f"{where}: column 'throughput' must be finite and >= 0, got {p}",
                                  "scalability")
        if n == 0 and not counts:
            if p != 0:
                raise InvalidArgument(f"{where}: throughput at 0 nodes must be 0, got {p}",
                                      "scalability")
            continue
        if n < 1:
            raise InvalidArgument(f"{where}: column 'nodes' must be >= 1, got {n}", "scalability")
        if counts and n <= counts[-1]:
            raise InvalidArgument(f"{where}: column 'nodes' must increase strictly "
                                  f"({n} after {counts[-1]})", "scalability")
        counts.append(n)
        rates.append(p)
    if not counts:
        raise InvalidArgument(f"{path}: no data rows", "scalability")
    return counts, rates


def make_task_spec(name: str, *, nodes: str | tuple[int, int], work_samples: float,
                   scalability: Scalability | None,
                   rescale_up_s: float = 30.0, rescale_down_s: float = 30.0,
                   objective: Literal["throughput", "speedup"] = "throughput",
                   command: Sequence[str] = (), zeus_job_id: str = "",
                   reports_progress: bool = False, gpus_per_node: int = 0,
                   constraint: str | Sequence[str] = (),
                   procs_per_node: int = 0) -> tasks_pb2.TaskSpec:
    """The ``TaskSpec`` of a task.

    Args:
        name: task name (shown by ``offcut queue``).
        nodes: ``"MIN-MAX"`` / ``"N"`` or ``(min_nodes, max_nodes)``.
        work_samples: total work Pmax [samples] > 0.
        scalability: ``(node_counts, throughputs)`` [samples/s], e.g. from
            :func:`read_scalability_csv`; must cover ``max_nodes``. ``None`` sends no curve:
            the daemon learns it (and the rescale costs) from the task's progress reports.
        rescale_up_s, rescale_down_s: Tcup / Tcdw [s]: progress lost when the task grows /
            shrinks (BFTrainer, arXiv 2106.12091, Section 3).
        objective: one of :data:`OBJECTIVES`; the curve Os the allocation maximises.
        command: argv of the training program (for live runs).
        zeus_job_id: a Zeus batch-size job whose batch size the task's runs use
            (``OFFCUT_ZEUS_JOB_ID`` in their environment; docs/execution.md).
        reports_progress: the task reports its progress (``offcut.client.elastic`` does, at
            every checkpoint); implied without a curve.
        gpus_per_node: GPUs every node of the task must have (as ``sbatch --gpus-per-node``;
            0: a CPU task, kept off GPU nodes).
        constraint: node features every node must have: ``"a100&ib"`` (as ``sbatch
            --constraint``, AND only) or a sequence of feature names.
        procs_per_node: processes started on each node (``RANK``/``LOCAL_RANK`` per
            process; docs/execution.md, "Processes per node"); 0: ``gpus_per_node`` when
            set (one process per GPU), else 1.

    Raises:
        InvalidArgument: naming ``nodes``, ``work``, ``scalability``, ``rescale_up``,
            ``rescale_down`` or ``objective``, else ``spec.<field>`` for the rules the daemon
            applies too (:func:`check_spec`; the daemon also checks its size limits).
    """
    low, high = parse_node_range(nodes) if isinstance(nodes, str) else nodes
    if not (isinstance(work_samples, (int, float)) and math.isfinite(work_samples)
            and work_samples > 0):
        raise InvalidArgument(f"must be a finite number of samples > 0, got {work_samples}", "work")
    for field, value in (("rescale_up", rescale_up_s), ("rescale_down", rescale_down_s)):
        if not (math.isfinite(value) and value >= 0):
            raise InvalidArgument(f"must be finite seconds >= 0, got {value}", field)
    if objective not in OBJECTIVES:
        raise InvalidArgument(f"{objective!r} is not one of {', '.join(OBJECTIVES)}", "objective")
    if not 0 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise InvalidArgument(f"must be 0 to {MAX_GPUS_PER_NODE}, got {gpus_per_node}",
                              "gpus_per_node")
    if not 0 <= procs_per_node <= MAX_PROCS_PER_NODE:
        raise InvalidArgument(f"must be 0 to {MAX_PROCS_PER_NODE}, got {procs_per_node}",
                              "procs_per_node")
    spec = tasks_pb2.TaskSpec(name=name, min_nodes=low, max_nodes=high,
                              total_work_samples=float(work_samples), rescale_up_s=rescale_up_s,
                              rescale_down_s=rescale_down_s, command=list(command),
                              zeus_job_id=zeus_job_id, reports_progress=reports_progress,
                              gpus_per_node=gpus_per_node,
                              constraint=parse_constraint(constraint),
                              procs_per_node=procs_per_node)
    if scalability is not None:
        _add_curve(spec, scalability, objective)
    check_spec(spec)
    return spec


def check_spec(spec: tasks_pb2.TaskSpec) -> None:
    """Check ``spec`` by the rules the daemon applies (:class:`offcut.taskspec.TaskSpec`, the
    one validator); raises :class:`InvalidArgument` naming ``spec.<field>``."""
    TaskSpec.create(name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                    node_counts=list(spec.node_counts), throughputs=list(spec.throughputs),
                    objective_values=list(spec.objective_values),
                    rescale_up_s=spec.rescale_up_s, rescale_down_s=spec.rescale_down_s,
                    total_work_samples=spec.total_work_samples, command=list(spec.command),
                    reports_progress=spec.reports_progress, power_w=list(spec.power_w),
                    zeus_job_id=spec.zeus_job_id, gpus_per_node=spec.gpus_per_node,
                    constraint=list(spec.constraint), procs_per_node=spec.procs_per_node)


def parse_constraint(constraint: str | Sequence[str]) -> list[str]:
    """Feature names of a Slurm ``--constraint`` of the AND form (``"a100&ib"``; a sequence
    is taken as the names), sorted without repeats. Slurm's other operators (``|``, ``[]``,
    ``*``, ``!``) are refused: InvalidArgument naming ``constraint``."""
    if isinstance(constraint, str):
        bad = sorted(set(constraint) & set("|[]*!(),:"))
        if bad:
            raise InvalidArgument(f"{constraint!r}: only features joined with '&' are supported "
                                  f"(not {' '.join(bad)})", "constraint")
        names = [f.strip() for f in constraint.split("&")] if constraint.strip() else []
    else:
        names = [str(f) for f in constraint]
    if any(not f for f in names):
        raise InvalidArgument(f"{constraint!r} has an empty feature", "constraint")
    return sorted(set(names))


def _add_curve(spec: tasks_pb2.TaskSpec, scalability: Scalability, objective: str) -> None:
    """Add ``(node_counts, throughputs)`` (and the speedup objective) to ``spec``."""
    high = spec.max_nodes
    counts, rates = scalability
    if counts[-1] < high:
        raise InvalidArgument(f"the curve ends at {counts[-1]} nodes but the task may use up to "
                              f"{high}: measure up to {high} nodes or lower the maximum",
                              "scalability")
    spec.node_counts.extend([0] + list(counts))
    spec.throughputs.extend([0.0] + [float(p) for p in rates])
    if objective == "speedup":
        base = rates[0]
        if base <= 0:
            raise InvalidArgument(f"objective speedup needs a throughput > 0 at {counts[0]} "
                                  "node(s)", "scalability")
        spec.objective_values.extend([0.0] + [p / base for p in rates])

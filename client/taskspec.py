"""Building a task's spec (the core :class:`offcut.taskspec.TaskSpec`) from what a researcher
knows.

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
and column) that is wrong. The spec's rules are checked once, by the one validator
(:meth:`offcut.taskspec.TaskSpec.create`); :meth:`offcut.client.Client.submit` sends the spec
in its wire form (:func:`offcut.wire.specs.spec_to_pb`).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Literal, Sequence

from offcut.errors import InvalidArgument
from offcut.taskspec import TaskSpec

__all__ = ["OBJECTIVES", "Scalability", "make_task_spec", "parse_node_range",
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
                   procs_per_node: int = 0) -> TaskSpec:
    """The validated spec of a task, ready for :meth:`offcut.client.Client.submit`.

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

    Returns:
        the core :class:`offcut.taskspec.TaskSpec`, checked once by :meth:`TaskSpec.create`
        (the rules the daemon applies; the daemon also checks its size limits).

    Raises:
        InvalidArgument: naming the argument (``nodes``, ``work``, ``scalability``,
            ``rescale_up``, ``rescale_down``, ``objective``, ``gpus_per_node``,
            ``procs_per_node``, ``constraint``) when one argument's value is wrong, else
            ``spec.<field>`` (``spec.name``, ``spec.throughputs``, ``spec.command``, ...).
    """
    low, high = parse_node_range(nodes) if isinstance(nodes, str) else nodes
    if objective not in OBJECTIVES:
        raise InvalidArgument(f"{objective!r} is not one of {', '.join(OBJECTIVES)}", "objective")
    counts, rates, objective_values = (([], [], []) if scalability is None
                                       else _curve(scalability, high, objective))
    try:
        return TaskSpec.create(
            name=name, min_nodes=low, max_nodes=high, node_counts=counts, throughputs=rates,
            objective_values=objective_values,
            total_work_samples=_number(work_samples, "work"),
            rescale_up_s=_number(rescale_up_s, "rescale_up"),
            rescale_down_s=_number(rescale_down_s, "rescale_down"), command=command,
            zeus_job_id=zeus_job_id, reports_progress=reports_progress,
            gpus_per_node=gpus_per_node, constraint=parse_constraint(constraint),
            procs_per_node=procs_per_node)
    except InvalidArgument as exc:
        argument = _ARGUMENT_OF.get(exc.field or "")
        if argument is None:
            raise
        raise InvalidArgument(exc.reason, argument) from None


#: spec fields set from one argument of :func:`make_task_spec` of another name (or that the CLI
#: offers as an option): their errors name the argument, as the argument's own checks do
_ARGUMENT_OF = {"spec.min_nodes": "nodes", "spec.max_nodes": "nodes",
                "spec.total_work_samples": "work", "spec.rescale_up_s": "rescale_up",
                "spec.rescale_down_s": "rescale_down", "spec.gpus_per_node": "gpus_per_node",
                "spec.procs_per_node": "procs_per_node", "spec.constraint": "constraint"}


def _number(value: object, argument: str) -> float:
    """``value`` as a float (its range is :meth:`TaskSpec.create`'s to check); InvalidArgument
    naming ``argument`` when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"must be a number, got {value!r}", argument)
    return float(value)


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


def _curve(scalability: Scalability, high: int,
           objective: str) -> tuple[list[int], list[float], list[float]]:
    """``(node_counts, throughputs, objective_values)`` of the spec: the measured curve with
    the point ``(0, 0)`` in front, and for ``speedup`` the throughputs over the first one
    (empty for ``throughput``). InvalidArgument naming ``scalability`` when the curve ends
    below ``high`` [nodes] or ``speedup`` has no throughput > 0 to divide by."""
    counts, rates = scalability
    if counts[-1] < high:
        raise InvalidArgument(f"the curve ends at {counts[-1]} nodes but the task may use up to "
                              f"{high}: measure up to {high} nodes or lower the maximum",
                              "scalability")
    objective_values: list[float] = []
    if objective == "speedup":
        base = rates[0]
        if base <= 0:
            raise InvalidArgument(f"objective speedup needs a throughput > 0 at {counts[0]} "
                                  "node(s)", "scalability")
        objective_values = [0.0] + [p / base for p in rates]
    return [0] + list(counts), [0.0] + [float(p) for p in rates], objective_values

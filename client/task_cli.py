"""Task commands of the ``offcut`` CLI, shaped after ``sbatch``/``squeue``/``scontrol
show job``/``scancel``: ``submit``, ``queue``, ``show``, ``cancel``, ``watch``.

Every command takes the connection flags of :mod:`offcut.client.settings` (``--address``,
``--token-file``, ``--tls-ca``, ... and ``--config FILE``; each also an ``OFFCUT_...``
variable and a key of the client's config file), prints one clear line and exits non-zero on
errors, and ``--json`` where it lists.
"""

from __future__ import annotations

import getpass
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional

import hostlist
import typer

from offcut.client.cli_common import fail as _fail
from offcut.client.json_out import json_text, time_text
from offcut.client.settings import ClientSettings, connection_options
from offcut.errors import InvalidArgument, NotFound, OffcutError
from offcut.text_safety import terminal_safe
from offcut.v1 import decision_pb2, tasks_pb2
from offcut.views import PlacementUpdate, TaskReply, TaskState, TaskView
from offcut.wire import tasks as tasks_wire

ACTIVE_STATES = ("queued", "admitted", "running")
ALL_STATES = ACTIVE_STATES + ("completed", "cancelled", "failed")
#: squeue's compact state codes (``%t``, ``-t PD,R``) of each task state: a task waiting for
#: admission or for nodes is PENDING to a Slurm user
STATE_CODES = {"queued": "PD", "admitted": "PD", "running": "R", "completed": "CD",
               "cancelled": "CA", "failed": "F"}
#: what ``-t`` accepts besides the state names and the codes: Slurm's long names
SLURM_STATE_NAMES = {"pending": ("queued", "admitted"), "running": ("running",),
                     "completed": ("completed",), "cancelled": ("cancelled",),
                     "failed": ("failed",)}
#: ``offcut queue -o`` fields, as squeue's ``--format`` letters: letter -> (header, value)
FORMAT_FIELDS = {
    "i": ("TASK_ID", lambda t: t.task_id),
    "j": ("NAME", lambda t: t.spec.name),
    "u": ("USER", lambda t: t.owner),
    "T": ("STATE", lambda t: state_name(t.state).upper()),
    "t": ("ST", lambda t: STATE_CODES[state_name(t.state)]),
    "D": ("NODES", lambda t: str(len(t.nodes))),
    "N": ("NODELIST", lambda t: hostlist.collect_hostlist(list(t.nodes)) if t.nodes else ""),
    "R": ("NODELIST(REASON)", lambda t: task_reason(t)),
    "P": ("PROGRESS", lambda t: progress_cell(t)),
    "e": ("ETA", lambda t: format_duration(eta_seconds(t))),
    "G": ("GENERATION", lambda t: str(t.generation)),
}
#: the default of ``offcut queue`` (``-o`` replaces it)
DEFAULT_FORMAT = "%i  %j  %u  %T  %D  %R  %P  %e"


def state_name(state: TaskState | int) -> str:
    """A task state's name: ``TaskState.RUNNING`` (or ``offcut.v1``'s ``TASK_STATE_RUNNING``)
    -> ``running``."""
    if isinstance(state, TaskState):
        return state.value
    return tasks_pb2.TaskState.Name(state).removeprefix("TASK_STATE_").lower()


def change_name(change: str | int) -> str:
    """A placement change's name: ``grow`` as is (a view's), or ``offcut.v1``'s
    ``PLACEMENT_CHANGE_GROW`` -> ``grow``."""
    if isinstance(change, str):
        return change
    return decision_pb2.PlacementChange.Name(change).removeprefix("PLACEMENT_CHANGE_").lower()


def format_duration(seconds: float | None) -> str:
    """Slurm's time format: ``[D-]HH:MM:SS`` (``-`` for unknown or infinite)."""
    if seconds is None or not seconds < float("inf") or seconds < 0:
        return "-"
    s = int(round(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def _ts(t: float | None) -> str:
    """A time [s since epoch] in RFC 3339 UTC, as the JSON output writes it; ``-`` for None."""
    return time_text(t) or "-"


def eta_seconds(task: TaskView) -> float | None:
    """Seconds to completion at the task's current rate (None when it earns nothing now, or
    when it reports its progress and has not reported yet: its rate is then only the prior)."""
    remaining = task.spec.total_work_samples - task.work_done_samples
    if task.state != TaskState.RUNNING or task.rate_samples_per_s <= 0:
        return None
    if reports_progress(task) and not (task.model is not None and task.model.has_report):
        return None
    return max(remaining, 0.0) / task.rate_samples_per_s


def progress_pct(task: TaskView) -> float:
    """The daemon's modelled work done in % of the task's total work, within [0, 100] (the
    progress model subtracts rescale and preemption costs, so a task that lost more than it
    earned has negative work done; ``work_done_samples`` keeps the signed figure). What the
    CLI shows is :func:`shown_progress`: this figure only for tasks that do not report."""
    total = task.spec.total_work_samples
    return 100.0 * min(max(task.work_done_samples / total, 0.0), 1.0) if total > 0 else 0.0


def reports_progress(task: TaskView) -> bool:
    """True when the task's progress comes from its own reports (``Tasks.ReportProgress``):
    submitted with ``reports_progress``, or without a curve (learned), as the daemon decides
    (``TaskSpec.reports`` of offcut.core.taskspec)."""
    s = task.spec
    return s.reports_progress or (not s.node_counts and not s.throughputs)


#: :attr:`Progress.source` values: the task's last progress report; the daemon's model (a task
#: that does not report: replays, tasks with a curve); nothing to show (a reporting task that
#: has not reported yet)
MEASURED, ESTIMATE, NO_REPORT = "measured", "estimate", "none"


@dataclass(frozen=True)
class Progress:
    """A task's progress as the CLI shows it (docs/execution.md, "Progress": reports complete a
    reporting task; the model only estimates between them).

    Attributes:
        source: :data:`MEASURED` (``LearnedModel.last_samples_done`` of the last accepted
            report), :data:`ESTIMATE` (``Task.work_done_samples``, modelled: the task does not
            report) or :data:`NO_REPORT` (it reports and has not yet: no figure).
        pct: samples in % of ``total_work_samples``, within [0, 100]; None for NO_REPORT.
        samples: the figure behind ``pct`` [samples] (signed for an estimate); None for
            NO_REPORT.
        report_time: when the last report was measured [s since the epoch]; None unless
            MEASURED.
    """

    source: str
    pct: float | None
    samples: float | None
    report_time: float | None

    def age_s(self, now: float) -> float | None:
        """Seconds from the report to ``now`` [s since the epoch], at least 0 (a report
        stamped ahead of this clock is 0 s old); None unless MEASURED."""
        return None if self.report_time is None else max(now - self.report_time, 0.0)


def shown_progress(task: TaskView) -> Progress:
    """The progress ``offcut show`` and ``queue`` print for ``task``: a reporting task's last
    reported figure (or none before its first report); a task that does not report, the
    daemon's modelled figure, an estimate. Never raises (a total of 0 is 0 %)."""
    total = task.spec.total_work_samples

    def pct(samples: float) -> float:
        return 100.0 * min(max(samples / total, 0.0), 1.0) if total > 0 else 0.0

    if not reports_progress(task):
        return Progress(ESTIMATE, pct(task.work_done_samples), task.work_done_samples, None)
    m = task.model
    if m is None or not m.has_report:
        return Progress(NO_REPORT, None, None, None)
    at = m.last_report_time
    return Progress(MEASURED, pct(m.last_samples_done), m.last_samples_done, at)


def format_age(seconds: float) -> str:
    """An age in words, as the CLI prints it: ``12 s``, ``4 min``, ``3 h``, ``2 d`` (whole
    units, rounded down; ``seconds`` [s] >= 0)."""
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size} {unit}"
    return f"{s} s"


def progress_cell(task: TaskView, now: float | None = None) -> str:
    """``offcut queue``'s PROGRESS: ``3.6% (2 min ago)`` (reported), ``~11.2% (est.)``
    (modelled), ``- (no report)``. ``now`` [s since the epoch] defaults to this clock."""
    p = shown_progress(task)
    if p.source == NO_REPORT:
        return "- (no report)"
    if p.source == ESTIMATE:
        return f"~{p.pct:.1f}% (est.)"
    now = time.time() if now is None else now
    return f"{p.pct:.1f}% ({format_age(p.age_s(now))} ago)"


def progress_text(task: TaskView, now: float | None = None) -> str:
    """``offcut show``'s Progress line: the reported figure, its samples and when (``3.60%
    (36000 of 1e+06 samples, reported 2 min ago at 2026-...Z)``), the modelled figure marked
    as an estimate, or that the task has not reported yet. ``now`` [s since the epoch]
    defaults to this clock."""
    p = shown_progress(task)
    total = task.spec.total_work_samples
    if p.source == NO_REPORT:
        return (f"- (no report yet; the task reports its progress, {total:.6g} samples in "
                "all)")
    if p.source == ESTIMATE:
        return (f"~{p.pct:.2f}% (estimate: {p.samples:.6g} of {total:.6g} samples modelled; "
                "the task does not report its progress)")
    now = time.time() if now is None else now
    return (f"{p.pct:.2f}% ({p.samples:.6g} of {total:.6g} samples, reported "
            f"{format_age(p.age_s(now))} ago at {_ts(task.model.last_report_time)})")


def generation_text(task: TaskView, clock_mode: str = "live",
                    now: float | None = None) -> str:
    """``offcut show``'s Generation line: the number, when it was placed, and on a live
    daemon whether its jobs run: ``5 (placed 12 s ago at ...; started)`` or ``5 (placed ...;
    waiting for the launcher: ...)`` while no launcher reported a run of it started
    (docs/execution.md, "Waiting for the launcher"). ``now`` [s since the epoch] defaults
    to this clock."""
    if task.generation_time is None:
        return str(task.generation)
    placed = task.generation_time
    now = time.time() if now is None else now
    text = (f"{task.generation} (placed {format_age(max(now - placed, 0.0))} ago at "
            f"{_ts(task.generation_time)}")
    if clock_mode == "replay" or not task.nodes or state_name(task.state) != "running":
        return text + ")"
    if task.started_generation >= task.generation:
        return text + "; its jobs started)"
    previous = (f"generation {task.started_generation} still stops (rescale_grace_s at most)"
                if task.started_generation else "the launcher has not submitted them")
    return (text + f"; waiting for the launcher: its jobs have not started: {previous}, or "
            "Slurm has not started them yet)")


def energy_figures(task: TaskView) -> tuple[float, float, str]:
    """``(joules [J], samples per joule [samples/J], source)`` of a task as the daemon shows
    it (``Task.energy``; docs/execution.md, "Energy"): source ``measured`` (its processes'
    GPUs) or ``modelled`` (an estimate); a daemon before that answers energy_j, modelled."""
    if task.energy is not None:
        e = task.energy
        return e.joules, e.samples_per_joule, e.source
    j = task.energy_j
    return j, (task.work_done_samples / j if j > 0 else 0.0), "modelled"


def energy_text(task: TaskView) -> str:
    """The ``Energy`` line of ``offcut show``: joules, their source and what stands behind
    them (the newest generation's ranks that reported; the modelled power now)."""
    joules, _, source = energy_figures(task)
    if source == "measured":
        e = task.energy
        return (f"{joules:.6g} J measured ({e.generations_reported} generation"
                f"{'s' if e.generations_reported != 1 else ''} reported; generation "
                f"{e.last_generation}: {e.last_generation_joules:.6g} J from "
                f"{e.last_generation_ranks} of {e.last_generation_world_size} ranks)")
    return (f"{joules:.6g} J modelled, an estimate (now {task.power_w:.6g} W; no process "
            "reported measured energy)")


#: columns of ``tasks.csv`` (``offcut history``): one row per task, as of the last journal
#: entry that answered with it (a submission, cancellation, run or energy report)
TASK_ENERGY_COLUMNS = ("task_id", "task_name", "state", "generation", "as_of",
                       "work_done_samples", "energy_j", "energy_source", "samples_per_joule")


class TaskEnergyRows:
    """The ``tasks.csv`` of ``offcut history``: every task of the exported journal entries
    that carry one (``HistoryEntry.task``), as last answered, with its joules and samples per
    joule labelled ``measured`` or ``modelled`` (:func:`energy_figures`). Holds one task per
    id seen (the export's tasks)."""

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[float, TaskView]] = {}

    def entry(self, e) -> None:
        """Note one :class:`~offcut.views.HistoryEntry` (entries without a task are
        skipped)."""
        if e.task is not None and e.task.task_id and e.decision is not None:
            self.tasks[e.task.task_id] = (e.decision.time, e.task)

    @property
    def measured(self) -> int:
        """Tasks whose energy is measured."""
        return sum(energy_figures(t)[2] == "measured" for _, t in self.tasks.values())

    def write(self, path: Path) -> None:
        """Write the rows (in task id order) to ``path`` (CSV with a header; ``as_of`` in
        ISO-8601 UTC, joules [J], samples/J)."""
        from datetime import datetime, timezone

        from offcut.text_safety import csv_writer

        with open(path, "w", newline="") as fh:
            out = csv_writer(fh)  # task names a spreadsheet would run are quoted
            out.writerow(TASK_ENERGY_COLUMNS)
            for task_id in sorted(self.tasks):
                at, task = self.tasks[task_id]
                joules, per_joule, source = energy_figures(task)
                out.writerow([task_id, task.spec.name, state_name(task.state), task.generation,
                              datetime.fromtimestamp(at, timezone.utc).isoformat(
                                  timespec="seconds"),
                              repr(task.work_done_samples), repr(joules), source,
                              repr(per_joule)])


#: columns of ``warnings.csv`` (``offcut history``): one row per warning a decision noted
TASK_WARNING_COLUMNS = ("time", "task_id", "generation", "kind", "message")


class TaskWarningRows:
    """The ``warnings.csv`` of ``offcut history``: every warning the exported decisions noted
    (``Decision.warnings``; docs/execution.md, "Wasted work"), one row each in journal order,
    written as the entries arrive (nothing is held: an export of any length). ``time`` in
    ISO-8601 UTC; the message as the daemon wrote it (at most 1,000 characters), quoted when
    a spreadsheet would run it. Use as a context manager."""

    def __init__(self, path: Path) -> None:
        from offcut.text_safety import csv_writer

        self.count = 0
        self._fh = open(path, "w", newline="")
        self._out = csv_writer(self._fh)
        self._out.writerow(TASK_WARNING_COLUMNS)

    def entry(self, e) -> None:
        """Write the warnings of one :class:`~offcut.views.HistoryEntry`'s decision."""
        from datetime import datetime, timezone

        for w in e.decision.warnings if e.decision is not None else ():
            at = datetime.fromtimestamp(w.time, timezone.utc)
            self._out.writerow([at.isoformat(timespec="seconds"), w.task_id, w.generation,
                                w.kind, w.message])
            self.count += 1

    def close(self) -> None:
        """Flush and close the file."""
        self._fh.close()

    def __enter__(self) -> "TaskWarningRows":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def task_json(task: TaskView) -> dict:
    """A task as ``offcut queue --json`` and ``offcut show --json`` print it: its ``Task``
    message (:func:`offcut.wire.tasks.task_to_pb`) in the one JSON form (:mod:`offcut.client.json_out`) plus the progress as shown
    (:func:`shown_progress`): ``progress_pct`` (% of its work done, 0-100; null when a
    reporting task has not reported yet), ``progress_source`` (``measured``: its last report;
    ``estimate``: the daemon's model, the task does not report; ``none``: no report yet),
    ``progress_report_time`` (RFC 3339 UTC of that report; null unless measured), and
    ``eta_s`` (s to completion at its current rate; null when it earns nothing now or has not
    reported yet)."""
    from offcut.client.json_out import to_json

    p = shown_progress(task)
    return {**to_json(tasks_wire.task_to_pb(task)),
            "progress_pct": None if p.pct is None else round(p.pct, 2),
            "progress_source": p.source,
            "progress_report_time": (_ts(task.model.last_report_time)
                                     if p.source == MEASURED else None),
            "eta_s": eta_seconds(task)}


def task_reason(task: TaskView) -> str:
    """squeue's ``%R`` of a task: its node list while it holds nodes, else why not, in
    parentheses: ``(MaxRunningTasks)`` (queued: the daemon admits at most
    ``max_running_tasks``), ``(Resources)`` (admitted, no idle node it fits is free), the
    failure reason of a failed task, ``(None)`` for other ended tasks."""
    if task.nodes:
        return hostlist.collect_hostlist(list(task.nodes))
    state = state_name(task.state)
    if state == "queued":
        return "(MaxRunningTasks)"
    if state in ("admitted", "running"):
        return "(Resources)"
    if state == "failed" and task.failure_reason:
        return f"({clip_words(task.failure_reason, REASON_WIDTH)})"
    return "(None)"


#: most characters of a failure reason in ``offcut queue``'s ``%R`` (``offcut show`` prints
#: it whole)
REASON_WIDTH = 60


def clip_words(text: str, limit: int) -> str:
    """``text`` on one line in at most ``limit`` characters (>= 2): whitespace runs become one
    space; a longer text is cut at the last word boundary that fits and ends in ``...``
    (three ASCII dots, as every terminal shows them); a first word longer than the limit is
    cut inside it."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    room = limit - 3
    cut = text.rfind(" ", 0, room + 1)
    head = text[:cut] if cut > 0 else text[:room]
    return head.rstrip(" ,;:.-") + "..."


def parse_format(fmt: str) -> list[tuple[str, str, int | None, bool]]:
    """squeue's ``--format`` string: ``%[.][size]letter`` fields (letters of
    :data:`FORMAT_FIELDS`), anything else literal. Returns ``(kind, text, size,
    right_justified)`` parts, kind ``field`` (text: the letter) or ``text``. Raises
    :class:`InvalidArgument` naming ``--format`` for an unknown letter, a dangling ``%`` or a
    size above :data:`MAX_FIELD_WIDTH`."""
    parts: list[tuple[str, str, int | None, bool]] = []
    i = 0
    while i < len(fmt):
        if fmt[i] != "%":
            j = fmt.find("%", i)
            j = len(fmt) if j < 0 else j
            parts.append(("text", fmt[i:j], None, False))
            i = j
            continue
        m = _FORMAT_RE.match(fmt, i)
        if not m:
            raise InvalidArgument(f"{fmt[i:i + 6]!r}: a field is %[.][size]LETTER", "--format")
        letter = m["letter"]
        if letter not in FORMAT_FIELDS:
            raise InvalidArgument(f"%{letter} is not a field; fields: "
                                  + " ".join(f"%{k} ({h})" for k, (h, _) in FORMAT_FIELDS.items()),
                                  "--format")
        size = int(m["size"]) if m["size"] else None
        if size is not None and size > MAX_FIELD_WIDTH:
            raise InvalidArgument(f"%{m['size']}{letter}: a field is at most {MAX_FIELD_WIDTH} "
                                  "characters wide", "--format")
        parts.append(("field", letter, size, bool(m["dot"])))
        i = m.end()
    return parts


#: widest field of ``--format`` [characters] (squeue's sizes are a few dozen)
MAX_FIELD_WIDTH = 1000
_FORMAT_RE = re.compile(r"%(?P<dot>\.?)(?P<size>\d*)(?P<letter>[A-Za-z])")


def render_format(parts: list[tuple[str, str, int | None, bool]],
                  tasks: Iterable[TaskView], header: bool = True) -> str:
    """Lines of ``tasks`` in a :func:`parse_format` format, as squeue prints them: a field
    with a size is padded to it (right-justified with ``.``) and cut to it, one without is
    as wide as its column's longest value; the header line first unless ``header`` is
    False. Every cell is :func:`~offcut.text_safety.terminal_safe` (escaped before the widths
    are taken)."""
    rows = [[terminal_safe(FORMAT_FIELDS[text][1](t) if kind == "field" else text)
             for kind, text, _, _ in parts] for t in tasks]
    heads = [FORMAT_FIELDS[text][0] if kind == "field" else terminal_safe(text)
             for kind, text, _, _ in parts]
    widths = []
    for k, (kind, _, size, _) in enumerate(parts):
        if kind != "field":
            widths.append(None)
        elif size is not None:
            widths.append(size)
        else:
            widths.append(max([len(heads[k])] + [len(r[k]) for r in rows]))

    def line(cells: list[str]) -> str:
        out = []
        for (kind, _, size, right), cell, width in zip(parts, cells, widths):
            if width is None:
                out.append(cell)
                continue
            cell = cell[:width] if size is not None else cell
            out.append(cell.rjust(width) if right else cell.ljust(width))
        return "".join(out).rstrip()

    return "\n".join(([line(heads)] if header else []) + [line(r) for r in rows])


def submit(
    name: str = typer.Option(..., "--name", "-J", help="task name"),
    nodes: str = typer.Option(..., "--nodes", "-N", help="node count or range MIN-MAX, as in sbatch --nodes (e.g. 2-8)"),
    work: float = typer.Option(..., "--work", help="total work of the task, samples (e.g. 1.2e9)"),
    scalability: Optional[Path] = typer.Option(None, "--scalability", help="CSV with header nodes,throughput (samples/s at each node count, up to the maximum); omit it and the daemon learns the curve and the rescale costs from the task's progress reports (the --rescale-* values are then the prior)"),
    reports_progress: bool = typer.Option(False, "--reports-progress", help="the task reports its own progress (offcut.client.progress.ProgressReporter, or Client.report_progress): only its reports complete it; implied without --scalability"),
    rescale_up: float = typer.Option(30.0, "--rescale-up", help="Tcup: seconds of progress lost when the task grows"),
    rescale_down: float = typer.Option(30.0, "--rescale-down", help="Tcdw: seconds of progress lost when the task shrinks"),
    objective: str = typer.Option("throughput", "--objective", help="throughput (samples/s) | speedup (over the smallest measured count)"),
    zeus_job: str = typer.Option("", "--zeus-job", help="Zeus batch-size job (offcut recur / BatchSizeOptimizer.RegisterJob) whose batch size the task's runs use: passed to them as OFFCUT_ZEUS_JOB_ID (docs/execution.md)"),
    gpus_per_node: int = typer.Option(0, "--gpus-per-node", help="GPUs every node of the task must have, as in sbatch (0: a CPU task, placed on nodes without GPUs only)"),
    constraint: str = typer.Option("", "--constraint", "-C", help="node features every node must have, as in sbatch: FEATURE[&FEATURE...] (e.g. a100&ib)"),
    procs_per_node: int = typer.Option(0, "--procs-per-node", help="processes started on each node, each with its own RANK and LOCAL_RANK, as torchrun --nproc-per-node (default: --gpus-per-node when given, one process per GPU; else 1)"),
    parsable: bool = typer.Option(False, "--parsable", help="print only the task id (like sbatch --parsable)"),
    command: Optional[List[str]] = typer.Argument(None, help="training command (after --), run on the task's nodes in live mode"),
    *, settings: ClientSettings,
) -> None:
    """Submit an elastic training task; prints its id.

    \b
    Examples:
      offcut submit --name resnet18 --nodes 1-8 --work 1.2e9 --scalability resnet18.csv -- python train.py
      id=$(offcut submit --parsable -J bert -N 2-16 --work 5e8 --scalability bert.csv)
      offcut submit -J new-model -N 1-32 --work 3e9 -- python train.py   # curve learned online
      offcut submit -J digits -N 1-4 --work 40000 -- python examples/elastic_digits/train.py
      offcut submit -J llm -N 2-8 --gpus-per-node 4 -C a100 --work 1e9 -- python train.py
      offcut submit -J cpu-ddp -N 1-4 --procs-per-node 2 --work 40000 -- python train.py
    """
    from offcut.client.taskspec import make_task_spec, read_scalability_csv

    try:
        curve = read_scalability_csv(scalability) if scalability is not None else None
        spec = make_task_spec(name, nodes=nodes, work_samples=work, scalability=curve,
                              rescale_up_s=rescale_up, rescale_down_s=rescale_down,
                              objective=objective, command=command or [],
                              gpus_per_node=gpus_per_node, constraint=constraint,
                              procs_per_node=procs_per_node, reports_progress=reports_progress,
                              zeus_job_id=zeus_job)
    except InvalidArgument as exc:
        _fail(_cli_field(str(exc)), 2)
    try:
        with settings.client() as c:
            # with a token the daemon takes the owner from it; without, the login name
            owner = "" if c.authenticated else getpass.getuser()
            reply = c.submit(spec, owner=owner, request_id=str(uuid.uuid4()))
    except InvalidArgument as exc:
        _fail(str(exc), 2)
    except OffcutError as exc:
        _fail(str(exc))
    task = reply.task
    if parsable:
        typer.echo(terminal_safe(task.task_id))
        return
    placed = [p for p in reply.decision.placements if p.task_id == task.task_id]
    where = (f", started on {len(placed[0].nodes)} node(s)" if placed and placed[0].nodes
             else f", {state_name(task.state)}")
    typer.echo(terminal_safe(f"Submitted task {task.task_id}{where}"))


def _cli_field(message: str) -> str:
    """Name the CLI option rather than the API argument in client-side errors."""
    for api, option in (("work:", "--work:"), ("nodes:", "--nodes:"), ("scalability:", "--scalability:"),
                        ("rescale_up:", "--rescale-up:"), ("rescale_down:", "--rescale-down:"),
                        ("objective:", "--objective:"), ("constraint:", "--constraint:"),
                        ("gpus_per_node:", "--gpus-per-node:"),
                        ("procs_per_node:", "--procs-per-node:")):
        if message.startswith(api):
            return option + message[len(api):]
    return message


def _states(values: list[str] | None, all_states: bool) -> list[TaskState]:
    if all_states:
        return []
    names = values or list(ACTIVE_STATES)
    codes = {}
    for state, code in STATE_CODES.items():
        codes.setdefault(code.lower(), []).append(state)
    out: list[TaskState] = []
    for n in names:
        for part in n.split(","):
            part = part.strip().lower()
            if part == "all":
                return []
            chosen = ([part] if part in ALL_STATES else codes.get(part)
                      or SLURM_STATE_NAMES.get(part))
            if not chosen:
                _fail(f"--state: {part!r} is not a state ({', '.join(ALL_STATES)}), a code "
                      f"({', '.join(sorted(set(STATE_CODES.values())))}), pending or all", 2)
            out += [TaskState(s) for s in chosen if TaskState(s) not in out]
    return out


def queue(
    state: Optional[List[str]] = typer.Option(None, "--state", "-t", help="only these states, as squeue -t: names (queued, admitted, running, completed, cancelled, failed), codes (PD, R, CD, CA, F), pending or all; comma-separated or repeated [default: the active ones]"),
    all_states: bool = typer.Option(False, "--all", help="every state, finished tasks included"),
    user: Optional[str] = typer.Option(None, "--user", "-u", help="only this owner's tasks"),
    me: bool = typer.Option(False, "--me", help="only my tasks"),
    fmt: Optional[str] = typer.Option(None, "--format", "-o", help="the columns, as squeue -o: %[.][size]LETTER fields: %i task id, %j name, %u owner, %T state, %t state code, %D nodes, %N node list, %R node list or (reason), %P progress (reported, and how long ago; ~ an estimate for a task that does not report; - before its first report), %e ETA, %G generation [default: \"%i  %j  %u  %T  %D  %R  %P  %e\"]"),
    noheader: bool = typer.Option(False, "--noheader", "-h", help="no header line (as squeue -h)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list of the tasks (each as offcut show --json prints it; docs/user-guide.md, \"JSON output\")"),
    *, settings: ClientSettings,
) -> None:
    """List tasks like squeue: id, name, owner, state, nodes now (or why none), progress, ETA.

    \b
    Examples:
      offcut queue
      offcut queue --me --all
      offcut queue -t R,PD -o "%i %u %T %D %N %R" -h
      offcut queue --state running --json
    """
    try:
        parts = parse_format(fmt if fmt is not None else DEFAULT_FORMAT)
    except InvalidArgument as exc:
        _fail(str(exc), 2)
    owner = getpass.getuser() if me else (user or "")
    try:
        with settings.client() as c:
            tasks = c.list_tasks(states=_states(state, all_states), owner=owner)
    except OffcutError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json_text([task_json(t) for t in tasks], indent=2))
        return
    text = render_format(parts, tasks, header=not noheader)
    if text:
        typer.echo(text)


def show(
    task_id: str = typer.Argument(..., help="task id (from submit or queue)"),
    as_json: bool = typer.Option(False, "--json", help="print the task as JSON: the Task message's fields (null when unset, lower-case states) plus progress_pct, progress_source (measured: the last report; estimate: modelled, the task does not report; none: no report yet), progress_report_time and eta_s (docs/user-guide.md, \"JSON output\")"),
    *, settings: ClientSettings,
) -> None:
    """Show one task in full, like scontrol show job, and why it holds what it holds (the
    idle nodes, the horizon, its rescale cost, its curve, and what would change it).

    Example: offcut show t000001
    """
    from offcut.client.explain import explain

    try:
        with settings.client() as c:
            task = c.get_task(task_id)
            status = c.status() if not as_json else None
    except OffcutError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json_text(task_json(task), indent=2))
        return
    s = task.spec
    fields = [
        ("TaskId", task.task_id), ("Name", s.name), ("Owner", task.owner),
        ("State", state_name(task.state)),
        ("Nodes", f"{len(task.nodes)} of {s.min_nodes}-{s.max_nodes}"),
        ("NodeList", hostlist.collect_hostlist(list(task.nodes)) if task.nodes else "(null)"),
        ("TresPerNode", f"gres:gpu:{s.gpus_per_node}" if s.gpus_per_node else "(null)"),
        ("Features", "&".join(s.constraint) or "(null)"),
        ("NtasksPerNode", str(s.procs_per_node or s.gpus_per_node or 1)),
        ("Progress", progress_text(task)),
        ("Rate", f"{task.rate_samples_per_s:.6g} samples/s"),
        ("ETA", format_duration(eta_seconds(task))),
        ("Rescales", task.rescales), ("Preemptions", task.preemptions),
        ("Launches", task.launches), ("LastRun", task.last_run or "-"),
        ("Generation", generation_text(task, status.clock_mode)),
        ("FailedRuns", task.failed_runs),
        ("FailedInARow", f"{task.failures_without_progress} (without progress; the task "
                         "fails at max_failed_generations)"),
        ("SamplesRedone", f"{task.samples_redone:.6g}"),
        ("Finishing", f"since {_ts(task.work_reached_time)} (the work is reached; COMPLETED "
                      "when its processes exit 0)" if task.work_reached_time is not None
         else "-"),
        ("Reason", task.failure_reason or "-"),
        ("RescaleUp", f"{s.rescale_up_s:g} s"), ("RescaleDown", f"{s.rescale_down_s:g} s"),
        ("Scalability", " ".join(f"{n}:{p:g}" for n, p in zip(s.node_counts, s.throughputs))
         or "learned online"),
        ("Energy", energy_text(task)),
        ("SamplesPerJ", "{1:.6g} ({2})".format(*energy_figures(task))),
    ]
    if task.model is not None:
        m = task.model
        fields += [
            ("Measured", " ".join(f"{x.nodes}:{x.samples_per_s:.6g}" for x in m.measured) or "-"),
            ("Learned", " ".join(f"{n}:{p:.6g}" for n, p in zip(m.curve_node_counts,
                                                                 m.curve_throughputs)) or "-"),
            ("RescaleInUse", f"up {m.rescale_up_s:.3g} s, down {m.rescale_down_s:.3g} s"),
            ("RescaleMeasured", " ".join(
                f"{k} {getattr(m, f'measured_rescale_{k}_s'):.3g} s" for k in ("up", "down")
                if getattr(m, f"measured_rescale_{k}_s") is not None) or "-"),
            ("RescaleLost", f"{m.measured_rescale_lost_s:.3g} s over {m.measured_rescales} "
                            "measured rescales and preemptions (seconds of progress at the "
                            "rate before each)" if m.measured_rescales else "- (none measured)"),
        ]
    fields += [
        ("SubmitTime", _ts(task.submit_time)), ("AdmitTime", _ts(task.admit_time)),
        ("FinishTime", _ts(task.finish_time)),
        ("Command", " ".join(s.command) or "-"),
    ]
    # user text (name, owner, command, failure reason, features) escaped: no control
    # character reaches the terminal (docs/security.md)
    for key, value in fields:
        typer.echo(f"{key:12s} {terminal_safe(value)}")
    for w in task.warnings:  # docs/execution.md, "Wasted work"
        text = f"{w.kind} (generation {w.generation}, {_ts(w.time)}): {w.message}"
        typer.echo(f"{'Warning':12s} {terminal_safe(text)}")
    for i, line in enumerate(explain(task, status)):
        typer.echo(f"{'Why' if i == 0 else '':12s} {terminal_safe(line)}")


def cancel_text(reply: TaskReply) -> str:
    """What ``offcut cancel`` says of one cancelled task: a task that held nodes is CANCELLED
    at once (its nodes re-allocated), but its jobs still end: each gets the stop signal to
    checkpoint and exit, and the launcher cancels it after ``rescale_grace_s`` at most (docs/
    execution.md, "Signals and exit codes")."""
    task_id = terminal_safe(reply.task.task_id)
    held = [p.previous_count for p in reply.decision.placements
            if p.task_id == reply.task.task_id]
    if held and held[0] > 0:
        return (f"Cancelled task {task_id}; its jobs on {held[0]} node(s) are ending: the "
                "launcher sends each the stop signal to checkpoint and exit, and cancels it "
                "after rescale_grace_s at most (squeue shows them until then)")
    return f"Cancelled task {task_id}"


def cancel(
    task_ids: List[str] = typer.Argument(..., help="task ids"),
    *, settings: ClientSettings,
) -> None:
    """Cancel tasks (their nodes are released and re-allocated), like scancel.

    Exits 1 if any id could not be cancelled (each failure is one line).

    Example: offcut cancel t000001 t000002
    """
    failed = 0
    try:
        with settings.client() as c:
            for task_id in task_ids:
                try:
                    reply = c.cancel(task_id)  # a fresh request id, the same on its retries
                except (NotFound, InvalidArgument) as exc:
                    typer.echo(f"offcut: {terminal_safe(exc)}", err=True)
                    failed += 1
                    continue
                except OffcutError as exc:
                    if exc.status == "UNAVAILABLE":
                        raise
                    typer.echo(f"offcut: {terminal_safe(f'{task_id}: {exc}')}", err=True)
                    failed += 1
                    continue
                typer.echo(cancel_text(reply))
    except OffcutError as exc:
        _fail(str(exc))
    if failed:
        raise typer.Exit(1)


def format_update(update: PlacementUpdate) -> list[str]:
    """One line per placement change of an update (``generation N`` once the task has one:
    docs/execution.md), then one per warning noted (docs/execution.md, "Wasted work"), each
    :func:`~offcut.text_safety.terminal_safe` (task names, causes and texts escaped)."""
    lines = []
    for p in update.placements:
        nodes = hostlist.collect_hostlist(list(p.nodes)) if p.nodes else "-"
        gen = f"  generation {p.generation}" if p.generation else ""
        lines.append(terminal_safe(
            f"{_ts(p.time)}  rev {update.revision:<6d} {update.cause:10s} {p.task_id}  "
            f"{p.task_name}  {change_name(p.change)} {p.previous_count}->"
            f"{len(p.nodes)}  {nodes}{gen}"))
    for w in update.warnings:
        lines.append(terminal_safe(
            f"{_ts(w.time)}  rev {update.revision:<6d} {update.cause:10s} {w.task_id}  "
            f"WARNING {w.kind} (generation {w.generation}): {w.message}"))
    return lines


def watch(
    task_id: Optional[str] = typer.Argument(None, help="only this task [default: all tasks]"),
    after_revision: Optional[int] = typer.Option(None, "--after-revision", min=0, help="first print the changes the daemon retains after this revision (0: all it retains) [default: only new changes]"),
    count: Optional[int] = typer.Option(None, "--count", min=1, help="exit after this many updates"),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.1, help="exit after this many seconds"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per update (docs/user-guide.md, \"JSON output\")"),
    *, settings: ClientSettings,
) -> None:
    """Print placement changes (start, grow, shrink, preempted, completed ...) as they
    happen; Ctrl-C stops.

    \b
    Examples:
      offcut watch
      offcut watch t000001 --json
      offcut watch --count 1 --timeout 60
    """
    seen = 0
    started = time.monotonic()
    try:
        with settings.client() as c:
            if after_revision is None:
                after_revision = c.status().revision
            from offcut.client.json_out import to_json

            for update in c.watch(task_id or "", after_revision=after_revision, timeout_s=timeout):
                if as_json:
                    typer.echo(json_text(to_json(tasks_wire.update_to_pb(update))))
                else:
                    for line in format_update(update):
                        typer.echo(line)
                seen += 1
                if count is not None and seen >= count:
                    return
    except KeyboardInterrupt:
        return
    except OffcutError as exc:
        _fail(str(exc))
    if count is not None and seen < count:  # the --timeout ended the stream first
        _fail(f"only {seen} of {count} update(s) in {time.monotonic() - started:.0f} s")


def register(app: typer.Typer) -> None:
    """Add the task commands to the ``offcut`` app."""
    for command in (submit, queue, show, cancel, watch):
        app.command()(connection_options(command))


__all__ = ["register", "task_json", "format_duration", "eta_seconds", "progress_pct",
           "reports_progress", "shown_progress", "Progress", "progress_cell", "progress_text",
           "clip_words",
           "format_update", "state_name", "change_name"]

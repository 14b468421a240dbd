"""Decision history -> ``steps.csv`` + ``placements.csv``: the one writer shared by replays and
by the export of a live daemon's journal (``offcut history``), so both have the same columns.

* ``steps.csv``: one row per node event (``ReportNodes`` / ``SyncNodes`` decision), BFTrainer's
  step-log columns :data:`STEP_COLUMNS` (``evtTime`` ISO-8601 UTC, whole seconds; ``Thr``,
  ``ReScost``, ``PreCost`` [samples]; ``Rate`` [samples/s]; ``evt`` the node event's index,
  0 for the first one written; node and task counts) plus ``solve_ms`` [ms]. Decisions that
  answer a submission or a cancellation get no step row (as in the original step log).
* ``placements.csv``: one row per task placement change of any decision, and a ``submitted``
  row per submission, columns :data:`PLACEMENT_COLUMNS` (``nodes`` = node count after the
  change; work in samples).

Both are written through :func:`offcut.text_safety.csv_writer`: a task name a spreadsheet
would run as a formula (``=HYPERLINK(...)``, ``@SUM(...)``) gets a leading ``'``; numbers stay
numbers (docs/security.md).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from offcut.replay.owners import NodeTime
from offcut.text_safety import csv_writer
from offcut.views import Decision, HistoryEntry, TaskView

__all__ = ["STEP_COLUMNS", "PLACEMENT_COLUMNS", "NODE_EVENT_KINDS", "HistoryWriter", "iso"]

STEP_COLUMNS = ["evtTime", "Thr", "Rate", "ReScost", "evt", "Nleft", "Npre", "Njoin", "nJob",
                "nNd", "nJrun", "nNrun", "PreCost", "solve_ms"]
PLACEMENT_COLUMNS = ["time", "task_id", "task_name", "change", "nodes", "work_done_samples",
                     "total_work_samples"]
#: journal kinds (``HistoryEntry.kind``) whose decision answers a node event
NODE_EVENT_KINDS = frozenset({"nodes", "snapshot"})


def iso(t: float | None) -> str | None:
    """ISO-8601 (UTC-naive, whole seconds) of epoch seconds, or None."""
    if t is None:
        return None
    return datetime.fromtimestamp(round(t), timezone.utc).replace(tzinfo=None).isoformat()


class HistoryWriter:
    """Writes ``steps.csv`` and ``placements.csv`` into ``out_dir`` (overwriting them), one row
    at a time, as decisions arrive. Use as a context manager or call :meth:`close`.

    Attributes:
        solve_ms: ``SolveStats.solve_ms`` [ms] of every decision that solved at least one
            allocation problem (node events, submissions and cancellations).
        completed: ids of the tasks reported completed so far.
        node_events: step rows written so far (the next row's ``evt``).
        node_time: every task's node count over time (:class:`~offcut.replay.owners.NodeTime`),
            from the placement changes written.
    """

    def __init__(self, out_dir: str | Path):
        out = Path(out_dir)
        self.steps_fh = open(out / "steps.csv", "w", newline="")
        try:
            self.pl_fh = open(out / "placements.csv", "w", newline="")
        except OSError:
            self.steps_fh.close()
            raise
        self.steps = csv_writer(self.steps_fh)
        self.steps.writerow(STEP_COLUMNS)
        self.pl = csv_writer(self.pl_fh)
        self.pl.writerow(PLACEMENT_COLUMNS)
        self.solve_ms: list[float] = []
        self.completed: set[str] = set()
        self.node_events = 0
        self.node_time = NodeTime()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def decision(self, d: Decision, index: int | None) -> None:
        """Record a decision: its placement changes, and a steps.csv row with ``evt = index``
        unless ``index`` is None (decisions answering a submission or a cancellation)."""
        self.completed.update(d.completed_task_ids)
        for p in d.placements:
            self.pl.writerow([iso(p.time), p.task_id, p.task_name, p.change, len(p.nodes),
                              repr(p.work_done), repr(p.total_work)])
            self.node_time.change(p.task_id, p.time, len(p.nodes))
        if d.solve.solves:
            self.solve_ms.append(d.solve.solve_ms)
        if index is None:
            return
        s = d.stats
        self.steps.writerow([iso(d.time), f"{s.progress_samples:.6f}",
                             f"{s.rate_samples_per_s:.6f}", f"{s.rescale_cost_samples:.6f}", index,
                             s.nodes_left, s.tasks_preempted, s.nodes_joined, s.admitted_tasks,
                             s.idle_nodes, s.running_tasks, s.nodes_in_use,
                             f"{s.preemption_cost_samples:.6f}", f"{d.solve.solve_ms:.3f}"])
        self.node_events += 1

    def node_event(self, d: Decision) -> None:
        """Record the decision of a node event, numbered after the previous ones (``evt`` =
        :attr:`node_events`: 0, 1, 2 ...)."""
        self.decision(d, self.node_events)

    def submitted(self, task: TaskView) -> None:
        """A placements.csv row at the task's submit time (0 % progress)."""
        t = iso(task.submit_time)
        self.pl.writerow([t, task.task_id, task.spec.name, "submitted", 0, "0.0",
                          repr(task.spec.total_work_samples)])

    def entry(self, e: HistoryEntry) -> None:
        """Record one exported journal entry (``Status.ExportHistory``) as a replay would
        have: node events and snapshots get a step row; a submission gets its ``submitted``
        row then its decision's placement rows; a cancellation or a run report its placement rows. Entries
        without a decision (journal kinds this writer does not know) are skipped."""
        if e.decision is None:
            return
        if e.kind in NODE_EVENT_KINDS:
            self.node_event(e.decision)
            return
        if e.kind == "submit" and e.task is not None:
            self.submitted(e.task)
        self.decision(e.decision, None)

    def close(self) -> None:
        """Flush and close both CSV files."""
        self.steps_fh.close()
        self.pl_fh.close()

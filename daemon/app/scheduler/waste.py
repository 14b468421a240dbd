"""Wasted work, named (docs/execution.md, "Wasted work"): samples trained again after restarts
that did not resume from the latest reported checkpoint, failed runs in a row that made no
progress, processes that ignored the stop signal or outran the final grace, each noted as a
warning on the task (``Task.warnings``) that ``offcut show``, ``offcut watch`` and the task's
answers carry.

Every figure here is measured: reports of the task's own processes (``samples_done`` as of a
checkpoint) and the launcher's run reports; nothing is modelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from offcut.daemon.app.model import Task

if TYPE_CHECKING:
    from offcut.daemon.app.scheduler.outcome import Outcome

#: warnings one task keeps, at most (the oldest dropped first: a retention rule)
MAX_TASK_WARNINGS = 16
#: characters of a warning's text, at most
MAX_WARNING_CHARS = 1000

NO_CHECKPOINT = "no-checkpoint"
CRASH_LOOP = "crash-loop"
STOP_IGNORED = "stop-ignored"
FINAL_GRACE = "final-grace"
#: the kinds, as ``TaskWarning.kind`` names them
WARNING_KINDS = (NO_CHECKPOINT, CRASH_LOOP, STOP_IGNORED, FINAL_GRACE)


def note_warning(task: Task, kind: str, message: str, t: float,
                 out: "Outcome | None" = None) -> bool:
    """Add a warning of ``kind`` (one of :data:`WARNING_KINDS`) about ``task``'s current
    generation at event time ``t`` [s]: once per kind and generation (a repeat replaces the
    text), at most :data:`MAX_TASK_WARNINGS` kept; also in ``out.warnings`` (the event's
    placement update: ``offcut watch``). Returns whether it was new."""
    entry = {"kind": kind, "message": message[:MAX_WARNING_CHARS], "time": float(t),
             "generation": int(task.generation)}
    if out is not None:
        out.warnings.append((task.task_id, entry))
    for i, w in enumerate(task.warnings):
        if w["kind"] == kind and w["generation"] == task.generation:
            task.warnings[i] = entry
            return False
    task.warnings.append(entry)
    del task.warnings[:-MAX_TASK_WARNINGS]
    return True


def note_report(task: Task, samples_done: float, t: float,
                out: "Outcome | None" = None) -> None:
    """Account a progress report of ``samples_done`` [samples] (its checkpoint): the first
    report of a generation below the most ever reported means that generation did not
    resume from the latest reported checkpoint; at least the difference is trained again
    (``samples_redone``) and a ``no-checkpoint`` warning names it."""
    high = task.reported_high
    if task.report_generation != task.generation and samples_done < high:
        lost = high - samples_done
        task.samples_redone += lost
        note_warning(task, NO_CHECKPOINT,
                     f"generation {task.generation} reported {samples_done:,.0f} samples, below "
                     f"the {high:,.0f} reported before: it did not resume from the latest "
                     f"checkpoint ({lost:,.0f} samples or more trained again; "
                     f"{task.samples_redone:,.0f} so far)", t, out)
    task.report_generation = task.generation
    task.reported_high = max(high, float(samples_done))


def note_failure(task: Task, t: float, loop_after: int, out: "Outcome | None" = None) -> int:
    """Account a failed run of ``task``'s current generation: ``failed_runs`` counts every
    one; ``failures_without_progress`` counts the failures in a row that reported no more
    samples than the previous failure had (a failure after progress starts a new count of
    1). A ``crash-loop`` warning names the second such failure in a row, and also
    ``loop_after`` failed runs in all (runs that crash again and again though each got
    further: the task goes on, but its owner should know). Returns
    ``failures_without_progress``."""
    task.failed_runs += 1
    progress = task.reported_high
    if progress > task.failure_progress:
        task.failures_without_progress = 1
    else:
        task.failures_without_progress += 1
    task.failure_progress = progress
    if task.failures_without_progress >= 2:
        note_warning(task, CRASH_LOOP,
                     f"{task.failures_without_progress} runs in a row failed without progress "
                     f"beyond {progress:,.0f} reported samples; the last: {task.last_run}", t,
                     out)
    elif task.failed_runs >= loop_after:
        note_warning(task, CRASH_LOOP,
                     f"{task.failed_runs} runs failed so far, each restarted from its latest "
                     f"checkpoint (the last at {progress:,.0f} reported samples): "
                     f"{task.last_run}", t, out)
    return task.failures_without_progress

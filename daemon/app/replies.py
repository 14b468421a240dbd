"""What the application answers: builders of the views of :mod:`offcut.views` (decisions,
task views, energy, learned models) from the engine's state, and the journal's stored form of
a reply (docs/architecture.md, "Durability").

Nothing here knows the wire: :mod:`offcut.wire.tasks` converts the views to ``offcut.v1``
messages at the gRPC edge, outside the engine's lock. The engine builds them under its lock
(they are copies, so a servicer may convert them at leisure) and stores each applied event's
:class:`Reply` in the journal as JSON (:meth:`Reply.to_record`), so a repeated request gets
the answer it got the first time and ``ExportHistory`` serves the history, whatever the
protocol's version.

Journal reply format (``REPLY_FORMAT``): ``{"format": 2, "decision": {...}, "tasks":
[...]}``, the fields of :class:`~offcut.views.Decision` and :class:`~offcut.views.TaskView`
by name (times in s since the epoch, None where unset), as state-file format 4 (the first
released one) stores it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from offcut.daemon.app.model import Task
from offcut.views import (MEASURED, MODELLED, Decision, EnergyView, EventFigures,
                          MeasuredCount, ModelView, SolveSummary, TaskView, TaskWarning)

if TYPE_CHECKING:
    from offcut.daemon.app.scheduler import Outcome, Scheduler

#: the version of the stored reply written by this release
REPLY_FORMAT = 2


def energy_view(task: Task) -> EnergyView:
    """``task``'s :class:`EnergyView`: measured once any of its processes reported, with the
    samples of its last progress report (else its work done); else modelled, with its work
    done [samples]."""
    ledger = task.energy
    if ledger is None or not ledger.measured:
        joules, samples = task.energy_j, task.work_done
        return EnergyView(MODELLED, joules, samples / joules if joules > 0 else 0.0)
    last = task.learner.last_report if task.learner is not None else None
    samples = last[1] if last is not None else task.work_done
    joules = ledger.total_j
    g, g_joules, g_ranks, g_size = ledger.last()
    return EnergyView(MEASURED, joules, samples / joules if joules > 0 else 0.0,
                      generations_reported=ledger.generations, last_generation=g,
                      last_generation_joules=g_joules, last_generation_ranks=g_ranks,
                      last_generation_world_size=g_size)


def model_view(task: Task, scheduler: "Scheduler") -> ModelView | None:
    """What the task's learner knows (None for a task without reports)."""
    learner = task.learner
    if learner is None:
        return None
    up, down = scheduler.rescale_costs(task)
    measured_up, measured_down = learner.measured_rescale_s()
    view = ModelView(rescale_up_s=up, rescale_down_s=down, measured_rescale_up_s=measured_up,
                     measured_rescale_down_s=measured_down, measured=[
                         MeasuredCount(nodes=n, samples_per_s=m["rate"], seconds=m["seconds"],
                                       power_w=m["power_w"] or 0.0)
                         for n, m in sorted(learner.measured().items())])
    last = learner.last_report
    if last is not None:
        view.last_report_time, view.last_samples_done, view.last_energy_j = last
    view.measured_rescale_lost_s, view.measured_rescales = learner.rescale_loss()
    if task.spec.learned and not task.state.finished:
        ns, ps = scheduler.learned_curve(task)
        view.curve_node_counts = [int(n) for n in ns]
        view.curve_throughputs = [float(p) for p in ps]
        prior = scheduler.prior_rate()
        bands = [learner.band(int(n), prior) for n in ns]
        view.curve_low = [b[0] for b in bands]
        view.curve_high = [b[2] for b in bands]
    return view


def task_view(task: Task, scheduler: "Scheduler") -> TaskView:
    """A copy of ``task`` as answered, its progress projected to the scheduler's clock."""
    return TaskView(
        task_id=task.task_id, spec=task.spec, owner=task.owner, state=task.state,
        submit_time=task.submit_time, admit_time=task.admit_time,
        finish_time=task.finish_time, nodes=list(task.nodes),
        work_done_samples=task.work_done, rate_samples_per_s=task.rate,
        rescales=task.rescales, preemptions=task.preemptions, launches=task.launches,
        last_run=task.last_run, generation=task.generation, failed_runs=task.failed_runs,
        failure_reason=task.failure_reason, energy_j=task.energy_j, power_w=task.power,
        model=model_view(task, scheduler), energy=energy_view(task),
        samples_redone=task.samples_redone,
        failures_without_progress=task.failures_without_progress,
        warnings=[TaskWarning.of(task.task_id, w) for w in task.warnings],
        work_reached_time=task.work_reached_time,
        started_generation=task.started_generation, generation_time=task.generation_time)


def decision_of(out: "Outcome", requested_solver: str,
                sent_time: float | None = None) -> Decision:
    """The decision of an applied event's :class:`~offcut.daemon.app.scheduler.Outcome`;
    ``sent_time`` [s since epoch]: the event's time as its sender stamped it (None: none)."""
    solve = SolveSummary(requested_solver=requested_solver, solves=len(out.solves),
                         solve_ms=sum(s.solve_ms for s in out.solves))
    if out.solves:
        last = out.solves[-1]
        solve.solver, solve.objective, solve.bound = last.solver, last.objective, last.bound
        reasons = [s.fallback_reason for s in out.solves if s.fallback_reason]
        solve.status = "fallback" if reasons else last.status
        solve.fallback_reason = reasons[-1] if reasons else ""
    stats = EventFigures(tasks_completed=len(out.completed_task_ids), **{
        f.name: getattr(out, f.name) for f in fields(EventFigures) if f.name != "tasks_completed"})
    return Decision(time=out.time, source=out.source, seq=out.seq, revision=out.revision,
                    placements=list(out.placements), stats=stats,
                    solve=solve, ignored_nodes=list(out.ignored_nodes),
                    completed_task_ids=list(out.completed_task_ids), sent_time=sent_time,
                    warnings=[TaskWarning.of(task_id, w) for task_id, w in out.warnings])


@dataclass
class Reply:
    """The answer to one applied event: its decision, and the tasks it answers about (the
    submitted, cancelled or reported task; every task of a progress report; none for node
    events). ``duplicate``: a repeated request answered from the journal."""

    decision: Decision
    tasks: list[TaskView] = field(default_factory=list)
    duplicate: bool = False

    def to_record(self) -> bytes:
        """The journal's stored form (format :data:`REPLY_FORMAT`, UTF-8 JSON)."""
        return json.dumps({"format": REPLY_FORMAT, "decision": self.decision.to_dict(),
                           "tasks": [t.to_dict() for t in self.tasks]},
                          separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, stored: bytes) -> "Reply":
        """Inverse of :meth:`to_record`; ValueError for another format or undecodable data."""
        d = json.loads(bytes(stored).decode())
        if not isinstance(d, dict) or d.get("format") != REPLY_FORMAT:
            raise ValueError(f"stored reply of format {d.get('format') if isinstance(d, dict) else '?'}"
                             f", this release reads format {REPLY_FORMAT}")
        return cls(decision=Decision.from_dict(d["decision"]),
                   tasks=[TaskView.from_dict(t) for t in d["tasks"]])

"""The checks a task's progress report must pass before its learner records it (issue "Learn
scalability online"; the rules are :meth:`offcut.daemon.app.learning.TaskLearner.check`'s).

A report (:class:`~offcut.daemon.app.model.ProgressReport`: ``time`` [s since epoch],
``samples_done`` [samples, cumulative], ``nodes`` [count], ``energy_j`` [J, cumulative, or
None]) is checked in two steps, always in this order so that the first problem found is the
one reported:

1. :func:`parse_report`: each value on its own (``InvalidArgument``: not a number, not finite,
   out of range, ``nodes`` not an integer);
2. :func:`check_history`: the values against the task's history (``FailedPrecondition``: a
   cumulative figure went backwards while the same processes ran, or ``nodes`` is not a count
   the task held since its last report). Across a restart (the processes stopped since the
   last report) ``samples_done`` and ``energy_j`` may be lower: the new generation resumed
   from an older checkpoint, or from none (docs/execution.md, "Wasted work").

Both raise before anything changes; the error's ``field`` is the caller's prefix plus the
report's field name.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

from offcut.daemon.app.model import ProgressReport
from offcut.taskspec import check_finite
from offcut.errors import FailedPrecondition, InvalidArgument

#: (time [s], samples, nodes, energy [J] or None) of a report that passed the checks
Figures = tuple[float, float, int, "float | None"]


class ReportHistory(Protocol):
    """What :func:`check_history` reads of a task's history (see
    :class:`offcut.daemon.app.learning.timeline.ReportTimeline`)."""

    #: (time [s], samples) of the last accepted report, or None
    last: tuple[float, float] | None
    #: the highest energy [J] reported so far, or None
    max_energy_j: float | None
    #: when the processes stopped since the last report [s], or None (the same ones run)
    paused: float | None

    def held(self) -> list[int]:
        """The node counts the task held since its last report, sorted."""


def fmt_number(x: float) -> str:
    """A number for an error message: short when that is exact, else repr."""
    short = format(x, ".15g")
    return short if float(short) == x else repr(float(x))


def real_number(value: Any, field: str) -> float:
    """``value`` as a finite float. Raises :class:`InvalidArgument` naming ``field`` when it
    is a bool, not a number (:func:`float` refuses it) or not finite."""
    if isinstance(value, bool):
        raise InvalidArgument(f"must be a number, got {value!r}", field)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"must be a number, got {value!r}", field) from None
    return check_finite(x, field)


def parse_report(report: ProgressReport, p: str) -> Figures:
    """The report's figures (time [s] > 0, samples >= 0, nodes >= 0, energy [J] >= 0 or None),
    each checked on its own. Raises :class:`InvalidArgument` (field ``p`` + name)."""
    t = real_number(report.time, p + "time")
    if t <= 0:
        raise InvalidArgument(f"must be > 0 [s since epoch], got {fmt_number(t)}", p + "time")
    s = real_number(report.samples_done, p + "samples_done")
    if s < 0:
        raise InvalidArgument(f"must be >= 0, got {fmt_number(s)}", p + "samples_done")
    e = None
    if report.energy_j is not None:
        e = real_number(report.energy_j, p + "energy_j")
        if e < 0:
            raise InvalidArgument(f"must be >= 0 [J], got {fmt_number(e)}", p + "energy_j")
    if isinstance(report.nodes, bool):
        raise InvalidArgument(f"must be an integer, got {report.nodes!r}", p + "nodes")
    try:
        n = operator.index(report.nodes)
    except TypeError:
        raise InvalidArgument(f"must be an integer, got {report.nodes!r}",
                              p + "nodes") from None
    if n < 0:
        raise InvalidArgument(f"must be >= 0, got {n}", p + "nodes")
    return t, s, n, e


def check_history(figures: Figures, history: ReportHistory, p: str) -> None:
    """Check parsed ``figures`` against ``history``: time may not go back; samples and energy
    may not go down unless the processes restarted since the last report
    (``history.paused``); ``nodes`` must be among :meth:`ReportHistory.held`. Raises
    :class:`FailedPrecondition` (field ``p`` + name)."""
    t, s, n, e = figures
    restarted = history.paused is not None and history.paused < t
    if history.last is not None:
        t0, s0 = history.last
        if t < t0:
            raise FailedPrecondition(f"went back from {fmt_number(t0)} (the last report's) to "
                                     f"{fmt_number(t)}", p + "time")
        if s < s0 and not restarted:
            raise FailedPrecondition(f"went down from {fmt_number(s0)} to {fmt_number(s)}",
                                     p + "samples_done")
    max_e = history.max_energy_j
    if e is not None and max_e is not None and e < max_e and not restarted:
        raise FailedPrecondition(f"went down from {fmt_number(max_e)} to {fmt_number(e)}",
                                 p + "energy_j")
    held = history.held()
    if n not in held:
        shown = ", ".join(str(c) for c in held[:20]) + (", ..." if len(held) > 20 else "")
        since = (f"since its last report at {fmt_number(history.last[0])}"
                 if history.last is not None else "since it was submitted")
        raise FailedPrecondition(f"task held {shown} nodes {since}, not {n}", p + "nodes")


def check_report(report: ProgressReport, history: ReportHistory, p: str = "") -> Figures:
    """:func:`parse_report` then :func:`check_history`; returns the figures."""
    figures = parse_report(report, p)
    check_history(figures, history, p)
    return figures

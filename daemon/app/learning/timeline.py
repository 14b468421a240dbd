"""A task's timeline of progress reports and node-count changes: which report intervals are
clean (issue "Learn scalability online"; the rules are in the "Measurements" section of
:mod:`offcut.daemon.app.learning`).

:class:`ReportTimeline` holds what happened since the task's last accepted report: the changes
of its node count (:meth:`ReportTimeline.on_allocation`), a pause of its processes
(:meth:`ReportTimeline.on_pause`), and the last report's time, samples and energy. For a new
report it cuts out the :class:`Interval` since the last one (:meth:`ReportTimeline.interval`),
which says whether the interval is clean or holds exactly one change; once the interval is
measured, :meth:`ReportTimeline.close` consumes it.

Units: times in s since the epoch, samples cumulative, energy in J (cumulative), node counts.
"""

from __future__ import annotations

import bisect
import math
import operator
from dataclasses import dataclass
from typing import Any

#: kinds of :meth:`ReportTimeline.on_allocation`
KINDS = ("start", "grow", "shrink", "stop", "preempted")
#: allocation changes kept between two reports (older ones make the interval unclean)
MAX_PENDING_ALLOCATIONS = 64


@dataclass(frozen=True)
class Interval:
    """The interval from the last accepted report (``t0`` [s], ``s0`` samples, ``e0`` [J];
    ``t0``/``s0`` None before the first report) to a new one (``t``, ``s``, ``n`` nodes, ``e``).

    ``c0``: the count in effect right after the last report; ``inside``: the changes
    ``[time, count, kind]`` that fell inside the interval (time-ordered); ``carried``: those that
    belong to the next one; ``overflow``: changes were dropped since the last report (the
    interval cannot be trusted); ``paused``: when the processes stopped inside it, or None.
    """

    t0: float | None
    s0: float | None
    e0: float | None
    t: float
    s: float
    n: int
    e: float | None
    c0: int
    inside: list[list]
    carried: list[list]
    overflow: bool
    paused: float | None

    @property
    def dt(self) -> float:
        """Length [s] (only for an interval after a first report)."""
        return self.t - self.t0

    @property
    def ds(self) -> float:
        """Samples done in it (only for an interval after a first report)."""
        return self.s - self.s0

    @property
    def measurable(self) -> bool:
        """It follows a report, has a positive length and no dropped change."""
        return self.t0 is not None and self.dt > 0 and not self.overflow

    @property
    def clean(self) -> bool:
        """No change and no pause inside, and the count n > 0 held throughout."""
        return (self.measurable and not self.inside and self.c0 == self.n and self.n > 0
                and self.paused is None)

    def energy_delta(self) -> float | None:
        """Energy [J] drawn in it when both ends carry energy, else None."""
        return self.e - self.e0 if self.e is not None and self.e0 is not None else None


class ReportTimeline:
    """Node-count changes and pauses since a task's last report, and that report's figures.

    Attributes (all JSON-able through :meth:`to_dict`): ``count`` the latest count set;
    ``count_at_last`` the count in effect at the last report's time; ``paused`` [s] when the
    processes stopped since the last report (None: not); ``last`` (time [s], samples) of the
    last report; ``last_energy_j`` its energy [J] (None: not measured); ``max_energy_j`` the
    latest reported energy [J]; ``allocations`` the changes ``[time, count, kind]`` not yet
    covered by a report, time-ordered; ``overflow_time`` [s] the latest dropped change (None:
    none dropped); ``dropped`` the counts held across dropped changes.
    """

    def __init__(self) -> None:
        self.count = 0
        self.count_at_last = 0
        self.paused: float | None = None
        self.last: tuple[float, float] | None = None
        self.last_energy_j: float | None = None
        self.max_energy_j: float | None = None
        self.allocations: list[list] = []
        self.overflow_time: float | None = None
        self.dropped: list[int] = []

    # ------------------------------------------------------------------ events
    def on_allocation(self, time: float, count: int, kind: str) -> None:
        """Record that the node count changed to ``count`` at ``time`` [s since epoch] (see
        :meth:`offcut.daemon.app.learning.TaskLearner.on_allocation`). Raises ValueError for an
        unknown kind, a negative count or a non-finite time."""
        if kind not in KINDS:
            raise ValueError(f"unknown allocation kind {kind!r} (one of {', '.join(KINDS)})")
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"node count must be >= 0, got {count}")
        t = float(time)
        if not math.isfinite(t):
            raise ValueError(f"allocation time must be finite, got {time!r}")
        if self.allocations:
            t = max(t, self.allocations[-1][0])
        elif self.last is not None:
            t = max(t, self.last[0])
        self.allocations.append([t, count, kind])
        if len(self.allocations) > MAX_PENDING_ALLOCATIONS:
            dropped = self.allocations.pop(0)
            if self.count_at_last not in self.dropped:
                self.dropped.append(self.count_at_last)
            self.count_at_last = int(dropped[1])
            self.overflow_time = float(dropped[0])
        self.count = count

    def on_pause(self, time: float) -> None:
        """Record that the processes stopped at ``time`` [s since epoch] (the first pause
        since the last report counts). Raises ValueError for a non-finite time."""
        t = float(time)
        if not math.isfinite(t):
            raise ValueError(f"pause time must be finite, got {time!r}")
        if self.paused is None:
            self.paused = t

    def held(self) -> list[int]:
        """The counts the task held since its last report, sorted."""
        return sorted({self.count_at_last, *self.dropped, *(a[1] for a in self.allocations)})

    # ------------------------------------------------------------------ intervals
    def interval(self, t: float, s: float, n: int, e: float | None) -> Interval:
        """The interval a checked report (``t`` [s], ``s`` samples, ``n`` nodes, ``e`` [J] or
        None) closes; changes nothing. A report of the generation that still ran on the old
        count after a decision moves the changes inside to its time (they take effect after
        it; module docstring of :mod:`offcut.daemon.app.learning`)."""
        k = bisect.bisect_left([a[0] for a in self.allocations], t)  # changes before t
        inside, carried = self.allocations[:k], self.allocations[k:]
        if (inside and self.last is not None and n == self.count_at_last
                and n != inside[-1][1]):
            # a report of the generation that still ran on the old count after the decision
            # (docs/execution.md: it stops, checkpoints and reports, then the next starts):
            # the changes take effect after this report, which closes a clean interval
            carried = [[t, c, kind] for _, c, kind in inside] + carried
            inside = []
        paused = self.paused if self.paused is not None and self.paused < t else None
        t0, s0 = self.last if self.last is not None else (None, None)
        return Interval(t0, s0, self.last_energy_j, t, s, n, e, self.count_at_last, inside,
                        carried, self.overflow_time is not None, paused)

    def close(self, iv: Interval) -> None:
        """Consume ``iv`` (from :meth:`interval`, nothing changed since): its report becomes
        the last one."""
        if iv.inside:
            self.count_at_last = int(iv.inside[-1][1])
        self.allocations = iv.carried
        if iv.overflow and self.overflow_time < iv.t:
            self.overflow_time = None
            self.dropped = []
        self.last = (iv.t, iv.s)
        self.last_energy_j = iv.e
        if iv.paused is not None:
            self.paused = None
        if iv.e is not None:
            self.max_energy_j = iv.e

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The fields of :meth:`offcut.daemon.app.learning.TaskLearner.to_dict` this holds, in
        that order, but for ``paused`` (the learner stores it last: it came with generations)."""
        return {
            "count": self.count,
            "count_at_last": self.count_at_last,
            "last": list(self.last) if self.last is not None else None,
            "last_energy_j": self.last_energy_j,
            "max_energy_j": self.max_energy_j,
            "allocations": [list(a) for a in self.allocations],
            "overflow_time": self.overflow_time,
            "dropped_counts": list(self.dropped),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReportTimeline":
        """Inverse of :meth:`to_dict`; ``paused`` stays None (the learner restores it)."""
        x = cls()
        x.count = int(d["count"])
        x.count_at_last = int(d["count_at_last"])
        x.last = (float(d["last"][0]), float(d["last"][1])) if d["last"] is not None else None
        x.last_energy_j = opt_float(d["last_energy_j"])
        x.max_energy_j = opt_float(d["max_energy_j"])
        x.allocations = [[float(t), int(c), str(k)] for t, c, k in d["allocations"]]
        x.overflow_time = opt_float(d["overflow_time"])
        x.dropped = [int(c) for c in d["dropped_counts"]]
        return x


def opt_float(x: Any) -> float | None:
    """``x`` as a float, None kept."""
    return None if x is None else float(x)

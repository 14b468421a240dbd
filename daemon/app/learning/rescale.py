"""A task's learned rescale costs Tcup and Tcdw (issue "Learn scalability online"; the rules
are in the "Measurements" section of :mod:`offcut.daemon.app.learning`).

Source: BFTrainer (Liu et al., arXiv 2106.12091, Section 3): growing a task from c nodes costs
Ps(c) * Tcup samples, shrinking it or losing nodes to preemption Ps(c) * Tcdw.

A report interval (t0, s0) -> (t1, s1) with exactly one change c -> n at t_r (c > 0, n > 0,
``grow``: up, ``shrink``/``preempted``: down, the report's ``nodes`` == n) lost
L = r(c) (t_r - t0) + r(n) (t1 - t_r) - (s1 - s0) samples, so T = L / r(c) seconds, clipped to
[0, (t1 - t_r) r(n) / r(c)]. It waits (the last :data:`MAX_PENDING_RESCALES`) until clean
rates at c and n exist and is valued with the rates measured then. The learned cost is the
median of the last :data:`MAX_RESCALE_ESTIMATES` estimates of its direction.

Units: times [s], samples, rates [samples/s].
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from offcut.daemon.app.learning.timeline import Interval
from offcut.daemon.app.learning.throughput import MAX_INTERVAL_S, ThroughputStats

#: rescale intervals kept waiting for the rates at both counts
MAX_PENDING_RESCALES = 64
#: rescale estimates kept per direction (the median is over these)
MAX_RESCALE_ESTIMATES = 128


class RescaleCosts:
    """Rescale intervals waiting for their rates, and the estimates [s] per direction.

    ``pending``: the waiting intervals as ``{"up": bool, "from": c, "to": n, "t0": s,
    "tr": s, "t1": s, "samples": samples}`` (the persisted form); ``up`` / ``down``: the
    estimates of Tcup / Tcdw [s], oldest first; ``lost_s`` / ``valued``: the sum of every
    estimate ever valued [s] and how many (the task's measured time lost to rescales and
    preemptions: docs/execution.md, "Wasted work").
    """

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.up: list[float] = []
        self.down: list[float] = []
        self.lost_s = 0.0
        self.valued = 0

    def record(self, iv: Interval) -> bool:
        """Keep ``iv`` when it is a rescale interval (one grow, shrink or preemption inside,
        reported at the new count); True if it was kept. The loss counts from the pause when
        the processes stopped before the change."""
        if not (iv.measurable and len(iv.inside) == 1):
            return False
        tr, c1, kind = iv.inside[0]
        if iv.paused is not None and iv.t0 <= iv.paused < tr:
            tr = iv.paused  # the loss began when the processes stopped
        c0 = iv.c0
        up = kind == "grow" and c1 > c0
        down = kind in ("shrink", "preempted") and c1 < c0
        if not (c0 > 0 and c1 > 0 and iv.n == c1 and (up or down) and iv.dt <= MAX_INTERVAL_S):
            return False
        self.pending.append({"up": up, "from": c0, "to": c1, "t0": iv.t0, "tr": tr,
                             "t1": iv.t, "samples": iv.ds})
        del self.pending[:-MAX_PENDING_RESCALES]
        return True

    def resolve(self, stats: ThroughputStats) -> bool:
        """Value the pending intervals whose two counts are measured in ``stats``; True if an
        estimate was added."""
        added = False
        keep = []
        for p in self.pending:
            a, b = stats.get(p["from"]), stats.get(p["to"])
            if a is None or b is None:
                keep.append(p)
                continue
            rc, rn = a.rate, b.rate
            if not rc > 0:
                continue  # a loss cannot be valued in seconds of a zero rate
            lost = rc * (p["tr"] - p["t0"]) + rn * (p["t1"] - p["tr"]) - p["samples"]
            hi = (p["t1"] - p["tr"]) * rn / rc
            est = min(max(lost / rc, 0.0), hi)
            if not (math.isfinite(est) and est >= 0):
                continue
            target = self.up if p["up"] else self.down
            target.append(est)
            self.lost_s += est
            self.valued += 1
            del target[:-MAX_RESCALE_ESTIMATES]
            added = True
        self.pending = keep
        return added

    def measured(self) -> tuple[float | None, float | None]:
        """``(Tcup, Tcdw)`` [s]: the medians of the estimates, None for a direction without
        one."""
        return (float(statistics.median(self.up)) if self.up else None,
                float(statistics.median(self.down)) if self.down else None)

    def to_dict(self) -> dict[str, Any]:
        """The fields of :meth:`offcut.daemon.app.learning.TaskLearner.to_dict` this holds."""
        return {
            "pending_rescales": [dict(p) for p in self.pending],
            "rescale_up_s": list(self.up),
            "rescale_down_s": list(self.down),
            "rescale_lost_s": self.lost_s,
            "rescales_valued": self.valued,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RescaleCosts":
        """Inverse of :meth:`to_dict`."""
        x = cls()
        x.pending = [{"up": bool(p["up"]), "from": int(p["from"]), "to": int(p["to"]),
                      "t0": float(p["t0"]), "tr": float(p["tr"]), "t1": float(p["t1"]),
                      "samples": float(p["samples"])} for p in d["pending_rescales"]]
        x.up = [float(v) for v in d["rescale_up_s"]]
        x.down = [float(v) for v in d["rescale_down_s"]]
        x.lost_s = float(d.get("rescale_lost_s", 0.0))  # (absent in states before issue 38)
        x.valued = int(d.get("rescales_valued", 0))
        return x

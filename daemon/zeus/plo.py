"""Zeus's power-limit optimizer for one (job, batch size) (Zeus, NSDI '23, Section 4.1 "JIT
profiling"; Zeus's ``GlobalPowerLimitOptimizer``; docs/zeus.md, "The power-limit optimizer").

The daemon plans and decides; the training side sets the limits (pynvml) and measures. The plan
walks the power limits from the maximum down to the minimum in ``step_w`` steps; at each limit
the training side runs ``warmup_steps`` steps, then measures time [s] and energy [J] over
``profile_steps`` steps and reports the window. A window cut short (end of epoch, preemption) is
reported as interrupted and planned again. Once every limit is measured, a selector picks the
limit that every later run of this batch size uses:

- ``zeus_cost``: minimum ``eta * E + (1 - eta) * MaxPower * T`` (Zeus Eq. 2; MaxPower is the
  job's ``max_power_w``);
- ``energy``: minimum energy; ``time``: minimum time;
- ``max_slowdown``: the lowest limit whose time is within ``max_slowdown_factor`` of the time
  at the maximum limit.
"""

from __future__ import annotations

from typing import Any

from offcut.taskspec import check_finite
from offcut.zeus_views import zeus_cost
from offcut.errors import FailedPrecondition, InvalidArgument
from offcut.zeus_views import PowerLimitSpec, PowerMeasurement, PowerPlan, PowerProfile

_LIMIT_TOLERANCE_W = 1e-6


class PowerLimitProfile:
    """The profiling state of one (job, batch size): measured windows and the chosen limit.

    ``max_power_w`` [W] is the MaxPower of the ``zeus_cost`` selector (the job's).
    """

    def __init__(self, spec: PowerLimitSpec, max_power_w: float):
        self.spec = spec
        self.max_power_w = max_power_w
        self.limits = spec.power_limits()
        self.windows: dict[float, tuple[float, float]] = {}  # limit -> (time_s, energy_j)
        self.interruptions = 0
        self.chosen_power_limit_w: float | None = None

    @property
    def done(self) -> bool:
        """Whether every limit is measured and one is chosen."""
        return self.chosen_power_limit_w is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state."""
        return {"spec": self.spec.to_dict(), "max_power_w": self.max_power_w,
                "windows": [[w, t, e] for w, (t, e) in self.windows.items()],
                "interruptions": self.interruptions, "chosen": self.chosen_power_limit_w}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PowerLimitProfile":
        """Inverse of :meth:`to_dict`."""
        p = cls(PowerLimitSpec.from_dict(d["spec"]), d["max_power_w"])
        p.windows = {float(w): (float(t), float(e)) for w, t, e in d["windows"]}
        p.interruptions = int(d["interruptions"])
        p.chosen_power_limit_w = d["chosen"]
        return p

    def _next_limit(self) -> float:
        return self.limits[len(self.windows)]

    def plan(self) -> PowerPlan:
        """The chosen limit once done, else the next window to profile."""
        if self.done:
            return PowerPlan("use", self.chosen_power_limit_w)
        return PowerPlan("profile", self._next_limit(), self.spec.warmup_steps,
                         self.spec.profile_steps)

    def _check_expected(self, power_limit_w: float) -> None:
        check_finite(power_limit_w, "power_limit_w")
        s = self.spec
        if not (s.min_power_limit_w - _LIMIT_TOLERANCE_W <= power_limit_w
                <= s.max_power_limit_w + _LIMIT_TOLERANCE_W):
            raise InvalidArgument(f"{power_limit_w} W is outside the device's range "
                                  f"[{s.min_power_limit_w}, {s.max_power_limit_w}] W",
                                  "power_limit_w")
        if self.done:
            raise FailedPrecondition(f"profiling is done (chosen {self.chosen_power_limit_w} W); "
                                     "no window is expected", "power_limit_w")
        expected = self._next_limit()
        if abs(power_limit_w - expected) > _LIMIT_TOLERANCE_W:
            raise FailedPrecondition(f"the window being profiled is at {expected} W, not "
                                     f"{power_limit_w} W", "power_limit_w")

    def report_window(self, power_limit_w: float, time_s: float, energy_j: float) -> PowerPlan:
        """Record the window measured at ``power_limit_w``: ``time_s`` [s] and ``energy_j`` [J]
        over ``profile_steps`` steps; after the last limit, choose. Returns the next plan.

        Raises:
            InvalidArgument: a limit outside the device's range; time or energy not > 0 or
                not finite.
            FailedPrecondition: the limit is not the one being profiled, or profiling is done.
        """
        self._check_expected(power_limit_w)
        check_finite(time_s, "time_s", positive=True)
        check_finite(energy_j, "energy_j", positive=True)
        self.windows[self._next_limit()] = (float(time_s), float(energy_j))
        if len(self.windows) == len(self.limits):
            self.chosen_power_limit_w = self._select()
        return self.plan()

    def interrupt(self, power_limit_w: float) -> PowerPlan:
        """The window at ``power_limit_w`` was cut short: it is planned again.

        Raises: as :meth:`report_window` for the limit.
        """
        self._check_expected(power_limit_w)
        self.interruptions += 1
        return self.plan()

    def score(self, power_limit_w: float) -> float:
        """The selector's score of a measured limit (lower is better; for ``max_slowdown`` the
        slowdown against the maximum limit)."""
        time_s, energy_j = self.windows[power_limit_w]
        selector = self.spec.selector
        if selector == "zeus_cost":
            return zeus_cost(energy_j, time_s, self.spec.eta_knob, self.max_power_w)
        if selector == "energy":
            return energy_j
        if selector == "time":
            return time_s
        return time_s / self.windows[self.limits[0]][0]

    def _select(self) -> float:
        if self.spec.selector == "max_slowdown":
            feasible = [w for w in self.windows
                        if self.score(w) <= self.spec.max_slowdown_factor]
            return min(feasible)
        return min(self.windows, key=self.score)

    def measurements(self) -> list[dict[str, float]]:
        """Measured windows, highest limit first: ``power_limit_w``, ``time_s``, ``energy_j``,
        ``cost`` (the selector's score)."""
        return [{"power_limit_w": w, "time_s": t, "energy_j": e, "cost": self.score(w)}
                for w, (t, e) in self.windows.items()]

    def view(self, job_id: str, batch_size: int) -> PowerProfile:
        """This profile as GetProfile shows it, a copy later windows do not change (chosen
        limit [W], 0 while profiling)."""
        return PowerProfile(job_id, batch_size, self.done, self.chosen_power_limit_w or 0.0,
                            tuple(PowerMeasurement(**m) for m in self.measurements()))

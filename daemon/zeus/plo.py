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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from offcut.daemon.app.model import check_finite
from offcut.daemon.zeus.cost import zeus_cost
from offcut.errors import FailedPrecondition, InvalidArgument

SELECTORS = ("zeus_cost", "energy", "time", "max_slowdown")
#: most power limits one profile walks through, unless the caller says otherwise
#: (the daemon passes its ``max_power_limits`` setting)
DEFAULT_MAX_POWER_LIMITS = 1000
_LIMIT_TOLERANCE_W = 1e-6


@dataclass(frozen=True)
class PowerLimitSpec:
    """How to profile: the device's range [W] (per GPU, as pynvml reports it), the stride
    ``step_w`` [W], steps per window, the selector and its parameters."""

    min_power_limit_w: float
    max_power_limit_w: float
    eta_knob: float
    selector: str = "zeus_cost"
    step_w: float = 25.0
    warmup_steps: int = 10
    profile_steps: int = 40
    max_slowdown_factor: float = 1.1

    @classmethod
    def create(cls, max_power_limits: int = DEFAULT_MAX_POWER_LIMITS, **fields: Any
               ) -> "PowerLimitSpec":
        """Validate the fields.

        Raises:
            InvalidArgument: naming the field (a range with min > max or min <= 0, a step
                <= 0, more than ``max_power_limits`` limits to profile,
                ``profile_steps`` < 1, ``warmup_steps`` < 0, an unknown selector,
                ``eta_knob`` outside [0, 1], ``max_slowdown_factor`` < 1).
        """
        lo = check_finite(fields.get("min_power_limit_w", math.nan), "min_power_limit_w",
                          positive=True)
        hi = check_finite(fields.get("max_power_limit_w", math.nan), "max_power_limit_w",
                          positive=True)
        if lo > hi:
            raise InvalidArgument(f"{lo} W is above max_power_limit_w {hi} W", "min_power_limit_w")
        step = check_finite(fields.get("step_w", 25.0), "step_w", positive=True)
        steps = (hi - lo) / step  # may overflow to inf for a tiny step
        if not steps + 1 <= max_power_limits:
            raise InvalidArgument(f"walks {steps + 1:.6g} power limits from {hi} W down to "
                                  f"{lo} W, more than max_power_limits ({max_power_limits})",
                                  "step_w")
        if int(fields.get("warmup_steps", 10)) < 0:
            raise InvalidArgument(f"must be >= 0, got {fields['warmup_steps']}", "warmup_steps")
        if int(fields.get("profile_steps", 40)) < 1:
            raise InvalidArgument(f"must be >= 1, got {fields['profile_steps']}", "profile_steps")
        if fields.get("selector", "zeus_cost") not in SELECTORS:
            raise InvalidArgument(f"{fields['selector']!r} is not one of {list(SELECTORS)}",
                                  "selector")
        eta = check_finite(fields.get("eta_knob", math.nan), "eta_knob")
        if not 0.0 <= eta <= 1.0:
            raise InvalidArgument(f"must be in [0, 1], got {eta}", "eta_knob")
        factor = check_finite(fields.get("max_slowdown_factor", 1.1), "max_slowdown_factor")
        if factor < 1.0:
            raise InvalidArgument(f"must be >= 1, got {factor}", "max_slowdown_factor")
        return cls(**fields)

    def power_limits(self) -> list[float]:
        """The limits to profile [W], from the maximum down to the minimum in ``step_w``
        steps (the minimum itself only when it lies on the grid, as in Zeus)."""
        count = int(math.floor((self.max_power_limit_w - self.min_power_limit_w) / self.step_w
                               + 1e-9))
        return [self.max_power_limit_w - i * self.step_w for i in range(count + 1)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PowerLimitSpec":
        """Inverse of :meth:`to_dict` (trusted input: the state file)."""
        return cls(**d)


@dataclass(frozen=True)
class PowerPlan:
    """What the training side does next: ``action`` ``profile`` (set ``power_limit_w``, run
    ``warmup_steps``, then measure ``profile_steps`` steps) or ``use`` (run at
    ``power_limit_w``)."""

    action: str
    power_limit_w: float
    warmup_steps: int = 0
    profile_steps: int = 0


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

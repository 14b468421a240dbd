"""The energy objectives (docs/architecture.md, "Allocation"): samples per unit of Zeus's cost
``eta * energy + (1 - eta) * MAXPOWER * time`` over the look-ahead, maximised exactly by
Dinkelbach's method over the exact backends (:func:`offcut.daemon.app.solvers.fractional.solve_ratio`,
a few ``solve`` calls: the throughput optimum first, then problems with a power price).

``energy`` is eta = 1 (samples per joule of the idle pool); ``zeus_cost`` takes eta from the
settings (``eta``). Power per task: :meth:`AllocationRequest.power_values`.
"""

from __future__ import annotations

from offcut.daemon.app.model import ObjectiveSettings
from offcut.daemon.app.solvers.fractional import EnergyTerms, solve_ratio

from .base import AllocationPolicy, AllocationRequest, Solve


class EnergyPolicy(AllocationPolicy):
    """Samples per joule (eta = 1)."""

    name = "energy"

    def eta(self, settings: ObjectiveSettings) -> float:
        """Zeus's eta_knob of this objective: 1 (energy only)."""
        return 1.0

    def allocate(self, request: AllocationRequest, solve: Solve) -> list[int]:
        """The counts that maximise samples per unit of Zeus's cost (NSDI '23, Section 3), solved
        exactly by Dinkelbach's method over ``solve`` (:func:`solve_ratio`); one per task."""
        s = request.settings
        terms = EnergyTerms(eta=self.eta(s), idle_node_power_w=s.idle_node_power_w,
                            node_max_power_w=s.node_max_power_w,
                            power_values=list(request.power_values()))
        return [int(c) for c in solve_ratio(request.problem, terms, solve).counts]


class ZeusCostPolicy(EnergyPolicy):
    """Samples per unit of zeus_cost with the configured ``eta``."""

    name = "zeus_cost"

    def eta(self, settings: ObjectiveSettings) -> float:
        """The configured ``eta``."""
        return settings.eta

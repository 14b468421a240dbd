"""The Zeus time-energy cost (Zeus, NSDI '23, Section 3.1, Eq. 2)."""

from __future__ import annotations


def zeus_cost(energy_j: float, time_s: float, eta_knob: float, max_power_w: float) -> float:
    """``zeus_cost = eta * energy + (1 - eta) * MaxPower * time`` [J].

    Args:
        energy_j: energy to accuracy [J].
        time_s: time to accuracy [s].
        eta_knob: weight of energy, in [0, 1] (0 = time only, 1 = energy only).
        max_power_w: MaxPower [W]: the maximum power limit times the number of GPUs, so that
            both terms are in joules.

    Returns:
        The cost [J]. Inputs are not validated here; callers validate them at the boundary.
    """
    return eta_knob * energy_j + (1.0 - eta_knob) * max_power_w * time_s

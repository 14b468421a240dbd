"""Allocation policies: what the allocation maximises, chosen by name (the ``policy``
setting; docs/architecture.md, "Allocation policies").

Built-ins: ``throughput`` (BFTrainer), ``energy`` and ``zeus_cost`` (exact ratio objectives),
``fair_share`` (max-min fair node-hours per owner). Third-party policies: entry points of the
group ``offcut.policies``. The interface and its contract: :mod:`.base`.
"""

from .base import (AllocationPolicy, AllocationRequest, PolicyError, Solve, PolicyTask,
                   check_counts, subproblem)
from .registry import (BUILTIN_POLICIES, ENTRY_POINT_GROUP, available_policies, get_policy,
                       policy_class)

__all__ = ["AllocationPolicy", "AllocationRequest", "PolicyError", "Solve", "PolicyTask",
           "check_counts", "subproblem", "BUILTIN_POLICIES", "ENTRY_POINT_GROUP",
           "available_policies", "get_policy", "policy_class"]

"""The placement rules of a re-allocation (docs/architecture.md, "Allocation" and "Departures from
BFTrainer"): what BFTrainer's count-level model leaves open, in one replaceable place. The
problem's horizon is Tfwd; node identities follow :mod:`offcut.daemon.app.placement` (whole cabinets
kept, a task's own cabinets and the longest-idle nodes taken). A variant (an experiment outside
the product: benchmarks/horizon_oracle.py) subclasses :class:`PlacementRules` and hands its
instance to :meth:`Scheduler.use_placement_rules <offcut.daemon.app.scheduler.Scheduler.use_placement_rules>`."""

from __future__ import annotations

from offcut.daemon.app import placement
from offcut.daemon.app.model import Task
from offcut.daemon.app.scheduler.state import SchedulerState


class PlacementRules:
    """The daemon's placement rules.

    Reads ``state.tfwd_s`` and ``state.pool`` (idle since, for the longest-idle rule); writes
    nothing (the re-allocator applies what they choose).

    Interface (:class:`~offcut.daemon.app.scheduler.interfaces.Placement`): :meth:`horizon_s`,
    :meth:`shrink_nodes`, :meth:`growth_order`, :meth:`pick_free_nodes`.
    """

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def horizon_s(self) -> float:
        """The look-ahead [s] the allocation problem weighs rescale costs against: BFTrainer's
        Tfwd (``state.tfwd_s``; arXiv 2106.12091, Section 3)."""
        return self.state.tfwd_s

    def shrink_nodes(self, task: Task, keep: int, t: float) -> tuple[list[str], list[str]]:
        """``(kept, released)`` of ``task``'s nodes when it shrinks to ``keep`` at ``t`` [s]:
        whole cabinets kept (:func:`offcut.daemon.app.placement.shrink`)."""
        return placement.shrink(task.nodes, keep)

    def growth_order(self, tasks: list[Task], counts: list[int]) -> list[tuple[Task, int]]:
        """The order in which growing tasks pick free nodes: ``(task, new count)`` pairs, the
        tasks' own order (the policy's)."""
        return list(zip(tasks, counts))

    def pick_free_nodes(self, task: Task, extra: int, free: list[str], t: float) -> list[str]:
        """``extra`` nodes of ``free`` (unheld nodes of the group, ``extra <= len(free)``) for
        ``task`` growing at ``t`` [s], in pick order: its cabinets first, then the
        longest-idle ones (:func:`offcut.daemon.app.placement.grow`)."""
        return placement.grow(task.nodes, extra, free, self.state.pool)

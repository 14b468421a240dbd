"""What applying one event did: the allocation answers it used, the placement changes, the
step-log figures (docs/architecture.md, "Time and events", "Tasks and the progress model" and
"Allocation"). Plain data, journaled as JSON (``SolveRecord``) or turned into a reply
(:mod:`offcut.daemon.app.replies`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from offcut.daemon.app.solvers.problem import AllocationProblem
from offcut.views import PlacementChange


@dataclass
class SolveRecord:
    """One allocation answer, as journaled. ``counts`` is per admitted task (submit order)."""

    counts: list[int]
    solver: str
    status: str
    objective: float
    bound: float
    solve_ms: float
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the journal."""
        return self.__dict__.copy()


#: the engine's allocator: a problem in, a journaled answer out
Allocate = Callable[[AllocationProblem], SolveRecord]


@dataclass
class Outcome:
    """What applying one event did (becomes an ``offcut.v1.Decision``)."""

    time: float
    source: str = ""
    seq: int = 0
    cause: str = "nodes"
    revision: int = 0
    placements: list[PlacementChange] = field(default_factory=list)
    solves: list[SolveRecord] = field(default_factory=list)
    #: a third-party policy's answers: (how many of ``solves`` came before it, its journal
    #: entry ``{"policy", "counts", "fallback"}``), journaled among the solves at that place
    policy_answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    ignored_nodes: list[str] = field(default_factory=list)
    completed_task_ids: list[str] = field(default_factory=list)
    #: warnings noted by the event: (task id, its ``Task.warnings`` entry)
    warnings: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    task_id: str | None = None
    #: finished tasks the event took out of the state (retention), for the state file's archive
    retired: list[Any] = field(default_factory=list)
    # BFTrainer step-log figures
    interval_s: float = 0.0
    progress_samples: float = 0.0
    rescale_cost_samples: float = 0.0
    preemption_cost_samples: float = 0.0
    nodes_left: int = 0
    nodes_joined: int = 0
    tasks_preempted: int = 0
    rate_samples_per_s: float = 0.0
    admitted_tasks: int = 0
    idle_nodes: int = 0
    running_tasks: int = 0
    nodes_in_use: int = 0



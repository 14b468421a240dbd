"""The narrow interfaces the scheduler's collaborators see of one another (docs/architecture.md,
"Modules"): a collaborator names the part it uses by one of these protocols, never by another
collaborator's class, so that each module imports only the state, these interfaces and the plain
data modules (the import contracts of pyproject.toml) and can be driven alone in a test with a
stand-in. :class:`~offcut.daemon.app.scheduler.Scheduler` composes the real ones."""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from offcut.daemon.app.model import Task
from offcut.views import TaskState
from offcut.daemon.app.scheduler.outcome import Allocate, Outcome
from offcut.views import PlacementChange


class Models(Protocol):
    """What the scheduler assumes of a task (:class:`~offcut.daemon.app.scheduler.models.TaskModels`)."""

    def rate_at(self, task: Task, n: int) -> float:
        """Modelled throughput [samples/s] of ``task`` on ``n`` nodes."""

    def power_at(self, task: Task, n: int) -> float:
        """Modelled power draw [W] of ``task`` on ``n`` nodes."""

    def rescale_costs(self, task: Task) -> tuple[float, float]:
        """(Tcup, Tcdw) [s] of ``task``."""

    def curves(self, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Ns, Os, S(n) for n = 0..Jmax) of ``task``, float arrays."""

    def power_values(self, task: Task, node_counts: np.ndarray) -> np.ndarray:
        """``task``'s power draw [W] at each of ``node_counts``, shape (len(node_counts),)."""

    def forget(self, task_id: str) -> None:
        """Drop what is cached of a finished task."""

    def learners_moved(self) -> None:
        """A learner's model changed: the population prior may have moved."""


class Lifecycle(Protocol):
    """The steps of a task's life the other collaborators take
    (:class:`~offcut.daemon.app.scheduler.lifecycle.TaskLifecycle`)."""

    def finish(self, task: Task, state: TaskState, t: float, out: Outcome) -> None:
        """End ``task`` in ``state`` at ``t`` [s], releasing its nodes."""

    def change(self, task: Task, change: str, before: int, t: float) -> PlacementChange:
        """The placement change of ``task`` (node set already updated), a new generation."""

    def set_running_state(self, task: Task) -> None:
        """Set ``task``'s rate, power and state from its node count."""

    def charge(self, task: Task, cost: float, out: Outcome) -> float:
        """Charge a rescale or preemption cost [samples] to ``task``; returns what was."""


class Placement(Protocol):
    """The choices of a re-allocation that BFTrainer's count-level model leaves open
    (:class:`~offcut.daemon.app.scheduler.placement_rules.PlacementRules`)."""

    def horizon_s(self) -> float:
        """The look-ahead [s] the allocation problem weighs rescale costs against."""

    def shrink_nodes(self, task: Task, keep: int, t: float) -> tuple[list[str], list[str]]:
        """``(kept, released)`` of ``task``'s nodes when it shrinks to ``keep``."""

    def growth_order(self, tasks: list[Task], counts: list[int]) -> list[tuple[Task, int]]:
        """The order in which growing tasks pick free nodes."""

    def pick_free_nodes(self, task: Task, extra: int, free: list[str], t: float) -> list[str]:
        """``extra`` nodes of ``free`` for ``task``, in pick order."""


#: re-allocate the admitted tasks at ``t`` [s] (the re-allocator's ``reallocate``)
Reallocate = Callable[[float, Outcome, Allocate], None]
#: the checked node counts of a policy for ``tasks`` at ``t`` on ``idle_nodes`` nodes (None: the
#: pool), solves journaled in the outcome (the policy runner's ``counts``)
Counts = Callable[[list[Task], float, Outcome, Allocate, "int | None"], list[int]]

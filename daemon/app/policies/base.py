"""The allocation policy interface (docs/architecture.md, "Allocation policies").

At every re-allocation the scheduler builds an :class:`AllocationRequest` (the admitted tasks, in
submit order, as BFTrainer's count-level :class:`AllocationProblem` plus who owns them) and asks
the configured :class:`AllocationPolicy` for one node count per admitted task. The scheduler checks
the answer (:func:`check_counts`) and places the nodes itself (``offcut.daemon.app.placement``).

The contract a policy keeps (the daemon's durability rests on it):

* **All optimisation goes through ``solve``** (the engine's allocator: the configured backend
  with its guard and ``dp`` fallback), or is pure deterministic computation on the request.
  Every answer ``solve`` returns is journaled with the event, in call order; when the daemon
  re-applies its journal after a restart it hands the same answers back in the same order
  and runs no solver.
* **Deterministic given those answers**: the same request and the same sequence of ``solve``
  answers give the same counts and the same sequence of ``solve`` calls. No wall clock, no
  randomness without a seed taken from the request, no dependence on dict or set order of
  unsorted data, no state kept in the policy object between calls (the scheduler may be rebuilt
  from a snapshot at any time; everything a policy needs must be in the request).
* **Read-only**: the request and the problem's arrays are shared with the scheduler's caches; a
  policy must not modify them (build new problems, e.g. with :func:`subproblem`).
* The answer: a sequence of ``problem.num_tasks`` integers, each 0 or within
  ``[min_nodes[j], max_nodes[j]]``, summing to at most ``problem.idle_nodes``. An answer that
  is not (a :class:`PolicyError` naming the policy), a policy that raises (any
  ``BaseException``), or one over its time limit, does not stop the event: that decision falls
  back to ``throughput``, logged and counted, with the reason in its last solve's
  ``fallback_reason`` (the Decision, ``offcut status``). Third-party policies run under
  :class:`~offcut.daemon.app.policies.guard.PolicyGuard` (bounded time, a policy that timed out is
  disabled until the daemon restarts), and their answers are journaled and compared when the
  journal is re-applied (the journaled answer wins).
"""

from __future__ import annotations

import abc
import itertools
import numbers
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from offcut.daemon.app.model import ObjectiveSettings
from offcut.daemon.app.solvers.problem import AllocationProblem

if TYPE_CHECKING:  # the scheduler imports this module; the record type is only named here
    from offcut.daemon.app.scheduler.outcome import SolveRecord

#: the engine's allocator as a policy sees it: an :class:`AllocationProblem` in, a journaled
#: ``SolveRecord`` out (``.counts``: one count per task of that problem, and ``.objective``,
#: ``.bound``, ``.solver``, ``.status``)
Solve = Callable[[AllocationProblem], "SolveRecord"]


class PolicyError(RuntimeError):
    """An allocation policy is unknown, cannot be loaded, failed, or answered counts the scheduler
    cannot apply. The message names the policy."""


@dataclass(frozen=True)
class PolicyTask:
    """What a policy may know of one admitted task besides its problem row.

    Attributes:
        task_id: the daemon's id (``t000001``).
        owner: the user who submitted it.
        submit_time: when it was submitted [s since epoch].
        node_seconds: nodes held times seconds, accrued so far [node-s].
    """

    task_id: str
    owner: str
    submit_time: float
    node_seconds: float


class AllocationRequest:
    """A read-only view of one re-allocation, built by the core.

    Attributes:
        problem: the throughput problem of the admitted tasks, row j = ``tasks[j]`` (submit
            order): idle node count N, current counts c_j, Jmin/Jmax, curves, Tfwd, rescale
            costs (docs/architecture.md, "Allocation"). Shared with the scheduler: do not modify it.
        tasks: per row, a :class:`PolicyTask` (id, owner, submit time, node-seconds so far).
        settings: the :class:`ObjectiveSettings` (policy name, eta, power figures).
        time: the time of the re-allocation [s since epoch] (event time, never the wall clock).

    :attr:`tasks` (when given as a function), :meth:`power_values` and
    :meth:`owner_node_seconds` are computed on first use (only some policies need them) and
    cached. Raises ``ValueError`` when there are not as many task views as problem rows.
    """

    __slots__ = ("_problem", "_tasks", "_tasks_fn", "_settings", "_time", "_power",
                 "_power_fn", "_owners", "_owners_fn")

    def __init__(self, problem: AllocationProblem,
                 tasks: Sequence[PolicyTask] | Callable[[], Sequence[PolicyTask]],
                 settings: ObjectiveSettings, time: float, *,
                 power_values: Callable[[], Sequence[np.ndarray]] | Sequence[np.ndarray] | None = None,
                 owner_node_seconds: Callable[[], Mapping[str, float]] | Mapping[str, float] | None = None):
        self._problem = problem
        self._tasks_fn = tasks if callable(tasks) else None
        self._tasks = None if callable(tasks) else self._checked(tasks)
        self._settings = settings
        self._time = float(time)
        self._power_fn = power_values if callable(power_values) else None
        self._power = None if callable(power_values) or power_values is None else \
            tuple(np.asarray(x, dtype=float) for x in power_values)
        self._owners_fn = owner_node_seconds if callable(owner_node_seconds) else None
        self._owners = None if callable(owner_node_seconds) or owner_node_seconds is None else \
            MappingProxyType(dict(owner_node_seconds))

    @property
    def problem(self) -> AllocationProblem:
        """The throughput problem of the admitted tasks (row j = ``tasks[j]``; read-only)."""
        return self._problem

    def _checked(self, tasks: Sequence[PolicyTask]) -> tuple[PolicyTask, ...]:
        if len(tasks) != self._problem.num_tasks:
            raise ValueError(f"{len(tasks)} task views for a problem of "
                             f"{self._problem.num_tasks} tasks")
        return tuple(tasks)

    @property
    def tasks(self) -> tuple[PolicyTask, ...]:
        """Per problem row, what the policy may know of the task (:class:`PolicyTask`)."""
        if self._tasks is None:
            self._tasks = self._checked(self._tasks_fn())
        return self._tasks

    @property
    def settings(self) -> ObjectiveSettings:
        """The objective settings: policy name, eta_knob, power figures [W]."""
        return self._settings

    @property
    def time(self) -> float:
        """When the re-allocation happens [s since epoch]: event time, never the wall clock."""
        return self._time

    def power_values(self) -> tuple[np.ndarray, ...]:
        """Per task, its modelled power draw [W] at each of ``problem.node_counts[j]`` (its
        spec's ``power_w`` curve, else its energy reports, else ``node_power_w`` per node; at
        least 1 mW per node at positive counts). Raises ``ValueError`` when the request was
        built without them."""
        if self._power is None:
            if self._power_fn is None:
                raise ValueError("this allocation request carries no power values")
            self._power = tuple(np.asarray(x, dtype=float) for x in self._power_fn())
        return self._power

    def owner_node_seconds(self) -> Mapping[str, float]:
        """Node-seconds used so far per owner, over all of the owner's tasks (finished ones
        included); without a source given at construction, the admitted tasks' sums."""
        if self._owners is None:
            if self._owners_fn is not None:
                owners = dict(self._owners_fn())
            else:
                owners = {}
                for t in self.tasks:
                    owners[t.owner] = owners.get(t.owner, 0.0) + t.node_seconds
            self._owners = MappingProxyType(owners)
        return self._owners


class AllocationPolicy(abc.ABC):
    """What the allocation maximises: one node count per admitted task (module docstring for
    the contract: determinism, all optimisation through ``solve``, read-only request).

    Subclasses set the class attribute :attr:`name` (built-ins: the registry's names;
    third-party policies are registered under their entry-point name in the group
    ``offcut.policies``) and implement :meth:`allocate`. The scheduler makes one instance per
    daemon (no-argument constructor) and may make a new one at any time.
    """

    #: the policy's name (the ``policy`` setting)
    name: ClassVar[str] = ""

    @abc.abstractmethod
    def allocate(self, request: AllocationRequest, solve: Solve) -> Sequence[int]:
        """Node counts for ``request.tasks`` (same order): each 0 or within [Jmin, Jmax], at
        most ``request.problem.idle_nodes`` in all. ``solve(problem)`` solves any
        :class:`AllocationProblem` with the configured backend (journaled)."""


def check_counts(name: str, counts: Any, problem: AllocationProblem) -> list[int]:
    """``counts`` as a list of ints if it is an answer the scheduler can apply to ``problem`` (one
    integer per task, 0 or within [Jmin_j, Jmax_j], sum <= idle nodes); else
    :class:`PolicyError` naming policy ``name`` and what is wrong. An iterable that is not a
    list or tuple is read to at most ``problem.num_tasks + 1`` items (an endless generator
    is refused, not followed to a MemoryError)."""
    where = f"allocation policy {name!r}"
    if type(counts) is list or type(counts) is tuple:  # the usual answer: sized, no copy
        values = counts
    else:  # any iterable, read to one item past the tasks (an endless generator ends here)
        try:
            values = list(itertools.islice(iter(counts), problem.num_tasks + 1))
        except TypeError:
            raise PolicyError(f"{where} answered {type(counts).__name__}, not a sequence of "
                              "node counts") from None
        if len(values) > problem.num_tasks:
            raise PolicyError(f"{where} answered more than {problem.num_tasks} counts for "
                              f"{problem.num_tasks} admitted tasks")
    if len(values) != problem.num_tasks:
        raise PolicyError(f"{where} answered {len(values)} counts for {problem.num_tasks} "
                          "admitted tasks")
    out = []
    lows, highs = problem.min_nodes.tolist(), problem.max_nodes.tolist()
    for j, v in enumerate(values):
        if type(v) is not int:  # the usual answer is plain ints: the ABC check is the rare path
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise PolicyError(f"{where}: count {j} is {v!r}, not an integer")
            v = int(v)
        n, lo, hi = v, lows[j], highs[j]
        if n != 0 and not lo <= n <= hi:
            raise PolicyError(f"{where}: task {j} gets {n} nodes, outside {{0}} U [{lo}, {hi}]")
        out.append(n)
    if sum(out) > problem.idle_nodes:
        raise PolicyError(f"{where} uses {sum(out)} nodes, only {problem.idle_nodes} are idle")
    return out


def subproblem(problem: AllocationProblem, rows: Sequence[int], idle_nodes: int
               ) -> AllocationProblem:
    """The problem of the tasks at ``rows`` of ``problem`` alone, with ``idle_nodes`` nodes
    (at least what those tasks hold now: a problem's tasks never hold more than its pool).
    Everything else (curves, cost curves, Tfwd, rescale costs) is the tasks' own. Raises
    :class:`~offcut.errors.InvalidArgument` when ``idle_nodes`` is too small."""
    rows = [int(j) for j in rows]
    return AllocationProblem(
        idle_nodes=idle_nodes, current_nodes=problem.current_nodes[rows],
        min_nodes=problem.min_nodes[rows], max_nodes=problem.max_nodes[rows],
        node_counts=[problem.node_counts[j] for j in rows],
        objective_values=[problem.objective_values[j] for j in rows], tfwd_s=problem.tfwd_s,
        rescale_up_s=problem.rescale_up_s[rows], rescale_down_s=problem.rescale_down_s[rows],
        cost_values=(None if problem.cost_values is None
                     else [problem.cost_values[j] for j in rows]),
        objective_tables=(None if problem.objective_tables is None
                          else [problem.objective_tables[j] for j in rows]))

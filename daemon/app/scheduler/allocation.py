"""Re-allocation (docs/architecture.md, "Allocation"): per node group, the policy's counts for the
admitted tasks, the node names placed by the placement rules, the rescale costs charged; the
placement changes that result."""

from __future__ import annotations

from typing import Collection

from offcut.daemon.app import placement
from offcut.daemon.app.model import PLAIN_NODE, Task
from offcut.views import TaskState
from offcut.daemon.app.scheduler.interfaces import Counts, Lifecycle, Models, Placement
from offcut.daemon.app.scheduler.outcome import Allocate, Outcome
from offcut.daemon.app.scheduler.state import SchedulerState


class Reallocator:
    """Re-allocates the admitted tasks and returns the placement changes in the outcome.

    Reads ``state.admitted()``, ``pool``, ``kinds``; writes ``state.holder`` and the admitted
    tasks' state, admit time, nodes, work (rescale costs) and rescale counts. Uses ``counts``
    (the policy's checked counts per node group: the policy runner's, composed by the
    scheduler), the placement rules (which node names), the task models (rate and rescale
    costs) and the task lifecycle (charge a cost, set the running state, record a change).

    Interface: :meth:`reallocate` ``(t, out, allocate)``: the placement changes go to
    ``out.placements``, their costs to ``out.rescale_cost_samples``; :meth:`node_groups`.
    """

    def __init__(self, state: SchedulerState, models: Models, lifecycle: Lifecycle,
                 rules: Placement, counts: Counts) -> None:
        self.state = state
        self.models = models
        self.lifecycle = lifecycle
        self.rules = rules
        self.counts = counts

    def node_groups(self, tasks: list[Task]) -> list[tuple[Collection[str], list[Task]]]:
        """``tasks`` grouped by the idle nodes they may run on (docs/architecture.md,
        "Node kinds"): ``(nodes in pool order, tasks in the given order)`` per group, the most
        constrained group first (fewest nodes; ties by the requirement). Tasks whose
        requirements (``gpus_per_node``, ``constraint``) select the same nodes share a group;
        while no node kind is known and no task asks for GPUs or features, that is one group
        of the whole pool (the pool itself, not a copy: the common case costs nothing per
        event)."""
        state = self.state
        plain = lambda task: not task.spec.gpus_per_node and not task.spec.constraint  # noqa: E731
        if not state.kinds and all(plain(task) for task in tasks):
            return [(state.pool.keys(), tasks)]
        by_need: dict[tuple[int, tuple[str, ...]], list[Task]] = {}
        for task in tasks:
            by_need.setdefault((task.spec.gpus_per_node, task.spec.constraint), []).append(task)
        groups: dict[frozenset[str], tuple[tuple, list[str], list[Task]]] = {}
        for need, members in sorted(by_need.items()):
            spec = members[0].spec
            nodes = [n for n in state.pool if state.kinds.get(n, PLAIN_NODE).fits(spec)]
            key = frozenset(nodes)
            if key in groups:
                groups[key][2].extend(members)
            else:
                groups[key] = (need, nodes, list(members))
        order = sorted(groups.values(), key=lambda g: (len(g[1]), g[0]))
        rank = {task.task_id: i for i, task in enumerate(tasks)}
        return [(nodes, sorted(members, key=lambda task: rank[task.task_id]))
                for _, nodes, members in order]

    def reallocate(self, t: float, out: Outcome, allocate: Allocate) -> None:
        """Re-allocate the admitted tasks at ``t`` [s]: per node group (:meth:`node_groups`,
        most constrained first) the policy's counts on the group's nodes that no earlier group
        took; a group may take nodes that tasks of later groups hold (they shrink), never the
        other way round. With one group (no node kinds) this is the single BFTrainer problem
        over the whole pool (docs/architecture.md, "Allocation"). A task in its final phase
        (its work reached while its processes finish: docs/execution.md, "Completion") keeps
        its nodes as they are: it is left out, and its nodes with it."""
        tasks = self.state.admitted()
        for task in tasks:
            if task.state is TaskState.QUEUED:
                task.state = TaskState.ADMITTED
                task.admit_time = t
        finishing = {n for task in tasks if task.work_reached_time is not None
                     for n in task.nodes}
        if finishing:
            tasks = [task for task in tasks if task.work_reached_time is None or not task.nodes]
        if not tasks:
            return
        before = {task.task_id: len(task.nodes) for task in tasks}
        groups = self.node_groups(tasks)
        taken: set[str] = set(finishing)  # nodes of the groups placed so far
        for i, (nodes, group) in enumerate(groups):
            avail = [n for n in nodes if n not in taken] if taken else nodes
            later = {task.task_id for _, g in groups[i + 1:] for task in g}
            self._place_group(group, avail, later, t, out, allocate)
            if i + 1 < len(groups):  # the last group's nodes are nobody else's concern
                taken.update(n for task in group for n in task.nodes)
        for task in tasks:
            c, n = before[task.task_id], len(task.nodes)
            if n != c:
                self._rescaled(task, c, n, t, out)

    def _rescaled(self, task: Task, c: int, n: int, t: float, out: Outcome) -> None:
        """``task`` went from ``c`` to ``n`` nodes at ``t``: charge the rescale cost (Ps(c) x
        Tcup to grow, x Tcdw to shrink), set its running state, its placement change."""
        lost_rate = self.models.rate_at(task, c)
        up_s, down_s = self.models.rescale_costs(task)
        out.rescale_cost_samples += self.lifecycle.charge(
            task, lost_rate * (up_s if n > c else down_s), out)
        task.rescales += 1
        self.lifecycle.set_running_state(task)
        kind = "start" if c == 0 else "stop" if n == 0 else "grow" if n > c else "shrink"
        if task.learner is not None:
            task.learner.on_allocation(t, n, kind)
        out.placements.append(self.lifecycle.change(task, kind, c, t))

    def _place_group(self, tasks: list[Task], avail: Collection[str], later: set[str], t: float,
                     out: Outcome, allocate: Allocate) -> None:
        """Counts and node names for one node group: ``tasks`` on ``avail`` (pool order);
        ``later``: ids of tasks of groups placed after this one, whose nodes in ``avail`` this
        group may take. A task's nodes outside ``avail`` (their kind changed, or a more
        constrained group took them) are released first."""
        state, rules = self.state, self.rules
        holder = state.holder
        allowed = set(avail) if len(avail) != len(state.pool) else None
        if allowed is not None:
            for task in tasks:
                if any(n not in allowed for n in task.nodes):
                    for node in task.nodes:
                        if node not in allowed and holder.get(node) == task.task_id:
                            del holder[node]
                    task.nodes = [n for n in task.nodes if n in allowed]
        counts = (self.counts(tasks, t, out, allocate, len(avail)) if avail
                  else [0] * len(tasks))
        # shrink first: released nodes become free for growing tasks
        for task, n in zip(tasks, counts):
            if n < len(task.nodes):
                kept, released = rules.shrink_nodes(task, n, t)
                for node in released:
                    del holder[node]
                task.nodes = kept
        free: list[str] | None = None  # the group's unheld nodes, listed once a task grows
        for task, n in rules.growth_order(tasks, counts):
            extra = n - len(task.nodes)
            if extra <= 0:
                continue
            if free is None:
                free = [x for x in avail if x not in holder]
            picked = rules.pick_free_nodes(task, min(extra, len(free)), free, t)
            if len(picked) < extra:  # the rest from tasks of less constrained groups
                held = [x for x in avail if holder.get(x) in later]
                picked += placement.grow(task.nodes + picked, extra - len(picked), held,
                                         state.pool)
                for node in picked:
                    owner = holder.get(node)
                    if owner is not None:
                        loser = state.tasks[owner]
                        loser.nodes = [x for x in loser.nodes if x != node]
            taken = set(picked)
            free = [x for x in free if x not in taken]
            for node in picked:
                holder[node] = task.task_id
            task.nodes = sorted(task.nodes + picked)

"""Node events (docs/architecture.md, "Time and events"): idle reports, preemptions and idle-set
snapshots change the pool; preempted tasks lose nodes and pay Tcdw."""

from __future__ import annotations

from offcut.daemon.app.model import PLAIN_NODE, NodeEvent, Task
from offcut.daemon.app.scheduler.interfaces import Lifecycle
from offcut.daemon.app.scheduler.outcome import Outcome
from offcut.daemon.app.scheduler.state import SchedulerState


class NodePool:
    """Applies ``ReportNodes`` / ``SyncNodes`` events to the idle pool.

    Reads and writes ``state.pool``, ``holder``, ``kinds``, ``last_seq``, ``node_clock``, and
    the preempted tasks (their nodes, work, preemptions). Uses the task lifecycle to charge
    the preemption cost (Tcdw x rate, once per task per event), set the tasks' running state
    and record their placement change.

    Interface: :meth:`apply` ``(event, t, out) -> whether the pool changed`` (then the
    scheduler re-allocates).
    """

    def __init__(self, state: SchedulerState, lifecycle: Lifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    def apply(self, event: NodeEvent, t: float, out: Outcome) -> bool:
        """Apply a validated node event at event time ``t`` [s]: its source's seq and the
        newest observation time recorded, the kinds table replaced when it carries kinds, the
        pool changed (a snapshot: to its idle set; a report: its idle nodes join, its
        preempted ones leave; nodes already so are ``out.ignored_nodes``)."""
        state = self.state
        out.source, out.seq = event.source, event.seq
        out.cause = "snapshot" if event.snapshot else "nodes"
        state.last_seq[event.source] = event.seq
        observed = event.observed_time
        state.node_clock = observed if state.node_clock is None else max(state.node_clock,
                                                                         observed)
        kinds_changed = False
        if event.kinds:
            kinds = {n: k for n, k in event.kinds if k != PLAIN_NODE}
            kinds_changed = kinds != state.kinds
            state.kinds = kinds
        pool = state.pool
        if event.snapshot:
            now_idle = set(event.idle)
            joined = sorted(now_idle - pool.keys())
            left = sorted(n for n in pool if n not in now_idle)
        else:
            joined, left = [], []
            for n in event.idle:
                (out.ignored_nodes if n in pool else joined).append(n)
            for n in event.preempted:
                (left if n in pool else out.ignored_nodes).append(n)
        hit: dict[str, Task] = {}
        for n in left:
            del pool[n]
            owner = state.holder.pop(n, None)
            if owner is not None:
                hit[owner] = state.tasks[owner]
        for task in hit.values():
            self._preempt(task, t, out)
        for n in joined:
            pool[n] = t
        out.nodes_left, out.nodes_joined, out.tasks_preempted = len(left), len(joined), len(hit)
        return bool(joined or left or kinds_changed)

    def _preempt(self, task: Task, t: float, out: Outcome) -> None:
        """``task`` lost nodes that left the pool: charge Tcdw x its rate, keep its nodes
        still idle, a ``preempted`` placement change."""
        cost = self.lifecycle.charge(task, task.spec.rescale_down_s * task.rate, out)
        out.preemption_cost_samples += cost
        task.preemptions += 1
        before = len(task.nodes)
        pool = self.state.pool
        task.nodes = [n for n in task.nodes if n in pool]
        self.lifecycle.set_running_state(task)
        if task.learner is not None:
            task.learner.on_allocation(t, len(task.nodes), "preempted")
        out.placements.append(self.lifecycle.change(task, "preempted", before, t))

"""Node events (docs/architecture.md, "Time and events"): idle reports, preemptions and idle-set
snapshots change the pool; preempted tasks lose nodes and pay Tcdw."""

from __future__ import annotations

from offcut.daemon.model import PLAIN_NODE, NodeEvent, Task
from offcut.daemon.scheduler.outcome import Outcome


class NodeEvents:
    """Applies ``ReportNodes`` / ``SyncNodes`` events to the pool."""

    def _apply_nodes(self, event: NodeEvent, t: float, out: Outcome) -> bool:
        kinds_changed = False
        if event.kinds:
            kinds = {n: k for n, k in event.kinds if k != PLAIN_NODE}
            kinds_changed = kinds != self.kinds
            self.kinds = kinds
        if event.snapshot:
            now_idle = set(event.idle)
            joined = sorted(now_idle - self.pool.keys())
            left = sorted(n for n in self.pool if n not in now_idle)
        else:
            joined, left = [], []
            for n in event.idle:
                (out.ignored_nodes if n in self.pool else joined).append(n)
            for n in event.preempted:
                (left if n in self.pool else out.ignored_nodes).append(n)
        hit: dict[str, Task] = {}
        for n in left:
            del self.pool[n]
            owner = self.holder.pop(n, None)
            if owner is not None:
                hit[owner] = self.tasks[owner]
        for task in hit.values():
            cost = self._chargeable(task, task.spec.rescale_down_s * task.rate)
            task.work_done -= cost
            out.progress_samples -= cost
            out.preemption_cost_samples += cost
            self.total_samples -= cost
            task.preemptions += 1
            before = len(task.nodes)
            task.nodes = [n for n in task.nodes if n in self.pool]
            self._set_running_state(task)
            if task.learner is not None:
                task.learner.on_allocation(t, len(task.nodes), "preempted")
            out.placements.append(self._change(task, "preempted", before, t))
        for n in joined:
            self.pool[n] = t
        out.nodes_left, out.nodes_joined, out.tasks_preempted = len(left), len(joined), len(hit)
        return bool(joined or left or kinds_changed)

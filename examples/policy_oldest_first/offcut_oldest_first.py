"""An example allocation policy for Offcut: the oldest task first.

The admitted tasks, oldest submission first, each take as many nodes as they can use (Jmax)
while idle nodes are left; a task that would get fewer than its Jmin gets none. No solver:
pure deterministic computation on the request (rescale costs are ignored).
"""

from offcut.daemon.app.policies import AllocationPolicy, AllocationRequest, Solve


class OldestFirst(AllocationPolicy):
    name = "oldest_first"

    def allocate(self, request: AllocationRequest, solve: Solve) -> list[int]:
        p = request.problem
        left, counts = p.idle_nodes, [0] * p.num_tasks
        for j in sorted(range(p.num_tasks),
                        key=lambda j: (request.tasks[j].submit_time, request.tasks[j].task_id)):
            n = min(int(p.max_nodes[j]), left)
            if n >= p.min_nodes[j]:
                counts[j], left = n, left - n
        return counts

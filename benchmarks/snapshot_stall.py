"""Snapshot stall with many tasks (docs/architecture.md, "Journal and snapshots"): how long a
snapshot holds the engine's lock when the daemon holds ``--tasks`` tasks (default 200,000: half
finished within the retention, the rest queued, ``max_running_tasks`` running).

An :class:`~offcut.daemon.app.engine.Engine` on a real SQLite file (durability ``full``) gets the
tasks put into its state (building them through 200,000 submissions would take minutes and
measure the submissions), writes the first snapshot (every task: what a daemon does once after
an upgrade), then applies ``--events`` node events with ``snapshot_every = --snapshot-every``.
Printed: the first (full) snapshot's time, and per snapshot-carrying event the time spent in
the snapshot (collecting the changed tasks and writing them; p50 / max [ms]), against what a
whole-state snapshot costs at that size (``Scheduler.to_dict`` + JSON, timed once), with PASS
when the max is under ``--goal-ms`` (50). The figure lines also go, with the machine and the
command, to a new ``benchmarks/results/snapshot_stall-DATE-TIME.txt`` (``--no-results``: not
written; earlier figures: benchmarks/results/earlier-measurements.md, "Snapshots with many
tasks").

Usage::

    python benchmarks/snapshot_stall.py                 # 200,000 tasks
    python benchmarks/snapshot_stall.py --tasks 20000 --events 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from offcut.daemon.app.engine import Engine
from offcut.daemon.app.model import NodeEvent, Task
from offcut.views import TaskState
from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.store import Store
from offcut.taskspec import TaskSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

T0 = 1_767_225_600.0  # 2026-01-01


def fill(engine: Engine, n: int) -> None:
    """Put ``n`` tasks into the engine's state: half completed a minute ago (within the
    retention), the rest queued behind the admitted ones."""
    sched = engine.scheduler
    spec = TaskSpec.create(name="bench", min_nodes=1, max_nodes=8, node_counts=[0, 1, 2, 4, 8],
                           throughputs=[0.0, 10.0, 19.0, 36.0, 66.0], rescale_up_s=5.0,
                           rescale_down_s=2.0, total_work_samples=1e9)
    for i in range(n):
        task_id = f"t{sched.next_task_number:06d}"
        sched.next_task_number += 1
        task = Task(task_id=task_id, spec=spec, owner=f"user{i % 64}", submit_time=T0)
        sched.tasks[task_id] = task
        if i < n // 2:
            task.state, task.finish_time, task.work_done = TaskState.COMPLETED, T0, 1e9
            sched.finished.append((T0, task_id))
        else:
            sched.active[task_id] = task
    sched.mark_all_changed()


def main(argv: list[str] | None = None) -> int:
    """Command line; exit status 1 when a snapshot took ``--goal-ms`` or longer."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=200_000, help="tasks in the state (default %(default)s)")
    ap.add_argument("--events", type=int, default=2_000, help="node events applied (default %(default)s)")
    ap.add_argument("--snapshot-every", type=int, default=100, help="journal rows between snapshots (default %(default)s)")
    ap.add_argument("--goal-ms", type=float, default=50.0, help="the goal for the slowest snapshot (default %(default)s)")
    add_option(ap)
    a = ap.parse_args(argv)
    log = ResultsLog.from_args("snapshot_stall", a, argv)
    with tempfile.TemporaryDirectory(prefix="offcut-snap-") as tmp:
        store = Store(Path(tmp) / "state.sqlite", snapshot_every=a.snapshot_every)
        engine = Engine(store, Allocator("dp"), max_running_tasks=10)
        put = store._put_snapshot
        times: list[float] = []

        def timed_put(journal_id, state):
            t0 = time.perf_counter()
            put(journal_id, state)
            times.append(time.perf_counter() - t0)
        store._put_snapshot = timed_put
        snap = engine._snapshot_state

        def timed_state():
            t0 = time.perf_counter()
            out = snap()
            times.append(-(time.perf_counter() - t0))  # collected part, added below
            return out
        engine._snapshot_state = timed_state

        engine.apply(NodeEvent(T0, "bench", 1, idle=tuple(f"n{i}" for i in range(64))))
        fill(engine, a.tasks)
        t0 = time.perf_counter()
        full = json.dumps(engine.scheduler.to_dict(), separators=(",", ":"))
        whole_s = time.perf_counter() - t0
        times.clear()
        with engine.lock:
            engine.store.write_snapshot(engine._snapshot_state())
        first_s = -times[0] + times[1]
        times.clear()
        rng = np.random.default_rng(0)
        for seq in range(2, a.events + 2):
            nodes = tuple(f"n{i}" for i in rng.choice(64, 4, replace=False))
            kind = {"idle": nodes} if seq % 2 else {"preempted": nodes}
            engine.apply(NodeEvent(T0 + seq, "bench", seq, **kind))
        stalls = [(-times[i] + times[i + 1]) * 1000.0 for i in range(0, len(times) - 1, 2)]
        engine.close()
    log.say(f"{a.tasks} tasks ({a.tasks // 2} finished, the rest queued or running): "
            f"whole-state snapshot {whole_s * 1000:.0f} ms ({len(full) / 2**20:.0f} MiB of "
            f"JSON); first incremental snapshot (every task) {first_s * 1000:.0f} ms")
    worst = max(stalls) if stalls else 0.0
    log.say(f"{len(stalls)} snapshots during {a.events} node events: p50 "
            f"{np.percentile(stalls, 50) if stalls else float('nan'):.1f} ms, max {worst:.1f} ms "
            f"({whole_s * 1000 / max(worst, 1e-3):.0f}x less than a whole-state snapshot)")
    ok = worst < a.goal_ms
    log.say(f"{'PASS' if ok else 'FAIL'} (goal: every snapshot under {a.goal_ms:g} ms)")
    log.finish()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

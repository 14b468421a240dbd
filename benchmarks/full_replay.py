"""Whole-machine replay benchmark (issue "Whole-machine scale").

1. The two-week log over all 4,734 nodes with the 1,001-task ImageNet set, ``--max-tasks 100``,
   through gRPC end to end: wall time, events/s, daemon peak RSS, all_done_at.
2. gRPC overhead per event: the same first ``--overhead-events`` events with solver
   ``greedy`` through a private daemon over gRPC vs through the engine alone (in-process, no
   gRPC), printed as ms/event and their ratio.

The figure lines also go, with the machine and the command, to a new
``benchmarks/results/full_replay-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/full_replay.py                       # whole log, solver dp
    python benchmarks/full_replay.py --max-events 2000 --solver greedy
    python benchmarks/full_replay.py --send-ahead 0        # one ReportNodes call per event
    python benchmarks/full_replay.py --record-instances whole.jsonl   # then time them alone:
    python benchmarks/decision_time.py --records whole.jsonl --solvers dp --no-anchor
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"


def engine_alone(node_log, tasks, max_events: int, max_tasks: int, solver: str) -> tuple[float, int]:
    """Apply the same submissions and events to an in-process engine (no gRPC); returns
    (seconds, calls)."""
    from offcut.daemon.app.engine import Engine
    from offcut.daemon.app.model import NodeEvent, SubmitEvent
    from offcut.wire.specs import spec_from_pb
    from offcut.daemon.app.solvers.allocator import Allocator
    from offcut.daemon.app.store import Store
    from offcut.replay.driver import task_spec, to_epoch

    tmp = tempfile.mkdtemp(prefix="offcut-bench-")
    engine = Engine(Store(f"{tmp}/state.sqlite", 5000, "normal"),
                    Allocator(solver, isolate=False), tfwd_s=10.0, max_running_tasks=max_tasks)
    pending = sorted(tasks, key=lambda t: (t.submit_time, t.name))
    nxt = calls = 0
    started = time.perf_counter()

    def submit_until(t) -> None:
        nonlocal nxt, calls
        while nxt < len(pending) and pending[nxt].submit_time <= t:
            task = pending[nxt]
            engine.apply(SubmitEvent(to_epoch(task.submit_time), spec_from_pb(task_spec(task)),
                                     "replay", f"replay:{task.name}"))
            nxt += 1
            calls += 1

    submit_until(node_log.initial_time)
    engine.apply(NodeEvent(to_epoch(node_log.initial_time), "replay", 1,
                           tuple(node_log.initial_idle), (), True))
    for i, change in enumerate(node_log.events()):
        if i >= max_events:
            break
        submit_until(change.time)
        engine.apply(NodeEvent(to_epoch(change.time), "replay", i + 2, tuple(change.became_idle),
                               tuple(change.became_busy)))
        calls += 1
    elapsed = time.perf_counter() - started
    engine.close()
    return elapsed, calls + 1


def main(argv: list[str] | None = None) -> None:
    from offcut.replay.driver import ReplayOptions

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--solver", default="dp")
    ap.add_argument("--max-tasks", type=int, default=100)
    ap.add_argument("--max-events", type=int, default=None, help="default: the whole log")
    ap.add_argument("--overhead-events", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--send-ahead", type=int, default=ReplayOptions.send_ahead,
                    help="node events sent on the StreamNodes stream before the oldest one's "
                         "Decision is read (0: one ReportNodes call per event)")
    ap.add_argument("--record-instances", type=Path, default=None,
                    help="write every allocation problem of the replay (JSONL) for "
                         "benchmarks/decision_time.py --records")
    add_option(ap)
    args = ap.parse_args(argv)
    args.out = args.out or Path(tempfile.mkdtemp(prefix="offcut-full-"))
    results = ResultsLog.from_args("full_replay", args, argv)
    say = results.say

    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import run_replay

    log_path = args.data_dir / "ndstat-10sdn6-evt.tar.gz"
    tasks_path = args.data_dir / "ImageNet-imgps-Jbnd-1001J.pkl"
    if not log_path.exists():
        raise SystemExit(f"real data not found at {args.data_dir}")
    tasks = load_task_set(tasks_path, allow_pickle=True)

    log = load_node_log(log_path, allow_pickle=True)
    say(f"whole machine: {len(log.node_names)} nodes, {len(tasks)} tasks, --max-tasks "
        f"{args.max_tasks}, solver {args.solver}, --send-ahead {args.send_ahead}")
    s = run_replay(log, tasks, args.out / "full", ReplayOptions(
        solver=args.solver, max_tasks=args.max_tasks, max_events=args.max_events,
        progress=True, until_log_end=True, send_ahead=args.send_ahead,
        record_instances=str(args.record_instances) if args.record_instances else None))
    say(f"  events {s['events']}  wall {s['wall_s']:.1f} s (daemon start included; "
        f"{s['drive_s']:.1f} s sending)  events/s {s['events_per_s']:.0f}  "
        f"daemon peak RSS {s['daemon_peak_rss_mb']:.0f} MiB")
    say(f"  tasks completed {s['tasks_completed']}/{s['tasks_submitted']}  "
        f"decision ms p50 {s['decision_ms']['p50']:.2f} p99 {s['decision_ms']['p99']:.2f}")
    print(f"  outputs: {args.out / 'full'}")

    n = args.overhead_events
    log = load_node_log(log_path, allow_pickle=True)
    alone_s, calls = engine_alone(log, tasks, n, args.max_tasks, "greedy")
    log = load_node_log(log_path, allow_pickle=True)
    s = run_replay(log, tasks, args.out / "overhead", ReplayOptions(
        solver="greedy", max_tasks=args.max_tasks, max_events=n, progress=False,
        until_log_end=True, send_ahead=args.send_ahead))
    grpc_ms = s["drive_s"] * 1e3 / calls
    alone_ms = alone_s * 1e3 / calls
    say(f"gRPC overhead, first {n} events + submissions ({calls} calls), solver greedy:")
    say(f"  engine alone {alone_ms:.2f} ms/call, over gRPC {grpc_ms:.2f} ms/call "
        f"(ratio {grpc_ms / alone_ms:.2f}, overhead {grpc_ms - alone_ms:.2f} ms/call)")
    results.finish()


if __name__ == "__main__":
    main()

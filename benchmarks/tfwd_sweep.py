"""The look-ahead horizon Tfwd swept on the real log: which default trains the most.

BFTrainer's objective (arXiv 2106.12091, Section 3; docs/architecture.md, "Allocation") weighs Tfwd
seconds of throughput against the progress a rescale costs (Tcup, Tcdw): a short horizon makes
almost every grow too dear (a task at c nodes grows only when Tfwd * (S(n) - S(c)) > Tcup * S(c)),
a long one rescales for gains the next preemption takes away. Each value here replays the
same task set on the same nodes of the real two-week node log through its own private daemon
(solver dp) until every task is done and prints, per Tfwd: the makespan (first submission to
the last task done) and its ratio to Tfwd = 10 s (BFTrainer's value and Offcut's old
default), the samples trained per hour of it (net of rescale and preemption costs), grows and
shrinks, and the decision p99. A task set the log cannot finish is cut at the log's end (then
the samples trained compare). The figure lines also go, with the machine and the command, to a
new ``benchmarks/results/tfwd_sweep-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/tfwd_sweep.py                                    # shufflenet 10 x 128
    python benchmarks/tfwd_sweep.py --tasks ImageNet-imgps-Jbnd-1001J.pkl --max-tasks 100 \\
        --num-nodes 0 --values 10,60,120                                # the whole machine
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from real_data import NODE_LOG, parser, require
from results_log import ResultsLog, add_option


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--tasks", default="hps-shufflenet-Jbnd-10J.pkl", help="task set file")
    ap.add_argument("--num-nodes", type=int, default=128, help="nodes of the log (0: all)")
    ap.add_argument("--max-tasks", type=int, default=10, help="tasks admitted at once")
    ap.add_argument("--values", default="10,30,60,120,300,600", help="Tfwd values [s]")
    add_option(ap)
    args = ap.parse_args(argv)
    results = ResultsLog.from_args("tfwd_sweep", args, argv)
    say = results.say
    require(args.data_dir, NODE_LOG, args.tasks)
    log_path = args.data_dir / NODE_LOG
    tasks_path = args.data_dir / args.tasks

    import pandas as pd

    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay

    out_root = args.out or Path(tempfile.mkdtemp(prefix="offcut-tfwd-"))
    values = [float(v) for v in args.values.split(",") if v]
    tasks = load_task_set(tasks_path, allow_pickle=True)
    runs = {}
    for tfwd in values:
        log = load_node_log(log_path, num_nodes=args.num_nodes or None, allow_pickle=True)
        t0 = time.monotonic()
        summary = run_replay(log, tasks, out_root / f"tfwd-{tfwd:g}", ReplayOptions(
            solver="dp", tfwd_s=tfwd, max_tasks=args.max_tasks, progress=False))
        changes = pd.read_csv(out_root / f"tfwd-{tfwd:g}" / "placements.csv")["change"]
        runs[tfwd] = (summary, int(changes.isin(["grow", "shrink"]).sum()),
                      time.monotonic() - t0)
        print(f"Tfwd {tfwd:g} s: {summary['total_samples']:.6g} samples "
              f"({runs[tfwd][2]:.0f} s wall)", flush=True)
    first = min(t.submit_time for t in tasks)
    first = first if isinstance(first, (int, float)) else pd.Timestamp(first).value / 1e9

    def makespan_h(s: dict) -> float | None:
        return ((pd.Timestamp(s["all_done_at"]).value / 1e9 - first) / 3600.0
                if s["all_done_at"] else None)

    base = makespan_h(runs.get(10.0, next(iter(runs.values())))[0])
    print(f"\noutputs in {out_root}")
    say(f"{tasks_path.name}, {args.num_nodes or 'all'} nodes, max {args.max_tasks} tasks, "
        f"solver dp")
    say("| Tfwd [s] | makespan [h] | vs Tfwd 10 s | samples trained | samples/h | "
        "grows + shrinks | decision p99 [ms] |")
    say("|---:|---:|---:|---:|---:|---:|---:|")
    for tfwd, (s, rescales, _) in runs.items():
        span = makespan_h(s)
        p99 = (s.get("decision_ms") or {}).get("p99")
        say(f"| {tfwd:g} | {'-' if span is None else f'{span:.3f}'} | "
            f"{'-' if span is None or not base else f'{span / base:.4f}'} | "
            f"{s['total_samples']:.6g} | "
            f"{'-' if not span else format(s['total_samples'] / span, '.4g')} | {rescales} | "
            f"{'-' if p99 is None else f'{p99:.2f}'} |")
    results.finish()


if __name__ == "__main__":
    main()

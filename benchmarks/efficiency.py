"""The efficiency against dedicated nodes on the real log (offcut.replay.efficiency).

Samples the tasks trained on the offcuts / samples the same tasks would train with the same
node-hours on dedicated nodes, each at its best count per node, without preemptions or
rescales (BFTrainer, arXiv 2106.12091, reports up to 93 %). Replays, each through its own
private daemon (solver dp, the replays' Tfwd 10 s, every task to its end): the hps-shufflenet
10-task set on 128 and on 64 nodes of the real two-week log, and the ImageNet 1,001-task set
(100 admitted at once) on the whole 4,734-node machine. The figure lines also go, with the
machine and the command, to a new ``benchmarks/results/efficiency-DATE-TIME.txt``
(``--no-results``: not written). Each row gives the efficiency's parts too: the overhead
factor (what the tasks kept over what their held node counts give on dedicated nodes) times
the scaling factor (those counts' rate over the best count's) is the efficiency, and the share
of idle node-hours the tasks held (docs/replay-and-policies.md, "Efficiency against dedicated
nodes").

Usage::

    python benchmarks/efficiency.py                 # all three (about 2 minutes on 2 cores)
    python benchmarks/efficiency.py --skip-imagenet
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from real_data import NODE_LOG, parser, require
from results_log import ResultsLog, add_option


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--skip-imagenet", action="store_true", help="only the shufflenet runs")
    add_option(ap)
    args = ap.parse_args(argv)
    log = ResultsLog.from_args("efficiency", args, argv)
    require(args.data_dir, NODE_LOG, "hps-shufflenet-Jbnd-10J.pkl",
            *([] if args.skip_imagenet else ["ImageNet-imgps-Jbnd-1001J.pkl"]))
    log_path = args.data_dir / NODE_LOG

    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay

    runs = [("hps-shufflenet 10 tasks", "hps-shufflenet-Jbnd-10J.pkl", 128, 10),
            ("hps-shufflenet 10 tasks", "hps-shufflenet-Jbnd-10J.pkl", 64, 10)]
    if not args.skip_imagenet:
        runs.append(("ImageNet 1,001 tasks", "ImageNet-imgps-Jbnd-1001J.pkl", None, 100))
    out_root = args.out or Path(tempfile.mkdtemp(prefix="offcut-efficiency-"))
    rows = []
    for label, name, nodes, max_tasks in runs:
        tasks = load_task_set(args.data_dir / name, allow_pickle=True)
        node_log = load_node_log(log_path, num_nodes=nodes, allow_pickle=True)
        s = run_replay(node_log, tasks, out_root / f"{name}-{nodes or 'all'}", ReplayOptions(
            solver="dp", max_tasks=max_tasks, progress=False))
        rows.append((label, s["num_nodes"], s))
        print(f"{label} on {s['num_nodes']} nodes: efficiency {s['dedicated_efficiency']:.4f}",
              flush=True)
    print(f"\noutputs in {out_root}")
    log.say("| task set | nodes | samples trained | dedicated, same node-hours | efficiency | "
            "= overhead (vs the same counts) | x scaling (vs the best count) | "
            "idle node-hours used | node-hours used | tasks done |")
    log.say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, nodes, s in rows:
        log.say(f"| {label} | {nodes:,} | {s['total_samples']:.4g} | "
                f"{s['dedicated_samples']:.4g} | {100 * s['dedicated_efficiency']:.1f} % | "
                f"{s['same_counts_efficiency']:.3f} | {s['scaling_factor']:.3f} | "
                f"{100 * s['utilisation']:.1f} % | "
                f"{s['used_node_hours']:.0f} | {s['tasks_completed']} of {s['tasks_submitted']} |")
    log.finish()


if __name__ == "__main__":
    main()

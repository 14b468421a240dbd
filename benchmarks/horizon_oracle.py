"""Beyond a fixed horizon (issue 19, part 3): what knowing each idle node's true remaining idle
time is worth, measured on the real log.

BFTrainer weighs every rescale against one fixed look-ahead Tfwd (arXiv 2106.12091 §3;
docs/architecture.md §4, "The horizon"). Slurm often knows better (the next job's start on a
node, a reservation). Before building that, this replays the real two-week node log with an
*oracle* that reads each idle node's true remaining idle time from the log itself
(:class:`LogOracle`, handed to the scheduler as an
:class:`~offcut.daemon.scheduler.forecast.IdleForecast`), against the fixed horizon at the
daemon's default (60 s). Variants, each a full replay through its own in-process offcutd
(solver dp, replay clock, every task to its end):

* ``fixed``: Tfwd = 60 s, default placement (the baseline);
* ``placement``: oracle placement: a growing task takes the free nodes that stay idle longest
  (the task with the highest preemption cost Tcdw x rate first), a shrinking task releases
  the nodes that leave soonest; Tfwd 60 s;
* ``horizon-median`` / ``horizon-mean``: the count-level problem's horizon is the median /
  mean true remaining idle time of the idle pool at each event (default placement);
* ``both``: oracle placement and the median horizon.

Per variant it prints the makespan (first submission to the last task done), samples trained
(every task's total work when all finish) and samples per hour of makespan, task-level
preemption events (a task losing nodes to Slurm at one event) and the node events that
preempted at least one task (a placement without migration can at best bring the former
down to about the latter, one task hit per such event), rescales (start, stop, grow,
shrink: the scheduler's own changes), the samples lost to rescales and preemptions, and the
% change of each against ``fixed``; then the decision by the issue's rule: build the real
version if an oracle trains >= 2 % more samples per hour or cuts preemptions by >= 10 %.

Usage::

    python benchmarks/horizon_oracle.py                      # shufflenet 10 x 128 and 10 x 64
    python benchmarks/horizon_oracle.py --nodes 128 --variants fixed,placement
    python benchmarks/horizon_oracle.py --tasks ImageNet-imgps-Jbnd-1001J.pkl --nodes 0 \
        --max-tasks 100 --variants fixed,placement,horizon-median       # the whole machine
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from real_data import NODE_LOG, parser, require

VARIANTS = {  # name -> (oracle placement, horizon)
    "fixed": (False, "fixed"),
    "placement": (True, "fixed"),
    "horizon-median": (False, "median"),
    "horizon-mean": (False, "mean"),
    "both": (True, "median"),
}
#: the task set replayed by default
TASKS = "hps-shufflenet-Jbnd-10J.pkl"


class LogOracle:
    """The true remaining idle time of each node of a node log (the oracle).

    Built by reading the log's events once: per node the sorted times [s since epoch] at
    which it became busy, kept as one sorted array of keys ``node index x SPAN + time``, so
    that one ``searchsorted`` answers a whole pool. ``remaining_s(nodes, t)`` gives, per node,
    the time [s] from ``t`` to its next busy time after ``t``, or to the log's last event
    when it stays idle to the end (a lower bound there). Shape: (len(nodes),), >= 0.
    """

    #: key spacing between nodes [s]: above any epoch time of the log (exact in float64)
    SPAN = 1e10

    def __init__(self, node_log) -> None:
        from offcut.replay.driver import to_epoch

        self.index = {n: i for i, n in enumerate(node_log.node_names)}
        keys: list[float] = []
        end = to_epoch(node_log.initial_time)
        for change in node_log.events():
            end = to_epoch(change.time)
            keys.extend(self.index[n] * self.SPAN + end for n in change.became_busy)
        self.keys = np.append(np.sort(np.asarray(keys, dtype=float)), np.inf)  # (sentinel)
        self.end = end

    def remaining_s(self, nodes: Sequence[str], t: float) -> np.ndarray:
        """Seconds from ``t`` until each node of ``nodes`` next becomes busy (the log's end
        if never); shape (len(nodes),)."""
        base = np.fromiter((self.index[n] for n in nodes), float, len(nodes)) * self.SPAN
        pos = np.searchsorted(self.keys, base + t, side="right")
        nxt = self.keys[pos]
        busy = np.where(nxt < base + self.SPAN, nxt - base, self.end)
        return np.maximum(0.0, busy - t)


def replay_variant(node_log, tasks, out_dir: Path, variant: str, tfwd_s: float,
                   max_tasks: int, oracle: LogOracle | None) -> dict:
    """Replay ``tasks`` on ``node_log`` through an in-process offcutd (solver dp, replay
    clock, Tfwd ``tfwd_s`` [s]) with ``variant``'s forecast (:data:`VARIANTS`) from
    ``oracle``; returns the replay's summary plus ``preemptions``, ``rescales`` (from
    placements.csv), ``hit_events`` (node events that preempted at least one task) and
    ``lost_samples`` (rescale + preemption costs, from steps.csv)."""
    import pandas as pd

    from offcut.daemon.config import DaemonConfig
    from offcut.daemon.scheduler.forecast import IdleForecast
    from offcut.daemon.server import OffcutServer
    from offcut.replay.driver import ReplayOptions, run_replay

    place, horizon = VARIANTS[variant]
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="offcut-horizon-") as tmp:
        cfg = DaemonConfig(listen=f"unix://{tmp}/s.sock", state=f"{tmp}/state.sqlite",
                           solver="dp", clock="replay", tfwd_s=tfwd_s,
                           max_running_tasks=max_tasks, log_level="warning")
        srv = OffcutServer(cfg)
        srv.start()
        try:
            forecast = None
            if variant != "fixed":
                forecast = IdleForecast(oracle.remaining_s, placement=place, horizon=horizon)
            srv.engine.scheduler.idle_forecast = forecast
            summary = run_replay(node_log, tasks, out_dir, ReplayOptions(
                solver="dp", tfwd_s=tfwd_s, max_tasks=max_tasks, target=cfg.listen,
                progress=False))
            if srv.engine.scheduler.idle_forecast is not forecast:
                raise SystemExit(f"{variant}: the daemon reloaded its scheduler during the "
                                 "replay; the oracle was lost, the figures do not hold")
        finally:
            srv.stop(0.5)
    changes = pd.read_csv(out_dir / "placements.csv")["change"]
    steps = pd.read_csv(out_dir / "steps.csv")
    summary["preemptions"] = int((changes == "preempted").sum())
    summary["hit_events"] = int((steps["Npre"] > 0).sum())
    summary["rescales"] = int(changes.isin(["start", "stop", "grow", "shrink"]).sum())
    summary["lost_samples"] = float(steps["ReScost"].sum() + steps["PreCost"].sum())
    return summary


def pct(value: float | None, base: float | None) -> str:
    """``value`` against ``base`` as a signed percentage ('-' when either is missing)."""
    if value is None or not base:
        return "-"
    return f"{100.0 * (value / base - 1.0):+.2f} %"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--tasks", default=TASKS, help="task set file")
    ap.add_argument("--nodes", default="128,64",
                    help="node counts of the log to replay on (the log's first N nodes; 0: all)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"which of {', '.join(VARIANTS)} (fixed is always run first)")
    ap.add_argument("--tfwd", type=float, default=60.0, help="the fixed horizon [s]")
    ap.add_argument("--max-tasks", type=int, default=10, help="tasks admitted at once")
    args = ap.parse_args()
    variants = ["fixed"] + [v for v in args.variants.split(",") if v and v != "fixed"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    require(args.data_dir, NODE_LOG, args.tasks)

    import pandas as pd

    from offcut.replay.bftrainer_data import load_node_log, load_task_set

    out_root = args.out or Path(tempfile.mkdtemp(prefix="offcut-horizon-oracle-"))
    tasks = load_task_set(args.data_dir / args.tasks, allow_pickle=True)
    first = pd.Timestamp(min(t.submit_time for t in tasks)).value / 1e9
    results: dict[int, dict[str, dict]] = {}
    for nodes in (int(n) for n in args.nodes.split(",") if n):
        node_log = load_node_log(args.data_dir / NODE_LOG, num_nodes=nodes or None,
                                 allow_pickle=True)
        nodes = len(node_log.node_names)
        t0 = time.monotonic()
        oracle = LogOracle(node_log)
        print(f"{nodes} nodes: oracle built from the log in {time.monotonic() - t0:.1f} s",
              flush=True)
        results[nodes] = {}
        for variant in variants:
            t0 = time.monotonic()
            s = replay_variant(node_log, tasks, out_root / f"{nodes}-{variant}", variant,
                               args.tfwd, args.max_tasks, oracle)
            s["makespan_h"] = ((pd.Timestamp(s["all_done_at"]).value / 1e9 - first) / 3600.0
                               if s["all_done_at"] else None)
            s["samples_per_h"] = (s["total_samples"] / s["makespan_h"]
                                  if s["makespan_h"] else None)
            results[nodes][variant] = s
            print(f"  {variant}: makespan {s['makespan_h'] or float('nan'):.3f} h, "
                  f"{s['preemptions']} preemptions, {s['rescales']} rescales "
                  f"({time.monotonic() - t0:.0f} s wall)", flush=True)

    print(f"\n{args.tasks}, {args.max_tasks} admitted, fixed Tfwd {args.tfwd:g} s, solver dp; "
          f"outputs in {out_root}")
    print("| nodes | variant | makespan [h] | samples trained | samples/h (vs fixed) | "
          "preemptions (vs fixed) | node events preempting | rescales (vs fixed) | "
          "lost to rescales + preemptions [samples] |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    gains = []
    for nodes, runs in results.items():
        base = runs["fixed"]
        for variant, s in runs.items():
            span, rate = s["makespan_h"], s["samples_per_h"]
            print(f"| {nodes} | {variant} | {'-' if span is None else f'{span:.3f}'} | "
                  f"{s['total_samples']:.6g} | "
                  f"{'-' if rate is None else f'{rate:.4g}'} "
                  f"({pct(s['samples_per_h'], base['samples_per_h'])}) | "
                  f"{s['preemptions']} ({pct(s['preemptions'], base['preemptions'])}) | "
                  f"{s['hit_events']} | "
                  f"{s['rescales']} ({pct(s['rescales'], base['rescales'])}) | "
                  f"{s['lost_samples']:.4g} |")
            if variant != "fixed" and s["samples_per_h"] and base["samples_per_h"]:
                gains.append((nodes, variant, s["samples_per_h"] / base["samples_per_h"] - 1.0,
                              1.0 - s["preemptions"] / max(base["preemptions"], 1)))
    wins = [g for g in gains if g[2] >= 0.02 or g[3] >= 0.10]
    print("\nDecision (issue 19: build if >= 2 % more samples/h or >= 10 % fewer preemptions): "
          + ("BUILD the real version; the oracle wins in " + ", ".join(
              f"{v} on {n} nodes ({100 * g:+.2f} % samples/h, {100 * p:.1f} % fewer "
              "preemptions)" for n, v, g, p in wins) if wins else
             "do NOT build it; no oracle reaches either threshold"))


if __name__ == "__main__":
    main()

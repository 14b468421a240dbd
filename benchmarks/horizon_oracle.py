"""Beyond a fixed horizon (issue 19, part 3): what knowing each idle node's true remaining idle
time is worth, measured on the real log.

BFTrainer weighs every rescale against one fixed look-ahead Tfwd (arXiv 2106.12091, Section 3;
docs/architecture.md, "The horizon"). Slurm often knows better (the next job's start on a
node, a reservation). Before building that, this replays the real two-week node log with an
*oracle* that reads each idle node's true remaining idle time from the log itself
(:class:`LogOracle`, handed as an :class:`IdleForecast` to :class:`ForecastRules`, this
benchmark's own variant of the scheduler's placement rules), against the fixed horizon at the
daemon's default (60 s). The variant lives here, not in the product: offcutd never uses a
forecast (it is neither persisted nor journaled, so a daemon using it would not re-apply its
journal to the same placements after a restart). Variants, each a full replay through its own in-process offcutd
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

from offcut.daemon.app.model import Task
from offcut.daemon.app.scheduler import Scheduler
from offcut.daemon.app.scheduler.interfaces import Models
from offcut.daemon.app.scheduler.placement_rules import PlacementRules
from offcut.daemon.app.scheduler.state import SchedulerState
from real_data import NODE_LOG, parser, require
from results_log import ResultsLog, add_option

VARIANTS = {  # name -> (oracle placement, horizon)
    "fixed": (False, "fixed"),
    "placement": (True, "fixed"),
    "horizon-median": (False, "median"),
    "horizon-mean": (False, "mean"),
    "both": (True, "median"),
}
#: the task set replayed by default
TASKS = "hps-shufflenet-Jbnd-10J.pkl"
#: how the count-level problem's horizon is chosen: ``fixed`` = Tfwd (``tfwd_s``); ``median`` /
#: ``mean`` = the median / mean expected remaining idle time of the idle pool at the event
HORIZONS = ("fixed", "median", "mean")


@dataclass(frozen=True)
class IdleForecast:
    """Expected remaining idle time of idle nodes, and what :class:`ForecastRules` do
    with it (docs/architecture.md, "The horizon").

    Attributes:
        remaining_s: ``(nodes, t) -> array (len(nodes),)``: each node's expected remaining
            idle time [s] at event time ``t`` [s since epoch], >= 0 (an oracle replaying a
            log knows the true one: :meth:`LogOracle.remaining_s`).
        placement: choose node identities by it: a shrinking task releases the nodes that
            leave soonest, growing tasks take the free nodes that stay longest, the task with
            the highest preemption cost (Tcdw x its rate at the new count, samples) first.
        horizon: one of :data:`HORIZONS`: the look-ahead [s] the allocation problem weighs
            rescale costs against (BFTrainer, arXiv 2106.12091, Section 3, the Tfwd of its
            objective).
        min_horizon_s: the smallest horizon used [s] (> 0: the problem needs a positive one).

    Raises ``ValueError`` naming ``horizon`` or ``min_horizon_s`` when either is out of range.
    """

    remaining_s: Callable[[Sequence[str], float], np.ndarray]
    placement: bool = False
    horizon: Literal["fixed", "median", "mean"] = "fixed"
    min_horizon_s: float = 1.0

    def __post_init__(self) -> None:
        if self.horizon not in HORIZONS:
            raise ValueError(f"horizon must be one of {', '.join(HORIZONS)}, got {self.horizon!r}")
        if not self.min_horizon_s > 0:
            raise ValueError(f"min_horizon_s must be > 0, got {self.min_horizon_s!r}")

    def by_node(self, nodes: Sequence[str], t: float) -> dict[str, float]:
        """``{node: expected remaining idle time [s]}`` of ``nodes`` at ``t``."""
        nodes = list(nodes)
        return dict(zip(nodes, np.asarray(self.remaining_s(nodes, t), dtype=float).tolist()))

    def horizon_s(self, pool: Sequence[str], t: float, tfwd_s: float) -> float:
        """The allocation horizon [s] at ``t`` on the idle ``pool``: ``tfwd_s`` when
        ``horizon`` is ``fixed`` or the pool is empty, else the pool's median / mean expected
        remaining idle time, at least ``min_horizon_s``."""
        if self.horizon == "fixed" or not pool:
            return tfwd_s
        left = np.asarray(self.remaining_s(list(pool), t), dtype=float)
        value = float(np.median(left) if self.horizon == "median" else left.mean())
        return max(self.min_horizon_s, value)


def shrink_by_forecast(nodes: list[str], keep: int, remaining_s: Mapping[str, float]
                       ) -> tuple[list[str], list[str]]:
    """Split ``nodes`` into (kept, released) keeping the ``keep`` nodes expected to stay idle
    longest (``remaining_s``: node -> expected remaining idle time [s]; ties by name), so
    that a node Slurm takes back soon leaves without preempting the task.

    Raises ``ValueError`` if ``keep`` is negative or larger than ``len(nodes)``.
    """
    if not 0 <= keep <= len(nodes):
        raise ValueError(f"cannot keep {keep} of {len(nodes)} nodes")
    ordered = sorted(nodes, key=lambda n: (-remaining_s[n], n))
    return sorted(ordered[:keep]), sorted(ordered[keep:])


def grow_by_forecast(extra: int, free: list[str], remaining_s: Mapping[str, float]) -> list[str]:
    """Pick the ``extra`` nodes of ``free`` expected to stay idle longest (``remaining_s``:
    node -> expected remaining idle time [s]; ties by name), in pick order.

    Raises ``ValueError`` if fewer than ``extra`` nodes are free.
    """
    if extra > len(free):
        raise ValueError(f"need {extra} free nodes, only {len(free)} free")
    if extra <= 0:
        return []
    return sorted(free, key=lambda n: (-remaining_s[n], n))[:extra]


class ForecastRules(PlacementRules):
    """The scheduler's placement rules with an :class:`IdleForecast` (``forecast``; None:
    exactly the daemon's rules): the count-level problem's horizon and, with
    ``forecast.placement``, the node identities follow each idle node's expected remaining
    idle time. The product's rules are the methods of
    :class:`~offcut.daemon.app.scheduler.placement_rules.PlacementRules`; this variant overrides
    them, reading the scheduler's state and its task models (the dearest task to preempt:
    Tcdw x its rate at the new count).

    :func:`use_forecast` puts them in a running daemon's scheduler."""

    def __init__(self, state: SchedulerState, models: Models,
                 forecast: IdleForecast | None) -> None:
        super().__init__(state)
        self.models = models
        self.forecast = forecast

    def horizon_s(self) -> float:
        """The forecast's horizon (:meth:`IdleForecast.horizon_s` on the idle pool at the
        scheduler's clock) instead of Tfwd."""
        f, state = self.forecast, self.state
        if f is None or f.horizon == "fixed" or state.clock is None:
            return super().horizon_s()
        return f.horizon_s(list(state.pool), state.clock, state.tfwd_s)

    def _placing(self) -> bool:
        return self.forecast is not None and self.forecast.placement

    def shrink_nodes(self, task: Task, keep: int, t: float) -> tuple[list[str], list[str]]:
        if not self._placing():
            return super().shrink_nodes(task, keep, t)
        return shrink_by_forecast(task.nodes, keep, self.forecast.by_node(task.nodes, t))

    def growth_order(self, tasks: list[Task], counts: list[int]) -> list[tuple[Task, int]]:
        order = super().growth_order(tasks, counts)
        if self._placing():  # the dearest task to preempt takes the longest-lived nodes
            order.sort(key=lambda tn: -self.models.rescale_costs(tn[0])[1]
                       * self.models.rate_at(*tn))
        return order

    def pick_free_nodes(self, task: Task, extra: int, free: list[str], t: float) -> list[str]:
        if not self._placing():
            return super().pick_free_nodes(task, extra, free, t)
        return grow_by_forecast(extra, free, self.forecast.by_node(free, t))


def use_forecast(scheduler: Scheduler, forecast: IdleForecast | None) -> ForecastRules:
    """Give a running daemon's ``scheduler`` (``OffcutServer.engine.scheduler``)
    :class:`ForecastRules` with ``forecast`` (its state stays; the daemon builds only its own
    scheduler). Returns the rules. The daemon loses them when it reloads its scheduler from
    the state file (after a failed commit): callers check that ``engine.scheduler`` is the
    same scheduler and ``scheduler.rules`` the same rules afterwards."""
    rules = ForecastRules(scheduler.state, scheduler.models, forecast)
    scheduler.use_placement_rules(rules)
    return rules


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
    from offcut.daemon.edge.server import OffcutServer
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
            scheduler = srv.engine.scheduler
            rules = use_forecast(scheduler, forecast)
            summary = run_replay(node_log, tasks, out_dir, ReplayOptions(
                solver="dp", tfwd_s=tfwd_s, max_tasks=max_tasks, target=cfg.listen,
                progress=False))
            if srv.engine.scheduler is not scheduler or scheduler.rules is not rules:
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
    add_option(ap)
    args = ap.parse_args()
    log = ResultsLog.from_args("horizon_oracle", args)
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

    with log.tee():  # the report: printed and kept for the results file
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

    log.finish()


if __name__ == "__main__":
    main()

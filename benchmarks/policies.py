"""Allocation policies side by side on the real log: throughput (BFTrainer), energy and
fair_share (max-min fair node-hours per owner).

The hps-shufflenet set (10 tasks) on 128 real nodes, as ``tests/test_replay_e2e.py`` and
docs/replay-and-policies.md replay it, each through its own private daemon (``offcut replay bftrainer --owners N
--policy P``). The log has no users: the tasks get ``--owners`` owners user1..userN with the
replay's skewed split (user k has weight 1/k; ``offcut.replay.owners.assign_owners``).

Printed per policy: samples trained, when all tasks were done, energy of the idle pool (the
daemon's model: tasks' nodes at ``node_power_w``, unused idle nodes at ``idle_node_power_w``)
[kWh], node-hours per owner and Jain's index / min-max of them, twice:

* over the whole run: each owner's total follows its work (an owner with more tasks needs
  more node-hours whatever the policy), so this shows the cost side;
* in the *contended window*: from the first submission until the first moment an owner has
  finished all its tasks (the earliest such moment over the compared runs, so all runs are cut
  at the same time); while every owner still has work, a fair policy should give them equal
  node-hours.

The figure lines also go, with the machine and the command, to a new
``benchmarks/results/policies-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/policies.py                       # 128 nodes, 3 owners, solver dp
    python benchmarks/policies.py --owners 2 --policies throughput,fair_share
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"


def contended_until(summary: dict) -> float | None:
    """The first time [s since epoch] an owner of the run had finished all its tasks (None if
    no owner did)."""
    import pandas as pd

    last: dict[str, float | None] = {}
    for t in summary["tasks"]:
        done = pd.Timestamp(t["finish_time"]).value / 1e9 if t["finish_time"] else None
        prev = last.get(t["owner"], 0.0)
        last[t["owner"]] = None if done is None or prev is None else max(prev, done)
    ends = [v for v in last.values() if v is not None]
    return min(ends) if ends else None


def node_hours_until(out: Path, summary: dict, until: float) -> dict[str, float]:
    """Node-hours per owner up to ``until`` [s since epoch], from the run's placements.csv."""
    import pandas as pd

    from offcut.replay.owners import NodeTime, by_owner

    node_time = NodeTime()
    for r in pd.read_csv(out / "placements.csv").itertuples():
        node_time.change(r.task_id, pd.Timestamp(r.time).value / 1e9, int(r.nodes))
    owner_of = {t["task_id"]: t["owner"] for t in summary["tasks"]}
    hours = {k: v / 3600.0 for k, v in node_time.seconds(until).items()}
    return by_owner(hours, owner_of, sorted(set(owner_of.values())))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                    help="the BFTrainer data folder (node log and job sets; ../shared/data)")
    ap.add_argument("--num-nodes", type=int, default=128, help="nodes of the log replayed")
    ap.add_argument("--owners", type=int, default=3,
                    help="task owners user1..userN (skewed split: user k has weight 1/k)")
    ap.add_argument("--policies", default="throughput,energy,fair_share",
                    help="comma-separated policy names (built-in or installed plugins)")
    ap.add_argument("--solver", default="dp", help="allocation backend of every daemon")
    ap.add_argument("--tfwd", type=float, default=10.0, help="look-ahead Tfwd [s]")
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    add_option(ap)
    args = ap.parse_args(argv)
    results = ResultsLog.from_args("policies", args, argv)
    say = results.say

    log_path = args.data_dir / "ndstat-10sdn6-evt.tar.gz"
    tasks_path = args.data_dir / "hps-shufflenet-Jbnd-10J.pkl"
    if not (log_path.exists() and tasks_path.exists()):
        raise SystemExit(f"skipped: the real BFTrainer data is not at {args.data_dir} "
                         "(see ../shared/data/README.md)")

    import pandas as pd

    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay
    from offcut.replay.owners import fairness

    out_root = args.out or Path(tempfile.mkdtemp(prefix="offcut-policies-"))
    policies = [p for p in args.policies.split(",") if p]
    tasks = load_task_set(tasks_path, allow_pickle=True)
    runs = {}
    for policy in policies:
        log = load_node_log(log_path, num_nodes=args.num_nodes, allow_pickle=True)
        runs[policy] = run_replay(log, tasks, out_root / policy, ReplayOptions(
            solver=args.solver, tfwd_s=args.tfwd, objective=policy, owners=args.owners,
            progress=False))
    ends = [e for e in (contended_until(s) for s in runs.values()) if e is not None]
    cut = min(ends) if ends else None
    first_submit = min(t.submit_time for t in tasks)

    print(f"outputs in {out_root}")
    say(f"hps-shufflenet {len(tasks)} tasks, {args.num_nodes} nodes, {args.owners} owners, "
        f"solver {args.solver}, Tfwd {args.tfwd:g} s")
    owners = sorted(next(iter(runs.values()))["owners"])
    tasks_of = {o: next(iter(runs.values()))["owners"][o]["tasks"] for o in owners}
    say("owners: " + ", ".join(f"{o} {tasks_of[o]} tasks" for o in owners))
    if cut is not None:
        say(f"contended window: {first_submit} -> {pd.Timestamp(cut, unit='s').round('s')} "
            f"(the first time an owner had finished all its tasks, earliest over the runs)")
    rows = [("samples trained", lambda s, w: f"{s['total_samples']:.4g}"),
            ("all tasks done at", lambda s, w: str(s["all_done_at"]).replace("T", " ")),
            ("energy [kWh]", lambda s, w: f"{s['energy_j'] / 3.6e6:.1f}"),
            ("samples per joule", lambda s, w: f"{s['samples_per_joule']:.4f}")]
    for o in owners:
        rows.append((f"node-hours {o}, whole run", lambda s, w, o=o: f"{s['owners'][o]['node_hours']:.1f}"))
    rows += [("Jain's index, whole run", lambda s, w: f"{s['fairness']['jain']:.3f}"),
             ("min/max, whole run", lambda s, w: f"{s['fairness']['min_max']:.3f}")]
    windows = {}
    if cut is not None:
        for policy, s in runs.items():
            windows[policy] = node_hours_until(out_root / policy, s, cut)
        for o in owners:
            rows.append((f"node-hours {o}, window", lambda s, w, o=o: f"{w[o]:.1f}"))
        rows += [("Jain's index, window", lambda s, w: f"{fairness(list(w.values()))['jain']:.3f}"),
                 ("min/max, window", lambda s, w: f"{fairness(list(w.values()))['min_max']:.3f}")]
    width = max(len(r[0]) for r in rows)
    cols = [max(len(p), 19) for p in policies]
    say(f"| {'':{width}s} | " + " | ".join(f"{p:>{c}s}" for p, c in zip(policies, cols)) + " |")
    say(f"|{'-' * (width + 2)}|" + "|".join("-" * (c + 2) for c in cols) + "|")
    for label, cell in rows:
        say(f"| {label:{width}s} | " + " | ".join(
            f"{cell(runs[p], windows.get(p)):>{c}s}" for p, c in zip(policies, cols)) + " |")
    results.finish()


if __name__ == "__main__":
    main()

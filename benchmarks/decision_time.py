"""Decision time per allocation backend (DESIGN §4): p50/p99 wall time [ms].

Instances (tasks x idle nodes): 10x128, 50x512, 100x4734, with task curves drawn from the
real BFTrainer ImageNet-imgps 1001-job set when ``--data-dir`` has it (else synthetic Amdahl
curves), random current counts c_j; optionally real recorded instances (``--records``).
Backends run in-process (no worker isolation) so the numbers are the solver's own cost.

    python benchmarks/decision_time.py [--repeat 5] [--solvers dp,cbc,gurobi,greedy]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from offcut.daemon.solvers.base import SolverFailed
from offcut.daemon.solvers.cbc import solve_cbc
from offcut.daemon.solvers.dp import solve_dp
from offcut.daemon.solvers.greedy import solve_greedy
from offcut.daemon.solvers.gurobi import choose_form, gurobi_importable, solve_gurobi
from offcut.daemon.solvers.problem import AllocationProblem

SIZES = [(10, 128), (50, 512), (100, 4734)]
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def load_jobs(data_dir: Path):
    """(Ns, Os, Jmin, Jmax, Tcup, Tcdw) per job from the ImageNet-imgps set, or None."""
    folder = data_dir / "bftrainer"
    if not (folder / "ImageNet-imgps-JNPs-1001J.pkl").exists():
        return None
    import pandas as pd

    nps = pd.read_pickle(folder / "ImageNet-imgps-JNPs-1001J.pkl")
    bnd = pd.read_pickle(folder / "ImageNet-imgps-Jbnd-1001J.pkl").loc[nps.index]
    return [(np.array(n), np.array(o), int(b.Jmin), int(b.Jmax), float(b.Tcup), float(b.Tcdw))
            for n, o, (_, b) in zip(nps["Ns"], nps["Os"], bnd.iterrows())]


def synthetic_jobs(rng, count=200):
    """Amdahl curves S(n) = r * n / (1 + a (n - 1)) sampled at 0, 1, 2, 4, ..., 64."""
    ns = np.array([0, 1, 2, 4, 8, 16, 32, 64])
    jobs = []
    for _ in range(count):
        r, a = rng.uniform(1e3, 1e4), rng.uniform(0.001, 0.05)
        os_ = np.where(ns > 0, r * ns / (1 + a * (np.maximum(ns, 1) - 1)), 0.0)
        jobs.append((ns, os_, 1, 64, rng.uniform(17, 19), rng.uniform(11, 13)))
    return jobs


def make_instance(jobs, J, N, rng) -> AllocationProblem:
    pick = rng.choice(len(jobs), J, replace=False)
    sel = [jobs[i] for i in pick]
    cur = np.zeros(J, dtype=int)
    held = rng.random(J) < 0.7
    cur[held] = rng.integers(1, max(2, 2 * N // J), held.sum())
    while cur.sum() > N:
        cur[int(np.argmax(cur))] -= 1
    return AllocationProblem(N, cur, [s[2] for s in sel], [s[3] for s in sel],
                             [s[0] for s in sel], [s[1] for s in sel], 10.0,
                             [s[4] for s in sel], [s[5] for s in sel])


def run_solver(name, p, limit):
    if name == "dp":
        return solve_dp(p)
    if name == "greedy":
        return solve_greedy(p)
    if name == "cbc":
        return solve_cbc(p, limit)
    if name == "gurobi":
        return solve_gurobi(p, limit)
    raise ValueError(name)


def record_real_replay(folder: Path, num_nodes: int, max_events: int) -> Path:
    """Run a real replay (private daemon, solver dp) with --record-instances; return the
    JSONL path (in a temporary folder)."""
    import tempfile

    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay

    tmp = Path(tempfile.mkdtemp(prefix="offcut-bench-"))
    records = tmp / f"replay-{num_nodes}n.jsonl"
    log = load_node_log(folder / "ndstat-10sdn6-evt.tar.gz", num_nodes=num_nodes, allow_pickle=True)
    tasks = load_task_set(folder / "hps-shufflenet-Jbnd-10J.pkl", allow_pickle=True)
    print(f"recording the instances of a real replay: {num_nodes} nodes, {max_events} events ...")
    run_replay(log, tasks, tmp / "out", ReplayOptions(solver="dp", max_events=max_events,
                                                      record_instances=str(records),
                                                      progress=False))
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="instances per size (default 5)")
    ap.add_argument("--solvers", default="dp,cbc,gurobi,greedy")
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--records", type=Path, help="JSONL of recorded instances, also timed")
    ap.add_argument("--replay-nodes", type=int, default=128,
                    help="without --records: record the instances of a real replay on this many "
                         "nodes (hps-shufflenet 10 tasks, Tfwd 10 s) and time them (0 = skip)")
    ap.add_argument("--replay-events", type=int, default=600,
                    help="events of that replay (default 600)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="MILP time limit [s]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    rng = np.random.default_rng(args.seed)
    jobs = load_jobs(args.data_dir)
    source = "ImageNet-imgps-1001J" if jobs else "synthetic Amdahl"
    jobs = jobs or synthetic_jobs(rng)
    sets = [(f"{J}x{N}", [make_instance(jobs, J, N, rng) for _ in range(args.repeat)])
            for J, N in SIZES]
    if not args.records and args.replay_nodes and (args.data_dir / "bftrainer").is_dir():
        args.records = record_real_replay(args.data_dir / "bftrainer", args.replay_nodes,
                                          args.replay_events)
    if args.records:
        from offcut.daemon.solvers.records import read_records

        sets.append((f"records:{args.records.name}", [p for _, p in read_records(args.records)]))
    if "gurobi" in solvers and not gurobi_importable():
        print("gurobi: gurobipy not importable, skipped")
        solvers.remove("gurobi")
    print(f"task curves: {source}; {args.repeat} instances per size; times in ms (wall, in-process)")
    header = f"{'instances':>16} {'solver':>8} {'p50':>9} {'p99':>9} {'p50/dp':>7} {'gap_max':>8} {'note':s}"
    print(header)
    for label, probs in sets:
        p50_dp = None
        opt = [solve_dp(p).objective for p in probs]
        for name in solvers:
            times, gaps, note = [], [], ""
            for p, best in zip(probs, opt):
                if name == "gurobi":
                    try:
                        form = choose_form(p)
                    except SolverFailed:
                        note = "does not fit the size-limited licence"
                        break
                    note = f"form {form}"
                t0 = time.perf_counter()
                try:
                    s = run_solver(name, p, args.time_limit)
                except SolverFailed as exc:
                    note = f"failed: {exc}"
                    break
                times.append((time.perf_counter() - t0) * 1e3)
                gaps.append((best - s.objective) / max(1.0, abs(best)))
            if not times:
                print(f"{label:>16} {name:>8} {'-':>9} {'-':>9} {'-':>7} {'-':>8} {note}")
                continue
            p50, p99 = np.percentile(times, 50), np.percentile(times, 99)
            if name == "dp":
                p50_dp = p50
            ratio = f"{p50 / p50_dp:7.1f}" if p50_dp else f"{'-':>7}"
            print(f"{label:>16} {name:>8} {p50:9.2f} {p99:9.2f} {ratio} {max(gaps):8.1e} {note}")


if __name__ == "__main__":
    main()

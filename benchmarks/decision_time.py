"""Decision time per allocation backend (docs/architecture.md, "Solver backends"): p50/p99 wall time
[ms].

Instances (tasks x idle nodes): 10x128, 50x512, 100x4734, with task curves drawn from the
real BFTrainer ImageNet-imgps 1001-job set when ``--data-dir`` has it (else synthetic Amdahl
curves), random current counts c_j; optionally real recorded instances (``--records``).
Backends run in-process (no worker isolation) so the numbers are the solver's own cost.

The "anchor" row is BFTrainer's original NODE-LEVEL MILP (Liu et al., arXiv 2106.12091, Section 3:
binaries x[j][n] per task and idle node, no-migration grow/shrink big-M, SOS2 curves) solved
by CBC with ``--anchor-time-limit``; each solve runs in a spawned child process killed at
time limit + 20 s (python-mip 2.0.0's CBC can abort or hang on SOS models). Its time is
the child's build + solve wall time (process start excluded; killed runs: the parent's wait).

    python benchmarks/decision_time.py [--repeat 5] [--solvers dp,cbc,gurobi,greedy]
                                       [--anchor-sizes 10x128] [--anchor-time-limit 10]

The MILP rows include the tie-breaking stages (``offcut.daemon.app.solvers.ties``, the rule all
exact backends follow); the ``<name>-noties`` rows time the same backend without them (its
first optimum, which may differ from dp's counts), and ``same=k/n`` counts the instances whose
counts equal dp's. The figure lines also go, with the machine and the command, to a new
``benchmarks/results/decision_time-DATE-TIME.txt`` (``--no-results``: not written).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

from offcut.daemon.app.solvers.base import SolverFailed
from offcut.daemon.app.solvers.cbc import solve_cbc
from offcut.daemon.app.solvers.dp import solve_dp
from offcut.daemon.app.solvers.greedy import solve_greedy
from offcut.daemon.app.solvers.gurobi import choose_form, gurobi_importable, solve_gurobi
from offcut.daemon.app.solvers.problem import AllocationProblem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

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
    """Solve ``p`` with backend ``name`` (``cbc-noties``/``gurobi-noties``: without the
    tie-breaking stages); returns the Solution."""
    if name == "dp":
        return solve_dp(p)
    if name == "greedy":
        return solve_greedy(p)
    if name.startswith("cbc"):
        return solve_cbc(p, limit, ties=not name.endswith("-noties"))
    if name.startswith("gurobi"):
        return solve_gurobi(p, limit, ties=not name.endswith("-noties"))
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


# ---------------------------------------------------------------------- node-level anchor
ANCHOR_KILL_MARGIN_S = 20.0


def anchor_binaries(J: int, N: int) -> int:
    """Binaries of the node-level model: x (J*N) + zero/range pair (2J) + grow/shrink mode (J)
    + up/down (2J)."""
    return J * N + 5 * J


def build_anchor_model(p: AllocationProblem):
    """BFTrainer's node-level MILP (arXiv 2106.12091, Section 3) for ``p`` as a python-mip CBC
    model.

    Returns (model, n_vars per task (J,) linear expressions, binaries, constraints).
    """
    import mip

    J, N = p.num_tasks, p.idle_nodes
    cur = [int(c) for c in p.current_nodes]
    m = mip.Model(sense=mip.MAXIMIZE, solver_name=mip.CBC)
    m.verbose = 0
    m.max_mip_gap = 1e-9
    m.max_mip_gap_abs = 1e-9
    # current map c[j][n]: task j holds nodes [start_j, start_j + c_j)
    starts = np.concatenate([[0], np.cumsum(cur)[:-1]]).astype(int) if J else []
    x = [[m.add_var(var_type=mip.BINARY) for _ in range(N)] for _ in range(J)]
    for n in range(N):  # each node to at most one task
        m += mip.xsum(x[j][n] for j in range(J)) <= 1
    bigm = N + 1
    counts, terms = [], []
    for j in range(J):
        nj = mip.xsum(x[j])
        counts.append(nj)
        jmin, jmax = int(p.min_nodes[j]), int(p.max_nodes[j])
        # 0 or within [Jmin, Jmax]: two binaries, exactly one on
        z0, z1 = m.add_var(var_type=mip.BINARY), m.add_var(var_type=mip.BINARY)
        m += z0 + z1 == 1
        m += nj >= jmin * z1
        m += nj <= jmax * z1
        # no migration: grow/keep (g=1, keep every current node) or shrink (g=0, no new node)
        g = m.add_var(var_type=mip.BINARY)
        held = range(starts[j], starts[j] + cur[j])
        others = [n for n in range(N) if not (starts[j] <= n < starts[j] + cur[j])]
        if cur[j]:
            m += mip.xsum(x[j][n] for n in held) >= cur[j] - bigm * (1 - g)
        m += mip.xsum(x[j][n] for n in others) <= bigm * g
        # objective curve: SOS2 lambda weights over (Ns, Os); extend flat to cover N nodes
        ns = [float(v) for v in p.node_counts[j]]
        os_ = [float(v) for v in p.objective_values[j]]
        top = min(jmax, N)
        if ns[-1] < top:
            ns.append(float(top))
            os_.append(os_[-1])
        lam = [m.add_var(lb=0.0, ub=1.0) for _ in ns]
        m += mip.xsum(lam) == 1
        m += nj == mip.xsum(w * l for w, l in zip(ns, lam))
        m.add_sos(list(zip(lam, ns)), 2)
        sj = mip.xsum(o * l for o, l in zip(os_, lam))
        # rescale up / down indicators
        u, d = m.add_var(var_type=mip.BINARY), m.add_var(var_type=mip.BINARY)
        m += nj <= cur[j] + (N - cur[j]) * u
        m += nj >= cur[j] - cur[j] * d
        r = p.current_rate(j)
        terms.append(p.tfwd_s * sj - float(p.rescale_up_s[j]) * r * u
                     - float(p.rescale_down_s[j]) * r * d)
    m.objective = mip.xsum(terms)
    binaries = sum(1 for v in m.vars if v.var_type == mip.BINARY)
    return m, x, binaries, m.num_rows


def _anchor_child(p: AllocationProblem, time_limit_s: float, conn) -> None:
    """Child process body: build, solve, send a result dict through ``conn``."""
    out: dict = {}
    try:
        import mip

        t0 = time.perf_counter()
        m, x, binaries, rows = build_anchor_model(p)
        out.update(binaries=binaries, constraints=rows, build_s=time.perf_counter() - t0)
        conn.send(dict(out, stage="built"))
        t1 = time.perf_counter()
        st = m.optimize(max_seconds=float(time_limit_s))
        out.update(solve_s=time.perf_counter() - t1, wall_s=time.perf_counter() - t0,
                   status=st.name)
        if m.num_solutions > 0 and st in (mip.OptimizationStatus.OPTIMAL,
                                          mip.OptimizationStatus.FEASIBLE):
            counts = [int(round(sum(v.x for v in row))) for row in x]
            out.update(counts=counts, milp_obj=float(m.objective_value),
                       bound=float(m.objective_bound))
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        out.update(error=f"{type(exc).__name__}: {exc}")
    conn.send(dict(out, stage="done"))
    conn.close()


def run_anchor(p: AllocationProblem, time_limit_s: float) -> dict:
    """Solve the node-level MILP of ``p`` in a spawned child; hard kill at limit + 20 s.

    Returns a dict with ``outcome`` in {optimal, feasible, no solution, crashed, killed}
    plus whatever the child reported (binaries, constraints, wall_s, counts, milp_obj, bound).
    """
    ctx = mp.get_context("spawn")
    res: dict = {}
    t0 = time.perf_counter()
    try:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_anchor_child, args=(p, time_limit_s, send), daemon=True)
        proc.start()
        send.close()
        deadline = t0 + time_limit_s + ANCHOR_KILL_MARGIN_S
        while True:
            try:
                if recv.poll(0.1):
                    res.update(recv.recv())
                    if res.get("stage") == "done":
                        break
                    continue
            except (EOFError, OSError):
                break  # the child died
            if not proc.is_alive() and not recv.poll(0):
                break
            if time.perf_counter() > deadline:
                break
        if proc.is_alive() and res.get("stage") != "done":
            proc.kill()
            proc.join(5)
            res.update(outcome="killed")
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        res.setdefault("exitcode", proc.exitcode)
    except BaseException as exc:  # noqa: BLE001
        res.update(outcome="crashed", error=f"parent: {type(exc).__name__}: {exc}")
    res.setdefault("parent_wall_s", time.perf_counter() - t0)
    if "outcome" not in res:
        if res.get("stage") != "done":
            res["outcome"] = "crashed"
            res.setdefault("error", f"child exit code {res.get('exitcode')}")
        elif "error" in res:
            res["outcome"] = "crashed"
        elif "counts" in res:
            res["outcome"] = "optimal" if res["status"] == "OPTIMAL" else "feasible"
        else:
            res["outcome"] = "no solution"
    return res


def anchor_row(label: str, probs, time_limit_s: float, dp_p99_ms: float | None,
               dp_p50_ms: float | None = None):
    """Run the anchor on every instance of one size; return (row text, ratio text or None)."""
    walls, gaps, outcomes, notes = [], [], [], []
    size = ""
    for p in probs:
        r = run_anchor(p, time_limit_s)
        if "binaries" in r and not size:
            size = f"{r['binaries']} bin / {r['constraints']} cons"
        wall = r.get("wall_s", r["parent_wall_s"])
        oc = r["outcome"]
        if oc in ("optimal", "feasible"):
            walls.append(wall * 1e3)
            best = solve_dp(p).objective
            try:
                val = p.evaluate(np.asarray(r["counts"]))
            except ValueError as exc:
                outcomes.append(f"{oc} but re-score failed ({exc})")
                continue
            gaps.append((best - val) / max(1.0, abs(best)))
            if oc == "feasible":
                mg = (r["bound"] - r["milp_obj"]) / max(1.0, abs(r["milp_obj"]))
                oc = f"feasible gap {mg:.1e}"
            if abs(r["milp_obj"] - val) > 1e-6 * max(1.0, abs(val)):
                notes.append(f"CBC's own objective {r['milp_obj']:.6g} != re-scored "
                             f"{val:.6g} (its answer breaks the SOS2/lambda rows)")
        elif oc == "killed":
            oc = f"killed after {r['parent_wall_s']:.0f} s"
            if r.get("stage") == "built":
                oc += " (in optimize)"
        elif oc == "crashed":
            oc = f"crashed [{r.get('error', '')[:60]}]"
        elif oc == "no solution":
            oc = f"no solution ({r.get('status')}, {wall:.1f} s)"
        outcomes.append(oc)
    summary = ", ".join(f"{o} x{outcomes.count(o)}" for o in dict.fromkeys(outcomes))
    note = f"node-level MILP, CBC {time_limit_s:g} s: {size or 'size n/a'}; {summary}"
    if notes:
        note += "; " + "; ".join(dict.fromkeys(notes))
    ratio = None
    if not walls:
        return f"{label:>16} {'anchor':>13} {'-':>9} {'-':>9} {'-':>7} {'-':>8} {note}", None
    p50, p99 = np.percentile(walls, 50), np.percentile(walls, 99)
    if dp_p99_ms:
        ratio = f"{label}: anchor p50 {p50:.0f} ms / dp p99 {dp_p99_ms:.3f} ms = {p50 / dp_p99_ms:.3g}x"
        if len(walls) < len(probs):
            ratio += f" ({len(walls)}/{len(probs)} finished)"
    gap = f"{max(gaps):8.1e}" if gaps else f"{'-':>8}"
    rel = f"{p50 / dp_p50_ms:7.0f}" if dp_p50_ms else f"{'-':>7}"
    return f"{label:>16} {'anchor':>13} {p50:9.2f} {p99:9.2f} {rel} {gap} {note}", ratio


def main(argv: list[str] | None = None) -> None:
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
    ap.add_argument("--anchor-sizes", default="10x128",
                    help="sizes (JxN, comma-separated) on which to run the node-level BFTrainer "
                         "MILP anchor; 50x512 and 100x4734 build 10^5-10^6 binaries (default 10x128)")
    ap.add_argument("--anchor-time-limit", type=float, default=10.0,
                    help="CBC time limit of the anchor [s]; hard kill 20 s later (default 10)")
    ap.add_argument("--no-anchor", action="store_true", help="skip the node-level anchor")
    add_option(ap)
    args = ap.parse_args(argv)
    results = ResultsLog.from_args("decision_time", args, argv)
    say = results.say
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    anchor_sizes = {a.strip() for a in args.anchor_sizes.split(",") if a.strip()}
    ratios: list[str] = []
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
        from offcut.daemon.app.solvers.records import read_records

        sets.append((f"records:{args.records.name}", [p for _, p in read_records(args.records)]))
    if "gurobi" in solvers and not gurobi_importable():
        say("gurobi: gurobipy not importable, skipped")
        solvers.remove("gurobi")
    say(f"task curves: {source}; {args.repeat} instances per size; times in ms (wall, "
        f"in-process)")
    header = f"{'instances':>16} {'solver':>13} {'p50':>9} {'p99':>9} {'p50/dp':>7} {'gap_max':>8} {'note':s}"
    say(header)
    rows = []
    for name in solvers:
        rows.append(name)
        if name in ("cbc", "gurobi"):
            rows.append(f"{name}-noties")
    for label, probs in sets:
        p50_dp = p99_dp = None
        dp_sols = [solve_dp(p) for p in probs]
        opt = [s.objective for s in dp_sols]
        for name in rows:
            times, gaps, note, same = [], [], "", 0
            for p, best, ref in zip(probs, opt, dp_sols):
                if name.startswith("gurobi"):
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
                same += bool(np.array_equal(s.counts, ref.counts))
            if not times:
                say(f"{label:>16} {name:>13} {'-':>9} {'-':>9} {'-':>7} {'-':>8} {note}")
                continue
            p50, p99 = np.percentile(times, 50), np.percentile(times, 99)
            if name == "dp":
                p50_dp, p99_dp = p50, p99
            ratio = f"{p50 / p50_dp:7.1f}" if p50_dp else f"{'-':>7}"
            note = f"same={same}/{len(times)} {note}".rstrip()
            say(f"{label:>16} {name:>13} {p50:9.2f} {p99:9.2f} {ratio} {max(gaps):8.1e} {note}")
        if args.no_anchor or label.startswith("records:"):
            continue
        if label not in anchor_sizes:
            J, N = (int(v) for v in label.split("x"))
            say(f"{label:>16} {'anchor':>13} {'-':>9} {'-':>9} {'-':>7} {'-':>8} "
                f"not attempted ({anchor_binaries(J, N)} binaries)")
            continue
        if p99_dp is None:
            p99_dp = float(np.percentile([_time_dp(p) for p in probs], 99))
        row, ratio = anchor_row(label, probs, args.anchor_time_limit, p99_dp, p50_dp)
        say(row)
        if ratio:
            ratios.append(ratio)
    if not args.no_anchor:
        say("anchor time / dp p99: " + ("; ".join(ratios) if ratios else
                                        "no anchor solve finished"))
    results.finish()


def _time_dp(p: AllocationProblem) -> float:
    t0 = time.perf_counter()
    solve_dp(p)
    return (time.perf_counter() - t0) * 1e3


if __name__ == "__main__":
    main()

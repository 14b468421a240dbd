"""Rescale cost of the elastic example on this machine, measured and as the daemon learns it.

Runs examples/elastic_digits (a CNN on scikit-learn's digits) under the launcher on the test
Slurm cluster of tests/slurm_cluster.py (4 nodes on this machine; needs root and Slurm, like
the Slurm tests), with a real daemon, and repeats ``--cycles`` times:

* shrink: a regular ``sbatch -N2`` takes two of the task's four nodes (Slurm preempts them,
  its signal reaches their ranks, the task goes on on the other two);
* grow: once the shrunk generation has trained a while, the regular job ends and the task
  grows back to four (the launcher signals the two-node generation).

For every rescale it measures, from the jobs' logs, the seconds from the stop signal (the
first rank that got it) to the first training step of the next generation: the pause of the
rescale (docs/execution.md). It prints their medians next to the daemon's learned rescale
costs of the task (``LearnedModel.measured_rescale_*_s``, from the progress reports alone),
converted from BFTrainer's convention (seconds of progress at the rate before the rescale,
arXiv 2106.12091, Section 3) to seconds of pause (x r(c) / r(n), with the rates the daemon
measured), and the ratio; the figures also go, with the machine and the command, to a new
``benchmarks/results/rescale_cost-DATE-TIME.txt`` (``--no-results``: not written).

    python benchmarks/rescale_cost.py                 # 3 cycles, about 2 minutes here
    python benchmarks/rescale_cost.py --cycles 5 --json out/rescale.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test cluster and the example's location

from slurm_cluster import SlurmCluster, skip_reason  # noqa: E402
from results_log import ResultsLog, add_option  # noqa: E402

from offcut.client import Client, make_task_spec  # noqa: E402
from offcut.views import ModelView  # noqa: E402
from offcut.daemon.config import DaemonConfig, SlurmConfig  # noqa: E402
from offcut.slurm_plugin.launcher import parse_job_name  # noqa: E402
from offcut.daemon.edge.server import OffcutServer  # noqa: E402

EXAMPLE = REPO / "examples" / "elastic_digits" / "train.py"
NODES = ["n1", "n2", "n3", "n4"]
_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank (\d+) \w+ offcut\.client\.elastic: "
STOP_RE = re.compile(_STAMP + r"rank \d+: stop requested", re.M)
FIRST_RE = re.compile(_STAMP + r"rank \d+: first step of generation (\d+)", re.M)


def log_time(stamp: str) -> float:
    """Seconds since the epoch of a logging timestamp (local time, ms)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def timeline(out: Path, task_id: str) -> dict[int, dict]:
    """generation -> {"nodes": [...], "stop": first stop signal [s] or None, "first": first
    step [s] or None}, from the jobs' output files."""
    cfg = SlurmConfig()
    gens: dict[int, dict] = {}
    for path in out.glob("*.out"):
        name = parse_job_name(cfg, path.name.rsplit("-", 1)[0])
        if name is None or name.task_id != task_id:
            continue
        g = gens.setdefault(name.generation, {"nodes": [], "stop": None, "first": None})
        g["nodes"].append(name.node)
        text = path.read_text(errors="replace")
        for m in STOP_RE.finditer(text):
            t = log_time(m.group(1))
            g["stop"] = t if g["stop"] is None else min(g["stop"], t)
        for m in FIRST_RE.finditer(text):
            t = log_time(m.group(1))
            g["first"] = t if g["first"] is None else min(g["first"], t)
    return gens


def pauses(gens: dict[int, dict]) -> dict[str, list[float]]:
    """Seconds from the stop signal of each generation that trained to the first step of the
    next one that trained, by kind (``shrink``: fewer nodes, ``grow``: more)."""
    trained = [(g, d) for g, d in sorted(gens.items()) if d["first"] is not None]
    out: dict[str, list[float]] = {"shrink": [], "grow": []}
    for (_, a), (_, b) in zip(trained, trained[1:]):
        if a["stop"] is None or len(a["nodes"]) == len(b["nodes"]):
            continue
        out["grow" if len(b["nodes"]) > len(a["nodes"]) else "shrink"].append(b["first"] - a["stop"])
    return out


def trained_on(out: Path, client, task_id: str, count: int, hold_s: float) -> bool:
    """Whether ``task_id``'s current generation runs on ``count`` nodes and its first step
    (in the jobs' output files under ``out``) is more than ``hold_s`` [s] ago."""
    task = client.get_task(task_id)
    g = timeline(out, task_id).get(task.generation)
    return bool(g and g["first"] and len(task.nodes) == count
                and time.time() - g["first"] > hold_s)


def wait_for(cond, what: str, timeout_s: float = 300.0):
    """Poll ``cond`` every 0.1 s until truthy (returned); ``SystemExit`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not (got := cond()):
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)
    return got


class ClusterUnavailable(RuntimeError):
    """The test cluster cannot run here (no Slurm, not root): the message says why."""


@contextlib.contextmanager
def bench_cluster(prefix: str, keep: bool = False):
    """The 4-node test cluster of tests/slurm_cluster.py in a fresh ``/tmp/PREFIX*`` folder,
    a real daemon on it (solver dp, state in the folder) and a client that has reported
    every node idle: yields ``(cluster, client, root)``. At the end the daemon and the
    cluster stop and the folder goes (kept, and its path printed, with ``keep``). Enter the
    launcher inside (``cluster.launcher``) so that it stops first. Raises
    :class:`ClusterUnavailable` before anything starts."""
    reason = skip_reason()
    if reason:
        raise ClusterUnavailable(reason)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    cluster = SlurmCluster(root)
    srv = None
    try:
        print(f"starting the 4-node test cluster in {root} ...", flush=True)
        cluster.start()
        srv = OffcutServer(DaemonConfig(listen=cluster.address, solver="dp",
                                        state=str(root / "state.sqlite")))
        srv.start()
        with Client(cluster.address, timeout_s=10) as client:
            client.wait_ready(10)
            client.sync_nodes(time.time(), "slurm-watch", 1, idle=NODES)
            yield cluster, client, root
    finally:
        if srv is not None:
            srv.stop(0.5)
        cluster.stop()
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=3, help="shrink + grow cycles (default 3)")
    p.add_argument("--work", type=int, default=2_000_000,
                   help="the task's total work, samples (large: the run ends after the cycles)")
    p.add_argument("--hold-s", type=float, default=6.0,
                   help="seconds each generation trains before the next change (default 6)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    add_option(p)
    args = p.parse_args(argv)
    log = ResultsLog.from_args("rescale_cost", args, argv)
    try:
        with contextlib.ExitStack() as stack:
            cluster, client, root = stack.enter_context(bench_cluster("offcut-rescale-"))
            return _measure(args, cluster, client, root, stack, log)
    except ClusterUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 1


def _measure(args, cluster, client, root, stack, log: ResultsLog) -> int:
    """The cycles of :func:`main` on a started cluster; prints the figures and writes them
    through ``log``."""
    argv_ = [sys.executable, str(EXAMPLE), "--batch-size", "64",
             "--checkpoint-every-s", "1", "--collective-timeout-s", "30"]
    # a curve that always prefers more nodes (so the task grows back); the daemon learns
    # the real rates and rescale costs from the reports anyway
    spec = make_task_spec("digits", nodes="1-4", work_samples=args.work,
                          scalability=([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0, command=argv_,
                          reports_progress=True)
    tid = client.submit(spec, owner="bench").task.task_id
    out = stack.enter_context(cluster.launcher(cluster.address, root))

    wait_for(lambda: trained_on(out, client, tid, 4, args.hold_s),
             "the first generation on four nodes")
    for cycle in range(1, args.cycles + 1):
        release = root / f"release-{cycle}"
        job = cluster.sbatch("-N2", "--exclusive",
                             wrap=f'while [ ! -e "{release}" ]; do sleep 0.2; done')
        wait_for(lambda: trained_on(out, client, tid, 2, args.hold_s),
                 f"cycle {cycle}: the shrunk generation")
        release.touch()
        cluster.wait_state(job, {"COMPLETED"}, timeout=60)
        wait_for(lambda: trained_on(out, client, tid, 4, args.hold_s),
                 f"cycle {cycle}: the grown generation")
        print(f"cycle {cycle}: done (generation {client.get_task(tid).generation})",
              flush=True)
    wait_for(lambda: (client.get_task(tid).model or ModelView(0.0, 0.0)).measured_rescale_up_s
             is not None,
             "the daemon's first grow estimate", 60)
    task = client.get_task(tid)
    client.cancel(tid)
    measured = pauses(timeline(out, tid))
    m = task.model
    rates = {x.nodes: x.samples_per_s for x in m.measured}
    learned = {"shrink": m.measured_rescale_down_s, "grow": m.measured_rescale_up_s}
    # BFTrainer's seconds at the old rate -> seconds of pause at the new rate
    as_pause = {"shrink": learned["shrink"] * rates[4] / rates[2],
                "grow": learned["grow"] * rates[2] / rates[4]}
    result = {"cycles": args.cycles, "rates_samples_per_s": rates,
              "pause_s": {k: [round(v, 3) for v in vs] for k, vs in measured.items()},
              "learned_bftrainer_s": learned, "learned_as_pause_s": as_pause}
    print()
    log.say(f"throughput measured by the daemon: {rates[2]:.0f} samples/s on 2 nodes, "
            f"{rates[4]:.0f} on 4 (4 ranks share this machine's 2 cores)")
    log.say(f"{'rescale':8} {'n':>2} {'pause, measured [s]':>20} "
            f"{'learned (BFTrainer) [s]':>24} {'learned as pause [s]':>21} {'ratio':>6}")
    for kind in ("shrink", "grow"):
        med = statistics.median(measured[kind]) if measured[kind] else float("nan")
        result[f"{kind}_ratio"] = as_pause[kind] / med
        log.say(f"{kind:8} {len(measured[kind]):>2} {med:>20.2f} {learned[kind]:>24.2f} "
                f"{as_pause[kind]:>21.2f} {as_pause[kind] / med:>6.2f}")
    log.finish()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Online scalability learning and energy-aware allocation on the real log (issue "Learn
scalability online, and let the allocation optimise energy").

1. Learning: the same replay three ways, the replay playing the tasks (true curves + seeded
   noise, :mod:`offcut.replay.progress_sim`): the daemon is given the true curves (``known``,
   the oracle), a naive linear guess from the throughput at Jmin (``linear``), or nothing
   (``hidden``: it learns the curves and rescale costs from the progress reports). Printed:
   samples processed within the replayed window, tasks completed, and the ratios
   hidden/known (goal >= 0.95) and hidden/linear (goal > 1).
2. Energy: the ``known`` replay with objective ``throughput``, ``energy`` and ``zeus_cost``
   (eta 0.5), at each ``--energy-tfwd`` look-ahead: samples, energy [J], samples per joule,
   and the trade-off (samples lost vs energy saved) against ``throughput``.

Workloads: 128 nodes with the 10-task hps-shufflenet set, and 128 nodes with a 100-task
excerpt of the ImageNet set (the first 100 tasks by submit time). Needs ../shared/data. The
figure lines also go, with the machine and the command, to a new
``benchmarks/results/learning_energy-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/learning_energy.py                  # both workloads, both parts
    python benchmarks/learning_energy.py --max-events 800 --workloads shufflenet
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


def workloads(data: Path, names: list[str]):
    """(name, node log, tasks, max_tasks, events) per workload; ``events``: the default window,
    shorter than the time every task needs (so the samples measure throughput)."""
    from offcut.replay.bftrainer_data import load_node_log, load_task_set

    log = load_node_log(data / "ndstat-10sdn6-evt.tar.gz", num_nodes=128, allow_pickle=True)
    if "shufflenet" in names:
        yield ("hps-shufflenet 10 tasks", log,
               load_task_set(data / "hps-shufflenet-Jbnd-10J.pkl", None, allow_pickle=True), 10,
               300)
    if "imagenet" in names:
        tasks = load_task_set(data / "ImageNet-imgps-Jbnd-1001J.pkl", None, allow_pickle=True)
        excerpt = sorted(tasks, key=lambda t: (t.submit_time, t.name))[:100]
        yield "ImageNet 100-task excerpt", log, excerpt, 10, 1500


def run(log, tasks, out: Path, **opts) -> dict:
    from offcut.replay.driver import ReplayOptions, run_replay

    return run_replay(log, tasks, out, ReplayOptions(progress=False, **opts))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--workloads", default="shufflenet,imagenet")
    ap.add_argument("--max-events", type=int, default=None,
                    help="node events replayed per run, the window the samples are counted in "
                         "(default: 300 for shufflenet, 1500 for ImageNet: tasks still run)")
    ap.add_argument("--solver", default="dp")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parts", default="learning,energy")
    ap.add_argument("--energy-tfwd", default="10,60",
                    help="look-ahead Tfwd values [s] of the energy comparison (comma-separated)")
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    add_option(ap)
    args = ap.parse_args(argv)
    args.out = args.out or Path(tempfile.mkdtemp(prefix="offcut-learn-"))
    results = ResultsLog.from_args("learning_energy", args, argv)
    say = results.say
    if not args.data_dir.is_dir():
        raise SystemExit(f"{args.data_dir} not found: this benchmark needs the BFTrainer data")
    parts = args.parts.split(",")
    for name, log, tasks, max_tasks, events in workloads(args.data_dir,
                                                         args.workloads.split(",")):
        tag = name.split()[0].lower()
        events = args.max_events or events
        common = dict(solver=args.solver, max_events=events, noise=args.noise, seed=args.seed)
        say(f"== {name}: 128 nodes, {len(tasks)} tasks, --max-tasks {max_tasks}, "
              f"{events} events, noise {args.noise}, seed {args.seed}")
        if "learning" in parts:
            got = {}
            for curves in ("known", "linear", "hidden"):
                t0 = time.perf_counter()
                s = run(log, tasks, args.out / tag / curves, curves=curves, max_tasks=max_tasks,
                        **common)
                got[curves] = s
                say(f"  curves {curves:7s} samples {s['total_samples']:.4e}  completed "
                    f"{s['tasks_completed']:3d}/{s['tasks_submitted']}  "
                    f"({time.perf_counter() - t0:.0f} s)")
            known = got["known"]["total_samples"]
            hidden, linear = got["hidden"]["total_samples"], got["linear"]["total_samples"]
            say(f"  hidden / known  = {hidden / known:.3f}   (goal >= 0.95)")
            say(f"  hidden / linear = {hidden / linear:.3f}   (goal > 1)")
        if "energy" in parts:
            for tfwd in (float(x) for x in args.energy_tfwd.split(",")):
                got = {}
                for objective, eta in (("throughput", 0.5), ("zeus_cost", 0.5), ("energy", 1.0)):
                    s = run(log, tasks, args.out / tag / f"energy-{objective}-{tfwd:g}",
                            curves="known", max_tasks=max_tasks, objective=objective, eta=eta,
                            tfwd_s=tfwd, **common)
                    got[objective] = s
                    say(f"  Tfwd {tfwd:4g} s  objective {objective:10s} samples "
                        f"{s['total_samples']:.4e}  energy {s['energy_j']:.4e} J  samples/J "
                        f"{s['samples_per_joule']:.4f}")
                base = got["throughput"]
                for objective in ("zeus_cost", "energy"):
                    s = got[objective]
                    say(f"  Tfwd {tfwd:4g} s  {objective:10s} vs throughput: samples/J x"
                        f"{s['samples_per_joule'] / base['samples_per_joule']:.3f}, samples "
                        f"{100 * (s['total_samples'] / base['total_samples'] - 1):+.1f} %, "
                        f"energy {100 * (s['energy_j'] / base['energy_j'] - 1):+.1f} %")
    print(f"outputs: {args.out}")
    results.finish()


if __name__ == "__main__":
    main()

"""A sweep of replays through submitit's local executor and through its Slurm executor on the
test cluster: the wall time of each and the table (docs/replay-and-policies.md, "Sweeps").

Runs the cells of ``--spec`` (default ``examples/sweeps/policies.toml``: 24 replays of the real
two-week log, 3 policies x 2 Tfwd x 2 node counts x 2 task sets) with ``offcut sweep``'s
:func:`offcut.replay.sweep.run_sweep`, each executor into a fresh folder (nothing finished
before), at most ``--max-parallel`` cells at once (default: the spec's) with either executor:

* ``local``: a process per cell on this machine;
* ``slurm``: one array job on the 4-node test cluster of tests/slurm_cluster.py with Slurm's
  accounting (slurmdbd on a private MariaDB, so submitit's ``sacct`` sees every state; needs
  root and Slurm, like the Slurm tests), started here and stopped at the end.

Printed: per executor the cells, failures and the wall time from the first submission to the
last result, the Slurm/local ratio, whether the two tables agree (every figure but the times),
and the table (the swept settings, the efficiency and its parts, the idle node-hours used, the
all-done time). The spec's paths into ``../shared/data/bftrainer`` are taken from
``--data-dir`` instead. The figures also go, with the machine and the command, to a new
``benchmarks/results/sweep-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/sweep.py                       # 24 cells, local then Slurm (~5 min here)
    python benchmarks/sweep.py --executors local
    python benchmarks/sweep.py --spec examples/sweeps/admission.toml --executors local
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))       # the test cluster
sys.path.insert(0, str(REPO / "benchmarks"))

from real_data import parser  # noqa: E402
from results_log import ResultsLog, add_option  # noqa: E402

from offcut.replay.sweep import run_sweep  # noqa: E402
from offcut.replay.sweep_results import FIGURES, table_text  # noqa: E402
from offcut.replay.sweep_spec import PATH_SETTINGS, load_spec  # noqa: E402
from offcut.toml_file import read_toml  # noqa: E402

DEFAULT_SPEC = REPO / "examples" / "sweeps" / "policies.toml"
#: figures that are times of this run, not results of the replay
TIMES = ("wall_s", "decision_p50_ms", "decision_p99_ms")


def with_data_dir(spec_path: Path, data_dir: Path, folder: Path, executor: str) -> Path:
    """A copy of the spec in ``folder`` whose inputs are ``data_dir``'s files of the same
    names, run by ``executor``; its path."""
    raw = read_toml(spec_path, "sweep spec")

    def moved(value):
        return ([moved(v) for v in value] if isinstance(value, list)
                else str(data_dir / Path(value).name))

    def inputs_moved(table: dict) -> dict:
        return {k: moved(v) if k in PATH_SETTINGS else v
                for k, v in table.items()}

    for key in ("fixed", "grid"):
        if key in raw:
            raw[key] = inputs_moved(raw[key])
    if "cells" in raw:
        raw["cells"] = [inputs_moved(c) for c in raw["cells"]]
    raw.setdefault("sweep", {}).update(executor=executor, out=str(folder / "out"))
    path = folder / spec_path.name
    path.write_text(tomli_w.dumps(raw))
    return path


def run(spec_path: Path, data_dir: Path, root: Path, executor: str, max_parallel: int | None):
    """Run the spec with ``executor`` into ``root/executor``; (spec, result, table)."""
    folder = root / executor
    folder.mkdir(parents=True)
    spec = load_spec(with_data_dir(spec_path, data_dir, folder, executor))
    print(f"\n== {executor}: {len(spec.cells)} cells", flush=True)
    result = run_sweep(spec, max_parallel=max_parallel, allow_pickle=True, progress=True)
    return spec, result, result.table


def slurm_cluster(root: Path):
    """The 4-node test cluster with accounting, started; its environment is this process's."""
    from slurm_cluster import SlurmCluster, accounting_skip_reason

    reason = accounting_skip_reason()
    if reason:
        raise SystemExit(f"the Slurm run cannot start here: {reason} (--executors local)")
    cluster = SlurmCluster(root, accounting=True)
    print(f"starting the 4-node test cluster (with accounting) in {root} ...", flush=True)
    cluster.start()
    os.environ.update(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=cluster.env["PATH"])
    return cluster


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="the sweep spec")
    ap.add_argument("--executors", default="local,slurm", help="local, slurm or local,slurm")
    ap.add_argument("--max-parallel", type=int, default=None,
                    help="cells at once with each executor (default: the spec's)")
    add_option(ap)
    args = ap.parse_args(argv)
    log = ResultsLog.from_args("sweep", args, argv)
    executors = [e for e in args.executors.split(",") if e]
    if not set(executors) <= {"local", "slurm"} or not executors:
        ap.error("--executors: local, slurm or local,slurm")
    if not args.data_dir.is_dir():
        raise SystemExit(f"skipped: the real BFTrainer data is not at {args.data_dir} (see "
                         "docs/replay-and-policies.md, 'Replaying the real public log')")
    root = args.out or Path(tempfile.mkdtemp(prefix="offcut-sweep-", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # (the test cluster's munged and slurmd reach the folder)
    results, cluster = {}, None
    try:
        for executor in executors:
            if executor == "slurm":
                cluster = slurm_cluster(root / "cluster")
            results[executor] = run(args.spec, args.data_dir, root, executor, args.max_parallel)
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(root / "cluster", ignore_errors=True)
    spec = next(iter(results.values()))[0]
    log.say(f"\nsweep {args.spec.relative_to(REPO) if args.spec.is_relative_to(REPO) else args.spec}: "
            f"{len(spec.cells)} cells, swept {', '.join(spec.axes)}; at most "
            f"{args.max_parallel or spec.sweep.max_parallel} at once; {os.cpu_count()} CPUs")
    for executor, (_, result, table) in results.items():
        log.say(f"  {executor:6s} executor: {len(table)} cells finished, {len(result.failed)} "
                f"failed, wall {result.wall_s:.1f} s (a cell: median {table['wall_s'].median():.1f} s)")
    if len(results) == 2:
        (_, loc, lt), (_, slu, st) = results["local"], results["slurm"]
        log.say(f"  slurm / local wall time: {slu.wall_s / loc.wall_s:.2f}")
        same = [c for c in FIGURES if c not in TIMES]
        agree = lt[["id", *same]].sort_values("id").reset_index(drop=True).equals(
            st[["id", *same]].sort_values("id").reset_index(drop=True))
        log.say(f"  the two executors' tables agree (every figure but the times): "
                f"{'yes' if agree else 'NO'}")
    _, result, table = results[executors[0]]
    log.say("")
    log.keep(table_text(table, spec.axes))
    print(table_text(table, spec.axes))
    log.say(f"\nfolders: {root} (table.csv, sweep.png, cells/ per executor)")
    log.finish()
    return 1 if any(r.failed for _, r, _ in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

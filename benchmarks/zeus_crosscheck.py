"""Cross-check our Zeus simulation (BSO + PLO hosted in offcutd, driven over gRPC) against
Zeus's own trace-driven simulator (``zeus._legacy.simulate.Simulator``) on the real traces.

For each V100 workload of ``offcut.replay.zeus_sim.WORKLOADS`` and each seed, both simulate
``--recurrences`` recurrences of the job (eta ``--eta``, beta ``--beta``, max epochs from
WORKLOADS) on the same ``summary_train.csv`` / ``summary_power_<gpu>.csv``:

- ours: ``offcut.replay.zeus_sim.run_zeus_replay`` through a private ``offcutd``;
- Zeus: ``Simulator(PruningGTSBatchSizeOptimizer(seed), JITPowerLimitOptimizer, seed)``
  ``.simulate_one_job`` exactly as Zeus's ``examples/research_reproducibility/zeus_nsdi23/
  run_single.py`` sets it up (verbose off; its stdout is captured).

Both are scored against the SAME baseline, our ``baseline()`` (the default batch size at the
maximum power limit, no early stopping, recorded runs sampled with the same seed), so the two
savings differ only in their numerators. Printed per workload: energy saving (mean and
min-max over seeds), its difference in percentage points, time change, whether our saving lies
inside the Zeus paper's band for batch size + power limit (15.3%-75.8%), and the final batch
size and power limit each picks (the commonest over seeds, with its count).

Diagnostics (skip with ``--no-diagnose``):

1. Lockstep: inside Zeus's simulator, a tee optimizer feeds every observation to both Zeus's
   ``PruningGTSBatchSizeOptimizer`` and our ``offcut.daemon.zeus.bso.BatchSizeJob`` (early
   stopping left to the simulator) and compares every prediction: do the two bandits decide
   the same given the same costs?
2. Semantics counters: runs, runs that did not converge, tries that could not afford one epoch
   under the cost bound, and the final min_cost (ours: the cheapest converged run,
   docs/zeus.md, "Trace-driven simulation"; Zeus: the cheapest accumulated cost of a recurrence,
   every try included).
3. Ablation ladder: ``offcut.replay.zeus_sim.simulate`` (our driver, unchanged) against an
   in-process stand-in for the daemon (the same ``BatchSizeJob`` / ``PowerLimitProfile`` and
   proto conversions, no gRPC), switching to Zeus's simulator semantics one at a time:
   L0 ours (must equal the gRPC run), L1 + Zeus's way of sampling recorded runs
   (``DataFrame.sample``), L2 + a try that cannot afford one epoch is observed as a failed run
   of cost 100 * beta * min_cost, L3 + "converged" = the recorded run reached the target (the
   daemon also fails a run whose cost crossed the bound), L4 + min_cost = accumulated cost of
   the cheapest recurrence. L4 must reproduce Zeus's simulator run for run.

Needs Zeus (not a dependency of offcut): ``pip install zeus`` into this venv (0.16 installs
numpy, pandas, scikit-learn, nvidia-ml-py, pydantic, rich, tyro, httpx, amdsmi; no torch).

Usage::

    python benchmarks/zeus_crosscheck.py                       # 6 workloads x 5 seeds
    python benchmarks/zeus_crosscheck.py --seeds 1,2 --workloads cifar100,squad --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from offcut.daemon.zeus.bso import BatchSizeJob
from offcut.daemon.zeus.plo import PowerLimitProfile
from offcut.errors import FailedPrecondition, OffcutError
from offcut.wire.zeus import job_spec_from_pb, power_spec_from_pb
from offcut.replay import zeus_sim
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402 (benchmarks/results_log.py)
from offcut.replay.zeus_sim import (WORKLOADS, ZeusReplayError, ZeusReplayOptions, baseline,
                                    load_traces, run_zeus_replay)

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PAPER_BAND = (0.153, 0.758)  # Zeus (NSDI '23) abstract: batch size + power limit
ZERO_EPOCH_LINE = "cannot run even one epoch"
INSTALL_HINT = ("Zeus is not installed in this environment. Install it with\n"
                "    pip install --dry-run zeus   # check: no torch, nothing downgraded\n"
                "    pip install zeus\n"
                "(zeus 0.16's base dependencies: numpy, pandas, scikit-learn, nvidia-ml-py, "
                "pydantic, rich, tyro, httpx, amdsmi, python-dateutil).")


def import_zeus():
    """Zeus's legacy simulator classes, or exit with the install hint."""
    try:
        from zeus._legacy.job import Job
        from zeus._legacy.policy.interface import BatchSizeOptimizer
        from zeus._legacy.policy.optimizer import (JITPowerLimitOptimizer,
                                                   PruningGTSBatchSizeOptimizer)
        from zeus._legacy.simulate import Simulator
    except ImportError as exc:
        raise SystemExit(f"{INSTALL_HINT}\n(import failed: {exc})") from None
    import zeus

    return dict(Job=Job, BatchSizeOptimizer=BatchSizeOptimizer, Simulator=Simulator,
                JIT=JITPowerLimitOptimizer, PGTS=PruningGTSBatchSizeOptimizer,
                version=getattr(zeus, "__version__", "?"))


def quiet():
    """Silence Zeus's unconditional prints (captured and returned) and numpy warnings."""
    buf = io.StringIO()
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(buf))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(np.errstate(all="ignore"))
    return stack, buf


# ---------------------------------------------------------------------- Zeus's simulator
def zeus_job(Z, w):
    return Z["Job"](w.dataset, w.network, w.optimizer, w.target_metric, w.max_epochs,
                    w.default_batch_size)


def run_zeus(Z, train: pd.DataFrame, power: pd.DataFrame, w, opts: ZeusReplayOptions,
             bso=None) -> dict:
    """Zeus's simulator as in run_single.py (verbose off). Returns the history as our rows."""
    bso = bso or Z["PGTS"](seed=opts.seed, verbose=False)
    sim = Z["Simulator"](train, power, bso, Z["JIT"](verbose=False), seed=opts.seed,
                         verbose=False)
    max_power = float(sim.df.power_limit.max())
    stack, buf = quiet()
    error = None
    with stack:
        try:
            hist = sim.simulate_one_job(zeus_job(Z, w), opts.recurrences, opts.beta_knob
                                        if opts.beta_knob is not None else math.inf,
                                        opts.eta_knob)
        except (RuntimeError, ValueError) as exc:  # e.g. "did not reach ... in 20 tries"
            hist, error = [], f"{type(exc).__name__}: {exc}"
    rows, recurrence = [], 1
    for h in hist:
        cost = opts.eta_knob * h.energy + (1 - opts.eta_knob) * max_power * h.time
        rows.append({"recurrence": recurrence, "batch_size": int(h.bs),
                     "power_limit_w": float(h.pl), "energy_j": float(h.energy),
                     "time_s": float(h.time), "reached": bool(h.reached), "cost": cost})
        recurrence += bool(h.reached)
    return {"rows": rows, "zero_epoch_tries": buf.getvalue().count(ZERO_EPOCH_LINE),
            "error": error, "bso": bso}


def totals(rows: list[dict], base: list[dict]) -> dict:
    h, b = pd.DataFrame(rows), pd.DataFrame(base)
    e, t = float(h.energy_j.sum()), float(h.time_s.sum())
    conv = h.loc[h.reached]
    return {"runs": len(h), "failed_runs": int((~h.reached).sum()), "energy_j": e, "time_s": t,
            "energy_saving": 1 - e / float(b.energy_j.sum()),
            "time_change": t / float(b.time_s.sum()) - 1,
            "final_batch_size": int(conv.batch_size.iloc[-1]) if len(conv) else None,
            "final_power_limit_w": float(conv.power_limit_w.iloc[-1]) if len(conv) else None}


def min_costs(rows: list[dict]) -> tuple[float, float]:
    """(cheapest converged run, cheapest accumulated recurrence) over a history."""
    h = pd.DataFrame(rows)
    single = float(h.loc[h.reached, "cost"].min())
    acc = float(h.groupby("recurrence").cost.sum().min())
    return single, acc


# ---------------------------------------------------------------------- lockstep tee
def make_tee(Z, w, df: pd.DataFrame, opts: ZeusReplayOptions):
    """A Zeus BatchSizeOptimizer that feeds Zeus's PruningGTS and our BatchSizeJob the same
    observations and records whether their predictions agree (Zeus's answer is used)."""

    class TeeBSO(Z["BatchSizeOptimizer"]):
        def __init__(self):
            self.zeus = Z["PGTS"](seed=opts.seed, verbose=False)
            self.ours = None
            self.trial = None
            self.agree = self.total = 0
            self.first_disagreement = None

        @property
        def name(self):
            return "tee(Zeus PruningGTS, offcut BatchSizeJob)"

        def __deepcopy__(self, memo):  # the simulator deep-copies its BSO; keep our counters
            return self

        def register_job(self, job, batch_sizes):
            self.zeus.register_job(job, batch_sizes)
            pb = zeus_sim._job_spec("tee", w, df, opts, w.max_epochs)
            pb.ClearField("beta_knob")  # the simulator does the early stopping
            spec = job_spec_from_pb(pb)
            if list(spec.batch_sizes) != sorted(int(b) for b in batch_sizes):
                raise RuntimeError(f"batch sizes differ: ours {spec.batch_sizes}, "
                                   f"Zeus {batch_sizes}")
            self.ours = BatchSizeJob(spec)

        def predict(self, job):
            z = int(self.zeus.predict(job))
            p = self.ours.predict()
            self.trial = p.trial_number
            self.total += 1
            if p.batch_size == z:
                self.agree += 1
            elif self.first_disagreement is None:
                self.first_disagreement = (self.total, z, p.batch_size)
            return z

        def observe(self, job, batch_size, cost, converged=None):
            self.zeus.observe(job, batch_size, cost, converged)
            s = self.ours.spec
            # report the same cost: energy/time chosen so that zeus_cost(...) == cost
            energy, seconds = ((cost / s.eta_knob, 0.0) if s.eta_knob > 0
                               else (0.0, cost / s.max_power_w))
            metric = s.target_metric if converged else zeus_sim._not_reached(w)
            v = self.ours.report(self.trial, 1, seconds, energy, metric)
            if not v.finished:
                self.ours.end_trial(self.trial)

    return TeeBSO()


# ---------------------------------------------------------------------- ablation ladder
class InProcessDaemon:
    """Stands in for ``offcut.client.Client`` in ``zeus_sim.simulate``: the daemon's own
    optimizer objects, which answer in the client's forms (:mod:`offcut.zeus_views`), the spec
    read by the wire's conversion; no gRPC, no SQLite. Flags switch to Zeus's
    simulator semantics: ``zero_epoch`` (a try that cannot afford one epoch is observed as a
    failed run of cost 100 * beta * min_cost; ours: the cost of that one epoch, judged over the
    bound), ``path_verdict`` (the BSO gets no beta, so "converged" is whether the recorded run
    reached the target, and the bound is applied here), ``acc_bound`` (min_cost = accumulated
    cost of the cheapest recurrence, every try included, as Zeus's simulator)."""

    def __init__(self, probe: dict, zero_epoch=False, path_verdict=False, acc_bound=False):
        self.probe = probe  # {"epochs": epochs of the last simulated run} (set by _Gpu.run)
        self.zero_epoch, self.path_verdict, self.acc_bound = zero_epoch, path_verdict, acc_bound
        self.acc = 0.0
        self.acc_min = math.inf
        self.single_min = math.inf
        self.zero_epoch_tries = 0

    def register_zeus_job(self, pb):
        spec = job_spec_from_pb(pb)
        self.beta = spec.beta_knob
        if self.path_verdict:
            spec = dataclasses.replace(spec, beta_knob=None)
        self.job = BatchSizeJob(spec)
        self.power = power_spec_from_pb(pb.power, spec.eta_knob)
        self.profiles: dict[int, PowerLimitProfile] = {}
        return None

    def _min_cost(self) -> float:
        return self.acc_min if self.acc_bound else self.single_min

    def predict_batch_size(self, job_id, request_id=""):
        p = self.job.predict()
        if self.path_verdict and self.beta is not None:
            p = dataclasses.replace(p, cost_bound_j=self.beta * self._min_cost())
        return p

    def _profile(self, bs):
        return self.profiles.setdefault(bs, PowerLimitProfile(self.power, self.job.spec.max_power_w))

    def power_plan(self, job_id, bs):
        return self._profile(bs).plan()

    def report_power_window(self, job_id, bs, limit, t, e):
        return self._profile(bs).report_window(limit, t, e)

    def _count(self, v, ran: bool):
        if v.finished and ran:
            self.acc += v.cost_j
            if v.converged:
                self.single_min = min(self.single_min, v.cost_j)
                self.acc_min = min(self.acc_min, self.acc)
                self.acc = 0.0

    def _zeus_zero_epoch(self, trial: int):
        """Zeus: ``bso.observe(job, bs, 100 * beta_knob * min_cost, False)``; no run, and
        nothing added to the recurrence's accumulated cost."""
        s = self.job.spec
        cost = 100 * self.beta * (self._min_cost() if self.path_verdict else self.job.min_cost)
        energy, seconds = ((cost / s.eta_knob, 0.0) if s.eta_knob > 0
                           else (0.0, cost / s.max_power_w))
        v = self.job.report(trial, 1, seconds, energy, _miss(s))
        if not v.finished:
            v = self.job.end_trial(trial)
        return v

    def report_epoch(self, job_id, trial, epoch, t, e, metric, batch_size=0):
        zero = self.probe.get("epochs") == 0
        if zero and self.job.trials[trial - 1]["epochs"] == 0:
            self.zero_epoch_tries += 1
            if self.zero_epoch:
                return self._zeus_zero_epoch(trial)
        v = self.job.report(trial, epoch, t, e, metric, batch_size)
        self._count(v, ran=not zero)
        return v

    def end_trial(self, job_id, trial):
        t = self.job.trials[trial - 1]
        if t["status"] == "running" and t["epochs"] == 0 and self.probe.get("epochs") == 0:
            # a driver that abandons a try that cannot afford one epoch
            self.zero_epoch_tries += 1
            if self.zero_epoch:
                return self._zeus_zero_epoch(trial)
        ran = t["epochs"] > 0 and t["status"] == "running"
        v = self.job.end_trial(trial)
        self._count(v, ran)
        return v


def _miss(spec) -> float:
    return spec.target_metric - 1.0 if spec.higher_is_better else spec.target_metric + 1.0


class _ChoiceRng:
    """Zeus's way of picking a recorded run: ``DataFrame.sample(n=1, random_state=rng)`` is
    ``rng.choice(len, size=1, replace=False)``."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integers(self, n: int) -> int:
        return int(self.rng.choice(n, size=1, replace=False)[0])


@contextlib.contextmanager
def patched_gpu(probe: dict, zeus_sampling: bool):
    """Swap ``zeus_sim._Gpu`` for a subclass that records each run's epochs in ``probe`` and
    optionally samples recorded runs the way Zeus's simulator does."""
    original = zeus_sim._Gpu

    class Gpu(original):
        def __init__(self, df, rng, eta, max_epochs):
            super().__init__(df, _ChoiceRng(rng) if zeus_sampling else rng, eta, max_epochs)

        def run(self, *args, **kwargs):
            result = super().run(*args, **kwargs)
            probe["epochs"] = result[0]
            return result

    zeus_sim._Gpu = Gpu
    try:
        yield
    finally:
        zeus_sim._Gpu = original


LADDER = [
    ("L0", "ours, in-process (no gRPC)", dict(), False),
    ("L1", "+ Zeus's run sampling (DataFrame.sample)", dict(), True),
    ("L2", "+ a try that cannot afford one epoch is observed at 100*beta*min_cost "
           "(ours: that epoch's cost, failed)", dict(zero_epoch=True), True),
    ("L3", "+ converged = run reached target (path)", dict(zero_epoch=True, path_verdict=True),
     True),
    ("L4", "+ min_cost = accumulated recurrence cost (= Zeus)",
     dict(zero_epoch=True, path_verdict=True, acc_bound=True), True),
]


def run_ladder_step(df, w, opts, flags, sampler) -> dict:
    probe: dict = {}
    client = InProcessDaemon(probe, **flags)
    with patched_gpu(probe, sampler):
        try:
            rows = zeus_sim.simulate(client, df, w, opts, "ladder")
        except (ZeusReplayError, FailedPrecondition) as exc:
            return {"error": f"{type(exc).__name__}: {exc}",
                    "zero_epoch_tries": client.zero_epoch_tries}
        except (TypeError, AttributeError) as exc:  # zeus_sim's driver changed its calls
            return {"error": f"the in-process stand-in no longer fits zeus_sim.simulate "
                             f"({type(exc).__name__}: {exc})", "zero_epoch_tries": 0}
    return {"rows": rows, "zero_epoch_tries": client.zero_epoch_tries}


def same_history(a: list[dict], b: list[dict]) -> bool:
    if len(a) != len(b):
        return False
    return all(x["batch_size"] == y["batch_size"] and x["power_limit_w"] == y["power_limit_w"]
               and x["reached"] == y["reached"]
               and math.isclose(x["energy_j"], y["energy_j"], rel_tol=1e-9)
               and math.isclose(x["time_s"], y["time_s"], rel_tol=1e-9) for x, y in zip(a, b))


# ---------------------------------------------------------------------- printing helpers
def pct(v: float) -> str:
    return f"{100 * v:6.1f}"


def spread(vals: list[float]) -> str:
    if not vals:
        return f"{'-':>21}"
    return f"{pct(statistics.mean(vals))} [{pct(min(vals)).strip()},{pct(max(vals)).strip()}]".rjust(21)


def commonest(pairs: list[tuple]) -> str:
    pairs = [p for p in pairs if p[0] is not None]
    if not pairs:
        return "-"
    (bs, pl), n = Counter(pairs).most_common(1)[0]
    return f"{bs}@{pl:g}W x{n}/{len(pairs)}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("Usage::")[0].rstrip(),
        epilog="usage examples:" + __doc__.split("Usage::")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                    help="folder holding zeus-nsdi23/ (default: ../shared/data from the repo "
                         "root)")
    ap.add_argument("--gpu", default="v100", choices=["v100", "a40", "p100", "rtx6000"],
                    help="power trace (default v100)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated (default: all six: {','.join(WORKLOADS)})")
    ap.add_argument("--seeds", default="1,2,3,4,5",
                    help="comma-separated seeds of both simulators (default 1,2,3,4,5)")
    ap.add_argument("--recurrences", type=int, default=50, help="recurrences (default 50)")
    ap.add_argument("--eta", type=float, default=0.5, help="eta_knob (default 0.5)")
    ap.add_argument("--beta", type=float, default=2.0, help="beta_knob (default 2.0)")
    ap.add_argument("--no-diagnose", action="store_true",
                    help="skip the lockstep, counters and ablation ladder")
    ap.add_argument("--json", type=Path, help="also write every number to this JSON file")
    add_option(ap)
    args = ap.parse_args()
    log = ResultsLog.from_args("zeus_crosscheck", args)
    sys.stdout.reconfigure(line_buffering=True)

    folder = args.data_dir / "zeus-nsdi23"
    train_csv, power_csv = folder / "summary_train.csv", folder / f"summary_power_{args.gpu}.csv"
    if not train_csv.is_file() or not power_csv.is_file():
        raise SystemExit(f"Zeus traces not found: need {train_csv} and {power_csv} "
                         "(pass --data-dir; the folder is ../shared/data relative to the repo "
                         "root, never copied into the repo)")
    Z = import_zeus()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    train, power = pd.read_csv(train_csv), pd.read_csv(power_csv)
    tmp = Path(tempfile.mkdtemp(prefix="offcut-zeus-xcheck-"))
    started = time.perf_counter()
    print(f"Zeus {Z['version']} legacy simulator vs offcut (gRPC, private offcutd); "
          f"GPU {args.gpu}, {args.recurrences} recurrences, eta {args.eta}, beta {args.beta}, "
          f"seeds {seeds}; baseline for both: our baseline() (default batch size at max power, "
          "no early stopping, same seed)", flush=True)

    results: dict[str, dict] = {}
    for name in names:
        w = WORKLOADS[name]
        df = load_traces(train_csv, power_csv, w)
        res = results[name] = {"seeds": {}}
        for seed in seeds:
            opts = ZeusReplayOptions(recurrences=args.recurrences, eta_knob=args.eta,
                                     beta_knob=args.beta, seed=seed)
            base = baseline(df, w, opts)
            r: dict = {}
            out = tmp / f"{name}-{seed}"
            try:
                run_zeus_replay(train_csv, power_csv, name, opts, out)
                ours_rows = pd.read_csv(out / "history.csv").to_dict("records")
                r["ours"] = totals(ours_rows, base)
                r["ours"]["zero_epoch_tries"] = int(sum(
                    g["try"].max() - len(g) for _, g in pd.DataFrame(ours_rows).groupby("recurrence")))
                r["ours"]["min_cost_single"], r["ours"]["min_cost_acc"] = min_costs(ours_rows)
            except (ZeusReplayError, FailedPrecondition) as exc:
                ours_rows, r["ours"] = None, {"error": f"{type(exc).__name__}: {exc}"}
            z = run_zeus(Z, train, power, w, opts)
            if z["error"]:
                r["zeus"] = {"error": z["error"]}
            else:
                r["zeus"] = totals(z["rows"], base)
                r["zeus"]["zero_epoch_tries"] = z["zero_epoch_tries"]
                r["zeus"]["min_cost_single"], r["zeus"]["min_cost_acc"] = min_costs(z["rows"])
            r["identical_runs"] = bool(ours_rows is not None and not z["error"]
                                       and same_history(ours_rows, z["rows"]))
            if not args.no_diagnose:
                try:
                    tee = make_tee(Z, w, df, opts)
                    run_zeus(Z, train, power, w, opts, bso=tee)
                    r["lockstep"] = {"agree": tee.agree, "total": tee.total,
                                     "first_disagreement": tee.first_disagreement}
                except (TypeError, AttributeError, OffcutError) as exc:  # an API drifted
                    r["lockstep"] = {"agree": 0, "total": 0, "first_disagreement": None,
                                     "error": f"{type(exc).__name__}: {exc}"}
                ladder = {}
                for key, _, flags, sampler in LADDER:
                    step = run_ladder_step(df, w, opts, flags, sampler)
                    if "rows" in step:
                        ladder[key] = totals(step["rows"], base)
                        ladder[key]["zero_epoch_tries"] = step["zero_epoch_tries"]
                        if key == "L0" and ours_rows is not None:
                            ladder[key]["equals_grpc"] = same_history(step["rows"], ours_rows)
                        if key == "L4" and not z["error"]:
                            ladder[key]["equals_zeus"] = same_history(step["rows"], z["rows"])
                    else:
                        ladder[key] = {"error": step["error"]}
                r["ladder"] = ladder
            res["seeds"][seed] = r
        print(f"  {name}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)

    # ------------------------------------------------------------------ main table
    def vals(name, who, key):
        return [r[who][key] for r in results[name]["seeds"].values() if key in r[who]]

    with log.tee():  # the report: printed and kept for the results file
        print()
        print("Energy saving and time change vs baseline, % (mean [min,max] over seeds); "
              "final = batch size @ power limit of the last converged run (commonest over seeds)")
        hdr = (f"{'workload':<13}{'ours saving':>21}{'Zeus saving':>21}{'diff pp':>8}"
               f"{'ours time':>21}{'Zeus time':>21}  {'in band':<8}{'ours final':<18}{'Zeus final':<18}")
        print(hdr)
        print("-" * len(hdr))
        for name in names:
            o, z = vals(name, "ours", "energy_saving"), vals(name, "zeus", "energy_saving")
            diff = f"{100 * (statistics.mean(o) - statistics.mean(z)):8.1f}" if o and z else f"{'-':>8}"
            band = ("yes" if PAPER_BAND[0] <= statistics.mean(o) <= PAPER_BAND[1] else "NO") if o else "-"
            fo = commonest(list(zip(vals(name, "ours", "final_batch_size"),
                                    vals(name, "ours", "final_power_limit_w"))))
            fz = commonest(list(zip(vals(name, "zeus", "final_batch_size"),
                                    vals(name, "zeus", "final_power_limit_w"))))
            print(f"{name:<13}{spread(o)}{spread(z)}{diff}{spread(vals(name, 'ours', 'time_change'))}"
                  f"{spread(vals(name, 'zeus', 'time_change'))}  {band:<8}{fo:<18}{fz:<18}")
            errors = [f"seed {s} {who}: {r[who]['error']}" for s, r in results[name]["seeds"].items()
                      for who in ("ours", "zeus") if "error" in r[who]]
            for e in errors:
                print(f"{'':13}  ERROR {e}")
        same = sum(r["identical_runs"] for n in names for r in results[n]["seeds"].values())
        print(f"identical run-by-run histories (batch size, power limit, energy, time, converged), "
              f"ours vs Zeus: {same}/{len(names) * len(seeds)} (workload, seed) pairs")
        print(f"(paper band for batch size + power limit: {100 * PAPER_BAND[0]:.1f}%-"
              f"{100 * PAPER_BAND[1]:.1f}%; 'in band' judges our mean saving)")

        if not args.no_diagnose:
            print()
            print("Semantics counters (sums over seeds; min_cost = mean over seeds, MJ): runs, "
                  "runs not converged, tries that could not afford one epoch")
            hdr = (f"{'workload':<13}{'ours runs':>10}{'failed':>7}{'0-ep':>6}{'Zeus runs':>10}"
                   f"{'failed':>7}{'0-ep':>6}   {'ours min_cost':>13}{'Zeus min_cost':>14}"
                   f"{'lockstep agree':>16}")
            print(hdr)
            print("-" * len(hdr))
            for name in names:
                seeds_r = results[name]["seeds"].values()
                ok_o = [r["ours"] for r in seeds_r if "error" not in r["ours"]]
                ok_z = [r["zeus"] for r in seeds_r if "error" not in r["zeus"]]
                agree = sum(r["lockstep"]["agree"] for r in seeds_r)
                total = sum(r["lockstep"]["total"] for r in seeds_r)
                mo = statistics.mean(x["min_cost_single"] for x in ok_o) / 1e6 if ok_o else math.nan
                mz = statistics.mean(x["min_cost_acc"] for x in ok_z) / 1e6 if ok_z else math.nan
                print(f"{name:<13}{sum(x['runs'] for x in ok_o):>10}"
                      f"{sum(x['failed_runs'] for x in ok_o):>7}"
                      f"{sum(x['zero_epoch_tries'] for x in ok_o):>6}"
                      f"{sum(x['runs'] for x in ok_z):>10}{sum(x['failed_runs'] for x in ok_z):>7}"
                      f"{sum(x['zero_epoch_tries'] for x in ok_z):>6}   {mo:>13.3f}{mz:>14.3f}"
                      f"{f'{agree}/{total}':>16}")
                for s, r in results[name]["seeds"].items():
                    if r["lockstep"].get("error"):
                        print(f"{'':13}  seed {s}: lockstep failed: {r['lockstep']['error']}")
                    d = r["lockstep"]["first_disagreement"]
                    if d:
                        print(f"{'':13}  seed {s}: first disagreement at prediction {d[0]}: "
                              f"Zeus {d[1]}, ours {d[2]}")
            print("(ours min_cost: cheapest converged run, what our daemon bounds with; Zeus "
                  "min_cost: cheapest recurrence's accumulated cost, what Zeus's simulator bounds "
                  "with)")

            print()
            print("Ablation ladder: our driver (zeus_sim.simulate) + in-process daemon objects, "
                  "switching to Zeus's simulator semantics step by step; energy saving %, "
                  "mean over seeds")
            head = "".join(f"{k:>9}" for k, *_ in LADDER)
            hdr = f"{'workload':<13}{'gRPC':>9}{head}{'Zeus':>9}  {'L0==gRPC':>9} {'L4==Zeus':>9}"
            print(hdr)
            print("-" * len(hdr))
            for name in names:
                seeds_r = list(results[name]["seeds"].values())

                def mean_of(get):
                    xs = [v for v in (get(r) for r in seeds_r) if v is not None]
                    return f"{100 * statistics.mean(xs):9.1f}" if xs else f"{'err':>9}"

                cells = "".join(mean_of(lambda r, k=k: r["ladder"][k].get("energy_saving"))
                                for k, *_ in LADDER)
                eq0 = sum(bool(r["ladder"]["L0"].get("equals_grpc")) for r in seeds_r)
                eq4 = sum(bool(r["ladder"]["L4"].get("equals_zeus")) for r in seeds_r)
                print(f"{name:<13}{mean_of(lambda r: r['ours'].get('energy_saving'))}{cells}"
                      f"{mean_of(lambda r: r['zeus'].get('energy_saving'))}  "
                      f"{f'{eq0}/{len(seeds_r)}':>9} {f'{eq4}/{len(seeds_r)}':>9}")
                for s, r in results[name]["seeds"].items():
                    for k, *_ in LADDER:
                        if "error" in r["ladder"][k]:
                            print(f"{'':13}  seed {s} {k}: {r['ladder'][k]['error']}")
            for key, label, *_ in LADDER:
                print(f"  {key}: {label}")

        print(f"\nwall time {time.perf_counter() - started:.0f} s; our runs' outputs under {tmp}")
    if args.json:
        payload = {"args": {k: str(v) if isinstance(v, Path) else v
                            for k, v in vars(args).items()},
                   "zeus_version": Z["version"], "paper_band": PAPER_BAND,
                   "results": results}
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"JSON: {args.json}")
    log.finish()


if __name__ == "__main__":
    main()

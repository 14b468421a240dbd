"""Extra wait of regular jobs that preempt Offcut's jobs, on the test cluster set up as docs/deployment.md says.

The premise of Offcut is that the regular workload does not notice it (issue 38, "Regular jobs wait
for Offcut"). This runs the 4-node test cluster of tests/slurm_cluster.py (needs root and Slurm,
like the Slurm tests) with the Slurm settings of docs/deployment.md, "3. slurm.conf", and nothing else that
concerns scheduling (checked against the document before anything runs), a real daemon, the
launcher and the PrologSlurmctld/EpilogSlurmctld hooks, and:

1. baseline: ``--jobs`` regular jobs (``sbatch -p batch -w NODE --exclusive``) on idle nodes,
   one at a time: the wait of each, from just before ``sbatch`` to the first line of its
   script (a wall-clock stamp the job writes);
2. an Offcut task on all four nodes (``-N 1-4``): a small PyTorch MLP regression written by
   this benchmark, which uses ``offcut.client.elastic`` (a checkpoint on the stop signal, then
   exit 75); once it has trained ``--hold-s`` on four nodes, the same regular job is submitted
   onto one of its nodes (n1..n4 in turn, so also rank 0's), Slurm preempts the task's job
   there, the task goes on on three nodes, the regular job ends after ``--job-s`` and the task
   grows back to four; ``--jobs`` times.

It prints, per regular job: its wait, its extra wait over the baseline's median, Slurm's own
view (``StartTime - SubmitTime``, whole seconds), and the task's checkpoint-and-exit time on the
preempted node (from the rank's "stop requested" log line to its exit 75); then the medians and
maxima, the training pause of each preemption (the first stop request of a generation to the
first step of the next one; benchmarks/rescale_cost.py's measure), how many generations the
daemon placed and how many the launcher submitted, and the goal (issue 38): the median extra
wait is at most the median checkpoint-and-exit time + 2 s, and no job waits the scavenger
partition's GraceTime. The figures also go, with the machine and the command, to a new
``benchmarks/results/regular_job_delay-DATE-TIME.txt`` (``--no-results``: not written); the
exit status is 0 when the goal is met, 3 when not, 1 when the cluster cannot run here.

    python benchmarks/regular_job_delay.py                    # 10 preemptions, ~10 min here
    python benchmarks/regular_job_delay.py --jobs 12 --keep   # keep the cluster folder (logs)
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))       # the test cluster
sys.path.insert(0, str(REPO / "benchmarks"))  # rescale_cost's log timeline

from slurm_cluster import SlurmCluster  # noqa: E402
from rescale_cost import (ClusterUnavailable, bench_cluster, log_time, timeline,  # noqa: E402
                          trained_on, wait_for)
from results_log import ResultsLog, add_option  # noqa: E402

from offcut.client import make_task_spec  # noqa: E402
from offcut.daemon.config import SlurmConfig  # noqa: E402
from offcut.slurm_plugin.launcher import parse_job_name  # noqa: E402

NODES = ["n1", "n2", "n3", "n4"]
DEPLOYMENT = REPO / "docs" / "deployment.md"
#: the global slurm.conf keys that decide when a preempting job starts: slurm.conf must have
#: exactly the values docs/deployment.md, "3. slurm.conf", gives (absent there: absent here)
SCHED_KEYS = ("PreemptType", "PreemptMode", "SlurmctldParameters", "SchedulerParameters")
GOAL_SLACK_S = 2.0  # issue 38: median extra wait <= checkpoint-and-exit time + 2 s

#: the task: an MLP regression on synthetic data, one process per node, checkpoint every 2 s
#: and on the stop signal (offcut.client.elastic); logs in rescale_cost.py's format
TASK_SCRIPT = textwrap.dedent('''\
    import logging, os, sys, time
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from offcut.client.elastic import ElasticRun

    torch.set_num_threads(1)
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("offcut.client.elastic")
    total, batch = int(sys.argv[1]), 64
    run = ElasticRun.from_env(checkpoint_every_s=2.0, timeout_s=30.0,
                              rendezvous_timeout_s=120.0)
    run.on_restart = lambda: log.info("rank %d: exit 75", run.rank)
    with run:
        torch.manual_seed(0)
        w_true = torch.randn(16, 1)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 1))
        ddp = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ckpt = run.load_checkpoint()
        if ckpt is not None:
            model.load_state_dict(ckpt["state"]["model"])
            opt.load_state_dict(ckpt["state"]["opt"])
        done = run.samples_done
        per_rank = batch // run.world_size
        while done < total:
            g = torch.Generator().manual_seed(done + run.rank)
            x = torch.randn(per_rank, 16, generator=g)
            loss = ((ddp(x) - x @ w_true) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += batch
            time.sleep(0.05)  # a light load: 4 ranks and Slurm share a small machine
            run.step(done, lambda: {"model": model.state_dict(), "opt": opt.state_dict()})
        run.save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict()}, done)
''')

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank \d+ \w+ offcut\.client\.elastic: "
STOP_RE = re.compile(_STAMP + r"rank \d+: stop requested", re.M)
EXIT_RE = re.compile(_STAMP + r"rank \d+: exit 75", re.M)


def docs_slurm_conf(path: Path = DEPLOYMENT) -> dict[str, str]:
    """``{key: value}`` of the global :data:`SCHED_KEYS` lines in the first code block of
    docs/deployment.md's section "## 3. slurm.conf". ``SystemExit`` when the section or its
    block is missing."""
    text = path.read_text()
    m = re.search(r"^## 3\. slurm\.conf\n(.*?)^## ", text, re.M | re.S)
    block = m and re.search(r"^```\n(.*?)^```", m.group(1), re.M | re.S)
    if not block:
        raise SystemExit(f"{path}: no slurm.conf block in section '## 3. slurm.conf'")
    return conf_keys(block.group(1))


def conf_keys(text: str) -> dict[str, str]:
    """``{key: value}`` of the :data:`SCHED_KEYS` lines of a slurm.conf text (comments and
    other lines ignored; Slurm's keys are case-insensitive, as here)."""
    out: dict[str, str] = {}
    wanted = {k.lower(): k for k in SCHED_KEYS}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and " " not in key and key.lower() in wanted:
            out[wanted[key.lower()]] = value.strip()
    return out


def check_conf(conf: Path) -> dict[str, str]:
    """The docs' scheduling keys, after checking that ``conf`` (the cluster's slurm.conf) has
    exactly them; ``SystemExit`` naming the difference otherwise."""
    want, have = docs_slurm_conf(), conf_keys(conf.read_text())
    if want != have:
        raise SystemExit(f"{conf} differs from {DEPLOYMENT.name}, '3. slurm.conf', in its scheduling keys: "
                         f"docs {want}, cluster {have}")
    return want


def grace_time(conf: Path) -> float:
    """The scavenger partition's GraceTime [s] in slurm.conf ``conf`` (0 when unset)."""
    m = re.search(r"^PartitionName=scavenger\b.*\bGraceTime=(\d+)", conf.read_text(), re.M)
    return float(m.group(1)) if m else 0.0


def slurm_wait(cluster: SlurmCluster, job_id: str) -> float:
    """Slurm's ``StartTime - SubmitTime`` of a job [s] (whole seconds)."""
    out = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    kv = dict(x.split("=", 1) for x in out.split() if "=" in x)
    t = lambda k: datetime.strptime(kv[k], "%Y-%m-%dT%H:%M:%S").timestamp()  # noqa: E731
    return t("StartTime") - t("SubmitTime")


def regular_job(cluster: SlurmCluster, root: Path, node: str, job_s: float, tag: str
                ) -> tuple[str, float, Path]:
    """Submit one regular job onto ``node``; ``(job id, submit time [s], stamp file)``; its
    script first writes the wall clock into the stamp file."""
    stamp = root / f"start-{tag}"
    t0 = time.time()
    job = cluster.sbatch("-p", "batch", "-w", node, "--exclusive", "-J", f"regular-{tag}",
                         wrap=f"date +%s.%N > {stamp}; sleep {job_s:g}")
    return job, t0, stamp


def started(cluster: SlurmCluster, job: str, stamp: Path) -> float:
    """Wait until the job's script wrote its stamp; the stamp [s since the epoch]."""
    def read():
        try:
            return float(stamp.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0
    return wait_for(read, f"job {job} to start", 120)


def ckpt_exit_s(out: Path, task_id: str, generation: int, node: str) -> float | None:
    """Seconds from the preempted node's rank's "stop requested" to its "exit 75" in the
    generation's job output (None when either line is missing)."""
    cfg = SlurmConfig()
    for path in out.glob("*.out"):
        name = parse_job_name(cfg, path.name.rsplit("-", 1)[0])
        if name and (name.task_id, name.generation, name.node) == (task_id, generation, node):
            text = path.read_text(errors="replace")
            stop, end = STOP_RE.search(text), EXIT_RE.search(text)
            if stop and end:
                return log_time(end.group(1)) - log_time(stop.group(1))
    return None


def pause(gens: dict[int, dict], generation: int) -> float | None:
    """The training pause of a preemption of ``generation`` [s]: from its first stop request to
    the first step of the next generation that trained (:func:`rescale_cost.timeline`'s
    ``gens``); None when either is missing."""
    stop = gens.get(generation, {}).get("stop")
    later = [d["first"] for g, d in sorted(gens.items()) if g > generation and d["first"]]
    return later[0] - stop if stop is not None and later else None


def submitted_generations(cluster: SlurmCluster, task_id: str) -> set[int]:
    """The generations of ``task_id`` of which squeue shows a job (submitted by the launcher;
    MinJobAge=300 keeps ended ones)."""
    cfg = SlurmConfig()
    return {n.generation for j in cluster.jobs().values()
            if (n := parse_job_name(cfg, j.get("name", ""))) and n.task_id == task_id}


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10,
                    help="regular jobs on idle nodes, and preemptions (default 10, at least 1)")
    ap.add_argument("--hold-s", type=float, default=5.0,
                    help="seconds the task trains on four nodes before each preemption "
                         "(default 5)")
    ap.add_argument("--job-s", type=float, default=15.0,
                    help="seconds each regular job runs (default 15: long enough for the task "
                         "to train on three nodes meanwhile)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the cluster's folder (slurmctld.log, the jobs' output) and "
                         "print its path")
    add_option(ap)
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.hold_s < 0 or args.job_s < 0:
        ap.error("--jobs must be >= 1, --hold-s and --job-s >= 0")
    try:
        with contextlib.ExitStack() as stack:
            cluster, client, root = stack.enter_context(
                bench_cluster("offcut-regular-delay-", keep=args.keep))
            return _measure(args, cluster, client, root, stack,
                            ResultsLog.from_args("regular_job_delay", args, argv))
    except ClusterUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 1


def _measure(args, cluster, client, root, stack, log: ResultsLog) -> int:
    """The baseline and the preemptions of :func:`main` on a started cluster; prints the
    figures and writes them through ``log``; the exit status (module docstring)."""
    say = log.say
    keys = check_conf(cluster.conf)
    grace = grace_time(cluster.conf)
    say("slurm.conf scheduling keys (as docs/deployment.md, '3. slurm.conf'): "
        + ", ".join(f"{k}={v}" for k, v in keys.items())
        + f"; scavenger GraceTime={grace:g} s")
    out = stack.enter_context(cluster.launcher(cluster.address, root))

    # 1. baseline: the same jobs on idle nodes
    base: list[float] = []
    for i in range(args.jobs):
        node = NODES[i % len(NODES)]
        job, t0, stamp = regular_job(cluster, root, node, 0.5, f"idle{i}")
        base.append(started(cluster, job, stamp) - t0)
        cluster.wait_state(job, {"COMPLETED"}, timeout=60)
        print(f"  baseline {i + 1}/{args.jobs}: job {job} on idle {node} waited "
              f"{base[-1]:.2f} s", flush=True)
    base_med = _med(base)

    # 2. the task, and the same jobs on its nodes
    script = root / "mlp_task.py"
    script.write_text(TASK_SCRIPT)
    work = 100_000_000  # never reached: the task is cancelled at the end
    spec = make_task_spec("mlp", nodes="1-4", work_samples=work,
                          scalability=([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0]),
                          rescale_up_s=0.0, rescale_down_s=0.0,
                          command=[sys.executable, str(script), str(work)],
                          reports_progress=True)
    tid = client.submit(spec, owner="bench").task.task_id

    rows = []
    for i in range(args.jobs):
        wait_for(lambda: trained_on(out, client, tid, 4, args.hold_s),
                 f"preemption {i + 1}: the task on four nodes", 300)
        gen = client.get_task(tid).generation
        node = NODES[i % len(NODES)]
        job, t0, stamp = regular_job(cluster, root, node, args.job_s, f"pre{i}")
        waited = started(cluster, job, stamp) - t0
        cluster.wait_state(job, {"COMPLETED"}, timeout=120)
        wait_for(lambda: ckpt_exit_s(out, tid, gen, node) is not None,
                 f"the exit of generation {gen} on {node}", 60)
        exit_s = ckpt_exit_s(out, tid, gen, node)
        rows.append((job, node, gen, waited, waited - base_med, slurm_wait(cluster, job),
                     exit_s))
        print(f"  preemption {i + 1}/{args.jobs}: job {job} on {node} (generation {gen}) "
              f"waited {waited:.2f} s (+{waited - base_med:.2f} s), checkpoint-and-exit "
              f"{exit_s:.2f} s", flush=True)
    wait_for(lambda: trained_on(out, client, tid, 4, args.hold_s),
             "the task back on four nodes", 300)
    task = client.get_task(tid)
    placed, submitted = task.generation, submitted_generations(cluster, tid)
    client.cancel(tid)
    gens = timeline(out, tid)
    shrink = [p for r in rows if (p := pause(gens, r[2])) is not None]

    say(f"baseline: {args.jobs} regular jobs on idle nodes waited median {base_med:.2f} s, "
        f"max {max(base):.2f} s")
    say(f"{'job':>5} {'node':>4} {'gen':>4} {'wait [s]':>9} {'extra [s]':>10} "
        f"{'slurm [s]':>10} {'ckpt+exit [s]':>14}")
    for job, node, gen, waited, extra, sw, ex in rows:
        say(f"{job:>5} {node:>4} {gen:>4} {waited:>9.2f} {extra:>10.2f} {sw:>10.0f} "
            f"{ex:>14.2f}")
    extras = [r[4] for r in rows]
    waits = [r[3] for r in rows]
    exits = [r[6] for r in rows]
    say(f"extra wait over {len(rows)} preemptions: median {_med(extras):.2f} s, max "
        f"{max(extras):.2f} s (wait: median {_med(waits):.2f} s, max {max(waits):.2f} s)")
    say(f"checkpoint-and-exit on the preempted node: median {_med(exits):.2f} s, max "
        f"{max(exits):.2f} s")
    say(f"training pause per preemption (first stop request -> first step of the next "
        f"generation that trained): n={len(shrink)}, median {_med(shrink):.2f} s, max "
        f"{max(shrink, default=float('nan')):.2f} s")
    say(f"generations: {placed} placed by the daemon, {len(submitted)} submitted by the "
        f"launcher")
    ok_med = _med(extras) <= _med(exits) + GOAL_SLACK_S
    ok_grace = max(waits) < grace if grace else True
    say(f"goal: median extra wait {_med(extras):.2f} s <= checkpoint-and-exit "
        f"{_med(exits):.2f} s + {GOAL_SLACK_S:g} s: {'met' if ok_med else 'NOT met'}; "
        f"no wait reaches GraceTime {grace:g} s (max {max(waits):.2f} s): "
        f"{'met' if ok_grace else 'NOT met'}")
    log.finish()
    return 0 if ok_med and ok_grace else 3


if __name__ == "__main__":
    sys.exit(main())

"""Load test of offcutd on TCP loopback (issue 5 item 4): many concurrent clients, large node
event bursts, task submissions, reads and Zeus batch-size calls, all mixed.

Each of ``--clients`` threads (default 64) has its own :class:`~offcut.client.api.Client` (its
own gRPC channel), its own node-event source ``load-cNN`` and its own node names
(``lcNNnKKKK``, ``--nodes-per-client`` of them), so its events are valid whatever the other
clients do, and its own Zeus job (registered first). Per operation a client draws one of:

* ``report_nodes``: a node event; its first one makes ``--burst-max`` nodes idle (default 761,
  the p99 event size of the real BFTrainer node log), later ones are idle or preempt bursts (or
  both in one event) of ``--burst-max`` nodes with probability ``--big-burst-p``, else 1-32;
* ``submit``: an elastic task (Amdahl-like curve, 1-64 nodes) with a request id;
* ``status`` and ``list_tasks``: reads (status without the idle-node list, all tasks);
* ``zeus``: the next step of its Zeus job: ``zeus_predict`` (with a request id) when no
  trial is open, else ``zeus_report`` of the next epoch (converges at epoch 1 or 2, at about
  the same cost either way).

Node events need non-decreasing times across all sources (docs/architecture.md §2), so the
clients work in rounds: every event of round r carries the time T0 + 10 s * r (equal times are
allowed) and the clients meet at a barrier before the next round; inside a round all calls are
concurrent.
The load is bounded either by ``--rounds`` (a fixed number of operations:
clients x rounds x ``--ops-per-round``) or by ``--duration`` (rounds continue until it has
passed, checked at round ends).

Afterwards :func:`check_state` compares the daemon's final state with what the clients did
(idle pool, revision, per-source sequence numbers, every submitted task exactly once, node
placements, Zeus trials). Printed: a table of calls per kind with count, errors, p50 / p99 /
max latency [ms], then sustained node events/s, node names/s, calls/s, and the daemon's RSS
(now and peak) and CPU time. ``tests/test_load.py`` runs a bounded version of the same load.

Usage::

    python benchmarks/load.py                          # 64 clients for 60 s, bursts up to 761
    python benchmarks/load.py --clients 16 --duration 30 --burst-max 200 --json out.json
    python benchmarks/load.py --rounds 5 --durability normal
    python benchmarks/load.py --mix report_nodes=1        # node events only
    python benchmarks/load.py --address 127.0.0.1:50051   # drive a running daemon (fresh state!)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from offcut.client.api import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.v1 import tasks_pb2, zeus_pb2

#: event time of round 0 [s since the epoch]; round r is at T0 + ROUND_S * r
T0 = 1_600_000_000.0
ROUND_S = 10.0
#: call kinds, in table order
KINDS = ("report_nodes", "submit", "status", "list_tasks", "zeus_register", "zeus_predict",
         "zeus_report")
#: operations a client draws from, with their default weights
DEFAULT_MIX = {"report_nodes": 0.4, "submit": 0.15, "status": 0.1, "list_tasks": 0.1,
               "zeus": 0.25}
BATCH_SIZES = [32, 64, 128, 256]


@dataclass
class LoadConfig:
    """What the load does (see the module docstring).

    ``rounds`` (a fixed number of rounds) wins over ``duration_s`` [s]; one of them must be
    set. ``mix``: operation -> weight (keys of :data:`DEFAULT_MIX`). ``timeout_s``: per call
    deadline [s], also the barrier's timeout.
    """

    clients: int = 64
    rounds: int | None = None
    duration_s: float | None = 60.0
    ops_per_round: int = 4
    burst_max: int = 761
    big_burst_p: float = 0.1
    nodes_per_client: int = 1000
    seed: int = 0
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.rounds is None and self.duration_s is None:
            raise ValueError("set rounds or duration_s")
        if self.clients < 1 or self.ops_per_round < 1 or self.burst_max < 1:
            raise ValueError("clients, ops_per_round and burst_max must be >= 1")
        if self.nodes_per_client < self.burst_max:
            raise ValueError("nodes_per_client must be >= burst_max")
        unknown = set(self.mix) - set(DEFAULT_MIX)
        if unknown:
            raise ValueError(f"unknown operations in mix: {sorted(unknown)}")


@dataclass
class ClientRun:
    """One client's record: what it did (to check the final state) and its call latencies."""

    index: int
    source: str
    names: list[str]
    idle: set[str] = field(default_factory=set)
    events: int = 0                       # node events sent (= last seq used)
    uncertain: bool = False               # a node event failed: its effect is unknown
    node_names_sent: int = 0
    submissions: list[tuple[str, str, str]] = field(default_factory=list)  # (request id, task id, name)
    submit_attempts: int = 0
    predictions: int = 0
    trial: dict[str, Any] | None = None   # the open Zeus trial
    ended_trials: list[int] = field(default_factory=list)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def call(self, kind: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run one RPC, timing it; returns (ok, reply). Failures are recorded, not raised."""
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is a finding of the load test
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:400])
            return False, None
        finally:
            self.latencies_ms.setdefault(kind, []).append((time.perf_counter() - t0) * 1e3)
        return True, out


@dataclass
class LoadResult:
    """The clients' records, the wall time of the rounds [s] and the number of rounds run."""

    config: LoadConfig
    runs: list[ClientRun]
    wall_s: float
    rounds: int

    def latencies(self, kind: str) -> np.ndarray:
        """All latencies [ms] of one call kind."""
        return np.asarray([x for r in self.runs for x in r.latencies_ms.get(kind, [])], dtype=float)

    @property
    def errors(self) -> list[str]:
        """Every failed call, as ``client: kind: error``."""
        return [f"{r.source}: {e}" for r in self.runs for e in r.errors]

    @property
    def node_events(self) -> int:
        """Node events sent by all clients."""
        return sum(r.events for r in self.runs)

    @property
    def calls(self) -> int:
        """RPCs made by all clients (the final checks excluded)."""
        return sum(len(v) for r in self.runs for v in r.latencies_ms.values())

    def rows(self) -> list[dict[str, Any]]:
        """Per call kind: count, errors, p50 / p99 / max latency [ms] (kinds with calls only)."""
        out = []
        for kind in KINDS:
            ms = self.latencies(kind)
            if len(ms) == 0:
                continue
            errs = sum(1 for r in self.runs for e in r.errors if e.startswith(kind + ":"))
            out.append(dict(kind=kind, count=int(len(ms)), errors=errs,
                            p50_ms=float(np.percentile(ms, 50)), p99_ms=float(np.percentile(ms, 99)),
                            max_ms=float(ms.max())))
        return out

    def summary(self) -> dict[str, Any]:
        """Throughput figures: node events, node names and calls per second of wall time."""
        wall = max(self.wall_s, 1e-9)
        return dict(clients=self.config.clients, rounds=self.rounds, wall_s=self.wall_s,
                    node_events=self.node_events, events_per_s=self.node_events / wall,
                    node_names_per_s=sum(r.node_names_sent for r in self.runs) / wall,
                    calls=self.calls, calls_per_s=self.calls / wall,
                    submissions=sum(len(r.submissions) for r in self.runs),
                    errors=len(self.errors))


# ----------------------------------------------------------------------------- the clients
def task_spec(rng: np.random.Generator, name: str) -> tasks_pb2.TaskSpec:
    """A random elastic task: 1-2 to 4-64 nodes, Amdahl-like curve S(n) = r n / (1 + a (n - 1))
    at 0, 1, 2, 4, ..., max_nodes [samples/s], 2e4-2e5 samples of work."""
    jmax = int(rng.choice([4, 8, 16, 32, 64]))
    ns = [0] + [2 ** k for k in range(int(math.log2(jmax)) + 1)]
    r, a = float(rng.uniform(50, 200)), float(rng.uniform(0.005, 0.05))
    return tasks_pb2.TaskSpec(
        name=name, min_nodes=int(rng.integers(1, 3)), max_nodes=jmax, node_counts=ns,
        throughputs=[0.0] + [r * n / (1 + a * (n - 1)) for n in ns[1:]],
        rescale_up_s=float(rng.uniform(0, 20)), rescale_down_s=float(rng.uniform(0, 10)),
        total_work_samples=float(rng.uniform(2e4, 2e5)))


def zeus_spec(job_id: str, seed: int) -> zeus_pb2.BatchSizeJobSpec:
    """The Zeus job of one client (4 batch sizes, eta 0.5, beta 2)."""
    return zeus_pb2.BatchSizeJobSpec(
        job_id=job_id, batch_sizes=BATCH_SIZES, default_batch_size=64, eta_knob=0.5,
        beta_knob=2.0, max_epochs=10, target_metric=0.5, higher_is_better=True,
        max_power_w=300.0, seed=seed)


def _sample(rng: np.random.Generator, pool: set[str], size: int) -> list[str]:
    size = min(size, len(pool))
    if size <= 0:
        return []
    return [str(x) for x in rng.choice(sorted(pool), size, replace=False)]


def _node_event(run: ClientRun, client: Client, rng: np.random.Generator, t: float,
                cfg: LoadConfig) -> None:
    off = set(run.names) - run.idle
    if run.events == 0:
        join, leave = _sample(rng, off, cfg.burst_max), []
    else:
        size = cfg.burst_max if rng.random() < cfg.big_burst_p else int(rng.integers(1, 33))
        u = rng.random()
        if not run.idle or (off and u < 0.45):
            join, leave = _sample(rng, off, size), []
        elif not off or u < 0.85:
            join, leave = [], _sample(rng, run.idle, size)
        else:  # both in one event
            join, leave = _sample(rng, off, max(1, size // 2)), _sample(rng, run.idle, max(1, size // 2))
    seq = run.events + 1
    ok, _ = run.call("report_nodes", lambda: client.report_nodes(t, run.source, seq, idle=join,
                                                                 preempted=leave))
    run.events = seq  # a failed call may still have been applied: never reuse its seq
    run.node_names_sent += len(join) + len(leave)
    if ok:
        run.idle |= set(join)
        run.idle -= set(leave)
    else:
        run.uncertain = True


def _zeus_step(run: ClientRun, client: Client, rng: np.random.Generator) -> None:
    if run.trial is None:
        rid = f"{run.source}-p{run.predictions + 1}"
        ok, pred = run.call("zeus_predict", lambda: client.predict_batch_size(run.source, rid))
        if ok:
            run.predictions += 1
            run.trial = dict(number=pred.trial_number, batch_size=pred.batch_size, epoch=0,
                             converge_at=int(rng.integers(1, 3)))
        return
    tr = run.trial
    e = tr["epoch"] + 1
    # a run costs about the same whatever its epoch count (so it stays within beta x
    # min_cost and the job never runs out of batch sizes); the metric is reached at converge_at
    share = e / tr["converge_at"]
    energy = share * 1000.0 * (1.0 + 0.05 * float(rng.random()))
    metric = 0.9 if e >= tr["converge_at"] else 0.1
    ok, verdict = run.call("zeus_report", lambda: client.report_epoch(
        run.source, tr["number"], e, share * 10.0, energy, metric, batch_size=tr["batch_size"]))
    if ok:
        tr["epoch"] = e
        if verdict.stop:
            run.ended_trials.append(tr["number"])
            run.trial = None


def _operation(run: ClientRun, client: Client, rng: np.random.Generator, t: float,
               cfg: LoadConfig, ops: list[str], weights: np.ndarray) -> None:
    op = ops[int(rng.choice(len(ops), p=weights))]
    if run.events == 0:
        op = "report_nodes"  # the first operation of every client: a full-size idle burst
    if op == "report_nodes":
        _node_event(run, client, rng, t, cfg)
    elif op == "submit":
        run.submit_attempts += 1
        rid = f"{run.source}-s{run.submit_attempts}"
        name = f"{run.source}-task{run.submit_attempts}"
        spec = task_spec(rng, name)
        ok, reply = run.call("submit", lambda: client.submit(spec, submit_time=t, owner=run.source,
                                                             request_id=rid))
        if ok:
            run.submissions.append((rid, reply.task.task_id, name))
    elif op == "status":
        run.call("status", client.status)
    elif op == "list_tasks":
        run.call("list_tasks", client.list_tasks)
    elif op == "zeus":
        _zeus_step(run, client, rng)


def run_load(address: str, cfg: LoadConfig) -> LoadResult:
    """Drive the daemon at ``address`` with ``cfg``'s load; returns the clients' records.

    The daemon must start from an empty state (sources, node names and Zeus job ids are
    fixed). Never raises for failed calls: they are in :attr:`LoadResult.errors`.
    """
    ops = [k for k, w in cfg.mix.items() if w > 0]
    weights = np.asarray([cfg.mix[k] for k in ops], dtype=float)
    weights /= weights.sum()
    runs = [ClientRun(i, f"load-c{i:02d}", [f"lc{i:02d}n{k:04d}" for k in range(cfg.nodes_per_client)])
            for i in range(cfg.clients)]
    state = {"round": -1, "stop": False, "started": None}

    def next_round() -> None:  # run by one thread when all have arrived at the barrier
        now = time.perf_counter()
        if state["started"] is None:
            state["started"] = now
        state["round"] += 1
        if cfg.rounds is not None:
            state["stop"] = state["round"] >= cfg.rounds
        else:
            state["stop"] = now - state["started"] >= cfg.duration_s

    barrier = threading.Barrier(cfg.clients, action=next_round, timeout=cfg.timeout_s)

    def worker(run: ClientRun) -> None:
        rng = np.random.default_rng([cfg.seed, run.index])
        client = Client(address, timeout_s=cfg.timeout_s)
        try:
            run.call("zeus_register", lambda: client.register_zeus_job(
                zeus_spec(run.source, cfg.seed * 1000 + run.index)))
            while True:
                barrier.wait()
                if state["stop"]:
                    return
                t = T0 + ROUND_S * state["round"]
                for _ in range(cfg.ops_per_round):
                    _operation(run, client, rng, t, cfg, ops, weights)
        except threading.BrokenBarrierError:
            run.errors.append("barrier: broken (another client failed or timed out)")
        except Exception as exc:  # noqa: BLE001 - a harness bug: record it, release the others
            run.errors.append(f"client thread: {type(exc).__name__}: {exc}"[:400])
            barrier.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(r,), name=r.source, daemon=True) for r in runs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ended = time.perf_counter()
    wall = ended - state["started"] if state["started"] is not None else 0.0
    return LoadResult(cfg, runs, wall, max(0, state["round"]))


# ----------------------------------------------------------------------------- the checks
def check_state(client: Client, result: LoadResult) -> list[str]:
    """Compare the daemon's final state with what the clients did; returns the differences
    (empty: consistent). Checks: the idle pool is the union of the clients' idle sets; the
    revision is the number of applied node events and submissions; ``last_seq`` per source;
    every submitted task exists exactly once (a retried request id returns the same task and
    changes nothing); tasks hold disjoint idle-pool nodes within their limits; each Zeus job
    has one trial per prediction, and the trials the clients saw end are ended. Makes a few
    read calls and one idempotent retry."""
    problems: list[str] = []
    runs = result.runs
    st = client.status(include_idle_nodes=True)
    pool = set(st.idle_node_names)
    expected_pool = set().union(*(r.idle for r in runs if not r.uncertain))
    mine = {n for r in runs if not r.uncertain for n in r.names}
    if {n for n in pool if n in mine} != expected_pool:
        problems.append(f"idle pool: {len(pool & mine)} of the checked clients' nodes, "
                        f"expected {len(expected_pool)}")
    if st.idle_nodes != len(pool):
        problems.append(f"status idle_nodes {st.idle_nodes} != {len(pool)} names")
    if not any(r.uncertain for r in runs) and len(pool) != len(expected_pool):
        problems.append(f"idle pool holds {len(pool)} nodes, expected {len(expected_pool)}")

    submissions = [s for r in runs for s in r.submissions]
    expected_revision = result.node_events + sum(r.submit_attempts for r in runs)
    if not result.errors and st.revision != expected_revision:
        problems.append(f"revision {st.revision} != {expected_revision} applied state changes")
    seqs = {r.source: r.events for r in runs if r.events}
    if dict(st.last_seq) != seqs:
        wrong = sorted(s for s in set(seqs) | set(st.last_seq) if st.last_seq.get(s) != seqs.get(s))
        problems.append(f"last_seq differs for {len(wrong)} sources, e.g. {wrong[:3]}")

    tasks = client.list_tasks()
    ids = [t.task_id for t in tasks]
    if len(ids) != len(set(ids)):
        problems.append("list_tasks returned a task twice")
    by_id = {t.task_id: t for t in tasks}
    if len(tasks) != len(submissions):
        problems.append(f"{len(tasks)} tasks exist, {len(submissions)} were submitted")
    if len({tid for _, tid, _ in submissions}) != len(submissions):
        problems.append("two submissions got the same task id")
    for rid, tid, name in submissions:
        t = by_id.get(tid)
        if t is None or t.spec.name != name or t.owner != name.split("-task")[0]:
            problems.append(f"submission {rid}: task {tid} missing or not {name!r}")
    if submissions:  # a retried request id answers the stored task and changes nothing
        rid, tid, name = submissions[len(submissions) // 2]
        run = next(r for r in runs if r.source == name.split("-task")[0])
        again = client.submit(tasks_pb2.TaskSpec(**_spec_fields(by_id[tid].spec)),
                              submit_time=T0, owner=run.source, request_id=rid)
        if again.task.task_id != tid or client.status().revision != st.revision:
            problems.append(f"retry of {rid} answered {again.task.task_id}, expected {tid} "
                            "without a state change")

    held: list[str] = []
    for t in tasks:
        held.extend(t.nodes)
        if t.nodes and not (t.spec.min_nodes <= len(t.nodes) <= t.spec.max_nodes):
            problems.append(f"task {t.task_id} holds {len(t.nodes)} nodes outside "
                            f"[{t.spec.min_nodes}, {t.spec.max_nodes}]")
    if len(held) != len(set(held)):
        problems.append("a node is held by two tasks")
    if not set(held) <= pool:
        problems.append(f"{len(set(held) - pool)} held nodes are not in the idle pool")
    if len(held) != st.nodes_in_use:
        problems.append(f"tasks hold {len(held)} nodes, status nodes_in_use {st.nodes_in_use}")
    if st.solver.fallbacks:
        problems.append(f"{st.solver.fallbacks} solver fallbacks ({st.solver.last_fallback_reason})")

    for r in runs:
        if not r.latencies_ms.get("zeus_register") or any(e.startswith("zeus_register") for e in r.errors):
            continue
        trials = json.loads(client.get_zeus_job(r.source).state_json)["trials"]
        if len(trials) != r.predictions:
            problems.append(f"zeus job {r.source}: {len(trials)} trials, {r.predictions} predictions")
            continue
        status = {t["trial_number"]: t["status"] for t in trials}
        if any(status.get(n) == "running" for n in r.ended_trials):
            problems.append(f"zeus job {r.source}: a trial it saw end is still running")
        if r.trial is not None and status.get(r.trial["number"]) != "running":
            problems.append(f"zeus job {r.source}: its open trial is {status.get(r.trial['number'])}")
    return problems


def _spec_fields(spec: tasks_pb2.TaskSpec) -> dict[str, Any]:
    return dict(name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                node_counts=list(spec.node_counts), throughputs=list(spec.throughputs),
                rescale_up_s=spec.rescale_up_s, rescale_down_s=spec.rescale_down_s,
                total_work_samples=spec.total_work_samples)


# ----------------------------------------------------------------------------- the report
def print_report(result: LoadResult, daemon: dict[str, Any] | None = None, title: str = "") -> None:
    """Print the per-kind latency table and the throughput lines (``daemon``: optional
    ``rss_mb``, ``peak_rss_mb``, ``cpu_s`` of the daemon process)."""
    from rich.console import Console
    from rich.table import Table

    s = result.summary()
    table = Table(title=title or (f"offcutd load: {s['clients']} clients, {s['rounds']} rounds, "
                                  f"{s['wall_s']:.1f} s"))
    for col in ("call", "count", "errors", "p50 ms", "p99 ms", "max ms"):
        table.add_column(col, justify="left" if col == "call" else "right")
    for row in result.rows():
        table.add_row(row["kind"], str(row["count"]), str(row["errors"]), f"{row['p50_ms']:.2f}",
                      f"{row['p99_ms']:.2f}", f"{row['max_ms']:.2f}")
    console = Console(width=110)
    console.print(table)
    line = (f"sustained: {s['events_per_s']:.1f} node events/s ({s['node_events']} events, "
            f"{s['node_names_per_s']:.0f} node names/s), {s['calls_per_s']:.1f} calls/s "
            f"({s['calls']} calls), {s['submissions']} tasks submitted, {s['errors']} errors")
    console.print(line, highlight=False)
    if daemon:
        parts = []
        if daemon.get("rss_mb") is not None:
            parts.append(f"RSS {daemon['rss_mb']:.0f} MiB (peak {daemon['peak_rss_mb']:.0f} MiB)")
        if daemon.get("cpu_s") is not None:
            parts.append(f"CPU {daemon['cpu_s']:.1f} s "
                         f"({daemon['cpu_s'] / max(1, s['calls']) * 1e3:.2f} ms per call)")
        console.print("daemon: " + ", ".join(parts), highlight=False)


# ----------------------------------------------------------------------------- the daemon
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_figures(pid: int) -> dict[str, Any]:
    """RSS and peak RSS [MiB] (VmRSS, VmHWM) and CPU time [s] (utime + stime) of ``pid``."""
    out: dict[str, Any] = {"rss_mb": None, "peak_rss_mb": None, "cpu_s": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024.0
            elif line.startswith("VmHWM:"):
                out["peak_rss_mb"] = int(line.split()[1]) / 1024.0
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return out


def start_daemon(folder: Path, durability: str) -> tuple[subprocess.Popen, str]:
    """``offcutd`` (solver dp) on a free TCP loopback port with its state in ``folder``;
    returns (process, address) once it answers health checks. Raises Unavailable."""
    address = f"127.0.0.1:{_free_port()}"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(folder / "state.sqlite"),
           "--solver", "dp", "--durability", durability, "--log-level", "warning"]
    return start_offcutd(cmd, address, folder / "offcutd.log"), address


def main(argv: list[str] | None = None) -> int:
    """Command line: run the load against a private daemon (or ``--address``); exit code 1
    on any failed call or inconsistency."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    ap.add_argument("--rounds", type=int, help="a fixed number of rounds instead of --duration")
    ap.add_argument("--ops-per-round", type=int, default=4, help="operations per client per round")
    ap.add_argument("--burst-max", type=int, default=761, help="largest node event (default 761)")
    ap.add_argument("--big-burst-p", type=float, default=0.1,
                    help="probability that a later node event has --burst-max nodes")
    ap.add_argument("--nodes-per-client", type=int, default=1000)
    ap.add_argument("--mix", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_MIX.items()),
                    help="operation weights, e.g. report_nodes=0.4,submit=0.15,status=0.1,"
                         "list_tasks=0.1,zeus=0.25 (the default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--durability", choices=("full", "normal"), default="full")
    ap.add_argument("--address", help="drive this running daemon (fresh state) instead of a private one")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    try:
        mix = {k.strip(): float(v) for k, v in (item.split("=") for item in args.mix.split(","))}
    except ValueError:
        ap.error(f"--mix: {args.mix!r} is not NAME=WEIGHT,...")
    cfg = LoadConfig(clients=args.clients, rounds=args.rounds,
                     duration_s=None if args.rounds else args.duration,
                     ops_per_round=args.ops_per_round, burst_max=args.burst_max,
                     big_burst_p=args.big_burst_p, nodes_per_client=args.nodes_per_client,
                     seed=args.seed, mix=mix)
    proc = None
    with tempfile.TemporaryDirectory(prefix="offcut-load-") as tmp:
        if args.address:
            address = args.address
        else:
            proc, address = start_daemon(Path(tmp), args.durability)
        try:
            before = _proc_figures(proc.pid) if proc else {}
            result = run_load(address, cfg)
            daemon = _proc_figures(proc.pid) if proc else None
            if daemon and before.get("cpu_s") is not None and daemon.get("cpu_s") is not None:
                daemon["cpu_s"] -= before["cpu_s"]
            with Client(address) as client:
                problems = check_state(client, result)
        finally:
            if proc is not None:
                stop_offcutd(proc)
    print_report(result, daemon)
    for e in result.errors[:20]:
        print("ERROR", e)
    print("final state: " + ("consistent" if not problems else "; ".join(problems)))
    if args.json:
        args.json.write_text(json.dumps(dict(config=asdict(cfg), summary=result.summary(),
                                             calls=result.rows(), daemon=daemon,
                                             errors=result.errors, problems=problems), indent=2))
    return 1 if result.errors or problems else 0


if __name__ == "__main__":
    sys.exit(main())

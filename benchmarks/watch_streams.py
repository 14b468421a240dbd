"""Node events while 1,000 WatchPlacements streams are open (docs/security.md, streams):
do Slurm's node events still apply within 100 ms p99?

A private ``offcutd`` (unix socket, tokens, solver dp) is started as a child process
(:mod:`offcut.client.child_daemon`). ``--users`` ordinary users (role ``user``, a token each)
submit one elastic task each (1-8 nodes) and one ``slurm``-role token sends the node events
(``ReportNodes``, one at a time, each waiting for its answer, as the Slurm hooks do). The pool
starts with ``--nodes`` idle nodes; each measured event takes back (preempts) or returns 1 to 4
of them, so most events move some task's nodes and publish a placement update.

1. baseline: ``--events`` node events without any stream open;
2. a second process opens ``--streams-per-user`` WatchPlacements streams per user (default
   100 users x 10 = 1,000 streams; ``grpc.aio``, one channel per user, each stream with its
   user's token) and waits until every stream has received its first update (the daemon holds
   them all open);
3. the same number of node events with all streams open, while the streams receive their
   users' placement updates.

Printed: node-event latency (the ``ReportNodes`` call's round trip) p50 / p99 / max [ms] for
both phases and their ratio, the streams' updates (how many, the delay from the event's time to
its arrival at a stream, p50 / p99 [ms]), and the daemon's RSS and thread count without and
with the streams (memory per open stream). Exit code 1 when a call failed, a stream did not
open or ended early, or the p99 with streams is above ``--p99-limit-ms`` (100). The figure
lines also go, with the machine and the command, to a new
``benchmarks/results/watch_streams-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/watch_streams.py                       # 100 users x 10 streams, 300 events
    python benchmarks/watch_streams.py --users 200 --streams-per-user 20 --events 500
    python benchmarks/watch_streams.py --durability normal --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import numpy as np

from offcut.client.api import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.daemon.edge.auth import add_token
from offcut.v1 import tasks_pb2, tasks_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

SOURCE = "bench-hook"


# ----------------------------------------------------------------------------- the daemon
def proc_figures(pid: int) -> dict[str, Any]:
    """RSS and peak RSS [MiB] (VmRSS, VmHWM) and the thread count of process ``pid``."""
    out: dict[str, Any] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            out["rss_mib"] = int(value.split()[0]) / 1024.0
        elif key == "VmHWM":
            out["peak_rss_mib"] = int(value.split()[0]) / 1024.0
        elif key == "Threads":
            out["threads"] = int(value)
    return out


def task_spec(name: str) -> tasks_pb2.TaskSpec:
    """An elastic task of 1-8 nodes with an Amdahl-like curve and a long run."""
    ns = list(range(9))
    ps = [0.0] + [100.0 * n / (1 + 0.1 * (n - 1)) for n in ns[1:]]
    return tasks_pb2.TaskSpec(name=name, min_nodes=1, max_nodes=8, node_counts=ns,
                              throughputs=ps, rescale_up_s=5.0, rescale_down_s=5.0,
                              total_work_samples=1e15)


# ----------------------------------------------------------------------------- the streams
def hold_streams(address: str, tokens: dict[str, str], per_user: int, since: int,
                 conn) -> None:
    """The stream holders' process: open ``per_user`` streams per user, say ``ready`` (with
    the seconds it took) once each has received its first update (the retained ones come
    first), then count updates until told to stop; answer with the counts and the delivery
    delays [s] of the updates after revision ``since``."""
    asyncio.run(_hold_streams(address, tokens, per_user, since, conn))


async def _hold_streams(address: str, tokens: dict[str, str], per_user: int, since: int,
                        conn) -> None:
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    channels = [grpc.aio.insecure_channel(address) for _ in tokens]
    n = len(tokens) * per_user
    received = [0] * n
    delays: list[float] = []
    ended: list[str] = []
    opened = asyncio.Event()
    first = [0]

    async def watch(i: int, stub: tasks_pb2_grpc.TasksStub, token: str) -> None:
        call = stub.WatchPlacements(tasks_pb2.WatchPlacementsRequest(),
                                    metadata=[("authorization", f"Bearer {token}")])
        try:
            async for update in call:
                if received[i] == 0:
                    first[0] += 1
                    if first[0] == n:
                        opened.set()
                if update.revision > since:
                    delays.append(time.time() - update.time)
                received[i] += 1
            ended.append(f"stream {i} ended")
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                ended.append(f"stream {i}: {err.code().name} {err.details()}")
                opened.set()

    tasks = []
    for u, (channel, token) in enumerate(zip(channels, tokens.values())):
        stub = tasks_pb2_grpc.TasksStub(channel)
        tasks += [asyncio.ensure_future(watch(u * per_user + k, stub, token))
                  for k in range(per_user)]
    await opened.wait()
    conn.send(("ready", time.perf_counter() - started, ended))
    await loop.run_in_executor(None, conn.recv)  # "stop"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    conn.send(("done", received, delays, ended))


# ----------------------------------------------------------------------------- node events
class NodeEvents:
    """Slurm's side: one-at-a-time ReportNodes calls that take back or return 1-4 nodes."""

    def __init__(self, client: Client, nodes: list[str], seed: int):
        self.client = client
        self.idle = set(nodes)
        self.away: set[str] = set()
        self.rng = random.Random(seed)
        self.seq = 0
        #: the revision after the last event
        self.revision = 0

    def send(self, idle=(), preempted=()) -> float:
        """One event; returns its latency [s]."""
        self.seq += 1
        t = time.perf_counter()
        decision = self.client.report_nodes(time.time(), SOURCE, self.seq, idle=idle,
                                            preempted=preempted)
        latency = time.perf_counter() - t
        self.revision = decision.revision
        return latency

    def step(self) -> float:
        """Take back 1-4 idle nodes, or return some taken ones; returns the latency [s]."""
        k = self.rng.randint(1, 4)
        if self.away and (self.rng.random() < 0.5 or len(self.idle) < 8):
            back = self.rng.sample(sorted(self.away), min(k, len(self.away)))
            self.away -= set(back)
            self.idle |= set(back)
            return self.send(idle=back)
        gone = self.rng.sample(sorted(self.idle), k)
        self.idle -= set(gone)
        self.away |= set(gone)
        return self.send(preempted=gone)

    def run(self, n: int) -> np.ndarray:
        """``n`` events; their latencies [ms]."""
        return np.array([self.step() for _ in range(n)]) * 1000.0


def percentiles(ms: np.ndarray) -> dict[str, float]:
    """p50, p99 and max of ``ms`` [ms]."""
    if len(ms) == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max())}


# ----------------------------------------------------------------------------- main
def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The whole benchmark in ``folder``; returns the figures."""
    tokens_file = folder / "tokens.toml"
    slurm_token = add_token(tokens_file, "slurm", "slurm")
    users = {f"user{u:03d}": add_token(tokens_file, f"user{u:03d}", "user")
             for u in range(args.users)}
    address = f"unix://{folder}/offcutd.sock"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(folder / "state.sqlite"),
           "--solver", "dp", "--durability", args.durability, "--tokens-file", str(tokens_file),
           "--max-running-tasks", str(args.users), "--log-level", "warning"]
    proc = start_offcutd(cmd, address, folder / "offcutd.log")
    holder = None
    try:
        for user, token in users.items():
            with Client(address, timeout_s=60, token=token) as c:
                c.submit(task_spec(f"{user}-task"))
        nodes = [f"b{i:05d}" for i in range(args.nodes)]
        slurm = Client(address, timeout_s=60, token=slurm_token)
        events = NodeEvents(slurm, nodes, args.seed)
        events.send(idle=nodes)  # every task gets nodes: each stream has a first update
        events.run(min(20, args.events))  # warm-up (not measured)
        baseline = events.run(args.events)
        quiet = proc_figures(proc.pid)

        parent, child = multiprocessing.get_context("spawn").Pipe()
        holder = multiprocessing.get_context("spawn").Process(
            target=hold_streams, args=(address, users, args.streams_per_user, events.revision,
                                       child), daemon=True)
        holder.start()
        if not parent.poll(args.open_timeout_s):
            raise RuntimeError(f"the streams did not open within {args.open_timeout_s:.0f} s")
        _, open_s, early = parent.recv()
        if early:
            raise RuntimeError(f"streams failed to open: {early[:5]}")
        busy_open = proc_figures(proc.pid)
        loaded = events.run(args.events)
        busy = proc_figures(proc.pid)
        parent.send("stop")
        _, received, delays, ended = parent.recv()
        holder.join(30)
        slurm.close()
    finally:
        if holder is not None and holder.is_alive():
            holder.kill()
        stop_offcutd(proc)
    streams = args.users * args.streams_per_user
    base, load = percentiles(baseline), percentiles(loaded)
    return {
        "users": args.users, "streams": streams, "events": args.events, "nodes": args.nodes,
        "durability": args.durability,
        "baseline": base, "with_streams": load,
        "p99_ratio": load["p99_ms"] / base["p99_ms"] if base["p99_ms"] > 0 else float("nan"),
        "streams_open_s": open_s,
        "updates_received": int(len(delays)),
        "streams_without_updates": int(sum(1 for r in received if r == 0)),
        "streams_ended_early": ended,
        "delivery": percentiles(np.array(delays) * 1000.0),
        "daemon_without_streams": quiet, "daemon_with_streams": busy_open,
        "daemon_after_events": busy,
        "rss_per_stream_kib": (busy_open["rss_mib"] - quiet["rss_mib"]) * 1024.0 / streams,
    }


def print_figures(f: dict[str, Any], limit_ms: float,
                  say: Callable[[str], None] = print) -> None:
    """The figures as a few lines, each through ``say`` (a :class:`ResultsLog`'s, or print)."""
    b, w = f["baseline"], f["with_streams"]
    say(f"offcutd, {f['users']} users, {f['nodes']} nodes, durability {f['durability']}: "
        f"{f['events']} node events (ReportNodes, slurm role) per phase")
    say(f"  node-event latency without streams: p50 {b['p50_ms']:.1f} ms, p99 "
        f"{b['p99_ms']:.1f} ms, max {b['max_ms']:.1f} ms")
    say(f"  node-event latency with {f['streams']} open streams: p50 {w['p50_ms']:.1f} ms, "
        f"p99 {w['p99_ms']:.1f} ms, max {w['max_ms']:.1f} ms (p99 ratio {f['p99_ratio']:.2f})")
    d = f["delivery"]
    say(f"  streams: all {f['streams']} open in {f['streams_open_s']:.1f} s; "
        f"{f['updates_received']} updates received during the run (delay from the event's "
        f"time: p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms)")
    q, s = f["daemon_without_streams"], f["daemon_with_streams"]
    say(f"  daemon: RSS {q['rss_mib']:.0f} MiB, {q['threads']} threads without streams; "
        f"RSS {s['rss_mib']:.0f} MiB, {s['threads']} threads with {f['streams']} streams "
        f"({f['rss_per_stream_kib']:.0f} KiB per stream); peak RSS "
        f"{f['daemon_after_events']['peak_rss_mib']:.0f} MiB")
    verdict = "PASS" if w["p99_ms"] <= limit_ms else "FAIL"
    say(f"  {verdict}: p99 with streams {w['p99_ms']:.1f} ms (limit {limit_ms:.0f} ms)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter,
                     argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each option's default."""


def main(argv: list[str] | None = None) -> int:
    """Command line (``--help``); exit code 1 on a failure or a p99 over the limit."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=_HelpFormatter)
    ap.add_argument("--users", type=int, default=100, help="ordinary users, one task each")
    ap.add_argument("--streams-per-user", type=int, default=10,
                    help="WatchPlacements streams per user (x --users: 1,000 in all)")
    ap.add_argument("--events", type=int, default=300, help="measured node events per phase")
    ap.add_argument("--nodes", type=int, default=400, help="idle nodes at the start")
    ap.add_argument("--durability", choices=("full", "normal"), default="full",
                    help="the daemon's durability (full: an fsync per event)")
    ap.add_argument("--p99-limit-ms", type=float, default=100.0,
                    help="the largest acceptable p99 [ms] of node events with streams")
    ap.add_argument("--open-timeout-s", type=float, default=120.0,
                    help="how long the streams may take to open")
    ap.add_argument("--seed", type=int, default=0, help="seed of the node events")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    add_option(ap)
    args = ap.parse_args(argv)
    log = ResultsLog.from_args("watch_streams", args, argv)
    with tempfile.TemporaryDirectory(prefix="offcut-streams-") as tmp:
        figures = run(args, Path(tmp))
    print_figures(figures, args.p99_limit_ms, log.say)
    log.finish()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    ok = (figures["with_streams"]["p99_ms"] <= args.p99_limit_ms
          and not figures["streams_ended_early"] and not figures["streams_without_updates"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

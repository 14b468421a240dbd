"""Junk MUNGE credentials beside Slurm's node events (issue 37, finding 10; docs/security.md,
"Round two: junk credentials").

A private ``munged`` (its own socket, the host's key) and a private ``offcutd`` with
``munge = true`` on a unix socket every user may connect to, and (unless ``--shared``) the
node side on a socket of its own (``node_listen``). The feeder plays node events as Slurm's
hooks send them (``SyncNodes`` with a fresh MUNGE credential per call, made before the call is
timed; root's: the admin role, which takes the node events' path as the slurm role does) at
``--rate`` events per second; ``--junk`` processes, each an ordinary local user (``nobody``),
send calls carrying credentials in MUNGE's armour made of random bytes (munged must judge each)
to ``listen``, each keeping ``--in-flight`` calls outstanding (a new one as soon as one is
answered). Prints the feeder's node-event latency p50 / p99 / max [ms] first with no junk, then
once every sender's flood is on, the junk calls answered per second and the daemon's RSS; exit
status 1 when a node event failed or the p99 with junk is :data:`P99_LIMIT_MS` or more. The
figure lines also go, with the machine and the command, to a new
``benchmarks/results/munge_junk-DATE-TIME.txt`` (``--no-results``: not written).

Needs root (it starts munged as user ``munge`` and the junk as ``nobody``) and MUNGE installed
(``apt-get install munge``).

    python benchmarks/munge_junk.py                           # 3 senders, 20 s each phase
    python benchmarks/munge_junk.py --shared --refusal-delay 0  # as before issue 37
    python benchmarks/munge_junk.py --in-flight 600           # past the held-refusal bound
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing as mp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from offcut import munge

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import _proc_figures  # noqa: E402  (RSS of the daemon)
from results_log import ResultsLog, add_option  # noqa: E402
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.v1 import nodes_pb2, nodes_pb2_grpc, tasks_pb2, tasks_pb2_grpc

#: the goal for the node events' p99 with three junk senders [ms] (issue 37, "Wanted")
P99_LIMIT_MS = 50.0
SYNC_NODES = "/offcut.v1.NodeEvents/SyncNodes"
#: nodes the feeder moves between idle and busy
NODES = [f"n{i:04d}" for i in range(64)]


def start_munged(folder: Path) -> tuple[subprocess.Popen | None, str]:
    """munged as user ``munge`` on a private socket in ``folder`` (0755, as munged wants);
    the host's key (``/etc/munge/munge.key``, made when missing as Debian's package does).
    Returns (None, socket path) once it answers. Raises SystemExit when it cannot start."""
    sock = folder / "munge" / "munge.socket.2"
    (folder / "munge").mkdir()
    shutil.chown(folder / "munge", "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={sock}",
                    f"--pid-file={folder / 'munge' / 'munged.pid'}",
                    f"--log-file={folder / 'munge' / 'munged.log'}",
                    f"--seed-file={folder / 'munge' / 'munged.seed'}"], check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            munge.decode(munge.encode(b"x", socket=str(sock)), socket=str(sock))
            return None, str(sock)
        except munge.MungeError:
            time.sleep(0.05)
    raise SystemExit(f"munged at {sock} does not answer (see {folder}/munge/munged.log)")


def stop_munged(folder: Path) -> None:
    """Stop the private munged (its pid file in ``folder``)."""
    pid_file = folder / "munge" / "munged.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text().strip()), 15)
        except (OSError, ValueError):
            pass


def junk_sender(address: str, in_flight: int, seconds: float, counts, ready) -> None:
    """One junk sender (a process of its own, as ``nobody``): ``in_flight`` calls outstanding
    at all times (``grpc.aio``, one channel), each with a fresh random credential in MUNGE's
    armour, for ``seconds`` [s]; adds the calls answered to ``counts``, and 1 to ``ready``
    once ``in_flight`` calls were answered (the flood is on)."""
    import asyncio

    nobody = pwd.getpwnam("nobody")
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)

    async def run() -> int:
        answered = 0
        end = time.monotonic() + seconds
        async with grpc.aio.insecure_channel(address) as channel:
            stub = tasks_pb2_grpc.TasksStub(channel)

            async def one_after_another() -> None:
                nonlocal answered
                while time.monotonic() < end:
                    junk = "MUNGE:" + base64.b64encode(os.urandom(120)).decode() + ":"
                    try:
                        await stub.ListTasks(tasks_pb2.ListTasksRequest(), timeout=30,
                                             metadata=[("authorization", f"MUNGE {junk}")])
                    except grpc.RpcError:
                        pass
                    answered += 1
                    with counts.get_lock():
                        counts.value += 1
                    if answered == in_flight:
                        with ready.get_lock():
                            ready.value += 1

            await asyncio.gather(*(one_after_another() for _ in range(in_flight)))

    asyncio.run(run())


def feed(address: str, sock: str, rate: float, seconds: float, seq0: int
         ) -> tuple[list[float], int, int]:
    """Node events at ``rate`` per second for ``seconds`` [s] (as root: the admin role, which
    takes the node side's path as the slurm role does), each with a fresh credential made before
    its call is timed. Returns (latencies [ms], failures, next sequence number)."""
    channel = grpc.insecure_channel(address)
    stub = nodes_pb2_grpc.NodeEventsStub(channel)
    latencies, failures, seq = [], 0, seq0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        seq += 1
        idle = NODES[: (seq * 7) % len(NODES)]
        request = nodes_pb2.NodeSnapshot(source="munge-junk", seq=seq, idle=idle)
        request.time.FromNanoseconds(time.time_ns())
        metadata = [("authorization",
                     "MUNGE " + munge.encode(munge.call_payload(SYNC_NODES), socket=sock))]
        t0 = time.perf_counter()
        try:
            stub.SyncNodes(request, metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            failures += 1
            print(f"node event {seq}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        latencies.append((time.perf_counter() - t0) * 1e3)
        next_at = start + (seq - seq0) / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    channel.close()
    return latencies, failures, seq


def figures(lat: list[float]) -> str:
    """p50 / p99 / max of ``lat`` [ms] as text."""
    a = np.array(lat or [0.0])
    return (f"p50 {np.percentile(a, 50):.1f} ms, p99 {np.percentile(a, 99):.1f} ms, "
            f"max {a.max():.1f} ms ({len(lat)} events)")


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--junk", type=int, default=3, help="junk senders (default 3)")
    ap.add_argument("--in-flight", type=int, default=16,
                    help="calls each junk sender keeps outstanding (default 16)")
    ap.add_argument("--rate", type=float, default=20.0,
                    help="node events per second (default 20)")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="length of each phase, s (default 20)")
    ap.add_argument("--refusal-delay", type=float, default=None,
                    help="the daemon's refusal_delay_s, s (default: the daemon's default; 0: "
                         "refusals at once, as before issue 37)")
    ap.add_argument("--shared", action="store_true",
                    help="no node_listen: node events share listen with the junk (as before "
                         "issue 37)")
    add_option(ap)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("munge_junk.py must run as root (it starts munged and the junk as nobody)")
    reason = munge.available()
    if reason or shutil.which("munged", path="/usr/sbin:/usr/bin") is None:
        raise SystemExit(f"MUNGE is not installed ({reason or 'no munged'}): apt-get install munge")
    folder = Path(tempfile.mkdtemp(prefix="offcut-munge-junk-", dir="/tmp"))
    folder.chmod(0o755)
    proc = None
    try:
        _, sock = start_munged(folder)
        address = f"unix://{folder / 'offcutd.sock'}"
        node_address = address if args.shared else f"unix://{folder / 'node' / 'node.sock'}"
        cmd = [*offcutd_argv(), "--listen", address, "--state", str(folder / "state" / "s.sqlite"),
               "--solver", "dp", "--clock", "live", "--munge", "--munge-socket", sock,
               "--log-level", "warning"]
        if not args.shared:
            cmd += ["--node-listen", node_address]
        if args.refusal_delay is not None:
            cmd += ["--refusal-delay", str(args.refusal_delay)]
        proc = start_offcutd(cmd, address, folder / "offcutd.log")
        delay = "default" if args.refusal_delay is None else f"{args.refusal_delay:g} s"
        log = ResultsLog.from_args("munge_junk", args, argv)
        say = log.say

        say(f"node events on {'listen (shared with the junk)' if args.shared else 'node_listen'}"
              f", {args.rate:g}/s; {args.junk} junk sender(s) on listen, {args.in_flight} calls "
              f"in flight each; refusal_delay_s {delay}")
        quiet, failures, seq = feed(node_address, sock, args.rate, args.seconds, 0)
        say(f"no junk:          {figures(quiet)}")
        counts, ready = mp.Value("q", 0), mp.Value("q", 0)
        flood_s = args.seconds + 60  # (until the feed ends: they are stopped then)
        senders = [mp.Process(target=junk_sender,
                              args=(address, args.in_flight, flood_s, counts, ready))
                   for _ in range(args.junk)]
        rss0 = _proc_figures(proc.pid)["rss_mb"]
        for p in senders:
            p.start()
        deadline = time.monotonic() + 120
        while ready.value < args.junk and time.monotonic() < deadline:
            time.sleep(0.1)  # every sender's first in-flight calls answered: the flood is on
        counted, t0 = counts.value, time.monotonic()
        noisy, failed, _ = feed(node_address, sock, args.rate, args.seconds, seq)
        rss1 = _proc_figures(proc.pid)["rss_mb"]
        for p in senders:
            p.terminate()
        for p in senders:
            p.join(timeout=60)
        failures += failed
        junk_rate = (counts.value - counted) / (time.monotonic() - t0)
        p99 = float(np.percentile(np.array(noisy or [0.0]), 99))
        say(f"with {args.junk} junk: {figures(noisy)}; junk judged {junk_rate:.0f}/s; goal "
            f"p99 < {P99_LIMIT_MS:g} ms")
        say(f"node events failed: {failures}; daemon RSS {rss0:.0f} -> {rss1:.0f} MiB "
            f"(during the junk)")
        log.finish()
        return 1 if failures or p99 >= P99_LIMIT_MS else 0
    finally:
        if proc is not None:
            stop_offcutd(proc)
        stop_munged(folder)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

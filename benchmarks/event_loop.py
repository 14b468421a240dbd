"""offcutd's CPU per unary call on uvloop vs asyncio's own event loop (docs/architecture.md,
"Threads").

Two daemons run side by side, one on each loop (the asyncio one is offcutd with ``uvloop``
made unimportable, as on a machine without it); one client sends them alternate batches of
``--batch`` trivial ``ReportNodes`` calls (one node joins or leaves a 2,000-node pool, no
tasks), so both see the same machine speed, which varies by up to 2x over an hour here.
Printed per loop: the daemon's CPU time per call [ms] (user + system, from /proc) and the wall
time per call [ms]; then uvloop's over asyncio's. The figure lines also go, with the machine
and the command, to a new ``benchmarks/results/event_loop-DATE-TIME.txt`` (``--no-results``:
not written).

Usage::

    python benchmarks/event_loop.py                 # 12 rounds of 400 calls to each
    python benchmarks/event_loop.py --rounds 20 --batch 1000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

#: offcutd as a machine without uvloop runs it
_WITHOUT_UVLOOP = ("import sys; sys.modules['uvloop'] = None; "
                   "from offcut.daemon.__main__ import main; main()")


class Daemon:
    """One offcutd on a unix socket in a temporary folder (on uvloop or not), with a client.

    Raises :class:`offcut.errors.Unavailable` with its log's tail when it does not start."""

    def __init__(self, label: str, uvloop: bool):
        from offcut.client.api import Client
        from offcut.client.child_daemon import offcutd_argv, start_offcutd

        self.label = label
        self.folder = folder = Path(tempfile.mkdtemp(prefix=f"offcut-loop-{label}-"))
        address = f"unix://{folder / 'd.sock'}"
        head = offcutd_argv() if uvloop else [sys.executable, "-c", _WITHOUT_UVLOOP]
        self.proc = start_offcutd(
            head + ["--listen", address, "--state", str(folder / "state.sqlite"),
                    "--clock", "replay", "--durability", "normal", "--log-level", "warning"],
            address, folder / "offcutd.log")
        self.client = Client(address)
        self.seq, self.cpu_s, self.wall_s, self.calls = 1, 0.0, 0.0, 0

    def cpu(self) -> float:
        """The daemon's CPU time so far [s] (user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def batch(self, names: list[str], n: int, counted: bool) -> None:
        """``n`` node events on the second half of ``names`` (the first half is the idle pool
        of the sync): odd seqs make a node idle, even ones take that node back."""
        spare = names[len(names) // 2:]
        cpu0, wall0 = self.cpu(), time.perf_counter()
        for _ in range(n):
            self.seq += 1
            node = spare[(self.seq - (self.seq + 1) % 2) % len(spare)]  # even: the last one
            change = {"idle": [node]} if self.seq % 2 else {"preempted": [node]}
            self.client.report_nodes(1.7e9 + self.seq, "bench", self.seq, **change)
        if counted:
            self.cpu_s += self.cpu() - cpu0
            self.wall_s += time.perf_counter() - wall0
            self.calls += n

    def stop(self) -> None:
        from offcut.client.child_daemon import stop_offcutd

        self.client.close()
        stop_offcutd(self.proc)
        shutil.rmtree(self.folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12, help="batches sent to each daemon")
    ap.add_argument("--batch", type=int, default=400, help="calls per batch")
    add_option(ap)
    args = ap.parse_args(argv)
    log = ResultsLog.from_args("event_loop", args, argv)
    try:
        import uvloop  # noqa: F401
    except ImportError:
        raise SystemExit("uvloop is not installed: nothing to compare (pip install uvloop)")
    names = [f"n{i:04d}" for i in range(4000)]
    daemons = [Daemon("uvloop", True), Daemon("asyncio", False)]
    try:
        for d in daemons:
            d.client.sync_nodes(1.7e9, "bench", 1, names[:len(names) // 2])
        for r in range(args.rounds + 1):  # round 0 warms up, uncounted
            for d in (daemons if r % 2 else daemons[::-1]):
                d.batch(names, args.batch, counted=r > 0)
    finally:
        for d in daemons:
            d.stop()
    for d in daemons:
        log.say(f"{d.label:8s} daemon CPU {d.cpu_s / d.calls * 1e3:.3f} ms/call, "
                f"wall {d.wall_s / d.calls * 1e3:.3f} ms/call ({d.calls} calls)")
    uv, aio = daemons
    log.say(f"uvloop / asyncio: CPU {uv.cpu_s / aio.cpu_s:.2f}x, "
            f"wall {uv.wall_s / aio.wall_s:.2f}x")
    log.finish()


if __name__ == "__main__":
    main()

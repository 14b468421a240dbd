"""A simulated year of service (docs/operations.md, "Retention: what is kept, and for how
long"): does the daemon stay flat?

One ``offcutd`` (a subprocess; ``--clock replay``, so the event clock is virtual and a year
passes in minutes; solver ``dp``; durability ``full`` unless ``--durability``) gets, in
virtual-time order, what a site sends it:

* **Slurm's node events**: the real two-week node log (``--node-log``, default
  ``../shared/data/bftrainer/ndstat-10sdn6-evt.tar.gz``, 4,734 nodes, 23,882 events; a
  synthetic log of its burst sizes when absent, and the output says so), played ``--laps``
  times back to back (26 laps: a year), as the hooks send it (``ReportNodes``, source
  ``slurm``); each lap starts with a ``SyncNodes`` of the log's initial idle set;
* **the watcher**: a ``SyncNodes`` of the whole idle set every ``--watch-interval-s`` virtual
  seconds (source ``slurm-watch``);
* **fresh tasks**: ``--tasks-per-day`` submissions a virtual day (elastic curves as
  benchmarks/load.py draws them, each with a request id), and a status and task-list read
  every ``--read-every`` events;
* **recurring Zeus jobs**: ``--zeus-jobs`` batch-size jobs, each running one recurrence a
  virtual day (predict, two epochs, end of trial) until ``--zeus-trials`` a job.

Per simulated month (30 virtual days, ``--month-days``) it prints: the daemon's RSS [MiB], the state file's size
(database + WAL) [MiB] and the task archive's share of it, the journal's rows and bytes, the p99 of the node events' and
submissions' round trips [ms], and the snapshot stall: the p50 over the month's snapshots of
how long each held events back, as the daemon measures it (``GetStatus``
``snapshots.last_ms``, read after each call whose revision is a multiple of
``--snapshot-every``, the events that carry a snapshot: building it, writing its rows, the
retention after it [ms]). Then the ratios month N / month 1 of each, with PASS when all are <= 1.2
(the issue's goal: month 12 / month 1), and the wall time. ``--json`` writes every figure.

Every table has a retention window (docs/operations.md, "Retention: what is kept, and for how
long"); the state file is flat once the longest window is full. The task archive's default
window is 400 days, longer than the year: with it the archive grows all year (about 1.4 MiB a
month at 48 tasks a day, shown as ``archive``), as configured.
``--task-archive-retention-s 2592000`` (30 days) fills every window in the first month, so
month 12 / month 1 measures what is not a window filling.

The figure lines (not the progress bar) also go, with the machine and the command, to a new
``benchmarks/results/soak-DATE-TIME.txt`` (``--no-results``: not written); earlier runs:
benchmarks/results/earlier-measurements.md, "A simulated year".

Usage::

    python benchmarks/soak.py                      # a year: 26 laps of the real log
    python benchmarks/soak.py --laps 4 --json soak.json
    python benchmarks/soak.py --laps 2 --node-log missing.tar.gz --max-events 3000   # quick
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from offcut.client.api import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd

DAY = 86400.0
MONTH_DAYS = 30
#: virtual start of the year [s since epoch] (2026-01-01)
YEAR_START = 1767225600.0


# benchmarks/load.py (the node-log feed, task specs, /proc figures): a sibling script
sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402
from results_log import ResultsLog, add_option  # noqa: E402


@dataclass
class Month:
    """The figures of one simulated month (latencies [ms], sizes [MiB])."""

    month: int
    node_events: int = 0
    submissions: int = 0
    rss_mb: float = 0.0
    db_mb: float = 0.0
    archive_mb: float = 0.0
    journal_rows: int = 0
    journal_mb: float = 0.0
    node_p99_ms: float = 0.0
    submit_p99_ms: float = 0.0
    snapshot_stall_ms: float = 0.0
    wall_s: float = 0.0
    complete: bool = True  # False: the part-month at the end of the run
    node_ms: list[float] = field(default_factory=list, repr=False)
    snapshot_ms: list[float] = field(default_factory=list, repr=False)
    submit_ms: list[float] = field(default_factory=list, repr=False)


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _sizes(state: Path) -> tuple[float, int, float, float]:
    """(database + WAL [MiB], journal rows, journal bytes [MiB], task archive [MiB]: the pages
    of ``task_archive`` and its indexes, SQLite's ``dbstat``) of the state file."""
    size = sum(p.stat().st_size for p in (state, state.with_name(state.name + "-wal"))
               if p.exists())
    db = sqlite3.connect(state.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        rows, nbytes = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(event) + LENGTH(solves) + LENGTH(response)), 0) "
            "FROM journal").fetchone()
        try:
            archive = db.execute("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN "
                                 "(SELECT name FROM sqlite_master WHERE tbl_name = "
                                 "'task_archive')").fetchone()[0]
        except sqlite3.OperationalError:  # an SQLite built without dbstat
            archive = 0
    finally:
        db.close()
    return size / 2**20, int(rows), nbytes / 2**20, archive / 2**20


class Soak:
    """Drives one daemon through the simulated year (see the module docstring)."""

    def __init__(self, client: Client, feed, args, state: Path, pid: int,
                 log: ResultsLog | None = None):
        self.c, self.feed, self.args, self.state, self.pid = client, feed, args, state, pid
        #: where the month lines are kept for the results file (None: printed only)
        self.log = log
        self.rng = np.random.default_rng(args.seed)
        self.seq = {"slurm": 0, "slurm-watch": 0}
        self.idle: set[str] = set()
        self.months: list[Month] = []
        self.month = Month(1)
        self.month_started = time.perf_counter()
        self.submitted = 0
        self.zeus_trials = {f"soak-zeus-{j}": 0 for j in range(args.zeus_jobs)}

    # -------------------------------------------------------------- senders
    def node_event(self, t: float, idle: list[str], busy: list[str]) -> None:
        self.seq["slurm"] += 1
        t0 = time.perf_counter()
        r = self.c.report_nodes(t, "slurm", self.seq["slurm"], idle=idle, preempted=busy)
        self.month.node_ms.append((time.perf_counter() - t0) * 1000.0)
        self._snapshot_of(r.revision)
        self.month.node_events += 1
        self.idle |= set(idle)
        self.idle -= set(busy)

    def sync(self, t: float, source: str = "slurm-watch") -> None:
        self.seq[source] += 1
        self._snapshot_of(self.c.sync_nodes(t, source, self.seq[source],
                                            idle=sorted(self.idle)).revision)

    def _snapshot_of(self, revision: int) -> None:
        """After a call answered at ``revision``: when its event carried a snapshot (every
        ``--snapshot-every`` journal rows), the daemon's own figure of how long that snapshot
        held events back (``GetStatus`` ``snapshots.last_ms``)."""
        if revision % self.args.snapshot_every:
            return
        snaps = self.c.status().snapshots
        if snaps is not None and snaps.last_revision == revision:
            self.month.snapshot_ms.append(snaps.last_ms)

    def submit(self, t: float) -> None:
        self.submitted += 1
        spec = load.task_spec(self.rng, f"soak-{self.submitted}")
        t0 = time.perf_counter()
        r = self.c.submit(spec, submit_time=t, owner=f"user{self.submitted % 16}",
                          request_id=f"soak-{self.submitted}")
        self.month.submit_ms.append((time.perf_counter() - t0) * 1000.0)
        self._snapshot_of(r.decision.revision)
        self.month.submissions += 1

    def zeus_day(self) -> None:
        for job, trials in self.zeus_trials.items():
            if trials >= self.args.zeus_trials:
                continue
            if trials == 0:
                self.c.register_zeus_job(load.zeus_spec(job, seed=len(job)))
            p = self.c.predict_batch_size(job, request_id=f"{job}-{trials}")
            for epoch in (1, 2):
                v = self.c.report_epoch(job, p.trial_number, epoch, 5.0 * epoch, 500.0 * epoch,
                                        0.9 if epoch == 2 else 0.1, batch_size=p.batch_size)
                if v.stop:
                    break
            self.zeus_trials[job] = trials + 1

    # -------------------------------------------------------------- months
    def close_month(self, complete: bool = True) -> None:
        """Take the month's figures, print them, start the next month."""
        m = self.month
        m.complete = complete
        m.rss_mb = load._proc_figures(self.pid)["rss_mb"] or 0.0
        m.db_mb, m.journal_rows, m.journal_mb, m.archive_mb = _sizes(self.state)
        m.node_p99_ms = _p(m.node_ms, 99)
        m.submit_p99_ms = _p(m.submit_ms, 99)
        m.snapshot_stall_ms = _p(m.snapshot_ms, 50)
        m.wall_s = time.perf_counter() - self.month_started
        self.months.append(m)
        line = (f"month {m.month:2d}: RSS {m.rss_mb:7.1f} MiB, state {m.db_mb:7.1f} MiB "
                f"(archive {m.archive_mb:5.1f}), "
                f"journal {m.journal_rows:7d} rows {m.journal_mb:6.1f} MiB, node p99 "
                f"{m.node_p99_ms:6.1f} ms, submit p99 {m.submit_p99_ms:6.1f} ms, snapshot "
                f"stall {m.snapshot_stall_ms:6.1f} ms ({len(m.snapshot_ms)} snapshots, "
                f"{m.node_events} node events, "
                f"{m.submissions} tasks, {m.wall_s:.0f} s)")
        tqdm.write(line)  # beside the progress bar, which stays out of the results file
        if self.log is not None:
            self.log.keep(line)
        self.month = Month(m.month + 1)
        self.month_started = time.perf_counter()

    # -------------------------------------------------------------- the year
    def _due(self, t: float) -> None:
        """Send what is due up to virtual time ``t`` [s], oldest first: month ends, the
        watcher's syncs, submissions, the daily Zeus recurrences."""
        while True:
            soonest = min(self.next.values())
            if soonest > t:
                return
            kind = min(self.next, key=self.next.get)
            if kind == "month":
                self.close_month()
                self.next[kind] += self.args.month_days * DAY
            elif kind == "watch":
                self.sync(soonest)
                self.next[kind] += self.args.watch_interval_s
            elif kind == "task":
                self.submit(soonest)
                self.next[kind] += DAY / self.args.tasks_per_day
            else:
                self.zeus_day()
                self.next[kind] += DAY

    def run(self) -> None:
        """The whole simulated year."""
        a = self.args
        events = self.feed.events
        lap_s = (events[-1].log_time_s if events else 0.0) + 3600.0
        #: next virtual time [s] of each scheduled kind of call
        self.next = {"month": YEAR_START + a.month_days * DAY, "watch": YEAR_START + a.watch_interval_s,
                     "task": YEAR_START if a.tasks_per_day > 0 else math.inf,
                     "zeus": YEAR_START}
        bar = tqdm(total=a.laps * len(events), unit="event", desc="node events",
                   disable=not a.progress, mininterval=5.0)
        n = 0
        for lap in range(a.laps):
            start = YEAR_START + lap * lap_s
            self._due(start)
            self.idle = set()
            self.sync(start)  # a lap starts from an empty idle set
            for ev in events:
                t = start + ev.log_time_s + 1e-3
                self._due(t)
                self.node_event(t, ev.idle, ev.busy)
                n += 1
                if n % a.read_every == 0:
                    self.c.status()
                    self.c.list_tasks(states=[2])  # running ones, as the launcher reads
                bar.update(1)
        bar.close()
        if self.month.node_events:
            self.close_month(complete=False)


def ratios(months: list[Month]) -> dict[str, float]:
    """Month N / month 1 of each figure (N: the last complete month, else the last)."""
    keys = ("rss_mb", "db_mb", "journal_mb", "node_p99_ms", "submit_p99_ms", "snapshot_stall_ms")
    complete = [m for m in months if m.complete]
    first, last = months[0], (complete[-1] if len(complete) >= 2 else months[-1])
    out = {}
    for k in keys:
        a, b = getattr(first, k), getattr(last, k)
        # stalls and latencies below 1 ms are noise: compare with a 1 ms floor
        floor = 1.0 if k.endswith("_ms") else 1e-9
        out[k] = max(b, floor) / max(a, floor)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line; exit status 1 when a month N / month 1 ratio exceeds ``--max-ratio``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laps", type=int, default=26, help="plays of the node log (26: a year; default %(default)s)")
    ap.add_argument("--node-log", type=Path, default=None, help="the node log (default: the real one in ../shared/data)")
    ap.add_argument("--max-events", type=int, default=None, help="events per lap (default: the whole log)")
    ap.add_argument("--watch-interval-s", type=float, default=600.0, help="virtual seconds between the watcher's SyncNodes (default %(default)s)")
    ap.add_argument("--tasks-per-day", type=float, default=48.0, help="fresh tasks a virtual day (default %(default)s)")
    ap.add_argument("--zeus-jobs", type=int, default=4, help="recurring Zeus jobs (default %(default)s)")
    ap.add_argument("--zeus-trials", type=int, default=400, help="recurrences per Zeus job at most (default %(default)s)")
    ap.add_argument("--read-every", type=int, default=50, help="a status and task-list read every this many node events (default %(default)s)")
    ap.add_argument("--snapshot-every", type=int, default=1000, help="the daemon's snapshot_every (default %(default)s)")
    ap.add_argument("--durability", choices=("full", "normal"), default="full")
    ap.add_argument("--month-days", type=float, default=MONTH_DAYS, help="virtual days a reported month (default %(default)s)")
    ap.add_argument("--journal-retention-s", type=float, default=None, help="the daemon's journal_retention_s (default: its default, 7 days)")
    ap.add_argument("--finished-task-retention-s", type=float, default=None, help="the daemon's finished_task_retention_s (default: its default, a day)")
    ap.add_argument("--task-archive-retention-s", type=float, default=None, help="the daemon's task_archive_retention_s (default: its default, 400 days: the archive then fills for all of a year, about 1 KiB a task)")
    ap.add_argument("--max-ratio", type=float, default=1.2, help="the goal for month N / month 1 (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_option(ap)
    a = ap.parse_args(argv)
    log = ResultsLog.from_args("soak", a, argv)
    feed = load.default_feed(a.node_log, max_events=a.max_events, seed=a.seed)
    log.say(f"node log: {feed.description}; {len(feed.events)} events a lap, {a.laps} laps")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="offcut-soak-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o700)
        address = f"unix://{folder}/offcutd.sock"
        state = folder / "state.sqlite"
        cmd = [*offcutd_argv(), "--listen", address, "--state", str(state), "--solver", "dp",
               "--durability", a.durability, "--clock", "replay", "--log-level", "warning",
               "--snapshot-every", str(a.snapshot_every)]
        if a.journal_retention_s is not None:
            cmd += ["--journal-retention-s", str(a.journal_retention_s)]
        if a.finished_task_retention_s is not None:
            cmd += ["--finished-task-retention-s", str(a.finished_task_retention_s)]
        if a.task_archive_retention_s is not None:
            cmd += ["--task-archive-retention-s", str(a.task_archive_retention_s)]
        proc = start_offcutd(cmd, address, folder / "offcutd.log")
        try:
            with Client(address, timeout_s=120) as client:
                soak = Soak(client, feed, a, state, proc.pid, log)
                soak.run()
        finally:
            stop_offcutd(proc)
    wall = time.perf_counter() - started
    months = soak.months
    r = ratios(months) if len(months) >= 2 else {}
    last = [m for m in months if m.complete][-1] if sum(m.complete for m in months) >= 2 else months[-1]
    ok = bool(r) and all(v <= a.max_ratio for v in r.values())
    print()
    log.say(f"{len(months)} simulated months, {sum(m.node_events for m in months)} node events, "
            f"{soak.submitted} tasks, {sum(soak.zeus_trials.values())} Zeus trials in "
            f"{wall:.0f} s")
    for k, v in r.items():
        log.say(f"  month {last.month} / month 1, {k:18s} {v:6.2f}"
                f"{'' if v <= a.max_ratio else '  > ' + str(a.max_ratio)}")
    log.say(f"{'PASS' if ok else 'FAIL'} (goal: every ratio <= {a.max_ratio})")
    log.finish()
    if a.json:
        a.json.write_text(json.dumps({"months": [
            {k: v for k, v in asdict(m).items() if not k.endswith("_ms") or "p99" in k
             or "stall" in k} for m in months], "ratios": r, "wall_s": wall,
            "feed": feed.description}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

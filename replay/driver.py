"""The replay driver: feeds a recorded node log and task set to a daemon over gRPC.

It starts its own ``offcutd`` on a private unix socket (or drives ``target``), submits each
task at its submit time, sends the initial idle set as a ``SyncNodes`` snapshot and every later
change as a ``ReportNodes`` event with the log's timestamps, and writes to ``out_dir``:

* ``steps.csv``: one row per event, BFTrainer's step-log columns
  (``evtTime,Thr,Rate,ReScost,evt,Nleft,Npre,Njoin,nJob,nNd,nJrun,nNrun,PreCost``) + ``solve_ms``;
* ``placements.csv``: one row per task placement change (and per submission)
  (both written by ``offcut.replay.history.HistoryWriter``, as ``offcut history`` does);
* ``summary.json`` (see :func:`summarise`), and ``report.png``, ``throughput.png``,
  ``decisions.png``, ``summary.txt`` (see ``offcut.replay.report.build_report``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
from tqdm import tqdm

from offcut.client.api import Client
from offcut.errors import Unavailable
from offcut.replay.bftrainer_data import NodeLog, TaskRecord
# steps.csv / placements.csv are written by the writer shared with ``offcut history``; the
# names stay importable from here
from offcut.replay.history import PLACEMENT_COLUMNS, STEP_COLUMNS, HistoryWriter, iso, seconds
from offcut.v1 import tasks_pb2

log = logging.getLogger("offcut.replay")


@dataclass
class ReplayOptions:
    """Settings of one replay (the original replayer's flags, DESIGN §4).

    ``tfwd_s`` [s], ``max_tasks`` (maxJ), ``max_events`` (None = whole log), ``target``
    (None = start a private daemon), ``time_limit_s`` per MILP solve [s]. Like the original
    replayer, the replay stops once every task is submitted and finished, unless
    ``until_log_end``.
    """

    solver: str = "auto"
    tfwd_s: float = 10.0
    max_tasks: int = 10
    max_events: int | None = None
    seed: int = 0
    target: str | None = None
    time_limit_s: float = 10.0
    record_instances: str | None = None
    until_log_end: bool = False
    progress: bool = True


def to_epoch(ts: pd.Timestamp) -> float:
    """Seconds since the epoch of a UTC-naive Timestamp."""
    return ts.value / 1e9


@contextmanager
def private_daemon(opts: ReplayOptions, workdir: Path, log_path: Path
                   ) -> Iterator[tuple[str, int | None]]:
    """Run ``offcutd`` on a private unix socket in ``workdir``; yields (address, pid).

    Raises :class:`Unavailable` (with the daemon's log tail) if it does not come up.
    """
    address = f"unix://{workdir / 'offcutd.sock'}"
    cmd = [sys.executable, "-m", "offcut.daemon", "--listen", address,
           "--state", str(workdir / "state.sqlite"), "--solver", opts.solver,
           "--tfwd", str(opts.tfwd_s), "--max-running-tasks", str(opts.max_tasks),
           "--time-limit", str(opts.time_limit_s), "--snapshot-every", "5000",
           "--durability", "normal",
           "--log-level", "warning"]
    if opts.record_instances:
        cmd += ["--record-instances", str(Path(opts.record_instances).resolve())]
    with open(log_path, "w") as log_fh:
        proc = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT)
        try:
            with Client(address) as probe:
                try:
                    probe.wait_ready(timeout_s=60)
                except Unavailable:
                    proc.kill()
                    proc.wait()
                    tail = log_path.read_text()[-2000:]
                    raise Unavailable(f"the replay's offcutd did not start:\n{tail}") from None
            yield address, proc.pid
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def peak_rss_mb(pid: int | None) -> float | None:
    """Peak resident set size [MiB] of process ``pid`` (Linux ``VmHWM``); None if unknown."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def task_spec(task: TaskRecord) -> tasks_pb2.TaskSpec:
    """The protocol spec of a recorded task."""
    return tasks_pb2.TaskSpec(
        name=task.name, min_nodes=int(task.min_nodes), max_nodes=int(task.max_nodes),
        node_counts=[int(n) for n in task.node_counts], throughputs=task.throughputs,
        objective_values=task.objective_values, rescale_up_s=task.rescale_up_s,
        rescale_down_s=task.rescale_down_s, total_work_samples=task.total_work_samples)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def summarise(client: Client, events: int, submitted: int, solve_ms: list[float],
              opts: ReplayOptions, wall_s: float, node_log: NodeLog) -> dict:
    """``summary.json``: events, tasks, ``all_done_at``, samples, node-hours, utilisation
    (used / idle node-hours), decision time percentiles [ms] (daemon-side allocation time of
    events that needed a solve), solver statistics."""
    status = client.status()
    tasks = client.list_tasks()
    completed = [t for t in tasks if t.state == tasks_pb2.TASK_STATE_COMPLETED]
    finish = [seconds(t.finish_time) for t in completed]
    all_done = len(completed) == submitted and submitted > 0
    idle_h = status.idle_node_seconds / 3600.0
    used_h = status.used_node_seconds / 3600.0
    return {
        "events": events,
        "tasks_submitted": submitted,
        "tasks_completed": len(completed),
        "all_done_at": iso(max(finish)) if all_done else None,
        "total_samples": status.total_samples,
        "idle_node_hours": idle_h,
        "used_node_hours": used_h,
        "utilisation": used_h / idle_h if idle_h > 0 else None,
        "decision_ms": _percentiles(solve_ms),
        "solver": opts.solver,
        "solves_by_backend": dict(status.solver.solves_by_backend),
        "solver_fallbacks": status.solver.fallbacks,
        "num_nodes": len(node_log.node_names),
        "first_event": iso(to_epoch(node_log.initial_time)),
        "last_event": iso(seconds(status.clock)),
        "options": {k: v for k, v in asdict(opts).items() if k != "progress"},
        "wall_s": wall_s,
        "events_per_s": events / wall_s if wall_s > 0 else None,
        "tasks": [{"task_id": t.task_id, "name": t.spec.name,
                   "state": tasks_pb2.TaskState.Name(t.state).removeprefix("TASK_STATE_").lower(),
                   "work_done_samples": t.work_done_samples,
                   "finish_time": iso(seconds(t.finish_time)) if t.finish_time.seconds else None}
                  for t in tasks],
    }


def run_replay(node_log: NodeLog, tasks: list[TaskRecord], out_dir: str | Path,
               opts: ReplayOptions) -> dict:
    """Replay ``node_log`` with ``tasks`` through a daemon; write the outputs; return the
    summary dict. Raises :class:`offcut.errors.OffcutError` if the daemon rejects an event or
    cannot be reached."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="offcut-replay-") as tmp:
        if opts.target:
            ctx = nullcontext((opts.target, None))
            source = f"replay-{os.getpid()}-{int(time.time())}"
        else:
            ctx = private_daemon(opts, Path(tmp), out_dir / "daemon.log")
            source = "replay"
        with ctx as (address, daemon_pid), Client(address) as client:
            client.wait_ready()
            drive_started = time.perf_counter()
            with HistoryWriter(out_dir) as writers:
                events, submitted, stop_reason = _drive(client, node_log, tasks, opts, writers,
                                                        source)
            drive_s = time.perf_counter() - drive_started
            summary = summarise(client, events, submitted, writers.solve_ms, opts,
                                time.perf_counter() - started, node_log)
            summary["stop_reason"] = stop_reason
            summary["drive_s"] = drive_s  # sending events and submissions, no daemon start
            summary["daemon_peak_rss_mb"] = peak_rss_mb(daemon_pid)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from offcut.replay.report import build_report
    build_report(out_dir)  # report.png, throughput.png, decisions.png, summary.txt
    return summary


def _drive(client: Client, node_log: NodeLog, tasks: list[TaskRecord], opts: ReplayOptions,
           writers: HistoryWriter, source: str) -> tuple[int, int, str]:
    """Send the log and the tasks; returns (node events after the initial snapshot, tasks
    submitted, stop reason)."""
    pending = sorted(tasks, key=lambda t: (t.submit_time, t.name))
    next_task = 0

    def submit_until(t: pd.Timestamp) -> None:
        nonlocal next_task
        while next_task < len(pending) and pending[next_task].submit_time <= t:
            task = pending[next_task]
            resp = client.submit(task_spec(task), submit_time=to_epoch(task.submit_time),
                                 owner="replay", request_id=f"{source}:{task.name}")
            writers.submitted(resp.task)
            writers.decision(resp.decision, None)
            next_task += 1

    submit_until(node_log.initial_time)
    seq = 1
    first = client.sync_nodes(to_epoch(node_log.initial_time), source, seq, node_log.initial_idle)
    writers.decision(first, 0)
    stop_reason = "end of log"
    total = node_log.num_events
    if opts.max_events is not None:
        total = min(total, opts.max_events) if total is not None else opts.max_events
    events = 0
    bar = tqdm(total=total, unit="ev", disable=not opts.progress, desc="replay",
               dynamic_ncols=True)
    try:
        for change in node_log.events():
            if opts.max_events is not None and events >= opts.max_events:
                stop_reason = "max_events"
                break
            if (next_task == len(pending) and len(writers.completed) == len(pending)
                    and not opts.until_log_end):
                stop_reason = "all tasks done"
                break
            submit_until(change.time)
            seq += 1
            d = client.report_nodes(to_epoch(change.time), source, seq,
                                    idle=change.became_idle, preempted=change.became_busy)
            events += 1
            writers.decision(d, events)
            bar.update(1)
            if events % 200 == 0:
                bar.set_postfix(idle=d.stats.idle_nodes, used=d.stats.nodes_in_use,
                                running=d.stats.running_tasks)
    finally:
        bar.close()
    return events, next_task, stop_reason

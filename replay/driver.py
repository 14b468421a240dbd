"""The replay driver: feeds a recorded node log and task set to a daemon over gRPC.

It starts its own ``offcutd`` on a private unix socket (or drives ``target``), submits each
task at its submit time, sends the initial idle set as a ``SyncNodes`` snapshot and every later
change as a node event with the log's timestamps, and writes to ``out_dir``:

* ``steps.csv``: one row per event, BFTrainer's step-log columns
  (``evtTime,Thr,Rate,ReScost,evt,Nleft,Npre,Njoin,nJob,nNd,nJrun,nNrun,PreCost``) + ``solve_ms``;
* ``placements.csv``: one row per task placement change (and per submission)
  (both written by ``offcut.replay.history.HistoryWriter``, as ``offcut history`` does);
* ``summary.json`` (see :func:`summarise`), and ``report.png``, ``throughput.png``,
  ``decisions.png``, ``summary.txt`` (see ``offcut.replay.report.build_report``).

Restarts (issue 5, docs/architecture.md, "Recovery"). Every call the driver makes is idempotent:
node events carry ``(source, seq)`` and submissions ``request_id = "<source>:<task name>"``, and the
daemon answers a repeat with the reply it stored. A client with a
:class:`~offcut.client.retry.RetryPolicy` (``run_replay(retry=...)``) therefore rides through a
daemon restart by repeating the call in flight. Above that, the **resume rule**: when the
driver starts with ``resume=True`` (a new driver after the old one died), or a call still
fails with ``Unavailable`` and ``resume_wait_s`` > 0 (it waits that long for the daemon to come
back), it asks the daemon what it has applied, ``status().last_seq[source]`` = L, checks that
against what it had acknowledged (L may be one ahead: the call in flight was applied, its reply
lost; anything else means lost state or a second writer on the source and stops the replay),
writes the rows of every applied event of its own that it has not written yet from the
daemon's journal (``ExportHistory``), then continues: node events with seq <= L are not sent
again, submissions are sent again with their request ids (the daemon answers the applied ones
with their stored reply, which is not written twice). Rows are written once per reply, in
revision order (a reply whose revision is not newer than the last written one is a repeat), so
``steps.csv`` / ``placements.csv`` come out as in an uninterrupted run.

Node events on a stream (``ReplayOptions.send_ahead``, with ``curves = model``): the events go
on one ``StreamNodes`` call, up to ``send_ahead`` of them sent before the oldest one's Decision
is received, so the driver's work overlaps the daemon's; the daemon applies them in the order
sent. Before a submission, and before the stop rule reads the completions, every Decision due
is received first, so the daemon sees the same calls in the same order as with one
``ReportNodes`` per event, and the outputs are the same. A stream is not retried by the
client's policy: when it fails with ``Unavailable`` the driver resumes as above (waiting
``resume_wait_s``, else the policy's ``deadline_s``), with up to as many events in flight as it
had sent (the daemon may have applied any prefix of them), and sends again those the daemon
had not applied.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd
from tqdm import tqdm

from offcut.client.api import Client, NodeStream
from offcut.client.retry import RetryPolicy
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.errors import OffcutError, Unavailable
from offcut.nodes import STREAM_MESSAGE_BYTES
from offcut.replay.bftrainer_data import NodeLog, TaskRecord
from offcut.replay.efficiency import dedicated_efficiency, rate_at
from offcut.replay.owners import SINGLE_OWNER, NodeTime, assign_owners, by_owner, fairness
from offcut.replay.progress_sim import PowerModel, ProgressSimulator
# steps.csv / placements.csv are written by the writer shared with ``offcut history``; the
# names stay importable from here
from offcut.replay.history import (NODE_EVENT_KINDS, PLACEMENT_COLUMNS, STEP_COLUMNS,
                                   HistoryWriter, iso)
from offcut.v1 import tasks_pb2
from offcut.views import Decision, HistoryEntry, StatusView, TaskState, TaskView

log = logging.getLogger("offcut.replay")


@dataclass
class ReplayOptions:
    """Settings of one replay (the original replayer's flags, docs/replay-and-policies.md,
    "Replaying the real public log").

    ``tfwd_s`` [s], ``max_tasks`` (maxJ), ``max_events`` (None = whole log), ``target``
    (None = start a private daemon), ``time_limit_s`` per MILP solve [s]. Like the original
    replayer, the replay stops once every task is submitted and finished, unless
    ``until_log_end``. ``objective``: the private daemon's allocation policy (``offcutd
    --policy``; a built-in or an installed entry point). ``owners``: 0 = every task is
    submitted by ``replay``; N > 0 = by ``user1`` .. ``userN``, split as
    :func:`offcut.replay.owners.assign_owners` says. ``send_ahead``: with ``curves =
    model``, node events go on one ``StreamNodes`` stream and up to this many are sent before
    the oldest one's Decision is received (the driver's work overlaps the daemon's; 0: one
    ``ReportNodes`` call per event, as the played curves always do, whose reports depend on
    each Decision). The outputs are the same either way.
    """

    solver: str = "dp"
    tfwd_s: float = 10.0
    max_tasks: int = 10
    max_events: int | None = None
    seed: int = 0
    target: str | None = None
    time_limit_s: float = 10.0
    record_instances: str | None = None
    until_log_end: bool = False
    progress: bool = True
    curves: str = "model"
    noise: float = 0.05
    report_every_s: float = 60.0
    objective: str = "throughput"
    eta: float = 0.5
    owners: int = 0
    send_ahead: int = 4


#: the option names of ``offcut replay bftrainer`` (and of a sweep cell's settings,
#: :class:`offcut.replay.sweep_spec.CellSettings`) that :class:`ReplayOptions` holds under
#: another name; the other options have the same name in both
CLI_NAMES = {"tfwd": "tfwd_s", "time_limit": "time_limit_s", "report_every": "report_every_s",
             "policy": "objective"}


def replay_options(**options) -> ReplayOptions:
    """The :class:`ReplayOptions` of options under the CLI's names (:data:`CLI_NAMES`; the
    others as they are). Raises ``TypeError`` naming an option that is not a replay's."""
    return ReplayOptions(**{CLI_NAMES.get(k, k): v for k, v in options.items()})


#: ``ReplayOptions.curves``: ``model`` = the daemon computes progress from the true curves (no
#: reports); with reports from :class:`~offcut.replay.progress_sim.ProgressSimulator` (true
#: curves + seeded noise): ``known`` = the daemon is given the true curves (and power curves),
#: ``linear`` = a naive linear guess from the throughput at Jmin, ``hidden`` = no curve (the
#: daemon learns it online).
CURVE_MODES = ("model", "known", "linear", "hidden")
#: rescale costs [s] a user guesses when they do not know them (``linear`` and ``hidden``; the
#: daemon learns the real ones for ``hidden``)
GUESSED_RESCALE_S = 30.0


def to_epoch(ts: pd.Timestamp) -> float:
    """Seconds since the epoch of a UTC-naive Timestamp."""
    return ts.value / 1e9


#: owner of the replay's submissions without ``owners``
REPLAY_OWNER = SINGLE_OWNER


def daemon_command(opts: ReplayOptions, address: str, state: str | Path, *,
                   durability: str = "normal", snapshot_every: int = 5000) -> list[str]:
    """The ``offcutd`` command line of a replay's daemon: ``opts``' solver, Tfwd [s], maxJ and
    MILP time limit [s], policy (``objective``) and eta, on the log's clock (``--clock
    replay``), listening on ``address`` with state file ``state``; ``durability``
    ``normal`` (survives ``kill -9``) or ``full`` (fsync per commit), a snapshot every
    ``snapshot_every`` journal rows."""
    cmd = [*offcutd_argv(), "--listen", address,
           "--state", str(state), "--solver", opts.solver,
           "--tfwd", str(opts.tfwd_s), "--max-running-tasks", str(opts.max_tasks),
           "--time-limit", str(opts.time_limit_s), "--snapshot-every", str(int(snapshot_every)),
           "--durability", durability, "--policy", opts.objective, "--eta", str(opts.eta),
           "--clock", "replay", "--log-level", "warning"]
    if opts.record_instances:
        cmd += ["--record-instances", str(Path(opts.record_instances).resolve())]
    return cmd


@contextmanager
def private_daemon(opts: ReplayOptions, workdir: Path, log_path: Path
                   ) -> Iterator[tuple[str, int | None]]:
    """Run ``offcutd`` on a private unix socket in ``workdir``; yields (address, pid).

    Raises :class:`Unavailable` (with the daemon's log tail) if it does not come up.
    """
    address = f"unix://{workdir / 'offcutd.sock'}"
    proc = start_offcutd(daemon_command(opts, address, workdir / "state.sqlite"), address,
                         log_path)
    try:
        yield address, proc.pid
    finally:
        stop_offcutd(proc)


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


def task_spec(task: TaskRecord, curves: str = "model",
              power: "PowerModel | None" = None) -> tasks_pb2.TaskSpec:
    """The protocol spec of a recorded task as the replay submits it in mode ``curves``
    (:data:`CURVE_MODES`); ``power`` gives ``known`` specs their true power curve."""
    if curves not in CURVE_MODES:
        raise ValueError(f"curves must be one of {', '.join(CURVE_MODES)}, got {curves!r}")
    spec = tasks_pb2.TaskSpec(
        name=task.name, min_nodes=int(task.min_nodes), max_nodes=int(task.max_nodes),
        rescale_up_s=task.rescale_up_s, rescale_down_s=task.rescale_down_s,
        total_work_samples=task.total_work_samples, reports_progress=curves != "model")
    if curves in ("model", "known"):
        spec.node_counts.extend(int(n) for n in task.node_counts)
        spec.throughputs.extend(task.throughputs)
        spec.objective_values.extend(task.objective_values)
        if curves == "known" and power is not None:
            spec.power_w.extend(power.curve_w(task))
        return spec
    spec.rescale_up_s = spec.rescale_down_s = GUESSED_RESCALE_S
    if curves == "linear":  # the throughput at Jmin, scaled linearly
        jmin, jmax = int(task.min_nodes), int(task.max_nodes)
        at_min = float(np.interp(jmin, task.node_counts, task.throughputs))
        counts = [0, jmin] + ([jmax] if jmax > jmin else [])
        spec.node_counts.extend(counts)
        spec.throughputs.extend(at_min * n / jmin for n in counts)
    return spec


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def summarise(client: Client, events: int, submitted: int, solve_ms: list[float],
              opts: ReplayOptions, wall_s: float, node_log: NodeLog, *,
              solves_by_backend: dict[str, int] | None = None,
              solver_fallbacks: int | None = None,
              sim: ProgressSimulator | None = None,
              node_time: NodeTime | None = None) -> dict:
    """``summary.json``: events, tasks, ``all_done_at``, samples, node-hours, utilisation
    (used / idle node-hours), decision time percentiles [ms] (daemon-side allocation time of
    events that needed a solve), solver statistics: ``solves_by_backend`` (allocation problems
    solved per backend) and ``solver_fallbacks`` as given (the replay counts them from its
    decisions, see :class:`Recorder`), else the daemon's counters since its last start; the
    energy figures of :func:`energy_summary` (``sim``: the played tasks' truth, which then
    also gives ``total_samples``); with ``node_time`` (the node counts each task held, from
    the replay's placements): per owner (:func:`owner_summary`) and the efficiency against
    dedicated nodes with its parts (:func:`offcut.replay.efficiency.dedicated_efficiency`:
    ``same_counts_efficiency`` x ``scaling_factor``)."""
    status = client.status()
    tasks = client.list_tasks()
    completed = [t for t in tasks if t.state == TaskState.COMPLETED]
    finish = [t.finish_time for t in completed]
    all_done = len(completed) == submitted and submitted > 0
    idle_h = status.idle_node_seconds / 3600.0
    used_h = status.used_node_seconds / 3600.0
    summary = {
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
        "solves_by_backend": (dict(status.solver.solves_by_backend) if solves_by_backend is None
                              else dict(sorted(solves_by_backend.items()))),
        "solver_fallbacks": (status.solver.fallbacks if solver_fallbacks is None
                             else solver_fallbacks),
        "num_nodes": len(node_log.node_names),
        "first_event": iso(to_epoch(node_log.initial_time)),
        "last_event": iso(status.clock),
        "options": {k: v for k, v in asdict(opts).items() if k != "progress"},
        "wall_s": wall_s,
        "events_per_s": events / wall_s if wall_s > 0 else None,
        "tasks": [{"task_id": t.task_id, "name": t.spec.name, "owner": t.owner,
                   "state": t.state.value,
                   "work_done_samples": t.work_done_samples,
                   "finish_time": iso(t.finish_time)}
                  for t in tasks],
    }
    summary.update(energy_summary(status, sim, opts))
    if node_time is not None:
        node_seconds = node_time.seconds(status.clock)
        specs = {t.task_id: t.spec for t in tasks}
        held = node_time.integral(
            status.clock, lambda task, n: (rate_at(specs[task], n) or 0.0) if task in specs
            else 0.0)
        summary.update(owner_summary(tasks, node_seconds))
        summary.update(dedicated_efficiency(tasks, node_seconds, held))
    return summary


def owner_summary(tasks: list[TaskView], node_seconds: dict[str, float]) -> dict:
    """``owners``: per task owner (name order) its ``tasks``, ``tasks_completed``,
    ``node_hours`` (from ``node_seconds`` [node-s] per task id), ``samples`` (work done) and
    ``task_energy_j`` [J, the daemon's figures]; ``fairness``: Jain's index and min/max of the
    owners' node-hours (:func:`offcut.replay.owners.fairness`)."""
    owner_of = {t.task_id: t.owner for t in tasks}
    names = sorted(set(owner_of.values()))
    hours = by_owner({k: v / 3600.0 for k, v in node_seconds.items()}, owner_of, names)
    samples = by_owner({t.task_id: t.work_done_samples for t in tasks}, owner_of, names)
    energy = by_owner({t.task_id: t.energy_j for t in tasks}, owner_of, names)
    owners = {o: {"tasks": sum(1 for t in tasks if t.owner == o),
                  "tasks_completed": sum(1 for t in tasks if t.owner == o
                                         and t.state == TaskState.COMPLETED),
                  "node_hours": hours[o], "samples": samples[o], "task_energy_j": energy[o]}
              for o in names}
    return {"owners": owners, "fairness": fairness(list(hours.values()))}


def energy_summary(status: StatusView, sim: ProgressSimulator | None,
                   opts: ReplayOptions) -> dict:
    """Energy figures of ``summary.json``: ``energy_j`` (the tasks' nodes plus the unused idle
    nodes) [J], ``task_energy_j`` [J], ``samples_per_joule``; with a
    :class:`ProgressSimulator` (``curves`` != ``model``) the samples and task energy are the
    simulated truth and the daemon's own figures are kept as ``daemon_total_samples`` /
    ``daemon_energy_j``; else they are the daemon's model (power from the specs or the prior
    ``node_power_w``)."""
    out: dict = {"curves": opts.curves, "objective": opts.objective,
                 "eta": opts.eta if opts.objective == "zeus_cost" else None}
    if sim is None:
        samples, task_j, total_j = status.total_samples, status.task_energy_j, status.energy_j
    else:
        samples, task_j = sim.total_samples, sim.task_energy_j
        unused_s = max(0.0, status.idle_node_seconds - status.used_node_seconds)
        total_j = task_j + unused_s * sim.power.idle_w
        out.update(noise=opts.noise, total_samples=samples,
                   daemon_total_samples=status.total_samples, daemon_energy_j=status.energy_j)
    out.update(energy_j=total_j, task_energy_j=task_j,
               samples_per_joule=samples / total_j if total_j > 0 else None)
    return out


class Recorder:
    """Writes each decision of the replay once, in revision order, through a
    :class:`HistoryWriter`, and counts the replay's allocation solves.

    A reply whose ``decision.revision`` is not newer than the last one written is a repeat (a
    stored answer to a retried or resent call) and writes nothing.

    Attributes:
        last_revision: revision of the last decision written (0: none).
        solves_by_backend: allocation problems solved per backend, over the written decisions
            (``SolveStats.solves`` credited to ``SolveStats.solver``). Counted from the
            replay's own (journaled) answers, so a daemon restart does not reset it; a decision
            names only the backend of its last solve, so an event whose solves used two
            backends (``trivial`` then ``dp``) credits all of them to the last one (the
            daemon's per-process counter may differ by such events).
        fallbacks: written decisions whose allocation fell back to another backend.
    """

    def __init__(self, writers: HistoryWriter, source: str, task_names: Iterable[str],
                 owners: dict[str, str] | None = None):
        self.writers = writers
        self.source = source
        self.task_names = frozenset(task_names)
        #: task name -> the owner the replay submits it as (default: all :data:`REPLAY_OWNER`)
        self.owners = owners if owners is not None else {n: REPLAY_OWNER for n in self.task_names}
        self.last_revision = 0
        self.solves_by_backend: dict[str, int] = {}
        self.fallbacks = 0

    def _new(self, d: Decision) -> bool:
        if d.revision <= self.last_revision:
            return False
        self.last_revision = d.revision
        if d.solve.solves:
            self.solves_by_backend[d.solve.solver] = (
                self.solves_by_backend.get(d.solve.solver, 0) + d.solve.solves)
        if d.solve.status == "fallback":
            self.fallbacks += 1
        return True

    def submission(self, task: TaskView, d: Decision) -> bool:
        """A submission's answer: a ``submitted`` row and its placement rows; False (nothing
        written) for a repeat."""
        if not self._new(d):
            return False
        self.writers.submitted(task)
        self.writers.decision(d, None)
        return True

    def node_event(self, d: Decision) -> bool:
        """A node event's answer: a steps.csv row (``evt`` = rows so far) and its placement
        rows; False (nothing written) for a repeat."""
        if not self._new(d):
            return False
        self.writers.node_event(d)
        return True

    def progress(self, d: Decision) -> bool:
        """A progress report's answer: its placement rows (completions and the re-allocation
        they caused); False (nothing written) for a repeat."""
        if not self._new(d):
            return False
        self.writers.decision(d, None)
        return True

    def entry(self, e: HistoryEntry) -> bool:
        """A journal entry (``ExportHistory``), written if it is this replay's (a node event of
        its source, or a submission of one of its task names by the owner the replay gives
        it) and newer than the last written decision."""
        if e.decision is None:
            return False
        if e.kind in NODE_EVENT_KINDS:
            return e.decision.source == self.source and self.node_event(e.decision)
        if (e.kind == "submit" and e.task is not None and e.task.spec.name in self.task_names
                and e.task.owner == self.owners.get(e.task.spec.name)):
            return self.submission(e.task, e.decision)
        return False


def check_policy(name: str) -> None:
    """Raise ``ValueError`` (naming the objective/policy option and the available policies)
    unless ``name`` is an allocation policy this environment's ``offcutd`` can load."""
    from offcut.daemon.app.policies import PolicyError, policy_class

    try:
        policy_class(name)
    except PolicyError as exc:
        raise ValueError(f"objective (policy): {exc}") from None


def run_replay(node_log: NodeLog, tasks: list[TaskRecord], out_dir: str | Path,
               opts: ReplayOptions, *, source: str | None = None, resume: bool = False,
               resume_wait_s: float = 0.0, retry: RetryPolicy | None = None,
               connect: Callable[[str], Client] | None = None) -> dict:
    """Replay ``node_log`` with ``tasks`` through a daemon; write the outputs; return the
    summary dict.

    Args:
        source: the node-event source name (default ``replay`` for a private daemon, a
            unique ``replay-<pid>-<time>`` for ``opts.target``); pass the earlier run's to
            resume it.
        resume: continue a replay of the same log, tasks and ``source`` that a previous
            driver began on ``opts.target`` (module docstring: the resume rule); the output
            files are rewritten whole, the applied part from the daemon's journal.
        resume_wait_s: when a call fails with ``Unavailable`` (after the client's own retries),
            wait up to this long [s] for the daemon to serve again and resume from what it has
            applied; 0 (default): raise.
        retry: the client's :class:`~offcut.client.retry.RetryPolicy` (None: no retries).
        connect: makes the client for an address (default ``Client(address, retry=retry)``).

    Raises :class:`offcut.errors.OffcutError` if the daemon rejects an event or cannot be
    reached, or (resuming) reports a state that contradicts what it acknowledged.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if resume and not opts.target:
        raise ValueError("resume needs a running daemon to continue on (opts.target)")
    if resume and opts.curves != "model":
        raise ValueError(f"a replay with curves={opts.curves!r} plays the tasks itself and "
                         "cannot be resumed; run it again")
    if opts.curves not in CURVE_MODES:
        raise ValueError(f"curves must be one of {', '.join(CURVE_MODES)}, got {opts.curves!r}")
    check_policy(opts.objective)
    owners = assign_owners([t.name for t in sorted(tasks, key=lambda t: (t.submit_time, t.name))],
                           opts.owners)
    if connect is None:
        def connect(address: str) -> Client:
            return Client(address, retry=retry)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="offcut-replay-") as tmp:
        if opts.target:
            ctx = nullcontext((opts.target, None))
            source = source or f"replay-{os.getpid()}-{int(time.time())}"
        else:
            ctx = private_daemon(opts, Path(tmp), out_dir / "daemon.log")
            source = source or "replay"
        with ctx as (address, daemon_pid), connect(address) as client:
            client.wait_ready()
            mode = client.status().clock_mode
            if mode != "replay":
                raise ValueError(f"{opts.target} runs the {mode or 'live'} clock: a replay needs a "
                                 "daemon started with --clock replay (its times are the log's)")
            drive_started = time.perf_counter()
            with HistoryWriter(out_dir) as writers:
                rec = Recorder(writers, source, (t.name for t in tasks), owners)
                driver = _Driver(client, node_log, tasks, opts, rec, source, resume_wait_s,
                                 owners)
                events, submitted, stop_reason = driver.run(resume)
            drive_s = time.perf_counter() - drive_started
            summary = summarise(client, events, submitted, writers.solve_ms, opts,
                                time.perf_counter() - started, node_log,
                                solves_by_backend=rec.solves_by_backend,
                                solver_fallbacks=rec.fallbacks, sim=driver.sim,
                                node_time=writers.node_time)
            summary["stop_reason"] = stop_reason
            summary["drive_s"] = drive_s  # sending events and submissions, no daemon start
            summary["daemon_peak_rss_mb"] = peak_rss_mb(daemon_pid)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from offcut.replay.report import build_report
    build_report(out_dir)  # report.png, throughput.png, decisions.png, summary.txt
    return summary


def run_with_oracle(node_log: NodeLog, tasks: list[TaskRecord], out_dir: str | Path,
                    opts: ReplayOptions, **kwargs) -> dict:
    """Run the replay twice: first with the true curves given to the daemon (``curves =
    known``, same noise and seed) into ``out_dir/oracle``, then as ``opts`` says into
    ``out_dir``; the second ``summary.json`` gains ``oracle_total_samples`` and
    ``samples_vs_oracle`` (its samples / the oracle's). ``opts.curves`` must be ``linear`` or
    ``hidden``; other arguments as :func:`run_replay`."""
    if opts.curves not in ("linear", "hidden"):
        raise ValueError("an oracle comparison needs curves 'linear' or 'hidden', got "
                         f"{opts.curves!r}")
    out_dir = Path(out_dir)
    oracle = run_replay(node_log, tasks, out_dir / "oracle",
                        ReplayOptions(**{**asdict(opts), "curves": "known"}), **kwargs)
    summary = run_replay(node_log, tasks, out_dir, opts, **kwargs)
    summary["oracle_total_samples"] = oracle["total_samples"]
    summary["samples_vs_oracle"] = (summary["total_samples"] / oracle["total_samples"]
                                    if oracle["total_samples"] > 0 else None)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class _Driver:
    """Sends the log and the tasks in order (see the module docstring for the resume rule)."""

    def __init__(self, client: Client, node_log: NodeLog, tasks: list[TaskRecord],
                 opts: ReplayOptions, rec: Recorder, source: str, resume_wait_s: float,
                 owners: dict[str, str]):
        self.client, self.node_log, self.opts, self.rec = client, node_log, opts, rec
        self.owners = owners  # task name -> owner it is submitted as
        self.source, self.resume_wait_s = source, float(resume_wait_s)
        self.pending = sorted(tasks, key=lambda t: (t.submit_time, t.name))
        self.next_task = 0
        self.acked_seq = 0   # last node event seq known applied (answered, or from the journal)
        self.applied_seq = 0  # the daemon's last_seq[source] at the last resume
        self.resumes = 0
        self.power = PowerModel()
        self.sim = (ProgressSimulator(tasks, opts.noise, opts.seed, self.power)
                    if opts.curves != "model" else None)
        self.next_report_t: float | None = None  # next periodic report of the played tasks
        self.sent_t = 0.0  # latest time sent to the daemon (played tasks)
        self.reports_sent = 0
        #: node events go on a stream, this many ahead (0: one ReportNodes call each)
        self.send_ahead = max(0, int(opts.send_ahead)) if self.sim is None else 0
        self.stream: NodeStream | None = None
        self.in_flight: deque = deque()  # (seq, change) sent on the stream, not answered
        self.last_decision: Decision | None = None

    # ------------------------------------------------------------------ resume rule
    def _resume(self, check: bool, in_flight: int = 1) -> None:
        """Ask the daemon what it applied; write the missing rows from its journal.
        ``in_flight``: node events sent after the last acknowledged one (``check``: the
        daemon may have applied any number of them, in order, and no more)."""
        applied = int(self.client.status().last_seq.get(self.source, 0))
        if check and not self.acked_seq <= applied <= self.acked_seq + in_flight:
            raise OffcutError(
                f"after a restart the daemon reports seq {applied} of source {self.source!r} "
                f"as its last applied, but {self.acked_seq} was acknowledged and only "
                f"{in_flight} more sent: it lost state, or another client uses this source")
        for e in self.client.export_history(after_revision=self.rec.last_revision):
            self.rec.entry(e)
        if self.rec.writers.node_events != applied:
            raise OffcutError(f"the daemon's journal holds {self.rec.writers.node_events} node "
                              f"events of source {self.source!r}, its status says {applied}")
        self.applied_seq = applied
        self.acked_seq = max(self.acked_seq, applied)
        self.resumes += 1
        log.info("resumed source %r after seq %d (revision %d)", self.source, applied,
                 self.rec.last_revision)

    def _call(self, send: Callable[[], object], seq: int | None = None):
        """``send()``, resuming after Unavailable if allowed; None if the node event ``seq``
        turned out to be applied already (its rows then came from the journal)."""
        while True:
            if seq is not None and seq <= self.applied_seq:
                return None
            try:
                return send()
            except Unavailable as exc:
                self._reconnect(exc, 1, self.resume_wait_s)

    def _reconnect(self, exc: Unavailable, in_flight: int, wait_s: float) -> None:
        """After ``exc``: wait up to ``wait_s`` [s] for the daemon to serve again and resume
        (:meth:`_resume`); raise ``exc`` when that is 0, Unavailable when the wait runs
        out."""
        if wait_s <= 0:
            raise exc
        deadline = time.monotonic() + wait_s
        while True:
            log.warning("offcutd unavailable; waiting up to %.0f s for it to resume",
                        deadline - time.monotonic())
            try:
                self.client.wait_ready(max(0.1, deadline - time.monotonic()))
                self._resume(check=True, in_flight=in_flight)
                return
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise

    # ------------------------------------------------------------------ sending
    def _run_until(self, t: pd.Timestamp) -> None:
        """Everything due by ``t``, in time order: submissions and, when the replay plays the
        tasks, each completion report at its exact time and the periodic reports."""
        sim, until = self.sim, to_epoch(t)
        while True:
            due = (self.pending[self.next_task]
                   if self.next_task < len(self.pending)
                   and self.pending[self.next_task].submit_time <= t else None)
            done = sim.next_completion() if sim is not None else None
            if done is not None and done[0] > until:
                done = None
            tick = None
            if sim is not None and sim.running():
                if self.next_report_t is None or self.next_report_t < self.sent_t:
                    # nothing ran for a while: the next periodic report is a period from now
                    self.next_report_t = self.sent_t + self.opts.report_every_s
                tick = self.next_report_t
            if tick is not None and tick > until:
                tick = None
            if due is None and done is None and tick is None:
                return
            due_t = to_epoch(due.submit_time) if due is not None else math.inf
            done_t = done[0] if done is not None else math.inf
            if tick is not None and tick < min(due_t, done_t):
                self.reports_sent += 1
                self._report_running(tick, f"r{self.reports_sent}")
                self.next_report_t = tick + self.opts.report_every_s
                continue
            if done is not None and done_t < due_t:
                self._complete(*done)
                continue
            task = due
            self._drain()  # the node events sent before it are applied first
            if sim is not None:
                sim.advance(to_epoch(task.submit_time))
                self.sent_t = max(self.sent_t, to_epoch(task.submit_time))
            resp = self._call(lambda: self.client.submit(
                task_spec(task, self.opts.curves, self.power),
                submit_time=to_epoch(task.submit_time), owner=self.owners[task.name],
                request_id=f"{self.source}:{task.name}"))
            self.rec.submission(resp.task, resp.decision)
            if sim is not None:
                sim.submitted(task.name, resp.task.task_id)
                sim.apply(resp.decision)
            self.next_task += 1

    def _complete(self, t: float, task_id: str) -> None:
        """The report with which a simulated task reaches its total work at ``t``."""
        sim = self.sim
        sim.advance(t)
        self.sent_t = max(self.sent_t, t)
        report = sim.report(task_id, t)
        report["samples_done"] = sim.by_id[task_id].record.total_work_samples
        sim.finish(task_id)
        resp = self._call(lambda: self.client.report_progress(
            [report], request_id=f"{self.source}:done:{task_id}"))
        self.rec.progress(resp.decision)
        sim.apply(resp.decision)

    def _report_running(self, t: float, tag) -> None:
        """Every running simulated task reports at ``t`` (before node event ``tag``, or the
        periodic report ``r<k>``)."""
        sim = self.sim
        sim.advance(t)
        self.sent_t = max(self.sent_t, t)
        running = sim.running()
        if not running:
            return
        resp = self._call(lambda: self.client.report_progress(
            [sim.report(task_id, t) for task_id in running],
            request_id=f"{self.source}:p{tag}"))
        self.rec.progress(resp.decision)
        sim.apply(resp.decision)

    def _node(self, seq: int, send: Callable[[], Decision]) -> Decision | None:
        d = self._call(send, seq)
        self._acknowledged(seq, d)
        return d

    # ------------------------------------------------------------------ the node stream
    def _stream_send(self, seq: int, change) -> None:
        """Send node event ``seq`` on the stream (opened on first use); receive the oldest
        Decisions while more than ``send_ahead`` are unanswered. An event too large for a
        stream message goes as one ``ReportNodes`` call, after every Decision due."""
        if seq <= self.applied_seq:  # applied before a restart: its row came from the journal
            self.acked_seq = max(self.acked_seq, seq)
            return
        # a bound on its encoded size: per name a tag, a length of up to 3 bytes, the name
        size = 64 + sum(len(n) + 4 for names in (change.became_idle, change.became_busy)
                        for n in names)
        if size > STREAM_MESSAGE_BYTES:
            self._drain()
            self._node(seq, lambda: self.client.report_nodes(
                to_epoch(change.time), self.source, seq, idle=change.became_idle,
                preempted=change.became_busy))
            return
        self.in_flight.append((seq, change))
        self._send_one(seq, change)
        while len(self.in_flight) > self.send_ahead:
            self._stream_receive()

    def _send_one(self, seq: int, change) -> None:
        if self.stream is None:
            self.stream = self.client.stream_nodes()
        self.stream.send(to_epoch(change.time), self.source, seq, idle=change.became_idle,
                         preempted=change.became_busy)

    def _stream_receive(self) -> None:
        """Receive and record the oldest unanswered Decision; after ``Unavailable``, resume
        (:meth:`_reconnect`) and send again the events the daemon had not applied."""
        seq, _ = self.in_flight[0]
        try:
            d = self.stream.receive()
        except Unavailable as exc:
            self.stream.close()
            self.stream = None
            # a stream is not retried by the client's policy: its deadline is the wait here
            retry = getattr(self.client, "retry", None)
            wait_s = self.resume_wait_s or (retry.deadline_s if retry is not None else 0.0)
            self._reconnect(exc, len(self.in_flight), wait_s)
            while self.in_flight and self.in_flight[0][0] <= self.applied_seq:
                self.in_flight.popleft()  # applied: its row came from the journal
            for again_seq, again in self.in_flight:
                self._send_one(again_seq, again)
            return
        self.in_flight.popleft()
        self._acknowledged(seq, d)

    def _drain(self) -> None:
        """Receive every Decision still due on the stream (before a submission, and before the
        stop rule looks at the completions)."""
        while self.in_flight:
            self._stream_receive()

    def _acknowledged(self, seq: int, d: Decision | None) -> None:
        """Node event ``seq`` answered with ``d`` (None: applied before a restart): record its
        row, and check that the rows match the events."""
        if d is not None:
            self.rec.node_event(d)
            self.last_decision = d
        self.acked_seq = max(self.acked_seq, seq)
        if seq > self.applied_seq and self.rec.writers.node_events != seq:
            # one steps.csv row per applied node event (skipped ones: checked in _resume)
            raise OffcutError(f"after seq {seq} of source {self.source!r} the replay has "
                              f"{self.rec.writers.node_events} step rows")

    def run(self, resume: bool) -> tuple[int, int, str]:
        """Send everything not applied yet; returns (node events after the initial snapshot,
        tasks submitted, stop reason)."""
        client, node_log, opts, source = self.client, self.node_log, self.opts, self.source
        if resume:
            self._resume(check=False)
        self._run_until(node_log.initial_time)
        seq = 1
        d0 = self._node(seq, lambda: client.sync_nodes(to_epoch(node_log.initial_time), source,
                                                       seq, node_log.initial_idle))
        if self.sim is not None and d0 is not None:
            self.sim.set_interval(seq)
            self.sim.apply(d0)
        stop_reason = "end of log"
        total = node_log.num_events
        if opts.max_events is not None:
            total = min(total, opts.max_events) if total is not None else opts.max_events
        events = 0
        bar = tqdm(total=total, unit="ev", disable=not opts.progress, desc="replay",
                   dynamic_ncols=True)
        try:
            for change in node_log.events():
                if seq + 1 > self.applied_seq:  # events applied before a restart were sent then
                    if opts.max_events is not None and events >= opts.max_events:
                        stop_reason = "max_events"
                        break
                    if self.next_task == len(self.pending) and not opts.until_log_end:
                        self._drain()  # the completions of every event sent so far
                        if len(self.rec.writers.completed) == len(self.pending):
                            stop_reason = "all tasks done"
                            break
                self._run_until(change.time)
                seq += 1
                if self.send_ahead:
                    self._stream_send(seq, change)
                else:
                    if self.sim is not None:
                        self._report_running(to_epoch(change.time), seq)
                    d = self._node(seq, lambda: client.report_nodes(
                        to_epoch(change.time), source, seq, idle=change.became_idle,
                        preempted=change.became_busy))
                    if self.sim is not None and d is not None:
                        self.sim.set_interval(seq)
                        self.sim.apply(d)
                events += 1
                bar.update(1)
                d = self.last_decision
                if events % 200 == 0 and d is not None:
                    bar.set_postfix(idle=d.stats.idle_nodes, used=d.stats.nodes_in_use,
                                    running=d.stats.running_tasks)
            self._drain()
        finally:
            if self.stream is not None:
                self.stream.close()
            bar.close()
        return events, self.next_task, stop_reason

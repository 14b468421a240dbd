"""Crash-safety harness (issue 5 item 1): a replay and a recurring Zeus job driven through an
``offcutd`` process that is ``kill -9``-ed at seeded points, restarted on the same state file
and socket, and compared with an uninterrupted run.

A :class:`Supervisor` runs the daemon as a subprocess (``durability="full"``, a snapshot every
few journal rows so recovery uses snapshot + journal). A :class:`KillHook` sits under the
client (it wraps the generated stubs, so it sees every attempt the client's
:class:`~offcut.client.retry.RetryPolicy` makes) and counts acknowledged calls; at a kill point
it does one of:

* ``ack``: SIGKILL right after the n-th acknowledged call, restart; the next call meets a dead
  or starting daemon and is retried;
* ``lost-reply``: the n+1-th call is applied and committed, then the daemon is killed and the
  reply thrown away (the client sees UNAVAILABLE, as when the connection drops after the
  commit); the retry must get the stored answer;
* ``in-flight``: the daemon is stopped (SIGSTOP), the n+1-th call is sent to it, and the daemon
  is killed while the call waits (so it was never applied); the retry applies it;
* ``driver`` (replay only): the daemon is killed after the n-th acknowledged call and the
  replay driver dies with it; a new driver resumes (``run_replay(resume=True)``) from what the
  restarted daemon says it applied, rewriting steps.csv / placements.csv from its journal.

The uninterrupted run uses the same socket path and options, so its ``summary.json`` may be
compared field by field; the checks (:func:`compare_runs`): summary.json without timing fields
(:data:`TIMING_FIELDS`), steps.csv without ``solve_ms``, placements.csv byte for byte, the
daemon's own view (status, tasks and their work, every journal entry without its solve time:
nothing applied twice or lost), and the Zeus job (trials, history, optimizer state) with the
verdicts the client saw. The figure lines of :func:`main` also go, with the machine and the
command, to a new ``benchmarks/results/crash_safety-DATE-TIME.txt`` (``--no-results``: not
written).

Usage::

    python benchmarks/crash_safety.py                 # 128 nodes, 10 tasks, 300 events, 20 kills
    python benchmarks/crash_safety.py --demo --kills 8 --max-events 400
"""

from __future__ import annotations

import argparse
import csv
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc

from offcut.client.api import Client
from offcut.client.retry import RetryPolicy
from offcut.client.child_daemon import stop_offcutd
from offcut.replay.driver import ReplayOptions, daemon_command, run_replay
from offcut.v1 import decision_pb2, tasks_pb2, zeus_pb2
from offcut.wire import tasks as tasks_wire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"

#: summary.json fields that measure wall-clock time or memory (not compared)
TIMING_FIELDS = frozenset({"wall_s", "drive_s", "events_per_s", "decision_ms",
                           "daemon_peak_rss_mb"})
REPLAY_KINDS = ("ack", "lost-reply", "in-flight", "driver")
ZEUS_KINDS = ("ack", "lost-reply", "in-flight")
#: streaming calls pass the hook untouched (not counted, never killed)
STREAMS = frozenset({"ExportHistory", "WatchPlacements"})


# ------------------------------------------------------------------------------ daemon
class Supervisor:
    """``offcutd`` as a subprocess on ``workdir/offcutd.sock`` and ``workdir/<state_name>``;
    killed with SIGKILL and restarted on the same socket and state file.

    Args:
        workdir: folder of the socket, the state file and ``offcutd.log``.
        opts: replay options (solver, Tfwd [s], maxJ) for :func:`daemon_command`.
        state_name: state file name inside ``workdir``.
        durability: ``full`` (fsync per commit) or ``normal``.
        snapshot_every: journal rows between snapshots (small: recovery replays a journal
            tail after a snapshot).

    Attributes:
        kills: SIGKILLs sent so far. starts: daemon processes started so far.
    """

    def __init__(self, workdir: Path, opts: ReplayOptions, state_name: str = "state.sqlite",
                 durability: str = "full", snapshot_every: int = 7):
        self.workdir = Path(workdir)
        self.address = f"unix://{self.workdir / 'offcutd.sock'}"
        self.cmd = daemon_command(opts, self.address, self.workdir / state_name,
                                  durability=durability, snapshot_every=snapshot_every)
        self.log_path = self.workdir / "offcutd.log"
        self.proc: subprocess.Popen | None = None
        self.lock = threading.RLock()
        self.kills = 0
        self.starts = 0

    def start(self, wait: bool = True) -> None:
        """Start the daemon; with ``wait``, block until it serves (Unavailable after 60 s)."""
        with self.lock:
            with open(self.log_path, "ab") as fh:
                self.proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT)
            self.starts += 1
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the daemon answers its health check [s]."""
        with Client(self.address) as probe:
            probe.wait_ready(timeout_s)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the running daemon."""
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the daemon and reap it."""
        with self.lock:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGKILL)
                    self.kills += 1
                self.proc.wait(30)
                self.proc = None

    def kill_and_restart(self) -> None:
        """SIGKILL, then start a new daemon without waiting for it to serve."""
        with self.lock:
            self.kill()
            self.start(wait=False)

    def stop(self) -> None:
        """SIGTERM (clean shutdown), SIGKILL after 30 s."""
        with self.lock:
            stop_offcutd(self.proc)
            self.proc = None


class DriverKilled(Exception):
    """Raised into the replay driver at a ``driver`` kill point (the driver process died)."""


class _LostReply(grpc.RpcError):
    """What a client sees when the connection drops after the daemon committed: UNAVAILABLE."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection lost after the call was sent (offcutd was killed)"


@dataclass(frozen=True)
class KillPoint:
    """Kill the daemon around the call after ``index`` acknowledged calls; ``kind`` one of
    :data:`REPLAY_KINDS`. With ``call`` (a stub method name, e.g. ``SubmitTask``), at the first
    such call once at least ``index`` calls were acknowledged (calls the resume adds shift
    later ones)."""

    index: int
    kind: str
    call: str | None = None


@dataclass
class KillHook:
    """Counts a client's acknowledged unary calls and kills the daemon at ``points`` (see the
    module docstring for the kinds). Install with :meth:`wrap`.

    Attributes:
        acked: calls answered so far (every attempt that returned a reply).
        calls: the method names of the answered calls, in order (``calls[i]`` is the call
            made after ``i`` acknowledged ones).
        fired: (point, call name) of the points fired so far, in order.
    """

    supervisor: Supervisor
    points: list[KillPoint] = field(default_factory=list)
    in_flight_kill_after_s: float = 0.2
    acked: int = 0
    calls: list[str] = field(default_factory=list)
    fired: list[tuple[KillPoint, str]] = field(default_factory=list)

    def reset(self, points: list[KillPoint]) -> None:
        """Start counting again from 0 with new kill points."""
        self.points, self.acked, self.calls, self.fired = points, 0, [], []

    def wrap(self, client: Client) -> Client:
        """Route ``client``'s stubs through this hook; returns the client."""
        for attr in ("nodes", "tasks", "status_stub", "bso", "plo"):
            setattr(client, attr, _StubProxy(getattr(client, attr), self))
        return client

    def _due(self, kinds: tuple[str, ...], name: str) -> KillPoint | None:
        done = {p for p, _ in self.fired}
        for p in self.points:
            if p.kind not in kinds or p in done:
                continue
            if p.index == self.acked if p.call is None else (p.index <= self.acked
                                                             and p.call == name):
                return p
        return None

    def around(self, name: str, fn: Callable, request: Any, kwargs: dict) -> Any:
        """Run one stub call ``fn(request, **kwargs)`` with the kill points due now."""
        point = self._due(("in-flight", "lost-reply"), name)
        if point is not None and point.kind == "in-flight":
            self.supervisor.wait_ready()  # the request must reach a serving daemon
            self.fired.append((point, name))
            self.supervisor.signal(signal.SIGSTOP)
            timer = threading.Timer(self.in_flight_kill_after_s, self.supervisor.kill_and_restart)
            timer.start()
            try:
                reply = fn(request, **kwargs)  # normally fails with UNAVAILABLE
            finally:
                timer.join()
            self.acked += 1  # (a reply from the stopped daemon is impossible; kept honest)
            self.calls.append(name)
            return reply
        reply = fn(request, **kwargs)  # raises before anything below when the daemon is down
        if point is not None:  # lost-reply: applied and committed, the answer never arrives
            self.fired.append((point, name))
            self.supervisor.kill_and_restart()
            raise _LostReply()
        self.acked += 1
        self.calls.append(name)
        after = self._due(("ack", "driver"), name)
        if after is not None:
            self.fired.append((after, name))
            self.supervisor.kill_and_restart()
            if after.kind == "driver":
                raise DriverKilled(f"driver killed after call {self.acked} ({name})")
        return reply


class _StubProxy:
    def __init__(self, stub: Any, hook: KillHook):
        self._stub, self._hook = stub, hook

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._stub, name)
        if name in STREAMS or not callable(fn):
            return fn
        if name == "StreamNodes":  # each answer on the stream counts as an acknowledged call
            return lambda requests, **kwargs: _AnswersProxy(name, fn(requests, **kwargs),
                                                            self._hook)
        return lambda request, **kwargs: self._hook.around(name, fn, request, kwargs)


class _AnswersProxy:
    """A bidirectional stream call whose answers go through :meth:`KillHook.around` one by
    one, as if each were a unary call's reply (the kill points fire between them; an
    ``in-flight`` kill stops the daemon while the next answer is awaited)."""

    def __init__(self, name: str, call: Any, hook: KillHook):
        self._name, self._call, self._hook = name, call, hook

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        return self._hook.around(self._name, lambda _request: next(self._call), None, {})

    def cancel(self) -> bool:
        return self._call.cancel()


# ------------------------------------------------------------------------------ workloads
def zeus_job_spec(seed: int) -> zeus_pb2.BatchSizeJobSpec:
    """The recurring job of the Zeus phase (5 batch sizes, eta 0.5, beta 2, 8 epochs max)."""
    return zeus_pb2.BatchSizeJobSpec(
        job_id="crash-zeus", batch_sizes=[16, 32, 64, 128, 256], default_batch_size=64,
        eta_knob=0.5, beta_knob=2.0, max_epochs=8, target_metric=0.8, higher_is_better=True,
        max_power_w=250.0, seed=seed)


def zeus_loop(client: Client, recurrences: int, seed: int) -> list[tuple]:
    """A recurring job: per recurrence ``predict_batch_size`` (request id ``crash-zeus:<r>``),
    then epochs with seeded synthetic figures (cumulative time [s] and energy [J], a metric
    that converges faster at some batch sizes) until the daemon says stop; every fourth
    recurrence ends its trial after 2 epochs with ``end_trial``. Returns what the client saw:
    (recurrence, batch size, trial, epoch, stop, converged, finished, cost [J]) per verdict."""
    spec = zeus_job_spec(seed)
    client.register_zeus_job(spec)
    seen = []
    for r in range(recurrences):
        pred = client.predict_batch_size(spec.job_id, request_id=f"crash-zeus:{r}")
        bs = pred.batch_size
        rng = random.Random(f"{seed}:{r}:{bs}")
        speed = {16: 0.06, 32: 0.11, 64: 0.16, 128: 0.14, 256: 0.07}[bs] * rng.uniform(0.8, 1.2)
        time_s = energy_j = metric = 0.0
        for epoch in range(1, spec.max_epochs + 1):
            time_s += 3600.0 * 64 / bs * rng.uniform(0.9, 1.1)
            energy_j += 200.0 * time_s / epoch * rng.uniform(0.9, 1.1)
            metric = min(0.95, metric + speed)
            if r % 4 == 3 and epoch == 3:
                v = client.end_trial(spec.job_id, pred.trial_number)
            else:
                v = client.report_epoch(spec.job_id, pred.trial_number, epoch, round(time_s, 3),
                                        round(energy_j, 3), round(metric, 6), batch_size=bs)
            seen.append((r, bs, pred.trial_number, epoch, v.stop, v.converged, v.finished,
                         round(v.cost_j, 6)))
            if v.stop:
                break
    return seen


def daemon_view(client: Client, job_id: str | None = None) -> dict:
    """The daemon's own state, without timing: status figures, tasks, the journal (entry
    kinds and decisions without ``solve_ms``), and the Zeus job if ``job_id``."""
    st = client.status(include_idle_nodes=True)
    journal = []
    for e in client.export_history():
        d = tasks_wire.decision_to_pb(e.decision)
        d.solve.ClearField("solve_ms")
        d.ClearField("duplicate")
        task = tasks_wire.task_to_pb(e.task) if e.task is not None else tasks_pb2.Task()
        journal.append((e.revision, e.kind, d.SerializeToString(deterministic=True),
                        task.SerializeToString(deterministic=True)))
    view = {
        "revision": st.revision, "clock": st.clock,
        "last_seq": dict(st.last_seq), "idle": list(st.idle_node_names),
        "counts": (st.queued_tasks, st.admitted_tasks, st.running_tasks, st.completed_tasks,
                   st.cancelled_tasks, st.failed_tasks, st.nodes_in_use),
        "totals": (st.total_samples, st.idle_node_seconds, st.used_node_seconds),
        "tasks": [tasks_wire.task_to_pb(t).SerializeToString(deterministic=True)
                  for t in client.list_tasks()],
        "journal": journal,
    }
    if job_id:
        job = client.get_zeus_job(job_id)
        view["zeus"] = (job, job.state())  # (a frozen ZeusJob: every field compared)
    return view


def check_journal(view: dict, source: str, tasks: int) -> list[str]:
    """Nothing applied twice or lost, from the journal alone: one entry per revision
    1..revision, the source's node events with seq 1..last_seq once each, one submission per
    task. Returns the problems found (empty: fine)."""
    problems = []
    revs = [r for r, *_ in view["journal"]]
    if revs != list(range(1, view["revision"] + 1)):
        problems.append(f"journal revisions are not 1..{view['revision']}")
    seqs = [decision_pb2.Decision.FromString(d).seq for _, kind, d, _ in view["journal"]
            if kind in ("nodes", "snapshot")
            and decision_pb2.Decision.FromString(d).source == source]
    if seqs != list(range(1, view["last_seq"].get(source, 0) + 1)):
        problems.append(f"node events of {source!r} are not seq 1..last_seq once each")
    submits = sum(1 for _, kind, *_ in view["journal"] if kind == "submit")
    if submits != tasks:
        problems.append(f"{submits} submissions in the journal, {tasks} tasks were submitted")
    return problems


# ------------------------------------------------------------------------------ runs
@dataclass
class RunResult:
    """One run's outputs: out folder, summary, daemon view, Zeus verdicts, counts."""

    out: Path
    summary: dict
    view: dict
    zeus_seen: list[tuple]
    calls: tuple[list[str], list[str]]  # acknowledged calls of the replay / Zeus phase
    fired: list[tuple[KillPoint, str]]
    driver_restarts: int
    retries: int
    reconciled: int
    kills: int
    starts: int
    seconds: float


def run_once(node_log, tasks, opts: ReplayOptions, workdir: Path, state_name: str, out: Path,
             *, replay_points: list[KillPoint], zeus_points: list[KillPoint],
             recurrences: int, seed: int, policy: RetryPolicy) -> RunResult:
    """The replay, then the Zeus loop, on a supervised daemon, killed at the given points."""
    started = time.perf_counter()
    sup = Supervisor(workdir, opts, state_name)
    hook = KillHook(sup)
    opts = ReplayOptions(**{**opts.__dict__, "target": sup.address, "progress": False})

    def connect(address: str) -> Client:
        return hook.wrap(Client(address, timeout_s=20, retry=policy))

    sup.start()
    try:
        hook.reset(replay_points)
        resume, driver_restarts = False, 0
        while True:
            try:
                summary = run_replay(node_log, tasks, out, opts, source="replay", resume=resume,
                                     connect=connect)
                break
            except DriverKilled:
                resume, driver_restarts = True, driver_restarts + 1
        replay_calls, fired = list(hook.calls), list(hook.fired)
        hook.reset(zeus_points)
        with connect(sup.address) as client:
            zeus_seen = zeus_loop(client, recurrences, seed)
            zeus_calls = list(hook.calls)
            fired += hook.fired
            hook.reset([])
            sup.wait_ready()
            view = daemon_view(client, zeus_job_spec(seed).job_id)
    finally:
        sup.stop()
    return RunResult(out, summary, view, zeus_seen, (replay_calls, zeus_calls), fired,
                     driver_restarts, policy.retries, policy.reconciled, sup.kills, sup.starts,
                     time.perf_counter() - started)


def choose_points(rng: random.Random, calls: list[str], kills: int, kinds: tuple[str, ...],
                  targets: dict[str, tuple[str, ...]] | None = None,
                  first: int = 2) -> list[KillPoint]:
    """``kills`` kill points at distinct acknowledged-call indices ``first..len(calls) - 1``,
    seeded by ``rng``: first one point per (call name, kind) of ``targets`` at a random
    occurrence of that call in ``calls`` (the reference run's call names; e.g. a lost reply
    of a submission), the rest at random indices with the kinds taken in turn (each kind at
    least once when there are enough points)."""
    points: dict[int, KillPoint] = {}
    for name, target_kinds in (targets or {}).items():
        for kind in target_kinds:
            if len(points) >= kills:
                break
            # in-flight / lost-reply act on the call made after ``index`` acknowledged ones,
            # ack / driver after the call ``index`` itself was acknowledged
            shift = 0 if kind in ("in-flight", "lost-reply") else 1
            free = [i + shift for i, n in enumerate(calls)
                    if n == name and i + shift < len(calls) and i + shift not in points]
            if free:
                i = rng.choice(free)
                points[i] = KillPoint(i - shift, kind, name)
    free = [i for i in range(first, len(calls)) if i not in points]
    rest = sorted(rng.sample(free, min(len(free), kills - len(points))))
    order = (list(kinds) * (len(rest) // len(kinds) + 1))[:len(rest)]
    rng.shuffle(order)
    points.update((i, KillPoint(i, k)) for i, k in zip(rest, order))
    return sorted(points.values(), key=lambda p: p.index)


#: kill points placed at particular calls first (each path of the retry rules is taken)
REPLAY_TARGETS = {"SubmitTask": ("lost-reply", "in-flight")}
ZEUS_TARGETS = {"ReportEpoch": ("lost-reply", "in-flight"), "Predict": ("lost-reply",),
                "EndTrial": ("lost-reply",), "RegisterJob": ("lost-reply",)}


def _steps_without_solve_ms(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    col = rows[0].index("solve_ms")
    return [r[:col] + r[col + 1:] for r in rows]


def compare_runs(ref: RunResult, crash: RunResult, source: str = "replay") -> list[str]:
    """Every difference between an uninterrupted and a crashed run that must not exist
    (empty list: none). See the module docstring for what is compared."""
    problems = []
    a = {k: v for k, v in ref.summary.items() if k not in TIMING_FIELDS}
    b = {k: v for k, v in crash.summary.items() if k not in TIMING_FIELDS}
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            problems.append(f"summary.json {key}: {a.get(key)!r} != {b.get(key)!r}")
    sa, sb = _steps_without_solve_ms(ref.out / "steps.csv"), _steps_without_solve_ms(crash.out / "steps.csv")
    if sa != sb:
        diff = next((i for i, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
        problems.append(f"steps.csv differs ({len(sa)} vs {len(sb)} rows, first at row {diff})")
    pa = (ref.out / "placements.csv").read_bytes()
    pb = (crash.out / "placements.csv").read_bytes()
    if pa != pb:
        problems.append("placements.csv differs")
    for key in sorted(set(ref.view) | set(crash.view)):
        if ref.view.get(key) != crash.view.get(key):
            problems.append(f"daemon view {key} differs")
    for name, run in (("uninterrupted", ref), ("crashed", crash)):
        problems += [f"{name}: {p}" for p in
                     check_journal(run.view, source, run.summary["tasks_submitted"])]
    if ref.zeus_seen != crash.zeus_seen:
        problems.append("the Zeus client saw different verdicts")
    return problems


def crash_test(node_log, tasks, opts: ReplayOptions, workdir: Path, *, replay_kills: int,
               zeus_kills: int, recurrences: int, seed: int,
               policy: Callable[[], RetryPolicy] | None = None) -> tuple[RunResult, RunResult, list[str]]:
    """Run uninterrupted, choose seeded kill points from its call counts, run with kills on a
    new state file (same socket path), compare. Returns (reference, crashed, problems)."""
    workdir = Path(workdir)
    make_policy = policy or (lambda: RetryPolicy(deadline_s=60, seed=seed))
    ref = run_once(node_log, tasks, opts, workdir, "ref.sqlite", workdir / "ref",
                   replay_points=[], zeus_points=[], recurrences=recurrences, seed=seed,
                   policy=make_policy())
    rng = random.Random(seed)
    replay_points = choose_points(rng, ref.calls[0], replay_kills, REPLAY_KINDS, REPLAY_TARGETS)
    zeus_points = choose_points(rng, ref.calls[1], zeus_kills, ZEUS_KINDS, ZEUS_TARGETS,
                                first=1)
    crash = run_once(node_log, tasks, opts, workdir, "crash.sqlite", workdir / "crash",
                     replay_points=replay_points, zeus_points=zeus_points,
                     recurrences=recurrences, seed=seed, policy=make_policy())
    problems = compare_runs(ref, crash)
    planned = len(replay_points) + len(zeus_points)
    if len(crash.fired) != planned:
        problems.append(f"{len(crash.fired)} of {planned} kill points fired")
    return ref, crash, problems


# ------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--demo", action="store_true", help="the bundled demo log instead")
    ap.add_argument("--num-nodes", type=int, default=128)
    ap.add_argument("--max-tasks", type=int, default=10)
    ap.add_argument("--max-events", type=int, default=300)
    ap.add_argument("--kills", type=int, default=20, help="kill points in the replay")
    ap.add_argument("--zeus-kills", type=int, default=6, help="kill points in the Zeus loop")
    ap.add_argument("--recurrences", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--solver", default="dp")
    ap.add_argument("--out", type=Path, default=None)
    add_option(ap)
    args = ap.parse_args(argv)
    log = ResultsLog.from_args("crash_safety", args, argv)
    say = log.say

    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.synth import demo_data_dir

    if args.demo:
        data = demo_data_dir()
        node_log, tasks = load_node_log(data, skip_rows=0), load_task_set(data)
        what = f"bundled demo log ({len(node_log.node_names)} nodes, {len(tasks)} tasks)"
    else:
        if not args.data_dir.is_dir():
            print(f"real BFTrainer data not found at {args.data_dir}; use --demo", file=sys.stderr)
            return 2
        node_log = load_node_log(args.data_dir / "ndstat-10sdn6-evt.tar.gz",
                                 num_nodes=args.num_nodes, allow_pickle=True)
        tasks = load_task_set(args.data_dir / "hps-shufflenet-Jbnd-10J.pkl",
                              allow_pickle=True)[:args.max_tasks]
        what = f"real log, {args.num_nodes} nodes, {len(tasks)} hps-shufflenet tasks"
    opts = ReplayOptions(solver=args.solver, max_tasks=args.max_tasks, max_events=args.max_events,
                         seed=args.seed, progress=False)
    workdir = args.out or Path(tempfile.mkdtemp(prefix="offcut-crash-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ref, crash, problems = crash_test(node_log, tasks, opts, workdir, replay_kills=args.kills,
                                      zeus_kills=args.zeus_kills, recurrences=args.recurrences,
                                      seed=args.seed)
    total = time.perf_counter() - started
    kinds: dict[str, int] = {}
    for p, _ in crash.fired:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    say(f"input: {what}, max {args.max_events} events, solver {args.solver}, seed {args.seed}")
    say(f"replay: {ref.summary['events']} events, {ref.summary['tasks_submitted']} tasks "
        f"({ref.summary['tasks_completed']} completed), {len(ref.calls[0])} acknowledged "
        f"calls; Zeus: {args.recurrences} recurrences, {len(ref.calls[1])} calls")
    say(f"kills: {len(crash.fired)} fired "
        f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}); "
        f"{crash.kills} SIGKILLs, {crash.starts} daemon starts, {crash.driver_restarts} driver "
        f"restarts (resumed from last_seq), {crash.retries} client retries, "
        f"{crash.reconciled} report_epoch answers reconciled")
    for p, name in crash.fired:
        where = f"the first {p.call} after" if p.call else "after"
        say(f"  {p.kind:10s} at {name:12s} ({where} {p.index} acknowledged calls)")
    say("checked: summary.json without " + ", ".join(sorted(TIMING_FIELDS)) + "; steps.csv "
        "without solve_ms; placements.csv; daemon status, tasks and every journal entry "
        "(each revision once, source seqs 1..last_seq once, one submission per task); Zeus "
        "job state, trials and the verdicts the client saw")
    say(f"time: uninterrupted {ref.seconds:.1f} s, with kills {crash.seconds:.1f} s, "
        f"total {total:.1f} s")
    print(f"outputs in {workdir}")
    if problems:
        say("FAILED:")
        for p in problems:
            say("  " + p)
    else:
        say("OK: the crashed run equals the uninterrupted one")
    log.finish()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

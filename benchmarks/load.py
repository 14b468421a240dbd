"""Load test of a live offcutd (docs/security.md, "Time"): Slurm's node events,
fed from the real node log at its real burst sizes, must never be refused or lost while many
users submit tasks, read state and run Zeus steps.

The daemon runs the live clock (``offcutd --clock live``, the default; docs/security.md,
"Time"): every event is applied at the daemon's own receive time, times in requests are data
(``Decision.sent_time``), and node events are never refused as older than a submission.

Who does what, each on its own gRPC channel, against a daemon with bearer tokens
(:func:`make_tokens`: an ``admin`` for the final checks, a ``slurm`` token for Slurm's side and
one ``user`` per client):

* the **feeder** (the headline) plays the node log as the Slurm hooks would: one
  ``ReportNodes`` per log event, in log order and at its real burst size (the nodes that became
  idle as ``idle``, those taken back as ``preempted``), source ``slurm``, sequence numbers
  1..N, stamped with the sender's own wall clock. Time is compressed: the next event goes as
  soon as the daemon answered the last one, or (``--speedup X``) no earlier than its log time
  divided by X. The log is the real BFTrainer node log (``--node-log``, by default
  ``../shared/data/bftrainer/ndstat-10sdn6-evt.tar.gz``: 4,734 nodes, 23,882 events in two
  weeks, 1-4,601 nodes per event, median 4, p99 761); when it is absent the feeder plays a
  synthetic log of the same burst-size distribution (:func:`synthetic_feed`) and the output
  says so. A refused call is not retried (every error counts as refused).
* ``--clients`` user threads (default 64) each start operations at ``--client-rate`` per second
  (default 2, Poisson; 0: back to back, which saturates the daemon) drawn from ``--mix``:
  ``submit`` (an elastic task with a request id; its ``submit_time`` is left unset, the
  sender's clock, or a day ahead -- data on a live daemon, it must not move the clock),
  ``status`` and ``list_tasks`` (reads, as the user sees them), ``zeus`` (the next step of
  its own Zeus job: ``zeus_predict`` with a request id when no trial is open, else
  ``zeus_report`` of the next epoch) and ``report_nodes``: a node event of its own source
  ``load-cNN`` (slurm token) on its own nodes ``lcNNnKKKK`` (``--nodes-per-client``; the first
  makes ``--burst-max`` nodes idle, later ones are idle or preempt bursts of ``--burst-max``
  with probability ``--big-burst-p``, else 1-32 nodes). Each client first does every operation
  of the mix once, then draws.

Node events of different sources are ordered by their observation times (a node event observed
before the newest applied one is stale: FAILED_PRECONDITION, the hooks observe again), so all
node senders here -- the feeder and the clients' ``report_nodes`` -- take their time stamp and
send under one lock (:class:`Observer`), as one Slurm controller observing; submissions, reads
and Zeus calls are not ordered with them at all. The load ends when the feeder has sent its
last event (``--max-events``, default the whole log) or after ``--duration`` seconds.

Afterwards :func:`check_state` compares the daemon's final state with what was done. For the
feeder (:func:`check_feed`): the daemon's journal (``ExportHistory``) holds every acknowledged
event exactly once, with the revision and ``sent_time`` its reply had, and no definitely refused
one; ``last_seq[slurm]`` is the last seq it holds; the final idle pool of the log's nodes equals
the log's state after the events it holds, applied in order (the acknowledged ones when none
was lost; the pool includes the nodes tasks hold). An acknowledged event missing from the
journal (or stored differently) is **lost**. For the clients: their idle pools and
``last_seq``, the revision, every submitted task exactly once (and a retried request id answers
it again without a state change), node placements within limits, Zeus trials, no solver
fallbacks, the live clock not moved by the submit times a day ahead.

Printed: progress every ``--progress`` seconds, then the node-event block (sent, acknowledged,
refused, lost; the feed rate and the apply delay: the daemon's receive time minus the sender's
stamp), a table of calls per kind with count, errors, p50 / p99 / max latency [ms], sustained
rates and the daemon's RSS and CPU time. Exit status 1 if any node event of the feeder was
refused or lost, any call failed, or the final state is inconsistent. ``tests/test_load.py``
runs a bounded version. The figure lines (not the progress) also go, with the machine and the
command, to a new ``benchmarks/results/load-DATE-TIME.txt`` (``--no-results``: not written).

Usage::

    python benchmarks/load.py                              # 64 clients, the whole real log
    python benchmarks/load.py --max-events 5000 --json out.json
    python benchmarks/load.py --client-rate 0 --max-events 500   # clients back to back
    python benchmarks/load.py --clients 16 --duration 30 --speedup 3600
    python benchmarks/load.py --mix submit=1,status=1     # clients without node events
    python benchmarks/load.py --node-log missing.tar.gz   # synthetic log of the real burst sizes
    python benchmarks/load.py --flood 30 --max-events 3000  # one user floods submit+cancel
    python benchmarks/load.py --address unix:///run/offcut/offcutd.sock --token-file admin.token
                                    # a running daemon (fresh state, admin token; over TCP
                                    # give its CA in $OFFCUT_TLS_CA: tokens need TLS)
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402

#: the real BFTrainer node log, found like the other benchmarks find ../shared/data
DEFAULT_NODE_LOG = (Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"
                    / "ndstat-10sdn6-evt.tar.gz")
#: the feeder's node-event source (as a Slurm hook's)
FEED_SOURCE = "slurm"
#: call kinds, in table order (``slurm_feed``: the feeder's ReportNodes)
KINDS = ("slurm_feed", "report_nodes", "submit", "status", "list_tasks", "zeus_register",
         "zeus_predict", "zeus_report")
#: operations a client draws from, with their default weights
#: (client node events are rare: all node events are sent one at a time, see :class:`Observer`,
#: so each one holds the feeder up, and the feeder's are the ones measured)
DEFAULT_MIX = {"report_nodes": 0.005, "submit": 0.25, "status": 0.15, "list_tasks": 0.15,
               "zeus": 0.445}
BATCH_SIZES = [32, 64, 128, 256]
#: how a client sets ``submit_time``: unset (the daemon's receive time), its own wall clock,
#: or a day ahead (on a live daemon all three are data and the clock stays the daemon's)
SUBMIT_TIMES = ("unset", "now", "day_ahead")
#: error statuses that say the call was certainly not applied
DEFINITE_REFUSALS = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED",
                               "UNAUTHENTICATED", "NOT_FOUND", "ALREADY_EXISTS",
                               "RESOURCE_EXHAUSTED", "OUT_OF_RANGE"})

#: nodes per event (idle + busy) of the real log (23,882 events after de-duplication), as
#: (percentile, size) pairs: the synthetic feed draws from this distribution (linear in between)
REAL_BURST_PERCENTILES = (
    (0, 1), (32, 1), (34, 2), (42, 2), (44, 3), (48, 3), (50, 4), (54, 4), (56, 5), (58, 6),
    (60, 6), (62, 8), (64, 8), (66, 9), (68, 10), (70, 11), (72, 13), (74, 16), (76, 16),
    (78, 18), (80, 21), (82, 27), (84, 32), (86, 34), (88, 46), (90, 52), (92, 66), (94, 100),
    (95, 124), (96, 136), (97, 210), (98, 355), (99, 761), (99.5, 1024), (99.8, 1600),
    (99.9, 2044), (100, 4601))
#: shares of the real log's events that only free nodes, only take nodes back, or both
REAL_IDLE_ONLY, REAL_BUSY_ONLY, REAL_BOTH = 0.539, 0.385, 0.076
#: the real log's machine size [nodes], median time between events [s] and idle share of
#: node-time
REAL_NODES, REAL_GAP_MEDIAN_S, REAL_IDLE_SHARE = 4734, 30.0, 0.087


# ----------------------------------------------------------------------------- the node log
@dataclass
class FeedEvent:
    """One node event of the feed: nodes that became idle / busy, at ``log_time_s`` [s after
    the log's first row]."""

    idle: list[str]
    busy: list[str]
    log_time_s: float

    @property
    def size(self) -> int:
        """Node names in the event."""
        return len(self.idle) + len(self.busy)


@dataclass
class NodeFeed:
    """What the feeder plays: ``events`` in order over ``node_names`` (all busy before the
    first event); ``description`` says where they come from; ``synthetic`` is True for the
    fallback of :func:`synthetic_feed`."""

    description: str
    node_names: list[str]
    events: list[FeedEvent]
    synthetic: bool = False
    total_events: int | None = None   # events of the whole source (None: unknown)

    def sizes(self) -> np.ndarray:
        """Node names per event."""
        return np.asarray([e.size for e in self.events], dtype=int)

    def state_after(self, applied: list[bool]) -> set[str]:
        """Idle nodes after applying, in order, the events whose ``applied`` flag is set."""
        idle: set[str] = set()
        for ev, ok in zip(self.events, applied):
            if ok:
                idle |= set(ev.idle)
                idle -= set(ev.busy)
        return idle


def load_real_feed(path: Path, *, max_events: int | None = None, skip_rows: int = 0,
                   allow_pickle: bool = False) -> NodeFeed:
    """The real node log at ``path`` (the BFTrainer ``.tar.gz`` / ``.pkl``, which needs
    ``allow_pickle``, or a safe-format folder) from row ``skip_rows``: its initial idle set as
    a first event (if any node is idle there), then one event per changed row, at most
    ``max_events`` events. Raises ``ReplayInputError`` for an unusable file."""
    from offcut.replay.bftrainer_data import load_node_log

    log = load_node_log(path, skip_rows=skip_rows, allow_pickle=allow_pickle)
    t0 = log.initial_time
    events: list[FeedEvent] = []
    if log.initial_idle:
        events.append(FeedEvent(list(log.initial_idle), [], 0.0))
    first_row = last_row = None
    last_time = t0
    total = len(events)
    for ch in log.events():
        total += 1
        if max_events is not None and len(events) >= max_events:
            continue  # count the rest (the whole log's size is printed)
        events.append(FeedEvent(list(ch.became_idle), list(ch.became_busy),
                                (ch.time - t0).total_seconds()))
        first_row = ch.row if first_row is None else first_row
        last_row, last_time = ch.row, ch.time
    rows = f"rows {first_row}-{last_row}" if first_row is not None else "no rows"
    return NodeFeed(f"real node log {path} ({rows}, {t0} to {last_time}, "
                    f"{len(log.node_names)} nodes)", list(log.node_names), events,
                    total_events=total)


def synthetic_feed(num_events: int, *, num_nodes: int = REAL_NODES, seed: int = 0) -> NodeFeed:
    """A synthetic log of ``num_events`` events over ``num_nodes`` nodes (``sNNNnKK``, all
    busy at first) with the real log's burst sizes (:data:`REAL_BURST_PERCENTILES`) and its
    share of events that both free and take back nodes (:data:`REAL_BOTH`). The others free
    nodes with the real log's odds (:data:`REAL_IDLE_ONLY` : :data:`REAL_BUSY_ONLY`) while
    fewer than :data:`REAL_IDLE_SHARE` of the nodes are idle, else take nodes back with those
    odds; a burst larger than the state allows goes the other way, and only one that fits
    neither way is cut. Gaps between events: log-normal, median :data:`REAL_GAP_MEDIAN_S` [s].
    Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    names = [f"s{i // 16:03d}n{i % 16:02d}" for i in range(num_nodes)]
    pct = np.asarray([p for p, _ in REAL_BURST_PERCENTILES], dtype=float)
    val = np.asarray([s for _, s in REAL_BURST_PERCENTILES], dtype=float)
    p_free = REAL_IDLE_ONLY / (REAL_IDLE_ONLY + REAL_BUSY_ONLY)
    idle = np.zeros(num_nodes, dtype=bool)
    events: list[FeedEvent] = []
    t = 0.0
    for _ in range(num_events):
        size = max(1, int(round(float(np.interp(rng.random() * 100.0, pct, val)))))
        free, taken = np.flatnonzero(~idle), np.flatnonzero(idle)
        if rng.random() < REAL_BOTH and size >= 2 and len(free) and len(taken):
            k_idle = int(rng.integers(1, size))
            k_busy = size - k_idle
        else:
            up = rng.random() < (p_free if len(taken) < REAL_IDLE_SHARE * num_nodes else 1 - p_free)
            if up and size > len(free) and size <= len(taken):
                up = False
            elif not up and size > len(taken) and size <= len(free):
                up = True
            k_idle, k_busy = (size, 0) if up else (0, size)
        k_idle, k_busy = min(k_idle, len(free)), min(k_busy, len(taken))
        if k_idle + k_busy == 0:  # (nothing idle to take back and nothing busy to free)
            k_idle, k_busy = min(size, len(free)), min(size, len(taken))
        up_i = rng.choice(free, k_idle, replace=False) if k_idle else np.empty(0, dtype=int)
        down_i = rng.choice(taken, k_busy, replace=False) if k_busy else np.empty(0, dtype=int)
        idle[up_i] = True
        idle[down_i] = False
        events.append(FeedEvent([names[i] for i in sorted(up_i)],
                                [names[i] for i in sorted(down_i)], t))
        t += float(rng.lognormal(math.log(REAL_GAP_MEDIAN_S), 1.0))
    return NodeFeed(f"SYNTHETIC node log ({num_events} events, {num_nodes} nodes, seed {seed}, "
                    "the real log's burst-size distribution)", names, events, synthetic=True,
                    total_events=num_events)


def default_feed(path: Path | None = None, *, max_events: int | None = None, skip_rows: int = 0,
                 allow_pickle: bool | None = None, seed: int = 0) -> NodeFeed:
    """The real node log at ``path`` (default :data:`DEFAULT_NODE_LOG`, whose pickle is
    trusted; another pickle needs ``allow_pickle``), or, when that file is absent, a synthetic
    log of the real burst sizes with ``max_events`` events (23,882, the real log's count, if
    None); its description then says why."""
    path = Path(path) if path is not None else DEFAULT_NODE_LOG
    if not path.exists():
        feed = synthetic_feed(max_events if max_events is not None else 23_882, seed=seed)
        feed.description += f"; the real log {path} is absent (../shared/data not here)"
        return feed
    if allow_pickle is None:
        allow_pickle = path.resolve() == DEFAULT_NODE_LOG.resolve()
    return load_real_feed(path, max_events=max_events, skip_rows=skip_rows,
                          allow_pickle=allow_pickle)


# ----------------------------------------------------------------------------- configuration
@dataclass
class Tokens:
    """Bearer tokens of the load's principals: ``admin`` (final checks), ``slurm`` (node
    events), ``users`` (client source -> its user's token). None: the daemon has no tokens
    (or one token is used for everything: ``--address`` with ``--token-file``)."""

    admin: str | None = None
    slurm: str | None = None
    users: dict[str, str] = field(default_factory=dict)

    def user(self, name: str) -> str | None:
        """The token of user ``name`` (the admin's when it has none)."""
        return self.users.get(name, self.admin)


def client_source(index: int) -> str:
    """Source, user name and Zeus job id of client ``index``."""
    return f"load-c{index:02d}"


def make_tokens(path: Path, clients: int) -> Tokens:
    """Write a tokens file (mode 0600) at ``path`` with an admin, a slurm and one user per
    client (named :func:`client_source`); returns the tokens."""
    from offcut.daemon.edge.auth import add_token

    return Tokens(admin=add_token(path, "load-admin", "admin"),
                  slurm=add_token(path, "load-slurm", "slurm"),
                  users={client_source(i): add_token(path, client_source(i), "user")
                         for i in range(clients)})


@dataclass
class LoadConfig:
    """What the clients do (see the module docstring).

    ``client_rate`` [operations/s per client]: each client starts its operations as a Poisson
    process of this rate, sending at once when it is behind (None: back to back, as fast as the
    daemon answers). ``duration_s`` [s]: stop the whole load (feeder too) after this long
    (None: when the feeder has sent its last event). ``speedup``: the feeder sends event i no
    earlier than its log time / speedup after the start (None: as fast as the daemon answers).
    ``mix``: operation -> weight (keys of :data:`DEFAULT_MIX`). ``timeout_s``: per call
    deadline [s]. ``progress_s``: print a progress line this often [s] (None: silent).
    """

    clients: int = 64
    client_rate: float | None = 2.0
    duration_s: float | None = None
    speedup: float | None = None
    burst_max: int = 761
    big_burst_p: float = 0.1
    nodes_per_client: int = 1000
    seed: int = 0
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    timeout_s: float = 120.0
    progress_s: float | None = None

    def __post_init__(self) -> None:
        if self.clients < 0 or self.burst_max < 1:
            raise ValueError("clients must be >= 0 and burst_max >= 1")
        if self.nodes_per_client < self.burst_max:
            raise ValueError("nodes_per_client must be >= burst_max")
        if self.speedup is not None and self.speedup <= 0:
            raise ValueError("speedup must be > 0")
        if self.client_rate is not None and self.client_rate <= 0:
            raise ValueError("client_rate must be > 0")
        unknown = set(self.mix) - set(DEFAULT_MIX)
        if unknown:
            raise ValueError(f"unknown operations in mix: {sorted(unknown)}")
        if not any(w > 0 for w in self.mix.values()):
            raise ValueError("the mix needs an operation with a positive weight")


class Observer:
    """Slurm's side observing nodes: every node-event sender takes its time stamp (the wall
    clock, never going back) and sends while holding :attr:`lock`, so observation order is
    arrival order (the daemon refuses a node event observed before the newest applied one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._last = 0.0

    def stamp(self) -> float:
        """The time of an observation made now [s since epoch]; call with :attr:`lock` held."""
        self._last = max(time.time(), self._last)
        return self._last


# ----------------------------------------------------------------------------- records
@dataclass
class Calls:
    """Latencies [ms] and failures of one caller's RPCs."""

    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def call(self, kind: str, fn: Callable[[], Any]) -> tuple[bool, Any, str | None]:
        """Run one RPC, timing it; returns (ok, reply, status name of the failure or None).
        Failures are recorded, not raised."""
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is a finding of the load test
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:400])
            return False, None, getattr(exc, "status", None) or type(exc).__name__
        finally:
            self.latencies_ms.setdefault(kind, []).append((time.perf_counter() - t0) * 1e3)
        return True, out, None


@dataclass
class FeedRun(Calls):
    """The feeder's record. Per sent event (index = seq - 1): ``sent_times`` [s since epoch],
    ``acked`` (the reply's revision, or None when the call failed) and ``definite`` (False: a
    failure that may still have been applied, e.g. a deadline). Also: replies that were
    duplicates, named ignored nodes, or did not echo the sent time; the apply delay [ms] (the
    reply's time, the daemon's receive time, minus the sender's stamp)."""

    source: str = FEED_SOURCE
    sent_times: list[float] = field(default_factory=list)
    acked: list[int | None] = field(default_factory=list)
    definite: list[bool] = field(default_factory=list)
    refusal_statuses: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    ignored_nodes: int = 0
    sent_time_not_echoed: int = 0
    apply_delay_ms: list[float] = field(default_factory=list)
    node_names_sent: int = 0
    wall_s: float = 0.0

    @property
    def sent(self) -> int:
        """Node events sent (= the last seq used)."""
        return len(self.sent_times)

    @property
    def acknowledged(self) -> int:
        """Node events the daemon answered with a decision."""
        return sum(1 for r in self.acked if r is not None)

    @property
    def refused(self) -> int:
        """Node events whose call failed, whatever the error."""
        return self.sent - self.acknowledged


@dataclass
class ClientRun(Calls):
    """One client's record: what it did (to check the final state) and its call latencies."""

    index: int = 0
    source: str = ""
    names: list[str] = field(default_factory=list)
    idle: set[str] = field(default_factory=set)
    events: int = 0                       # node events sent (= last seq used)
    uncertain: bool = False               # a node event failed: its effect is unknown
    node_names_sent: int = 0
    submissions: list[tuple[str, str, str]] = field(default_factory=list)  # (request id, task id, name)
    submit_attempts: int = 0
    submit_times: dict[str, int] = field(default_factory=dict)  # SUBMIT_TIMES kind -> count
    predictions: int = 0
    trial: dict[str, Any] | None = None   # the open Zeus trial
    ended_trials: list[int] = field(default_factory=list)
    operations: int = 0


@dataclass
class LoadResult:
    """The feeder's and clients' records, the wall time of the load [s] and why it stopped."""

    config: LoadConfig
    address: str
    tokens: Tokens
    feed: NodeFeed
    feed_run: FeedRun
    runs: list[ClientRun]
    wall_s: float
    stopped_by: str

    def latencies(self, kind: str) -> np.ndarray:
        """All latencies [ms] of one call kind."""
        return np.asarray([x for r in self._callers() for x in r.latencies_ms.get(kind, [])],
                          dtype=float)

    def _callers(self) -> list[Calls]:
        return [self.feed_run, *self.runs]

    @property
    def errors(self) -> list[str]:
        """Every failed call, as ``caller: kind: error``."""
        return [f"{self.feed_run.source}: {e}" for e in self.feed_run.errors] + \
               [f"{r.source}: {e}" for r in self.runs for e in r.errors]

    @property
    def node_events(self) -> int:
        """Node events sent by the feeder and the clients."""
        return self.feed_run.sent + sum(r.events for r in self.runs)

    @property
    def calls(self) -> int:
        """RPCs made by the feeder and the clients (the final checks excluded)."""
        return sum(len(v) for r in self._callers() for v in r.latencies_ms.values())

    def rows(self) -> list[dict[str, Any]]:
        """Per call kind: count, errors, p50 / p99 / max latency [ms] (kinds with calls only)."""
        out = []
        for kind in KINDS:
            ms = self.latencies(kind)
            if len(ms) == 0:
                continue
            errs = sum(1 for r in self._callers() for e in r.errors if e.startswith(kind + ":"))
            out.append(dict(kind=kind, count=int(len(ms)), errors=errs,
                            p50_ms=float(np.percentile(ms, 50)), p99_ms=float(np.percentile(ms, 99)),
                            max_ms=float(ms.max())))
        return out

    def summary(self) -> dict[str, Any]:
        """The feeder's counts and rates, then all node events, node names and calls per
        second of wall time."""
        wall = max(self.wall_s, 1e-9)
        f = self.feed_run
        sizes = self.feed.sizes()[:f.sent]
        delay = np.asarray(f.apply_delay_ms, dtype=float)
        names = f.node_names_sent + sum(r.node_names_sent for r in self.runs)
        return dict(
            clients=self.config.clients, wall_s=self.wall_s, stopped_by=self.stopped_by,
            feed=self.feed.description, feed_synthetic=self.feed.synthetic,
            feed_events_in_log=self.feed.total_events, feed_sent=f.sent,
            feed_acknowledged=f.acknowledged, feed_refused=f.refused,
            feed_refusals=dict(f.refusal_statuses), feed_node_names=f.node_names_sent,
            feed_burst_p50=float(np.percentile(sizes, 50)) if len(sizes) else None,
            feed_burst_p99=float(np.percentile(sizes, 99)) if len(sizes) else None,
            feed_burst_max=int(sizes.max()) if len(sizes) else None,
            feed_events_per_s=f.sent / max(f.wall_s, 1e-9),
            feed_apply_delay_ms_p50=float(np.percentile(delay, 50)) if len(delay) else None,
            feed_apply_delay_ms_p99=float(np.percentile(delay, 99)) if len(delay) else None,
            feed_duplicates=f.duplicates, feed_ignored_nodes=f.ignored_nodes,
            feed_sent_time_not_echoed=f.sent_time_not_echoed,
            node_events=self.node_events, events_per_s=self.node_events / wall,
            node_names_per_s=names / wall, calls=self.calls, calls_per_s=self.calls / wall,
            submissions=sum(len(r.submissions) for r in self.runs),
            submit_times={k: sum(r.submit_times.get(k, 0) for r in self.runs) for k in SUBMIT_TIMES},
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


def _node_event(run: ClientRun, client: Client, rng: np.random.Generator, cfg: LoadConfig,
                observer: Observer) -> None:
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
    with observer.lock:
        t = observer.stamp()
        ok, _, status = run.call("report_nodes", lambda: client.report_nodes(
            t, run.source, seq, idle=join, preempted=leave))
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
        ok, pred, _ = run.call("zeus_predict", lambda: client.predict_batch_size(run.source, rid))
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
    ok, verdict, _ = run.call("zeus_report", lambda: client.report_epoch(
        run.source, tr["number"], e, share * 10.0, energy, metric, batch_size=tr["batch_size"]))
    if ok:
        tr["epoch"] = e
        if verdict.stop:
            run.ended_trials.append(tr["number"])
            run.trial = None


def _submit(run: ClientRun, client: Client, rng: np.random.Generator) -> None:
    run.submit_attempts += 1
    rid = f"{run.source}-s{run.submit_attempts}"
    name = f"{run.source}-task{run.submit_attempts}"
    spec = task_spec(rng, name)
    how = SUBMIT_TIMES[int(rng.integers(len(SUBMIT_TIMES)))]
    run.submit_times[how] = run.submit_times.get(how, 0) + 1
    t = None if how == "unset" else time.time() + (86_400.0 if how == "day_ahead" else 0.0)
    ok, reply, _ = run.call("submit", lambda: client.submit(spec, submit_time=t, owner=run.source,
                                                           request_id=rid))
    if ok:
        run.submissions.append((rid, reply.task.task_id, name))


def _operation(op: str, run: ClientRun, user: Client, slurm: Client | None,
               rng: np.random.Generator, cfg: LoadConfig, observer: Observer) -> None:
    run.operations += 1
    if op == "report_nodes":
        _node_event(run, slurm, rng, cfg, observer)
    elif op == "submit":
        _submit(run, user, rng)
    elif op == "status":
        run.call("status", user.status)
    elif op == "list_tasks":
        run.call("list_tasks", user.list_tasks)
    elif op == "zeus":
        _zeus_step(run, user, rng)


def _feed(feed: NodeFeed, run: FeedRun, client: Client, cfg: LoadConfig, observer: Observer,
          stop: threading.Event) -> None:
    """Play ``feed`` as source ``run.source``, seq 1..N, each event stamped with the sender's
    clock; stops early when ``stop`` is set."""
    started = time.perf_counter()
    first_t = feed.events[0].log_time_s if feed.events else 0.0
    for seq, ev in enumerate(feed.events, start=1):
        if stop.is_set():
            break
        if cfg.speedup is not None:
            due = started + (ev.log_time_s - first_t) / cfg.speedup
            if stop.wait(max(0.0, due - time.perf_counter())):
                break
        with observer.lock:
            t = observer.stamp()
            ok, reply, status = run.call("slurm_feed", lambda: client.report_nodes(
                t, run.source, seq, idle=ev.idle, preempted=ev.busy))
        run.sent_times.append(t)
        run.node_names_sent += ev.size
        if ok:
            d = reply
            run.acked.append(int(d.revision))
            run.definite.append(True)
            run.duplicates += int(d.duplicate)
            run.ignored_nodes += len(d.ignored_nodes)
            sent = d.sent_time
            if sent is None or abs(sent - t) > 2e-6:
                run.sent_time_not_echoed += 1
            run.apply_delay_ms.append((d.time - t) * 1e3)
        else:
            run.acked.append(None)
            run.definite.append(status in DEFINITE_REFUSALS)
            run.refusal_statuses[status] = run.refusal_statuses.get(status, 0) + 1
    run.wall_s = time.perf_counter() - started


def run_load(address: str, cfg: LoadConfig, feed: NodeFeed, tokens: Tokens | None = None) -> LoadResult:
    """Drive the live daemon at ``address``: the feeder plays ``feed`` while ``cfg.clients``
    clients make their calls; returns the records once the feeder is done (or
    ``cfg.duration_s`` passed) and every client finished its operation in flight.

    The daemon must start from an empty state (sources, node names and Zeus job ids are fixed).
    Never raises for failed calls: they are in :attr:`LoadResult.errors`.
    """
    tokens = tokens or Tokens()
    ops = [k for k, w in cfg.mix.items() if w > 0]
    weights = np.asarray([cfg.mix[k] for k in ops], dtype=float)
    weights /= weights.sum()
    runs = [ClientRun(index=i, source=client_source(i),
                      names=[f"lc{i:02d}n{k:04d}" for k in range(cfg.nodes_per_client)])
            for i in range(cfg.clients)]
    feed_run = FeedRun()
    observer, stop = Observer(), threading.Event()
    start = threading.Barrier(cfg.clients + 2, timeout=cfg.timeout_s)  # clients, feeder, main

    def worker(run: ClientRun) -> None:
        rng = np.random.default_rng([cfg.seed, run.index])
        user = Client(address, timeout_s=cfg.timeout_s, token=tokens.user(run.source))
        slurm = Client(address, timeout_s=cfg.timeout_s, token=tokens.slurm) \
            if "report_nodes" in ops else None
        try:
            run.call("zeus_register", lambda: user.register_zeus_job(
                zeus_spec(run.source, cfg.seed * 1000 + run.index)))
            start.wait()
            first = [ops[i] for i in rng.permutation(len(ops))]  # every operation once
            due = time.perf_counter()
            while first or not stop.is_set():
                if cfg.client_rate is not None:
                    due += float(rng.exponential(1.0 / cfg.client_rate))
                    if stop.wait(max(0.0, due - time.perf_counter())) and not first:
                        break
                op = first.pop() if first else ops[int(rng.choice(len(ops), p=weights))]
                _operation(op, run, user, slurm, rng, cfg, observer)
        except threading.BrokenBarrierError:
            run.errors.append("start: barrier broken (another thread failed or timed out)")
        except Exception as exc:  # noqa: BLE001 - a harness bug: record it, release the others
            run.errors.append(f"client thread: {type(exc).__name__}: {exc}"[:400])
            start.abort()
        finally:
            user.close()
            if slurm is not None:
                slurm.close()

    def feeder() -> None:
        client = Client(address, timeout_s=cfg.timeout_s, token=tokens.slurm)
        try:
            start.wait()
            _feed(feed, feed_run, client, cfg, observer, stop)
        except threading.BrokenBarrierError:
            feed_run.errors.append("start: barrier broken (another thread failed or timed out)")
        except Exception as exc:  # noqa: BLE001
            feed_run.errors.append(f"feeder thread: {type(exc).__name__}: {exc}"[:400])
            start.abort()
        finally:
            stop.set()
            client.close()

    threads = [threading.Thread(target=worker, args=(r,), name=r.source, daemon=True) for r in runs]
    feed_thread = threading.Thread(target=feeder, name="feeder", daemon=True)
    for th in [*threads, feed_thread]:
        th.start()
    stopped_by = "end of the feed"
    try:
        start.wait()
    except threading.BrokenBarrierError:
        stopped_by = "a thread failed before the start"
        stop.set()
    started = time.perf_counter()
    next_progress = started + (cfg.progress_s or 0.0)
    while feed_thread.is_alive():
        now = time.perf_counter()
        if cfg.duration_s is not None and now - started >= cfg.duration_s and not stop.is_set():
            stopped_by = f"--duration {cfg.duration_s:g} s"
            stop.set()
        if cfg.progress_s and now >= next_progress and now > started:
            _progress(now - started, feed, feed_run, runs)
            next_progress += cfg.progress_s
        ends = started + cfg.duration_s if cfg.duration_s is not None and not stop.is_set() \
            else math.inf
        wake = [next_progress if cfg.progress_s else math.inf, ends]
        feed_thread.join(timeout=min(1.0, max(0.01, min(wake) - time.perf_counter())))
    for th in threads:
        th.join()
    wall = time.perf_counter() - started
    return LoadResult(cfg, address, tokens, feed, feed_run, runs, wall, stopped_by)


def _progress(elapsed: float, feed: NodeFeed, f: FeedRun, runs: list[ClientRun]) -> None:
    calls = sum(len(v) for r in runs for v in r.latencies_ms.values())
    errors = sum(len(r.errors) for r in runs)
    print(f"[{elapsed:7.1f} s] slurm feed: {f.sent}/{len(feed.events)} events sent, "
          f"{f.acknowledged} acknowledged, {f.refused} refused ({f.sent / elapsed:.1f}/s); "
          f"clients: {calls} calls, {errors} errors", flush=True)


# ----------------------------------------------------------------------------- the checks
@dataclass
class FeedCheck:
    """What the daemon kept of the feeder's events: ``journal`` (its node events of the
    feeder's source), ``lost`` (acknowledged events missing from the journal or stored with
    another revision or sent time), ``applied_refused`` (refused events the journal holds
    anyway: a definite refusal there is a bug, a deadline may be), ``last_seq``, the final idle
    pool of the log's nodes (``pool_idle``) against the log's state after the journaled
    events (``expected_idle``; ``pool_missing`` / ``pool_extra`` names out of place)."""

    journal: int = 0
    lost: int = 0
    applied_refused: int = 0
    last_seq: int = 0
    pool_idle: int = 0
    expected_idle: int = 0
    pool_missing: int = 0
    pool_extra: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class StateCheck:
    """The final checks: ``problems`` (empty: consistent, the feeder's included) and the
    feeder's part in detail."""

    problems: list[str]
    feed: FeedCheck


def check_feed(admin: Client, result: LoadResult, pool: set[str], last_seq: dict[str, int],
               timeout_s: float = 600.0) -> FeedCheck:
    """The feeder's part of :func:`check_state` (see :class:`FeedCheck`): reads the daemon's
    whole journal (``ExportHistory``, admin only; ``timeout_s`` [s] bounds it)."""
    f, feed = result.feed_run, result.feed
    out = FeedCheck()
    seen: dict[int, list[tuple[int, float | None]]] = {}
    for entry in admin.export_history(timeout_s=timeout_s):
        d = entry.decision
        if entry.kind in ("nodes", "snapshot") and d.source == f.source:
            sent = d.sent_time
            seen.setdefault(int(d.seq), []).append((int(entry.revision), sent))
    out.journal = sum(len(v) for v in seen.values())
    applied = []
    for i in range(f.sent):
        seq, rows = i + 1, seen.get(i + 1, [])
        ack = f.acked[i]
        if ack is not None:
            if len(rows) != 1 or rows[0][0] != ack or rows[0][1] is None or \
                    abs(rows[0][1] - f.sent_times[i]) > 2e-6:
                out.lost += 1
                if out.lost <= 3:
                    out.problems.append(f"feed seq {seq}: acknowledged at revision {ack}, journal "
                                        f"has {rows}")
        elif rows:
            out.applied_refused += 1
            if f.definite[i]:
                out.problems.append(f"feed seq {seq}: refused definitely, yet applied {rows}")
        applied.append(bool(rows))
    extra = sorted(s for s in seen if not 1 <= s <= f.sent)
    if extra:
        out.problems.append(f"the journal holds feed seqs never sent: {extra[:5]}")
    if any(len(v) > 1 for v in seen.values()):
        out.problems.append("a feed seq is in the journal twice")
    if out.lost:
        out.problems.append(f"{out.lost} acknowledged node events lost (not in the journal as "
                            "answered)")
    out.last_seq = int(last_seq.get(f.source, 0))
    last_applied = max((s for s in seen if 1 <= s <= f.sent), default=0)
    if out.last_seq != last_applied:
        out.problems.append(f"last_seq[{f.source}] {out.last_seq} != {last_applied}, the last "
                            "applied feed seq")
    expected = feed.state_after(applied)
    mine = pool & set(feed.node_names)
    out.pool_idle, out.expected_idle = len(mine), len(expected)
    out.pool_missing, out.pool_extra = len(expected - mine), len(mine - expected)
    if out.pool_missing or out.pool_extra:
        out.problems.append(f"idle pool of the log's nodes: {len(mine)} idle, the log's state "
                            f"after the applied events has {len(expected)} ({out.pool_missing} "
                            f"missing, {out.pool_extra} extra, e.g. "
                            f"{sorted((expected - mine) | (mine - expected))[:3]})")
    if f.duplicates:
        out.problems.append(f"{f.duplicates} feed replies were duplicates (a seq applied before)")
    if f.ignored_nodes:
        out.problems.append(f"{f.ignored_nodes} preempted names of feed events were not idle "
                            "(ignored_nodes): the daemon's pool drifted from the log")
    if f.sent_time_not_echoed:
        out.problems.append(f"{f.sent_time_not_echoed} feed replies did not echo the sent time "
                            "(Decision.sent_time)")
    return out


def check_state(address: str, result: LoadResult, timeout_s: float = 600.0) -> StateCheck:
    """Compare the daemon's final state with what the feeder and the clients did; returns the
    differences (empty problems: consistent). Checks: the daemon is on the live clock and its
    clock was not moved ahead by ``submit_time`` s a day ahead; the feeder's events
    (:func:`check_feed`); the clients' idle pools (the idle pool of their nodes is the union of
    the clients' idle sets), the revision is the number of applied node events and
    submissions, ``last_seq`` per source; every submitted task exists exactly once (a retried
    request id returns the same task and changes nothing); tasks hold disjoint idle-pool nodes
    within their limits; each Zeus job has one trial per prediction, and the trials the
    clients saw end are ended. Makes read calls (admin token), one export of the journal and
    one idempotent retry (the submitter's token)."""
    problems: list[str] = []
    runs, tokens = result.runs, result.tokens
    with Client(address, timeout_s=timeout_s, token=tokens.admin) as admin:
        st = admin.status(include_idle_nodes=True)
        checked_at = time.time()
        pool = set(st.idle_node_names)
        if st.clock_mode != "live":
            problems.append(f"the daemon runs clock {st.clock_mode!r}, not live")
        clock = st.clock or 0.0
        if clock > checked_at + 60.0:
            problems.append(f"the daemon's clock is {clock - checked_at:.0f} s ahead of the wall "
                            "clock: a sender's time moved it")
        last_seq = dict(st.last_seq)
        feed_check = check_feed(admin, result, pool, last_seq, timeout_s)
        problems.extend(feed_check.problems)

        expected_pool = set().union(*(r.idle for r in runs if not r.uncertain))
        mine = {n for r in runs if not r.uncertain for n in r.names}
        if {n for n in pool if n in mine} != expected_pool:
            problems.append(f"idle pool: {len(pool & mine)} of the checked clients' nodes, "
                            f"expected {len(expected_pool)}")
        if st.idle_nodes != len(pool):
            problems.append(f"status idle_nodes {st.idle_nodes} != {len(pool)} names")
        if not any(r.uncertain for r in runs) and not feed_check.problems:
            expected_total = len(expected_pool) + feed_check.expected_idle
            if len(pool) != expected_total:
                problems.append(f"idle pool holds {len(pool)} nodes, expected {expected_total}")

        submissions = [s for r in runs for s in r.submissions]
        expected_revision = feed_check.journal + sum(r.events for r in runs) + \
            sum(r.submit_attempts for r in runs)
        if not result.errors and st.revision != expected_revision:
            problems.append(f"revision {st.revision} != {expected_revision} applied state changes")
        seqs = {r.source: r.events for r in runs if r.events}
        others = {s: v for s, v in last_seq.items() if s != result.feed_run.source}
        if others != seqs:
            wrong = sorted(s for s in set(seqs) | set(others) if others.get(s) != seqs.get(s))
            problems.append(f"last_seq differs for {len(wrong)} client sources, e.g. {wrong[:3]}")

        tasks = admin.list_tasks()
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
            owner = name.split("-task")[0]
            with Client(address, timeout_s=timeout_s, token=tokens.user(owner)) as user:
                again = user.submit(tasks_pb2.TaskSpec(**_spec_fields(by_id[tid].spec)),
                                    owner=owner, request_id=rid)
            if again.task.task_id != tid or admin.status().revision != st.revision:
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
            problems.append(f"{st.solver.fallbacks} solver fallbacks "
                            f"({st.solver.last_fallback_reason})")

        for r in runs:
            if not r.latencies_ms.get("zeus_register") or any(e.startswith("zeus_register") for e in r.errors):
                continue
            trials = [{"trial_number": t.trial_number, "status": t.status}
                      for t in admin.zeus_trials(r.source)]  # (GetJob pages the trials)
            if len(trials) != r.predictions:
                problems.append(f"zeus job {r.source}: {len(trials)} trials, {r.predictions} predictions")
                continue
            status = {t["trial_number"]: t["status"] for t in trials}
            if any(status.get(n) == "running" for n in r.ended_trials):
                problems.append(f"zeus job {r.source}: a trial it saw end is still running")
            if r.trial is not None and status.get(r.trial["number"]) != "running":
                problems.append(f"zeus job {r.source}: its open trial is {status.get(r.trial['number'])}")
    return StateCheck(problems, feed_check)


def _spec_fields(spec: tasks_pb2.TaskSpec) -> dict[str, Any]:
    return dict(name=spec.name, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes,
                node_counts=list(spec.node_counts), throughputs=list(spec.throughputs),
                rescale_up_s=spec.rescale_up_s, rescale_down_s=spec.rescale_down_s,
                total_work_samples=spec.total_work_samples)


# ----------------------------------------------------------------------------- the report
def print_report(result: LoadResult, check: StateCheck | None = None,
                 daemon: dict[str, Any] | None = None, title: str = "",
                 log: ResultsLog | None = None) -> None:
    """Print the feeder's block (sent, acknowledged, refused, lost: ``check`` gives the lost
    count, else it reads "not checked"), the per-kind latency table and the throughput lines
    (``daemon``: optional ``rss_mb``, ``peak_rss_mb``, ``cpu_s`` of the daemon process); with
    ``log``, also keep the printed text, as plain text, for its results file."""
    from rich.console import Console
    from rich.table import Table

    s = result.summary()
    console = Console(width=110, record=log is not None)
    lost = str(check.feed.lost) if check is not None else "not checked"
    verdict = "OK" if check is not None and s["feed_refused"] == 0 and check.feed.lost == 0 \
        and not check.feed.problems else "FAILED"
    console.rule(f"Slurm node events ({FEED_SOURCE!r} source): {verdict}", style="bold")
    console.print(f"feed: {s['feed']}", highlight=False, markup=False)
    of_log = f" of {s['feed_events_in_log']} in the log" if s["feed_events_in_log"] else ""
    console.print(f"[bold]node events sent {s['feed_sent']}{of_log}, acknowledged "
                  f"{s['feed_acknowledged']}, refused {s['feed_refused']}, lost {lost}[/bold]")
    if s["feed_refusals"]:
        console.print(f"refusals by status: {s['feed_refusals']}", highlight=False, markup=False)
    if s["feed_sent"]:
        delay = ("none acknowledged" if s["feed_apply_delay_ms_p50"] is None else
                 f"{s['feed_apply_delay_ms_p50']:.1f} ms (p50) / {s['feed_apply_delay_ms_p99']:.1f} "
                 "ms (p99) after the sender's stamp")
        console.print(
            f"{s['feed_node_names']} node names (burst p50 {s['feed_burst_p50']:.0f}, p99 "
            f"{s['feed_burst_p99']:.0f}, max {s['feed_burst_max']}), {s['feed_events_per_s']:.1f} "
            f"events/s; applied at the daemon's receive time: {delay}", highlight=False)
    if check is not None:
        fc = check.feed
        console.print(f"daemon: {fc.journal} feed events in its journal, last_seq[{FEED_SOURCE}] "
                      f"{fc.last_seq}, the log's nodes idle {fc.pool_idle} (the log's state after "
                      f"them: {fc.expected_idle}); {fc.applied_refused} refused ones applied",
                      highlight=False, markup=False)
    console.print(f"load: {s['clients']} clients, {s['wall_s']:.1f} s, stopped by {s['stopped_by']}",
                  highlight=False)

    table = Table(title=title or f"calls: {s['clients']} clients + the slurm feed, {s['wall_s']:.1f} s")
    for col in ("call", "count", "errors", "p50 ms", "p99 ms", "max ms"):
        table.add_column(col, justify="left" if col == "call" else "right")
    for row in result.rows():
        table.add_row(row["kind"], str(row["count"]), str(row["errors"]), f"{row['p50_ms']:.2f}",
                      f"{row['p99_ms']:.2f}", f"{row['max_ms']:.2f}")
    console.print(table)
    line = (f"sustained: {s['events_per_s']:.1f} node events/s ({s['node_events']} events, "
            f"{s['node_names_per_s']:.0f} node names/s), {s['calls_per_s']:.1f} calls/s "
            f"({s['calls']} calls), {s['submissions']} tasks submitted (submit_time "
            + ", ".join(f"{k} {v}" for k, v in s["submit_times"].items())
            + f"), {s['errors']} errors")
    console.print(line, highlight=False)
    if daemon:
        parts = []
        if daemon.get("rss_mb") is not None:
            parts.append(f"RSS {daemon['rss_mb']:.0f} MiB (peak {daemon['peak_rss_mb']:.0f} MiB)")
        if daemon.get("cpu_s") is not None:
            parts.append(f"CPU {daemon['cpu_s']:.1f} s "
                         f"({daemon['cpu_s'] / max(1, s['calls']) * 1e3:.2f} ms per call)")
        console.print("daemon: " + ", ".join(parts), highlight=False)
    if log is not None:
        log.keep(console.export_text())


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


def start_daemon(folder: Path, durability: str, tokens_file: Path) -> tuple[subprocess.Popen, str]:
    """``offcutd`` (live clock, solver dp, bearer tokens from ``tokens_file``) on a unix
    socket in ``folder`` (clients send tokens only over a unix socket or TLS:
    docs/security.md) with its state there; returns (process, address) once it answers
    health checks. Raises Unavailable."""
    address = f"unix://{folder / 'offcutd.sock'}"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(folder / "state.sqlite"),
           "--solver", "dp", "--durability", durability, "--clock", "live",
           "--tokens-file", str(tokens_file), "--log-level", "warning"]
    return start_offcutd(cmd, address, folder / "offcutd.log"), address


# ----------------------------------------------------------------------------- the flood case
#: largest command argument the daemon accepts [characters] (offcut.taskspec)
MAX_ARG_CHARS = 65536
#: the flood case's limit on the feeder's node-event p99 [ms] (issue 37, "Done when")
FLOOD_P99_LIMIT_MS = 100.0


def _state_bytes(path: Path) -> int:
    """The state file's size with its ``-wal`` [bytes] (0 for a part not there)."""
    return sum(q.stat().st_size for q in (path, Path(f"{path}-wal")) if q.exists())


def run_flood(feed: NodeFeed, seconds: float, durability: str,
              say: Callable[[str], None] = print) -> int:
    """The flood case (issue 37, finding 2; docs/security.md, "Round two: what one user makes
    the daemon keep"): beside the feeder's node events, one user submits and cancels tasks
    back to back, each with the largest command ``max_command_bytes`` allows (arguments of
    :data:`MAX_ARG_CHARS`), for ``seconds`` [s] (or until the feed ends). Prints the pairs
    accepted and refused (RESOURCE_EXHAUSTED: the per-owner budget), the daemon's RSS and the
    state file's growth [MiB], and the node events' p50 / p99 latency [ms]. Returns 1 when a
    node event failed, a flood call failed otherwise than RESOURCE_EXHAUSTED, or the p99 is
    :data:`FLOOD_P99_LIMIT_MS` or more; else 0. The figure lines go through ``say`` (a
    :class:`ResultsLog`'s, or print)."""
    from offcut.daemon.config import DaemonConfig
    from offcut.errors import OffcutError, ResourceExhausted

    size = DaemonConfig().max_command_bytes
    command = ["x" * min(MAX_ARG_CHARS, size - at) for at in range(0, size, MAX_ARG_CHARS)]
    spec = tasks_pb2.TaskSpec(name="flood", min_nodes=1, max_nodes=4, node_counts=[0, 1, 2, 4],
                              throughputs=[0.0, 10.0, 18.0, 30.0], total_work_samples=1e6,
                              command=command)
    counts = {"accepted": 0, "refused": 0, "errors": 0, "node_errors": 0}
    latencies: list[float] = []
    with tempfile.TemporaryDirectory(prefix="offcut-flood-") as tmp:
        folder = Path(tmp)
        tokens = make_tokens(folder / "tokens.toml", 1)
        proc, address = start_daemon(folder, durability, folder / "tokens.toml")
        state = folder / "state.sqlite"
        stop = threading.Event()
        try:
            slurm = Client(address, timeout_s=120, token=tokens.slurm)
            user = Client(address, timeout_s=120, token=tokens.user(client_source(0)))
            rss0, state0 = _proc_figures(proc.pid)["rss_mb"], _state_bytes(state)

            def flood() -> None:
                i = 0
                while not stop.is_set():
                    try:
                        task_id = user.submit(spec, request_id=f"flood-{i}").task.task_id
                        user.cancel(task_id)
                        counts["accepted"] += 1
                    except ResourceExhausted:
                        counts["refused"] += 1
                    except OffcutError:
                        counts["errors"] += 1
                    i += 1

            thread = threading.Thread(target=flood, daemon=True)
            thread.start()
            started = time.perf_counter()
            for seq, ev in enumerate(feed.events, start=1):
                if time.perf_counter() - started > seconds:
                    break
                t0 = time.perf_counter()
                try:
                    slurm.report_nodes(time.time(), FEED_SOURCE, seq, idle=ev.idle,
                                       preempted=ev.busy)
                except OffcutError:
                    counts["node_errors"] += 1
                latencies.append((time.perf_counter() - t0) * 1e3)
            stop.set()
            thread.join(timeout=120)
            rss1, state1 = _proc_figures(proc.pid)["rss_mb"], _state_bytes(state)
            slurm.close()
            user.close()
        finally:
            stop.set()
            stop_offcutd(proc)
    lat = np.array(latencies or [0.0])
    p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    say(f"flood: {counts['accepted']} submit+cancel pairs of {size:,}-byte commands accepted, "
        f"{counts['refused']} refused (RESOURCE_EXHAUSTED), {counts['errors']} other errors")
    say(f"daemon RSS {rss0:.0f} -> {rss1:.0f} MiB (+{rss1 - rss0:.0f}); state file "
        f"{state0 / 2**20:.1f} -> {state1 / 2**20:.1f} MiB (+{(state1 - state0) / 2**20:.1f})")
    say(f"node events: {len(latencies)} sent, {counts['node_errors']} failed, p50 {p50:.1f} ms,"
        f" p99 {p99:.1f} ms (limit {FLOOD_P99_LIMIT_MS:g} ms)")
    bad = counts["node_errors"] or counts["errors"] or p99 >= FLOOD_P99_LIMIT_MS
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """Command line: run the load against a private daemon (or ``--address``); exit status 1
    when a node event of the feeder was refused or lost, a call failed or the final state is
    inconsistent."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node-log", type=Path, default=DEFAULT_NODE_LOG,
                    help="node-state log the feeder plays (BFTrainer .tar.gz/.pkl or a safe-format "
                         "folder); absent: a synthetic log of the real burst sizes (default "
                         "%(default)s)")
    ap.add_argument("--allow-pickle", action="store_true",
                    help="load a --node-log pickle other than the default (loading runs code)")
    ap.add_argument("--max-events", type=int, help="feed the first N events (default: all)")
    ap.add_argument("--skip-rows", type=int, default=0,
                    help="start at this log row; its idle set is the first event (default 0)")
    ap.add_argument("--speedup", type=float,
                    help="feed at the log's pace divided by this (default: as fast as the daemon "
                         "answers)")
    ap.add_argument("--duration", type=float,
                    help="stop the load after this many seconds (default: at the end of the feed)")
    ap.add_argument("--clients", type=int, default=64, help="user threads (default 64)")
    ap.add_argument("--client-rate", type=float, default=2.0,
                    help="operations per second of each client, Poisson (default 2; 0: back to "
                         "back, as fast as the daemon answers)")
    ap.add_argument("--mix", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_MIX.items()),
                    help="the clients' operation weights (default %(default)s)")
    ap.add_argument("--burst-max", type=int, default=761,
                    help="largest client node event (default 761, the real log's p99)")
    ap.add_argument("--big-burst-p", type=float, default=0.1,
                    help="probability that a later client node event has --burst-max nodes")
    ap.add_argument("--nodes-per-client", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--durability", choices=("full", "normal"), default="full")
    ap.add_argument("--progress", type=float, default=10.0,
                    help="seconds between progress lines (0: none; default 10)")
    ap.add_argument("--address", help="drive this running live daemon (fresh state) instead of a "
                                      "private one")
    ap.add_argument("--token-file", type=Path,
                    help="with --address: an admin token for every call (default: none)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--flood", type=float, metavar="SECONDS",
                    help="the flood case instead (run_flood): one user submits and cancels "
                         "tasks with the largest allowed command beside the node events for "
                         "this many seconds; prints RSS, state-file growth, node-event p99")
    add_option(ap)
    args = ap.parse_args(argv)
    log = ResultsLog.from_args("load", args, argv)
    try:
        mix = {k.strip(): float(v) for k, v in (item.split("=") for item in args.mix.split(","))}
    except ValueError:
        ap.error(f"--mix: {args.mix!r} is not NAME=WEIGHT,...")
    try:
        cfg = LoadConfig(clients=args.clients, client_rate=args.client_rate or None,
                         duration_s=args.duration, speedup=args.speedup,
                         burst_max=args.burst_max, big_burst_p=args.big_burst_p,
                         nodes_per_client=args.nodes_per_client, seed=args.seed, mix=mix,
                         progress_s=args.progress or None)
    except ValueError as exc:
        ap.error(str(exc))
    t_load = time.perf_counter()
    feed = default_feed(args.node_log, max_events=args.max_events, skip_rows=args.skip_rows,
                        allow_pickle=True if args.allow_pickle else None, seed=args.seed)
    log.say(f"feed: {feed.description}: {len(feed.events)} events to send "
            f"({time.perf_counter() - t_load:.1f} s to load)")
    if feed.synthetic:
        log.say("NOTE: the real node log is absent; the feeder plays a SYNTHETIC log of its "
                "burst-size distribution")
    if args.flood is not None:
        rc = run_flood(feed, args.flood, args.durability, log.say)
        log.finish()
        return rc
    proc = None
    with tempfile.TemporaryDirectory(prefix="offcut-load-") as tmp:
        if args.address:
            address = args.address
            token = args.token_file.read_text().strip() if args.token_file else None
            tokens = Tokens(admin=token, slurm=token)
        else:
            tokens = make_tokens(Path(tmp) / "tokens.toml", cfg.clients)
            proc, address = start_daemon(Path(tmp), args.durability, Path(tmp) / "tokens.toml")
        try:
            before = _proc_figures(proc.pid) if proc else {}
            result = run_load(address, cfg, feed, tokens)
            daemon = _proc_figures(proc.pid) if proc else None
            if daemon and before.get("cpu_s") is not None and daemon.get("cpu_s") is not None:
                daemon["cpu_s"] -= before["cpu_s"]
            print("checking the final state (journal export) ...", flush=True)
            check = check_state(address, result)
        finally:
            if proc is not None:
                stop_offcutd(proc)
    print_report(result, check, daemon, log=log)
    for e in result.errors[:20]:
        log.say(f"ERROR {e}")
    log.say("final state: " + ("consistent" if not check.problems else "; ".join(check.problems)))
    log.finish()
    if args.json:
        args.json.write_text(json.dumps(dict(
            config=asdict(cfg), summary=result.summary(), feed_check=asdict(check.feed),
            calls=result.rows(), daemon=daemon, errors=result.errors,
            problems=check.problems), indent=2, default=str))
    bad = result.feed_run.refused or check.feed.lost or result.errors or check.problems
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

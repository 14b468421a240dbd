"""Prometheus metrics of the daemon: a ``/metrics`` HTTP endpoint (docs/metrics.md).

Three parts, all on one :class:`prometheus_client.CollectorRegistry` per daemon (never the
process-global one, so several daemons can share a process):

* :class:`EngineCollector` reads the engine's figures at scrape time, under the engine's lock;
  the event path (``Engine.apply``) does no metrics work at all;
* :class:`RpcMetricsInterceptor` counts every finished RPC by method and status code and times it;
* :class:`MetricsEndpoint` serves the registry over HTTP (``prometheus_client.start_http_server``).

Units follow the Prometheus conventions: seconds, samples, nodes; counters end in ``_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from offcut.daemon.app.decision_times import LATENCY_BUCKETS_S, DecisionTimeSummary
from offcut.daemon.app.engine import Engine
from offcut.daemon.edge.handlers import ASYNC_GENERATOR, COROUTINE, SYNC, kind_of, wrapped
from offcut.views import TaskState
from offcut.daemon.app.replies import energy_view
from offcut.views import MEASURED, MODELLED, StatusView
from offcut.daemon.zeus.registry import ZeusRegistry

log = logging.getLogger("offcut.daemon")


@dataclass(frozen=True)
class _EngineFigures:
    """What :class:`EngineCollector` copies under the engine's lock: the Status reply's
    figures (tasks by state, node counts, accounting), the event clock [s since epoch, None
    before the first event], the modelled rate [samples/s] and power [W] of the running
    tasks, the fallback count, solves by backend, the summaries of the decision times and
    of the snapshots' hold times, and per energy source (``measured`` | ``modelled``) the
    joules [J] and samples of the tasks in the state."""

    status: StatusView
    clock: float | None
    rate: float
    power: float
    energy_by_source: dict[str, tuple[float, float]]
    fallbacks: int
    solves_by_backend: dict[str, int]
    decisions: DecisionTimeSummary
    snapshots: DecisionTimeSummary
    #: (policy, kind) -> decisions that fell back to throughput (PolicyGuard.fallbacks)
    policy_fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)


class EngineCollector(Collector):
    """Engine, scheduler and Zeus figures read at scrape time (a custom Prometheus collector).

    Args:
        engine: the daemon's engine; its lock is held while the figures are copied.
        zeus: the Zeus optimizer registry (optional; adds the ``offcut_zeus_*`` gauges).
    """

    def __init__(self, engine: Engine, zeus: ZeusRegistry | None = None):
        self.engine = engine
        self.zeus = zeus

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families (see docs/metrics.md for units and meanings)."""
        figures = self._copy()
        yield from _state_families(figures)
        yield from _energy_families(figures)
        yield from _counter_families(figures)
        if self.zeus is not None:
            yield from self._zeus_families()

    def _copy(self) -> _EngineFigures:
        """The engine's figures, copied under its lock (the event path waits on it)."""
        engine = self.engine
        with engine.lock:  # copy only; the event path waits on this lock
            scheduler = engine.scheduler
            # the Status reply's own figures (tasks by state, node counts, accounting)
            st = engine.status(include_idle=False, with_solver=False)
            clock = scheduler.clock
            running = [t for t in scheduler.active.values() if t.state is TaskState.RUNNING]
            rate = float(sum(t.rate for t in running))
            power = float(sum(t.power for t in running))
            energy_by_source = _energy_by_source(scheduler.tasks.values())
            fallbacks, solves_by_backend = engine.fallbacks, dict(engine.solves_by_backend)
            decisions = engine.decision_times.summary()
            snapshots = engine.snapshot_times.summary()
            policy_fallbacks = dict(engine.policy_guard.fallbacks)
        return _EngineFigures(st, clock, rate, power, energy_by_source, fallbacks,
                              solves_by_backend, decisions, snapshots, policy_fallbacks)

    def _zeus_families(self) -> Iterator[Metric]:
        """The ``offcut_zeus_*`` gauges (counts copied under the registry's lock)."""
        with self.zeus.lock:
            jobs, profiles = len(self.zeus.jobs), len(self.zeus.profiles)
        yield GaugeMetricFamily("offcut_zeus_jobs", "Registered Zeus batch-size optimizer jobs",
                                value=jobs)
        yield GaugeMetricFamily("offcut_zeus_power_profiles",
                                "Zeus power-limit profiles (one per job and batch size)",
                                value=profiles)


def _energy_by_source(tasks) -> dict[str, tuple[float, float]]:
    """(joules [J], samples) summed over ``tasks`` by the source of each task's shown energy
    (:func:`~offcut.daemon.app.replies.energy_view`: measured by its processes, else modelled)."""
    sums = {MEASURED: [0.0, 0.0], MODELLED: [0.0, 0.0]}
    for task in tasks:
        view = energy_view(task)
        sums[view.source][0] += view.joules
        sums[view.source][1] += view.samples_per_joule * view.joules  # its samples
    return {source: (j, n) for source, (j, n) in sums.items()}


def _energy_families(figures: _EngineFigures) -> Iterator[Metric]:
    """The tasks' energy [J] and samples per joule by source (docs/metrics.md)."""
    joules = GaugeMetricFamily(
        "offcut_task_energy_by_source_joules",
        "Energy of the tasks in the daemon's state (running, and finished within "
        "finished_task_retention_s) by source: measured = summed from their processes' GPU "
        "measurements (ReportEnergy), modelled = the daemon's estimate for the tasks without "
        "any, J", labels=["source"])
    per_joule = GaugeMetricFamily(
        "offcut_task_samples_per_joule",
        "Samples per joule of the same tasks by source (their samples / their joules; 0 "
        "without joules), samples/J", labels=["source"])
    for source in (MEASURED, MODELLED):
        j, n = figures.energy_by_source[source]
        joules.add_metric([source], j)
        per_joule.add_metric([source], n / j if j > 0 else 0.0)
    yield joules
    yield per_joule


def _state_families(figures: _EngineFigures) -> Iterator[Metric]:
    """Gauges of the current state: nodes, tasks, rate [samples/s], samples, energy [J],
    power [W], revision, event clock [s]."""
    st = figures.status
    yield GaugeMetricFamily("offcut_idle_nodes",
                            "Nodes in the idle pool (held by a task or free), nodes",
                            value=st.idle_nodes)
    yield GaugeMetricFamily("offcut_nodes_in_use", "Idle-pool nodes held by a task, nodes",
                            value=st.nodes_in_use)
    yield GaugeMetricFamily("offcut_nodes_awaiting_launch",
                            "Nodes held for generations no launcher reported started (the "
                            "previous generation stops, or Slurm has not started the jobs), "
                            "nodes", value=st.nodes_awaiting_launch)
    tasks = GaugeMetricFamily("offcut_tasks", "Tasks by state, tasks", labels=["state"])
    for state in TaskState:
        tasks.add_metric([state.value], st.tasks_by_state[state])
    yield tasks
    yield GaugeMetricFamily("offcut_rate_samples_per_second",
                            "Sum of the modelled throughputs of running tasks, samples/s",
                            value=figures.rate)
    yield GaugeMetricFamily(
        "offcut_samples_net",
        "Net samples earned by all tasks: progress minus rescale and preemption costs; "
        "can decrease (preemption costs), so a gauge, samples", value=st.total_samples)
    yield GaugeMetricFamily(
        "offcut_energy_joules",
        "Energy of the idle pool while Offcut ran it: tasks' nodes (reported, or modelled "
        "between reports) plus unused idle nodes at idle_node_power_w, J",
        value=st.energy_j)
    yield GaugeMetricFamily("offcut_task_energy_joules",
                            "Energy drawn by the tasks' nodes, J", value=st.task_energy_j)
    yield GaugeMetricFamily("offcut_samples_per_joule",
                            "offcut_samples_net / offcut_energy_joules, samples/J",
                            value=st.total_samples / st.energy_j if st.energy_j > 0 else 0.0)
    yield GaugeMetricFamily("offcut_power_watts",
                            "Sum of the modelled power of running tasks, W", value=figures.power)
    yield GaugeMetricFamily("offcut_revision", "Revision of the cluster state (applied events)",
                            value=st.revision)
    clock_family = GaugeMetricFamily(
        "offcut_event_clock_seconds",
        "Time of the last applied event (event time, not wall time), s since the epoch; "
        "absent before the first event")
    if figures.clock is not None:
        clock_family.add_metric([], figures.clock)
    yield clock_family


def _counter_families(figures: _EngineFigures) -> Iterator[Metric]:
    """Counters since the start: node time [node-s], fallbacks, solves by backend, and the
    decision-time histogram [s]."""
    st = figures.status
    yield CounterMetricFamily("offcut_idle_node_seconds_total",
                              "Idle-pool node time accrued between events, node-s",
                              value=st.idle_node_seconds)
    yield CounterMetricFamily("offcut_used_node_seconds_total",
                              "Idle-pool node time held by tasks, node-s",
                              value=st.used_node_seconds)
    yield CounterMetricFamily("offcut_solver_fallbacks_total",
                              "Allocations answered by a fallback backend since the daemon "
                              "started", value=figures.fallbacks)
    solves = CounterMetricFamily("offcut_solves_total",
                                 "Allocation problems solved since the daemon started, by "
                                 "the backend that answered", labels=["backend"])
    for backend, n in sorted(figures.solves_by_backend.items()):
        solves.add_metric([backend], n)
    yield solves
    policy = CounterMetricFamily(
        "offcut_policy_fallbacks_total",
        "Decisions of an allocation policy that used 'throughput' instead since the daemon "
        "started, by policy and kind: error (it raised), answer (counts or a solve() argument "
        "it may not give), timeout (over its time limit: then disabled), disabled",
        labels=["policy", "kind"])
    for (name, kind), n in sorted(figures.policy_fallbacks.items()):
        policy.add_metric([name, kind], n)
    yield policy
    yield _histogram("offcut_decision_seconds",
                     "Wall time of each decision (event in, allocation solved, journal "
                     "committed) since the daemon started, s", figures.decisions)
    yield _histogram("offcut_snapshot_seconds",
                     "How long each snapshot written at an event held events back under the "
                     "engine's lock (building it, committing it with its event's journal row, "
                     "the retention after it) since the daemon started, s", figures.snapshots)


def _histogram(name: str, documentation: str, times: DecisionTimeSummary) -> Metric:
    """A Prometheus histogram of ``times`` (its cumulative buckets and sum)."""
    return HistogramMetricFamily(
        name, documentation,
        buckets=[("+Inf" if bound == float("inf") else floatToGoString(bound), float(n))
                 for bound, n in times.buckets],
        sum_value=times.sum_s)


class _CodeRecorder:
    """A synchronous servicer context that remembers the status code its handler aborted
    with or set (``grpc.aio``'s context for plain handlers cannot be asked afterwards)."""

    def __init__(self, context):
        self._context = context
        self.code: grpc.StatusCode | None = None

    def abort(self, code, details="", *args):
        """Record ``code``, then abort as the wrapped context does (raises)."""
        self.code = code
        return self._context.abort(code, details, *args)

    def set_code(self, code) -> None:
        """Record ``code`` and set it."""
        self.code = code
        self._context.set_code(code)

    def __getattr__(self, name):
        return getattr(self._context, name)


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts finished RPCs by method and status code and times them (a ``grpc.aio`` server
    interceptor).

    Metrics (on ``registry``): ``offcut_rpc_requests_total{method, code}`` and
    ``offcut_rpc_duration_seconds{method}`` [s]; for streaming responses the duration is the
    stream's lifetime. ``method`` is the full gRPC name (``/offcut.v1.Tasks/SubmitTask``); calls
    to unknown methods are not counted (their names come from the client). The code is the
    one the handler aborted with or set; otherwise OK, CANCELLED when the client went away
    from an asyncio behaviour (a stream), UNKNOWN for an uncaught exception.
    """

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter("offcut_rpc_requests_total",
                                "Finished RPCs by gRPC method and status code",
                                ["method", "code"], registry=registry)
        self.duration = Histogram("offcut_rpc_duration_seconds",
                                  "RPC handling time (stream lifetime for streaming responses), s",
                                  ["method"], buckets=LATENCY_BUCKETS_S, registry=registry)
        #: method -> (the handler the inner interceptors gave, that handler recorded): the same
        #: handler object comes back for a method on every call unless authentication wraps
        #: it per call, so it is wrapped once; None once a method's handler was seen to change
        #: (made per call: wrapped per call, nothing kept, so no caller's call context is
        #: held). One entry per registered method: unknown methods have no handler.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler] | None] = {}
        #: the labelled children already looked up (``labels`` costs a lock and a key per call)
        self._counters: dict[tuple[str, grpc.StatusCode], Counter] = {}
        self._timers: dict[str, Histogram] = {}

    def _record(self, method: str, code: grpc.StatusCode | None, started: float,
                failed: bool, cancelled: bool = False) -> None:
        if code is None:
            if cancelled:
                code = grpc.StatusCode.CANCELLED
            else:
                code = grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK
        counter = self._counters.get((method, code))
        if counter is None:  # (registered methods x status codes: a bounded table)
            counter = self._counters[(method, code)] = self.requests.labels(method, code.name)
        timer = self._timers.get(method)
        if timer is None:
            timer = self._timers[method] = self.duration.labels(method)
        counter.inc()
        timer.observe(time.perf_counter() - started)

    def _sync(self, method: str, behavior: Callable) -> Callable:
        """A plain behaviour (a worker thread's), recorded when it returns or raises."""
        @functools.wraps(behavior)
        def wrapper(request, context):
            started, failed = time.perf_counter(), True
            recorder = _CodeRecorder(context)
            try:
                response = behavior(request, recorder)
                failed = False
                return response
            finally:
                self._record(method, recorder.code, started, failed)
        return wrapper

    def _coroutine(self, method: str, behavior: Callable) -> Callable:
        """A coroutine behaviour (a unary asyncio handler, or a stream written with
        ``context.write``), recorded when it ends: aborted, failed, cancelled or done."""
        @functools.wraps(behavior)
        async def wrapper(request, context):
            started, failed, cancelled = time.perf_counter(), True, False
            try:
                result = await behavior(request, context)
                failed = False
                return result
            except asyncio.CancelledError:  # the client went away (or the server stops)
                cancelled = True
                raise
            finally:
                self._record(method, context.code(), started, failed, cancelled)
        return wrapper

    def _async_generator(self, method: str, behavior: Callable) -> Callable:
        """An async generator behaviour (server reflection), recorded when it ends."""
        @functools.wraps(behavior)
        async def wrapper(request, context):
            started, failed, cancelled = time.perf_counter(), True, False
            try:
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        yield response
                failed = False
            except (asyncio.CancelledError, GeneratorExit):  # the client went away
                cancelled = True
                raise
            finally:
                self._record(method, context.code(), started, failed, cancelled)
        return wrapper

    async def intercept_service(self, continuation, handler_call_details):
        """Wrap the method's handler (every arity and kind of behaviour) so that it records
        when it finishes."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        seen = method in self._wrapped
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrap = {SYNC: self._sync, COROUTINE: self._coroutine,
                ASYNC_GENERATOR: self._async_generator}
        recorded = wrapped(handler, lambda behavior: wrap[kind_of(behavior)](method, behavior))
        if handler is not None:
            self._wrapped[method] = None if seen else (handler, recorded)
        return recorded


class MetricsEndpoint:
    """A running HTTP server answering ``GET /metrics`` from ``registry``.

    Args:
        registry: what to serve.
        host: address to bind (IPv6 without brackets).
        port: TCP port; 0 = any free port (see :attr:`port`).

    Raises:
        OSError: the address cannot be bound (port in use, unknown host).
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self.host = host
        self._httpd, self._thread = start_http_server(port, host, registry=registry)
        #: the bound TCP port
        self.port: int = int(self._httpd.server_port)

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop serving and close the socket (waits up to ``timeout_s`` [s] for the thread)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout_s)


class DaemonMetrics:
    """Everything a daemon exports: its registry, the engine collector and the RPC interceptor.

    Args:
        engine: the daemon's engine.
        zeus: the Zeus optimizer registry (optional).
    """

    def __init__(self, engine: Engine, zeus: ZeusRegistry | None = None):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, zeus))
        self.interceptor = RpcMetricsInterceptor(self.registry)

    def serve(self, host: str, port: int) -> MetricsEndpoint:
        """Start the HTTP endpoint on ``host:port`` (0 = any free port). Raises OSError."""
        return MetricsEndpoint(self.registry, host, port)

"""Tests of the Prometheus endpoint (docs/metrics.md): figures scraped over real HTTP from a
real daemon match its Status reply; RPCs are counted by method and status code; the endpoint
is only opened when configured; configuration and bind errors are clear."""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from offcut.daemon.__main__ import app as offcutd_app
from offcut.daemon.config import ConfigError, load_config, split_host_port
from offcut.daemon.edge.metrics import RpcMetricsInterceptor
from offcut.errors import InvalidArgument, NotFound
from offcut.v1 import tasks_pb2

from daemon_helpers import T0, make_spec

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

TASKS = "/offcut.v1.Tasks/"


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` from the live endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def metered(daemons):
    return daemons.start(metrics_listen="127.0.0.1:0")


def test_gauges_follow_status(metered):
    srv, c = metered
    assert srv.metrics_port and srv.metrics_port > 0
    m = scrape(srv.metrics_port)
    assert value(m, "offcut_idle_nodes") == 0 and value(m, "offcut_revision") == 0
    assert ("offcut_event_clock_seconds", ()) not in m  # no event yet
    assert [value(m, "offcut_tasks", state=s) for s in ("queued", "admitted", "running")] == [0] * 3

    a = c.submit(make_spec("a"), submit_time=T0).task.task_id
    c.submit(make_spec("b", max_nodes=2), submit_time=T0 + 1)
    c.report_nodes(T0 + 2, "w", 1, idle=["n1", "n2", "n3", "n4", "n5", "n6", "n7"])
    c.report_nodes(T0 + 30, "w", 2, preempted=["n1"])
    m = scrape(srv.metrics_port)
    st = c.status()
    assert value(m, "offcut_idle_nodes") == st.idle_nodes == 6
    assert value(m, "offcut_nodes_in_use") == st.nodes_in_use > 0
    assert value(m, "offcut_revision") == st.revision == 4
    assert value(m, "offcut_event_clock_seconds") == pytest.approx(T0 + 30)
    assert value(m, "offcut_tasks", state="running") == st.running_tasks == 2
    assert value(m, "offcut_samples_net") == pytest.approx(st.total_samples)
    assert st.idle_node_seconds > 0 and st.used_node_seconds > 0
    assert value(m, "offcut_idle_node_seconds_total") == pytest.approx(st.idle_node_seconds)
    assert value(m, "offcut_used_node_seconds_total") == pytest.approx(st.used_node_seconds)
    assert st.last_decision.stats.rate_samples_per_s > 0
    assert value(m, "offcut_rate_samples_per_second") == pytest.approx(
        st.last_decision.stats.rate_samples_per_s)
    assert value(m, "offcut_solves_total", backend="dp") == st.solver.solves_by_backend["dp"] > 0
    assert value(m, "offcut_solver_fallbacks_total") == st.solver.fallbacks == 0

    # decision histogram: one observation per decision in Status, cumulative buckets in seconds
    count = value(m, "offcut_decision_seconds_count")
    assert count == st.solver.decisions > 0
    buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in m.items()
                      if k[0] == "offcut_decision_seconds_bucket"))
    assert buckets[-1] == (float("inf"), count)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    total_s = value(m, "offcut_decision_seconds_sum")  # seconds, not milliseconds
    assert 0 < total_s <= count * st.solver.decision_ms_max / 1000 * (1 + 1e-9)

    # tasks by state after a cancel
    c.cancel(a, time=T0 + 40)
    m = scrape(srv.metrics_port)
    assert value(m, "offcut_tasks", state="cancelled") == 1
    assert value(m, "offcut_tasks", state="running") == 1
    assert value(m, "offcut_revision") == c.status().revision == 5


def test_snapshot_hold_times_are_counted_per_snapshot_in_status_and_metrics(daemons):
    srv, c = daemons.start(metrics_listen="127.0.0.1:0", snapshot_every=3)
    assert c.status().snapshots.count == 0
    c.submit(make_spec("a", max_nodes=4), submit_time=T0)  # revision 1
    for k in range(2, 8):  # revisions 2..7: snapshots with the events of revisions 3 and 6
        c.report_nodes(T0 + k, "w", k - 1, idle=[f"n{k}"])
    snaps = c.status().snapshots
    assert snaps.count == 2 and snaps.last_revision == 6
    assert 0 < snaps.last_ms <= snaps.ms_max * (1 + 1e-9)
    assert 0 < snaps.ms_p50 <= snaps.ms_p99 <= snaps.ms_max * (1 + 1e-9)
    m = scrape(srv.metrics_port)
    assert value(m, "offcut_snapshot_seconds_count") == 2
    assert 0 < value(m, "offcut_snapshot_seconds_sum") <= 2 * snaps.ms_max / 1000 * (1 + 1e-9)
    c.report_nodes(T0 + 9, "w", 7, idle=["n9"])  # revision 8: no snapshot
    assert c.status().snapshots.count == 2


def test_rpc_requests_by_method_and_code(metered):
    srv, c = metered
    before = scrape(srv.metrics_port)
    with pytest.raises(InvalidArgument):
        c.submit(make_spec("bad", max_nodes=0), submit_time=T0)
    with pytest.raises(NotFound):
        c.get_task("t999999")
    with pytest.raises(NotFound):
        c.cancel("t999999", time=T0)
    with pytest.raises(NotFound):  # unary-stream handler
        next(iter(c.watch(task_id="t999999", timeout_s=5)))
    c.submit(make_spec("ok"), submit_time=T0)
    after = scrape(srv.metrics_port)

    def delta(method, code):
        return (value(after, "offcut_rpc_requests_total", method=TASKS + method, code=code)
                - value(before, "offcut_rpc_requests_total", method=TASKS + method, code=code))

    assert delta("SubmitTask", "INVALID_ARGUMENT") == 1
    assert delta("SubmitTask", "OK") == 1
    assert delta("GetTask", "NOT_FOUND") == 1
    assert delta("CancelTask", "NOT_FOUND") == 1
    assert delta("WatchPlacements", "NOT_FOUND") == 1
    assert delta("GetTask", "OK") == 0
    assert value(after, "offcut_rpc_duration_seconds_count", method=TASKS + "SubmitTask") == 2
    assert value(after, "offcut_rpc_requests_total", method="/grpc.health.v1.Health/Check",
                 code="OK") >= 1  # wait_ready


class _SyncContext:
    """The calls a plain (worker-thread) handler makes on its context here."""

    def __init__(self):
        self.code = None

    def set_code(self, code):
        self.code = code


class _AsyncContext:
    """The asyncio servicer context's calls the interceptor and a streaming handler use."""

    def __init__(self):
        self.written = asyncio.Event()

    def code(self):
        return None

    async def write(self, message):
        self.written.set()


def test_interceptor_codes_for_crashes_and_cancelled_streams():
    registry = CollectorRegistry()
    icpt = RpcMetricsInterceptor(registry)

    def crash(request, context):
        raise ValueError("bug")

    def crash_with_code(request, context):
        context.set_code(grpc.StatusCode.INTERNAL)
        raise ValueError("bug")

    async def endless(request, context):  # a stream (coroutine, context.write) left open
        await context.write(1)
        await asyncio.Event().wait()

    async def short(request, context):
        await context.write(1)
        await context.write(2)

    with pytest.raises(ValueError):
        icpt._sync("/x/Crash", crash)(None, _SyncContext())
    with pytest.raises(ValueError):
        icpt._sync("/x/Crash", crash_with_code)(None, _SyncContext())

    async def streams():
        context = _AsyncContext()
        call = asyncio.ensure_future(icpt._coroutine("/x/Stream", endless)(None, context))
        await context.written.wait()
        call.cancel()  # what grpc.aio does when the client goes away mid-stream
        with pytest.raises(asyncio.CancelledError):
            await call
        await icpt._coroutine("/x/Stream", short)(None, _AsyncContext())

    asyncio.run(streams())

    def count(method, code):
        return registry.get_sample_value("offcut_rpc_requests_total",
                                         {"method": method, "code": code})

    assert count("/x/Crash", "UNKNOWN") == 1 and count("/x/Crash", "INTERNAL") == 1
    assert count("/x/Stream", "CANCELLED") == 1 and count("/x/Stream", "OK") == 1


def _listening_tcp_sockets() -> set[int]:
    """Inodes of this process's listening TCP sockets (Linux /proc)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(int(target[8:-1]))
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if Path(table).exists():
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":  # TCP_LISTEN
                    listening.add(int(f[9]))
    return mine & listening


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
def test_no_endpoint_without_metrics_listen(daemons):
    before = _listening_tcp_sockets()
    srv, c = daemons.start()
    assert srv.metrics_port is None and srv.metrics_endpoint is None
    assert c.status().revision == 0  # RPCs work (the interceptor is installed regardless)
    assert _listening_tcp_sockets() == before


def test_port_in_use_is_a_clear_error(daemons):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"metrics_listen 127.0.0.1:{port}"):
            daemons.start(metrics_listen=f"127.0.0.1:{port}")
    # the failed daemon released its state file and socket: the same one starts cleanly
    srv, c = daemons.start(metrics_listen="127.0.0.1:0")
    assert c.status().revision == 0
    port = srv.metrics_port
    daemons.stop(srv)
    with pytest.raises(OSError):  # stop() closed the endpoint
        scrape(port)


@pytest.mark.parametrize("bad", ["9100", ":9100", "localhost:", "host:65536", "host:-1",
                                 "::1:9100", "a b:80", "[]:80"])
def test_metrics_listen_validation(bad):
    with pytest.raises(ConfigError, match="metrics_listen"):
        load_config(None, {"metrics_listen": bad})


def test_split_host_port():
    assert split_host_port("127.0.0.1:0") == ("127.0.0.1", 0)
    assert split_host_port("[::1]:9464") == ("::1", 9464)
    assert split_host_port("metrics.example:65535") == ("metrics.example", 65535)
    assert load_config(None, {}).metrics_listen is None


def test_cli_flag():
    out = CliRunner().invoke(offcutd_app, ["--help"])
    assert out.exit_code == 0 and "--metrics-listen" in out.output
    assert "[metrics_listen]" in out.output
    out = CliRunner().invoke(offcutd_app, ["--metrics-listen", "nope"])
    assert out.exit_code == 2 and "metrics_listen" in out.output

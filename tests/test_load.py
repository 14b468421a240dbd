"""The bounded load test (docs/security.md, "Time"): a live daemon (bearer
tokens, TCP loopback) gets Slurm's node events -- 120 events of the real node log at their real
burst sizes (up to 1,002 nodes), or, without ../shared/data (CI), a synthetic log of the real
log's burst-size distribution -- from a ``slurm`` feeder, while 16 users, back to back
(the daemon saturated), submit tasks (with
``submit_time`` unset, their own clock or a day ahead), read status and tasks, run Zeus steps
and send node events of their own sources. No node event of Slurm's may be refused or lost, no
call may fail, and the final state must be exactly what was done. The load and the checks are
``benchmarks/load.py`` (which runs 64 clients over the whole log); latencies are printed
(``pytest -s``), not asserted."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from grpc_health.v1 import health_pb2

from offcut.client import Client
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer

from daemon_helpers import load_benchmark

EVENTS = 120
CLIENTS = 16


def _harness():
    return load_benchmark("load")


def test_slurm_node_events_are_never_refused_or_lost_under_submit_load(tmp_path):
    load = _harness()
    # the real log, else a synthetic one (its description says so); seed 2 has a 986-node burst
    feed = load.default_feed(max_events=EVENTS, seed=2)
    print(feed.description)
    tokens = load.make_tokens(tmp_path / "tokens.toml", CLIENTS)
    cfg = load.LoadConfig(clients=CLIENTS, client_rate=None, burst_max=200, nodes_per_client=400,
                          seed=5, timeout_s=60.0)  # clients back to back: the daemon saturated
    # a unix socket: clients send tokens only over a unix socket or TLS (docs/security.md)
    srv = OffcutServer(DaemonConfig(listen=f"unix://{tmp_path}/offcutd.sock",
                                    state=str(tmp_path / "state.sqlite"),
                                    solver="dp", tokens_file=str(tmp_path / "tokens.toml")))
    srv.start()
    try:
        address = srv.address
        result = load.run_load(address, cfg, feed, tokens)
        check = load.check_state(address, result, timeout_s=120.0)
        load.print_report(result, check, title=f"load test: {CLIENTS} clients + the slurm feed "
                                               f"({EVENTS} events), {result.wall_s:.1f} s")
        f = result.feed_run
        assert (f.sent, f.acknowledged, f.refused) == (EVENTS, EVENTS, 0), f.errors[:3]
        assert (check.feed.lost, check.feed.journal, check.feed.last_seq) == (0, EVENTS, EVENTS)
        assert check.feed.pool_idle == check.feed.expected_idle == \
            len(feed.state_after([True] * EVENTS))
        assert check.problems == []
        assert result.errors == []
        assert f.sent_time_not_echoed == 0 and f.duplicates == 0 and f.ignored_nodes == 0

        # the load was what it claims: real burst sizes, every call kind, the clients busy
        # while the feed ran, submit times that used to move the clock
        assert feed.sizes().max() >= 761 and np.median(feed.sizes()) <= 5
        counts = {row["kind"]: row["count"] for row in result.rows()}
        assert set(counts) == set(load.KINDS)
        assert counts["zeus_register"] == CLIENTS
        assert all(r.operations >= len(cfg.mix) for r in result.runs)
        assert result.calls - f.sent >= f.sent
        assert result.summary()["submit_times"]["day_ahead"] > 0

        with Client(address, timeout_s=30, token=tokens.admin) as admin:
            st = admin.status(include_idle_nodes=True)
            assert st.clock_mode == "live" and st.solver.fallbacks == 0
            assert admin.health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
            # the check has teeth: an acknowledged event the daemon does not have is lost
            ghost = dataclasses.replace(f, sent_times=[*f.sent_times, time.time()],
                                        acked=[*f.acked, st.revision + 1000],
                                        definite=[*f.definite, True])
            teeth = load.check_feed(admin, dataclasses.replace(result, feed_run=ghost),
                                    set(st.idle_node_names), dict(st.last_seq), timeout_s=120.0)
            assert teeth.lost == 1 and teeth.problems
    finally:
        srv.stop(0.5)


def test_without_the_real_log_the_feed_is_synthetic_with_its_burst_sizes(tmp_path):
    load = _harness()
    feed = load.default_feed(tmp_path / "absent.tar.gz", max_events=5000, seed=1)
    assert feed.synthetic and "absent" in feed.description and len(feed.events) == 5000
    sizes = feed.sizes()
    # the real log: median 4, 33 % single nodes, p99 761 nodes per event
    assert 3 <= np.median(sizes) <= 5
    assert 0.28 <= np.mean(sizes == 1) <= 0.38
    assert 400 <= np.percentile(sizes, 99) <= 1100
    # every event is valid in order: it frees busy nodes and takes back idle ones
    idle: set[str] = set()
    for ev in feed.events:
        assert ev.size >= 1
        assert not set(ev.idle) & idle and set(ev.busy) <= idle
        idle = (idle | set(ev.idle)) - set(ev.busy)
    assert idle == feed.state_after([True] * len(feed.events))

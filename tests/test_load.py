"""A bounded load test (issue 5 item 4): 64 concurrent clients against a real daemon on TCP
loopback, mixing node-event bursts as large as the real log's p99 event (761 nodes), task
submissions with request ids, reads and Zeus batch-size calls. The load and the final-state
checks are ``benchmarks/load.py`` (which runs it longer and reports sustained events/s); here a
fixed number of operations. No call may fail and the final state must be exactly what the
clients did; latencies are printed (``pytest -s``), not asserted."""

from __future__ import annotations


from grpc_health.v1 import health_pb2

from offcut.client import Client
from offcut.daemon.config import DaemonConfig
from offcut.daemon.server import OffcutServer

from daemon_helpers import load_benchmark


def _harness():
    return load_benchmark("load")


def test_64_clients_mixed_load_without_errors_and_consistent_state(tmp_path):
    load = _harness()
    cfg = load.LoadConfig(clients=64, rounds=5, duration_s=None, ops_per_round=4,
                          burst_max=761, big_burst_p=0.1, nodes_per_client=1000, seed=5)
    srv = OffcutServer(DaemonConfig(listen="127.0.0.1:0", state=str(tmp_path / "state.sqlite"),
                                    solver="dp", insecure_local=True))
    srv.start()
    try:
        address = f"127.0.0.1:{srv.port}"
        result = load.run_load(address, cfg)
        load.print_report(result, title=f"load test: {cfg.clients} clients x {cfg.rounds} rounds "
                                        f"x {cfg.ops_per_round} operations, {result.wall_s:.1f} s")
        assert result.errors == []
        # the load was what it claims: every client sent a full-size burst, all kinds mixed
        assert result.rounds == cfg.rounds
        counts = {row["kind"]: row["count"] for row in result.rows()}
        assert set(counts) == set(load.KINDS)
        assert counts["zeus_register"] == cfg.clients
        assert sum(counts.values()) == result.calls == cfg.clients * (1 + cfg.rounds * cfg.ops_per_round)
        assert all(r.events >= 1 for r in result.runs)
        assert max(r.node_names_sent for r in result.runs) >= 761
        with Client(address, timeout_s=30) as client:
            assert load.check_state(client, result) == []
            st = client.status()
            assert st.revision == result.node_events + sum(len(r.submissions) for r in result.runs)
            assert st.solver.fallbacks == 0
            assert client.health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
    finally:
        srv.stop(0.5)

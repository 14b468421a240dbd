"""The harness of ``benchmarks/zeus_bso_throughput.py`` at test scale: its gRPC floor (an empty
``Check`` served as a coroutine on offcutd's kind of loop) answers every round trip, and its
CPU budget's registry part drives a real registry over a real state file. The figures are the
benchmark's (``python benchmarks/zeus_bso_throughput.py``); nothing here is timed."""

from __future__ import annotations

import argparse
import sqlite3

import pytest

from daemon_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("zeus_bso_throughput")


def test_the_floor_answers_every_round_trip_from_every_thread(bench, tmp_path):
    args = argparse.Namespace(seconds=120.0, trials=40)
    result = bench.floor_scenario(tmp_path, 2, args)
    assert result.errors == []
    assert result.round_trips >= 40 and len(result.latencies_ms) == result.round_trips
    assert result.server_cpu_s is not None and result.server_cpu_s > 0


def test_the_budget_drives_the_registry_through_durable_round_trips(bench, tmp_path):
    ms = bench.registry_cpu_ms(tmp_path, 30, "full")
    assert ms > 0
    with sqlite3.connect(tmp_path / "registry.sqlite") as db:
        # 30 measured round trips after 30 first ones, each a converged trial and a stored answer
        assert db.execute("SELECT COUNT(*) FROM zeus_trials WHERE status = 'converged'"
                          ).fetchone() == (60,)
        assert db.execute("SELECT COUNT(*) FROM zeus_requests").fetchone() == (60,)


def test_the_budget_line_sets_the_parts_against_what_the_cores_allow(bench, capsys,
                                                                    monkeypatch):
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    rows = [{"server": "grpc floor", "threads": 4, "server_cpu_ms_per_rt": 0.9,
             "client_cpu_ms_per_rt": 0.7}]
    bench.print_budget(rows, 1.0, argparse.Namespace(threads=4, durability="full"))
    out = capsys.readouterr().out
    assert "700 rt/s on 2 cores allows 2.86 ms" in out
    assert "= 2.60 ms, 0.91x what the goal allows" in out

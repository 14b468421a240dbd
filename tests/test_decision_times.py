"""Decision-time statistics stay accurate and fixed-size however many decisions a daemon
makes (daemon/app/decision_times.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from offcut.daemon.app.decision_times import (BIN_LIMIT, LATENCY_BUCKETS_S, RELATIVE_ACCURACY,
                                          DecisionTimes)


def test_quantiles_within_the_relative_accuracy_and_exact_count_sum_max_buckets():
    rng = np.random.default_rng(7)
    # a decision-time mix: mostly ~2 ms, a tail of solves up to seconds, a few zeros
    ms = np.concatenate([rng.lognormal(np.log(2.0), 0.6, 40_000),
                         rng.lognormal(np.log(300.0), 1.0, 2_000), np.zeros(10)])
    rng.shuffle(ms)
    times = DecisionTimes()
    for v in ms:
        times.record(float(v))
    s = times.summary()
    assert s.count == len(ms)
    assert s.max_ms == pytest.approx(ms.max())
    assert s.sum_s == pytest.approx(ms.sum() / 1000.0)
    for q, got in ((50, s.p50_ms), (95, s.p95_ms), (99, s.p99_ms)):
        exact = float(np.percentile(ms, q, method="lower"))
        assert abs(got - exact) <= 2 * RELATIVE_ACCURACY * exact, (q, got, exact)
    # Prometheus buckets: cumulative counts of values <= each bound, then +Inf
    expected = [int(np.count_nonzero(ms / 1000.0 <= b)) for b in LATENCY_BUCKETS_S] + [len(ms)]
    assert [n for _, n in s.buckets] == expected
    assert s.buckets[-1][0] == float("inf")


def test_memory_does_not_grow_with_the_number_of_decisions():
    times = DecisionTimes()
    rng = np.random.default_rng(1)

    def size() -> int:
        return len(pickle.dumps(times))

    for v in rng.lognormal(0.0, 2.0, 20_000):
        times.record(float(v))
    after_20k = size()
    for v in rng.lognormal(0.0, 2.0, 200_000):  # ten times more, same spread
        times.record(float(v))
    assert times.summary().count == 220_000
    assert size() <= after_20k * 1.05  # a year of decisions costs what a day's does
    # capped even for a spread wider than the bins cover (0.1 ns .. 30 years)
    for v in np.geomspace(1e-9, 1e12, 50_000):
        times.record(float(v))
    wide = size()
    for v in np.geomspace(1e-9, 1e12, 100_000):
        times.record(float(v))
    assert size() <= wide * 1.05 and size() < BIN_LIMIT * 16


def test_empty_and_bad_input():
    s = DecisionTimes().summary()
    assert (s.count, s.p50_ms, s.p99_ms, s.max_ms, s.sum_s) == (0, 0.0, 0.0, 0.0, 0.0)
    assert [n for _, n in s.buckets] == [0] * (len(LATENCY_BUCKETS_S) + 1)
    times = DecisionTimes()
    times.record(-0.5)  # a clock step: counted as 0 ms
    assert times.summary().max_ms == 0.0 and times.summary().count == 1
    with pytest.raises(ValueError, match="increasing"):
        DecisionTimes((0.1, 0.05))

"""The horizon oracle's placement rules (issue 19, part 3; benchmarks/horizon_oracle.py,
``ForecastRules``, outside the product: the scheduler's placement collaborator replaced): on
real in-process daemons with the replay clock,
a forecast of each node's remaining idle time changes which nodes a task takes (and so whether
Slurm's next job preempts it) and the horizon rescales are weighed against; without one
nothing changes. Also the benchmark's log oracle on a hand-made node log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from daemon_helpers import T0, load_benchmark, make_spec
from offcut.replay.bftrainer_data import NodeChange, NodeLog

pytestmark = pytest.mark.replay_clock

NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture(scope="module")
def bench():
    """benchmarks/horizon_oracle.py as a module (it imports its sibling real_data.py, as when
    run as a script)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
        yield load_benchmark("horizon_oracle")


def table(left: dict[str, float]):
    """A forecast callable from a fixed table {node: remaining idle time [s]}."""
    return lambda nodes, t: np.array([left[n] for n in nodes])


def start(bench, daemons, name, forecast=None, **kw):
    """A daemon whose scheduler places by the benchmark's rules with ``forecast`` (None: the
    daemon's own scheduler, untouched)."""
    srv, client = daemons.start(name, **kw)
    if forecast is not None:
        scheduler = srv.engine.scheduler
        rules = bench.use_forecast(scheduler, forecast)
        assert scheduler.rules is rules and scheduler.reallocator.rules is rules
    return srv, client


def test_forecast_placement_takes_long_lived_nodes_and_avoids_the_preemption(bench, daemons):
    soon_gone = {"n1": 5.0, "n2": 5.0, "n3": 1000.0, "n4": 1000.0}
    runs = {}
    for name, forecast in (("plain", None),
                           ("oracle", bench.IdleForecast(table(soon_gone), placement=True))):
        _, c = start(bench, daemons, name, forecast)
        c.sync_nodes(T0, "w", 1, NODES)
        task = c.submit(make_spec("a", min_nodes=2, max_nodes=2, ns=(0, 2), ps=(0.0, 10.0),
                                  down=3.0), submit_time=T0).task
        held = list(c.get_task(task.task_id).nodes)
        c.report_nodes(T0 + 5, "w", 2, preempted=["n1"])  # Slurm takes n1 back
        runs[name] = (held, c.get_task(task.task_id))
    assert runs["plain"][0] == ["n1", "n2"]  # longest idle, then name: the default
    assert runs["plain"][1].preemptions == 1
    assert runs["oracle"][0] == ["n3", "n4"]  # the nodes that stay
    assert runs["oracle"][1].preemptions == 0 and list(runs["oracle"][1].nodes) == ["n3", "n4"]


def test_forecast_placement_gives_the_dearest_task_the_longest_lived_nodes(bench, daemons):
    left = {"n1": 1000.0, "n2": 900.0, "n3": 5.0, "n4": 5.0}
    held = {}
    for name, forecast in (("plain", None),
                           ("oracle", bench.IdleForecast(table(left), placement=True))):
        _, c = start(bench, daemons, name, forecast)
        ids = {}
        for i, (label, down) in enumerate((("cheap", 1.0), ("dear", 100.0))):
            ids[label] = c.submit(make_spec(label, min_nodes=2, max_nodes=2, ns=(0, 2),
                                            ps=(0.0, 10.0), down=down),
                                  submit_time=T0 + i).task.task_id
        c.sync_nodes(T0 + 2, "w", 1, NODES)  # both start in one re-allocation
        held[name] = {k: list(c.get_task(v).nodes) for k, v in ids.items()}
    assert held["plain"] == {"cheap": ["n1", "n2"], "dear": ["n3", "n4"]}  # submit order
    assert held["oracle"] == {"cheap": ["n3", "n4"], "dear": ["n1", "n2"]}


def test_forecast_horizon_lets_a_dear_grow_pay(bench, daemons):
    # at Tfwd 10 s growing 1 -> 2 nodes gains 10 x (18 - 10) = 80 < Tcup x S(1) = 1,000
    # samples: no grow; over the nodes' true 1,000 s it gains 8,000 > 1,000: grow
    counts = {}
    for name, forecast in (("fixed", None),
                           ("horizon", bench.IdleForecast(table(dict.fromkeys(NODES, 1000.0)),
                                                          horizon="median"))):
        _, c = start(bench, daemons, name, forecast, tfwd_s=10.0)
        c.sync_nodes(T0, "w", 1, ["n1"])
        task = c.submit(make_spec("a", up=100.0), submit_time=T0).task
        c.report_nodes(T0 + 10, "w", 2, idle=["n2"])
        counts[name] = len(c.get_task(task.task_id).nodes)
    assert counts == {"fixed": 1, "horizon": 2}


def test_shrink_by_forecast_releases_the_nodes_leaving_soonest(bench):
    kept, released = bench.shrink_by_forecast(
        ["a1", "a2", "b1"], 2, {"a1": 10.0, "a2": 500.0, "b1": 300.0})
    assert (kept, released) == (["a2", "b1"], ["a1"])
    with pytest.raises(ValueError):
        bench.shrink_by_forecast(["a1"], 2, {"a1": 1.0})
    with pytest.raises(ValueError):
        bench.grow_by_forecast(2, ["a1"], {"a1": 1.0})


def test_forecast_settings_are_checked(bench):
    with pytest.raises(ValueError, match="horizon"):
        bench.IdleForecast(table({}), horizon="p90")
    with pytest.raises(ValueError, match="min_horizon_s"):
        bench.IdleForecast(table({}), min_horizon_s=0.0)
    f = bench.IdleForecast(table({"a": 0.2, "b": 0.4, "c": 90.0}), horizon="median")
    assert f.horizon_s(["a", "b", "c"], T0, 60.0) == 1.0  # at least min_horizon_s
    assert f.horizon_s([], T0, 60.0) == 60.0              # an empty pool keeps Tfwd


def test_log_oracle_reads_the_true_remaining_idle_time(bench):
    t = pd.Timestamp("2021-02-10 00:00:00")
    changes = [NodeChange(t + pd.Timedelta(seconds=100), [], ["x"]),
               NodeChange(t + pd.Timedelta(seconds=200), ["x"], ["y"]),
               NodeChange(t + pd.Timedelta(seconds=300), [], ["x"]),
               NodeChange(t + pd.Timedelta(seconds=400), ["y"], [])]
    log = NodeLog(["x", "y", "z"], t, ["x", "y", "z"], len(changes),
                  _events_factory=lambda: iter(changes))
    oracle = bench.LogOracle(log)
    t0 = t.value / 1e9
    # x busy at 100 and 300, y at 200, z never (the log ends at 400)
    assert oracle.remaining_s(["x", "y", "z"], t0).tolist() == [100.0, 200.0, 400.0]
    assert oracle.remaining_s(["x", "z", "y"], t0 + 250).tolist() == [50.0, 150.0, 150.0]
    assert oracle.remaining_s(["x"], t0 + 100).tolist() == [200.0]  # busy at 100: next is 300

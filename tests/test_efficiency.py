"""The efficiency against dedicated nodes (offcut.replay.efficiency): the formula and its parts
on hand-made tasks (tests/test_replay_e2e.py checks the figures every replay's summary
carries)."""

from __future__ import annotations

import pytest
from daemon_helpers import make_spec

from offcut.replay.efficiency import best_rate_per_node, dedicated_efficiency, rate_at
from offcut.replay.owners import NodeTime
from offcut.v1 import tasks_pb2


def task(tid: str, work: float, **kw) -> tasks_pb2.Task:
    return tasks_pb2.Task(task_id=tid, spec=make_spec(tid, **kw), work_done_samples=work)


def test_best_rate_per_node_is_over_the_counts_the_task_may_run_at():
    # P = 10, 18, (24), 30 at 1, 2, 3, 4 nodes: 10 samples/s per node at 1 node
    assert best_rate_per_node(make_spec("a")) == pytest.approx(10.0)
    # at least 2 nodes: 18 / 2 = 9 is the best
    assert best_rate_per_node(make_spec("b", min_nodes=2)) == pytest.approx(9.0)
    # a superlinear curve: best at the top
    assert best_rate_per_node(make_spec("c", ns=(0, 1, 4), ps=(0.0, 1.0, 8.0))) == \
        pytest.approx(2.0)
    assert best_rate_per_node(make_spec("d", ns=(), ps=())) is None  # learned online


def test_efficiency_is_trained_over_what_dedicated_nodes_give_for_the_same_node_hours():
    tasks = [task("a", 800.0), task("b", 900.0, min_nodes=2), task("learned", 5.0, ns=(), ps=()),
             task("idle", 0.0)]
    held = {"a": 100.0, "b": 200.0, "learned": 50.0}  # node-s; "idle" held none
    got = dedicated_efficiency(tasks, held)
    # dedicated: a 100 node-s x 10 + b 200 node-s x 9 = 2800 samples; trained 800 + 900
    assert got["dedicated_samples"] == pytest.approx(2800.0)
    assert got["dedicated_efficiency"] == pytest.approx(1700.0 / 2800.0)
    assert got["dedicated_tasks_left_out"] == 2
    assert dedicated_efficiency([], {})["dedicated_efficiency"] is None


def test_the_parts_are_the_held_counts_overhead_and_their_scaling_and_multiply_to_it():
    # a: P = 10, 18, 30 at 1, 2, 4 nodes (r* = 10 per node), held 2 nodes for 10 s then 4 for 5 s
    # b: the same curve at least 2 nodes (r* = 9), held 2 nodes for 20 s
    node_time = NodeTime()
    for task_id, t, n in (("a", 0.0, 2), ("a", 10.0, 4), ("a", 15.0, 0), ("b", 0.0, 2),
                          ("b", 20.0, 0)):
        node_time.change(task_id, t, n)
    specs = {"a": make_spec("a"), "b": make_spec("b", min_nodes=2)}
    held = node_time.integral(100.0, lambda task, n: rate_at(specs[task], n))
    assert held == pytest.approx({"a": 18.0 * 10 + 30.0 * 5, "b": 18.0 * 20})  # 330, 360
    seconds = node_time.seconds(100.0)
    assert seconds == pytest.approx({"a": 40.0, "b": 40.0})
    # trained 300 and 330 samples after rescale and preemption costs
    got = dedicated_efficiency([task("a", 300.0), task("b", 330.0, min_nodes=2)], seconds, held)
    assert got["held_count_samples"] == pytest.approx(690.0)
    assert got["dedicated_samples"] == pytest.approx(40.0 * 10 + 40.0 * 9)  # 760
    assert got["same_counts_efficiency"] == pytest.approx(630.0 / 690.0)
    assert got["scaling_factor"] == pytest.approx(690.0 / 760.0)
    assert got["same_counts_efficiency"] * got["scaling_factor"] == \
        pytest.approx(got["dedicated_efficiency"])
    assert got["dedicated_efficiency"] == pytest.approx(630.0 / 760.0)
    # without the held counts' samples only the whole figure is given
    assert "scaling_factor" not in dedicated_efficiency([task("a", 300.0)], seconds)
    # a learned task has no curve: no rate
    assert rate_at(make_spec("d", ns=(), ps=()), 2) is None

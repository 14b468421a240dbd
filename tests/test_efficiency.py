"""The efficiency against dedicated nodes (offcut.replay.efficiency): the formula on hand-made
tasks, and the figure every replay's summary carries."""

from __future__ import annotations

import pytest
from daemon_helpers import make_spec

from offcut.replay.efficiency import best_rate_per_node, dedicated_efficiency
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

"""The task spec's one wire conversion (:mod:`offcut.wire.specs`), without a daemon: a spec
comes back equal from its message, a request's message is validated naming the field, and the
spec and the message have the same fields."""

from __future__ import annotations

import pytest

from offcut.errors import InvalidArgument
from offcut.taskspec import Limits, TaskSpec
from offcut.v1 import tasks_pb2
from offcut.wire.specs import SPEC_FIELDS, spec_from_pb, spec_to_pb, spec_view_from_pb


def test_the_spec_and_its_message_have_the_same_fields():
    assert sorted(SPEC_FIELDS) == sorted(f.name for f in tasks_pb2.TaskSpec.DESCRIPTOR.fields)


def test_a_spec_goes_to_the_wire_and_back_unchanged():
    spec = TaskSpec.create(name="t", min_nodes=1, max_nodes=2, node_counts=[0, 1, 2],
                           throughputs=[0.0, 5.0, 9.0], objective_values=[0.0, 1.0, 1.8],
                           rescale_up_s=3.0, rescale_down_s=4.0, total_work_samples=1e6,
                           command=["python", "t.py"], reports_progress=True,
                           power_w=[0.0, 100.0, 200.0], zeus_job_id="z", gpus_per_node=2,
                           constraint=["ib", "a100"], procs_per_node=1)
    msg = spec_to_pb(spec)
    assert list(msg.constraint) == ["a100", "ib"] and msg.gpus_per_node == 2
    assert spec_from_pb(msg) == spec
    assert spec_view_from_pb(msg) == spec  # (the answer's view: the same, unchecked)


def test_a_bad_message_names_the_spec_field_and_the_limits_apply():
    msg = tasks_pb2.TaskSpec(name="t", min_nodes=1, max_nodes=9, total_work_samples=1.0,
                             gpus_per_node=65)
    with pytest.raises(InvalidArgument) as err:
        spec_from_pb(msg)
    assert err.value.field == "spec.gpus_per_node"
    msg.gpus_per_node = 0
    assert spec_from_pb(msg).learned
    with pytest.raises(InvalidArgument) as err:
        spec_from_pb(msg, Limits(max_task_nodes=8))
    assert err.value.field == "spec.max_nodes" and "max_task_nodes (8)" in str(err.value)

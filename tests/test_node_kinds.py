"""Node kinds (docs/architecture.md, "Node kinds"): what each node has (GPUs, features),
from the watcher's SyncNodes, and tasks that say what their nodes need (``gpus_per_node``,
``constraint``). Real daemons over gRPC on unix sockets; the Slurm side is in
tests/test_slurm_gres.py."""

from __future__ import annotations

import time

import pytest
from daemon_helpers import make_spec

from offcut.client.taskspec import make_task_spec, parse_constraint
from offcut.daemon.app.model import NodeEvent, NodeKind, event_from_dict, event_to_dict
from offcut.errors import InvalidArgument

CPU = ["c1", "c2", "c3"]
GPU = ["g1", "g2"]
A100 = ["g3"]
#: node -> (GPUs, features): three CPU nodes, two GPU nodes, one GPU node with a100
KINDS = {"c1": (0, []), "c2": (0, []), "c3": (0, ["ib"]), "g1": (1, []), "g2": (2, ["ib"]),
         "g3": (4, ["a100", "ib"])}
ALL = CPU + GPU + A100


def synced(client, idle=ALL, kinds=KINDS, seq=1):
    return client.sync_nodes(time.time(), "slurm-watch", seq, idle=idle, kinds=kinds)


def nodes_of(client, tid) -> list[str]:
    return sorted(client.get_task(tid).nodes)


def test_tasks_run_only_on_nodes_that_have_what_they_need(daemon):
    _, client = daemon
    synced(client)
    cpu = client.submit(make_spec("cpu", max_nodes=8, ns=(0, 1, 8),
                                  ps=(0.0, 10.0, 80.0))).task.task_id
    gpu = client.submit(make_spec("gpu", max_nodes=8, ns=(0, 1, 8), ps=(0.0, 10.0, 80.0),
                                  gpus_per_node=1)).task.task_id
    assert nodes_of(client, cpu) == CPU        # never a GPU node
    assert nodes_of(client, gpu) == GPU + A100  # every node with a GPU
    big = client.submit(make_spec("big", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 100.0, 200.0),
                                  gpus_per_node=2)).task.task_id
    # g1 has one GPU only; the 2-GPU task's throughput wins g2 and g3 from the 1-GPU task
    assert nodes_of(client, big) == ["g2", "g3"]
    assert nodes_of(client, gpu) == ["g1"]
    ib = client.submit(make_spec("ib", max_nodes=1, ns=(0, 1), ps=(0.0, 10.0),
                                 constraint=["ib"])).task.task_id
    assert nodes_of(client, ib) == ["c3"]  # a CPU node with the feature
    assert set(nodes_of(client, cpu)) == {"c1", "c2"}


def test_a_more_constrained_task_takes_its_node_from_a_less_constrained_one(daemon):
    _, client = daemon
    synced(client)
    gpu = client.submit(make_spec("gpu", max_nodes=8, ns=(0, 1, 8), ps=(0.0, 10.0, 80.0),
                                  gpus_per_node=1)).task.task_id
    assert nodes_of(client, gpu) == GPU + A100
    a100 = client.submit(make_spec("a100", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 50.0, 100.0),
                                   gpus_per_node=1, constraint=["a100"])).task.task_id
    assert nodes_of(client, a100) == ["g3"]
    assert nodes_of(client, gpu) == GPU
    client.cancel(a100)
    assert nodes_of(client, gpu) == GPU + A100  # and grows back when it is free


def test_without_a_fitting_node_a_task_waits(daemon):
    _, client = daemon
    synced(client, idle=CPU)
    tid = client.submit(make_spec("gpu", gpus_per_node=1)).task.task_id
    assert not client.get_task(tid).nodes and client.status().nodes_in_use == 0
    synced(client, idle=CPU + ["g1"], seq=2)  # a GPU node joins
    assert nodes_of(client, tid) == ["g1"]


def test_a_kind_change_moves_the_task_off_the_node(daemon):
    _, client = daemon
    synced(client)
    tid = client.submit(make_spec("gpu", max_nodes=8, ns=(0, 1, 8), ps=(0.0, 10.0, 80.0),
                                  gpus_per_node=1)).task.task_id
    assert "g1" in nodes_of(client, tid)
    kinds = {**KINDS, "g1": (0, [])}  # its GPU is gone from Slurm's configuration
    d = synced(client, kinds=kinds, seq=2)
    assert "g1" not in nodes_of(client, tid)
    assert any(p.task_id == tid for p in d.placements)


def test_kinds_survive_a_restart(daemons):
    srv, client = daemons.start()
    synced(client)
    gpu = client.submit(make_spec("gpu", gpus_per_node=1, max_nodes=8, ns=(0, 1, 8),
                                  ps=(0.0, 10.0, 80.0))).task.task_id
    before = nodes_of(client, gpu)
    daemons.stop(srv)
    _, client = daemons.start()
    assert nodes_of(client, gpu) == before
    cpu = client.submit(make_spec("cpu", max_nodes=8, ns=(0, 1, 8),
                                  ps=(0.0, 10.0, 80.0))).task.task_id
    assert nodes_of(client, cpu) == CPU  # the restarted daemon still knows the GPU nodes


@pytest.mark.parametrize("kinds,field,message", [
    ({"c1": (2000, [])}, "kinds[c1]", "gpus must be 0 to 1024"),
    ({"c1": (0, ["a b"])}, "kinds[c1]", "feature 'a b'"),
    ({"c1": (0, [f"f{i}" for i in range(65)])}, "kinds[c1]", "65 features"),
    ({"c1": (0, ["x" * 65])}, "kinds[c1]", "1-64 letters"),
    ({"bad node!": (1, [])}, "kinds", "not a valid node name"),
])
def test_bad_kinds_are_refused_and_change_nothing(daemon, kinds, field, message):
    _, client = daemon
    synced(client)
    tid = client.submit(make_spec("gpu", gpus_per_node=1)).task.task_id
    before = (nodes_of(client, tid), client.status().revision)
    with pytest.raises(InvalidArgument, match=message) as err:
        synced(client, kinds=kinds, seq=2)
    assert str(err.value).startswith(f"{field}: ")
    assert (nodes_of(client, tid), client.status().revision) == before
    synced(client, seq=2)  # the refused seq was not used up


@pytest.mark.parametrize("kw,field", [
    ({"gpus_per_node": 65}, "spec.gpus_per_node"),
    ({"procs_per_node": 65}, "spec.procs_per_node"),
    ({"procs_per_node": 3, "gpus_per_node": 4}, "spec.procs_per_node"),  # not even
    ({"constraint": ["a&b"]}, "spec.constraint"),
    ({"constraint": [""]}, "spec.constraint"),
    ({"constraint": [f"f{i}" for i in range(17)]}, "spec.constraint"),
])
def test_bad_node_needs_are_refused(daemon, kw, field):
    _, client = daemon
    with pytest.raises(InvalidArgument) as err:
        client.submit(make_spec("x", **kw))
    assert str(err.value).startswith(f"{field}: ")
    assert not client.list_tasks()


def test_node_needs_are_kept_and_shown(daemon):
    _, client = daemon
    tid = client.submit(make_spec("x", gpus_per_node=4, constraint=["ib", "a100", "ib"])
                        ).task.task_id
    spec = client.get_task(tid).spec
    assert spec.gpus_per_node == 4 and list(spec.constraint) == ["a100", "ib"]
    assert spec.procs_per_node == 0   # the default: one process per GPU (the launcher's 4)
    two = client.submit(make_spec("y", gpus_per_node=4, procs_per_node=2)).task.task_id
    assert client.get_task(two).spec.procs_per_node == 2


def test_processes_per_node_survive_a_restart(daemons):
    srv, client = daemons.start()
    tid = client.submit(make_spec("p", procs_per_node=3)).task.task_id
    daemons.stop(srv)
    _, client = daemons.start()
    assert client.get_task(tid).spec.procs_per_node == 3


def test_journal_rows_keep_kinds_and_read_rows_without_them():
    event = NodeEvent(5.0, "slurm-watch", 3, ("g1",), snapshot=True,
                      kinds=(("g1", NodeKind(2, ("a100",))),))
    d = event_to_dict(event)
    assert event_from_dict(d) == event
    old = {k: v for k, v in d.items() if k != "kinds"}  # a row of an earlier release
    assert event_from_dict(old).kinds == ()


def test_client_spec_takes_slurm_constraint_syntax():
    spec = make_task_spec("x", nodes="1-2", work_samples=10, scalability=([1, 2], [1.0, 2.0]),
                          gpus_per_node=1, constraint="ib&a100")
    assert list(spec.constraint) == ["a100", "ib"] and spec.gpus_per_node == 1
    assert parse_constraint("") == []
    for bad in ("a100|v100", "[a*2]", "a&&b", "!a"):
        with pytest.raises(InvalidArgument) as err:
            parse_constraint(bad)
        assert err.value.field == "constraint"
    with pytest.raises(InvalidArgument) as err:
        make_task_spec("x", nodes="1", work_samples=10, scalability=None, gpus_per_node=-1)
    assert err.value.field == "gpus_per_node"

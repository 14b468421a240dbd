"""``offcut show`` says why a task holds what it holds (offcut.client.explain): checked
against real daemons, where the thresholds it names decide whether the task grows."""

from __future__ import annotations

import time

from daemon_helpers import make_spec
from typer.testing import CliRunner

from offcut.client.cli import app
from offcut.client.explain import explain

NODES = [f"n{i}" for i in range(1, 9)]
#: 1-8 nodes, S(2) = 190 and S(8) = 680 samples/s, Tcup = 30 s (the CLI's default)
CURVE = dict(min_nodes=1, max_nodes=8, ns=(0, 1, 2, 4, 8), ps=(0.0, 100.0, 190.0, 360.0, 680.0),
             up=30.0, down=30.0, work=1e12)


def two_then_eight(client) -> str:
    """A task starts on 2 idle nodes; 6 more become idle. Returns its id."""
    client.report_nodes(time.time(), "slurm-epilog", 1, idle=NODES[:2])
    tid = client.submit(make_spec("t", **CURVE)).task.task_id
    assert len(client.get_task(tid).nodes) == 2  # a start costs nothing
    client.report_nodes(time.time(), "slurm-epilog", 2, idle=NODES[2:])
    return tid


def test_a_task_that_does_not_grow_is_told_why_and_the_thresholds_hold(daemons):
    _, client = daemons.start("ten", tfwd_s=10.0)
    tid = two_then_eight(client)
    task = client.get_task(tid)
    assert len(task.nodes) == 2  # 10 s x 490 samples/s < 30 s x 190 samples/s: no growth
    why = "\n".join(explain(task, client.status()))
    assert "Holds 2 of 1-8 nodes; the pool has 8 idle node(s), 6 of them free" in why
    assert "Growing to 8 node(s) would add 490 samples/s" in why
    assert "4900 samples, against a rescale-up cost of Tcup = 30 s x 190 samples/s = 5700" in why
    # the break-even horizon 5700 / 490 = 11.63 s and cost 4900 / 190 = 25.8 s
    assert "horizon above 11.6 s" in why and "rescale-up cost below 25.8 s" in why
    # ... and they are the daemon's: just above the horizon it grows, just below it does not
    for tfwd, grows in ((11.5, False), (11.8, True)):
        _, other = daemons.start(f"tfwd-{tfwd}", tfwd_s=tfwd)
        assert len(other.get_task(two_then_eight(other)).nodes) == (8 if grows else 2)
    # the CLI prints it under "Why"
    res = CliRunner().invoke(app, ["show", tid, "--address", client.address])
    assert res.exit_code == 0 and "Why          Holds 2 of 1-8 nodes" in res.stdout
    assert "Growing does not pay within the horizon" in res.stdout


def test_a_task_that_grows_is_told_it_holds_its_maximum(daemons):
    _, client = daemons.start()
    client.report_nodes(time.time(), "slurm-epilog", 1, idle=NODES[:2])
    tid = client.submit(make_spec("t", **{**CURVE, "up": 0.0})).task.task_id
    client.report_nodes(time.time(), "slurm-epilog", 2, idle=NODES[2:])
    task = client.get_task(tid)
    assert len(task.nodes) == 8  # with a free rescale, growing pays
    why = explain(task, client.status())
    assert why[0].startswith("Holds 8 of 1-8 nodes; the pool has 8 idle node(s), 0 of them free")
    assert why[1] == "It holds its maximum (max_nodes 8)."


def test_waiting_tasks_are_told_what_they_wait_for(daemons):
    _, client = daemons.start(max_running_tasks=1)
    client.report_nodes(time.time(), "slurm-epilog", 1, idle=NODES[:1])
    first = client.submit(make_spec("a", **CURVE)).task.task_id
    second = client.submit(make_spec("b", **CURVE)).task.task_id
    status = client.status()
    assert explain(client.get_task(second), status)[0].startswith(
        "Not admitted yet: the daemon runs at most 1 tasks at once")
    client.cancel(first)
    big = client.submit(make_spec("c", **{**CURVE, "min_nodes": 4})).task.task_id
    client.cancel(second)
    lines = explain(client.get_task(big), client.status())
    assert "It needs at least 4 node(s) (min_nodes) and 1 are free" in lines[-1]

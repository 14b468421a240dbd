"""Waiting for the launcher (docs/execution.md, "Waiting for the launcher"; issue 38): the
daemon knows which held nodes run nothing yet because no launcher reported the current
generation's jobs started (the previous generation still stops, or Slurm has not started
them), and says so in ``Task.started_generation``, ``Status.nodes_awaiting_launch``,
``offcut status`` and ``offcut show``. A real live daemon over gRPC."""

from __future__ import annotations

from typer.testing import CliRunner

from offcut.client.cli import app
from offcut.client.task_cli import generation_text

from daemon_helpers import T0, make_spec


def show_line(address: str, task_id: str, key: str) -> str:
    out = CliRunner().invoke(app, ["show", task_id, "--address", address],
                             catch_exceptions=False).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith(key + " ")]
    return line.split(None, 1)[1]


def test_held_nodes_wait_for_the_launcher_until_a_run_of_the_generation_starts(daemons):
    srv, c = daemons.start("a")
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    tid = c.submit(make_spec("w", max_nodes=3)).task.task_id
    t = c.get_task(tid)
    assert t.generation == 1 and t.started_generation == 0 and t.generation_time is not None
    assert c.status().nodes_awaiting_launch == 2
    line = show_line(srv.address, tid, "Generation")
    assert line.startswith("1 (placed ") and "waiting for the launcher" in line
    assert "the launcher has not submitted them" in line

    c.report_task_run(tid, "started", node="n1", job_id="11", generation=1)
    assert c.get_task(tid).started_generation == 1
    assert c.status().nodes_awaiting_launch == 0
    assert "its jobs started" in show_line(srv.address, tid, "Generation")
    status_out = CliRunner().invoke(app, ["status", "--address", srv.address],
                                    catch_exceptions=False).stdout
    assert "launcher has not started" not in status_out

    c.report_nodes(T0 + 1, "slurm", 2, idle=["n3"])  # a grow: generation 2 on 3 nodes
    t = c.get_task(tid)
    assert t.generation == 2 and len(t.nodes) == 3 and t.started_generation == 1
    assert c.status().nodes_awaiting_launch == 3
    assert "generation 1 still stops" in show_line(srv.address, tid, "Generation")
    status_out = CliRunner().invoke(app, ["status", "--address", srv.address],
                                    catch_exceptions=False).stdout
    assert "3 of those held for generations the launcher has not started" in status_out

    c.report_task_run(tid, "started", node="n3", job_id="21", generation=2)
    c.report_task_run(tid, "started", node="n2", job_id="12", generation=1)  # a late report
    assert c.get_task(tid).started_generation == 2  # never lowered
    assert c.status().nodes_awaiting_launch == 0


def test_replay_mode_and_ended_tasks_show_no_wait():
    """No launcher runs in replay mode: the Generation line never says it waits; nor for a
    task that holds no nodes."""
    from offcut.v1 import tasks_pb2
    from offcut.wire.tasks import task_from_pb

    msg = tasks_pb2.Task(task_id="t000001", generation=3, started_generation=2,
                         nodes=["n1"], state=tasks_pb2.TASK_STATE_RUNNING, spec=make_spec("w"))
    msg.generation_time.FromSeconds(int(T0))
    task = task_from_pb(msg)
    assert "waiting for the launcher" in generation_text(task, "live", now=T0 + 5)
    assert generation_text(task, "replay", now=T0 + 5) == \
        "3 (placed 5 s ago at 2020-09-13T12:26:40Z)"
    task.nodes.clear()
    assert "waiting" not in generation_text(task, "live", now=T0 + 5)
    assert generation_text(task_from_pb(tasks_pb2.Task(
        generation=0, spec=make_spec("w"), state=tasks_pb2.TASK_STATE_QUEUED))) == "0"

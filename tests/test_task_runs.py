"""Run reports from a launcher (``Tasks.ReportTaskRun``) over real gRPC: started/preempted are
recorded, finished completes the task, failed fails it; both release the nodes and
re-allocate; retries are idempotent; bad reports change nothing; all survive a restart."""

from __future__ import annotations

import grpc
import pytest

from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from daemon_helpers import T0, make_spec, status_key

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock


def two_tasks(client):
    """Two tasks of 2 nodes each on 4 idle nodes (a superlinear curve), a third waiting."""
    client.report_nodes(T0, "slurm", 1, idle=["n1", "n2", "n3", "n4"])
    ids = [client.submit(make_spec(f"t{i}", max_nodes=2, ns=(0, 1, 2), ps=(0.0, 10.0, 21.0)),
                         submit_time=T0 + 1).task.task_id for i in range(3)]
    held = {t.task_id: len(t.nodes) for t in client.list_tasks()}
    assert sorted(held.values()) == [0, 2, 2]
    return ids, held


def test_started_and_preempted_are_recorded(daemon):
    _, c = daemon
    ids, held = two_tasks(c)
    running = [i for i in ids if held[i]][0]
    before = c.status().revision
    r = c.report_task_run(running, "started", node="n1", job_id="101", request_id="a", time=T0 + 2)
    assert r.task.launches == 1 and "started on n1 (job 101)" == r.task.last_run
    assert not r.decision.placements and r.decision.revision == before + 1
    r = c.report_task_run(running, "preempted", node="n1", job_id="101", message="by job 7", time=T0 + 2)
    assert r.task.launches == 1 and r.task.last_run == "preempted on n1 (job 101) - by job 7"
    assert len(c.get_task(running).nodes) == 2  # the node events decide the placement


def test_finished_completes_and_reallocates(daemon):
    _, c = daemon
    ids, held = two_tasks(c)
    done, waiting = [i for i in ids if held[i]][0], [i for i in ids if not held[i]][0]
    r = c.report_task_run(done, "finished", node="n1", job_id="102", time=T0 + 5,
                          request_id="fin-1")
    assert r.task.state == TaskState.COMPLETED
    assert r.task.work_done_samples == r.task.spec.total_work_samples
    assert list(r.decision.completed_task_ids) == [done]
    changes = {p.task_id: p.change for p in r.decision.placements}
    assert changes[done] == "completed"
    assert changes[waiting] == "start"  # its nodes went on
    assert len(c.get_task(waiting).nodes) == 2
    # a retry gets the stored answer and changes nothing
    key = status_key(c)
    again = c.report_task_run(done, "finished", node="n1", job_id="102", request_id="fin-1", time=T0 + 2)
    assert again.decision.duplicate and again.decision.revision == r.decision.revision
    assert status_key(c) == key
    # another run of the finished task reporting: refused, nothing changes
    with pytest.raises(FailedPrecondition, match="already completed"):
        c.report_task_run(done, "finished", node="n2", job_id="103", time=T0 + 2)
    assert status_key(c) == key


def test_failed_fails_the_task(daemon):
    _, c = daemon
    ids, held = two_tasks(c)
    bad = [i for i in ids if held[i]][0]
    r = c.report_task_run(bad, "failed", node="n2", job_id="104", exit_code=3, message="OOM", time=T0 + 2)
    assert r.task.state == TaskState.FAILED and not r.task.nodes
    assert r.task.last_run == "failed on n2 (job 104) exit code 3 - OOM"
    assert {p.task_id: p.change for p in r.decision.placements}[bad] == "failed"
    st = c.status()
    assert st.failed_tasks == 1 and st.nodes_in_use == 4
    assert [t.task_id for t in c.list_tasks(states=[TaskState.FAILED])] == [bad]


@pytest.mark.parametrize("kwargs,error,field", [
    (dict(task_id="t999999", state="started"), NotFound, "task_id"),
    (dict(task_id="", state="started"), InvalidArgument, "task_id"),
    (dict(state="started", node="bad node!"), InvalidArgument, "node"),
    (dict(state="started", message="x" * 5000), InvalidArgument, "message"),
    (dict(state="started", job_id="j" * 300), InvalidArgument, "job_id"),
])
def test_bad_reports_change_nothing(daemon, kwargs, error, field):
    _, c = daemon
    ids, _ = two_tasks(c)
    kwargs = {"task_id": ids[0], **kwargs}
    key = status_key(c)
    with pytest.raises(error) as info:
        c.report_task_run(**kwargs, time=T0 + 2)
    assert str(info.value).startswith(f"{field}:")
    assert status_key(c) == key


def test_unknown_state_is_invalid_on_the_wire(daemon):
    _, c = daemon
    ids, _ = two_tasks(c)
    with pytest.raises(grpc.RpcError) as info:  # the raw stub: state left unset
        c.tasks.ReportTaskRun(tasks_pb2.TaskRunReport(task_id=ids[0]), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("state:")
    with pytest.raises(InvalidArgument, match="state"):
        c.report_task_run(ids[0], "exploded", time=T0 + 2)


def test_run_reports_survive_restart(daemons):
    srv, c = daemons.start("a")
    ids, held = two_tasks(c)
    running = [i for i in ids if held[i]]
    c.report_task_run(running[0], "started", node="n1", request_id="s1", time=T0 + 2)
    c.report_task_run(running[1], "failed", node="n3", exit_code=1, request_id="f1", time=T0 + 2)
    key = status_key(c)
    daemons.stop(srv)
    _, c2 = daemons.start("a")
    assert status_key(c2) == key
    assert c2.report_task_run(running[1], "failed", node="n3", exit_code=1,
                              request_id="f1", time=T0 + 2).decision.duplicate


# ----------------------------------------------------------------------------- generations
def test_every_change_of_the_node_set_starts_a_generation(daemon):
    _, c = daemon
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    r = c.submit(make_spec("g", max_nodes=4), submit_time=T0 + 1)
    tid = r.task.task_id
    start = {p.task_id: p for p in r.decision.placements}[tid]
    assert start.change == "start" and start.generation == 1
    assert c.get_task(tid).generation == 1
    grow = c.report_nodes(T0 + 2, "slurm", 2, idle=["n3", "n4"])
    assert [p.generation for p in grow.placements if p.task_id == tid] == [2]
    shrink = c.report_nodes(T0 + 3, "slurm", 3, preempted=["n4"])
    assert [(p.change, p.generation) for p in shrink.placements if p.task_id == tid] == [
        ("preempted", 3)]
    # a report that leaves the task's nodes alone keeps its generation
    c.report_task_run(tid, "started", node="n1", job_id="5", generation=3, time=T0 + 4)
    assert c.get_task(tid).generation == 3 and sorted(c.get_task(tid).nodes) == ["n1", "n2", "n3"]


def _one_task(c, **spec):
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    return c.submit(make_spec("g", max_nodes=2, **spec), submit_time=T0 + 1).task.task_id


def test_interrupted_run_of_the_current_generation_restarts_it_on_the_same_nodes(daemon):
    _, c = daemon
    tid = _one_task(c)
    rev = c.status().revision
    r = c.report_task_run(tid, "interrupted", node="n1", job_id="7", exit_code=75,
                          generation=1, time=T0 + 2)
    assert r.task.generation == 2 and sorted(r.task.nodes) == ["n1", "n2"]
    assert r.task.state == TaskState.RUNNING and r.task.failed_runs == 0
    (p,) = r.decision.placements
    assert p.change == "restart" and p.generation == 2
    assert list(p.nodes) == ["n1", "n2"] and r.decision.revision == rev + 1
    # the other rank of generation 1 exits 75 too: superseded, recorded only
    r = c.report_task_run(tid, "interrupted", node="n2", job_id="8", exit_code=75,
                          generation=1, time=T0 + 2)
    assert r.task.generation == 2 and not r.decision.placements
    assert r.task.last_run == "interrupted in generation 1 on n2 (job 8) exit code 75"


def test_a_failure_of_a_superseded_generation_is_not_a_task_failure(daemon):
    _, c = daemon
    tid = _one_task(c)
    c.report_nodes(T0 + 2, "slurm", 2, preempted=["n2"])  # generation 2 on n1
    assert c.get_task(tid).generation == 2
    r = c.report_task_run(tid, "failed", node="n1", job_id="9", exit_code=1, generation=1,
                          message="gloo: Connection closed by peer", time=T0 + 3)
    assert r.task.state == TaskState.RUNNING and r.task.generation == 2
    assert r.task.failed_runs == 0 and not r.decision.placements


def test_repeated_failures_of_the_current_generation_fail_the_task_with_the_reason(daemon):
    _, c = daemon
    tid = _one_task(c)
    for gen in (1, 2):
        r = c.report_task_run(tid, "failed", node="n1", job_id=f"j{gen}", exit_code=1,
                              generation=gen, message="ImportError", time=T0 + 2)
        assert r.task.state == TaskState.RUNNING
        assert r.task.generation == gen + 1 and r.task.failed_runs == gen
        assert r.task.failures_without_progress == gen
        assert "failed in generation" in r.task.failure_reason
    assert [w.kind for w in r.task.warnings] == ["crash-loop"]  # from the second in a row
    assert "2 runs in a row failed without progress" in r.task.warnings[0].message
    # a checkpointed exit in between neither resets nor adds: it made no progress either
    c.report_task_run(tid, "interrupted", node="n1", job_id="k", exit_code=75, generation=3,
                      time=T0 + 2)
    t = c.get_task(tid)
    assert (t.failed_runs, t.failures_without_progress, t.generation) == (2, 2, 4)
    r = c.report_task_run(tid, "failed", node="n2", job_id="j4", exit_code=2, generation=4,
                          message="bug", time=T0 + 3)
    assert r.task.state == TaskState.FAILED and not r.task.nodes
    assert r.task.failed_runs == 3
    assert r.task.failure_reason.startswith(
        "3 runs in a row failed without progress beyond 0 reported samples (3 failed runs in "
        "all); the last: failed in generation 4 on n2 (job j4) exit code 2 - bug")
    assert {p.task_id: p.change for p in r.decision.placements}[tid] == \
        "failed"
    assert c.status().nodes_in_use == 0


def test_max_failed_generations_is_configurable(daemons):
    _, c = daemons.start("a", max_failed_generations=1)
    tid = _one_task(c)
    r = c.report_task_run(tid, "failed", node="n1", exit_code=1, generation=1, time=T0 + 2)
    assert r.task.state == TaskState.FAILED


def test_failures_count_in_a_row_only_without_progress_and_every_one_counts(daemon):
    """A crash loop fails the task even when each run reports progress before it crashes at
    the same point (issue 38: 26 crashes then COMPLETED with FailedRuns 0); a failure after
    progress beyond the previous failure's starts a new count."""
    _, c = daemon
    tid = _one_task(c, reports_progress=True)
    c.report_task_run(tid, "failed", node="n1", exit_code=1, generation=1, time=T0 + 2)
    assert (c.get_task(tid).failed_runs, c.get_task(tid).failures_without_progress) == (1, 1)
    c.report_progress([{"task_id": tid, "time": T0 + 3, "samples_done": 10.0, "nodes": 2}])
    t = c.get_task(tid)
    assert (t.failed_runs, t.failures_without_progress) == (1, 1)  # a report resets nothing
    c.report_task_run(tid, "failed", node="n1", exit_code=1, generation=2, time=T0 + 4)
    t = c.get_task(tid)  # progress since the last failure: a new count
    assert (t.failed_runs, t.failures_without_progress) == (2, 1) and not t.warnings
    # the same point again and again: each generation reports 10 samples and crashes
    for gen, at in ((3, 5), (4, 7)):
        c.report_progress([{"task_id": tid, "time": T0 + at, "samples_done": 10.0,
                            "nodes": 2}])
        r = c.report_task_run(tid, "failed", node="n1", exit_code=1, generation=gen,
                              time=T0 + at + 1)
    assert r.task.state == TaskState.FAILED
    assert (r.task.failed_runs, r.task.failures_without_progress) == (4, 3)
    assert "beyond 10 reported samples (4 failed runs in all)" in r.task.failure_reason


@pytest.mark.parametrize("generation", [0, 2, 2**40])
def test_a_generation_the_task_never_had_is_refused(daemon, generation):
    _, c = daemon
    tid = _one_task(c)
    key = status_key(c)
    with pytest.raises(FailedPrecondition) as info:
        c.report_task_run(tid, "failed", node="n1", exit_code=1, generation=generation,
                          time=T0 + 2)
    assert str(info.value).startswith("generation:")
    assert status_key(c) == key and c.get_task(tid).generation == 1


def test_a_run_report_from_the_future_is_refused_and_moves_no_clock(daemon):
    import time as _time

    _, c = daemon
    tid = _one_task(c)
    key = status_key(c)
    with pytest.raises(InvalidArgument) as info:
        c.report_task_run(tid, "started", node="n1", generation=1, time=_time.time() + 3600)
    assert str(info.value).startswith("time:")
    assert status_key(c) == key

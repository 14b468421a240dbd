"""Progress reports (``Tasks.ReportProgress``) over real gRPC: learned tasks are allocated with
the model their reports build, a report reaching the total work completes the task, bad
reports are refused naming the field and change nothing (the model is not poisoned), retries
are idempotent, everything survives a restart; the energy objectives."""

from __future__ import annotations

import pytest

from offcut.errors import FailedPrecondition, InvalidArgument, NotFound
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from daemon_helpers import T0, make_spec, status_key

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock


def learned_spec(name="learn", max_nodes=4, work=1e6, **kw) -> tasks_pb2.TaskSpec:
    """A task without a curve: the daemon learns it."""
    return tasks_pb2.TaskSpec(name=name, min_nodes=1, max_nodes=max_nodes,
                              total_work_samples=work, **kw)


def start_learned(client, nodes=4):
    client.report_nodes(T0, "slurm", 1, idle=[f"n{i}" for i in range(1, nodes + 1)])
    task = client.submit(learned_spec(), submit_time=T0 + 1).task
    assert task.state == TaskState.RUNNING and task.model.curve_node_counts
    return task


def report(client, task_id, t, samples, nodes, energy=None, request_id=""):
    r = {"task_id": task_id, "time": t, "samples_done": samples, "nodes": nodes}
    if energy is not None:
        r["energy_j"] = energy
    return client.report_progress([r], request_id=request_id)


def test_learned_task_is_measured_and_its_curve_used(daemon):
    _, c = daemon
    task = start_learned(c)
    n = len(task.nodes)
    report(c, task.task_id, T0 + 11, 100.0, n, energy=5_000.0)      # startup interval: unclean
    r = report(c, task.task_id, T0 + 31, 100.0 + 20 * 40.0, n, energy=5_000.0 + 20 * 900.0)
    got = r.tasks[0]
    assert [m.nodes for m in got.model.measured] == [n]
    m = got.model.measured[0]
    assert m.samples_per_s == pytest.approx(40.0) and m.seconds == pytest.approx(20.0)
    assert m.power_w == pytest.approx(900.0)
    assert got.work_done_samples == pytest.approx(900.0)
    assert got.energy_j == pytest.approx(23_000.0)
    # the allocation's curve passes through the measurement
    curve = dict(zip(got.model.curve_node_counts, got.model.curve_throughputs))
    assert curve[n] == pytest.approx(40.0)
    # the uncertainty band: around the measurement, widening to linear scaling above it
    low = dict(zip(got.model.curve_node_counts, got.model.curve_low))
    high = dict(zip(got.model.curve_node_counts, got.model.curve_high))
    assert low[n] <= 40.0 <= high[n]
    top = max(got.model.curve_node_counts)
    if top > n:
        assert low[top] == pytest.approx(40.0) and high[top] == pytest.approx(40.0 * top / n)
    assert got.rate_samples_per_s == pytest.approx(40.0)


def test_report_reaching_total_work_completes_and_reallocates(daemon):
    _, c = daemon
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2", "n3", "n4"])
    a = c.submit(learned_spec("a", work=1000.0), submit_time=T0 + 1).task
    b = c.submit(make_spec("b", max_nodes=4, reports_progress=True), submit_time=T0 + 1).task
    held = {t.task_id: len(t.nodes) for t in c.list_tasks()}
    assert sum(held.values()) == 4
    r = report(c, a.task_id, T0 + 50, 1000.0, held[a.task_id])
    assert list(r.decision.completed_task_ids) == [a.task_id]
    assert r.tasks[0].state == TaskState.COMPLETED
    assert len(c.get_task(b.task_id).nodes) == 4  # b got a's nodes
    # a modelled-but-reporting task is never completed by the model
    c.report_nodes(T0 + 1e6, "slurm", 2, idle=["n5"])
    t = c.get_task(b.task_id)
    assert t.state == TaskState.RUNNING and t.work_done_samples < 1e6


BAD = [
    (lambda tid, n: dict(task_id=tid, time=T0 + 40, samples_done=-1.0, nodes=n),
     InvalidArgument, "reports[0].samples_done"),
    (lambda tid, n: dict(task_id=tid, time=T0 + 40, samples_done=float("nan"), nodes=n),
     InvalidArgument, "reports[0].samples_done"),
    (lambda tid, n: dict(task_id=tid, time=T0 + 40, samples_done=500.0, nodes=n),
     FailedPrecondition, "reports[0].samples_done"),        # went down from 900
    (lambda tid, n: dict(task_id=tid, time=T0 + 20, samples_done=2000.0, nodes=n),
     FailedPrecondition, "reports[0].time"),                # before the last report
    (lambda tid, n: dict(task_id=tid, time=T0 + 40, samples_done=2000.0, nodes=n + 7),
     FailedPrecondition, "reports[0].nodes"),               # never held
    (lambda tid, n: dict(task_id=tid, time=T0 + 40, samples_done=2000.0, nodes=-1),
     InvalidArgument, "reports[0].nodes"),
    (lambda tid, n: dict(task_id=tid, time=T0 + 40, samples_done=2000.0, nodes=n,
                         energy_j=-5.0), InvalidArgument, "reports[0].energy_j"),
    (lambda tid, n: dict(task_id="t999999", time=T0 + 40, samples_done=1.0, nodes=n),
     NotFound, "reports[0].task_id"),
    (lambda tid, n: dict(task_id=tid, time=4e9, samples_done=2000.0, nodes=n),
     InvalidArgument, "reports[0].time"),                   # far in the future (year 2096)
]


@pytest.mark.parametrize("make,error,field", BAD)
def test_bad_reports_change_nothing_and_do_not_poison(daemon, make, error, field):
    _, c = daemon
    task = start_learned(c)
    n = len(task.nodes)
    report(c, task.task_id, T0 + 11, 100.0, n)
    report(c, task.task_id, T0 + 31, 900.0, n)   # 40 samples/s
    before = status_key(c)
    with pytest.raises(error) as exc:
        c.report_progress([make(task.task_id, n)])
    assert str(exc.value).startswith(field + ":")
    assert status_key(c) == before
    # the model still holds only the good measurement, and takes the next good one
    r = report(c, task.task_id, T0 + 41, 1300.0, n)
    (m,) = r.tasks[0].model.measured
    assert m.samples_per_s == pytest.approx(40.0) and m.seconds == pytest.approx(30.0)


def test_reports_for_modelled_or_finished_tasks_are_refused(daemon):
    _, c = daemon
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    modelled = c.submit(make_spec("m", max_nodes=2), submit_time=T0 + 1).task
    with pytest.raises(FailedPrecondition) as exc:
        report(c, modelled.task_id, T0 + 5, 10.0, 2)
    assert str(exc.value).startswith("reports[0].task_id" + ":") and "reports_progress" in str(exc.value)
    c.cancel(modelled.task_id)
    learned = c.submit(learned_spec("l", max_nodes=2), submit_time=T0 + 2).task
    c.cancel(learned.task_id)
    with pytest.raises(FailedPrecondition):
        report(c, learned.task_id, T0 + 5, 10.0, 0)
    with pytest.raises(InvalidArgument) as exc:
        c.report_progress([])
    assert str(exc.value).startswith("reports" + ":")


def test_spec_validation_of_learned_and_power_fields(daemon):
    _, c = daemon
    with pytest.raises(InvalidArgument) as exc:
        c.submit(learned_spec(power_w=[0.0, 100.0]))
    assert str(exc.value).startswith("spec.power_w" + ":")
    with pytest.raises(InvalidArgument) as exc:
        c.submit(make_spec(power_w=[0.0, 1.0]))
    assert str(exc.value).startswith("spec.power_w" + ":")


def test_retried_report_is_applied_once(daemon):
    _, c = daemon
    task = start_learned(c)
    n = len(task.nodes)
    first = report(c, task.task_id, T0 + 11, 100.0, n, request_id="r1")
    again = report(c, task.task_id, T0 + 11, 100.0, n, request_id="r1")
    assert again.decision.duplicate and again.decision.revision == first.decision.revision
    assert c.status().revision == first.decision.revision


def test_learned_model_survives_restart(daemons):
    srv, c = daemons.start()
    task = start_learned(c)
    n = len(task.nodes)
    report(c, task.task_id, T0 + 11, 100.0, n, energy=10.0)
    report(c, task.task_id, T0 + 31, 900.0, n, energy=20_010.0)
    before = status_key(c)
    model = c.get_task(task.task_id).model
    daemons.stop(srv)
    _, c = daemons.start()
    assert status_key(c) == before
    assert c.get_task(task.task_id).model == model
    # and it keeps learning from where it was
    r = report(c, task.task_id, T0 + 41, 1300.0, n)
    assert r.tasks[0].model.measured[0].seconds == pytest.approx(30.0)


def test_energy_objective_uses_fewer_nodes_when_scaling_wastes_power(daemons):
    """One task whose last nodes add little throughput but full power: the throughput
    objective gives it every node, samples per joule (unused nodes draw 250 W) prefers 4."""
    spec = make_spec("e", max_nodes=8, ns=(0, 1, 2, 4, 8), ps=(0.0, 100.0, 190.0, 300.0, 330.0),
                     power_w=[0.0, 1000.0, 2000.0, 4000.0, 8000.0])
    counts = {}
    for objective in ("throughput", "energy"):
        srv, c = daemons.start(objective, policy=objective)
        c.report_nodes(T0, "slurm", 1, idle=[f"n{i}" for i in range(8)])
        task = c.submit(spec, submit_time=T0 + 1).task
        counts[objective] = len(task.nodes)
        st = c.status()
        assert st.objective == objective
        c.report_nodes(T0 + 101, "slurm", 2, idle=["x1"])
        st = c.status()
        # 100 s at the placed count, power from the spec's curve; unused nodes at the idle draw
        power = dict(zip(spec.node_counts, spec.power_w))[counts[objective]]
        assert st.task_energy_j == pytest.approx(power * 100.0)
        daemons.stop(srv)
    assert counts == {"throughput": 8, "energy": 4}  # 300 / (4 * 750 + 8 * 250) is the best ratio


def test_training_side_reporter_reports_continues_and_completes(daemon):
    from offcut.client.progress import ProgressReporter

    srv, c = daemon
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    task = c.submit(learned_spec("train", max_nodes=2, work=10_000.0), submit_time=T0 + 1).task
    n = len(task.nodes)
    now = [T0 + 1]
    joules = [0.0]
    env = {"OFFCUT_TASK_ID": task.task_id, "OFFCUT_NUM_NODES": str(n),
           "OFFCUT_ADDRESS": srv.address}
    with ProgressReporter.from_env(env, every_s=30.0, clock=lambda: now[0],
                                   energy_j=lambda: joules[0]) as p:
        for _ in range(12):        # 10 s steps of 100 samples: a report every 30 s
            now[0] += 10
            joules[0] += 5_000.0
            p.add(100.0)
        assert p.reports == 4
    got = c.get_task(task.task_id)   # close() sent a last report
    assert got.model.last_samples_done == pytest.approx(1200.0)
    assert got.model.last_energy_j == pytest.approx(60_000.0)
    assert got.model.measured[0].samples_per_s == pytest.approx(10.0)
    # a restarted process continues the cumulative counters, and its report completes the task
    joules[0] = 0.0
    with ProgressReporter(srv.address, task.task_id, n, every_s=30.0, clock=lambda: now[0],
                          energy_j=lambda: joules[0]) as p:
        assert p.samples_done == pytest.approx(1200.0)
        now[0] += 60
        joules[0] = 1_000.0
        p.add(8_800.0)
    got = c.get_task(task.task_id)
    assert got.state == TaskState.COMPLETED
    assert got.energy_j == pytest.approx(61_000.0)
    with pytest.raises(ValueError, match="OFFCUT_TASK_ID"):
        ProgressReporter.from_env({})


def test_reporter_set_nodes_reports_the_old_count_first(daemon):
    from offcut.client.progress import ProgressReporter

    srv, c = daemon
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2"])
    task = c.submit(learned_spec("shrinking", max_nodes=2), submit_time=T0 + 1).task
    assert len(task.nodes) == 2
    now = [T0 + 1]
    p = ProgressReporter(srv.address, task.task_id, 2, every_s=1e9, clock=lambda: now[0])
    now[0] += 20
    p.add(400.0)
    c.report_nodes(T0 + 21, "slurm", 2, preempted=[task.nodes[0]])   # Slurm takes one node
    p.set_nodes(1)                       # reports the 2-node interval, then counts on 1 node
    assert p.reports == 1 and p.nodes == 1
    now[0] += 20
    p.add(150.0)
    p.close()
    got = c.get_task(task.task_id)
    assert got.model.last_samples_done == pytest.approx(550.0) and p.reports == 2
    p.set_nodes(1)                       # no change: no report
    assert p.reports == 2


def test_rescale_costs_never_take_a_reporting_task_below_its_last_report(daemon):
    """A preemption right after a report: the modelled cost (Tcdw x rate, here 30 s x 400
    samples/s) would take the task far below the samples it reported; it stops there."""
    _, c = daemon
    c.report_nodes(T0, "slurm", 1, idle=["n1", "n2", "n3", "n4"])
    spec = make_spec("r", max_nodes=4, ns=(0, 1, 2, 4), ps=(0.0, 100.0, 200.0, 400.0),
                     up=30.0, down=30.0, work=1e6, reports_progress=True)
    tid = c.submit(spec, submit_time=T0).task.task_id
    assert len(c.get_task(tid).nodes) == 4
    c.report_progress([{"task_id": tid, "time": T0 + 10, "samples_done": 3000.0, "nodes": 4}])
    c.report_nodes(T0 + 11, "slurm", 2, preempted=["n1", "n2"])
    task = c.get_task(tid)
    assert len(task.nodes) == 2 and task.preemptions == 1
    # 400 samples/s for the second after the report, then the cost: floored at the report
    assert task.work_done_samples == pytest.approx(3000.0)
    c.report_progress([{"task_id": tid, "time": T0 + 20, "samples_done": 4000.0, "nodes": 2}])
    assert c.get_task(tid).work_done_samples == pytest.approx(4000.0)

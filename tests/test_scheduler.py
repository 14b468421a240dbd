"""Tests of the deterministic core (docs/architecture.md, "Time and events",
"Tasks and the progress model" and "Allocation"): progress model, rescale and preemption costs,
exact completion, admission, validation, snapshots, persistence round trip, node placement, and
invariants under random event sequences (hypothesis). No gRPC here.

Expected values are derived by hand from the model in docs/architecture.md,
"Tasks and the progress model": rate = Ps(n) (piecewise linear) if n >= Jmin else 0; grow costs
Ps(c)*Tcup, shrink Ps(c)*Tcdw; preemption costs Tcdw*rate once per task per event.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offcut.daemon.app import placement
from offcut.daemon.app.scheduler import Scheduler, SolveRecord
from offcut.daemon.app.model import CancelEvent, NodeEvent, SubmitEvent
from offcut.taskspec import TaskSpec
from offcut.views import TaskState
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound, OffcutError

from daemon_helpers import Feed, core_spec, dp_record

T0 = 1_000_000.0


# ----------------------------------------------------------------------------- helpers
def greedy_in_order(problem) -> list[int]:
    """Each admitted task, in submit order, takes min(Jmax, what is left) (0 if below Jmin)."""
    left = problem.idle_nodes
    counts = []
    for j in range(problem.num_tasks):
        n = min(int(problem.max_nodes[j]), left)
        if n < int(problem.min_nodes[j]):
            n = 0
        counts.append(n)
        left -= n
    return counts


class Scripted:
    """An allocate callable: counts from ``fn(problem)``; records the problems it saw."""

    def __init__(self, fn=greedy_in_order):
        self.fn = fn
        self.problems = []

    def __call__(self, problem) -> SolveRecord:
        self.problems.append(problem)
        counts = [int(c) for c in self.fn(problem)]
        return SolveRecord(counts=counts, solver="scripted", status="optimal", objective=0.0,
                           bound=0.0, solve_ms=0.0)


def fixed(*counts):
    """Scripted allocation returning exactly ``counts``."""
    return Scripted(lambda problem: list(counts))


#: this file's tasks: the shared spec with 1e9 samples (none completes unless a test says so)
spec = functools.partial(core_spec, work=1e9)


def submit(t, s, owner="alice", request_id=""):
    return SubmitEvent(time=t, spec=s, owner=owner, request_id=request_id)


def check_invariants(core: Scheduler) -> None:
    held = []
    for task in core.tasks.values():
        n = len(task.nodes)
        for node in task.nodes:
            assert node in core.pool, f"{task.task_id} holds {node}, which is not idle"
            assert core.holder.get(node) == task.task_id
        held.extend(task.nodes)
        assert n == 0 or task.spec.min_nodes <= n <= task.spec.max_nodes, (task.task_id, n)
        assert task.work_done <= task.spec.total_work_samples * (1 + 1e-9) + 1e-9
        if task.state.finished:
            assert task.nodes == [] and task.rate == 0.0
        if task.state is TaskState.RUNNING:
            assert task.nodes
        assert task.rate == pytest.approx(task.spec.throughput_at(n))
    assert len(held) == len(set(held)), "a node is held by two tasks"
    assert set(core.holder) == set(held)
    assert len(held) <= len(core.pool)
    admitted = [t for t in core.tasks.values()
                if t.state in (TaskState.ADMITTED, TaskState.RUNNING)]
    assert len(admitted) <= core.max_running_tasks


# ----------------------------------------------------------------------------- progress
def test_progress_accrues_rate_times_interval():
    core = Scheduler()
    feed = Feed()
    alloc = Scripted()
    core.apply(submit(T0, spec()), alloc)
    out = core.apply(feed(T0, idle=["c1n1", "c1n2"]), alloc)
    task = core.tasks["t000001"]
    assert task.nodes == ["c1n1", "c1n2"] and task.state is TaskState.RUNNING
    assert task.rate == pytest.approx(18.0)  # Ps(2)
    assert [p.change for p in out.placements] == ["start"]

    out = core.apply(feed(T0 + 10, idle=["c1n3"]), alloc)
    # 10 s at 18 samples/s; growing to 3 nodes (Tcup = 0) is free
    assert out.interval_s == pytest.approx(10.0)
    assert out.progress_samples == pytest.approx(180.0)
    assert task.work_done == pytest.approx(180.0)
    assert len(task.nodes) == 3
    assert task.rate == pytest.approx(24.0)  # Ps(3) interpolated between (2, 18) and (4, 30)

    out = core.apply(feed(T0 + 15, idle=["c1n4"]), alloc)
    assert task.work_done == pytest.approx(180.0 + 5 * 24.0)
    assert core.total_samples == pytest.approx(300.0)
    assert task.rate == pytest.approx(30.0)


def test_below_min_nodes_earns_nothing():
    core = Scheduler()
    feed = Feed()
    s = spec(min_nodes=3, max_nodes=4)
    core.apply(submit(T0, s), Scripted())
    core.apply(feed(T0, idle=["a1", "a2"]), Scripted())
    task = core.tasks["t000001"]
    assert task.nodes == [] and task.state is TaskState.ADMITTED and task.rate == 0.0
    assert core.problem([task]).value_tables()[0].shape == (3,)
    core.apply(feed(T0 + 100, idle=["a3"]), Scripted())
    assert task.work_done == 0.0
    assert len(task.nodes) == 3


def test_exact_completion_releases_nodes_to_next_task():
    core = Scheduler()
    feed = Feed()
    a = spec("a", 1, 2, ns=(0, 1, 2), ps=(0.0, 10.0, 20.0), work=100.0)
    b = spec("b", 1, 2, ns=(0, 1, 2), ps=(0.0, 5.0, 8.0), up=3.0, down=3.0, work=1e6)
    alloc = Scripted()
    core.apply(submit(T0, a), alloc)
    core.apply(submit(T0, b), alloc)
    core.apply(feed(T0, idle=["c1n1", "c1n2"]), alloc)
    ta, tb = core.tasks["t000001"], core.tasks["t000002"]
    assert ta.nodes == ["c1n1", "c1n2"] and tb.nodes == []

    # A needs 100 / Ps(2) = 100 / 20 = 5 s: it completes at T0 + 5, inside the next interval
    out = core.apply(feed(T0 + 12, idle=["c2n1"]), alloc)
    assert ta.state is TaskState.COMPLETED
    assert ta.finish_time == pytest.approx(T0 + 5.0)
    assert ta.work_done == pytest.approx(100.0)
    assert ta.nodes == [] and ta.rate == 0.0
    assert out.completed_task_ids == ["t000001"]
    # B got A's two nodes at T0 + 5 (start from 0 nodes: no rescale cost) and earned
    # Ps(2) = 8 samples/s for the remaining 7 s; the new node c2n1 cannot grow it past Jmax=2
    assert tb.nodes == ["c1n1", "c1n2"]
    assert tb.work_done == pytest.approx(8.0 * 7.0)
    assert out.rescale_cost_samples == pytest.approx(0.0)
    changes = [(p.task_id, p.change) for p in out.placements]
    assert changes == [("t000001", "completed"), ("t000002", "start")]
    # progress in the interval: A's last 100 samples and B's 56
    assert out.progress_samples == pytest.approx(156.0)
    # the re-allocation at completion saw B with 0 nodes and 2 idle
    assert alloc.problems[-2].idle_nodes == 2
    assert list(alloc.problems[-2].current_nodes) == [0]


def test_completion_exactly_at_event_time():
    core = Scheduler()
    feed = Feed()
    alloc = Scripted()
    core.apply(submit(T0, spec(ns=(0, 1), ps=(0.0, 4.0), max_nodes=1, work=40.0)), alloc)
    core.apply(feed(T0, idle=["n1"]), alloc)
    out = core.apply(feed(T0 + 10, idle=["n2"]), alloc)
    task = core.tasks["t000001"]
    assert task.state is TaskState.COMPLETED and task.finish_time == pytest.approx(T0 + 10)
    assert out.completed_task_ids == ["t000001"]


# ----------------------------------------------------------------------------- rescale costs
def test_rescale_costs_grow_shrink_and_free_start():
    core = Scheduler()
    feed = Feed()
    s = spec(ns=(0, 1, 2, 3, 4), ps=(0.0, 10.0, 18.0, 24.0, 30.0), up=2.0, down=3.0)
    core.apply(submit(T0, s), fixed(0))
    out = core.apply(feed(T0, idle=["n1", "n2", "n3", "n4"]), fixed(2))
    task = core.tasks["t000001"]
    assert len(task.nodes) == 2
    assert task.work_done == 0.0 and out.rescale_cost_samples == 0.0  # start from 0 is free

    out = core.apply(feed(T0 + 10, idle=["n5"]), fixed(4))
    # 10 s at Ps(2) = 18, then grow from c = 2: Ps(2) * Tcup = 18 * 2 = 36
    assert out.rescale_cost_samples == pytest.approx(36.0)
    assert task.work_done == pytest.approx(180.0 - 36.0)
    assert out.progress_samples == pytest.approx(180.0 - 36.0)
    assert [p.change for p in out.placements] == ["grow"]
    assert task.rescales == 2

    out = core.apply(feed(T0 + 20, idle=["n6"]), fixed(1))
    # 10 s at Ps(4) = 30, then shrink from c = 4: Ps(4) * Tcdw = 30 * 3 = 90
    assert out.rescale_cost_samples == pytest.approx(90.0)
    assert task.work_done == pytest.approx(144.0 + 300.0 - 90.0)
    assert [p.change for p in out.placements] == ["shrink"]
    assert task.rate == pytest.approx(10.0)
    assert core.total_samples == pytest.approx(task.work_done)

    out = core.apply(feed(T0 + 30, idle=["n7"]), fixed(0))
    # 10 s at 10, then stop from c = 1: Ps(1) * Tcdw = 30
    assert out.rescale_cost_samples == pytest.approx(30.0)
    assert task.work_done == pytest.approx(354.0 + 100.0 - 30.0)
    assert [p.change for p in out.placements] == ["stop"]
    assert task.state is TaskState.ADMITTED and task.nodes == []


def test_preemption_costs_once_per_task_per_event():
    core = Scheduler()
    feed = Feed()
    s = spec(ns=(0, 1, 2, 3, 4), ps=(0.0, 10.0, 18.0, 24.0, 30.0), up=2.0, down=3.0)
    other = spec("other", ns=(0, 1, 2), ps=(0.0, 1.0, 2.0), max_nodes=2, down=5.0)
    core.apply(submit(T0, s), fixed(0))
    core.apply(submit(T0, other), fixed(0, 0))
    core.apply(feed(T0, idle=["n1", "n2", "n3", "n4", "m1", "m2"]), fixed(4, 2))
    task = core.tasks["t000001"]
    assert task.rate == pytest.approx(30.0)
    victims = task.nodes[:2]
    # the re-allocation keeps the 2 surviving nodes: no further rescale cost
    out = core.apply(feed(T0 + 10, preempted=victims), fixed(2, 2))
    assert out.nodes_left == 2 and out.tasks_preempted == 1
    assert out.preemption_cost_samples == pytest.approx(3.0 * 30.0)  # Tcdw * rate, once
    assert out.rescale_cost_samples == 0.0
    assert task.work_done == pytest.approx(300.0 - 90.0)
    assert task.preemptions == 1
    assert len(task.nodes) == 2 and not set(victims) & set(task.nodes)
    assert task.rate == pytest.approx(18.0)
    assert core.tasks["t000002"].preemptions == 0
    assert core.tasks["t000002"].work_done == pytest.approx(20.0)
    assert [p.change for p in out.placements] == ["preempted"]
    # preempting an idle node nobody holds costs nothing
    free_before = set(core.pool) - set(core.holder)
    assert free_before == set()
    core.apply(feed(T0 + 11, idle=["z1"]), fixed(2, 2))
    out = core.apply(feed(T0 + 12, preempted=["z1"]), fixed(2, 2))
    assert out.tasks_preempted == 0 and out.preemption_cost_samples == 0.0


def test_preemption_below_min_then_stop():
    """Losing nodes below Jmin: pay Tcdw*rate, then the allocation stops the task at no extra
    cost (R = Ps(c) with c < Jmin is 0)."""
    core = Scheduler()
    feed = Feed()
    s = spec(min_nodes=2, max_nodes=2, ns=(0, 2), ps=(0.0, 20.0), down=1.5)
    core.apply(submit(T0, s), Scripted())
    core.apply(feed(T0, idle=["n1", "n2"]), Scripted())
    out = core.apply(feed(T0 + 4, preempted=["n1"]), Scripted())
    task = core.tasks["t000001"]
    assert out.preemption_cost_samples == pytest.approx(1.5 * 20.0)
    assert out.rescale_cost_samples == 0.0
    assert task.nodes == [] and task.state is TaskState.ADMITTED
    assert task.work_done == pytest.approx(80.0 - 30.0)
    assert core.holder == {}


# ----------------------------------------------------------------------------- admission
def test_admission_in_submit_order_and_slot_freed_by_completion_and_cancel():
    core = Scheduler(max_running_tasks=2)
    feed = Feed()
    alloc = Scripted()
    small = dict(ns=(0, 1), ps=(0.0, 10.0), max_nodes=1)
    core.apply(submit(T0, spec("a", work=50.0, **small)), alloc)
    core.apply(submit(T0 + 1, spec("b", **small)), alloc)
    core.apply(submit(T0 + 2, spec("c", **small)), alloc)
    core.apply(submit(T0 + 3, spec("d", **small)), alloc)
    a, b, c, d = (core.tasks[f"t00000{i}"] for i in range(1, 5))
    assert [t.state for t in (a, b, c, d)] == [TaskState.ADMITTED, TaskState.ADMITTED,
                                               TaskState.QUEUED, TaskState.QUEUED]
    assert core.admitted() == [a, b]
    core.apply(feed(T0 + 3, idle=["n1", "n2", "n3"]), alloc)
    # only two admitted tasks: the third node stays free
    assert alloc.problems[-1].num_tasks == 2
    assert len(a.nodes) == len(b.nodes) == 1 and c.nodes == []
    # a finishes after 50 / 10 = 5 s -> c is admitted at that moment and takes a free node
    core.apply(feed(T0 + 20, idle=["n4"]), alloc)
    assert a.state is TaskState.COMPLETED and a.finish_time == pytest.approx(T0 + 8)
    assert c.state is TaskState.RUNNING and c.admit_time == pytest.approx(T0 + 8)
    assert c.work_done == pytest.approx(10.0 * 12)
    assert d.state is TaskState.QUEUED
    # cancelling b frees a slot for d
    out = core.apply(CancelEvent(T0 + 21, b.task_id), alloc)
    assert b.state is TaskState.CANCELLED and b.nodes == []
    assert d.state is TaskState.RUNNING and d.admit_time == pytest.approx(T0 + 21)
    assert ("t000002", "cancelled") in [(p.task_id, p.change) for p in out.placements]
    check_invariants(core)


# ----------------------------------------------------------------------------- validation
@pytest.fixture
def busy_core():
    core = Scheduler()
    feed = Feed("src")
    core.apply(submit(T0, spec()), Scripted())
    core.apply(feed(T0 + 5, idle=["c1n1", "c1n2", "c1n3"]), Scripted())
    return core, feed


def _rejected(core, event, exc_type, field):
    before = core.fingerprint()
    with pytest.raises(exc_type) as info:
        core.apply(event, Scripted())
    assert info.value.field == field
    assert field in str(info.value)
    assert core.fingerprint() == before
    return info.value


def test_event_older_than_clock_is_failed_precondition(busy_core):
    core, _ = busy_core
    _rejected(core, NodeEvent(T0 + 4, "src", 2, idle=("c1n4",)), FailedPrecondition, "time")
    # another source, same rule
    _rejected(core, NodeEvent(T0 + 1, "other", 1, idle=("c1n4",)), FailedPrecondition, "time")


def test_seq_not_increasing_is_failed_precondition(busy_core):
    core, _ = busy_core
    _rejected(core, NodeEvent(T0 + 6, "src", 1, idle=("c1n4",)), FailedPrecondition, "seq")
    _rejected(core, NodeEvent(T0 + 6, "src", 0, idle=("c1n4",)), InvalidArgument, "seq")


def test_a_decisions_stored_form_is_asdicts_without_the_copies():
    """``Decision.to_dict`` (the journal's stored reply, once per event) equals
    ``dataclasses.asdict`` field for field and in order, for decisions with placements of
    every kind of change, completions and ignored nodes; and it reads back equal."""
    from offcut.daemon.app.replies import decision_of
    from offcut.views import Decision

    core, feed = Scheduler(), Feed("src")
    events = [submit(T0, spec()), submit(T0 + 1, spec(), owner="bob"),
              feed(T0 + 2, idle=["c1n1", "c1n2", "c1n3", "c1n4"]),
              feed(T0 + 3, preempted=["c1n1"]), feed(T0 + 4, idle=["c1n1", "c1n9"]),
              CancelEvent(T0 + 5, "t000001"), feed(T0 + 1e6, idle=["c1n5"])]
    kinds = set()
    for event in events:
        out = core.apply(event, Scripted())
        decision = decision_of(out, "dp", sent_time=event.time - 1)
        kinds |= {p.change for p in decision.placements}
        stored = decision.to_dict()
        # (``duplicate`` is set on an answer, never journaled)
        as_dicts = {k: v for k, v in dataclasses.asdict(decision).items() if k != "duplicate"}
        assert stored == as_dicts
        assert list(stored) == list(as_dicts)
        assert json.dumps(stored) == json.dumps(as_dicts)
        assert Decision.from_dict(json.loads(json.dumps(stored))) == decision
    assert {"start", "preempted", "cancelled"} <= kinds, kinds


def test_sources_are_bounded(busy_core):
    """No sender grows the state by inventing node-event sources: past MAX_SOURCES a new
    source is RESOURCE_EXHAUSTED and changes nothing; known sources go on."""
    from offcut.daemon.app.scheduler.validation import MAX_SOURCES
    from offcut.errors import ResourceExhausted

    core, _ = busy_core
    for i in range(MAX_SOURCES - 1):  # "src" is the first
        core.apply(NodeEvent(T0 + 6, f"s{i}", 1, idle=(f"x{i}",)), Scripted())
    assert len(core.last_seq) == MAX_SOURCES
    error = _rejected(core, NodeEvent(T0 + 7, "one-more", 1, idle=("c1n4",)),
                      ResourceExhausted, "source")
    assert f"{MAX_SOURCES} sources" in str(error)
    core.apply(NodeEvent(T0 + 7, "s0", 2, idle=("c1n4",)), Scripted())
    assert "c1n4" in core.pool


@pytest.mark.parametrize("idle,preempted,field", [
    (("bad name",), (), "idle"),
    (("",), (), "idle"),
    (("-leading",), (), "idle"),
    (("x" * 129,), (), "idle"),
    (("c1n4", "c1n4"), (), "idle"),
    ((), ("c1n1", "no/slash"), "preempted"),
    (("c1n4",), ("c1n4",), "preempted"),
    ((), (), "idle"),
])
def test_malformed_node_events_are_invalid_argument(busy_core, idle, preempted, field):
    core, _ = busy_core
    _rejected(core, NodeEvent(T0 + 6, "src", 2, idle=idle, preempted=preempted),
              InvalidArgument, field)


def test_bad_source_and_time_are_invalid_argument(busy_core):
    core, _ = busy_core
    _rejected(core, NodeEvent(T0 + 6, "", 2, idle=("c1n4",)), InvalidArgument, "source")
    _rejected(core, NodeEvent(float("nan"), "src", 2, idle=("c1n4",)), InvalidArgument, "time")
    _rejected(core, NodeEvent(0.0, "src", 2, idle=("c1n4",)), InvalidArgument, "time")


def test_cancel_validation(busy_core):
    core, _ = busy_core
    _rejected(core, CancelEvent(T0 + 6, "t999999"), NotFound, "task_id")
    core.apply(CancelEvent(T0 + 6, "t000001"), Scripted())
    _rejected(core, CancelEvent(T0 + 7, "t000001"), FailedPrecondition, "task_id")


def test_invalid_spec_in_submit_changes_nothing(busy_core):
    core, _ = busy_core
    good = spec()
    bad = dataclasses.replace(good, max_nodes=0)
    _rejected(core, submit(T0 + 6, bad), InvalidArgument, "spec.max_nodes")
    _rejected(core, submit(T0 + 6, good, owner=""), InvalidArgument, "owner")


def test_unknown_preempted_node_is_ignored_not_an_error(busy_core):
    core, feed = busy_core
    task = core.tasks["t000001"]
    assert task.nodes == ["c1n1", "c1n2", "c1n3"]
    out = core.apply(feed(T0 + 6, preempted=["zz9n9", "c1n1"]), Scripted())
    assert out.ignored_nodes == ["zz9n9"]
    assert "c1n1" not in core.pool and "zz9n9" not in core.pool
    assert out.nodes_left == 1
    # preempting only an unknown node: accepted, nothing else changes
    before_pool = dict(core.pool)
    out = core.apply(feed(T0 + 7, preempted=["ghost1"]), Scripted())
    assert out.ignored_nodes == ["ghost1"] and out.placements == [] and out.solves == []
    assert core.pool == before_pool
    assert core.last_seq["src"] == 3
    assert task.nodes == ["c1n2", "c1n3"]


# ----------------------------------------------------------------------------- snapshots
def test_snapshot_is_diffed_into_idle_and_preempt():
    core = Scheduler()
    feed = Feed("watcher")
    s = spec(ns=(0, 1, 2, 3, 4), ps=(0.0, 10.0, 18.0, 24.0, 30.0), down=2.0)
    core.apply(submit(T0, s), Scripted())
    core.apply(feed(T0, idle=["a1", "a2", "a3"]), Scripted())
    task = core.tasks["t000001"]
    assert task.nodes == ["a1", "a2", "a3"]
    out = core.apply(feed(T0 + 10, idle=["a1", "a3", "b1", "b2"], snapshot=True), Scripted())
    assert sorted(core.pool) == ["a1", "a3", "b1", "b2"]
    assert out.nodes_left == 1 and out.nodes_joined == 2 and out.tasks_preempted == 1
    assert out.cause == "snapshot"
    # a2 was preempted: Tcdw * Ps(3) = 2 * 24 = 48; then regrow from 2 to 4 (Tcup = 0)
    assert out.preemption_cost_samples == pytest.approx(48.0)
    assert task.work_done == pytest.approx(240.0 - 48.0)
    assert task.nodes == ["a1", "a3", "b1", "b2"]
    assert core.pool["a1"] == T0 and core.pool["b1"] == T0 + 10
    # an empty snapshot is valid: everything leaves
    out = core.apply(feed(T0 + 11, idle=[], snapshot=True), Scripted())
    assert core.pool == {} and task.nodes == [] and out.nodes_left == 4
    # a snapshot equal to the pool changes nothing but the clock/seq
    core.apply(feed(T0 + 12, idle=["a1"]), Scripted())
    out = core.apply(feed(T0 + 13, idle=["a1"], snapshot=True), Scripted())
    assert out.nodes_left == 0 and out.nodes_joined == 0 and out.solves == []


# ----------------------------------------------------------------------------- persistence
def _events(seed: int, n: int = 40):
    rng = random.Random(seed)
    names = [f"c{c}n{i}" for c in range(1, 4) for i in range(1, 5)]
    feed = Feed("r")
    t = T0
    idle: set[str] = set()
    evs = []
    for _ in range(n):
        t += rng.uniform(0, 30)
        r = rng.random()
        if r < 0.2:
            k = rng.randint(1, 4)
            ns = (0, 1, 2, 4, 8)
            ps = tuple([0.0] + sorted(rng.uniform(1, 50) for _ in range(4)))
            evs.append(submit(t, spec(f"j{len(evs)}", rng.randint(1, 2), k + 2, ns=ns, ps=ps,
                                      up=rng.uniform(0, 5), down=rng.uniform(0, 5),
                                      work=rng.uniform(500, 5000))))
        elif r < 0.6:
            new = rng.sample([x for x in names if x not in idle] or names, 1)
            idle |= set(new)
            evs.append(feed(t, idle=new))
        elif idle:
            gone = rng.sample(sorted(idle), min(len(idle), rng.randint(1, 3)))
            idle -= set(gone)
            evs.append(feed(t, preempted=gone))
    return evs


def _outcome_key(out):
    return (out.time, out.revision, out.cause,
            [(p.task_id, p.change, tuple(p.nodes), p.previous_count, round(p.work_done, 6))
             for p in out.placements],
            [tuple(s.counts) for s in out.solves], out.completed_task_ids, out.ignored_nodes,
            round(out.progress_samples, 6), out.idle_nodes, out.nodes_in_use)


def test_to_dict_from_dict_round_trip_continues_identically():
    core = Scheduler(tfwd_s=7.0, max_running_tasks=3)
    events = _events(1)
    for ev in events[:25]:
        core.apply(ev, dp_record)
    data = json.loads(json.dumps(core.to_dict()))
    clone = Scheduler.from_dict(data)
    assert clone.fingerprint() == core.fingerprint()
    assert (clone.tfwd_s, clone.max_running_tasks) == (7.0, 3)
    assert clone.holder == core.holder
    assert clone.total_samples == core.total_samples
    for ev in events[25:]:
        a = core.apply(ev, dp_record)
        b = clone.apply(ev, dp_record)
        assert _outcome_key(a) == _outcome_key(b)
        assert clone.fingerprint() == core.fingerprint()
    assert core.revision == len(events)


# ----------------------------------------------------------------------------- placement
def test_cabinet_of_examples():
    assert placement.cabinet_of("c05n06") == "c05"
    assert placement.cabinet_of("nid00012") == "nid"
    assert placement.cabinet_of("rack2-node7") == "rack2"
    assert placement.cabinet_of("gpu") == "gpu"
    assert placement.cabinet_of("c1n1") == placement.cabinet_of("c1n2") != placement.cabinet_of("c2n1")


def test_shrink_keeps_whole_cabinets():
    kept, rel = placement.shrink(["a1n1", "a1n2", "b2n1", "b2n2", "b2n3"], 3)
    assert kept == ["b2n1", "b2n2", "b2n3"] and rel == ["a1n1", "a1n2"]
    kept, rel = placement.shrink(["a1n1", "a1n2", "a1n3", "b2n1"], 3)
    assert kept == ["a1n1", "a1n2", "a1n3"] and rel == ["b2n1"]
    kept, rel = placement.shrink(["b2n3", "a1n1", "b2n1"], 0)
    assert kept == [] and rel == ["a1n1", "b2n1", "b2n3"]
    with pytest.raises(ValueError):
        placement.shrink(["a1n1"], 2)
    with pytest.raises(ValueError):
        placement.shrink(["a1n1"], -1)


def test_grow_prefers_own_cabinet_then_longest_idle():
    idle_since = {"a1n1": 1.0, "a1n2": 2.0, "b2n2": 50.0, "b2n3": 40.0, "c3n1": 0.0}
    free = ["a1n1", "a1n2", "b2n2", "b2n3", "c3n1"]
    # own cabinet b2 first (longest idle inside it first), although c3n1 has idled longer
    assert placement.grow(["b2n1"], 1, free, idle_since) == ["b2n3"]
    assert placement.grow(["b2n1"], 2, free, idle_since) == ["b2n3", "b2n2"]
    # then whole cabinets by their longest-idle node: c3 (0) before a1 (1)
    assert placement.grow(["b2n1"], 4, free, idle_since) == ["b2n3", "b2n2", "c3n1", "a1n1"]
    # a task with no nodes: longest idle cabinet first
    assert placement.grow([], 2, free, idle_since) == ["c3n1", "a1n1"]
    assert placement.grow([], 0, free, idle_since) == []
    with pytest.raises(ValueError):
        placement.grow([], 6, free, idle_since)


def test_placement_is_deterministic():
    idle_since = {f"c{c}n{i}": float((c * 7 + i * 3) % 5) for c in range(4) for i in range(6)}
    free = sorted(idle_since)
    want = placement.grow(["c2n0"], 9, free, idle_since)
    for seed in range(5):
        shuffled = free[:]
        random.Random(seed).shuffle(shuffled)
        assert placement.grow(["c2n0"], 9, shuffled, idle_since) == want
    nodes = free[:13]
    want = placement.shrink(nodes, 5)
    for seed in range(5):
        shuffled = nodes[:]
        random.Random(seed).shuffle(shuffled)
        assert placement.shrink(shuffled, 5) == want


def test_core_grow_keeps_existing_nodes_no_migration():
    core = Scheduler()
    feed = Feed()
    s = spec(ns=(0, 1, 2, 3, 4), ps=(0.0, 10.0, 18.0, 24.0, 30.0))
    core.apply(submit(T0, s), fixed(0))
    core.apply(feed(T0, idle=["a1n1", "b1n1", "b1n2"]), fixed(1))
    task = core.tasks["t000001"]
    first = list(task.nodes)
    core.apply(feed(T0 + 1, idle=["c1n1"]), fixed(3))
    assert set(first) <= set(task.nodes)


# ----------------------------------------------------------------------------- hypothesis
NAMES = [f"c{c}n{i}" for c in (1, 2) for i in range(1, 5)]

op_strategy = st.one_of(
    st.tuples(st.just("idle"), st.lists(st.sampled_from(NAMES), max_size=4, unique=True)),
    st.tuples(st.just("preempt"), st.lists(st.sampled_from(NAMES + ["ghost1"]), max_size=4,
                                           unique=True)),
    st.tuples(st.just("snap"), st.lists(st.sampled_from(NAMES), max_size=8, unique=True)),
    st.tuples(st.just("submit"), st.tuples(st.integers(1, 3), st.integers(0, 3),
                                           st.floats(1, 100), st.floats(0, 5), st.floats(0, 5),
                                           st.floats(10, 3000))),
    st.tuples(st.just("cancel"), st.integers(1, 8)),
)


def op_event(core, feed, kind, arg, t):
    """The event of one drawn operation of :data:`op_strategy` at time ``t``."""
    if kind in ("idle", "preempt", "snap"):
        return feed(t, idle=arg if kind != "preempt" else (),
                    preempted=arg if kind == "preempt" else (), snapshot=kind == "snap")
    if kind == "submit":
        jmin, extra, p1, up, down, work = arg
        ps = (0.0, p1, p1 * 1.7, p1 * 2.2)
        return submit(t, spec(f"j{core.next_task_number}", jmin, jmin + extra,
                              ns=(0, 1, 3, 6), ps=ps, up=up, down=down, work=work))
    return CancelEvent(t, f"t{arg:06d}")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(op_strategy, st.floats(0, 40), st.booleans()), min_size=1,
                    max_size=25),
       max_running=st.integers(1, 4))
def test_random_sequences_keep_invariants(ops, max_running):
    core = Scheduler(tfwd_s=10.0, max_running_tasks=max_running)
    feed = Feed("h")
    t = T0
    for (kind, arg), dt, use_dp in ops:
        t += dt
        alloc = dp_record if use_dp else Scripted()
        ev = op_event(core, feed, kind, arg, t)
        before = core.fingerprint()
        try:
            out = core.apply(ev, alloc)
        except OffcutError:
            assert core.fingerprint() == before
            feed.seq -= 1 if isinstance(ev, NodeEvent) else 0
            continue
        assert out.revision == core.revision
        check_invariants(core)
        assert core.clock == pytest.approx(t)


def test_cancel_arriving_after_the_task_completed_changes_nothing_more():
    """A cancel stamped after the modelled completion time: the task completes first (at its
    exact time) and stays completed; the cancel releases nothing twice."""
    core = Scheduler(tfwd_s=10.0, max_running_tasks=2)
    alloc = Scripted()
    core.apply(NodeEvent(T0, "t", 1, idle=("c1n1", "c1n2")), alloc)
    out = core.apply(SubmitEvent(T0, spec(work=100.0), "alice"), alloc)  # 2 nodes: 18 samples/s
    task_id = out.task_id
    late = core.apply(CancelEvent(T0 + 60.0, task_id), alloc)
    task = core.tasks[task_id]
    assert task.state is TaskState.COMPLETED
    assert task.finish_time == pytest.approx(T0 + 100.0 / 18.0)
    assert late.completed_task_ids == [task_id]
    assert [p.change for p in late.placements] == ["completed"]
    assert core.holder == {}


def test_task_spec_create_refuses_a_misspelled_field():
    with pytest.raises(TypeError, match="total_work"):
        TaskSpec.create(name="x", min_nodes=1, max_nodes=2, node_counts=[0, 1, 2],
                        throughputs=[0.0, 1.0, 2.0], total_work=1e6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(op_strategy, st.floats(0, 40), st.booleans()), min_size=1,
                    max_size=30),
       max_running=st.integers(1, 4))
def test_changed_tasks_cover_every_task_an_event_changes(ops, max_running):
    """Incremental snapshots write only ``changed`` tasks: every task an event changes must
    be among them (a task outside them equals its form at the last snapshot), and the
    increments rebuild exactly the whole state."""
    core = Scheduler(tfwd_s=10.0, max_running_tasks=max_running,
                     finished_task_retention_s=60.0)
    feed = Feed("h")
    t = T0
    stored: dict[str, dict] = {}  # task id -> its form in the snapshots so far
    for i, ((kind, arg), dt, use_dp) in enumerate(ops):
        t += dt
        ev = op_event(core, feed, kind, arg, t)
        try:
            core.apply(ev, dp_record if use_dp else Scripted())
        except OffcutError:
            feed.seq -= 1 if isinstance(ev, NodeEvent) else 0
            continue
        for task_id, task in core.tasks.items():
            if task_id not in core.changed:
                assert task.to_dict() == stored[task_id], (task_id, ev)
        if i % 3 == 0:  # a snapshot now and then
            header, changed, removed = core.snapshot_changes()
            stored.update({d["task_id"]: d for d in changed})
            for task_id in removed:
                stored.pop(task_id, None)
            assert "tasks" not in header and not core.changed and not core.removed
            full = core.to_dict()
            assert {**header, "tasks": [stored[k] for k in sorted(stored)]} == full


def test_a_tasks_dict_form_is_json_owns_its_lists_and_rebuilds_the_task():
    from offcut.daemon.app.model import Task

    spec = TaskSpec.create(name="resnet", min_nodes=2, max_nodes=8, node_counts=(0, 2, 4, 8),
                           throughputs=(0.0, 10.0, 18.0, 30.0), rescale_up_s=5.0,
                           rescale_down_s=2.0, total_work_samples=1e6, command=("python", "t.py"),
                           constraint=("a100",), gpus_per_node=4)
    task = Task("t000007", spec, "alice", 1.7e9, TaskState.RUNNING, admit_time=1.7e9 + 1,
                nodes=["n1", "n2"], work_done=12.5, rate=18.0, rescales=3, node_seconds=40.0)
    d = task.to_dict()
    assert list(d) == [f.name for f in dataclasses.fields(Task)]
    assert d["state"] == "running" and d["learner"] is None and d["nodes"] == ["n1", "n2"]
    assert d["spec"] == {**{f.name: getattr(spec, f.name) for f in dataclasses.fields(TaskSpec)},
                         "node_counts": [0, 2, 4, 8], "throughputs": [0.0, 10.0, 18.0, 30.0],
                         "objective_values": list(spec.objective_values),
                         "command": ["python", "t.py"], "power_w": [], "constraint": ["a100"]}
    assert Task.from_dict(json.loads(json.dumps(d))) == task
    d["nodes"].append("n3")  # the dict is the caller's: the task keeps its nodes
    assert task.nodes == ["n1", "n2"]


def test_an_energy_report_for_a_task_its_event_would_retire_is_refused_and_changes_nothing():
    """A finished task still takes its ranks' energy reports until
    ``finished_task_retention_s`` after its finish; a report whose event would retire it
    first is FAILED_PRECONDITION at validation (it used to pass validation and fail half
    applied, the task already retired)."""
    from offcut.daemon.app.model import EnergyEvent
    from offcut.daemon.app.scheduler.ledger import generation_world_size

    core = Scheduler(finished_task_retention_s=60.0)
    feed = Feed("r")
    core.apply(feed(T0, idle=["n1", "n2"]), dp_record)
    tid = core.apply(SubmitEvent(T0, core_spec("e", max_nodes=2), "alice"), dp_record).task_id
    assert generation_world_size(core.tasks[tid], 1) == 2
    core.apply(CancelEvent(T0 + 1, tid), dp_record)
    core.apply(EnergyEvent(T0 + 30, tid, 1, 0, 5.0), dp_record)  # within the retention
    assert core.tasks[tid].energy.total_j == 5.0
    before = json.dumps(core.to_dict(), sort_keys=True), core.revision
    with pytest.raises(FailedPrecondition) as late:
        core.apply(EnergyEvent(T0 + 100, tid, 1, 1, 5.0), dp_record)
    assert late.value.field == "task_id" and "finished_task_retention_s" in str(late.value)
    assert (json.dumps(core.to_dict(), sort_keys=True), core.revision) == before

"""Each collaborator of the scheduler driven alone, without a :class:`Scheduler`
(docs/architecture.md, "Modules"; daemon/app/scheduler/interfaces.py): the state and its books, the
task models, the task lifecycle, the node pool, the progress model, the progress and energy
reports, the event validation, the policy runner, the re-allocator and the placement rules,
each over a hand-made :class:`SchedulerState` with real or stand-in neighbours (stand-ins
record what the collaborator asked of its narrow interface). Then the composition: the
scheduler's state fields read and write through, and a variant's placement rules reach both
the problem and the node names.

Expected values by hand from docs/architecture.md, "Tasks and the progress model": the shared
curve Ps = (0, 10, 18, 30) at (0, 1, 2, 4) nodes, so Ps(3) = 24.
"""

from __future__ import annotations

import json
from collections import Counter, deque

import pytest

from daemon_helpers import T0, core_spec
from offcut.daemon.app.learning import TaskLearner
from offcut.daemon.app.model import (CancelEvent, EnergyEvent, NodeEvent, NodeKind, ObjectiveSettings, ProgressEvent, ProgressItem, ProgressReport, SubmitEvent, Task)
from offcut.views import TaskState
from offcut.daemon.app.policies import PolicyError
from offcut.daemon.app.policies.guard import PolicyGuard
from offcut.daemon.app.scheduler import Outcome, Scheduler, SolveRecord
from offcut.views import PlacementChange
from offcut.daemon.app.scheduler.allocation import Reallocator
from offcut.daemon.app.scheduler.clock import ProgressModel
from offcut.daemon.app.scheduler.energy import EnergyReports
from offcut.daemon.app.scheduler.ledger import ledger_of
from offcut.daemon.app.scheduler.lifecycle import TaskLifecycle
from offcut.daemon.app.scheduler.models import TaskModels
from offcut.daemon.app.scheduler.nodes import NodePool
from offcut.daemon.app.scheduler.placement_rules import PlacementRules
from offcut.daemon.app.scheduler.policy_runner import PolicyRunner
from offcut.daemon.app.scheduler.progress import ProgressReports
from offcut.daemon.app.scheduler.state import SchedulerState, retained_bytes
from offcut.daemon.app.scheduler.validation import EventValidation
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound


# ----------------------------------------------------------------------------- helpers
def add_task(state: SchedulerState, task_id: str, nodes=(), owner="alice", **spec_kw) -> Task:
    """Put a task in ``state`` by hand (unfinished, holding ``nodes``, idle since T0): what
    the lifecycle's submit and the re-allocator would have done; rate from the spec."""
    task = Task(task_id, core_spec(task_id, **spec_kw), owner, T0)
    state.tasks[task_id] = task
    state.active[task_id] = task
    state.active_owners[owner] += 1
    state.retain(task)
    for n in nodes:
        state.pool.setdefault(n, T0)
        state.holder[n] = task_id
    task.nodes = sorted(nodes)
    if nodes:
        task.state = TaskState.RUNNING
        task.rate = task.spec.throughput_at(len(nodes))
    return task


class RecordingModels:
    """A :class:`~offcut.daemon.app.scheduler.interfaces.Models` stand-in: the spec's curve, no
    power, no learner; records :meth:`forget`."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def rate_at(self, task, n):
        return task.spec.throughput_at(n) if n >= task.spec.min_nodes else 0.0

    def power_at(self, task, n):
        return 0.0

    def forget(self, task_id):
        self.forgotten.append(task_id)


class RecordingLifecycle:
    """A :class:`~offcut.daemon.app.scheduler.interfaces.Lifecycle` stand-in: charges every cost
    whole, rate from the spec, no generations; records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def charge(self, task, cost, out):
        self.calls.append(("charge", task.task_id, cost))
        task.work_done -= cost
        out.progress_samples -= cost
        return cost

    def set_running_state(self, task):
        self.calls.append(("running", task.task_id, len(task.nodes)))
        task.rate = RecordingModels().rate_at(task, len(task.nodes))
        task.state = TaskState.RUNNING if task.nodes else TaskState.ADMITTED

    def change(self, task, change, before, t):
        self.calls.append(("change", task.task_id, change, before, t))
        return PlacementChange(task.task_id, task.spec.name, change, list(task.nodes), before,
                               task.rate, task.work_done, task.spec.total_work_samples, t)

    def finish(self, task, state, t, out):
        raise AssertionError("not expected here")


def record(*counts) -> SolveRecord:
    return SolveRecord(counts=list(counts), solver="scripted", status="optimal", objective=0.0,
                       bound=0.0, solve_ms=0.0)


class FixedHorizon(PlacementRules):
    """The daemon's rules with a fixed horizon of 42 s."""

    def horizon_s(self) -> float:
        return 42.0


# ----------------------------------------------------------------------------- the state
def test_state_alone_keeps_its_books_and_persists():
    state = SchedulerState(tfwd_s=7.0, max_running_tasks=1)
    a = add_task(state, "t000001", nodes=["c1n1"])
    b = add_task(state, "t000002", owner="bob")
    state.pool["c1n2"] = T0 + 1
    state.clock, state.last_seq, state.next_task_number = T0 + 5, {"w": 3}, 3
    assert state.admitted() == [a]  # maxJ = 1
    assert state.retained_owners == {"alice": (1, retained_bytes(a)),
                                      "bob": (1, retained_bytes(b))}

    out = Outcome(time=T0 + 5)
    state.fill_figures(out)
    assert (out.admitted_tasks, out.running_tasks, out.idle_nodes, out.nodes_in_use,
            out.rate_samples_per_s) == (1, 1, 2, 1, 10.0)
    state.mark_changed(CancelEvent(T0 + 5, "t000002"), out, set())
    assert state.changed == {"t000001", "t000002"}  # admitted, and the event's task

    clone = SchedulerState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert clone.fingerprint() == state.fingerprint()
    assert clone.holder == {"c1n1": "t000001"} and clone.active_owners == Counter(alice=1, bob=1)
    assert clone.retained_owners == state.retained_owners and clone.tfwd_s == 7.0
    header, changed, removed = state.snapshot_changes()
    assert "tasks" not in header and [d["task_id"] for d in changed] == ["t000001", "t000002"]
    assert removed == [] and not state.changed

    del state.tasks["t000002"]
    state.release(b)
    assert state.retained_owners == {"alice": (1, retained_bytes(a))}


# ----------------------------------------------------------------------------- task models
def test_task_models_alone_rates_powers_costs_and_cached_curves():
    state = SchedulerState(objective=ObjectiveSettings(node_power_w=500.0,
                                                       prior_rate_per_node=3.0))
    models = TaskModels(state)
    task = Task("t000001", core_spec(min_nodes=2, up=4.0, down=1.5), "alice", T0)
    assert models.rate_at(task, 1) == 0.0  # below Jmin
    assert models.rate_at(task, 3) == pytest.approx(24.0)
    assert models.power_at(task, 3) == 1500.0 and models.power_at(task, 0) == 0.0
    assert models.rescale_costs(task) == (4.0, 1.5)
    assert models.prior_rate() == 3.0  # no learner measured anything
    ns, ps, table = models.curves(task)
    assert list(ns) == [0, 1, 2, 4] and list(ps) == [0.0, 10.0, 18.0, 30.0]
    assert models.curves(task)[2] is table  # cached
    models.forget(task.task_id)
    assert models.curves(task)[2] is not table
    assert list(models.power_values(task, ns)) == [0.0, 500.0, 1000.0, 2000.0]


# ----------------------------------------------------------------------------- lifecycle
def test_task_lifecycle_alone_submits_runs_cancels_and_retires():
    state = SchedulerState(finished_task_retention_s=60.0)
    models = RecordingModels()
    life = TaskLifecycle(state, models)
    out = Outcome(time=T0)
    assert life.submit(SubmitEvent(T0, core_spec(down=2.0), "alice"), T0, out)
    task = state.tasks["t000001"]
    assert out.task_id == "t000001" and state.next_task_number == 2
    assert state.active == {"t000001": task} and state.active_owners == {"alice": 1}
    assert task.state is TaskState.QUEUED and task.learner is None

    state.pool.update({"c1n1": T0, "c1n2": T0})  # the re-allocator's part, by hand
    state.holder.update({"c1n1": task.task_id, "c1n2": task.task_id})
    task.nodes = ["c1n1", "c1n2"]
    life.set_running_state(task)
    assert task.state is TaskState.RUNNING and task.rate == 18.0
    change = life.change(task, "start", 0, T0)
    assert (change.change, change.nodes, change.generation, task.generation) == \
           ("start", ["c1n1", "c1n2"], 1, 1)
    assert ledger_of(task).world_size(1) == 2  # a generation's world size, for energy
    task.work_done = 100.0
    assert life.charge(task, 36.0, out) == 36.0 and task.work_done == 64.0
    assert out.progress_samples == -36.0 and state.total_samples == -36.0

    out = Outcome(time=T0 + 10)
    assert life.cancel(CancelEvent(T0 + 10, task.task_id), T0 + 10, out)
    assert task.state is TaskState.CANCELLED and task.nodes == [] and state.holder == {}
    assert state.active == {} and state.active_owners == {} and models.forgotten == [task.task_id]
    assert [p.change for p in out.placements] == ["cancelled"]
    assert state.finished == deque([(T0 + 10, task.task_id)])
    assert not life.cancel(CancelEvent(T0 + 11, task.task_id), T0 + 11, Outcome(T0 + 11))

    out = Outcome(time=T0 + 69)
    life.retire_finished(T0 + 69, out)  # 59 s after it finished: kept
    assert out.retired == [] and task.task_id in state.tasks
    life.retire_finished(T0 + 70, out)
    assert out.retired == [task] and state.tasks == {} and state.retained_owners == {}


# ----------------------------------------------------------------------------- node pool
def test_node_pool_alone_applies_node_events_and_charges_preemptions():
    state = SchedulerState()
    life = RecordingLifecycle()
    pool = NodePool(state, life)
    out = Outcome(time=T0)
    assert pool.apply(NodeEvent(T0, "w", 1, idle=("c1n2", "c1n1")), T0, out)
    assert state.pool == {"c1n2": T0, "c1n1": T0} and out.nodes_joined == 2
    assert state.last_seq == {"w": 1} and state.node_clock == T0 and out.cause == "nodes"
    task = add_task(state, "t000001", nodes=["c1n1", "c1n2"], down=2.0)  # 18 samples/s

    out = Outcome(time=T0 + 5)
    assert pool.apply(NodeEvent(T0 + 5, "w", 2, idle=("c1n1",), preempted=("c1n2", "ghost")),
                      T0 + 5, out)
    assert out.ignored_nodes == ["c1n1", "ghost"] and (out.nodes_left, out.tasks_preempted) == (1, 1)
    assert life.calls == [("charge", "t000001", 36.0), ("running", "t000001", 1),
                          ("change", "t000001", "preempted", 2, T0 + 5)]
    assert out.preemption_cost_samples == 36.0 and task.preemptions == 1
    assert task.nodes == ["c1n1"] and state.holder == {"c1n1": "t000001"}
    assert [(p.change, p.previous_count) for p in out.placements] == [("preempted", 2)]

    # a snapshot of the same idle set changes nothing; one that brings node kinds does
    same = NodeEvent(T0 + 6, "s", 1, idle=("c1n1",), snapshot=True)
    assert not pool.apply(same, T0 + 6, Outcome(time=T0 + 6))
    kinds = NodeEvent(T0 + 7, "s", 2, idle=("c1n1",), snapshot=True,
                      kinds=(("c1n1", NodeKind(4)),))
    out = Outcome(time=T0 + 7)
    assert pool.apply(kinds, T0 + 7, out) and out.cause == "snapshot"
    assert state.kinds == {"c1n1": NodeKind(4)} and state.last_seq == {"w": 2, "s": 2}


# ----------------------------------------------------------------------------- progress model
def test_progress_model_alone_completes_a_task_at_its_exact_time():
    state = SchedulerState()
    life = TaskLifecycle(state, TaskModels(state))
    asked: list[float] = []
    model = ProgressModel(state, life, lambda t, out, allocate: asked.append(t))
    model.advance(T0, Outcome(time=T0), allocate=None)  # the first event sets the clock
    assert state.clock == T0 and asked == []

    task = add_task(state, "t000001", nodes=["c1n1", "c1n2"], work=100.0)
    life.set_running_state(task)  # 18 samples/s, 2,000 W (the prior 1,000 W per node)
    done = T0 + 100.0 / 18.0
    out = Outcome(time=T0 + 10)
    model.advance(T0 + 10, out, allocate=None)
    assert task.state is TaskState.COMPLETED and task.finish_time == done
    assert asked == [done] and out.completed_task_ids == ["t000001"]
    assert task.work_done == 100.0 and out.progress_samples == pytest.approx(100.0)
    assert state.total_samples == pytest.approx(100.0) and state.clock == T0 + 10
    assert task.energy_j == pytest.approx(2000.0 * 100.0 / 18.0)
    assert state.used_node_seconds == pytest.approx(2 * 100.0 / 18.0)  # released at the end
    assert state.idle_node_seconds == pytest.approx(2 * 10.0)


# ----------------------------------------------------------------------------- progress reports
def test_progress_reports_alone_replace_progress_and_complete_or_start_the_final_phase():
    state = SchedulerState(final_grace_s=30.0)
    models = TaskModels(state)
    life = TaskLifecycle(state, models)
    reports = ProgressReports(state, models, life)
    launched = add_task(state, "t000001", nodes=["c1n1"], work=1000.0, reports_progress=True)
    modelled = add_task(state, "t000002", nodes=["c1n2"], work=1000.0, reports_progress=True)
    launched.launches = 1  # a launcher runs it: its processes get final_grace_s to exit
    for task in (launched, modelled):
        task.learner = TaskLearner()
        task.learner.on_allocation(T0, 1, "start")

    def report(task, t, samples, energy=None):
        return ProgressItem(task.task_id, ProgressReport(t, samples, 1, energy))

    out = Outcome(time=T0 + 10)
    reports.apply(ProgressEvent(T0 + 10, (report(launched, T0 + 10, 500.0, 40.0),)), T0 + 10, out)
    assert launched.work_done == 500.0 and out.progress_samples == 500.0
    assert state.total_samples == 500.0
    assert launched.energy_j == 40.0 and state.task_energy_j == 40.0

    out = Outcome(time=T0 + 20)
    event = ProgressEvent(T0 + 20, (report(launched, T0 + 20, 1000.0),
                                    report(modelled, T0 + 20, 1000.0)))
    assert reports.apply(event, T0 + 20, out)  # the allocation must be solved again
    assert launched.work_reached_time == T0 + 20 and launched.state is TaskState.RUNNING
    assert modelled.state is TaskState.COMPLETED and out.completed_task_ids == ["t000002"]
    assert launched.nodes == ["c1n1"] and state.holder == {"c1n1": "t000001"}


# ----------------------------------------------------------------------------- energy reports
def test_energy_reports_alone_check_and_record_per_rank():
    state = SchedulerState()
    task = add_task(state, "t000001", nodes=["c1n1", "c1n2"])
    task.generation = 1
    ledger_of(task).start_generation(1, 2)  # 2 processes
    energy = EnergyReports(state)
    with pytest.raises(NotFound):
        energy.validate(EnergyEvent(T0, "t000009", 1, 0, 1.0))
    with pytest.raises(InvalidArgument) as rank:
        energy.validate(EnergyEvent(T0, task.task_id, 1, 2, 1.0))
    with pytest.raises(FailedPrecondition) as generation:
        energy.validate(EnergyEvent(T0, task.task_id, 2, 0, 1.0))
    with pytest.raises(InvalidArgument) as joules:
        energy.validate(EnergyEvent(T0, task.task_id, 1, 0, float("nan")))
    assert (rank.value.field, generation.value.field, joules.value.field) == \
           ("rank", "generation", "joules")
    assert task.energy.total_j == 0.0  # validation changes nothing

    for rank_, joules_ in ((0, 5.0), (0, 3.0), (1, 7.0)):  # a lower figure changes nothing
        out = Outcome(time=T0)
        assert energy.apply(EnergyEvent(T0, task.task_id, 1, rank_, joules_), T0, out) is False
        assert out.task_id == task.task_id
    assert task.energy.total_j == 12.0 and task.energy.last() == (1, 12.0, 2, 2)


# ----------------------------------------------------------------------------- validation
def test_event_validation_alone_refuses_without_changing_state():
    state = SchedulerState()
    state.last_seq["w"], state.clock = 3, T0
    energy_checked: list = []
    validation = EventValidation(state, energy_checked.append)
    before = state.fingerprint()
    with pytest.raises(FailedPrecondition) as seq:
        validation.validate(NodeEvent(T0 + 1, "w", 3, idle=("c1n1",)))
    with pytest.raises(FailedPrecondition) as time:
        validation.validate(NodeEvent(T0 - 1, "w", 4, idle=("c1n1",)))
    with pytest.raises(InvalidArgument) as empty:
        validation.validate(NodeEvent(T0 + 1, "w", 4))
    with pytest.raises(NotFound):
        validation.validate(CancelEvent(T0 + 1, "t000001"))
    assert (seq.value.field, time.value.field, empty.value.field) == ("seq", "time", "idle")
    validation.validate(NodeEvent(T0 + 1, "w", 4, idle=("c1n1",)))  # accepted, not applied
    energy = EnergyEvent(T0 + 1, "t000001", 1, 0, 1.0)
    validation.validate(energy)  # the energy reports' own check decides
    assert energy_checked == [energy] and state.fingerprint() == before


# ----------------------------------------------------------------------------- policy runner
def test_policy_runner_alone_builds_the_problem_and_returns_checked_counts():
    state = SchedulerState()
    state.pool.update({"c1n1": T0, "c1n2": T0, "c1n3": T0})
    a = add_task(state, "t000001", min_nodes=2, max_nodes=4)
    b = add_task(state, "t000002", owner="bob", max_nodes=2)
    a.node_seconds, b.node_seconds = 5.0, 7.0
    runner = PolicyRunner(state, TaskModels(state), FixedHorizon(state))
    problem = runner.problem([a, b])
    assert problem.idle_nodes == 3 and problem.tfwd_s == 42.0  # the rules' horizon
    assert list(problem.min_nodes) == [2, 1] and list(problem.max_nodes) == [4, 2]
    assert runner.problem([a], idle_nodes=1).idle_nodes == 1
    assert runner.owner_node_seconds() == {"alice": 5.0, "bob": 7.0}

    seen = []
    out = Outcome(time=T0)
    assert runner.guard is None
    counts = runner.counts([a, b], T0, out, lambda p: seen.append(p) or record(2, 1))
    assert counts == [2, 1] and [s.counts for s in out.solves] == [[2, 1]]
    assert len(seen) == 1 and seen[0].tfwd_s == 42.0
    assert out.policy_answers == []  # a built-in policy: nothing to journal besides its solves
    assert isinstance(runner.guard, PolicyGuard)  # made on first use
    with pytest.raises(PolicyError, match="throughput"):  # counts it cannot apply
        runner.counts([a, b], T0, Outcome(time=T0), lambda p: record(4, 2))
    state.objective = ObjectiveSettings(objective="no_such_policy")
    with pytest.raises(PolicyError, match="no_such_policy"):
        runner.policy()


# ----------------------------------------------------------------------------- re-allocator
class LastFreeFirst(PlacementRules):
    """Rules that pick the last free nodes first; records what they were asked."""

    def __init__(self, state):
        super().__init__(state)
        self.asked: list[tuple] = []

    def pick_free_nodes(self, task, extra, free, t):
        self.asked.append(("pick", task.task_id, extra, tuple(free)))
        return free[len(free) - extra:][::-1]

    def shrink_nodes(self, task, keep, t):
        self.asked.append(("shrink", task.task_id, keep))
        return task.nodes[:keep], task.nodes[keep:]


def test_reallocator_alone_places_the_counts_by_the_rules_and_charges_rescales():
    state = SchedulerState()
    state.pool.update({"c1n1": T0, "c1n2": T0, "c1n3": T0, "c1n4": T0})
    task = add_task(state, "t000001", up=1.0, down=2.0)
    life, rules = RecordingLifecycle(), LastFreeFirst(state)
    answers = [[3], [1]]
    asked = []

    def counts(tasks, t, out, allocate, idle_nodes):
        asked.append(([x.task_id for x in tasks], t, idle_nodes))
        return answers.pop(0)

    realloc = Reallocator(state, TaskModels(state), life, rules, counts)
    out = Outcome(time=T0 + 5)
    realloc.reallocate(T0 + 5, out, allocate=None)
    assert asked == [(["t000001"], T0 + 5, 4)]
    assert rules.asked == [("pick", "t000001", 3, ("c1n1", "c1n2", "c1n3", "c1n4"))]
    assert task.nodes == ["c1n2", "c1n3", "c1n4"] and task.admit_time == T0 + 5
    assert state.holder == dict.fromkeys(["c1n2", "c1n3", "c1n4"], "t000001")
    assert life.calls == [("charge", "t000001", 0.0), ("running", "t000001", 3),  # Ps(0) x Tcup
                          ("change", "t000001", "start", 0, T0 + 5)]
    assert [p.change for p in out.placements] == ["start"] and task.rescales == 1

    life.calls.clear()
    out = Outcome(time=T0 + 6)
    realloc.reallocate(T0 + 6, out, allocate=None)  # shrink to 1: Ps(3) x Tcdw = 48
    assert rules.asked[-1] == ("shrink", "t000001", 1)
    assert task.nodes == ["c1n2"] and state.holder == {"c1n2": "t000001"}
    assert life.calls[0] == ("charge", "t000001", 48.0) and out.rescale_cost_samples == 48.0
    assert [p.change for p in out.placements] == ["shrink"]


def test_reallocator_groups_tasks_by_the_nodes_they_fit():
    state = SchedulerState()
    state.pool.update({"g1": T0, "c1n1": T0, "g2": T0})
    state.kinds = {"g1": NodeKind(4), "g2": NodeKind(8)}
    gpu = add_task(state, "t000001", gpus_per_node=4)
    plain = add_task(state, "t000002")
    big = add_task(state, "t000003", gpus_per_node=2)
    realloc = Reallocator(state, TaskModels(state), RecordingLifecycle(), PlacementRules(state),
                          counts=None)
    groups = realloc.node_groups([gpu, plain, big])
    # the fewest nodes first; tasks that select the same nodes share a group, in given order
    assert [(list(nodes), [t.task_id for t in tasks]) for nodes, tasks in groups] == \
           [(["c1n1"], ["t000002"]), (["g1", "g2"], ["t000001", "t000003"])]
    state.kinds = {}
    [(nodes, tasks)] = realloc.node_groups([plain])  # no kinds, no needs: one group ...
    state.pool["c1n2"] = T0
    assert "c1n2" in nodes and tasks == [plain]  # ... of the pool itself, not a copy


# ----------------------------------------------------------------------------- placement rules
def test_placement_rules_alone_horizon_and_node_names():
    state = SchedulerState(tfwd_s=9.0)
    state.pool.update({"a1n1": 0.5, "b2n1": 1.0, "b2n2": 3.0, "b2n3": 2.0})
    rules = PlacementRules(state)
    assert rules.horizon_s() == 9.0
    task = Task("t000001", core_spec(), "alice", T0, nodes=["b2n3"])
    # its own cabinet first, the longest idle first, although a1n1 idled longer
    assert rules.pick_free_nodes(task, 2, ["a1n1", "b2n1", "b2n2"], T0) == ["b2n1", "b2n2"]
    task.nodes = ["a1n1", "b2n1", "b2n2"]
    assert rules.shrink_nodes(task, 2, T0) == (["b2n1", "b2n2"], ["a1n1"])  # whole cabinets
    other = Task("t000002", core_spec(), "bob", T0)
    assert rules.growth_order([task, other], [3, 1]) == [(task, 3), (other, 1)]


# ----------------------------------------------------------------------------- composition
def test_scheduler_reads_and_writes_its_state_and_takes_a_variants_rules():
    core = Scheduler(tfwd_s=7.0)
    assert core.pool is core.state.pool and core.tasks is core.state.tasks
    core.tfwd_s = 5.0
    assert core.state.tfwd_s == 5.0 and core.to_dict()["tfwd_s"] == 5.0
    guard = PolicyGuard()
    core.policy_guard = guard
    assert core.policies.guard is guard and core.policy_guard_in_use() is guard

    rules = LastFreeFirst(core.state)
    rules.horizon_s = lambda: 42.0
    core.use_placement_rules(rules)
    problems = []

    def allocate(problem):
        problems.append(problem)
        return record(2)

    core.apply(SubmitEvent(T0, core_spec(), "alice"), allocate)
    core.apply(NodeEvent(T0, "w", 1, idle=("c1n1", "c1n2", "c1n3")), allocate)
    assert problems[-1].tfwd_s == 42.0  # the rules' horizon reached the problem
    assert core.tasks["t000001"].nodes == ["c1n2", "c1n3"]  # and their node names
    assert core.problem([core.tasks["t000001"]]).tfwd_s == 42.0

    clone = Scheduler.from_dict(json.loads(json.dumps(core.to_dict())))
    assert clone.fingerprint() == core.fingerprint()
    assert type(clone.rules) is PlacementRules  # not persisted: the daemon's own again
    assert clone.problem([clone.tasks["t000001"]]).tfwd_s == 5.0

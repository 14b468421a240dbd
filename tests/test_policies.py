"""Allocation policies (docs/architecture.md, "Allocation policies"): the interface, the
built-ins (throughput and energy exactly as before, fair_share), the registry with real entry
points, the core's check of a policy's answer, a fair_share daemon surviving ``kill -9``, the
replay's owners and per-owner node-hours."""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from offcut.client import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.daemon.__main__ import app as offcutd
from offcut.daemon.config import OBJECTIVES, ConfigError, DaemonConfig, load_config
from offcut.daemon.app.scheduler import Scheduler, SolveRecord
from offcut.daemon.app.model import ObjectiveSettings, SubmitEvent, Task
from offcut.taskspec import TaskSpec
from offcut.daemon.app.policies import (BUILTIN_POLICIES, AllocationPolicy, AllocationRequest,
                                    PolicyError, PolicyTask, available_policies, check_counts,
                                    get_policy, policy_class, subproblem)
from offcut.daemon.app.policies.energy import EnergyPolicy, ZeusCostPolicy
from offcut.daemon.app.policies.fair_share import FairSharePolicy, water_fill
from offcut.daemon.app.policies.throughput import ThroughputPolicy
from offcut.daemon.app.solvers.dp import solve_dp
from offcut.daemon.app.solvers.fractional import EnergyTerms, solve_ratio
from offcut.daemon.app.solvers.problem import AllocationProblem
from offcut.replay.owners import NodeTime, assign_owners, fairness
from solver_helpers import fit_current

from daemon_helpers import T0, Feed, core_spec, decision_key, dp_record, make_spec, status_key

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


# ----------------------------------------------------------------------------- helpers
class Recording:
    """A solve callable (exact dp) that keeps the problems it was asked, in order."""

    def __init__(self):
        self.problems: list[AllocationProblem] = []

    def __call__(self, problem: AllocationProblem) -> SolveRecord:
        self.problems.append(problem)
        return dp_record(problem)


def random_problem(rng: np.random.Generator, max_tasks: int = 5, max_nodes: int = 14
                   ) -> AllocationProblem:
    """A valid problem: curves with 1-4 points after 0, c_j anywhere with sum <= N."""
    J = int(rng.integers(1, max_tasks + 1))
    N = int(rng.integers(0, max_nodes + 1))
    jmin = rng.integers(1, 4, J)
    jmax = jmin + rng.integers(0, 8, J)
    ns, os_ = [], []
    for _ in range(J):
        pts = np.unique(rng.choice(np.arange(1, 15), size=int(rng.integers(1, 5)), replace=False))
        ns.append(np.concatenate(([0], pts)).astype(float))
        os_.append(np.cumsum(rng.uniform(0, 100, len(pts) + 1)) * (rng.random() < 0.8))
    cur = rng.integers(0, 6, J)
    fit_current(cur, N)
    return AllocationProblem(idle_nodes=N, current_nodes=cur, min_nodes=jmin, max_nodes=jmax,
                             node_counts=ns, objective_values=os_,
                             tfwd_s=float(rng.uniform(1, 30)), rescale_up_s=rng.uniform(0, 30, J),
                             rescale_down_s=rng.uniform(0, 30, J))


def views(owners: list[str], used: list[float] | None = None) -> list[PolicyTask]:
    used = used or [0.0] * len(owners)
    return [PolicyTask(f"t{j:06d}", o, T0 + j, u) for j, (o, u) in enumerate(zip(owners, used))]


#: this file's tasks: the shared spec on 1-8 nodes, 80 samples/s on 8, 1e12 samples
spec = functools.partial(core_spec, max_nodes=8, ns=(0, 8), ps=(0.0, 80.0), work=1e12)


def nodes_of(core: Scheduler) -> dict[str, int]:
    return {t.spec.name: len(t.nodes) for t in core.tasks.values()}


# ----------------------------------------------------------------------------- registry
def test_builtins_are_the_configs_names_and_available():
    assert tuple(BUILTIN_POLICIES) == OBJECTIVES
    assert available_policies()[:4] == list(OBJECTIVES)
    for name, cls in BUILTIN_POLICIES.items():
        assert cls.name == name and isinstance(get_policy(name), AllocationPolicy)


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(PolicyError) as err:
        policy_class("nope")
    msg = str(err.value)
    assert "unknown allocation policy 'nope'" in msg
    assert "throughput, energy, zeus_cost, fair_share" in msg and "offcut.policies" in msg


def test_offcutd_refuses_an_unknown_policy_at_start(tmp_path):
    res = runner.invoke(offcutd, ["--policy", "nope", "--state", str(tmp_path / "s.sqlite"),
                                  "--listen", f"unix://{tmp_path}/s.sock"])
    assert res.exit_code == 2, res.output
    assert "unknown allocation policy 'nope'" in res.stderr
    assert "throughput, energy, zeus_cost, fair_share" in res.stderr
    assert "Traceback" not in res.output and not (tmp_path / "s.sqlite").exists()


def test_policy_is_one_setting_without_an_older_name(tmp_path):
    assert DaemonConfig().policy == "throughput"
    assert DaemonConfig(policy="fair_share").objective_settings().objective == "fair_share"
    path = tmp_path / "offcut.toml"
    path.write_text('policy = "zeus_cost"\n')
    assert load_config(path, {}).objective_settings().objective == "zeus_cost"
    # ``objective``, the pre-release name, is an unknown setting and flag like any other
    path.write_text('objective = "zeus_cost"\n')
    with pytest.raises(ConfigError, match="objective"):
        load_config(path, {})
    res = runner.invoke(offcutd, ["--policy", "energy", "--objective", "fair_share"])
    assert res.exit_code == 2 and "--objective" in res.stderr
    with pytest.raises(ConfigError, match="policy"):
        load_config(None, {"policy": "no spaces"})


# ----------------------------------------------------------------------------- answers
def test_the_core_checks_a_policys_answer():
    p = AllocationProblem(idle_nodes=5, current_nodes=[0, 0], min_nodes=[2, 1],
                          max_nodes=[4, 3], node_counts=[[0, 4], [0, 3]],
                          objective_values=[[0, 4], [0, 3]], tfwd_s=10, rescale_up_s=[0, 0],
                          rescale_down_s=[0, 0])
    for ok in (np.array([2, 3]), [2, 3], (np.int32(2), 3), [0, 0]):
        answer = check_counts("x", ok, p)
        assert answer == [int(c) for c in ok] and all(type(c) is int for c in answer)
    for counts, needle in (([1], "answered 1 counts for 2"), ([1, 0], "task 0 gets 1 nodes"),
                           ([0, 4], "task 1 gets 4 nodes"), ([4, 3], "uses 7 nodes, only 5"),
                           ([2, np.int64(4)], "task 1 gets 4 nodes"),
                           ([2.0, 1], "count 0 is 2.0"), ([2, True], "count 1 is True"),
                           (None, "not a sequence")):
        with pytest.raises(PolicyError, match=needle) as err:
            check_counts("my_policy", counts, p)
        assert "'my_policy'" in str(err.value)


def test_a_requests_task_views_may_come_from_a_function_called_on_first_use():
    p = AllocationProblem(idle_nodes=5, current_nodes=[0, 0], min_nodes=[2, 1],
                          max_nodes=[4, 3], node_counts=[[0, 4], [0, 3]],
                          objective_values=[[0, 4], [0, 3]], tfwd_s=10, rescale_up_s=[0, 0],
                          rescale_down_s=[0, 0])
    calls = []

    def make():
        calls.append(1)
        return views(["alice", "bob"], [3.0, 4.0])

    request = AllocationRequest(p, make, ObjectiveSettings(), T0)
    assert calls == []  # a policy that never looks costs nothing
    assert [t.owner for t in request.tasks] == ["alice", "bob"]
    assert request.owner_node_seconds() == {"alice": 3.0, "bob": 4.0}
    assert request.tasks is request.tasks and calls == [1]  # made once
    short = AllocationRequest(p, lambda: views(["alice"]), ObjectiveSettings(), T0)
    with pytest.raises(ValueError, match="1 task views for a problem of 2 tasks"):
        short.tasks
    with pytest.raises(ValueError, match="1 task views for a problem of 2 tasks"):
        AllocationRequest(p, views(["alice"]), ObjectiveSettings(), T0)


# ------------------------------------------------------------- throughput and energy: as before
def test_throughput_policy_is_one_solve_of_the_problem():
    rng = np.random.default_rng(1)
    for _ in range(200):
        p = random_problem(rng)
        solve = Recording()
        counts = ThroughputPolicy().allocate(AllocationRequest(p, views(["a"] * p.num_tasks),
                                                               ObjectiveSettings(), T0), solve)
        assert solve.problems == [p] and solve.problems[0] is p
        assert counts == solve_dp(p).counts.tolist()


@pytest.mark.parametrize("policy, eta", [(EnergyPolicy(), 1.0), (ZeusCostPolicy(), 0.3)])
def test_energy_policies_are_dinkelbach_on_the_requests_power(policy, eta):
    rng = np.random.default_rng(2)
    settings = ObjectiveSettings(objective=policy.name, eta=0.3, idle_node_power_w=120.0,
                                 node_max_power_w=900.0)
    for _ in range(150):
        p = random_problem(rng)
        power = [ns * rng.uniform(50, 400) + 10.0 * (ns > 0) for ns in p.node_counts]
        asked = []
        request = AllocationRequest(p, views(["a"] * p.num_tasks), settings, T0,
                                    power_values=lambda: asked.append(1) or power)
        solve = Recording()
        counts = policy.allocate(request, solve)
        ref_solve = Recording()
        ref = solve_ratio(p, EnergyTerms(eta=eta, idle_node_power_w=120.0,
                                         node_max_power_w=900.0, power_values=power), ref_solve)
        assert counts == ref.counts.tolist() and asked == [1]
        assert [x.to_record() for x in solve.problems] == [x.to_record() for x in ref_solve.problems]


class LegacyScheduler(Scheduler):
    """The core's allocation rule before policies existed (daemon/core.py at 3593fb3, now offcut.daemon.app.scheduler), verbatim
    but for the hook it now lives in."""

    def _allocation_counts(self, tasks, t, out, allocate, idle_nodes=None):
        problem = self.problem(tasks, idle_nodes)
        if self.objective.objective == "throughput":
            answer = allocate(problem)
            out.solves.append(answer)
            return [int(c) for c in answer.counts]

        def solve(p):
            record = allocate(p)
            out.solves.append(record)
            return record
        eta = {"throughput": 0.0, "energy": 1.0}.get(self.objective.objective, self.objective.eta)
        terms = EnergyTerms(eta=eta, idle_node_power_w=self.objective.idle_node_power_w,
                            node_max_power_w=self.objective.node_max_power_w,
                            power_values=[self._power_values(t, ns)
                                          for t, ns in zip(tasks, problem.node_counts)])
        return [int(c) for c in solve_ratio(problem, terms, solve).counts]


def demo_events(max_events: int):
    """The bundled demo log and task set as core events, as the replay sends them."""
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import to_epoch
    from offcut.replay.synth import demo_data_dir

    data = demo_data_dir()
    log = load_node_log(data, skip_rows=0)
    pending = sorted(load_task_set(data), key=lambda t: (t.submit_time, t.name))
    owners = assign_owners([t.name for t in pending], 2)
    feed = Feed("replay")
    events = []

    def submit_until(ts):
        while pending and pending[0].submit_time <= ts:
            t = pending.pop(0)
            events.append(SubmitEvent(to_epoch(t.submit_time), TaskSpec.create(
                name=t.name, min_nodes=t.min_nodes, max_nodes=t.max_nodes,
                node_counts=t.node_counts, throughputs=t.throughputs,
                objective_values=t.objective_values, rescale_up_s=t.rescale_up_s,
                rescale_down_s=t.rescale_down_s, total_work_samples=t.total_work_samples),
                owners[t.name]))

    submit_until(log.initial_time)
    events.append(feed(to_epoch(log.initial_time), log.initial_idle, snapshot=True))
    for change in itertools.islice(log.events(), max_events):
        submit_until(change.time)
        events.append(feed(to_epoch(change.time), change.became_idle, change.became_busy))
    return events


@pytest.mark.parametrize("objective", ["throughput", "energy", "zeus_cost"])
def test_builtin_policies_decide_exactly_as_the_core_did_before(objective):
    settings = ObjectiveSettings(objective=objective, eta=0.4)
    new, old = Scheduler(objective=settings), LegacyScheduler(objective=settings)
    decisions = 0
    for event in demo_events(700):
        a, b = new.apply(event, dp_record), old.apply(event, dp_record)
        assert [(c.task_id, c.change, c.nodes, c.time) for c in a.placements] == \
               [(c.task_id, c.change, c.nodes, c.time) for c in b.placements]
        assert [s.counts for s in a.solves] == [s.counts for s in b.solves]
        decisions += bool(a.solves)
    assert new.fingerprint() == old.fingerprint()
    assert new.total_samples == old.total_samples and new.energy_j == old.energy_j
    assert decisions > 300 and sum(t.state.finished for t in new.tasks.values()) >= 1


# ----------------------------------------------------------------------------- fair_share
def greedy_fill(usage, caps, nodes, step):
    """The definition of water_fill: one node at a time."""
    share = {o: 0 for o in caps}
    for _ in range(nodes):
        open_ = [o for o in sorted(caps) if share[o] < caps[o]]
        if not open_:
            break
        o = min(open_, key=lambda o: (usage[o] + share[o] * step, o))
        share[o] += 1
    return share


def test_water_fill_is_one_node_at_a_time_to_the_least_used_owner():
    rng = np.random.default_rng(3)
    for _ in range(500):
        k = int(rng.integers(1, 6))
        owners = [f"o{i}" for i in rng.permutation(k)]
        step = float(rng.choice([10.0, 0.7, 60.0]))
        usage = {o: float(rng.choice([0.0, 10.0, 20.0, rng.uniform(0, 500)])) for o in owners}
        caps = {o: int(rng.integers(0, 12)) for o in owners}
        nodes = int(rng.integers(0, 40))
        assert water_fill(usage, caps, nodes, step) == greedy_fill(usage, caps, nodes, step)
    # the worked example of the docs: 8 nodes, Tfwd 10 s, alice used 40 node-s, bob none
    assert water_fill({"alice": 40.0, "bob": 0.0}, {"alice": 8, "bob": 8}, 8, 10.0) == \
        {"alice": 2, "bob": 6}
    big = water_fill({"a": 1e6, "b": 0.0, "c": 5e5}, {"a": 4734, "b": 4734, "c": 4734}, 4734, 10.0)
    assert big == greedy_fill({"a": 1e6, "b": 0.0, "c": 5e5}, {"a": 4734, "b": 4734, "c": 4734},
                              4734, 10.0)


def best_within(sub: AllocationProblem, share: int) -> float:
    """The best value of ``sub``'s tasks using at most ``share`` nodes (exhaustive)."""
    ranges = [[0, *range(int(lo), int(hi) + 1)] for lo, hi in zip(sub.min_nodes, sub.max_nodes)]
    return max(sub.evaluate(c) for c in itertools.product(*ranges)
               if sum(c) <= min(share, sub.idle_nodes))


def test_an_owner_over_its_share_shrinks_at_the_lowest_cost():
    """The blocker row: within a share smaller than what the owner's tasks hold, the owner's
    tasks get the exact optimum of their true problem (current counts and rescale costs)."""
    rng = np.random.default_rng(4)
    checked = 0
    while checked < 150:
        p = random_problem(rng, max_tasks=3, max_nodes=12)
        held = int(p.current_nodes.sum())
        if held < 2:
            continue
        share = int(rng.integers(1, held))
        rows = list(range(p.num_tasks))
        solve = Recording()
        got = FairSharePolicy._owner_counts(p, rows, share, solve)
        sub = subproblem(p, rows, held)
        assert sum(got) <= share and len(solve.problems) == 1
        assert solve.problems[0].num_tasks == p.num_tasks + 1  # the blocker
        assert sub.evaluate(got) == pytest.approx(best_within(sub, share), rel=1e-9, abs=1e-9)
        checked += 1


def test_fair_share_with_one_owner_is_throughput():
    rng = np.random.default_rng(5)
    for _ in range(50):
        p = random_problem(rng)
        request = AllocationRequest(p, views(["alice"] * p.num_tasks), ObjectiveSettings(), T0)
        a, b = Recording(), Recording()
        assert FairSharePolicy().allocate(request, a) == ThroughputPolicy().allocate(request, b)
        assert a.problems == b.problems == [p]


def two_owner_core(policy: str) -> tuple[Scheduler, Feed]:
    """8 nodes; alice's task runs alone for 5 s, then bob submits the same task (linear
    curves, free rescales: every split of the 8 nodes earns the same)."""
    core, feed = Scheduler(tfwd_s=10.0, objective=ObjectiveSettings(objective=policy)), Feed()
    core.apply(feed(T0, [f"n{i}" for i in range(1, 9)]), dp_record)
    core.apply(SubmitEvent(T0, spec("a"), "alice"), dp_record)
    assert nodes_of(core) == {"a": 8}
    core.apply(SubmitEvent(T0 + 5, spec("b"), "bob"), dp_record)
    return core, feed


def test_fair_share_gives_the_owner_behind_its_share_where_throughput_keeps_the_first():
    core, _ = two_owner_core("throughput")
    assert nodes_of(core) == {"a": 8, "b": 0}
    core, _ = two_owner_core("fair_share")
    # alice used 40 node-s: water-filling 8 nodes with Tfwd 10 s gives bob 6, alice 2
    # (projected usage 40 + 2*10 = 60 = 0 + 6*10)
    assert nodes_of(core) == {"a": 2, "b": 6}
    assert core.owner_node_seconds() == {"alice": 40.0, "bob": 0.0}


def test_fair_share_equalises_usage_over_time():
    gaps = {}
    for policy in ("throughput", "fair_share"):
        core, feed = two_owner_core(policy)
        gap = []
        for k in range(1, 31):  # a spare node comes and goes every 10 s: 30 re-allocations
            t = T0 + 5 + 10 * k
            core.apply(feed(t, idle=["n9"]) if k % 2 else feed(t, preempted=["n9"]), dp_record)
            used = core.owner_node_seconds()
            gap.append(used["alice"] - used["bob"])
            assert sum(used.values()) == pytest.approx(core.used_node_seconds)
        gaps[policy] = gap
    assert gaps["throughput"][-1] > 2000  # alice keeps everything: the gap only grows
    fair = [abs(g) for g in gaps["fair_share"]]
    assert fair[0] < 40 and max(fair) <= 9 * 10  # within one look-ahead of the pool
    assert fair[-1] <= 9 * 10 and all(abs(g) < 100 for g in gaps["fair_share"][5:])


def test_fair_share_gives_back_nodes_an_owner_cannot_use():
    """Both start at 0 node-s: 8 nodes split 4/4, but bob's share is below his task's Jmin (5),
    so he leaves the round with nothing and alice's share grows to 8 in a second round,
    rather than 4 nodes staying idle."""
    core = Scheduler(tfwd_s=10.0, objective=ObjectiveSettings(objective="fair_share"))
    feed = Feed()
    core.apply(feed(T0, [f"n{i}" for i in range(1, 9)]), dp_record)
    core.apply(SubmitEvent(T0, spec("a"), "alice"), dp_record)
    out = core.apply(SubmitEvent(T0, spec("b", min_nodes=5), "bob"), dp_record)
    assert nodes_of(core) == {"a": 8, "b": 0}
    # alice within 4 (she holds 8: her problem has a blocker row taking the other 4), bob
    # within 4 (nothing fits), alice again within 8
    assert [s.counts for s in out.solves] == [[4, 4], [0], [8]]
    # 10 s later alice has used 80 node-s, bob none: bob gets all his task can take (8 of
    # the 10 nodes), alice the other 2
    core.apply(feed(T0 + 10, ["n9", "n10"]), dp_record)
    assert nodes_of(core) == {"a": 2, "b": 8}


def test_node_seconds_are_persisted_and_old_snapshots_load_as_zero():
    core, feed = two_owner_core("fair_share")
    core.apply(feed(T0 + 25, ["n9"]), dp_record)
    d = json.loads(json.dumps(core.to_dict()))
    again = Scheduler.from_dict(d)
    assert again.owner_node_seconds() == core.owner_node_seconds() == \
        {"alice": 40.0 + 2 * 20, "bob": 6 * 20.0}
    for task in d["tasks"]:
        del task["node_seconds"]
    assert Scheduler.from_dict(d).owner_node_seconds() == {"alice": 0.0, "bob": 0.0}
    assert Task.from_dict({**d["tasks"][0]}).node_seconds == 0.0


# ----------------------------------------------------------------------------- plugins
PLUGIN = '''
from offcut.daemon.app.policies import AllocationPolicy


class NewestFirst(AllocationPolicy):
    """The newest task first, each up to Jmax (no solver: pure computation)."""
    name = "test_newest_first"

    def allocate(self, request, solve):
        p = request.problem
        left, counts = p.idle_nodes, [0] * p.num_tasks
        for j in sorted(range(p.num_tasks), key=lambda j: -request.tasks[j].submit_time):
            n = min(int(p.max_nodes[j]), left)
            if n >= p.min_nodes[j]:
                counts[j], left = n, left - n
        return counts


class TooGreedy(AllocationPolicy):
    name = "test_too_greedy"

    def allocate(self, request, solve):
        return [int(m) for m in request.problem.max_nodes]


class Crashing(AllocationPolicy):
    """Asks one solve, then fails (a bug in a policy)."""
    name = "test_crashing"

    def allocate(self, request, solve):
        solve(request.problem)
        raise ZeroDivisionError("division by zero")


class NotAPolicy:
    pass
'''

ENTRY_POINTS = """[offcut.policies]
test_newest_first = offcut_test_policies:NewestFirst
test_too_greedy = offcut_test_policies:TooGreedy
test_crashing = offcut_test_policies:Crashing
test_not_a_policy = offcut_test_policies:NotAPolicy
test_broken = offcut_test_broken:Policy
throughput = offcut_test_policies:NewestFirst
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A distribution with entry points in ``offcut.policies``, as pip would leave it (a
    ``*.dist-info`` folder beside the modules), on sys.path."""
    root = tmp_path / "site"
    info = root / "offcut_test_policies-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: offcut-test-policies\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (root / "offcut_test_policies.py").write_text(PLUGIN)
    (root / "offcut_test_broken.py").write_text("raise ImportError('no such GPU library')\n")
    monkeypatch.syspath_prepend(str(root))
    for mod in ("offcut_test_policies", "offcut_test_broken"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    return root


def test_entry_point_policies_are_found_by_name(plugin_dir):
    names = available_policies()
    assert names[:4] == list(OBJECTIVES)
    assert {"test_newest_first", "test_too_greedy", "test_broken"} <= set(names[4:])
    assert policy_class("test_newest_first").__name__ == "NewestFirst"
    assert policy_class("throughput") is ThroughputPolicy  # a built-in name is not taken over
    with pytest.raises(PolicyError, match=r"'test_broken' failed to import .*offcut-test-policies"
                                          r" 0\.1.*ImportError: no such GPU library"):
        policy_class("test_broken")
    with pytest.raises(PolicyError, match="'test_not_a_policy'.*not a subclass of "
                                          "offcut.daemon.app.policies.AllocationPolicy"):
        policy_class("test_not_a_policy")
    with pytest.raises(PolicyError, match="available: .*test_newest_first"):
        policy_class("test_nope")


def test_the_scheduler_uses_a_plugin_and_falls_back_on_its_bad_answer(plugin_dir):
    core = Scheduler(objective=ObjectiveSettings(objective="test_newest_first"))
    feed = Feed()
    core.apply(feed(T0, ["n1", "n2", "n3", "n4"]), dp_record)
    core.apply(SubmitEvent(T0, spec("old", max_nodes=4), "alice"), dp_record)
    out = core.apply(SubmitEvent(T0 + 1, spec("new", max_nodes=3), "bob"), dp_record)
    assert nodes_of(core) == {"old": 1, "new": 3} and out.solves == []  # no solver used
    # an answer the scheduler cannot apply: the event is applied with throughput's counts
    bad = Scheduler(objective=ObjectiveSettings(objective="test_too_greedy"))
    good = Scheduler()
    for sched in (bad, good):
        sched.apply(Feed()(T0, ["n1", "n2"]), dp_record)
        out = sched.apply(SubmitEvent(T0, spec("x", max_nodes=4), "alice"), dp_record)
    assert nodes_of(bad) == nodes_of(good) == {"x": 2}
    assert len(out.solves) == 1 and out.solves[0].fallback_reason is None
    bad_out = bad.apply(SubmitEvent(T0 + 1, spec("y", max_nodes=4), "bob"), dp_record)
    good.apply(SubmitEvent(T0 + 1, spec("y", max_nodes=4), "bob"), dp_record)
    assert nodes_of(bad) == nodes_of(good)
    assert "'test_too_greedy' uses 8 nodes, only 2 are idle; this decision used 'throughput'" \
        in bad_out.solves[-1].fallback_reason


def test_a_crashing_policy_falls_back_and_replays_the_same(plugin_dir):
    """A policy that raises after one solve: the event is applied with throughput's counts
    (two solves journaled: the policy's, then throughput's), and re-applying the events with
    the recorded answers, as the engine's recovery does, gives the same state."""
    core = Scheduler(objective=ObjectiveSettings(objective="test_crashing"))
    feed, events, solves = Feed(), [], []
    events.append(feed(T0, ["n1", "n2", "n3"]))
    events.append(SubmitEvent(T0, spec("a", max_nodes=2), "alice"))
    events.append(SubmitEvent(T0 + 1, spec("b", max_nodes=2), "bob"))
    for e in events:
        out = core.apply(e, dp_record)
        solves.append(list(out.solves))
    assert [len(s) for s in solves] == [0, 2, 2]
    assert "'test_crashing' failed: ZeroDivisionError: division by zero; this decision used " \
           "'throughput'" in solves[-1][-1].fallback_reason
    assert sum(nodes_of(core).values()) == 3
    again = Scheduler(objective=ObjectiveSettings(objective="test_crashing"))
    for e, recorded in zip(events, solves):
        answers = iter(recorded)
        again.apply(e, lambda p: next(answers))
    assert again.fingerprint() == core.fingerprint()


def test_a_daemon_uses_a_plugin_named_by_policy(plugin_dir, tmp_path, monkeypatch):
    address = f"unix://{tmp_path}/d.sock"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(tmp_path / "state.sqlite"),
           "--solver", "dp", "--policy", "test_newest_first", "--clock", "replay",
           "--log-level", "warning"]
    without = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(plugin_dir), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = start_offcutd(cmd, address, tmp_path / "daemon.log")  # the plugin on its path
    try:
        with Client(address, timeout_s=10) as c:
            assert c.status().objective == "test_newest_first"
            c.report_nodes(T0, "s", 1, idle=[f"n{i}" for i in range(1, 5)])
            a = c.submit(make_spec("a", max_nodes=4), submit_time=T0 + 1).task
            b = c.submit(make_spec("b", max_nodes=4), submit_time=T0 + 2).task
            got = {t.spec.name: len(t.nodes) for t in c.list_tasks()}
            assert len(a.nodes) == 4 and len(b.nodes) == 4 and got == {"a": 0, "b": 4}
    finally:
        stop_offcutd(proc)
    # without the plugin on its path offcutd refuses to start, naming the policy
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=without)
    assert res.returncode == 2 and "unknown allocation policy 'test_newest_first'" in res.stderr


def test_the_readme_example_policy_is_a_working_plugin(tmp_path, monkeypatch):
    """examples/policy_oldest_first as pip would install it (its own entry point declaration),
    and the README shows its code."""
    import tomllib

    example = ROOT / "examples" / "policy_oldest_first"
    meta = tomllib.loads((example / "pyproject.toml").read_text())["project"]
    info = tmp_path / "offcut_policy_oldest_first-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\n"
                                   f"Version: {meta['version']}\n")
    (info / "entry_points.txt").write_text("[offcut.policies]\n" + "".join(
        f"{k} = {v}\n" for k, v in meta["entry-points"]["offcut.policies"].items()))
    monkeypatch.syspath_prepend(str(example))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "offcut_oldest_first", raising=False)
    assert "oldest_first" in available_policies()
    core = Scheduler(objective=ObjectiveSettings(objective="oldest_first"))
    feed = Feed()
    core.apply(feed(T0, [f"n{i}" for i in range(1, 7)]), dp_record)
    for k, name in enumerate(("first", "second", "third")):
        core.apply(SubmitEvent(T0 + k, spec(name, max_nodes=4), "alice"), dp_record)
    assert nodes_of(core) == {"first": 4, "second": 2, "third": 0}
    code = (example / "offcut_oldest_first.py").read_text()
    readme = (ROOT / "README.md").read_text()
    block = code[code.index("class OldestFirst"):]
    assert block in readme and "pip install -e examples/policy_oldest_first" in readme


# ----------------------------------------------------------------------------- kill -9
FAIR_OPS = [
    ("report", dict(time=T0, source="w", seq=1, idle=[f"n{i}" for i in range(1, 7)])),
    ("submit", dict(spec=make_spec("a1", max_nodes=6, ns=(0, 6), ps=(0.0, 60.0)),
                    submit_time=T0 + 1, owner="alice", request_id="a1")),
    ("report", dict(time=T0 + 20, source="w", seq=2, idle=["n7", "n8"])),
    ("submit", dict(spec=make_spec("b1", max_nodes=6, ns=(0, 6), ps=(0.0, 60.0), up=3.0,
                                   down=2.0), submit_time=T0 + 30, owner="bob",
                    request_id="b1")),
    ("report", dict(time=T0 + 40, source="w", seq=3, preempted=["n1"])),
    ("submit", dict(spec=make_spec("a2", max_nodes=4), submit_time=T0 + 45, owner="alice",
                    request_id="a2")),
    ("report", dict(time=T0 + 60, source="w", seq=4, idle=["n9", "n1"])),
    ("submit", dict(spec=make_spec("c1", min_nodes=2, max_nodes=4), submit_time=T0 + 70,
                    owner="carol", request_id="c1")),
    ("report", dict(time=T0 + 90, source="w", seq=5, preempted=["n2", "n3"])),
    ("report", dict(time=T0 + 120, source="w", seq=6, idle=["n2", "n3", "n10"])),
    ("report", dict(time=T0 + 150, source="w", seq=7, preempted=["n9"])),
    ("report", dict(time=T0 + 180, source="w", seq=8, idle=["n9"])),
]


def run_op(client: Client, op):
    kind, args = op
    return client.submit(**args).decision if kind == "submit" else client.report_nodes(**args)


@pytest.mark.parametrize("snapshot_every", [1000, 3])
def test_a_fair_share_daemon_killed_re_applies_its_journal_to_the_same_state(
        daemons, tmp_path, snapshot_every):
    address = f"unix://{tmp_path}/crash.sock"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(tmp_path / "crash.sqlite"),
           "--solver", "dp", "--policy", "fair_share", "--snapshot-every", str(snapshot_every),
           "--clock", "replay", "--log-level", "warning"]
    log = tmp_path / "crash.log"
    acked = 8
    proc = start_offcutd(cmd, address, log)
    try:
        with Client(address, timeout_s=10) as c:
            first = [run_op(c, op) for op in FAIR_OPS[:acked]]
            before = status_key(c)
        proc.kill()  # SIGKILL: no snapshot at shutdown
        proc.wait(30)
        proc = start_offcutd(cmd, address, log, append=True)
        with Client(address, timeout_s=10) as c:
            assert status_key(c) == before
            assert c.status().objective == "fair_share"
            rest = [run_op(c, op) for op in FAIR_OPS[acked:]]
            crashed_final = status_key(c)
    finally:
        stop_offcutd(proc)
    _, ref = daemons.start("ref", policy="fair_share")
    ref_decisions = [run_op(ref, op) for op in FAIR_OPS]
    assert [decision_key(d) for d in first + rest] == [decision_key(d) for d in ref_decisions]
    assert crashed_final == status_key(ref)
    # the owners really shared: every owner's tasks held nodes at some point
    owner_of = {t.task_id: t.owner for t in ref.list_tasks()}
    assert {owner_of[p.task_id] for d in ref_decisions for p in d.placements if p.nodes} == \
        {"alice", "bob", "carol"}


# ----------------------------------------------------------------------------- replay
def test_owners_are_a_skewed_deterministic_split():
    names = [f"J{i:05d}" for i in range(10)]
    owners = assign_owners(names, 3)
    assert owners == assign_owners(names, 3)
    counts = {o: list(owners.values()).count(o) for o in ("user1", "user2", "user3")}
    assert counts == {"user1": 5, "user2": 3, "user3": 2}
    # dealt in submit order: every owner has a task early on
    assert [owners[n][4:] for n in names] == list("1213121312")
    assert set(assign_owners(names, 0).values()) == {"replay"}
    with pytest.raises(ValueError, match="more owners than"):
        assign_owners(names[:2], 3)


def test_node_time_and_fairness_figures():
    nt = NodeTime()
    for t, n in ((0.0, 0), (10.0, 4), (30.0, 2), (40.0, 0)):
        nt.change("a", t, n)
    nt.change("b", 20.0, 3)
    assert nt.seconds(100.0) == {"a": 4 * 20 + 2 * 10, "b": 3 * 80}
    assert nt.seconds(35.0) == {"a": 4 * 20 + 2 * 5, "b": 3 * 15}
    assert fairness([5.0, 5.0]) == {"jain": 1.0, "min_max": 1.0}
    assert fairness([4.0, 0.0]) == {"jain": 0.5, "min_max": 0.0}
    assert fairness([]) == {"jain": None, "min_max": None}


def test_replay_with_owners_and_fair_share_reports_node_hours_per_owner(tmp_path):
    from offcut.client.cli import app
    from offcut.replay.synth import demo_data_dir

    demo = str(demo_data_dir())
    out = tmp_path / "fair"
    res = runner.invoke(app, ["replay", "bftrainer", "--node-log", demo, "--tasks", demo,
                              "--skip-rows", "0", "--solver", "dp", "--owners", "2",
                              "--policy", "fair_share", "--max-events", "1200",  # 6 submitted
                              "--out", str(out),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["objective"] == "fair_share" and s["options"]["owners"] == 2
    assert set(s["owners"]) == {"user1", "user2"}
    assert sum(o["tasks"] for o in s["owners"].values()) == s["tasks_submitted"] == 6
    assert sum(o["node_hours"] for o in s["owners"].values()) == \
        pytest.approx(s["used_node_hours"], rel=1e-9)
    assert 0 < s["fairness"]["min_max"] <= 1 and "owner user2" in res.output
    assert {t["owner"] for t in s["tasks"]} == {"user1", "user2"}


def test_replay_policy_options(tmp_path):
    from offcut.client.cli import app
    from offcut.replay.synth import demo_data_dir

    demo = str(demo_data_dir())
    base = ["replay", "bftrainer", "--node-log", demo, "--tasks", demo, "--skip-rows", "0",
            "--out", str(tmp_path / "o"), "--no-progress"]
    res = runner.invoke(app, [*base, "--policy", "nope"])
    assert res.exit_code == 2 and "unknown allocation policy 'nope'" in res.output
    assert "fair_share" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, [*base, "--policy", "energy", "--objective", "fair_share"])
    assert res.exit_code == 2 and "--objective" in res.output  # no such option (pre-release)
    res = runner.invoke(app, [*base, "--policy", "energy", "--max-events", "20"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["objective"] == "energy"

"""Allocation policy plug-ins cannot stop the daemon (issue 37, finding 3; docs/security.md,
"Round two: allocation policy plug-ins"): a policy raising SystemExit or KeyboardInterrupt,
passing garbage to solve(), hanging, or answering an endless generator costs only its own
decision (throughput answers, the failure is logged and counted); a real offcutd with such a
policy answers node events and stops on SIGTERM; a non-deterministic policy's journaled
answer wins over its new one when the journal is re-applied, and the mismatch is logged."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time

import pytest

from offcut.client import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.daemon.app.engine import Engine
from offcut.daemon.edge.metrics import EngineCollector
from offcut.daemon.app.model import NodeEvent, ObjectiveSettings, SubmitEvent
from offcut.daemon.app.policies.guard import PolicyGuard
from offcut.daemon.app.scheduler import Scheduler
from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.store import Store

from daemon_helpers import T0, core_spec, dp_record, make_spec

pytestmark = pytest.mark.replay_clock

PLUGIN = '''
import itertools
import threading

from offcut.daemon.app.policies import AllocationPolicy

RELEASE = threading.Event()   # the tests set it to end the hanging threads they leave


class Exits(AllocationPolicy):
    def allocate(self, request, solve):
        raise SystemExit(3)


class Interrupted(AllocationPolicy):
    def allocate(self, request, solve):
        solve(request.problem)
        raise KeyboardInterrupt


class GarbageSolve(AllocationPolicy):
    def allocate(self, request, solve):
        return solve("garbage").counts


class Hangs(AllocationPolicy):
    def allocate(self, request, solve):
        solve(request.problem)
        RELEASE.wait()
        solve(request.problem)  # after its decision was given up: never reaches the solver
        return [0] * request.problem.num_tasks


class Endless(AllocationPolicy):
    def allocate(self, request, solve):
        return itertools.repeat(0)


class LastFirst(AllocationPolicy):
    """Everything to the newest task, or (``FIRST``) to the oldest: not deterministic."""
    FIRST = False

    def allocate(self, request, solve):
        p = request.problem
        counts = [0] * p.num_tasks
        j = 0 if LastFirst.FIRST else p.num_tasks - 1
        counts[j] = min(int(p.max_nodes[j]), p.idle_nodes)
        return counts


class Hostile(AllocationPolicy):
    """SystemExit, then KeyboardInterrupt, then hangs (in a daemon)."""
    calls = itertools.count()

    def allocate(self, request, solve):
        n = next(Hostile.calls)
        if n == 0:
            raise SystemExit(3)
        if n == 1:
            raise KeyboardInterrupt
        RELEASE.wait()
        return [0] * request.problem.num_tasks
'''

NAMES = {"g_exits": "Exits", "g_interrupted": "Interrupted", "g_garbage_solve": "GarbageSolve",
         "g_hangs": "Hangs", "g_endless": "Endless", "g_last_first": "LastFirst",
         "g_hostile": "Hostile"}


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The policies above as an installed distribution's entry points, on sys.path; the
    hanging threads they leave are released at the end."""
    root = tmp_path / "site"
    info = root / "offcut_guard_policies-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: offcut-guard-policies\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[offcut.policies]\n" + "".join(
        f"{k} = offcut_guard_policies:{v}\n" for k, v in NAMES.items()))
    (root / "offcut_guard_policies.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "offcut_guard_policies", raising=False)
    yield root
    mod = sys.modules.get("offcut_guard_policies")
    if mod is not None:
        mod.RELEASE.set()


#: this file's tasks: the shared spec on 1-4 nodes, 80 samples/s on 8, 1e12 samples
spec = functools.partial(core_spec, ns=(0, 8), ps=(0.0, 80.0), work=1e12)


def run_core(policy: str, guard: PolicyGuard | None = None):
    """Three nodes, tasks a (2 nodes at most) and b (2): the policy decides twice, then a
    node event; returns the scheduler, the last outcome and the node counts."""
    core = Scheduler(objective=ObjectiveSettings(objective=policy))
    core.policy_guard = guard
    core.apply(NodeEvent(T0, "s", 1, ("n1", "n2", "n3"), (), False), dp_record)
    core.apply(SubmitEvent(T0, spec("a", max_nodes=2), "alice"), dp_record)
    core.apply(SubmitEvent(T0 + 1, spec("b", max_nodes=2), "bob"), dp_record)
    out = core.apply(NodeEvent(T0 + 2, "s", 2, ("n4",), (), False), dp_record)
    return core, out, {t.spec.name: len(t.nodes) for t in core.tasks.values()}


@pytest.mark.parametrize("policy,kind,says", [
    ("g_exits", "error", "SystemExit: 3"),
    ("g_interrupted", "error", "KeyboardInterrupt"),
    ("g_garbage_solve", "answer", "passed a str to solve(), not an AllocationProblem"),
    ("g_endless", "answer", "answered more than 2 counts for 2 admitted tasks"),
])
def test_a_failing_policy_costs_its_decision_only(plugins, policy, kind, says, caplog):
    """The node event is applied with throughput's counts, the reason is in the decision and
    the log, and the fallback is counted by kind."""
    _, _, want = run_core("throughput")
    guard = PolicyGuard()
    with caplog.at_level(logging.ERROR, logger="offcut.daemon"):
        _, out, got = run_core(policy, guard)
    assert got == want == {"a": 2, "b": 2}
    assert says in out.solves[-1].fallback_reason
    assert "this decision used 'throughput'" in out.solves[-1].fallback_reason
    assert guard.fallbacks == {(policy, kind): 3}
    assert any(says in r.getMessage() for r in caplog.records)
    assert [a["fallback"] for _, a in out.policy_answers] == [kind]


def test_a_hanging_policy_is_abandoned_and_disabled_until_restart(plugins, caplog):
    """Bounded by its own time (solves not counted); then the decision uses throughput, the
    policy is disabled (logged at ERROR) and never called again; its abandoned thread's
    later solve() does not reach the allocator."""
    import offcut_guard_policies as mod

    _, _, want = run_core("throughput")
    guard = PolicyGuard(time_limit_s=0.3)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="offcut.daemon"):
        core, out, got = run_core("g_hangs", guard)
    assert time.monotonic() - started < 30
    assert got == want
    threads = [t for t in threading.enumerate() if t.name == "offcut-policy-g_hangs"]
    assert len(threads) == 1  # called once: disabled after its first timeout
    assert "disabled until the daemon restarts" in out.solves[-1].fallback_reason
    assert guard.fallbacks == {("g_hangs", "timeout"): 1, ("g_hangs", "disabled"): 2}
    assert "g_hangs" in guard.disabled
    assert any("disabled until the daemon restarts" in r.getMessage() and
               r.levelno == logging.ERROR for r in caplog.records)
    # the abandoned thread wakes and calls solve(): refused, the scheduler's solves unchanged
    n = len(out.solves)
    mod.RELEASE.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads) and len(out.solves) == n


def test_a_non_deterministic_policy_replayed_keeps_the_journals_answer(plugins, tmp_path,
                                                                        caplog):
    """A daemon killed (no shutdown snapshot) re-applies its journal; the policy now answers
    otherwise: the journaled answer wins (the same placements as before the crash) and the
    mismatch is logged at ERROR."""
    import offcut_guard_policies as mod

    path = tmp_path / "state.sqlite"
    objective = ObjectiveSettings(objective="g_last_first")
    engine = Engine(Store(path), Allocator("dp"), objective=objective)
    engine.apply(NodeEvent(T0, "s", 1, ("n1", "n2", "n3"), (), False))
    engine.apply(SubmitEvent(T0, spec("a", max_nodes=3), "alice"))
    engine.apply(SubmitEvent(T0 + 1, spec("b", max_nodes=3), "bob"))
    before = {t.spec.name: list(t.nodes) for t in engine.scheduler.tasks.values()}
    assert before == {"a": [], "b": ["n1", "n2", "n3"]}
    fingerprint = engine.scheduler.fingerprint()
    engine.store.db.close()  # a crash: no snapshot at stop
    mod.LastFirst.FIRST = True
    try:
        with caplog.at_level(logging.ERROR, logger="offcut.daemon"):
            again = Engine(Store(path), Allocator("dp"), objective=objective)
    finally:
        mod.LastFirst.FIRST = False
    assert {t.spec.name: list(t.nodes) for t in again.scheduler.tasks.values()} == before
    assert again.scheduler.fingerprint() == fingerprint
    assert again.policy_guard.replay_mismatches == 1
    assert any("'g_last_first' is not deterministic" in r.getMessage()
               and "the journal's answer is kept" in r.getMessage() for r in caplog.records)
    again.close()


def test_the_engine_counts_policy_fallbacks_in_a_metric(plugins, tmp_path):
    engine = Engine(Store(tmp_path / "s.sqlite"), Allocator("dp"),
                    objective=ObjectiveSettings(objective="g_exits"))
    engine.apply(NodeEvent(T0, "s", 1, ("n1", "n2"), (), False))
    engine.apply(SubmitEvent(T0, spec("a", max_nodes=2), "alice"))
    family = next(m for m in EngineCollector(engine).collect()
                  if m.name == "offcut_policy_fallbacks")
    assert [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == \
        [({"policy": "g_exits", "kind": "error"}, 1.0)]
    engine.close()


def test_offcutd_with_a_hostile_policy_answers_and_stops_on_sigterm(plugins, tmp_path,
                                                                    monkeypatch):
    """A real offcutd whose policy raises SystemExit, then KeyboardInterrupt, then hangs:
    every node event is answered with throughput's placement and names the failure, and
    SIGTERM stops it (before: the first SystemExit wedged it until kill -9)."""
    address = f"unix://{tmp_path}/d.sock"
    cmd = [*offcutd_argv(), "--listen", address, "--state", str(tmp_path / "state.sqlite"),
           "--solver", "dp", "--policy", "g_hostile", "--clock", "replay",
           "--log-level", "warning"]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]))
    log_path = tmp_path / "daemon.log"
    proc = start_offcutd(cmd, address, log_path)
    try:
        with Client(address, timeout_s=60) as c:
            c.report_nodes(T0, "s", 1, idle=["n1", "n2"])
            d = c.submit(make_spec("a", max_nodes=4), submit_time=T0 + 1).decision
            assert "SystemExit: 3" in d.solve.fallback_reason
            d = c.report_nodes(T0 + 2, "s", 2, idle=["n3"])
            assert "KeyboardInterrupt" in d.solve.fallback_reason
            d = c.report_nodes(T0 + 3, "s", 3, idle=["n4"])  # hangs: 5 s, then disabled
            assert "disabled until the daemon restarts" in d.solve.fallback_reason
            d = c.report_nodes(T0 + 4, "s", 4, idle=["n5"])
            assert "is disabled until the daemon restarts" in d.solve.fallback_reason
            assert [len(t.nodes) for t in c.list_tasks()] == [4]
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.returncode == 0, log_path.read_text()[-2000:]
    finally:
        stop_offcutd(proc)
    text = log_path.read_text()
    assert "disabled until the daemon restarts" in text and "Traceback" not in text

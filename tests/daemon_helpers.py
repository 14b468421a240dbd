"""Helpers shared by the tests: a fixed epoch, task and Zeus job specs (wire and core forms),
node events with increasing seq, a clock the test moves, state fingerprints, and waits on a
condition with a deadline (the suite runs on a loaded 2-core box: never a fixed sleep)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from offcut.client import Client
from offcut.daemon.app.model import NodeEvent
from offcut.daemon.app.scheduler import SolveRecord
from offcut.daemon.app.solvers.dp import solve_dp
from offcut.zeus_views import BatchSizeJobSpec
from offcut.taskspec import TaskSpec
from offcut.v1 import tasks_pb2, zeus_pb2
from offcut.views import Decision
from offcut.wire.tasks import decision_to_pb, task_to_pb

T0 = 1_600_000_000.0  # well before "now": explicit times everywhere keep runs deterministic

#: generous bound [s] of waits that only a broken implementation reaches
DEADLINE_S = 180.0

_T = TypeVar("_T")


def make_spec(name="job", min_nodes=1, max_nodes=4, ns=(0, 1, 2, 4), ps=(0.0, 10.0, 18.0, 30.0),
              up=0.0, down=0.0, work=1e6, **kw) -> tasks_pb2.TaskSpec:
    """A task spec (defaults: 1-4 nodes, a concave curve, free rescales, 1e6 samples)."""
    return tasks_pb2.TaskSpec(name=name, min_nodes=min_nodes, max_nodes=max_nodes,
                              node_counts=list(ns), throughputs=list(ps), rescale_up_s=up,
                              rescale_down_s=down, total_work_samples=work, **kw)


def core_spec(name="job", min_nodes=1, max_nodes=4, ns=(0, 1, 2, 4), ps=(0.0, 10.0, 18.0, 30.0),
              up=0.0, down=0.0, work=1e6, **kw) -> TaskSpec:
    """:func:`make_spec`'s task as the core's validated :class:`TaskSpec` (for tests of the
    scheduler and engine without gRPC); ``kw``: further ``TaskSpec.create`` fields
    (``command``, ``objective_values`` ...). InvalidArgument as ``TaskSpec.create``."""
    return TaskSpec.create(name=name, min_nodes=min_nodes, max_nodes=max_nodes, node_counts=ns,
                           throughputs=ps, rescale_up_s=up, rescale_down_s=down,
                           total_work_samples=work, **kw)


def zeus_spec(job_id="resnet", **kw) -> zeus_pb2.BatchSizeJobSpec:
    """A Zeus batch-size job's spec as sent (defaults: batch sizes 32-256, default 64, eta
    0.5, early stop at 2x the best cost, 20 epochs to 0.7, 250 W, seed 7, power limits
    100-250 W in steps of 50 W); ``kw`` replaces fields, a None one is left unset."""
    fields = dict(job_id=job_id, batch_sizes=[32, 64, 128, 256], default_batch_size=64,
                  eta_knob=0.5, beta_knob=2.0, max_epochs=20, target_metric=0.7,
                  higher_is_better=True, max_power_w=250.0, seed=7,
                  power=zeus_pb2.PowerLimitSpec(min_power_limit_w=100, max_power_limit_w=250,
                                                step_w=50))
    fields.update(kw)
    return zeus_pb2.BatchSizeJobSpec(**{k: v for k, v in fields.items() if v is not None})


def zeus_core_spec(job_id="j", **kw) -> BatchSizeJobSpec:
    """A Zeus batch-size job's validated core spec (defaults: batch sizes 8-128, default 32,
    eta 0.5, no early stop, 10 epochs to 0.9, 300 W, seed 3); ``kw`` replaces fields."""
    fields = dict(job_id=job_id, batch_sizes=(8, 16, 32, 64, 128), default_batch_size=32,
                  eta_knob=0.5, beta_knob=None, max_epochs=10, target_metric=0.9,
                  higher_is_better=True, max_power_w=300.0, seed=3)
    fields.update(kw)
    return BatchSizeJobSpec.create(**fields)


def dp_record(problem) -> SolveRecord:
    """The scheduler's allocate callable on the exact ``dp`` backend: ``problem``'s solution
    (an AllocationProblem) as the SolveRecord the core journals."""
    sol = solve_dp(problem)
    return SolveRecord(counts=[int(c) for c in sol.counts], solver=sol.solver, status=sol.status,
                       objective=float(sol.objective), bound=float(sol.bound),
                       solve_ms=float(sol.solve_ms))


class Feed:
    """Node events of one ``source`` with increasing per-source ``seq`` (1, 2, ...)."""

    def __init__(self, source="test"):
        self.source = source
        self.seq = 0

    def __call__(self, t, idle=(), preempted=(), snapshot=False) -> NodeEvent:
        """The next event at time ``t`` [s]: ``idle`` and ``preempted`` node names."""
        self.seq += 1
        return NodeEvent(time=t, source=self.source, seq=self.seq, idle=tuple(idle),
                         preempted=tuple(preempted), snapshot=snapshot)


class Clock:
    """A clock [s] the test moves (``t``); call it to read it, hand its :meth:`sleep` to
    code that waits (it records the wait and moves the clock on, at once)."""

    def __init__(self, t: float = 0.0):
        self.t = t
        #: every wait [s] asked of :meth:`sleep`, in order
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.waits.append(s)
        self.t += s


def wait_until(cond: Callable[[], _T], what: str, timeout_s: float = DEADLINE_S,
               every_s: float = 0.05) -> _T:
    """Poll ``cond`` until it returns something truthy (returned), every ``every_s`` [s];
    AssertionError naming ``what`` after ``timeout_s`` [s]."""
    end = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def start_secured(daemons, tokens, name="sec", **kw):
    """A daemon of ``daemons`` (conftest's fixture) with the tokens file ``tokens`` (the
    ``user_tokens`` fixture: ``(path, {who: token})``) and one client per token; ``kw``:
    DaemonConfig fields. Returns ``(server, {who: Client})``; the clients close with the
    daemons."""
    path, made = tokens
    srv, _ = daemons.start(name, tokens_file=str(path), **kw)
    clients = {who: Client(srv.address, timeout_s=10, token=tok) for who, tok in made.items()}
    daemons.clients.extend(clients.values())
    return srv, clients


def status_key(client: Client):
    """Everything about the state that must survive a restart (no timing statistics)."""
    st = client.status(include_idle_nodes=True)
    fields = (st.revision, st.clock, st.idle_nodes, st.nodes_in_use,
              tuple(st.idle_node_names), st.queued_tasks, st.admitted_tasks, st.running_tasks,
              st.completed_tasks, st.cancelled_tasks, st.failed_tasks, tuple(sorted(st.last_seq.items())),
              round(st.total_samples, 6), round(st.idle_node_seconds, 6),
              round(st.used_node_seconds, 6), st.tfwd_s, st.max_running_tasks)
    tasks = [task_to_pb(t).SerializeToString(deterministic=True) for t in client.list_tasks()]
    return fields, tasks


def decision_key(d: Decision) -> bytes:
    """A decision's bytes (its wire form) without its timing and duplicate flag (for equality
    checks)."""
    d = decision_to_pb(d)
    d.solve.ClearField("solve_ms")
    d.ClearField("duplicate")
    return d.SerializeToString(deterministic=True)


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (not a package) as module ``offcut_<name>``, so tests can
    drive the same harness the benchmark runs."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"offcut_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod

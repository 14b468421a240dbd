"""Helpers shared by the daemon tests: a fixed epoch, a task spec, state fingerprints."""

from __future__ import annotations

from offcut.client import Client
from offcut.v1 import decision_pb2, tasks_pb2

T0 = 1_600_000_000.0  # well before "now": explicit times everywhere keep runs deterministic


def make_spec(name="job", min_nodes=1, max_nodes=4, ns=(0, 1, 2, 4), ps=(0.0, 10.0, 18.0, 30.0),
              up=0.0, down=0.0, work=1e6, **kw) -> tasks_pb2.TaskSpec:
    """A task spec (defaults: 1-4 nodes, a concave curve, free rescales, 1e6 samples)."""
    return tasks_pb2.TaskSpec(name=name, min_nodes=min_nodes, max_nodes=max_nodes,
                              node_counts=list(ns), throughputs=list(ps), rescale_up_s=up,
                              rescale_down_s=down, total_work_samples=work, **kw)


def status_key(client: Client):
    """Everything about the state that must survive a restart (no timing statistics)."""
    st = client.status(include_idle_nodes=True)
    fields = (st.revision, st.clock.seconds, st.clock.nanos, st.idle_nodes, st.nodes_in_use,
              tuple(st.idle_node_names), st.queued_tasks, st.admitted_tasks, st.running_tasks,
              st.completed_tasks, st.cancelled_tasks, st.failed_tasks, tuple(sorted(st.last_seq.items())),
              round(st.total_samples, 6), round(st.idle_node_seconds, 6),
              round(st.used_node_seconds, 6), st.tfwd_s, st.max_running_tasks)
    tasks = [t.SerializeToString(deterministic=True) for t in client.list_tasks()]
    return fields, tasks


def decision_key(d: decision_pb2.Decision) -> bytes:
    """A decision's bytes without its timing and duplicate flag (for equality checks)."""
    d = decision_pb2.Decision.FromString(d.SerializeToString())
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

"""Replays in which the replay plays the tasks (``curves`` known / linear / hidden, issue
"Learn scalability online, and let the allocation optimise energy") on the bundled demo log,
through a private daemon over gRPC: the outputs, the oracle comparison, determinism given the
seed, and the energy figures."""

from __future__ import annotations

import json

import pytest

from offcut.replay.bftrainer_data import load_node_log, load_task_set
from offcut.replay.driver import ReplayOptions, run_replay, run_with_oracle, task_spec
from offcut.replay.progress_sim import PowerModel, ProgressSimulator
from offcut.replay.synth import demo_data_dir


@pytest.fixture(scope="module")
def demo():
    data = demo_data_dir()
    return load_node_log(data, skip_rows=0), load_task_set(data)


def opts(**kw) -> ReplayOptions:
    return ReplayOptions(**{"solver": "dp", "max_events": 150, "progress": False, **kw})


def test_hidden_curves_with_oracle(demo, tmp_path):
    log, tasks = demo
    s = run_with_oracle(log, tasks, tmp_path, opts(curves="hidden", seed=3))
    assert s["curves"] == "hidden" and s["oracle_total_samples"] > 0
    assert s["samples_vs_oracle"] == pytest.approx(s["total_samples"] / s["oracle_total_samples"])
    assert 0.5 < s["samples_vs_oracle"] < 1.5  # learning works at all on a short window
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["oracle_total_samples"] == s["oracle_total_samples"]
    oracle = json.loads((tmp_path / "oracle" / "summary.json").read_text())
    assert oracle["curves"] == "known"
    # the played truth and the daemon's view of it agree up to the modelled accrual since the
    # last report (reports replace the daemon's progress)
    assert s["daemon_total_samples"] == pytest.approx(s["total_samples"], rel=0.05)
    assert s["energy_j"] > s["task_energy_j"] > 0 and s["samples_per_joule"] > 0
    # completions came from reports: placements.csv has them
    rows = (tmp_path / "placements.csv").read_text().splitlines()
    assert sum(",completed," in r for r in rows) == s["tasks_completed"]


def test_played_replay_is_deterministic_given_the_seed(demo, tmp_path):
    log, tasks = demo
    a = run_replay(log, tasks, tmp_path / "a", opts(curves="hidden", seed=5, max_events=80))
    b = run_replay(log, tasks, tmp_path / "b", opts(curves="hidden", seed=5, max_events=80))
    c = run_replay(log, tasks, tmp_path / "c", opts(curves="hidden", seed=6, max_events=80))
    assert a["total_samples"] == b["total_samples"] and a["energy_j"] == b["energy_j"]
    assert (tmp_path / "a" / "placements.csv").read_text() == \
        (tmp_path / "b" / "placements.csv").read_text()
    assert c["total_samples"] != a["total_samples"]  # other noise


def test_oracle_needs_a_guessing_mode(demo, tmp_path):
    log, tasks = demo
    with pytest.raises(ValueError, match="linear"):
        run_with_oracle(log, tasks, tmp_path, opts(curves="known"))
    with pytest.raises(ValueError, match="curves"):
        run_replay(log, tasks, tmp_path, opts(curves="psychic"))
    with pytest.raises(ValueError, match="objective"):
        run_replay(log, tasks, tmp_path, opts(objective="speed"))


def test_specs_of_each_mode(demo):
    _, tasks = demo
    t = tasks[0]
    known = task_spec(t, "known", PowerModel())
    assert list(known.throughputs) == list(t.throughputs) and known.reports_progress
    assert len(known.power_w) == len(known.node_counts) and known.power_w[-1] > 0
    hidden = task_spec(t, "hidden")
    assert not hidden.node_counts and not hidden.throughputs
    linear = task_spec(t, "linear")
    per_node = linear.throughputs[1] / linear.node_counts[1]
    assert linear.throughputs[-1] == pytest.approx(per_node * linear.node_counts[-1])
    assert task_spec(t).reports_progress is False  # model mode: as before


def test_simulator_pays_rescales_as_pauses_and_draws_power(demo):
    _, tasks = demo
    t = tasks[0]
    sim = ProgressSimulator([t], noise=0.0, seed=0)
    from offcut.v1 import decision_pb2
    from offcut.wire.tasks import decision_from_pb

    def placement(change, n, at):
        d = decision_pb2.Decision()
        p = d.placements.add(task_id="x", change=change, nodes=[f"n{i}" for i in range(n)])
        p.time.FromNanoseconds(int(at * 1e9))
        return decision_from_pb(d)

    sim.submitted(t.name, "x")
    jmin = t.min_nodes
    sim.apply(placement(decision_pb2.PLACEMENT_CHANGE_START, jmin, 1000.0))
    sim.advance(1100.0)
    rate = sim._rate(sim.by_id["x"], jmin)
    assert sim.report("x", 1100.0)["samples_done"] == pytest.approx(100 * rate)
    power = PowerModel().task_power_w(t, jmin)
    assert sim.report("x", 1100.0)["energy_j"] == pytest.approx(100 * power)
    top = t.max_nodes
    if top > jmin:
        sim.apply(placement(decision_pb2.PLACEMENT_CHANGE_GROW, top, 1100.0))
        new_rate = sim._rate(sim.by_id["x"], top)
        pause = rate * t.rescale_up_s / new_rate
        sim.advance(1200.0)
        assert sim.report("x", 1200.0)["samples_done"] == pytest.approx(
            100 * rate + (100 - pause) * new_rate)

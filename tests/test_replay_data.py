"""Replay inputs: safe format, pickles (real BFTrainer data), synthetic demo data, report."""

from __future__ import annotations

import gzip
import itertools
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from offcut.replay.bftrainer_data import (
    ReplayInputError, TaskRecord, convert, load_node_log, load_task_set, write_task_set,
)
from offcut.replay.report import render_report
from offcut.replay.synth import demo_data_dir, generate, log_stats

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BFT = DATA / "bftrainer"
TARBALL = BFT / "ndstat-10sdn6-evt.tar.gz"
JBND = BFT / "hps-shufflenet-Jbnd-10J.pkl"
JNPS = BFT / "hps-shufflenet-JNPs-10J.pkl"


def needs_real_data():
    """Skip the calling test when the shared real data set is absent (a fresh checkout)."""
    if not TARBALL.is_file():
        pytest.skip(f"real BFTrainer data not found at {BFT} (only present next to the project "
                    "checkout / in CI)")


@pytest.fixture(scope="module")
def real_frame():
    """The real node-state DataFrame, loaded once (about 1-2 s)."""
    needs_real_data()
    import pickle
    import tarfile
    with tarfile.open(TARBALL) as tf:
        member = next(m for m in tf if m.name.endswith(".pkl"))
        return pickle.load(tf.extractfile(member))


def _replay_state(log):
    """Apply all events to the initial state, checking consistency; return (#events, state)."""
    idle = set(log.initial_idle)
    nodes = set(log.node_names)
    assert idle <= nodes
    n = 0
    last = log.initial_time
    for ev in log.events():
        assert ev.became_idle or ev.became_busy
        assert ev.time >= last
        last = ev.time
        for name in ev.became_idle:
            assert name in nodes and name not in idle, f"{name} idle again at {ev.time}"
            idle.add(name)
        for name in ev.became_busy:
            assert name in nodes and name in idle, f"{name} busy again at {ev.time}"
            idle.discard(name)
        n += 1
    return n, idle


# ------------------------------------------------------------------ synthetic / safe format


def test_synth_round_trip_and_statistics(tmp_path):
    d = generate(tmp_path / "syn", seed=3)
    log = load_node_log(d, skip_rows=0)
    assert len(log.node_names) == 64
    assert all(len(n) == 6 and n[3] == "n" for n in log.node_names)  # c05n06 style
    n, _ = _replay_state(log)
    assert n > 1000
    st = log_stats(log)
    assert 380 <= st["idle_interval_median_s"] <= 600      # real: 475 s
    assert 20 <= st["gap_median_s"] <= 45                  # real: 30 s
    assert 1 <= st["changes_mean"] <= 4
    assert 0.2 <= st["idle_fraction"] <= 0.45
    assert 35 * 3600 * 0.98 <= st["duration_s"] <= 36 * 3600

    tasks = load_task_set(d)
    assert len(tasks) == 6
    assert [t.submit_time for t in tasks] == sorted(t.submit_time for t in tasks)
    assert max(t.submit_time for t in tasks) <= log.initial_time + pd.Timedelta(hours=12)
    for t in tasks:
        assert t.node_counts[:3] == [0, 1, 2] and t.node_counts[-1] == 64
        assert t.throughputs[0] == 0 and all(np.diff(t.throughputs) > 0)
        assert 0.7 < t.throughputs[-1] / (64 * t.throughputs[1]) < 0.95  # near-linear
    # total work ~35 % of (mean idle nodes x duration x mean per-node throughput)
    cap = st["idle_fraction"] * 64 * st["duration_s"] * np.mean([t.throughputs[1] for t in tasks])
    assert 0.25 < sum(t.total_work_samples for t in tasks) / cap < 0.45

    # deterministic for a seed
    d2 = generate(tmp_path / "syn2", seed=3)
    for f in ("nodes.csv", "events.csv.gz", "tasks.csv"):
        assert (d / f).read_bytes() == (d2 / f).read_bytes()


def test_demo_data_is_bundled_small_and_consistent():
    d = demo_data_dir()
    files = {p.name: p.stat().st_size for p in d.iterdir()}
    assert {"nodes.csv", "events.csv.gz", "tasks.csv"} <= set(files)
    assert sum(files.values()) < 300_000
    log = load_node_log(d, skip_rows=0)
    _replay_state(log)
    assert len(load_task_set(d)) == 6


def test_safe_format_skip_rows_and_slice(tmp_path):
    d = generate(tmp_path / "s", num_nodes=20, hours=4, num_tasks=2, seed=1)
    full = load_node_log(d, skip_rows=0)
    events = list(full.events())
    # the state at row k = initial + all changes with row <= k, sliced to nodes 5..14
    k = events[40].row
    part = load_node_log(d, first_node=5, num_nodes=10, skip_rows=k)
    sel = full.node_names[5:15]
    idle = set(full.initial_idle)
    for ev in events:
        if ev.row > k:
            break
        idle |= set(ev.became_idle)
        idle -= set(ev.became_busy)
    assert part.node_names == sel
    assert part.initial_idle == [n for n in sel if n in idle]
    assert part.initial_time == events[40].time
    expected = [(e.row, [n for n in e.became_idle if n in sel], [n for n in e.became_busy if n in sel])
                for e in events if e.row > k]
    expected = [e for e in expected if e[1] or e[2]]
    got = [(e.row, e.became_idle, e.became_busy) for e in part.events()]
    assert got == expected


def test_task_set_csv_round_trip_exact(tmp_path):
    tasks = [TaskRecord("b", pd.Timestamp("2021-02-10 01:00:00"), 1, 8, 0.1 + 0.2, 1 / 3, 1e9 / 7,
                        [0, 1, 2, 4, 8], [0.0, 1 / 3, 2 / 3, 1.1, 2.2], [0.0, 1.0, 2.0, 3.0, 4.0]),
             TaskRecord("a", pd.Timestamp("2021-02-10 01:00:00"), 2, 2, 18.0, 12.0, 5.0,
                        [0, 2], [0.0, 3.0], [0.0, 3.0])]
    write_task_set(tasks, tmp_path / "tasks.csv")
    back = load_task_set(tmp_path / "tasks.csv")
    assert back == sorted(tasks, key=lambda t: (t.submit_time, t.name))


# ------------------------------------------------------------------ real data


def test_real_tarball_vs_safe_format(tmp_path, real_frame):
    """Safe format (converted from a slice of the real log) == the pickle loaded directly."""
    needs_real_data()
    rows, cols = 10_000, 160
    small = tmp_path / "slice.pkl"
    real_frame.iloc[:rows, :cols].to_pickle(small)
    convert(small, None, None, tmp_path / "safe", allow_pickle=True)

    ref = load_node_log(TARBALL, first_node=0, num_nodes=128, skip_rows=1000, allow_pickle=True)
    safe = load_node_log(tmp_path / "safe", first_node=0, num_nodes=128, skip_rows=1000)
    assert safe.node_names == ref.node_names == [str(c) for c in real_frame.columns[:128]]
    assert safe.initial_time == ref.initial_time == real_frame.index[1000]
    assert safe.initial_idle == ref.initial_idle
    assert ref.initial_idle == [str(c) for c in real_frame.columns[:128][real_frame.iloc[1000, :128].to_numpy() == 1]]
    n_cmp = 2000
    ev_ref = list(itertools.islice(ref.events(), n_cmp))
    ev_safe = list(safe.events())
    assert len(ev_ref) == n_cmp and len(ev_safe) >= n_cmp
    assert ev_safe[:n_cmp] == ev_ref
    # the reference dedup: rows differing from the previous kept row
    sub = real_frame.iloc[1000:rows, :128].to_numpy()
    kept = [i for i in range(1, len(sub)) if (sub[i] != sub[i - 1]).any()]
    assert [e.row for e in ev_safe] == [1000 + i for i in kept]


def test_real_task_set_pickle_to_csv_round_trip(tmp_path):
    needs_real_data()
    tasks = load_task_set(JBND, JNPS, allow_pickle=True)
    assert len(tasks) == 10 and tasks[0].name == "J00000"
    assert tasks[0].node_counts == [0, 1, 2, 4, 8, 16, 32, 64]
    assert tasks[0].throughputs[-1] == 145081.5 and tasks[0].total_work_samples == 1.3e8
    convert(None, JBND, None, tmp_path, allow_pickle=True)
    assert load_task_set(tmp_path / "tasks.csv") == tasks
    assert load_task_set(tmp_path, allow_pickle=False) == tasks


# ------------------------------------------------------------------ errors


def test_error_missing_file(tmp_path):
    with pytest.raises(ReplayInputError, match="nope.tar.gz.*not found"):
        load_node_log(tmp_path / "nope.tar.gz", allow_pickle=True)
    with pytest.raises(ReplayInputError, match="tasks.csv.*not found"):
        load_task_set(tmp_path / "tasks.csv")
    (tmp_path / "d").mkdir()
    with pytest.raises(ReplayInputError, match="nodes.csv.*not found"):
        load_node_log(tmp_path / "d")
    for name in ("nope.pkl", "hps-Jbnd-10J.pkl"):  # a missing pickle is said to be missing
        with pytest.raises(ReplayInputError, match=f"{name}: no such file"):
            load_task_set(tmp_path / name, allow_pickle=True)


def test_error_truncated_tarball(tmp_path):
    df = pd.DataFrame(np.eye(50, 40, dtype=np.int8),
                      index=pd.date_range("2021-01-01", periods=50, freq="min"),
                      columns=[f"a01n{i:02d}" for i in range(40)])
    import tarfile
    pkl = tmp_path / "x.pkl"
    df.to_pickle(pkl)
    tgz = tmp_path / "x.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(pkl, arcname="x.pkl")
    assert load_node_log(tgz, skip_rows=0, allow_pickle=True).node_names[0] == "a01n00"
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(tgz.read_bytes()[: tgz.stat().st_size // 2])
    with pytest.raises(ReplayInputError, match=r"cut\.tar\.gz.*(truncated|corrupt)"):
        load_node_log(cut, allow_pickle=True)
    badpkl = tmp_path / "bad.pkl"
    badpkl.write_bytes(pkl.read_bytes()[:100])
    with pytest.raises(ReplayInputError, match=r"bad\.pkl.*unpickle"):
        load_node_log(badpkl, allow_pickle=True)


def test_error_pickle_without_allow(tmp_path):
    with pytest.raises(ReplayInputError, match=r"--allow-pickle.*offcut replay convert"):
        load_node_log(TARBALL if TARBALL.exists() else _tiny_pickle(tmp_path))
    if JBND.exists():
        with pytest.raises(ReplayInputError, match=r"Jbnd.*--allow-pickle"):
            load_task_set(JBND, JNPS)


def _tiny_pickle(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.pkl"
    pd.DataFrame({"a01n01": np.array([0, 1], dtype=np.int8)},
                 index=pd.date_range("2021-01-01", periods=2, freq="min")).to_pickle(p)
    return p


def test_error_csv_missing_column(tmp_path):
    d = generate(tmp_path / "g", num_nodes=8, hours=1, num_tasks=2)
    text = (d / "tasks.csv").read_text().splitlines()
    hdr = text[0].split(",")
    i = hdr.index("max_nodes")
    (d / "tasks.csv").write_text("\n".join(",".join(f for j, f in enumerate(l.split(",")) if j != i)
                                           for l in text) + "\n")
    with pytest.raises(ReplayInputError, match=r"tasks\.csv.*max_nodes"):
        load_task_set(d)
    with gzip.open(d / "events.csv.gz", "rt") as fh:
        lines = fh.read().splitlines()
    with gzip.open(d / "events.csv.gz", "wt") as fh:
        fh.write("\n".join(l.rsplit(",", 1)[0] for l in lines) + "\n")  # drop 'busy'
    with pytest.raises(ReplayInputError, match=r"events\.csv\.gz.*busy"):
        load_node_log(d, skip_rows=0)


def test_error_slice_out_of_range(tmp_path):
    d = generate(tmp_path / "g", num_nodes=8, hours=1, num_tasks=1)
    with pytest.raises(ReplayInputError, match=r"nodes\.csv.*first_node=8.*8 nodes"):
        load_node_log(d, first_node=8, skip_rows=0)
    with pytest.raises(ReplayInputError, match=r"num_nodes=5 exceeds"):
        load_node_log(d, first_node=4, num_nodes=5, skip_rows=0)
    with pytest.raises(ReplayInputError, match="skip_rows=100000"):
        load_node_log(d, skip_rows=100_000)
    p = _tiny_pickle(tmp_path)
    with pytest.raises(ReplayInputError, match=r"tiny\.pkl.*first_node=3"):
        load_node_log(p, first_node=3, skip_rows=0, allow_pickle=True)


def test_error_wrong_dtype_and_inconsistent_events(tmp_path):
    p = tmp_path / "f.pkl"
    pd.DataFrame({"a01n01": [0.5, 1.0]},
                 index=pd.date_range("2021-01-01", periods=2, freq="min")).to_pickle(p)
    with pytest.raises(ReplayInputError, match=r"f\.pkl.*integer 0/1"):
        load_node_log(p, skip_rows=0, allow_pickle=True)
    d = tmp_path / "e"
    d.mkdir()
    (d / "nodes.csv").write_text("index,node\n0,a01n01\n1,a01n02\n")
    with gzip.open(d / "events.csv.gz", "wt") as fh:
        fh.write("row,time,idle,busy\n0,2021-01-01T00:00:00,a01n01,\n"
                 "1,2021-01-01T00:01:00,a01n01,\n")
    log = load_node_log(d, skip_rows=0)
    with pytest.raises(ReplayInputError, match=r"line 3: node a01n01 became idle but was already"):
        list(log.events())


# ------------------------------------------------------------------ report


def test_report_png(tmp_path):
    t0 = pd.Timestamp("2021-02-10 00:00:00")
    times = [t0 + pd.Timedelta(minutes=5 * i) for i in range(40)]
    rng = np.random.default_rng(0)
    nnd = rng.integers(5, 30, len(times))
    steps = pd.DataFrame({
        "evtTime": [t.isoformat() for t in times], "Thr": 1.0, "Rate": 1.0, "ReScost": 0.0,
        "evt": "join", "Nleft": 0, "Npre": 0, "Njoin": 1, "nJob": 3, "nNd": nnd,
        "nJrun": 2, "nNrun": nnd - 2, "PreCost": 0.0, "solve_ms": 3.0})
    steps.to_csv(tmp_path / "steps.csv", index=False)
    rows = []
    for k in range(3):
        total = 1e6 * (k + 1)
        for i, t in enumerate(times[k * 5::6]):
            rows.append((t.isoformat(), k, f"J{k:05d}", "rescale", 4, min(total, total * i / 5), total))
    pd.DataFrame(rows, columns=["time", "task_id", "task_name", "change", "nodes",
                                "work_done_samples", "total_work_samples"]).to_csv(
        tmp_path / "placements.csv", index=False)
    png = render_report(tmp_path)
    data = png.read_bytes()
    assert png == tmp_path / "report.png"
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    w, h = struct.unpack(">II", data[16:24])
    assert w > 600 and h > 400

    (tmp_path / "placements.csv").unlink()
    with pytest.raises(ReplayInputError, match=r"placements\.csv.*not found"):
        render_report(tmp_path)
    steps.drop(columns=["nNrun"]).to_csv(tmp_path / "steps.csv", index=False)
    with pytest.raises(ReplayInputError, match=r"steps\.csv.*nNrun"):
        render_report(tmp_path)


@pytest.mark.parametrize("change,field", [
    (dict(min_nodes=0), "spec.min_nodes"),
    (dict(node_counts=[1, 2, 4]), "spec.node_counts"),        # the curve must start at 0
    (dict(throughputs=[0.0, 1.0, float("nan")]), "spec.throughputs"),
    (dict(total_work_samples=0.0), "spec.total_work_samples"),
])
def test_a_task_the_daemon_would_refuse_is_refused_when_loaded(tmp_path, change, field):
    """One validator (offcut.taskspec): a task set's task is checked by the daemon's rules."""
    from offcut.replay.bftrainer_data import _check_task

    fields = dict(name="j1", submit_time=pd.Timestamp("2021-02-01"), min_nodes=1, max_nodes=4,
                  rescale_up_s=10.0, rescale_down_s=10.0, total_work_samples=1e6,
                  node_counts=[0, 2, 4], throughputs=[0.0, 1.0, 2.0],
                  objective_values=[0.0, 1.0, 2.0])
    assert _check_task(TaskRecord(**fields), tmp_path / "t.csv").name == "j1"
    with pytest.raises(ReplayInputError) as info:
        _check_task(TaskRecord(**{**fields, **change}), tmp_path / "t.csv")
    assert f"t.csv: task 'j1': {field}:" in str(info.value)

"""``offcut sweep`` (offcut.replay.sweep, docs/replay-and-policies.md, "Sweeps"): specs are
checked and expand to stable cells; cells run through submitit's local executor and its Slurm
executor on the real test cluster with accounting (``slurm_site``); a rerun runs only the
cells not finished; a failed cell is reported with its log and the others finish.

Real parts: the bundled demo log and task set, real replays through private ``offcutd``
processes, submitit's executors, and Slurm's sbatch/sacct.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from offcut.replay.sweep import SweepSubmitError, check_inputs, run_sweep
from offcut.replay.sweep_results import FIGURES, cell_dir, table_text
from offcut.replay.sweep_spec import MAX_CELLS, SweepSpecError, load_spec
from offcut.replay.synth import demo_data_dir

DEMO = demo_data_dir()
#: 8 cells of the demo log (64 nodes), each a few seconds
GRID = """
[fixed]
node_log = "{demo}"
tasks = "{demo}"
skip_rows = 0
max_events = 150
[grid]
policy = ["throughput", "energy"]
tfwd = [10, 60]
num_nodes = [16, 32]
"""


def write_spec(folder: Path, text: str, name: str = "study.toml") -> Path:
    path = folder / name
    path.write_text(text.format(demo=DEMO))
    return path


def row_times(out: Path, spec) -> dict[str, int]:
    return {c.id: (cell_dir(out, c.id) / "row.json").stat().st_mtime_ns for c in spec.cells}


@pytest.fixture
def site(slurm_site, monkeypatch):
    """The test cluster with accounting, in this process's environment (submitit calls
    sbatch, squeue and sacct)."""
    for key in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(key, slurm_site.env[key])
    return slurm_site


def slurm_grid(max_events: int, max_parallel: int, drop: tuple[str, ...] = (),
               slurm: str = "") -> str:
    """:data:`GRID` with ``max_events``, without the axes ``drop``, on the Slurm executor
    (partition batch, a CPU per cell), ``max_parallel`` at once; ``slurm``: more [slurm]
    lines."""
    text = GRID.replace("max_events = 150", f"max_events = {max_events}")
    for axis in drop:
        text = re.sub(rf"^{axis} = .*\n", "", text, flags=re.MULTILINE)
    return text + (f'[sweep]\nexecutor = "slurm"\nmax_parallel = {max_parallel}\n'
                   f'[slurm]\npartition = "batch"\ncpus_per_task = 1\n{slurm}')


# ---------------------------------------------------------------------------- the spec
def test_grid_expands_to_stable_cells_with_their_axes(tmp_path):
    spec = load_spec(write_spec(tmp_path, GRID))
    assert len(spec.cells) == 8 and spec.axes == ("policy", "tfwd", "num_nodes")
    assert len({c.id for c in spec.cells}) == 8
    first = spec.cells[0].settings
    assert (first.policy, first.tfwd, first.num_nodes, first.max_events) == ("throughput", 10.0, 16, 150)
    # the same settings written otherwise (keys reordered, 10 as 10.0) are the same cells
    reordered = GRID.replace('tfwd = [10, 60]\nnum_nodes = [16, 32]',
                             'num_nodes = [16, 32]\ntfwd = [10.0, 60.0]')
    again = load_spec(write_spec(tmp_path, reordered, "again.toml"))
    assert {c.id for c in again.cells} == {c.id for c in spec.cells}
    # a fixed setting is part of every cell's identity
    other = load_spec(write_spec(tmp_path, GRID.replace("max_events = 150", "max_events = 151"),
                                 "other.toml"))
    assert not {c.id for c in other.cells} & {c.id for c in spec.cells}


def test_a_cells_settings_are_the_replays_options_under_the_cli_names(tmp_path):
    from offcut.replay.driver import replay_options

    cell = load_spec(write_spec(tmp_path, GRID)).cells[-1].settings  # (energy, 60 s, 32 nodes)
    opts = replay_options(progress=False, **cell.replay_settings())
    assert (opts.objective, opts.tfwd_s, opts.max_events, opts.progress) == ("energy", 60.0,
                                                                             150, False)
    assert "num_nodes" not in cell.replay_settings()  # (an input, not a replay option)


def test_relative_paths_are_the_spec_folders_and_cells_can_be_listed(tmp_path):
    (tmp_path / "inputs").symlink_to(DEMO)
    spec = load_spec(write_spec(tmp_path, """
[sweep]
out = "results"
[fixed]
node_log = "inputs"
tasks = "inputs"
[[cells]]
num_nodes = 8
[[cells]]
num_nodes = 16
policy = "energy"
"""))
    assert spec.out_dir() == (tmp_path / "results").resolve()
    assert [c.settings.node_log for c in spec.cells] == [str((tmp_path / "inputs").resolve())] * 2
    assert spec.axes == ("num_nodes", "policy")


@pytest.mark.parametrize("text, named", [
    ("[fixed]\nnode_log='x'\ntasks='x'\n[grid]\ntfwd=[0.0, 10]\n", "tfwd"),
    ("[fixed]\nnode_log='x'\ntasks='x'\n[grid]\npolcy=['energy']\n", "polcy"),
    ("[fixed]\nnode_log='x'\ntasks='x'\n[grid]\nsolver=['simplex']\n", "solver"),
    ("[fixed]\nnode_log='x'\n[grid]\nnum_nodes=[1]\n", "tasks"),
    ("[fixed]\nnode_log='x'\ntasks='x'\n[grid]\nnum_nodes=[]\n", "grid.num_nodes"),
    ("[fixed]\nnode_log='x'\ntasks='x'\nseed=1\n[grid]\nseed=[1, 2]\n", "seed"),
    ("[fixed]\nnode_log='x'\ntasks='x'\n[grid]\nseed=[1, 1]\n", "same settings"),
    ("[fixed]\nnode_log='x'\ntasks='x'\n", "no cell"),
    ("[sweep]\nexecutor='condor'\n[[cells]]\nnode_log='x'\ntasks='x'\n", "sweep.executor"),
    ("[slurm]\npartition='a b'\n[[cells]]\nnode_log='x'\ntasks='x'\n", "slurm.partition"),
    ("[clusters]\nx=1\n[[cells]]\nnode_log='x'\ntasks='x'\n", "clusters"),
    ("[grid\n", "not valid TOML"),
])
def test_a_bad_spec_is_refused_naming_the_setting(tmp_path, text, named):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SweepSpecError) as err:
        load_spec(path)
    assert named in str(err.value) and str(path) in str(err.value)


def test_too_many_cells_are_refused_before_expanding(tmp_path):
    side = int(MAX_CELLS ** 0.5) + 1
    path = tmp_path / "big.toml"
    path.write_text(f"[fixed]\nnode_log='x'\ntasks='x'\n[grid]\nseed={list(range(side))}\n"
                    f"first_node={list(range(side))}\n")
    with pytest.raises(SweepSpecError, match=f"{side * side} cells, at most {MAX_CELLS}"):
        load_spec(path)


def test_missing_inputs_and_unknown_policies_stop_the_sweep_before_it_submits(tmp_path):
    spec = load_spec(write_spec(tmp_path, GRID.replace('tasks = "{demo}"', 'tasks = "nothere"')))
    with pytest.raises(SweepSpecError, match="tasks .*nothere: no such file"):
        check_inputs(spec)
    spec = load_spec(write_spec(tmp_path, GRID.replace('"energy"', '"no-such-policy"')))
    with pytest.raises(SweepSpecError, match="policy 'no-such-policy'"):
        run_sweep(spec, progress=False, echo=lambda s: None)
    assert not spec.out_dir().exists()  # nothing was made or submitted


def test_a_second_sweep_in_the_same_folder_is_refused(tmp_path):
    from filelock import FileLock

    spec = load_spec(write_spec(tmp_path, GRID))
    spec.out_dir().mkdir()
    with FileLock(spec.out_dir() / ".sweep.lock"):  # (a sweep running in another process)
        with pytest.raises(SweepSpecError, match="another offcut sweep runs in"):
            run_sweep(spec, progress=False, echo=lambda s: None)
    assert not (spec.out_dir() / "cells").exists()


def test_without_the_sweep_extra_it_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # (as if not installed)
    spec = load_spec(write_spec(tmp_path, GRID))
    with pytest.raises(SweepSpecError, match=r"needs submitit: pip install 'offcut\[sweep\]'"):
        run_sweep(spec, progress=False, echo=lambda s: None)
    assert not spec.out_dir().exists()


def test_pickles_need_the_command_lines_word_and_a_foreign_folder_is_refused(tmp_path):
    spec = load_spec(write_spec(tmp_path, GRID.replace("skip_rows = 0", "skip_rows = 0\n"
                                                       "allow_pickle = true")))
    with pytest.raises(SweepSpecError, match="give --allow-pickle if you trust them"):
        run_sweep(spec, progress=False, echo=lambda s: None)
    check_inputs(spec, allow_pickle=True)  # (the word given: accepted)
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    spec = load_spec(write_spec(tmp_path, GRID))
    with pytest.raises(SweepSpecError, match="is not a sweep's folder"):
        run_sweep(spec, out=home, progress=False, echo=lambda s: None)
    assert sorted(p.name for p in home.iterdir()) == ["thesis.tex"]


# ---------------------------------------------------------------------------- running
def check_table(out: Path, spec, n: int) -> pd.DataFrame:
    table = pd.read_csv(out / "table.csv")
    assert len(table) == n
    assert list(table.columns) == ["id", *spec.axes, *FIGURES]
    for _, row in table.iterrows():
        summary = json.loads((cell_dir(out, row["id"]) / "summary.json").read_text())
        # the table is the cell's summary, and the efficiency's parts multiply to it
        assert row["dedicated_efficiency"] == pytest.approx(summary["dedicated_efficiency"])
        assert row["dedicated_efficiency"] == pytest.approx(
            row["same_counts_efficiency"] * row["scaling_factor"], rel=1e-9)
        assert row["events"] == summary["events"] <= 150
        assert row["nodes"] == row["num_nodes"]
    assert (out / "sweep.png").stat().st_size > 10_000
    return table


@pytest.mark.slow
def test_local_executor_runs_the_cells_reports_a_failure_and_reruns_only_what_is_left(tmp_path):
    # 8 grid cells, and a listed cell that fails in its job (more nodes than the log has)
    spec_path = write_spec(tmp_path, GRID + "[[cells]]\nnum_nodes = 500\n")
    spec = load_spec(spec_path)
    lines: list[str] = []
    result = run_sweep(spec, progress=False, echo=lines.append, max_parallel=2, poll_s=0.2)
    out = spec.out_dir()
    assert (result.cells, result.finished_before, result.ran) == (9, 0, 9)
    [failure] = result.failed
    assert failure.cell.settings.num_nodes == 500
    assert "ReplayInputError" in failure.error and "exceeds the log's 64 nodes" in failure.error
    assert "exceeds the log's 64 nodes" in failure.log.read_text()
    failed = pd.read_csv(out / "failed.csv")
    assert failed["id"].tolist() == [failure.cell.id] and failed["log"][0] == str(failure.log)
    table = check_table(out, spec, 8)
    assert len(result.table) == 8 and set(result.table["id"]) == set(table["id"])
    text = table_text(result.table, spec.axes)
    assert text.splitlines()[0].split()[:4] == ["policy", "tfwd", "num_nodes", "efficiency"]
    assert "baselines from the tasks' curves" in text.splitlines()[-1]
    before = row_times(out, load_spec(write_spec(tmp_path, GRID)))

    # the rerun runs only the failed cell, and fails it again
    again = run_sweep(spec, progress=False, echo=lines.append, poll_s=0.2)
    assert (again.finished_before, again.ran, len(again.failed)) == (8, 1, 1)
    assert row_times(out, load_spec(write_spec(tmp_path, GRID))) == before

    # without it, the spec is finished: nothing runs, failed.csv goes, the table stays
    done = run_sweep(load_spec(write_spec(tmp_path, GRID)), out=out, progress=False,
                     echo=lines.append)
    assert (done.finished_before, done.ran, done.failed) == (8, 0, [])
    assert not (out / "failed.csv").exists()
    check_table(out, spec, 8)


@pytest.mark.slow
def test_slurm_executor_runs_the_cells_as_one_array_job_on_the_test_cluster(site, tmp_path):
    cluster = site
    spec = load_spec(write_spec(tmp_path, slurm_grid(150, 4)))
    result = run_sweep(spec, progress=False, echo=lambda s: None, poll_s=0.5)
    out = spec.out_dir()
    assert (result.ran, result.failed) == (8, [])
    check_table(out, spec, 8)
    # Slurm ran them: one array job of 8 tasks under the sweep's name, all COMPLETED (sacct:
    # MinJobAge=2, so the controller has forgotten them)
    rows = cluster.run("sacct", "-n", "-X", "-P", "-S", "2020-01-01", "-o", "JobID,JobName,State",
                       "--name", "offcut-sweep-study").stdout.split()
    arrays = {r.split("|")[0].split("_")[0] for r in rows}
    assert len(rows) == 8 and len(arrays) == 1, rows
    assert all(r.endswith("|COMPLETED") for r in rows), rows
    before = row_times(out, spec)
    again = run_sweep(spec, progress=False, echo=lambda s: None)
    assert (again.finished_before, again.ran, again.failed) == (8, 0, [])
    assert row_times(out, spec) == before


@pytest.mark.slow
def test_slurm_arrays_are_cut_at_max_array_size_and_a_refused_submission_says_why(
        site, tmp_path):
    cluster = site
    text = slurm_grid(20, 2, drop=("tfwd",), slurm="max_array_size = 3\n")
    spec = load_spec(write_spec(tmp_path, text, "arrays.toml"))
    result = run_sweep(spec, progress=False, echo=lambda s: None, poll_s=0.5)
    assert (result.ran, result.failed) == (4, [])
    rows = cluster.run("sacct", "-n", "-X", "-P", "-S", "2020-01-01", "-o", "JobID,State",
                       "--name", "offcut-sweep-arrays").stdout.split()
    arrays = sorted({r.split("|")[0].split("_")[0] for r in rows})
    assert len(rows) == 4 and len(arrays) == 2, rows  # 3 cells, then 1
    bad = load_spec(write_spec(tmp_path, text.replace('"batch"', '"nosuch"').replace(
        "max_events = 20", "max_events = 21"), "bad.toml"))
    with pytest.raises(SweepSubmitError, match="slurm executor refused the cells: .*"
                       "(?i:invalid partition)"):
        run_sweep(bad, progress=False, echo=lambda s: None)


@pytest.mark.slow
def test_a_rerun_waits_for_the_cells_a_killed_submitter_left_queued_on_slurm(site, tmp_path):
    cluster = site
    text = slurm_grid(60, 1, drop=("policy",))
    path = write_spec(tmp_path, text, "killed.toml")
    spec = load_spec(path)
    submitter = subprocess.Popen([str(Path(sys.executable).with_name("offcut")), "sweep",
                                  str(path), "--no-progress"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        cluster.wait_for(lambda: "RUNNING" in cluster.run(
            "squeue", "-h", "-r", "--name", "offcut-sweep-killed", "-o", "%T").stdout,
            timeout=120, what="the first cell running")
    finally:
        submitter.kill()  # (SIGKILL: nothing is cancelled, the array stays queued)
        submitter.wait(30)
    result = run_sweep(spec, progress=False, echo=lambda s: None, poll_s=0.5)
    assert result.ran == 0 and result.failed == [] and result.adopted >= 1
    assert result.finished_before + result.adopted == 4
    check_table(spec.out_dir(), spec, 4)
    rows = cluster.run("sacct", "-n", "-X", "-P", "-S", "2020-01-01", "-o", "JobID,State",
                       "--name", "offcut-sweep-killed").stdout.split()
    assert len(rows) == 4 and all(r.endswith("|COMPLETED") for r in rows), rows  # none twice


# ---------------------------------------------------------------------------- the CLI
def offcut(*args: str):
    from typer.testing import CliRunner

    from offcut.client.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_dry_run_lists_the_cells_and_bad_input_exits_2(tmp_path):
    path = write_spec(tmp_path, GRID)
    proc = offcut("sweep", str(path), "--dry-run")
    assert proc.exit_code == 0, proc.output
    lines = proc.output.splitlines()
    assert len([ln for ln in lines if "to run" in ln]) == 8
    assert "policy=energy, tfwd=60.0, num_nodes=32" in proc.output
    assert lines[-1] == f"8 cells; folder {tmp_path / 'study-out'}"
    bad = tmp_path / "bad.toml"
    bad.write_text("[fixed]\nnode_log='x'\ntasks='x'\n[grid]\nmax_tasks=[0]\n")
    proc = offcut("sweep", str(bad))
    assert proc.exit_code == 2 and "max_tasks" in proc.output, proc.output
    proc = offcut("sweep", str(path), "--executor", "condor")
    assert proc.exit_code == 2 and "--executor" in proc.output


def test_cli_runs_a_sweep_prints_its_table_and_a_rerun_runs_nothing(tmp_path):
    path = write_spec(tmp_path, GRID.replace("max_events = 150", "max_events = 20").replace(
        'policy = ["throughput", "energy"]\n', "").replace("tfwd = [10, 60]\n", ""))
    proc = offcut("sweep", str(path), "--no-progress")
    assert proc.exit_code == 0, proc.output
    lines = proc.output.splitlines()
    assert lines[0].startswith("sweep: 2 cells, 0 finished before, 2 to run with the local")
    assert [ln.split()[0] for ln in lines[2:4]] == ["16", "32"]  # the table, by num_nodes
    assert lines[-1].startswith("sweep: 2 cells run in ")
    assert f"table: {tmp_path / 'study-out' / 'table.csv'}" in lines[-1]
    proc = offcut("sweep", str(path), "--no-progress")
    assert proc.exit_code == 0 and "sweep: 0 cells run in" in proc.output, proc.output

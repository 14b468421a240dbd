"""``offcut sweep``: the cells of a sweep spec (:mod:`offcut.replay.sweep_spec`), each one
replay, run through submitit, and their results gathered into one table and its plots
(docs/replay-and-policies.md, "Sweeps").

The executor is submitit's: ``local`` (a process per cell on this machine, at most
``max_parallel`` at once) or ``slurm`` (a Slurm array job, ``%max_parallel`` of it running at
once, with the options of ``[slurm]``; more cells than the cluster's MaxArraySize go in further
arrays, each submitted when the one before has ended). A cell runs :func:`run_cell` in the executor's process with
the interpreter that submitted it, so the sweep's folder, the spec's inputs and that
interpreter must be reachable from the compute nodes (a shared filesystem).

The sweep's folder (``OUT``) holds:

* ``cells/<id>/``: one cell's replay outputs (``summary.json``, ``steps.csv``, ``report.png``
  ...) and ``row.json``, its settings and figures, written last and atomically: **a cell is
  finished when its row.json exists**, and a run of the spec runs only the cells that are not
  (a failed or cancelled cell has none, so it runs again);
* ``logs/``: submitit's folder, every job's stdout and stderr (``<job id>_0_log.out`` /
  ``.err``) and its pickled call and result;
* ``table.csv``: one row per finished cell: its id, the swept settings, the figures
  (:data:`FIGURES`); ``failed.csv``: the cells that failed in the last run, their error and
  log; ``sweep.png``: the efficiency and the all-done time against each swept setting
  (:mod:`offcut.replay.sweep_plots`); ``spec.toml``: the spec run last.

Retention: nothing is deleted; each cell's folder is as large as one replay's (a few MB; the
whole machine's steps.csv tens of MB), and submitit's pickles are small.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from offcut.replay.sweep_spec import Cell, CellSettings, SweepSpec, SweepSpecError

__all__ = ["FIGURES", "CellFailure", "SweepResult", "SweepSubmitError", "cell_dir", "finished",
           "gather", "run_cell", "run_sweep"]

#: the figures of a cell in ``table.csv``, from its replay's summary.json
#: (docs/replay-and-policies.md, "Efficiency against dedicated nodes"): the efficiency against
#: dedicated nodes and its parts, the share of idle node-hours held, the all-done time [h
#: from the log's first event; empty when not every task finished], samples, energy [J],
#: decision times [ms], the nodes replayed and the cell's wall time [s]
FIGURES = ("dedicated_efficiency", "same_counts_efficiency", "scaling_factor", "utilisation",
           "all_done_h", "tasks_completed", "tasks_submitted", "stop_reason", "total_samples",
           "idle_node_hours", "used_node_hours", "energy_j", "samples_per_joule",
           "decision_p50_ms", "decision_p99_ms", "events", "nodes", "wall_s")
ROW_FILE = "row.json"


def cell_dir(out: Path, cell_id: str) -> Path:
    """The folder of cell ``cell_id`` in the sweep folder ``out``."""
    return out / "cells" / cell_id


def _write_json_atomic(path: Path, value: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(value, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def figures(summary: dict) -> dict[str, Any]:
    """The :data:`FIGURES` of a replay's ``summary`` (:func:`offcut.replay.driver.summarise`'s
    dict)."""
    done_h = None
    if summary.get("all_done_at") and summary.get("first_event"):
        done_h = (pd.Timestamp(summary["all_done_at"])
                  - pd.Timestamp(summary["first_event"])).total_seconds() / 3600
    dm = summary.get("decision_ms") or {}
    row = {k: summary.get(k) for k in FIGURES}
    row.update(all_done_h=done_h, decision_p50_ms=dm.get("p50"), decision_p99_ms=dm.get("p99"),
               nodes=summary.get("num_nodes"))
    return row


def run_cell(settings: dict[str, Any], folder: str) -> dict[str, Any]:
    """Run one cell: load its inputs, replay them through a private daemon into ``folder``,
    then write ``folder/row.json`` (its settings and :func:`figures`) atomically. This is the
    job submitit runs (in the executor's process); returns the figures.

    Args:
        settings: a :class:`~offcut.replay.sweep_spec.CellSettings` as a dict (checked again).
        folder: the cell's folder (created).

    Raises ``ReplayInputError`` (an input is missing or malformed), ``ValueError`` (a setting
    the replay refuses) or :class:`offcut.errors.OffcutError` (the daemon failed): the job
    fails, and the sweep reports it with its log.
    """
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import ReplayOptions, run_replay

    s = CellSettings(**settings)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    node_log = load_node_log(s.node_log, first_node=s.first_node, num_nodes=s.num_nodes,
                             skip_rows=s.skip_rows, allow_pickle=s.allow_pickle)
    tasks = load_task_set(s.tasks, s.jnps, allow_pickle=s.allow_pickle)
    if s.num_tasks is not None:
        tasks = tasks[:s.num_tasks]  # (sorted by submit time, then name)
    opts = ReplayOptions(solver=s.solver, tfwd_s=s.tfwd, max_tasks=s.max_tasks,
                         max_events=s.max_events, seed=s.seed, time_limit_s=s.time_limit,
                         until_log_end=s.until_log_end, progress=False, curves=s.curves,
                         noise=s.noise, report_every_s=s.report_every, objective=s.policy,
                         eta=s.eta, owners=s.owners)
    summary = run_replay(node_log, tasks, out, opts)
    row = figures(summary)
    row["wall_s"] = time.perf_counter() - started  # (with loading the inputs)
    _write_json_atomic(out / ROW_FILE, {"settings": s.model_dump(mode="json"), "figures": row})
    return row


def finished(out: Path, cell: Cell) -> dict[str, Any] | None:
    """The figures of ``cell`` if it is finished in the sweep folder ``out`` (its row.json
    holds its settings), else None."""
    try:
        row = json.loads((cell_dir(out, cell.id) / ROW_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(row, dict) or row.get("settings") != cell.settings.model_dump(mode="json"):
        return None
    figs = row.get("figures")
    return figs if isinstance(figs, dict) else None


@dataclass(frozen=True)
class CellFailure:
    """A cell whose job failed: ``error`` (the exception's last line, or why the job did not
    complete) and ``log`` (the job's stderr file; its stdout is beside it)."""

    cell: Cell
    error: str
    log: Path | None


@dataclass
class SweepResult:
    """What :func:`run_sweep` did: ``cells`` in the spec, ``finished_before`` (skipped),
    ``ran`` (submitted this time), ``failed``, ``table`` / ``plots`` (paths; plots None when
    nothing is swept or nothing finished), ``wall_s`` [s] from the first submission to the
    last result."""

    cells: int
    finished_before: int
    ran: int
    failed: list[CellFailure] = field(default_factory=list)
    table: Path | None = None
    plots: Path | None = None
    wall_s: float = 0.0


def check_inputs(spec: SweepSpec) -> None:
    """Check before anything is submitted what each cell's job would find only later: every
    input path exists and every policy loads here. Raises :class:`SweepSpecError` naming the
    setting."""
    from offcut.replay.driver import check_policy

    seen: set[tuple[str, str]] = set()
    for cell in spec.cells:
        s = cell.settings
        for name in ("node_log", "tasks", "jnps"):
            value = getattr(s, name)
            if value is not None and (name, value) not in seen:
                seen.add((name, value))
                if not Path(value).exists():
                    raise SweepSpecError(f"sweep spec {spec.path}: {name} {value}: no such file "
                                         "or folder")
        if ("policy", s.policy) not in seen:
            seen.add(("policy", s.policy))
            try:
                check_policy(s.policy)
            except ValueError as exc:
                raise SweepSpecError(f"sweep spec {spec.path}: policy {s.policy!r}: "
                                     f"{str(exc).split(': ', 1)[-1]}") from None


def _executor(spec: SweepSpec, out: Path, kind: str, max_parallel: int):
    import submitit

    ex = submitit.AutoExecutor(folder=out / "logs", cluster=kind)
    params: dict[str, Any] = {"name": f"offcut-sweep-{spec.path.stem}"[:64],
                              "timeout_min": spec.sweep.time_min}
    if kind == "slurm":
        sl = spec.slurm
        params.update(cpus_per_task=sl.cpus_per_task, slurm_array_parallelism=max_parallel)
        params.update({f"slurm_{k}": v for k, v in (("partition", sl.partition),
                                                    ("account", sl.account), ("qos", sl.qos))
                       if v is not None})
        if sl.mem_gb is not None:
            params["mem_gb"] = sl.mem_gb
    ex.update_parameters(**params)
    return ex


def _failure(cell: Cell, job) -> CellFailure | None:
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        job.result()
        return None
    except FailedJobError as exc:
        # "... failed during processing with trace:\n-----\n<traceback>\n-----\n<log paths>":
        # the traceback's last line is the exception
        parts = str(exc).split("----------------------")
        lines = [ln.strip() for ln in (parts[1] if len(parts) > 2 else str(exc)).splitlines()
                 if ln.strip()]
        error = lines[-1] if lines else type(exc).__name__
    except UncompletedJobError as exc:  # killed, timed out, or cancelled: no result written
        error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the job's result could not be read back
        error = f"{type(exc).__name__}: {exc}"
    try:
        log = Path(job.paths.stderr)
    except Exception:  # noqa: BLE001 - (no paths for a job that never started)
        log = None
    return CellFailure(cell, error[-500:], log)


class SweepSubmitError(RuntimeError):
    """The executor refused the cells (``sbatch`` failed: a partition or account the cluster
    does not know, a limit; no ``sbatch``): the message says why, in one line."""


def _submit(ex, kind: str, out: Path, cells: list[Cell]) -> list[tuple[Cell, Any]]:
    settings = [c.settings.model_dump(mode="json") for c in cells]
    folders = [str(cell_dir(out, c.id)) for c in cells]
    try:
        if kind == "slurm":
            return list(zip(cells, ex.map_array(run_cell, settings, folders)))
        return [(c, ex.submit(run_cell, s, f)) for c, s, f in zip(cells, settings, folders)]
    except Exception as exc:  # noqa: BLE001 - submitit raises what sbatch or Popen raised
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise SweepSubmitError(f"the {kind} executor refused the cells: {text[-500:]}") from None


def _run_jobs(ex, kind: str, out: Path, cells: list[Cell], max_parallel: int, array_size: int,
              on_done: Callable[[Cell, CellFailure | None], None], poll_s: float) -> None:
    """Submit ``cells`` and wait for each; calls ``on_done`` as each ends. The Slurm executor
    gets an array job of up to ``array_size`` cells (its throttle ``%max_parallel``), the next
    one when it has ended; the local executor a process per cell, ``max_parallel`` at once.
    Raises :class:`SweepSubmitError`; interrupted (Ctrl-C), it cancels the cells running."""
    size = array_size if kind == "slurm" else 1
    batches = [cells[i:i + size] for i in range(0, len(cells), size)]
    running: list[tuple[Cell, Any]] = []
    try:
        while batches or running:
            while batches and (not running if kind == "slurm" else len(running) < max_parallel):
                running += _submit(ex, kind, out, batches.pop(0))
            still = []
            for cell, job in running:
                if job.done():
                    on_done(cell, _failure(cell, job))
                else:
                    still.append((cell, job))
            running = still
            if running:
                time.sleep(poll_s)
    except BaseException:  # interrupted: the cells still running are cancelled, not left behind
        for _, job in running:
            try:
                job.cancel(check=False)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        raise


def run_sweep(spec: SweepSpec, *, out: Path | None = None, executor: str | None = None,
              max_parallel: int | None = None, progress: bool = True, poll_s: float = 1.0,
              echo: Callable[[str], None] = print) -> SweepResult:
    """Run the spec's cells that are not finished in ``out`` (default ``spec.out_dir()``),
    through submitit's ``executor`` (default ``[sweep] executor``), at most ``max_parallel``
    at once (default ``[sweep] max_parallel``); a failed cell is reported (``echo``) with its
    log and does not stop the others. Then gather every finished cell into ``table.csv`` and
    ``sweep.png``, and the failures into ``failed.csv``.

    Raises :class:`SweepSpecError` for an input that is missing, a policy that does not load,
    no submitit, or another sweep running in ``out``, before anything is submitted;
    :class:`SweepSubmitError` when the executor refuses the cells (the cells of earlier
    Slurm arrays that still run are cancelled).
    """
    out = (out or spec.out_dir()).resolve()
    kind = executor or spec.sweep.executor
    parallel = max_parallel or spec.sweep.max_parallel
    check_inputs(spec)
    try:
        import filelock  # noqa: F401
        import submitit  # noqa: F401
    except ImportError as exc:
        raise SweepSpecError(f"offcut sweep needs {exc.name}: pip install 'offcut[sweep]' (in a "
                             "source checkout: pip install -e '.[sweep]')") from None
    out.mkdir(parents=True, exist_ok=True)
    with _only_sweep_in(out):
        return _run_sweep(spec, out, kind, parallel, progress, poll_s, echo)


@contextmanager
def _only_sweep_in(out: Path) -> Iterator[None]:
    """Hold ``out/.sweep.lock`` (``flock``, dropped by the kernel if this process dies): two
    sweeps in one folder would run the same cells into the same folders."""
    from filelock import FileLock, Timeout

    lock = FileLock(out / ".sweep.lock", timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise SweepSpecError(f"another offcut sweep runs in {out} (lock {out / '.sweep.lock'}); "
                             "wait for it or give this one another --out") from None
    try:
        yield
    finally:
        lock.release()


def _run_sweep(spec: SweepSpec, out: Path, kind: str, parallel: int, progress: bool,
               poll_s: float, echo: Callable[[str], None]) -> SweepResult:
    if spec.path.resolve() != (out / "spec.toml").resolve():
        shutil.copyfile(spec.path, out / "spec.toml")
    todo = [c for c in spec.cells if finished(out, c) is None]
    result = SweepResult(cells=len(spec.cells), finished_before=len(spec.cells) - len(todo),
                         ran=len(todo))
    echo(f"sweep: {len(spec.cells)} cells, {result.finished_before} finished before, "
         f"{len(todo)} to run with the {kind} executor ({parallel} at once); folder {out}")
    started = time.perf_counter()
    if todo:
        from tqdm import tqdm

        ex = _executor(spec, out, kind, parallel)
        with tqdm(total=len(todo), desc="cells", unit="cell", disable=not progress) as bar:
            def done(cell: Cell, failure: CellFailure | None) -> None:
                if failure is not None:
                    result.failed.append(failure)
                    bar.write(f"cell {cell.id} ({_where(spec, cell)}) failed: {failure.error}"
                              f"\n  log: {failure.log}")
                bar.update(1)
                bar.set_postfix(failed=len(result.failed))
            _run_jobs(ex, kind, out, todo, parallel, spec.slurm.max_array_size, done, poll_s)
    result.wall_s = time.perf_counter() - started
    result.table, result.plots = gather(spec, out)
    _write_failures(out, spec, result.failed)
    return result


def _where(spec: SweepSpec, cell: Cell) -> str:
    return ", ".join(f"{a}={getattr(cell.settings, a)}" for a in spec.axes) or "the only cell"


def _write_failures(out: Path, spec: SweepSpec, failed: list[CellFailure]) -> None:
    rows = [{"id": f.cell.id, **{a: getattr(f.cell.settings, a) for a in spec.axes},
             "error": f.error, "log": str(f.log) if f.log else ""} for f in failed]
    path = out / "failed.csv"
    if rows:
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path.unlink(missing_ok=True)


def gather(spec: SweepSpec, out: Path) -> tuple[Path, Path | None]:
    """Write ``out/table.csv`` (a row per finished cell of ``spec``: id, swept settings,
    :data:`FIGURES`) and ``out/sweep.png``; returns their paths (the plot's None when nothing
    is swept or no cell finished)."""
    from offcut.replay.sweep_plots import plot_sweep

    rows = []
    for cell in spec.cells:
        figs = finished(out, cell)
        if figs is not None:
            rows.append({"id": cell.id, **{a: getattr(cell.settings, a) for a in spec.axes},
                         **{k: figs.get(k) for k in FIGURES}})
    table = pd.DataFrame(rows, columns=["id", *spec.axes, *FIGURES])
    path = out / "table.csv"
    table.to_csv(path, index=False)
    plots = None
    if rows and spec.axes:
        plots = plot_sweep(table, spec.axes, out / "sweep.png", title=spec.path.name)
    return path, plots


def table_text(table: pd.DataFrame, axes: tuple[str, ...]) -> str:
    """``table`` (:func:`gather`'s) as aligned text: the swept settings, the efficiency and its
    parts [%], the idle node-hours used [%], the all-done time [h], the tasks done, the
    decision time's p99 [ms] and the cell's wall time [s]."""
    cols = [*axes, "dedicated_efficiency", "same_counts_efficiency", "scaling_factor",
            "utilisation", "all_done_h", "tasks_completed", "decision_p99_ms", "wall_s"]
    shown = table[cols].copy()
    for c in ("node_log", "tasks", "jnps"):  # (the file names: the table has the paths)
        if c in shown:
            shown[c] = shown[c].map(lambda v: Path(v).name if isinstance(v, str) else v)
    for c in ("dedicated_efficiency", "same_counts_efficiency", "scaling_factor", "utilisation"):
        shown[c] = shown[c].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v))
                                else f"{100 * v:.1f} %")
    shown["all_done_h"] = shown["all_done_h"].map(
        lambda v: "not all" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}")
    shown["wall_s"] = shown["wall_s"].map(lambda v: f"{v:.1f}")
    shown["decision_p99_ms"] = shown["decision_p99_ms"].map(lambda v: f"{v:.2f}")
    shown = shown.rename(columns={"dedicated_efficiency": "efficiency",
                                  "same_counts_efficiency": "= overhead",
                                  "scaling_factor": "x scaling", "utilisation": "idle used",
                                  "all_done_h": "all done [h]", "tasks_completed": "done",
                                  "decision_p99_ms": "p99 [ms]",
                                  "wall_s": "wall [s]"})
    return shown.to_string(index=False)

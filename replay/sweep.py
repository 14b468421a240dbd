"""``offcut sweep``: the cells of a sweep spec (:mod:`offcut.replay.sweep_spec`), each one
replay, run through submitit, and their results gathered into one table and its plots
(docs/replay-and-policies.md, "Sweeps").

The executor is submitit's: ``local`` (a process per cell on this machine, at most
``max_parallel`` at once) or ``slurm`` (a Slurm array job, ``%max_parallel`` of it running at
once, with the options of ``[slurm]``; more cells than the cluster's MaxArraySize go in further
arrays, each submitted when the one before has ended). A cell runs :func:`run_cell` in the
executor's process with the interpreter that submitted it, so the sweep's folder, the spec's
inputs and that interpreter must be reachable from the compute nodes (a shared filesystem).

The sweep's folder (``OUT``) holds:

* ``cells/<id>/``: one cell's replay outputs (``summary.json``, ``steps.csv``, ``report.png``
  ...) and ``row.json``, its settings and figures, written last and atomically: **a cell is
  finished when its row.json exists**, and a run of the spec runs only the cells that are not
  (a failed or cancelled cell has none, so it runs again); ``job.json``, its Slurm job id: a
  rerun waits for a cell whose job squeue still lists (its submitter was killed) rather than
  submit it again;
* ``logs/``: submitit's folder, every job's stdout and stderr (``<job id>_0_log.out`` /
  ``.err``) and its pickled call and result;
* ``table.csv``: one row per finished cell: its id, the swept settings, the figures
  (:mod:`offcut.replay.sweep_results`); ``failed.csv``: the cells that failed in the last run, their error and
  log; ``sweep.png``: the efficiency and the all-done time against each swept setting
  (:mod:`offcut.replay.sweep_plots`); ``spec.toml``: the spec run last.

Retention: nothing is deleted; each cell's folder is as large as one replay's (a few MB; the
whole machine's steps.csv tens of MB); ``logs/`` gains a few small files per cell run and may
be removed whenever no sweep runs in the folder.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from offcut.replay.sweep_results import cell_dir, figures, finished, gather, write_row
from offcut.replay.sweep_spec import PATH_SETTINGS, Cell, CellSettings, SweepSpec, SweepSpecError
from offcut.text_safety import terminal_safe, write_csv_frame

__all__ = ["CellFailure", "SweepResult", "SweepSubmitError", "check_inputs", "run_cell",
           "run_sweep", "still_queued"]

#: the most cells looked at per second on Slurm (each look checks the cell's result file on
#: the shared filesystem; submitit's sacct runs at most every few seconds whatever this is)
SLURM_LOOKS_PER_S = 100


def poll_interval(kind: str, cells: int) -> float:
    """Seconds between looks at ``cells`` running cells: 1 s, and on Slurm up to 10 s so that
    no more than :data:`SLURM_LOOKS_PER_S` cells are looked at per second."""
    return 1.0 if kind == "local" else min(10.0, max(1.0, cells / SLURM_LOOKS_PER_S))


def run_cell(settings: dict[str, Any], folder: str) -> dict[str, Any]:
    """Run one cell: load its inputs, replay them through a private daemon into ``folder``,
    then write ``folder/row.json`` (its settings and figures,
    :func:`offcut.replay.sweep_results.write_row`). This is the job submitit runs (in the
    executor's process); returns the figures.

    Args:
        settings: a :class:`~offcut.replay.sweep_spec.CellSettings` as a dict (checked again).
        folder: the cell's folder (created).

    Raises ``ReplayInputError`` (an input is missing or malformed), ``ValueError`` (a setting
    the replay refuses) or :class:`offcut.errors.OffcutError` (the daemon failed): the job
    fails, and the sweep reports it with its log.
    """
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import replay_options, run_replay

    s = CellSettings(**settings)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    node_log = load_node_log(s.node_log, first_node=s.first_node, num_nodes=s.num_nodes,
                             skip_rows=s.skip_rows, allow_pickle=s.allow_pickle)
    tasks = load_task_set(s.tasks, s.jnps, allow_pickle=s.allow_pickle)
    if s.num_tasks is not None:
        tasks = tasks[:s.num_tasks]  # (sorted by submit time, then name)
    opts = replay_options(progress=False, **s.replay_settings())
    row = figures(run_replay(node_log, tasks, out, opts))
    row["wall_s"] = time.perf_counter() - started  # (with loading the inputs)
    write_row(out, s, row)
    return row


@dataclass(frozen=True)
class CellFailure:
    """A cell whose job failed: ``error`` (the exception's last line, or why the job left no
    result: its Slurm state) and ``log`` (the job's stderr file; its stdout is beside it)."""

    cell: Cell
    error: str
    log: Path | None


@dataclass
class SweepResult:
    """What :func:`run_sweep` did: ``cells`` in the spec, ``finished_before`` (skipped),
    ``ran`` (submitted this time), ``adopted`` (an earlier run's Slurm jobs still queued or
    running, waited for: :func:`still_queued`), ``failed``, ``table`` (the finished cells, a
    ``pandas.DataFrame``: :func:`offcut.replay.sweep_results.gather`), ``table_csv`` /
    ``plots`` (paths; plots None when nothing is swept or nothing finished), ``wall_s`` [s]
    from the first submission to the last result."""

    cells: int
    finished_before: int
    ran: int
    adopted: int = 0
    failed: list[CellFailure] = field(default_factory=list)
    table: Any = None
    table_csv: Path | None = None
    plots: Path | None = None
    wall_s: float = 0.0


class SweepSubmitError(RuntimeError):
    """The executor refused the cells (``sbatch`` failed: a partition or account the cluster
    does not know, a limit): the message says why, in one line."""


def check_inputs(spec: SweepSpec, allow_pickle: bool = False) -> None:
    """Check before anything is submitted what each cell's job would find only later: every
    input path exists, every policy loads here, and no cell sets ``allow_pickle`` unless
    ``allow_pickle`` (a pickle runs code from its file: the spec's author is trusted only on
    the command line's word). Raises :class:`SweepSpecError` naming the setting."""
    from offcut.daemon.app.policies import PolicyError, policy_class

    where = f"sweep spec {spec.path}"
    if not allow_pickle and any(c.settings.allow_pickle for c in spec.cells):
        raise SweepSpecError(f"{where}: allow_pickle = true loads pickles, which runs code from "
                             "the files: give --allow-pickle if you trust them")
    seen: set[tuple[str, str]] = set()
    for cell in spec.cells:
        s = cell.settings
        for name in PATH_SETTINGS:
            value = getattr(s, name)
            if value is not None and (name, value) not in seen:
                seen.add((name, value))
                if not Path(value).exists():
                    raise SweepSpecError(f"{where}: {name} {value}: no such file or folder")
        if ("policy", s.policy) not in seen:
            seen.add(("policy", s.policy))
            try:
                policy_class(s.policy)
            except PolicyError as exc:
                raise SweepSpecError(f"{where}: policy {s.policy!r}: {exc}") from None


def _check_folder(out: Path) -> None:
    """Refuse an ``out`` that holds other files than a sweep's (its table and plot would be
    written over them)."""
    if out.is_dir() and any(out.iterdir()) and not any(
            (out / name).exists() for name in ("cells", ".sweep.lock", "spec.toml")):
        raise SweepSpecError(f"{out} holds files and is not a sweep's folder (no cells/): give "
                             "a new or empty folder (--out)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SweepSpecError(f"cannot make the sweep's folder {out}: "
                             f"{exc.strerror or exc}") from None


def _executor(spec: SweepSpec, out: Path, kind: str, max_parallel: int):
    import submitit

    try:
        ex = submitit.AutoExecutor(folder=out / "logs", cluster=kind)
    except Exception as exc:  # noqa: BLE001 - (e.g. no srun: submitit's RuntimeError)
        raise SweepSubmitError(f"the {kind} executor cannot start here: "
                               f"{' '.join(str(exc).split())}") from None
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
    except UncompletedJobError as exc:  # killed, out of memory, cancelled: no result written
        state = re.search(r"\(state: ([^)]*)\)", str(exc))
        error = (f"job {job.job_id} ended without a result (state {state.group(1)})" if state
                 else " ".join(str(exc).split()[:40]) or type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - the job's result could not be read back
        error = f"{type(exc).__name__}: {exc}"
    try:
        log = Path(job.paths.stderr)
    except Exception:  # noqa: BLE001 - (no paths for a job that never started)
        log = None
    return CellFailure(cell, error[-500:], log)


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


#: a cell's Slurm job id (``{"job_id": "123_4"}``), written when it is submitted
JOB_FILE = "job.json"
#: squeue states of a cell's job that a rerun waits for instead of submitting the cell again
QUEUED_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING",
                 "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"}


def _record_jobs(out: Path, submitted: list[tuple[Cell, Any]]) -> None:
    """Write each submitted cell's Slurm job id to its folder (:data:`JOB_FILE`)."""
    for cell, job in submitted:
        folder = cell_dir(out, cell.id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / JOB_FILE).write_text(json.dumps({"job_id": str(job.job_id)}) + "\n")


def still_queued(out: Path, cells: list[Cell]) -> list[tuple[Cell, Any]]:
    """The cells of ``cells`` whose Slurm job from an earlier run (:data:`JOB_FILE`) squeue
    still lists as pending or running (:data:`QUEUED_STATES`), as ``(cell, submitit job)``:
    a rerun waits for them rather than run them twice (the earlier submitter was killed
    without cancelling them). A job squeue does not know has ended."""
    from submitit import SlurmJob

    recorded: dict[str, Cell] = {}
    for cell in cells:
        try:
            job_id = json.loads((cell_dir(out, cell.id) / JOB_FILE).read_text())["job_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(job_id, str) and re.fullmatch(r"\d+(_\d+)?", job_id):
            recorded[job_id] = cell
    live: set[str] = set()
    for array in sorted({j.split("_")[0] for j in recorded}):
        try:  # (-r: a line per array task, "123_4"; an id squeue has forgotten: exit 1)
            proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", array],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        live.update(f[0] for f in (line.split() for line in proc.stdout.splitlines())
                    if len(f) == 2 and f[1] in QUEUED_STATES)
    return [(cell, SlurmJob(folder=out / "logs", job_id=j)) for j, cell in recorded.items()
            if j in live]


def _cancel(kind: str, jobs: list[Any]) -> None:
    """Cancel ``jobs``, best effort: on Slurm one ``scancel`` of their array ids."""
    try:
        if kind == "slurm":
            ids = sorted({str(j.job_id).split("_")[0] for j in jobs})
            if ids:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
        else:
            for job in jobs:
                job.cancel(check=False)
    except Exception:  # noqa: BLE001 - on the way out
        pass


def _run_jobs(ex, kind: str, out: Path, cells: list[Cell], adopted: list[tuple[Cell, Any]],
              max_parallel: int, array_size: int,
              on_done: Callable[[Cell, CellFailure | None], None], poll_s: float | None) -> None:
    """Submit ``cells`` and wait for each, and for the ``adopted`` jobs of an earlier run;
    calls ``on_done`` as each ends. The Slurm executor gets an array job of up to
    ``array_size`` cells (its throttle ``%max_parallel``), the next one when the jobs before
    have ended; the local executor a process per cell, ``max_parallel`` at once. Raises
    :class:`SweepSubmitError`; interrupted (Ctrl-C), it cancels the cells running."""
    size = array_size if kind == "slurm" else 1
    batches = [cells[i:i + size] for i in range(0, len(cells), size)]
    running: list[tuple[Cell, Any]] = list(adopted)
    try:
        while batches or running:
            while batches and (not running if kind == "slurm" else len(running) < max_parallel):
                submitted = _submit(ex, kind, out, batches.pop(0))
                if kind == "slurm":
                    _record_jobs(out, submitted)
                running += submitted
            still = []
            for cell, job in running:
                if job.done():
                    on_done(cell, _failure(cell, job))
                else:
                    still.append((cell, job))
            running = still
            if running:
                time.sleep(poll_s or poll_interval(kind, len(running)))
    except BaseException:  # interrupted: the cells still running are cancelled, not left behind
        _cancel(kind, [job for _, job in running])
        raise


def run_sweep(spec: SweepSpec, *, out: Path | None = None, executor: str | None = None,
              max_parallel: int | None = None, allow_pickle: bool = False,
              progress: bool = True, poll_s: float | None = None,
              echo: Callable[[str], None] = print) -> SweepResult:
    """Run the spec's cells that are not finished in ``out`` (default ``spec.out_dir()``),
    through submitit's ``executor`` (default ``[sweep] executor``), at most ``max_parallel``
    at once (default ``[sweep] max_parallel``); a failed cell is reported (``echo``) with its
    log and does not stop the others. Then gather every finished cell into ``table.csv`` and
    ``sweep.png``, and the failures into ``failed.csv``. ``allow_pickle``: cells may load
    pickles (:func:`check_inputs`). ``poll_s``: seconds between looks at the running cells
    (default :func:`poll_interval`).

    Raises :class:`SweepSpecError` before anything is submitted: an input is missing, a
    policy does not load, a cell loads pickles without ``allow_pickle``, the sweep extra is not
    installed, ``out`` is another folder's or cannot be made, or another sweep runs in it.
    :class:`SweepSubmitError` when the executor cannot start or refuses the cells (cells of
    earlier Slurm arrays that still run are cancelled).
    """
    out = (out or spec.out_dir()).resolve()
    kind = executor or spec.sweep.executor
    parallel = max_parallel or spec.sweep.max_parallel
    check_inputs(spec, allow_pickle)
    try:
        import filelock  # noqa: F401
        import submitit  # noqa: F401
    except ImportError as exc:
        raise SweepSpecError(f"offcut sweep needs {exc.name}: pip install 'offcut[sweep]' (in a "
                             "source checkout: pip install -e '.[sweep]')") from None
    _check_folder(out)
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
               poll_s: float | None, echo: Callable[[str], None]) -> SweepResult:
    if spec.path.resolve() != (out / "spec.toml").resolve():
        shutil.copyfile(spec.path, out / "spec.toml")
    todo = [c for c in spec.cells if finished(out, c) is None]
    adopted = still_queued(out, todo) if kind == "slurm" and todo else []
    waiting = {c.id for c, _ in adopted}
    new = [c for c in todo if c.id not in waiting]
    result = SweepResult(cells=len(spec.cells), finished_before=len(spec.cells) - len(todo),
                         ran=len(new), adopted=len(adopted))
    echo(f"sweep: {len(spec.cells)} cells, {result.finished_before} finished before, "
         f"{len(new)} to run with the {kind} executor ({parallel} at once); folder {out}"
         + (f"; waiting for {len(adopted)} cells an earlier run left queued or running"
            if adopted else ""))
    started = time.perf_counter()
    if todo:
        from tqdm import tqdm

        ex = _executor(spec, out, kind, parallel)
        with tqdm(total=len(todo), desc="cells", unit="cell", disable=not progress) as bar:
            def done(cell: Cell, failure: CellFailure | None) -> None:
                if failure is not None:
                    result.failed.append(failure)
                    bar.write(terminal_safe(f"cell {cell.id} ({spec.describe(cell)}) failed: "
                                            f"{failure.error}\n  log: {failure.log}",
                                            keep_newlines=True))
                bar.update(1)
                bar.set_postfix(failed=len(result.failed))
            _run_jobs(ex, kind, out, new, adopted, parallel, spec.slurm.max_array_size, done,
                      poll_s)
    result.wall_s = time.perf_counter() - started
    result.table, result.table_csv, result.plots = gather(spec, out)
    _write_failures(out, spec, result.failed)
    return result


def _write_failures(out: Path, spec: SweepSpec, failed: list[CellFailure]) -> None:
    import pandas as pd

    path = out / "failed.csv"
    if failed:
        write_csv_frame(pd.DataFrame([{"id": f.cell.id, **spec.swept(f.cell), "error": f.error,
                                       "log": str(f.log) if f.log else ""} for f in failed]),
                        path)
    else:
        path.unlink(missing_ok=True)

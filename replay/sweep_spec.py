"""The spec of ``offcut sweep``: a TOML file that names a grid (or a list) of replay settings,
and its cells (docs/replay-and-policies.md, "Sweeps").

A spec has up to five tables::

    [sweep]                 # how to run: out, executor, max_parallel (all optional)
    [slurm]                 # the Slurm executor's job options (optional)
    [fixed]                 # settings every cell shares
    [grid]                  # setting = [values ...]: the cells are every combination
    [[cells]]               # ... and/or cells given one by one (over [fixed])

A cell's settings are :class:`CellSettings` (the options of ``offcut replay bftrainer``, under
the same names, plus ``num_tasks``). Relative paths (``node_log``, ``tasks``, ``jnps``,
``[sweep] out``) are relative to the spec file's folder, so a job on another node finds them.

A cell's id is the first 16 hex digits of the SHA-256 of its settings as canonical JSON (paths
resolved): the same settings are the same cell in every run of the spec, which is what makes a
sweep resumable (:mod:`offcut.replay.sweep`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from offcut.daemon.app.solvers.base import SOLVER_NAMES
from offcut.replay.driver import CURVE_MODES
from offcut.toml_file import TomlFileError, read_toml

__all__ = ["MAX_CELLS", "MAX_SPEC_BYTES", "PATH_SETTINGS", "Cell", "CellSettings",
           "SlurmOptions", "SweepOptions", "SweepSpec", "SweepSpecError", "load_spec",
           "setting_text"]

#: most cells one spec may expand to (a study is hundreds)
MAX_CELLS = 10_000
#: largest spec file [bytes]
MAX_SPEC_BYTES = 1024 * 1024
#: most values one ``[grid]`` axis may list
MAX_AXIS_VALUES = 1_000
#: longest path or name in a spec [characters]
MAX_TEXT = 4096


class SweepSpecError(ValueError):
    """A sweep that cannot start: its spec is unreadable, not TOML, has an unknown table or
    setting, a value out of its bounds or too many cells (the message names the file and the
    setting); or (:func:`offcut.replay.sweep.run_sweep`) an input is missing, a policy does
    not load, the sweep extra is not installed, another sweep runs in the folder."""


class CellSettings(BaseModel):
    """The settings of one cell: one replay (``offcut replay bftrainer``'s options, same names
    and units). ``num_tasks``: only the first N tasks of the set (by submit time); None = all.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_log: str = Field(min_length=1, max_length=MAX_TEXT)
    tasks: str = Field(min_length=1, max_length=MAX_TEXT)
    jnps: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    allow_pickle: bool = False
    first_node: int = Field(0, ge=0, le=10_000_000)
    num_nodes: int | None = Field(None, ge=1, le=10_000_000)
    skip_rows: int = Field(1000, ge=0, le=100_000_000)
    num_tasks: int | None = Field(None, ge=1, le=10_000_000)
    max_tasks: int = Field(10, ge=1, le=10_000_000)
    tfwd: float = Field(10.0, ge=0.001, le=30 * 86400.0)
    solver: Literal[SOLVER_NAMES] = "dp"  # type: ignore[valid-type]
    time_limit: float = Field(10.0, ge=0.01, le=86400.0)
    max_events: int | None = Field(None, ge=1, le=10_000_000_000)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    until_log_end: bool = False
    curves: Literal[CURVE_MODES] = "model"  # type: ignore[valid-type]
    noise: float = Field(0.05, ge=0.0, le=10.0)
    report_every: float = Field(60.0, ge=1.0, le=30 * 86400.0)
    policy: str = Field("throughput", min_length=1, max_length=128)
    eta: float = Field(0.5, ge=0.0, le=1.0)
    owners: int = Field(0, ge=0, le=100_000)

    def replay_settings(self) -> dict[str, Any]:
        """The replay's options among the settings, under the CLI's names (for
        :func:`offcut.replay.driver.replay_options`): all but the inputs
        (:data:`INPUT_SETTINGS`)."""
        return self.model_dump(exclude=set(INPUT_SETTINGS))


class SweepOptions(BaseModel):
    """``[sweep]``: ``out`` (the sweep's folder; default ``<spec name>-out`` beside the spec),
    ``executor`` (``local``: processes on this machine; ``slurm``: one Slurm array job),
    ``max_parallel`` (cells running at once: the local executor's processes, the array's
    ``%N`` throttle), ``time_min`` (a cell's time limit, minutes: Slurm's ``--time``; the
    local executor kills the cell then too)."""

    model_config = ConfigDict(extra="forbid")

    out: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    executor: Literal["local", "slurm"] = "local"
    max_parallel: int = Field(2, ge=1, le=10_000)
    time_min: int = Field(60, ge=1, le=366 * 24 * 60)


class SlurmOptions(BaseModel):
    """``[slurm]``: the job options of the Slurm executor (sbatch's names): ``partition``,
    ``account``, ``qos``, ``cpus_per_task`` (a cell runs a replay and its private daemon: 2 is
    right), ``mem_gb`` (None: the partition's default), ``max_array_size`` (the cluster's
    ``MaxArraySize``, ``scontrol show config``; Slurm's default 1001: an array holds at most
    that many cells, more go in further arrays, one after the other)."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[\w.,-]+$")
    account: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[\w.-]+$")
    qos: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[\w.-]+$")
    cpus_per_task: int = Field(2, ge=1, le=4096)
    mem_gb: float | None = Field(None, ge=0.001, le=65536)  # (>= 1 MB: --mem=0 is "all")
    max_array_size: int = Field(1001, ge=1, le=4_000_001)


@dataclass(frozen=True)
class Cell:
    """One cell: its ``id`` (:func:`cell_id`) and its ``settings``."""

    id: str
    settings: CellSettings


class _SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep: SweepOptions = SweepOptions()
    slurm: SlurmOptions = SlurmOptions()
    fixed: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    cells: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_CELLS)

    @field_validator("grid")
    @classmethod
    def _axes(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in grid.items():
            if not values:
                raise ValueError(f"grid.{name}: an empty list (give at least one value)")
            if len(values) > MAX_AXIS_VALUES:
                raise ValueError(f"grid.{name}: {len(values)} values, at most {MAX_AXIS_VALUES}")
        return grid


@dataclass(frozen=True)
class SweepSpec:
    """A checked spec: ``path`` (the file), ``sweep`` and ``slurm`` options, ``cells`` (in
    the grid's order, then the listed ones; no two alike) and ``axes`` (the settings whose
    values differ between cells, in the spec's order)."""

    path: Path
    sweep: SweepOptions
    slurm: SlurmOptions
    cells: tuple[Cell, ...]
    axes: tuple[str, ...]

    def swept(self, cell: Cell) -> dict[str, Any]:
        """``cell``'s values of the swept settings (:attr:`axes`), by name."""
        return {a: getattr(cell.settings, a) for a in self.axes}

    def describe(self, cell: Cell) -> str:
        """``cell`` in one line: its swept settings (input files by name), e.g.
        ``policy=energy, tfwd=60.0``."""
        return ", ".join(f"{a}={setting_text(a, v)}" for a, v in self.swept(cell).items()) \
            or "the only cell"

    def out_dir(self) -> Path:
        """The sweep's folder: ``[sweep] out`` (relative to the spec's folder), else
        ``<spec stem>-out`` beside the spec."""
        if self.sweep.out:
            return _resolve(self.path.parent, self.sweep.out)
        return self.path.parent / f"{self.path.stem}-out"


#: the settings that are paths (resolved against the spec's folder)
PATH_SETTINGS = ("node_log", "tasks", "jnps")
#: the settings that say what is loaded (the rest are the replay's options)
INPUT_SETTINGS = (*PATH_SETTINGS, "allow_pickle", "first_node", "num_nodes", "skip_rows",
                  "num_tasks")


def setting_text(name: str, value: Any) -> str:
    """A setting's value as a table or plot shows it: an input file by its name (the table's
    CSV keeps the whole path), anything else as ``str``."""
    return Path(value).name if name in PATH_SETTINGS and isinstance(value, str) else str(value)


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def cell_id(settings: CellSettings) -> str:
    """16 hex digits of the SHA-256 of ``settings`` as canonical JSON (sorted keys, every
    setting, defaults included): the same settings give the same id in every run."""
    text = json.dumps(settings.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cell(base: Path, values: dict[str, Any], where: str) -> CellSettings:
    values = dict(values)
    for key in PATH_SETTINGS:
        if isinstance(values.get(key), str) and values[key]:
            values[key] = str(_resolve(base, values[key]))
    try:
        return CellSettings(**values)
    except ValidationError as exc:
        raise SweepSpecError(f"{where}: {_problems(exc)}") from None


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}"
                     for e in exc.errors()[:5])


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check the spec at ``path``; expand its cells.

    Raises:
        SweepSpecError: unreadable or over :data:`MAX_SPEC_BYTES`, not TOML, an unknown table
            or setting, a value out of bounds, a grid axis that is also ``[fixed]``, no cell,
            more than :data:`MAX_CELLS` cells, or the same cell twice. The message names the
            file and the setting.
    """
    path = Path(path).resolve()
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise SweepSpecError(f"sweep spec {path}: larger than {MAX_SPEC_BYTES} bytes")
        raw = read_toml(path, "sweep spec")
    except (OSError, TomlFileError) as exc:
        raise SweepSpecError(str(exc) if isinstance(exc, TomlFileError)
                             else f"cannot read sweep spec {path}: {exc.strerror}") from None
    try:
        spec = _SpecFile(**raw)
    except ValidationError as exc:
        raise SweepSpecError(f"sweep spec {path}: {_problems(exc)}") from None
    both = sorted(set(spec.fixed) & set(spec.grid))
    if both:
        raise SweepSpecError(f"sweep spec {path}: {', '.join(both)} both fixed and in the grid")
    n_grid = 1
    for values in spec.grid.values():
        n_grid *= len(values)
    n = (n_grid if spec.grid else 0) + len(spec.cells)
    if n == 0:
        raise SweepSpecError(f"sweep spec {path}: no cell (give a [grid] or [[cells]])")
    if n > MAX_CELLS:
        raise SweepSpecError(f"sweep spec {path}: {n} cells, at most {MAX_CELLS}")
    base = path.parent
    settings: list[CellSettings] = []
    if spec.grid:
        names = list(spec.grid)
        for combo in itertools.product(*spec.grid.values()):
            point = dict(zip(names, combo))
            where = f"sweep spec {path}, grid cell {point}"
            settings.append(_cell(base, {**spec.fixed, **point}, where))
    for i, listed in enumerate(spec.cells):
        settings.append(_cell(base, {**spec.fixed, **listed}, f"sweep spec {path}, cells[{i}]"))
    cells, seen = [], {}
    for i, s in enumerate(settings):
        cid = cell_id(s)
        if cid in seen:
            raise SweepSpecError(f"sweep spec {path}: cells {seen[cid]} and {i} have the same "
                                 "settings")
        seen[cid] = i
        cells.append(Cell(cid, s))
    dumped = [s.model_dump() for s in settings]
    order = list(spec.grid) + [k for c in spec.cells for k in c] + list(CellSettings.model_fields)
    axes = tuple(dict.fromkeys(k for k in order
                               if len({json.dumps(d[k], sort_keys=True) for d in dumped}) > 1))
    return SweepSpec(path, spec.sweep, spec.slurm, tuple(cells), axes)

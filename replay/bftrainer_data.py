"""Readers and writers for BFTrainer-style replay inputs: node-state logs and elastic task sets.

Two input flavours are supported:

* **Original pickles** published with the BFTrainer paper (``ndstat-*-evt.tar.gz`` /
  ``.pkl`` node-state log, ``*-Jbnd-*.pkl`` + ``*-JNPs-*.pkl`` task sets). Loading a pickle
  runs code, so these are only read when the caller passes ``allow_pickle=True``.
* **Safe format** (a directory, written by :func:`convert` / ``offcut replay convert``):

  ``nodes.csv``
      columns ``index,node``: every node of the log, in log column order.
  ``events.csv.gz``
      columns ``row,time,idle,busy``: ``row`` is the original log row index, ``time`` its ISO
      timestamp, ``idle`` / ``busy`` the hostlist-compressed names of the nodes that became idle /
      busy at that row (compared with the previous row). The first CSV row is ``row`` 0 and holds
      the full initial state: every node idle at row 0 in ``idle`` (all others are busy). The
      writer keeps one CSV row per original log row (rows without a change have empty ``idle``
      and ``busy``), so row times and ``skip_rows`` semantics are exact: the state at row
      ``skip_rows`` is the initial state plus all changes with ``row <= skip_rows``.
  ``tasks.csv``
      columns ``name,submit_time,min_nodes,max_nodes,rescale_up_s,rescale_down_s,
      total_work_samples,node_counts,throughputs,objective_values``; lists are space-separated,
      floats written with ``repr`` so that they round-trip exactly.

Text cells a spreadsheet would run as a formula (a task or node name beginning with ``=``,
``+``, ``-``, ``@``) are written with a leading ``'`` (:func:`offcut.text_safety.csv_cell`)
and read back without it (:func:`~offcut.text_safety.csv_uncell`). Every hostlist of
``events.csv.gz`` is counted before it is expanded (:class:`offcut.slurm_values.NodeBudget`,
the size guard shared with ``offcut replay slurm``): one names at most the log's nodes, one
pass over the file at most :data:`offcut.slurm_values.MAX_INPUT_NODES` in all.

Every problem with an input is reported as :class:`ReplayInputError` with one line naming the
file and what is wrong.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import pickle
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hostlist
import numpy as np
import pandas as pd

from offcut.errors import InvalidArgument
from offcut.slurm_values import NodeBudget, NodeListError
from offcut.taskspec import TaskSpec
from offcut.text_safety import csv_uncell, csv_writer

__all__ = [
    "ReplayInputError",
    "TaskRecord",
    "NodeChange",
    "NodeLog",
    "load_node_log",
    "load_task_set",
    "write_node_log",
    "write_task_set",
    "convert",
    "NODES_CSV",
    "EVENTS_CSV",
    "TASKS_CSV",
]

NODES_CSV = "nodes.csv"
EVENTS_CSV = "events.csv.gz"
TASKS_CSV = "tasks.csv"

NODES_COLUMNS = ["index", "node"]
EVENTS_COLUMNS = ["row", "time", "idle", "busy"]
TASKS_COLUMNS = [
    "name", "submit_time", "min_nodes", "max_nodes", "rescale_up_s", "rescale_down_s",
    "total_work_samples", "node_counts", "throughputs", "objective_values",
]
JBND_COLUMNS = ["Tcup", "Tcdw", "Jmin", "Jmax", "Pmax", "Tsub"]
JNPS_COLUMNS = ["Ns", "Ps", "Os"]

_PICKLE_HINT = ("it is a Python pickle (loading runs code); pass --allow-pickle "
                "(allow_pickle=True) if you trust it, or convert it once with `offcut replay convert`")
_CHUNK_ROWS = 2048


class ReplayInputError(ValueError):
    """A replay input file is missing, unreadable or malformed.

    The message is one line meant for the user: which file, and what is wrong with it.
    """


# --------------------------------------------------------------------------------------------
# records


@dataclass
class TaskRecord:
    """One elastic training task of a task set.

    ``submit_time`` is a UTC-naive :class:`pandas.Timestamp` (as in the data); ``min_nodes`` /
    ``max_nodes`` bound the allocation; ``rescale_up_s`` / ``rescale_down_s`` are the seconds of
    lost progress (at the current rate) caused by scaling up / down; ``total_work_samples`` is
    the work to finish (throughput x seconds). ``node_counts[i]`` nodes give ``throughputs[i]``
    samples/s and objective value ``objective_values[i]``; the three lists have equal length and
    ``node_counts`` usually starts at 0.
    """

    name: str
    submit_time: pd.Timestamp
    min_nodes: int
    max_nodes: int
    rescale_up_s: float
    rescale_down_s: float
    total_work_samples: float
    node_counts: list[int] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)
    objective_values: list[float] = field(default_factory=list)


@dataclass
class NodeChange:
    """Nodes that changed state at ``time`` (a UTC-naive Timestamp).

    ``became_idle`` / ``became_busy`` list node names in log column order; at least one of them
    is non-empty. ``row`` is the original log row index when known.
    """

    time: pd.Timestamp
    became_idle: list[str]
    became_busy: list[str]
    row: int | None = None


@dataclass
class NodeLog:
    """A node-state log restricted to a contiguous slice of nodes.

    ``node_names``: the selected nodes in log column order. ``initial_time`` / ``initial_idle``:
    the time of log row ``skip_rows`` and the selected nodes idle at that row (column order).
    :meth:`events` streams the later changes; ``num_events`` is their count when known cheaply,
    else ``None``.
    """

    node_names: list[str]
    initial_time: pd.Timestamp
    initial_idle: list[str]
    num_events: int | None = None
    source: str = ""
    _events_factory: Callable[[], Iterator[NodeChange]] | None = field(
        default=None, repr=False, compare=False)

    def events(self) -> Iterator[NodeChange]:
        """Iterate over :class:`NodeChange` for every later log row whose selected nodes differ
        from the previous row (rows without a change are skipped, as the reference replayer's
        de-duplication did). Streams: each call re-reads the source lazily.

        Raises :class:`ReplayInputError` if the source turns out malformed while streaming.
        """
        if self._events_factory is None:
            return iter(())
        return self._events_factory()


# --------------------------------------------------------------------------------------------
# helpers


def _require_file(path: Path, what: str) -> None:
    if not path.exists():
        raise ReplayInputError(f"{path}: {what} not found")
    if not path.is_file():
        raise ReplayInputError(f"{path}: {what} is not a regular file")


def _check_pickle_allowed(path: Path, allow_pickle: bool) -> None:
    if not allow_pickle:
        raise ReplayInputError(f"{path}: refusing to load: {_PICKLE_HINT}")


def _unpickle(stream, path: Path):
    try:
        return pickle.load(stream)
    except (EOFError, pickle.UnpicklingError, tarfile.TarError, zlib.error, OSError,
            ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError,
            MemoryError) as exc:
        raise ReplayInputError(
            f"{path}: cannot unpickle (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None


def _read_pickled_frame(path: Path, allow_pickle: bool, what: str) -> pd.DataFrame:
    """Load a DataFrame from a ``.pkl`` or from the single ``.pkl`` member of a ``.tar.gz``."""
    _require_file(path, what)
    _check_pickle_allowed(path, allow_pickle)
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        try:
            with tarfile.open(path, "r:*") as tf:
                member = None
                for m in tf:
                    if m.isfile() and m.name.endswith(".pkl"):
                        member = m
                        break
                if member is None:
                    raise ReplayInputError(f"{path}: archive holds no .pkl member")
                stream = tf.extractfile(member)
                obj = _unpickle(stream, path)
        except ReplayInputError:
            raise
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise ReplayInputError(
                f"{path}: cannot read archive (truncated or corrupt?): {type(exc).__name__}: {exc}"
            ) from None
    else:
        with open(path, "rb") as fh:
            obj = _unpickle(fh, path)
    if not isinstance(obj, pd.DataFrame):
        raise ReplayInputError(f"{path}: expected a pandas DataFrame, got {type(obj).__name__}")
    return obj


def _safe_dir(path: Path) -> Path | None:
    """Return the safe-format directory that ``path`` designates, or None."""
    if path.is_dir():
        return path
    if path.name in (NODES_CSV, EVENTS_CSV, TASKS_CSV):
        return path.parent
    return None


def _open_csv(path: Path, columns: list[str], what: str):
    """Open a (possibly gzip) CSV; check its header has ``columns``. Returns (fh, reader, idx)."""
    _require_file(path, what)
    try:
        if path.name.endswith(".gz"):
            fh = io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
        else:
            fh = open(path, encoding="utf-8", newline="")
        reader = csv.reader(fh)
        header = next(reader, None)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as exc:
        raise ReplayInputError(f"{path}: cannot read {what}: {type(exc).__name__}: {exc}") from None
    if header is None:
        fh.close()
        raise ReplayInputError(f"{path}: {what} is empty (no header)")
    missing = [c for c in columns if c not in header]
    if missing:
        fh.close()
        raise ReplayInputError(f"{path}: {what} lacks column(s) {', '.join(missing)} "
                               f"(found: {', '.join(header)})")
    return fh, reader, {c: header.index(c) for c in columns}


def _csv_rows(fh, reader, path: Path, what: str) -> Iterator[list[str]]:
    try:
        yield from reader
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, csv.Error) as exc:
        raise ReplayInputError(
            f"{path}: cannot read {what} (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None
    finally:
        fh.close()


def _select_slice(n_cols: int, first_node: int, num_nodes: int | None, path: Path) -> tuple[int, int]:
    if not isinstance(first_node, (int, np.integer)) or isinstance(first_node, bool):
        raise ReplayInputError(f"{path}: first_node must be an integer, got {first_node!r}")
    if not 0 <= first_node < n_cols:
        raise ReplayInputError(
            f"{path}: first_node={first_node} is out of range: the log has {n_cols} nodes "
            f"(valid 0..{n_cols - 1})")
    if num_nodes is None:
        num_nodes = n_cols - first_node
    if not isinstance(num_nodes, (int, np.integer)) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ReplayInputError(f"{path}: num_nodes must be a positive integer, got {num_nodes!r}")
    if first_node + num_nodes > n_cols:
        raise ReplayInputError(
            f"{path}: first_node={first_node} + num_nodes={num_nodes} exceeds the log's "
            f"{n_cols} nodes")
    return int(first_node), int(first_node + num_nodes)


def _check_skip(skip_rows: int, n_rows: int, path: Path) -> int:
    if not isinstance(skip_rows, (int, np.integer)) or isinstance(skip_rows, bool) or skip_rows < 0:
        raise ReplayInputError(f"{path}: skip_rows must be a non-negative integer, got {skip_rows!r}")
    if skip_rows >= n_rows:
        raise ReplayInputError(
            f"{path}: skip_rows={skip_rows} leaves nothing: the log has {n_rows} rows")
    return int(skip_rows)


# --------------------------------------------------------------------------------------------
# node log: pickle


def _validate_node_frame(df: pd.DataFrame, path: Path) -> np.ndarray:
    """Check shape/index/dtypes of a node-state DataFrame; return its values without copying
    where pandas allows (a single int8 block gives a view)."""
    if df.shape[0] < 1 or df.shape[1] < 1:
        raise ReplayInputError(f"{path}: node-state table is empty (shape {df.shape})")
    if not isinstance(df.index, pd.DatetimeIndex):
        raise ReplayInputError(
            f"{path}: node-state index must be a DatetimeIndex, got {type(df.index).__name__}")
    if df.index.tz is not None:
        raise ReplayInputError(f"{path}: node-state index must be time-zone naive (UTC)")
    if df.index.hasnans or not df.index.is_monotonic_increasing:
        raise ReplayInputError(f"{path}: node-state index must be increasing times without NaT")
    if not df.columns.is_unique:
        raise ReplayInputError(f"{path}: node-state column names are not unique")
    bad = [str(c) for c, dt in df.dtypes.items()
           if not (pd.api.types.is_integer_dtype(dt) or pd.api.types.is_bool_dtype(dt))]
    if bad:
        raise ReplayInputError(
            f"{path}: node-state columns must be integer 0/1 (int8), e.g. column {bad[0]!r} is "
            f"{df.dtypes[bad[0]]}")
    vals = df.values  # one int8 block -> a view of the block, no copy
    if vals.dtype == np.bool_:
        vals = vals.view(np.int8)
    return vals


def _check_01(block: np.ndarray, path: Path, row0: int) -> None:
    if block.size and (block.min() < 0 or block.max() > 1):
        bad = np.argwhere((block != 0) & (block != 1))[0]
        raise ReplayInputError(
            f"{path}: node-state values must be 0 (busy) or 1 (idle); row {row0 + bad[0]} "
            f"has {block[bad[0], bad[1]]}")


def _iter_frame_changes(vals: np.ndarray, times: pd.DatetimeIndex, names: list[str], lo: int,
                        hi: int, start_row: int, path: Path,
                        include_unchanged: bool = False) -> Iterator[NodeChange]:
    """Diff rows ``start_row+1 ..`` of ``vals[:, lo:hi]`` against their predecessor, in chunks
    of rows (one small int8 copy per chunk)."""
    n_rows = vals.shape[0]
    sel = vals[:, lo:hi]
    prev = np.array(sel[start_row], dtype=np.int8)
    row = start_row + 1
    while row < n_rows:
        end = min(row + _CHUNK_ROWS, n_rows)
        chunk = np.ascontiguousarray(sel[row:end], dtype=np.int8)
        _check_01(chunk, path, row)
        full = np.empty((end - row + 1, hi - lo), dtype=np.int8)
        full[0] = prev
        full[1:] = chunk
        diff = np.diff(full, axis=0)
        changed = np.flatnonzero(diff.any(axis=1))
        if include_unchanged:
            rows_iter = range(end - row)
        else:
            rows_iter = changed
        for k in rows_iter:
            d = diff[k]
            idle = [names[j] for j in np.flatnonzero(d == 1)]
            busy = [names[j] for j in np.flatnonzero(d == -1)]
            yield NodeChange(times[row + k], idle, busy, int(row + k))
        prev = chunk[-1].copy()
        del chunk, full, diff
        row = end


def _load_node_log_pickle(path: Path, first_node: int, num_nodes: int | None, skip_rows: int,
                          allow_pickle: bool) -> NodeLog:
    df = _read_pickled_frame(path, allow_pickle, "node-state log")
    vals = _validate_node_frame(df, path)
    n_rows, n_cols = vals.shape
    lo, hi = _select_slice(n_cols, first_node, num_nodes, path)
    skip = _check_skip(skip_rows, n_rows, path)
    names = [str(c) for c in df.columns[lo:hi]]
    times = df.index
    first = np.asarray(vals[skip, lo:hi])
    _check_01(first[None, :], path, skip)
    initial_idle = [names[j] for j in np.flatnonzero(first == 1)]

    def factory() -> Iterator[NodeChange]:
        return _iter_frame_changes(vals, times, names, lo, hi, skip, path)

    return NodeLog(node_names=names, initial_time=times[skip], initial_idle=initial_idle,
                   num_events=None, source=str(path), _events_factory=factory)


# --------------------------------------------------------------------------------------------
# node log: safe format


def _read_nodes_csv(path: Path) -> list[str]:
    fh, reader, idx = _open_csv(path, NODES_COLUMNS, "node list")
    pairs = []
    for ln, rec in enumerate(_csv_rows(fh, reader, path, "node list"), start=2):
        try:
            pairs.append((int(rec[idx["index"]]), csv_uncell(rec[idx["node"]].strip())))
        except (ValueError, IndexError):
            raise ReplayInputError(f"{path}: line {ln}: expected 'index,node', got {rec!r}") from None
    pairs.sort()
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise ReplayInputError(f"{path}: column 'index' must be 0..N-1 without gaps")
    names = [n for _, n in pairs]
    if not names:
        raise ReplayInputError(f"{path}: node list is empty")
    if any(not n for n in names):
        raise ReplayInputError(f"{path}: empty node name")
    if len(set(names)) != len(names):
        raise ReplayInputError(f"{path}: node names are not unique")
    return names


def _expand(text: str, path: Path, ln: int, col: str, budget: NodeBudget,
            max_nodes: int) -> list[str]:
    """The names of the hostlist ``text`` (column ``col`` of line ``ln``), [] when blank: the
    shared size guard (:class:`offcut.slurm_values.NodeBudget`) counts them first, so a
    hostlist naming more than ``max_nodes`` (the log's nodes: no row can name more) or a
    file passing the budget is refused before anything is expanded."""
    text = text.strip()
    if not text:
        return []
    try:
        return budget.expand(text, max_nodes)
    except NodeListError as exc:
        raise ReplayInputError(f"{path}: line {ln}: bad hostlist in column {col!r}: {exc}") from None


def _iter_events_csv(path: Path) -> Iterator[tuple[int, int, str, pd.Timestamp | None, str, str]]:
    """Yield (line_no, row, time_text, idle_text, busy_text) from events.csv.gz, checking rows
    increase."""
    fh, reader, idx = _open_csv(path, EVENTS_COLUMNS, "event log")
    i_row, i_time, i_idle, i_busy = idx["row"], idx["time"], idx["idle"], idx["busy"]
    last = -1
    for ln, rec in enumerate(_csv_rows(fh, reader, path, "event log"), start=2):
        try:
            row = int(rec[i_row])
            t, idle, busy = rec[i_time], csv_uncell(rec[i_idle]), csv_uncell(rec[i_busy])
        except (ValueError, IndexError):
            raise ReplayInputError(f"{path}: line {ln}: malformed record {rec[:4]!r}") from None
        if row <= last:
            raise ReplayInputError(f"{path}: line {ln}: column 'row' must increase ({row} after {last})")
        if last == -1 and row != 0:
            raise ReplayInputError(f"{path}: line {ln}: first record must be row 0 (the initial state)")
        last = row
        yield ln, row, t, idle, busy


def _utc_naive(value, where: str) -> pd.Timestamp:
    """``value`` as a UTC-naive Timestamp; ReplayInputError naming ``where`` if it is not one."""
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError):
        raise ReplayInputError(f"{where}: bad time {value!r}") from None
    if ts is pd.NaT:
        raise ReplayInputError(f"{where}: time is missing")
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts


def _parse_time(text: str, path: Path, ln: int) -> pd.Timestamp:
    return _utc_naive(text, f"{path}: line {ln}")


@dataclass(frozen=True)
class _SafeSelection:
    """The node columns a safe-format log is read for: ``all_names`` (``nodes.csv``, log
    column order), ``col_of`` name -> column, the selected columns ``lo`` .. ``hi`` - 1, and
    ``events_path`` (``events.csv.gz``) for error messages."""

    events_path: Path
    all_names: list[str]
    col_of: dict[str, int]
    lo: int
    hi: int

    def member(self, n: str, ln: int) -> int | None:
        """Column of node ``n`` (line ``ln``) if selected, None if not; ReplayInputError for a
        node not in ``nodes.csv``."""
        c = self.col_of.get(n)
        if c is None:
            raise ReplayInputError(f"{self.events_path}: line {ln}: unknown node {n!r} "
                                   f"(not in {NODES_CSV})")
        return c if self.lo <= c < self.hi else None

    def expand(self, text: str, ln: int, col: str, budget: NodeBudget) -> list[str]:
        """The names of the hostlist ``text`` in column ``col`` of line ``ln``, counted first
        against ``budget`` (one per pass over the file) and the log's node count."""
        return _expand(text, self.events_path, ln, col, budget, len(self.all_names))

    def columns(self, text: str, ln: int, col: str, budget: NodeBudget) -> list[int]:
        """Selected columns of the hostlist ``text`` in column ``col`` of line ``ln``."""
        return [c for n in self.expand(text, ln, col, budget)
                if (c := self.member(n, ln)) is not None]


def _apply_initial_record(sel: _SafeSelection, ln: int, row: int, idle_txt: str, busy_txt: str,
                          idle_cols: set[int], budget: NodeBudget) -> None:
    """Apply record ``row`` (line ``ln``) of the initial state's pass to ``idle_cols``: row 0
    lists the idle nodes (all others are busy), later rows the changes."""
    events_path = sel.events_path
    became_idle = sel.expand(idle_txt, ln, "idle", budget)
    became_busy = sel.expand(busy_txt, ln, "busy", budget)
    if row == 0 and became_busy:
        unknown = [n for n in became_busy if n not in sel.col_of]
        if unknown:
            raise ReplayInputError(f"{events_path}: line {ln}: unknown node {unknown[0]!r}")
        became_busy = []  # the initial record lists idle nodes; all others are busy anyway
    for n in became_idle:
        c = sel.member(n, ln)
        if c is not None:
            if row > 0 and c in idle_cols:
                raise ReplayInputError(
                    f"{events_path}: line {ln}: node {n} became idle but was already idle")
            idle_cols.add(c)
    for n in became_busy:
        c = sel.member(n, ln)
        if c is not None:
            if c not in idle_cols:
                raise ReplayInputError(
                    f"{events_path}: line {ln}: node {n} became busy but was already busy")
            idle_cols.discard(c)


def _safe_initial_state(sel: _SafeSelection, skip_rows: int) -> tuple[pd.Timestamp, set[int]]:
    """(time of log row ``skip_rows``, the selected columns idle then): the records up to that
    row applied in order. ReplayInputError for an empty log or one ending before the row."""
    events_path = sel.events_path
    idle_cols: set[int] = set()
    initial_time = None
    initial_row = None
    lines = _iter_events_csv(events_path)
    budget = NodeBudget()
    for ln, row, t, idle_txt, busy_txt in lines:
        if row > skip_rows:
            break
        _apply_initial_record(sel, ln, row, idle_txt, busy_txt, idle_cols, budget)
        initial_time = _parse_time(t, events_path, ln)
        initial_row = row
    else:
        if initial_time is None:
            raise ReplayInputError(f"{events_path}: event log has no records")
        if initial_row is not None and initial_row < skip_rows:
            raise ReplayInputError(
                f"{events_path}: skip_rows={skip_rows} leaves nothing: the last log row is "
                f"{initial_row}")
    lines.close()
    if initial_time is None:
        raise ReplayInputError(f"{events_path}: event log has no records")
    return initial_time, idle_cols


def _iter_safe_changes(sel: _SafeSelection, skip_rows: int,
                       start_idle: frozenset[int]) -> Iterator[NodeChange]:
    """The changes of the selected nodes after row ``skip_rows`` (``start_idle``: the columns
    idle at that row), re-reading ``events.csv.gz``; records without a selected change are
    skipped. ReplayInputError for a node that becomes idle (busy) while it is idle (busy)."""
    events_path, all_names = sel.events_path, sel.all_names
    state = set(start_idle)
    budget = NodeBudget()
    for ln, row, t, idle_txt, busy_txt in _iter_events_csv(events_path):
        if row <= skip_rows:
            continue
        if not idle_txt and not busy_txt:
            continue
        up = sel.columns(idle_txt, ln, "idle", budget)
        down = sel.columns(busy_txt, ln, "busy", budget)
        if not up and not down:
            continue
        for c in up:
            if c in state:
                raise ReplayInputError(f"{events_path}: line {ln}: node {all_names[c]} "
                                       "became idle but was already idle")
            state.add(c)
        for c in down:
            if c not in state:
                raise ReplayInputError(f"{events_path}: line {ln}: node {all_names[c]} "
                                       "became busy but was already busy")
            state.discard(c)
        yield NodeChange(_parse_time(t, events_path, ln), [all_names[c] for c in sorted(up)],
                         [all_names[c] for c in sorted(down)], row)


def _load_node_log_safe(directory: Path, first_node: int, num_nodes: int | None,
                        skip_rows: int) -> NodeLog:
    """The safe-format log in ``directory`` (``nodes.csv`` + ``events.csv.gz``), nodes
    ``first_node`` .. ``first_node + num_nodes - 1`` from row ``skip_rows`` on (see
    :func:`load_node_log`): the state at that row is read now, the later changes lazily."""
    nodes_path = directory / NODES_CSV
    events_path = directory / EVENTS_CSV
    _require_file(nodes_path, "node list")
    _require_file(events_path, "event log")
    all_names = _read_nodes_csv(nodes_path)
    lo, hi = _select_slice(len(all_names), first_node, num_nodes, nodes_path)
    if not isinstance(skip_rows, (int, np.integer)) or isinstance(skip_rows, bool) or skip_rows < 0:
        raise ReplayInputError(f"{events_path}: skip_rows must be a non-negative integer, "
                               f"got {skip_rows!r}")
    sel = _SafeSelection(events_path, all_names, {n: i for i, n in enumerate(all_names)}, lo, hi)
    initial_time, idle_cols = _safe_initial_state(sel, skip_rows)
    initial_idle = [all_names[c] for c in sorted(idle_cols)]
    start_idle = frozenset(idle_cols)

    def factory() -> Iterator[NodeChange]:
        return _iter_safe_changes(sel, skip_rows, start_idle)

    return NodeLog(node_names=all_names[lo:hi], initial_time=initial_time,
                   initial_idle=initial_idle, num_events=None, source=str(directory),
                   _events_factory=factory)


def load_node_log(path: str | Path, *, first_node: int = 0, num_nodes: int | None = None,
                  skip_rows: int = 1000, allow_pickle: bool = False) -> NodeLog:
    """Load a node-state log and select nodes ``first_node .. first_node+num_nodes-1`` (log
    column order; ``num_nodes=None`` = all remaining) from log row ``skip_rows`` on.

    ``path``: the original ``.tar.gz`` (its ``.pkl`` member is unpickled straight from the
    archive, nothing is extracted to disk) or ``.pkl`` — both need ``allow_pickle=True`` — or a
    safe-format directory (or its ``nodes.csv`` / ``events.csv.gz``). Only the one DataFrame is
    kept in memory for pickles; events are diffed lazily in chunks of rows.

    Raises :class:`ReplayInputError` for a missing/corrupt/truncated file, a pickle without
    ``allow_pickle``, a wrong shape, index or dtype, or an out-of-range slice / ``skip_rows``.
    """
    path = Path(path)
    if not path.exists():
        raise ReplayInputError(f"{path}: node-state log not found")
    d = _safe_dir(path)
    if d is not None:
        return _load_node_log_safe(d, first_node, num_nodes, skip_rows)
    return _load_node_log_pickle(path, first_node, num_nodes, skip_rows, allow_pickle)


# --------------------------------------------------------------------------------------------
# task sets


def _as_list(value, path: Path, name: str, col: str) -> list:
    if isinstance(value, (list, tuple, np.ndarray, pd.Series)):
        return list(value)
    raise ReplayInputError(f"{path}: task {name!r}: column {col!r} must be a list, "
                           f"got {type(value).__name__}")


def _int_of(v, path: Path, name: str, col: str) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ReplayInputError(f"{path}: task {name!r}: {col} must be a number, got {v!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise ReplayInputError(f"{path}: task {name!r}: {col} must be an integer, got {v!r}")
    return int(f)


def _float_of(v, path: Path, name: str, col: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ReplayInputError(f"{path}: task {name!r}: {col} must be a number, got {v!r}") from None
    if math.isnan(f):
        raise ReplayInputError(f"{path}: task {name!r}: {col} is NaN")
    return f


def _check_task(t: TaskRecord, path: Path) -> TaskRecord:
    """``t`` if it is a task the daemon accepts (the one validator, :class:`offcut.taskspec.
    TaskSpec`, without size limits) with a submit time; else ReplayInputError naming the file,
    the task and the field."""
    if t.submit_time is pd.NaT:
        raise ReplayInputError(f"{path}: task {t.name!r}: submit_time is missing")
    try:
        TaskSpec.create(name=t.name, min_nodes=t.min_nodes, max_nodes=t.max_nodes,
                        node_counts=list(t.node_counts), throughputs=list(t.throughputs),
                        objective_values=list(t.objective_values),
                        rescale_up_s=t.rescale_up_s, rescale_down_s=t.rescale_down_s,
                        total_work_samples=t.total_work_samples)
    except InvalidArgument as exc:
        raise ReplayInputError(f"{path}: task {t.name!r}: {exc}") from None
    return t


def _naive(ts, path: Path, name: str) -> pd.Timestamp:
    return _utc_naive(ts, f"{path}: task {name!r}: submit time")


def _load_tasks_pickles(jbnd: Path, jnps: Path, allow_pickle: bool) -> list[TaskRecord]:
    bnd = _read_pickled_frame(jbnd, allow_pickle, "task bounds (Jbnd)")
    nps = _read_pickled_frame(jnps, allow_pickle, "task scalability (JNPs)")
    for df, p, cols in ((bnd, jbnd, JBND_COLUMNS), (nps, jnps, JNPS_COLUMNS)):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise ReplayInputError(f"{p}: lacks column(s) {', '.join(missing)} "
                                   f"(found: {', '.join(map(str, df.columns))})")
        if not df.index.is_unique:
            raise ReplayInputError(f"{p}: job names (index) are not unique")
    if set(bnd.index) != set(nps.index):
        only = sorted(set(map(str, bnd.index)) ^ set(map(str, nps.index)))
        raise ReplayInputError(f"{jnps}: job names differ from {jbnd.name}, e.g. {only[0]!r}")
    out = []
    for name, b in bnd.iterrows():
        s = nps.loc[name]
        nm = str(name)
        out.append(_check_task(TaskRecord(
            name=nm,
            submit_time=_naive(b["Tsub"], jbnd, nm),
            min_nodes=_int_of(b["Jmin"], jbnd, nm, "Jmin"),
            max_nodes=_int_of(b["Jmax"], jbnd, nm, "Jmax"),
            rescale_up_s=_float_of(b["Tcup"], jbnd, nm, "Tcup"),
            rescale_down_s=_float_of(b["Tcdw"], jbnd, nm, "Tcdw"),
            total_work_samples=_float_of(b["Pmax"], jbnd, nm, "Pmax"),
            node_counts=[_int_of(v, jnps, nm, "Ns") for v in _as_list(s["Ns"], jnps, nm, "Ns")],
            throughputs=[_float_of(v, jnps, nm, "Ps") for v in _as_list(s["Ps"], jnps, nm, "Ps")],
            objective_values=[_float_of(v, jnps, nm, "Os")
                              for v in _as_list(s["Os"], jnps, nm, "Os")],
        ), jnps))
    return out


def _load_tasks_csv(path: Path) -> list[TaskRecord]:
    fh, reader, idx = _open_csv(path, TASKS_COLUMNS, "task set")
    out = []
    names = set()
    for ln, rec in enumerate(_csv_rows(fh, reader, path, "task set"), start=2):
        if not rec:
            continue
        if len(rec) < len(idx):
            raise ReplayInputError(f"{path}: line {ln}: expected {len(TASKS_COLUMNS)} fields, "
                                   f"got {len(rec)}")
        g = {c: rec[i] for c, i in idx.items()}
        nm = csv_uncell(g["name"])  # written through csv_cell (write_task_set)
        if not nm:
            raise ReplayInputError(f"{path}: line {ln}: empty task name")
        if nm in names:
            raise ReplayInputError(f"{path}: line {ln}: duplicate task name {nm!r}")
        names.add(nm)
        lists = {}
        for col in ("node_counts", "throughputs", "objective_values"):
            conv = _int_of if col == "node_counts" else _float_of
            lists[col] = [conv(v, path, nm, col) for v in g[col].split()]
        out.append(_check_task(TaskRecord(
            name=nm,
            submit_time=_naive(g["submit_time"], path, nm),
            min_nodes=_int_of(g["min_nodes"], path, nm, "min_nodes"),
            max_nodes=_int_of(g["max_nodes"], path, nm, "max_nodes"),
            rescale_up_s=_float_of(g["rescale_up_s"], path, nm, "rescale_up_s"),
            rescale_down_s=_float_of(g["rescale_down_s"], path, nm, "rescale_down_s"),
            total_work_samples=_float_of(g["total_work_samples"], path, nm, "total_work_samples"),
            **lists,
        ), path))
    return out


def load_task_set(path: str | Path, jnps_path: str | Path | None = None, *,
                  allow_pickle: bool = False) -> list[TaskRecord]:
    """Load a task set, sorted by ``(submit_time, name)``.

    ``path`` is either a safe ``tasks.csv`` (or a directory holding one), or the ``*-Jbnd-*.pkl``
    bounds pickle; in that case ``jnps_path`` is the matching ``*-JNPs-*.pkl`` (default: the
    same name with ``-Jbnd-`` replaced by ``-JNPs-``) and ``allow_pickle=True`` is required.

    Raises :class:`ReplayInputError` for missing files, missing columns, inconsistent lists or
    bounds, or a pickle without ``allow_pickle``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TASKS_CSV
    if path.suffix.lower() == ".csv":
        if jnps_path is not None:
            raise ReplayInputError(f"{path}: a tasks.csv is complete; do not pass a JNPs file too")
        tasks = _load_tasks_csv(path)
    else:
        if not path.exists():
            raise ReplayInputError(f"{path}: no such file (the task set: a tasks.csv, a folder "
                                   "holding one, or a *-Jbnd-*.pkl bounds pickle)")
        if jnps_path is None:
            if "-Jbnd-" not in path.name:
                raise ReplayInputError(
                    f"{path}: cannot infer the JNPs (scalability) file; pass it explicitly")
            jnps_path = path.with_name(path.name.replace("-Jbnd-", "-JNPs-"))
        tasks = _load_tasks_pickles(path, Path(jnps_path), allow_pickle)
    tasks.sort(key=lambda t: (t.submit_time, t.name))
    return tasks


# --------------------------------------------------------------------------------------------
# writers


def _fmt_float(v: float) -> str:
    return repr(float(v))


def write_task_set(tasks: Iterable[TaskRecord], path: str | Path) -> Path:
    """Write ``tasks`` as a safe ``tasks.csv`` (``path`` may be the file or a directory).

    Floats are written with ``repr`` (exact round trip), lists space-separated, times ISO.
    Returns the file written.
    """
    path = Path(path)
    if path.is_dir() or path.suffix == "":
        path.mkdir(parents=True, exist_ok=True)
        path = path / TASKS_CSV
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv_writer(fh, lineterminator="\n")
        w.writerow(TASKS_COLUMNS)
        for t in tasks:
            w.writerow([
                t.name, pd.Timestamp(t.submit_time).isoformat(), int(t.min_nodes),
                int(t.max_nodes), _fmt_float(t.rescale_up_s), _fmt_float(t.rescale_down_s),
                _fmt_float(t.total_work_samples),
                " ".join(str(int(n)) for n in t.node_counts),
                " ".join(_fmt_float(v) for v in t.throughputs),
                " ".join(_fmt_float(v) for v in t.objective_values),
            ])
    return path


def write_node_log(out_dir: str | Path, node_names: list[str], initial_time: pd.Timestamp,
                   initial_idle: Iterable[str], changes: Iterable[NodeChange], *,
                   total: int | None = None, progress: bool = False) -> None:
    """Write ``nodes.csv`` and ``events.csv.gz`` into ``out_dir`` (created if needed).

    ``node_names``: all nodes in log column order; ``initial_idle``: nodes idle at row 0 (time
    ``initial_time``); ``changes``: later rows in order (``row`` numbers taken from each change,
    or counted 1, 2, ... when ``None``; changes with empty lists are written as empty rows so
    that row times are kept). ``total`` sizes the tqdm bar shown when ``progress`` is true.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / NODES_CSV, "w", encoding="utf-8", newline="") as fh:
        w = csv_writer(fh, lineterminator="\n")
        w.writerow(NODES_COLUMNS)
        for i, n in enumerate(node_names):
            w.writerow([i, n])
    it: Iterable[NodeChange] = changes
    if progress:
        from tqdm import tqdm
        it = tqdm(changes, total=total, unit="row", desc="node log", mininterval=0.5)
    # mtime=0: identical inputs give byte-identical files
    with gzip.GzipFile(out / EVENTS_CSV, "wb", compresslevel=9, mtime=0) as gz:
        fh = io.TextIOWrapper(gz, encoding="utf-8", newline="")
        w = csv_writer(fh, lineterminator="\n")
        w.writerow(EVENTS_COLUMNS)
        w.writerow([0, pd.Timestamp(initial_time).isoformat(),
                    hostlist.collect_hostlist(list(initial_idle)), ""])
        last = 0
        for ch in it:
            row = last + 1 if ch.row is None else int(ch.row)
            if row <= last:
                raise ValueError(f"change rows must increase ({row} after {last})")
            last = row
            w.writerow([row, pd.Timestamp(ch.time).isoformat(),
                        hostlist.collect_hostlist(ch.became_idle) if ch.became_idle else "",
                        hostlist.collect_hostlist(ch.became_busy) if ch.became_busy else ""])
        fh.flush()
        fh.detach()


def convert(node_log_path: str | Path | None, jbnd_path: str | Path | None,
            jnps_path: str | Path | None, out_dir: str | Path, *,
            allow_pickle: bool = False) -> None:
    """Convert original BFTrainer inputs to the safe format in ``out_dir``.

    ``node_log_path`` (``.tar.gz``/``.pkl``) becomes ``nodes.csv`` + ``events.csv.gz`` (the
    whole log, all rows and nodes, with a tqdm bar); ``jbnd_path`` + ``jnps_path`` become
    ``tasks.csv`` (``jnps_path`` may be None to infer it). Pass None to skip a part. Pickles
    are only read with ``allow_pickle=True``. Raises :class:`ReplayInputError` on bad inputs.
    """
    out = Path(out_dir)
    if node_log_path is not None:
        p = Path(node_log_path)
        df = _read_pickled_frame(p, allow_pickle, "node-state log")
        vals = _validate_node_frame(df, p)
        names = [str(c) for c in df.columns]
        first = np.asarray(vals[0])
        _check_01(first[None, :], p, 0)
        idle0 = [names[j] for j in np.flatnonzero(first == 1)]
        changes = _iter_frame_changes(vals, df.index, names, 0, len(names), 0, p,
                                      include_unchanged=True)
        write_node_log(out, names, df.index[0], idle0, changes, total=len(df) - 1, progress=True)
        del df, vals
    if jbnd_path is not None:
        tasks = load_task_set(jbnd_path, jnps_path, allow_pickle=allow_pickle)
        out.mkdir(parents=True, exist_ok=True)
        write_task_set(tasks, out / TASKS_CSV)

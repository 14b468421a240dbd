"""A sweep's results (docs/replay-and-policies.md, "Sweeps"): each cell's ``row.json`` (its
settings and figures, the mark that it is finished), the table of every finished cell and its
text.

``OUT/cells/<id>/row.json`` is written last and atomically by the cell's job
(:func:`write_row`); ``OUT/table.csv`` has a row per finished cell of the spec: its id, the
swept settings, :data:`FIGURES`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from offcut.replay.sweep_spec import Cell, CellSettings, SweepSpec, setting_text
from offcut.text_safety import write_csv_frame

__all__ = ["FIGURES", "ROW_FILE", "cell_dir", "figures", "finished", "gather", "table_text",
           "write_row"]

#: the figures of a cell in ``table.csv``, from its replay's summary.json
#: (docs/replay-and-policies.md, "Efficiency against dedicated nodes"): the efficiency against
#: dedicated nodes (its baselines from the tasks' curves) and its parts, the share of idle
#: node-hours held, the all-done time [h from the log's first event; empty when not every
#: task finished], samples, energy [J] (modelled: an estimate), decision times [ms], the
#: nodes replayed and the cell's wall time [s]
FIGURES = ("dedicated_efficiency", "same_counts_efficiency", "scaling_factor", "utilisation",
           "all_done_h", "tasks_completed", "tasks_submitted", "stop_reason", "total_samples",
           "idle_node_hours", "used_node_hours", "energy_j", "samples_per_joule",
           "decision_p50_ms", "decision_p99_ms", "events", "nodes", "wall_s")
#: a finished cell's settings and figures, in its folder
ROW_FILE = "row.json"
#: the line under :func:`table_text`'s table: what the efficiency is measured against
EFFICIENCY_NOTE = ("efficiency: against the same node-hours on dedicated nodes, each task at "
                   "its best count (baselines from the tasks' curves)")


def cell_dir(out: Path, cell_id: str) -> Path:
    """The folder of cell ``cell_id`` in the sweep folder ``out``."""
    return out / "cells" / cell_id


def figures(summary: dict) -> dict[str, Any]:
    """The :data:`FIGURES` of a replay's ``summary`` (:func:`offcut.replay.driver.summarise`'s
    dict); ``all_done_h`` [h] is from ``first_event`` to ``all_done_at``."""
    done_h = None
    if summary.get("all_done_at") and summary.get("first_event"):
        done_h = (pd.Timestamp(summary["all_done_at"])
                  - pd.Timestamp(summary["first_event"])).total_seconds() / 3600
    dm = summary.get("decision_ms") or {}
    row = {k: summary.get(k) for k in FIGURES}
    row.update(all_done_h=done_h, decision_p50_ms=dm.get("p50"), decision_p99_ms=dm.get("p99"),
               nodes=summary.get("num_nodes"))
    return row


def write_row(folder: Path, settings: CellSettings, row: dict[str, Any]) -> None:
    """Write ``folder/row.json`` (``settings`` and the figures ``row``) atomically: a
    temporary file in the folder, ``fsync``, ``os.replace``. Raises ``OSError``."""
    path = folder / ROW_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{ROW_FILE}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"settings": settings.model_dump(mode="json"), "figures": row}, fh,
                      indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def gather(spec: SweepSpec, out: Path) -> tuple[pd.DataFrame, Path, Path | None]:
    """Write ``out/table.csv`` (a row per finished cell of ``spec``: id, swept settings,
    :data:`FIGURES`) and ``out/sweep.png``; returns the table and the two paths (the plot's
    None when nothing is swept or no cell finished). Raises ``OSError``."""
    from offcut.replay.sweep_plots import plot_sweep

    rows = []
    for cell in spec.cells:
        figs = finished(out, cell)
        if figs is not None:
            rows.append({"id": cell.id, **spec.swept(cell), **{k: figs.get(k) for k in FIGURES}})
    table = pd.DataFrame(rows, columns=["id", *spec.axes, *FIGURES])
    path = out / "table.csv"
    write_csv_frame(table, path)
    plots = None
    if rows and spec.axes:
        plots = plot_sweep(table, spec.axes, out / "sweep.png", title=spec.path.name)
    return table, path, plots


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def table_text(table: pd.DataFrame, axes: tuple[str, ...]) -> str:
    """``table`` (:func:`gather`'s) as aligned text: the swept settings (input files by
    name), the efficiency and its parts [%], the idle node-hours used [%], the all-done time
    [h], the tasks done, the decision time's p99 [ms] and the cell's wall time [s]; then
    :data:`EFFICIENCY_NOTE`."""
    cols = {"dedicated_efficiency": "efficiency", "same_counts_efficiency": "= overhead",
            "scaling_factor": "x scaling", "utilisation": "idle used",
            "all_done_h": "all done [h]", "tasks_completed": "done",
            "decision_p99_ms": "p99 [ms]", "wall_s": "wall [s]"}
    shown = table[[*axes, *cols]].copy()
    for a in axes:
        shown[a] = shown[a].map(lambda v, a=a: setting_text(a, v))
    for c in ("dedicated_efficiency", "same_counts_efficiency", "scaling_factor", "utilisation"):
        shown[c] = shown[c].map(lambda v: "" if _missing(v) else f"{100 * v:.1f} %")
    shown["all_done_h"] = shown["all_done_h"].map(lambda v: "not all" if _missing(v)
                                                  else f"{v:.1f}")
    for c, fmt in (("wall_s", "{:.1f}"), ("decision_p99_ms", "{:.2f}")):
        shown[c] = shown[c].map(lambda v, fmt=fmt: "" if _missing(v) else fmt.format(v))
    return shown.rename(columns=cols).to_string(index=False) + "\n" + EFFICIENCY_NOTE

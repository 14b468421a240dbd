"""A one-page PNG summary of a replay run (``steps.csv`` + ``placements.csv`` -> ``report.png``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .bftrainer_data import ReplayInputError

__all__ = ["render_report", "STEPS_COLUMNS", "PLACEMENTS_COLUMNS"]

STEPS_COLUMNS = ["evtTime", "Thr", "Rate", "ReScost", "evt", "Nleft", "Npre", "Njoin", "nJob",
                 "nNd", "nJrun", "nNrun", "PreCost", "solve_ms"]
PLACEMENTS_COLUMNS = ["time", "task_id", "task_name", "change", "nodes", "work_done_samples",
                      "total_work_samples"]
_MAX_LEGEND = 12


def _read(path: Path, columns: list[str], what: str) -> pd.DataFrame:
    if not path.is_file():
        raise ReplayInputError(f"{path}: {what} not found")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise ReplayInputError(f"{path}: cannot read {what}: {type(exc).__name__}: {exc}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ReplayInputError(f"{path}: {what} lacks column(s) {', '.join(missing)}")
    return df


def _times(series: pd.Series, path: Path, col: str) -> tuple[pd.Series, bool]:
    """Parse a time column: ISO datetimes, or numbers = seconds since the run start (then the
    result is in hours and the flag is False)."""
    if pd.api.types.is_numeric_dtype(series):
        if series.isna().any():
            raise ReplayInputError(f"{path}: column {col!r} has empty values")
        return series.astype(float) / 3600.0, False
    try:
        t = pd.to_datetime(series, format="ISO8601")
    except (ValueError, TypeError) as exc:
        raise ReplayInputError(f"{path}: column {col!r}: bad time: {exc}") from None
    if t.isna().any():
        raise ReplayInputError(f"{path}: column {col!r} has empty values")
    if getattr(t.dt, "tz", None) is not None:
        t = t.dt.tz_convert("UTC").dt.tz_localize(None)
    return t, True


def _numeric(df: pd.DataFrame, cols: list[str], path: Path) -> None:
    for c in cols:
        try:
            df[c] = pd.to_numeric(df[c])
        except (ValueError, TypeError):
            raise ReplayInputError(f"{path}: column {c!r} must be numeric") from None


def render_report(out_dir: str | Path) -> Path:
    """Render ``out_dir/report.png`` from a replay's ``steps.csv`` and ``placements.csv``.

    ``steps.csv``: one row per replay step, columns :data:`STEPS_COLUMNS` (``evtTime`` ISO time
    or seconds since start; ``nNd`` idle nodes, ``nNrun`` nodes used by tasks).
    ``placements.csv``: columns :data:`PLACEMENTS_COLUMNS`, one row whenever a task's placement
    changes or it completes; progress is linear between rows.
    Top panel: idle nodes vs nodes in use (step plots); bottom panel: each task's progress in %
    (legend when at most 12 tasks). Returns the PNG path.
    Raises :class:`ReplayInputError` when a file is missing or malformed.
    """
    # Figure + the Agg canvas directly: no pyplot, no global backend switch, no display needed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    import matplotlib.dates as mdates

    out = Path(out_dir)
    steps_path, plc_path = out / "steps.csv", out / "placements.csv"
    steps = _read(steps_path, STEPS_COLUMNS, "replay steps")
    plc = _read(plc_path, PLACEMENTS_COLUMNS, "task placements")
    if steps.empty:
        raise ReplayInputError(f"{steps_path}: replay steps table has no rows")
    _numeric(steps, ["nNd", "nNrun"], steps_path)
    _numeric(plc, ["work_done_samples", "total_work_samples"], plc_path)
    st, st_dt = _times(steps["evtTime"], steps_path, "evtTime")
    steps = steps.assign(_t=st).sort_values("_t", kind="stable")
    if not plc.empty:
        pt, pt_dt = _times(plc["time"], plc_path, "time")
        if pt_dt != st_dt:
            raise ReplayInputError(f"{plc_path}: column 'time' must use the same kind of time "
                                   "(datetime or seconds) as steps.csv evtTime")
        if (plc["total_work_samples"] <= 0).any():
            raise ReplayInputError(f"{plc_path}: total_work_samples must be > 0")
        plc = plc.assign(_t=pt, _pct=100.0 * plc["work_done_samples"] / plc["total_work_samples"])
        plc = plc.sort_values("_t", kind="stable")

    fig = Figure(figsize=(11, 7.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1.2]})
    ax1.step(steps["_t"], steps["nNd"], where="post", label="idle nodes (nNd)", color="tab:gray")
    ax1.step(steps["_t"], steps["nNrun"], where="post", label="nodes in use by tasks (nNrun)",
             color="tab:blue")
    ax1.fill_between(steps["_t"], steps["nNrun"], step="post", alpha=0.25, color="tab:blue")
    ax1.set_ylabel("nodes")
    ax1.set_ylim(bottom=0)
    ax1.legend(loc="upper right", fontsize="small")
    ax1.grid(alpha=0.3)
    ax1.set_title("Idle nodes and nodes used by elastic tasks")

    if plc.empty:
        ax2.text(0.5, 0.5, "no task placements", ha="center", va="center",
                 transform=ax2.transAxes)
    else:
        key = "task_id" if plc["task_id"].notna().all() else "task_name"
        groups = list(plc.groupby(key, sort=False))
        for _, g in groups:
            label = str(g["task_name"].iloc[0]) if pd.notna(g["task_name"].iloc[0]) else str(g[key].iloc[0])
            ax2.plot(g["_t"], g["_pct"], marker=".", markersize=3, linewidth=1.2, label=label)
        if len(groups) <= _MAX_LEGEND:
            ax2.legend(loc="upper left", fontsize="small", ncol=2 if len(groups) > 6 else 1)
        else:
            ax2.text(0.01, 0.97, f"{len(groups)} tasks", transform=ax2.transAxes, va="top")
    ax2.set_ylabel("task progress (% of total work)")
    ax2.set_ylim(0, 105)
    ax2.grid(alpha=0.3)
    ax2.set_title("Task progress")
    if st_dt:
        loc = mdates.AutoDateLocator()
        ax2.xaxis.set_major_locator(loc)
        ax2.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))
        ax2.set_xlabel("time (UTC)")
    else:
        ax2.set_xlabel("time since replay start (h)")
    n_tasks = plc[["task_id", "task_name"]].drop_duplicates().shape[0] if not plc.empty else 0
    fig.suptitle(f"Replay report: {out.resolve().name} ({len(steps)} steps, {n_tasks} tasks)")
    png = out / "report.png"
    fig.savefig(png)
    return png

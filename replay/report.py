"""Reports of a replay or of an exported live history (``steps.csv`` + ``placements.csv``).

:func:`build_report` writes into the same folder:

* ``report.png``: idle nodes vs nodes used by tasks; each task's progress;
* ``throughput.png``: aggregate rate (``Rate``, samples/s) and the samples lost to rescales
  (``ReScost``) and preemptions (``PreCost``), per event and cumulated;
* ``decisions.png``: distribution of the allocation time per node event (``solve_ms``) and the
  same over time;
* ``timeline.png``: one lane per task (the :data:`TIMELINE_TASKS` with the most node-hours),
  the nodes it held over time, its preemptions marked (what a researcher opens first);
* ``summary.txt``: a short text summary (period, events, node-hours, utilisation, samples,
  tasks, rescales and preemptions, decision time), also returned.

Only ``steps.csv`` and ``placements.csv`` are needed; a ``summary.json`` beside them (replays
write one) adds the replay's own facts (stop reason, solver, the daemon's sample count).
:func:`render_report` is the older entry point: it does the same and returns ``report.png``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .bftrainer_data import ReplayInputError
from .history import PLACEMENT_COLUMNS, STEP_COLUMNS
from offcut.text_safety import csv_uncell

__all__ = ["Report", "build_report", "render_report", "summarise_history", "format_summary",
           "task_timelines", "Lane", "STEPS_COLUMNS", "PLACEMENTS_COLUMNS"]

#: required columns (the writer's, ``offcut.replay.history``)
STEPS_COLUMNS = STEP_COLUMNS
PLACEMENTS_COLUMNS = PLACEMENT_COLUMNS
#: steps.csv columns that must hold numbers (``evt``, ``nJob``, ``nJrun`` are only carried)
STEPS_NUMERIC = ["Thr", "Rate", "ReScost", "Nleft", "Npre", "Njoin", "nNd", "nNrun", "PreCost",
                 "solve_ms"]
PLACEMENTS_NUMERIC = ["nodes", "work_done_samples", "total_work_samples"]
#: placements.csv ``change`` values that count as a rescale (the daemon's ``Task.rescales``)
RESCALE_CHANGES = ("start", "grow", "shrink", "stop")
REPORT_FILES = ("report.png", "throughput.png", "decisions.png", "timeline.png", "summary.txt")
_MAX_LEGEND = 12
#: most lanes of timeline.png (the tasks with the most node-hours; the rest are counted)
TIMELINE_TASKS = 40


@dataclass
class Lane:
    """One task's lane of ``timeline.png``: ``times`` [s, the file's time base] and the nodes
    held from each (a step function; the last value holds to the end), the times of its
    preemptions (``change`` = ``preempted``), and node-hours held up to ``end`` [h]."""

    key: str
    label: str
    times: list[float]
    nodes: list[int]
    preempted: list[float]
    node_hours: float


@dataclass
class Report:
    """What :func:`build_report` wrote.

    Attributes:
        out_dir: the folder.
        files: ``report.png``, ``throughput.png``, ``decisions.png``, ``timeline.png``,
            ``summary.txt`` paths.
        text: the content of ``summary.txt`` (several lines, newline-terminated).
        figures: the summary's numbers (see :func:`summarise_history`), plus ``"replay"``:
            facts taken from ``summary.json`` (empty dict without one).
    """

    out_dir: Path
    files: list[Path]
    text: str
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def summary_path(self) -> Path:
        """``summary.txt``."""
        return self.out_dir / "summary.txt"


# ------------------------------------------------------------------ reading and checking
def _read(path: Path, columns: list[str], what: str) -> pd.DataFrame:
    if not path.is_file():
        raise ReplayInputError(f"{path}: {what} not found")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        msg = " ".join(str(exc).split())
        raise ReplayInputError(f"{path}: cannot read {what}: {type(exc).__name__}: {msg}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ReplayInputError(f"{path}: {what} lacks column(s) {', '.join(missing)}")
    return df


def _times(series: pd.Series, path: Path, col: str) -> tuple[pd.Series, pd.Series, bool]:
    """Parse a time column: ISO datetimes, or numbers = seconds since the run start.

    Returns (plot times: datetimes, or hours since start for numbers; seconds: since the epoch,
    or as given; True for datetimes)."""
    if pd.api.types.is_numeric_dtype(series):
        _no_empty(series, path, col)
        secs = series.astype(float)
        return secs / 3600.0, secs, False
    try:
        t = pd.to_datetime(series, format="ISO8601")
    except (ValueError, TypeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReplayInputError(f"{path}: column {col!r}: bad time: {msg}") from None
    _no_empty(t, path, col)
    if getattr(t.dt, "tz", None) is not None:
        t = t.dt.tz_convert("UTC").dt.tz_localize(None)
    return t, (t - pd.Timestamp("1970-01-01")).dt.total_seconds(), True


def _no_empty(series: pd.Series, path: Path, col: str) -> None:
    empty = series.isna().to_numpy()
    if empty.any():
        line = int(np.argmax(empty)) + 2  # 1-based, after the header line
        raise ReplayInputError(f"{path}: column {col!r} has an empty value (line {line})")


def _numeric(df: pd.DataFrame, cols: list[str], path: Path) -> None:
    for c in cols:
        try:
            df[c] = pd.to_numeric(df[c])
        except (ValueError, TypeError):
            bad = pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()
            line = int(np.argmax(bad.to_numpy())) + 2 if bad.any() else None
            where = f" (line {line}: {df[c].iloc[line - 2]!r})" if line else ""
            raise ReplayInputError(f"{path}: column {c!r} must be numeric{where}") from None
        _no_empty(df[c], path, c)


def _load(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """steps and placements, checked, with ``_t`` (plot time) and ``_s`` (seconds) columns and
    sorted by time (file order among equal times); True when times are datetimes."""
    if not out.is_dir():
        raise ReplayInputError(f"{out}: no such folder")
    steps_path, plc_path = out / "steps.csv", out / "placements.csv"
    steps = _read(steps_path, STEPS_COLUMNS, "replay steps")
    plc = _read(plc_path, PLACEMENTS_COLUMNS, "task placements")
    if steps.empty:
        raise ReplayInputError(f"{steps_path}: replay steps table has no rows")
    _numeric(steps, STEPS_NUMERIC, steps_path)
    st, st_s, st_dt = _times(steps["evtTime"], steps_path, "evtTime")
    steps = steps.assign(_t=st, _s=st_s).sort_values("_s", kind="stable").reset_index(drop=True)
    if not plc.empty:
        _numeric(plc, PLACEMENTS_NUMERIC, plc_path)
        pt, pt_s, pt_dt = _times(plc["time"], plc_path, "time")
        if pt_dt != st_dt:
            raise ReplayInputError(f"{plc_path}: column 'time' must use the same kind of time "
                                   "(datetime or seconds) as steps.csv evtTime")
        if (plc["total_work_samples"] <= 0).any():
            raise ReplayInputError(f"{plc_path}: column 'total_work_samples' must be > 0")
        if (plc["nodes"] < 0).any():
            raise ReplayInputError(f"{plc_path}: column 'nodes' must be >= 0")
        plc = plc.assign(_t=pt, _s=pt_s,
                         _pct=100.0 * plc["work_done_samples"] / plc["total_work_samples"])
        plc = plc.sort_values("_s", kind="stable").reset_index(drop=True)
    return steps, plc, st_dt


def _task_key(plc: pd.DataFrame) -> str:
    return "task_id" if plc["task_id"].notna().all() else "task_name"


def _read_summary_json(out: Path) -> dict[str, Any]:
    path = out / "summary.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReplayInputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ReplayInputError(f"{path}: expected a JSON object")
    keys = ("stop_reason", "all_done_at", "solver", "total_samples", "wall_s")
    return {k: data[k] for k in keys if data.get(k) is not None}


# ------------------------------------------------------------------ figures
def _held_integral(t_s: np.ndarray, values: np.ndarray, end_s: float) -> float:
    """Integral [value x s] of a step function: values[i] holds from t_s[i] to t_s[i+1]
    (the last one until end_s)."""
    if len(t_s) == 0:
        return 0.0
    dt = np.diff(np.append(t_s, end_s))
    return float(np.sum(values * np.maximum(dt, 0.0)))


def _percentile(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def summarise_history(steps: pd.DataFrame, plc: pd.DataFrame) -> dict[str, Any]:
    """The summary's numbers from loaded ``steps`` / ``placements`` tables (with ``_s``: time in
    seconds, sorted).

    Returns a dict: ``start_s``, ``end_s`` (first and last recorded time in either table
    [s]), ``hours`` (their difference [h]); ``events`` (steps rows = node events),
    ``events_with_preemption`` (rows with ``Nleft`` > 0), ``idle_node_hours`` (integral of
    ``nNd``, each row's value held until the next row, the last until ``end_s``),
    ``used_node_hours`` (integral of each task's node count from placements.csv when every
    task's history starts with its ``submitted`` row, exact even for completions between
    events; else of ``nNrun`` like the idle figure) and ``used_from`` (``"placements"`` or
    ``"steps"``), ``utilisation`` (used / idle, None without idle node-hours),
    ``net_samples`` (sum of ``Thr``: samples earned over the node events' intervals, net of
    costs; intervals ended by a submission or cancellation are not in steps.csv),
    ``rescale_cost_samples`` / ``preemption_cost_samples`` (sums of ``ReScost`` / ``PreCost``),
    ``rate_max`` [samples/s], ``tasks``, ``tasks_completed``, ``tasks_cancelled``,
    ``completed_work_samples`` (total work of completed tasks), ``rescales`` (placement rows
    ``start | grow | shrink | stop``), ``preemptions`` (rows ``preempted``),
    ``decision_ms`` (``p50``, ``p99``, ``max`` [ms] and ``n``, over node events whose
    ``solve_ms`` > 0, i.e. that needed an allocation solve).
    """
    t = steps["_s"].to_numpy(dtype=float)
    start = float(t[0])
    end = float(t[-1])
    if not plc.empty:
        start = min(start, float(plc["_s"].iloc[0]))
        end = max(end, float(plc["_s"].iloc[-1]))
    idle_s = _held_integral(t, steps["nNd"].to_numpy(dtype=float), end)
    used_from = "steps"
    used_s = _held_integral(t, steps["nNrun"].to_numpy(dtype=float), end)
    tasks = completed = cancelled = 0
    completed_work = 0.0
    if not plc.empty:
        key = _task_key(plc)
        groups = plc.groupby(key, sort=False)
        tasks = groups.ngroups
        done = plc[plc["change"] == "completed"]
        completed = done[key].nunique()
        completed_work = float(done.groupby(key)["total_work_samples"].first().sum())
        cancelled = plc.loc[plc["change"] == "cancelled", key].nunique()
        if (groups["change"].first() == "submitted").all():
            used_from = "placements"
            used_s = sum(_held_integral(g["_s"].to_numpy(dtype=float),
                                        g["nodes"].to_numpy(dtype=float), end)
                         for _, g in groups)
    solve = steps["solve_ms"].to_numpy(dtype=float)
    solve = solve[solve > 0]
    return {
        "start_s": start, "end_s": end, "hours": (end - start) / 3600.0,
        "events": int(len(steps)),
        "events_with_preemption": int((steps["Nleft"] > 0).sum()),
        "idle_node_hours": idle_s / 3600.0,
        "used_node_hours": used_s / 3600.0,
        "used_from": used_from,
        "utilisation": used_s / idle_s if idle_s > 0 else None,
        "net_samples": float(steps["Thr"].sum()),
        "rescale_cost_samples": float(steps["ReScost"].sum()),
        "preemption_cost_samples": float(steps["PreCost"].sum()),
        "rate_max": float(steps["Rate"].max()),
        "tasks": int(tasks), "tasks_completed": int(completed), "tasks_cancelled": int(cancelled),
        "completed_work_samples": completed_work,
        "rescales": int(plc["change"].isin(RESCALE_CHANGES).sum()) if not plc.empty else 0,
        "preemptions": int((plc["change"] == "preempted").sum()) if not plc.empty else 0,
        "decision_ms": {"p50": _percentile(solve, 50), "p99": _percentile(solve, 99),
                        "max": float(solve.max()) if len(solve) else None, "n": int(len(solve))},
    }


def _when(t_s: float, is_dt: bool) -> str:
    if is_dt:
        return pd.Timestamp(round(t_s), unit="s").isoformat(sep=" ")
    return f"{t_s / 3600.0:.3f} h"


def format_summary(name: str, f: dict[str, Any], is_dt: bool,
                   replay: dict[str, Any] | None = None) -> str:
    """``summary.txt``: one line per topic, from :func:`summarise_history`'s dict ``f`` (and
    ``summary.json`` facts in ``replay``). Node-hours with 3 decimals, utilisation in %,
    samples with 6 significant digits, times in ms with 3 decimals."""
    util = f"{100.0 * f['utilisation']:.1f} %" if f["utilisation"] is not None else "-"
    span = "UTC" if is_dt else "since the run start"
    dm = f["decision_ms"]
    lines = [
        f"Offcut report: {name}",
        f"period        {_when(f['start_s'], is_dt)} -> {_when(f['end_s'], is_dt)} {span} "
        f"({f['hours']:.3f} h)",
        f"events        {f['events']} node events (steps.csv rows), "
        f"{f['events_with_preemption']} took idle nodes back",
        f"node-hours    idle {f['idle_node_hours']:.3f}, used {f['used_node_hours']:.3f} "
        f"(from {f['used_from']}.csv), utilisation {util}",
        f"samples       {f['net_samples']:.6g} net over node events (sum of Thr); lost to "
        f"rescales {f['rescale_cost_samples']:.6g}, to preemptions "
        f"{f['preemption_cost_samples']:.6g}; peak rate {f['rate_max']:.6g} samples/s",
        f"tasks         {f['tasks_completed']} of {f['tasks']} completed "
        f"({f['completed_work_samples']:.6g} samples of work), {f['tasks_cancelled']} cancelled",
        f"placements    {f['rescales']} rescales (start/grow/shrink/stop), "
        f"{f['preemptions']} preemptions",
    ]
    if dm["n"]:
        lines.append(f"decision ms   p50 {dm['p50']:.3f}, p99 {dm['p99']:.3f}, max "
                     f"{dm['max']:.3f} ({dm['n']} node events with a solve)")
    else:
        lines.append("decision ms   - (no node event needed a solve)")
    if replay:
        facts = [f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                 for k, v in replay.items()]
        lines.append("replay        " + "; ".join(facts) + " (summary.json)")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ plots
def _new_figure(size: tuple[float, float]):
    # Figure + the Agg canvas directly: no pyplot, no global backend switch, no display needed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _time_axis(ax, is_dt: bool) -> None:
    import matplotlib.dates as mdates

    if is_dt:
        loc = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(loc)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))
        ax.set_xlabel("time (UTC)")
    else:
        ax.set_xlabel("time since replay start (h)")


def _plot_overview(out: Path, steps: pd.DataFrame, plc: pd.DataFrame, is_dt: bool) -> Path:
    fig = _new_figure((11, 7.5))
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
        key = _task_key(plc)
        groups = list(plc.groupby(key, sort=False))
        for _, g in groups:
            label = (csv_uncell(str(g["task_name"].iloc[0])) if pd.notna(g["task_name"].iloc[0])
                     else str(g[key].iloc[0]))
            ax2.plot(g["_t"], g["_pct"], marker=".", markersize=3, linewidth=1.2, label=label)
        if len(groups) <= _MAX_LEGEND:
            ax2.legend(loc="upper left", fontsize="small", ncol=2 if len(groups) > 6 else 1)
        else:
            ax2.text(0.01, 0.97, f"{len(groups)} tasks", transform=ax2.transAxes, va="top")
    ax2.set_ylabel("task progress (% of total work)")
    ax2.set_ylim(0, 105)
    ax2.grid(alpha=0.3)
    ax2.set_title("Task progress")
    _time_axis(ax2, is_dt)
    n_tasks = plc[["task_id", "task_name"]].drop_duplicates().shape[0] if not plc.empty else 0
    fig.suptitle(f"Replay report: {out.resolve().name} ({len(steps)} steps, {n_tasks} tasks)")
    png = out / "report.png"
    fig.savefig(png)
    return png


def task_timelines(plc: pd.DataFrame, end_s: float) -> list[Lane]:
    """Per task of ``placements.csv`` (as :func:`_load` returns it: ``_s`` seconds), the
    nodes held over time and its preemptions, up to ``end_s`` [s]; sorted by node-hours,
    most first. Empty for an empty table."""
    if plc.empty:
        return []
    key = _task_key(plc)
    lanes = []
    for k, g in plc.groupby(key, sort=False):
        times = [float(t) for t in g["_s"]]
        nodes = [int(n) for n in g["nodes"]]
        label = (csv_uncell(str(g["task_name"].iloc[0])) if pd.notna(g["task_name"].iloc[0])
                 else str(k))
        hours = _held_integral(np.asarray(times), np.asarray(nodes, dtype=float),
                               max(end_s, times[-1])) / 3600.0
        lanes.append(Lane(str(k), label, times, nodes,
                          [float(t) for t, c in zip(g["_s"], g["change"]) if c == "preempted"],
                          hours))
    lanes.sort(key=lambda lane: (-lane.node_hours, lane.key))
    return lanes


def _plot_timeline(out: Path, steps: pd.DataFrame, plc: pd.DataFrame, is_dt: bool,
                   end_s: float) -> Path:
    """``timeline.png``: a lane per task (the :data:`TIMELINE_TASKS` with most node-hours),
    its held nodes as a filled step plot scaled to the lane, preemptions as red marks; up to
    ``end_s`` [s], the summary's end (:func:`summarise_history`), so its node-hours agree."""
    lanes = task_timelines(plc, end_s)
    shown = lanes[:TIMELINE_TASKS]
    fig = _new_figure((11, max(3.0, 0.45 * len(shown) + 1.6)))
    ax = fig.subplots()
    origin = float(steps["_s"].iloc[0])

    def x(values):
        values = np.asarray(values, dtype=float)
        if is_dt:
            return pd.to_datetime(values, unit="s")
        return (values - origin) / 3600.0

    peak = max([max(lane.nodes) for lane in shown] + [1])
    for row, lane in enumerate(shown):
        base = len(shown) - 1 - row
        t = lane.times + [max(end_s, lane.times[-1])]
        held = [n / peak * 0.8 for n in lane.nodes] + [lane.nodes[-1] / peak * 0.8]
        ax.fill_between(x(t), base, [base + h for h in held], step="post", alpha=0.6,
                        color="tab:blue", linewidth=0)
        if lane.preempted:
            ax.plot(x(lane.preempted), [base + 0.85] * len(lane.preempted), "v",
                    color="tab:red", markersize=5,
                    label="preempted" if row == 0 or "preempted" not in
                    ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks([len(shown) - 1 - r + 0.4 for r in range(len(shown))])
    ax.set_yticklabels([f"{lane.label} ({lane.node_hours:.0f} node-h)" for lane in shown],
                       fontsize="small")
    ax.set_ylim(-0.2, max(len(shown), 1))
    if not shown:
        ax.text(0.5, 0.5, "no task placements", ha="center", va="center", transform=ax.transAxes)
    elif any(lane.preempted for lane in shown):
        ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3, axis="x")
    _time_axis(ax, is_dt)
    more = f"; {len(lanes) - len(shown)} more not shown" if len(lanes) > len(shown) else ""
    ax.set_title(f"Nodes held per task (lane height: up to {peak} nodes){more}")
    png = out / "timeline.png"
    fig.savefig(png)
    return png


def _plot_throughput(out: Path, steps: pd.DataFrame, is_dt: bool) -> Path:
    fig = _new_figure((11, 7))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    ax1.step(steps["_t"], steps["Rate"], where="post", color="tab:green",
             label="aggregate rate after each event (Rate)")
    ax1.fill_between(steps["_t"], steps["Rate"], step="post", alpha=0.2, color="tab:green")
    ax1.set_ylabel("samples/s")
    ax1.set_ylim(bottom=0)
    ax1.legend(loc="upper right", fontsize="small")
    ax1.grid(alpha=0.3)
    ax1.set_title("Aggregate training rate of all tasks")

    ax2.plot(steps["_t"], steps["ReScost"].cumsum(), color="tab:orange",
             label="rescales (cumulative ReScost)")
    ax2.plot(steps["_t"], steps["PreCost"].cumsum(), color="tab:red",
             label="preemptions (cumulative PreCost)")
    ax2.set_ylabel("samples lost (cumulative)")
    ax2.set_ylim(bottom=0)
    ax2.grid(alpha=0.3)
    per_event = steps["ReScost"] + steps["PreCost"]
    if (per_event > 0).any():
        ax3 = ax2.twinx()
        hit = steps[per_event > 0]
        ax3.scatter(hit["_t"], per_event[per_event > 0], s=6, color="tab:purple", alpha=0.5,
                    label="per event (ReScost + PreCost)")
        ax3.set_ylabel("samples lost in the event")
        ax3.set_ylim(bottom=0)
        ax3.legend(loc="lower right", fontsize="small")
    ax2.legend(loc="upper left", fontsize="small")
    ax2.set_title("Cost of rescales and preemptions")
    _time_axis(ax2, is_dt)
    fig.suptitle(f"Throughput: {out.resolve().name}")
    png = out / "throughput.png"
    fig.savefig(png)
    return png


def _plot_decisions(out: Path, steps: pd.DataFrame, is_dt: bool) -> Path:
    fig = _new_figure((11, 4.5))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    solved = steps[steps["solve_ms"] > 0]
    if solved.empty:
        for ax in (ax1, ax2):
            ax.text(0.5, 0.5, "no node event needed a solve", ha="center", va="center",
                    transform=ax.transAxes)
    else:
        ms = solved["solve_ms"].to_numpy(dtype=float)
        lo, hi = float(ms.min()), float(ms.max())
        log_scale = hi > 20 * lo
        bins = np.geomspace(lo, hi * 1.0001, 40) if log_scale and lo > 0 else 40
        ax1.hist(ms, bins=bins, color="tab:blue", alpha=0.8)
        if log_scale:
            ax1.set_xscale("log")
        for q, style in ((50, "--"), (99, ":")):
            v = float(np.percentile(ms, q))
            ax1.axvline(v, color="black", linestyle=style, linewidth=1, label=f"p{q} {v:.3g} ms")
        ax1.legend(fontsize="small")
        ax2.scatter(solved["_t"], ms, s=5, alpha=0.6, color="tab:blue")
        if log_scale:
            ax2.set_yscale("log")
    ax1.set_xlabel("allocation time per node event (ms)")
    ax1.set_ylabel("node events")
    ax1.set_title("Decision time distribution")
    ax1.grid(alpha=0.3)
    ax2.set_ylabel("ms")
    ax2.set_title("Decision time over time")
    ax2.grid(alpha=0.3)
    _time_axis(ax2, is_dt)
    fig.suptitle(f"Decisions: {out.resolve().name} ({len(solved)} node events with a solve)")
    png = out / "decisions.png"
    fig.savefig(png)
    return png


# ------------------------------------------------------------------ entry points
def build_report(out_dir: str | Path, use_summary_json: bool = True) -> Report:
    """Render the plots and ``summary.txt`` from ``out_dir/steps.csv`` and
    ``out_dir/placements.csv`` (and ``summary.json`` when present and ``use_summary_json``);
    see the module docstring.

    ``steps.csv``: one row per node event, columns :data:`STEPS_COLUMNS` (``evtTime`` ISO
    time or seconds since start; ``nNd`` idle nodes, ``nNrun`` nodes used by tasks; ``Rate``
    samples/s; ``Thr``, ``ReScost``, ``PreCost`` samples; ``solve_ms`` ms).
    ``placements.csv``: columns :data:`PLACEMENTS_COLUMNS`, one row whenever a task's
    placement changes, it is submitted, or it completes; progress is linear between rows.
    Returns the :class:`Report` (paths, summary text, figures).
    Raises :class:`ReplayInputError` (one line naming the file, and the column where one is
    at fault) when the folder or a file is missing or malformed.
    """
    out = Path(out_dir)
    steps, plc, is_dt = _load(out)
    replay = _read_summary_json(out) if use_summary_json else {}
    figures = summarise_history(steps, plc)
    text = format_summary(out.resolve().name, figures, is_dt, replay)
    files = [_plot_overview(out, steps, plc, is_dt), _plot_throughput(out, steps, is_dt),
             _plot_decisions(out, steps, is_dt),
             _plot_timeline(out, steps, plc, is_dt, figures["end_s"])]
    summary_path = out / "summary.txt"
    summary_path.write_text(text)
    files.append(summary_path)
    return Report(out_dir=out, files=files, text=text, figures={**figures, "replay": replay})


def render_report(out_dir: str | Path) -> Path:
    """Render every report file like :func:`build_report`; return the ``report.png`` path.

    Top panel of ``report.png``: idle nodes vs nodes in use (step plots); bottom panel: each
    task's progress in % (legend when at most 12 tasks).
    Raises :class:`ReplayInputError` when a file is missing or malformed.
    """
    return build_report(out_dir).files[0]

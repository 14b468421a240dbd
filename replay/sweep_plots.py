"""The plots of a sweep (:mod:`offcut.replay.sweep`): the efficiency against dedicated nodes
(docs/replay-and-policies.md, "Efficiency against dedicated nodes") and the all-done time
against each swept setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from offcut.replay.sweep_spec import setting_text

__all__ = ["plot_sweep"]

#: the panels' rows: (table column, y label, scale)
_ROWS = (("dedicated_efficiency", "efficiency vs dedicated nodes [%]\n(baselines from the curves)", 100.0),
         ("all_done_h", "all tasks done after [h]", 1.0))
#: most swept settings drawn (one column each)
MAX_AXES = 6


def _label(text: str) -> str:
    """A tick label of at most 28 characters."""
    return text if len(text) <= 28 else text[:27] + "…"


def plot_sweep(table: pd.DataFrame, axes: tuple[str, ...], path: Path, title: str = "") -> Path:
    """Draw ``table`` (:func:`offcut.replay.sweep.gather`'s: a row per finished cell) as a grid
    of panels: a column per swept setting (the first :data:`MAX_AXES` of ``axes``), a row per
    figure (efficiency [%], all-done time [h]); each cell is a dot at its setting's value, the
    line joins the means over the other settings. A cell whose tasks did not all finish has no
    all-done time and is left out of that row (the panel says how many). Writes ``path`` (PNG)
    and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(axes[:MAX_AXES])
    fig, panels = plt.subplots(len(_ROWS), len(shown), figsize=(3.4 * len(shown) + 0.6, 6.2),
                               squeeze=False)
    rng = np.random.default_rng(0)  # (the dots' sideways jitter only)
    for j, axis in enumerate(shown):
        values = list(dict.fromkeys(table[axis].tolist()))  # (the spec's order ...)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            values.sort()  # (... numbers ascending)
        pos = {v: i for i, v in enumerate(values)}
        x = table[axis].map(pos).to_numpy(dtype=float)
        for i, (col, label, scale) in enumerate(_ROWS):
            ax = panels[i][j]
            y = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float) * scale
            ok = ~np.isnan(y)
            ax.scatter(x[ok] + rng.uniform(-0.08, 0.08, ok.sum()), y[ok], s=14, alpha=0.6,
                       color="tab:blue", label="a cell")
            means = [np.nanmean(y[(x == k) & ok]) if ((x == k) & ok).any() else np.nan
                     for k in range(len(values))]
            ax.plot(range(len(values)), means, "-o", color="tab:red", lw=1.5, ms=4,
                    label="mean of the cells")
            labels = [_label(setting_text(axis, v)) for v in values]
            crowded = sum(len(t) for t in labels) > 24
            ax.set_xticks(range(len(values)), labels, rotation=25 if crowded else 0,
                          ha="right" if crowded else "center", fontsize=8 if crowded else 10)
            ax.set_xlim(-0.5, len(values) - 0.5)
            ax.grid(alpha=0.3)
            if (~ok).any():
                ax.set_title(f"{(~ok).sum()} of {len(y)} cells: not every task done",
                             fontsize=8)
            if j == 0:
                ax.set_ylabel(label)
            if i == len(_ROWS) - 1:
                ax.set_xlabel(axis)
    panels[0][0].legend(fontsize=8, loc="best")
    more = f" (first {MAX_AXES} of {len(axes)} swept settings)" if len(axes) > MAX_AXES else ""
    fig.suptitle(f"sweep {title}: {len(table)} cells{more}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""A site's own node log from Slurm's accounting, for ``offcut replay slurm`` (issue "Evaluate
on your own site").

A node is *busy* while a job of the accounting ran on it (from its ``Start`` to its ``End``)
and *idle* otherwise; jobs of the scavenger partitions (Offcut's own, and any other
preemptable work) do not make a node busy, so a site that already runs Offcut replays its own
history. A node down or drained (a node event of ``sacctmgr show event``, when given) is not
idle either: the log has only idle and busy, so it counts as busy. The result is a
:class:`~offcut.replay.bftrainer_data.NodeLog` like the BFTrainer log's, replayed the same way.
Input: ``sacct`` of the window as text or JSON, optionally the node events, and the list of
nodes; :mod:`offcut.replay.slurm_accounting` reads them (its docstring has the commands and the
forms of each Slurm release).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pandas as pd

from offcut.replay.bftrainer_data import NodeChange, NodeLog, ReplayInputError
from offcut.replay.slurm_accounting import (EVENT_FIELDS, SACCT_LOG_FIELDS, busy_intervals,
                                            sacct_command, sacct_json_command,
                                            sacctmgr_events_command, unavailable_intervals)

__all__ = ["SACCT_LOG_FIELDS", "EVENT_FIELDS", "sacct_command", "sacct_json_command",
           "sacctmgr_events_command", "busy_intervals", "unavailable_intervals",
           "node_log_from_sacct", "read_node_log_from_sacct"]


def node_log_from_sacct(text: str, nodes: Sequence[str], start: pd.Timestamp,
                        end: pd.Timestamp, *, source: str = "sacct",
                        own_partitions: Iterable[str] = ("scavenger",),
                        events: str | None = None, events_source: str = "events") -> NodeLog:
    """The node log of ``nodes`` between ``start`` and ``end`` (UTC-naive) from the accounting
    ``text`` (``sacct`` text or JSON) and the node ``events`` (``sacctmgr show event`` text;
    None: not given): a node is idle unless a job outside ``own_partitions`` ran on it or an
    event had it down or drained; changes at the same second are one event.

    Raises:
        ReplayInputError: a malformed record (its line, or its index and job id, or the JSON
            parse position; the events' line), records naming more nodes in all than the
            size guard allows (:data:`offcut.replay.slurm_accounting.MAX_EXPANDED_NODES`,
            counted before expansion), no node, or ``end <= start``.
    """
    names = list(dict.fromkeys(nodes))
    if not names:
        raise ReplayInputError(f"{source}: no nodes to replay")
    t_start, t_end = start.value / 1e9, end.value / 1e9
    if t_end <= t_start:
        raise ReplayInputError(f"{source}: the window ends ({end}) before it starts ({start})")
    wanted = set(names)
    deltas: dict[float, dict[str, int]] = {}
    busy_at_start: dict[str, int] = {}
    # only the replayed nodes' names are kept (one reference each per record): a window
    # naming many other nodes costs no memory beyond its text
    held = busy_intervals(text, end_s=t_end, source=source, own_partitions=own_partitions,
                          keep=wanted)
    if events is not None:
        held += unavailable_intervals(events, end_s=t_end, source=events_source, keep=wanted)
    for t0, t1, job_nodes in held:
        if t1 <= t_start or t0 >= t_end:
            continue
        for n in job_nodes:
            if n not in wanted:
                continue
            if t0 <= t_start:
                busy_at_start[n] = busy_at_start.get(n, 0) + 1
            else:
                d = deltas.setdefault(t0, {})
                d[n] = d.get(n, 0) + 1
            if t1 < t_end:
                d = deltas.setdefault(t1, {})
                d[n] = d.get(n, 0) - 1
    initial_idle = [n for n in names if not busy_at_start.get(n)]
    order = {n: i for i, n in enumerate(names)}

    def sweep() -> Iterator[NodeChange]:
        count = dict(busy_at_start)
        for t in sorted(deltas):
            idle, busy = [], []
            for n, d in deltas[t].items():
                before = count.get(n, 0)
                count[n] = before + d
                if before == 0 and count[n] > 0:
                    busy.append(n)
                elif before > 0 and count[n] == 0:
                    idle.append(n)
            if idle or busy:
                yield NodeChange(pd.Timestamp(t, unit="s"), sorted(idle, key=order.get),
                                 sorted(busy, key=order.get))

    changes = list(sweep())  # once: its length is the log's num_events
    return NodeLog(names, start, initial_idle, num_events=len(changes), source=source,
                   _events_factory=lambda: iter(changes))


def read_node_log_from_sacct(path: str | Path, nodes: Sequence[str], start: pd.Timestamp,
                             end: pd.Timestamp, *, events_path: str | Path | None = None,
                             **kw) -> NodeLog:
    """:func:`node_log_from_sacct` of the accounting file ``path`` (text or JSON) and the node
    events file ``events_path`` (None: none); ReplayInputError when one is unreadable."""
    texts = []
    for p in (path, events_path):
        try:
            texts.append(None if p is None else Path(p).read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ReplayInputError(f"{p}: {getattr(exc, 'strerror', None) or exc}") from None
    return node_log_from_sacct(texts[0], nodes, start, end, source=str(path), events=texts[1],
                               events_source=str(events_path), **kw)

"""A site's own node log from Slurm's accounting, for ``offcut replay slurm`` (issue "Evaluate
on your own site").

A node is *busy* while a job of the accounting ran on it (from its ``Start`` to its ``End``)
and *idle* otherwise; jobs of the scavenger partitions (Offcut's own, and any other
preemptable work) do not make a node busy, so a site that already runs Offcut replays its own
history. The result is a :class:`~offcut.replay.bftrainer_data.NodeLog` like the BFTrainer
log's, replayed the same way. Input: ``sacct -X -a --parsable2 --noheader
--format=JobID,JobName,Partition,State,NodeList,Start,End`` with ``SLURM_TIME_FORMAT=%s``
(:data:`SACCT_LOG_FIELDS`; :func:`sacct_command` builds the command) and the list of nodes.
Not covered yet: nodes down or drained (``sacctmgr show event``) count as idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Sequence

import hostlist
import pandas as pd

from offcut.parsable import parsable_rows
from offcut.replay.bftrainer_data import NodeChange, NodeLog, ReplayInputError

__all__ = ["SACCT_LOG_FIELDS", "sacct_command", "busy_intervals", "node_log_from_sacct",
           "read_node_log_from_sacct"]

#: the columns of the accounting this module reads, in this order
SACCT_LOG_FIELDS = ("JobID", "JobName", "Partition", "State", "NodeList", "Start", "End")
_NO_TIME = ("", "Unknown", "None", "N/A")


def sacct_command(start: pd.Timestamp, end: pd.Timestamp) -> list[str]:
    """The ``sacct`` command (run with ``SLURM_TIME_FORMAT=%s``) whose output
    :func:`node_log_from_sacct` reads: every user's allocations that ran between ``start`` and
    ``end`` (UTC-naive Timestamps)."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    return ["sacct", "-X", "-a", "--parsable2", "--noheader",
            f"--format={','.join(SACCT_LOG_FIELDS)}", f"--starttime={start.strftime(fmt)}",
            f"--endtime={end.strftime(fmt)}"]


def busy_intervals(text: str, *, end_s: float, source: str = "sacct",
                   own_partitions: Iterable[str] = ("scavenger",)
                   ) -> list[tuple[float, float, list[str]]]:
    """``(start_s, end_s, nodes)`` of every job in ``text`` (:data:`SACCT_LOG_FIELDS`, times
    in epoch seconds) that started, outside ``own_partitions``; a job still running ends at
    ``end_s``. Raises :class:`ReplayInputError` naming the line of a malformed record."""
    own = set(own_partitions)
    out = []
    try:
        records = list(parsable_rows(text, SACCT_LOG_FIELDS, source))
    except ValueError as exc:
        raise ReplayInputError(str(exc)) from None
    for number, cols in records:
        _, _, partition, _, nodes, start, end = cols
        if own & set(partition.split(",")) or start.strip() in _NO_TIME \
                or nodes.strip() in ("", "None assigned"):
            continue
        try:
            t0 = float(start)
            t1 = end_s if end.strip() in _NO_TIME else float(end)
            names = hostlist.expand_hostlist(nodes)
        except (ValueError, hostlist.BadHostlist) as exc:
            raise ReplayInputError(f"{source} line {number}: start {start!r}, end {end!r} or "
                                   f"node list {nodes!r} unreadable ({exc}; times need "
                                   "SLURM_TIME_FORMAT=%s)") from None
        if t1 > t0:
            out.append((t0, t1, names))
    return out


def node_log_from_sacct(text: str, nodes: Sequence[str], start: pd.Timestamp,
                        end: pd.Timestamp, *, source: str = "sacct",
                        own_partitions: Iterable[str] = ("scavenger",)) -> NodeLog:
    """The node log of ``nodes`` between ``start`` and ``end`` (UTC-naive) from the accounting
    ``text`` (module docstring): a node is idle unless a job outside ``own_partitions`` ran
    on it; changes at the same second are one event.

    Raises:
        ReplayInputError: a malformed record (its line), no node, or ``end <= start``.
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
    for t0, t1, job_nodes in busy_intervals(text, end_s=t_end, source=source,
                                            own_partitions=own_partitions):
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
                             end: pd.Timestamp, **kw) -> NodeLog:
    """:func:`node_log_from_sacct` of the file ``path``; ReplayInputError when unreadable."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReplayInputError(f"{path}: {exc.strerror}") from None
    return node_log_from_sacct(text, nodes, start, end, source=str(path), **kw)

"""Values of Slurm's outputs read by both the Slurm plugin and the replay of a site's accounting
(so neither imports the other, docs/architecture.md §1): hostlists (``n[1-4]``) expanded with a
size guard, and the numbers of Slurm's JSON (plain, or ``{"set", "infinite", "number"}`` from
the data_parser plugins of 23.02+).

Imports only the standard library and python-hostlist (lazily), so the Slurm hooks stay fast.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Mapping

__all__ = ["MAX_NODES", "NodeListError", "expand_nodelist", "reported_errors", "slurm_number",
           "slurm_time_arg"]

#: Expansion guard: a garbage hostlist such as ``n[1-99999999]`` must not eat the hook's memory.
MAX_NODES = 1_000_000


class NodeListError(ValueError):
    """A hostlist that is empty, malformed or too large."""


def expand_nodelist(text: str | None, max_nodes: int = MAX_NODES) -> list[str]:
    """The node names of a Slurm hostlist, in order, without repeats.

    Raises:
        NodeListError: empty/blank text, a malformed hostlist, or more than ``max_nodes``.
    """
    import hostlist  # python-hostlist: a single pure-Python module

    if text is None or not str(text).strip():
        raise NodeListError("empty node list")
    text = str(text).strip()
    if len(text) > 1_000_000:
        raise NodeListError(f"node list of {len(text)} characters")
    count = _estimate_count(text)
    if count > max_nodes:
        raise NodeListError(f"node list {text[:80]!r} names {count} nodes (limit {max_nodes})")
    try:
        names = hostlist.expand_hostlist(text, allow_duplicates=False)
    except hostlist.BadHostlist as exc:
        raise NodeListError(f"malformed node list {text[:80]!r}: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        raise NodeListError(f"malformed node list {text[:80]!r}: {exc.__class__.__name__}") from None
    if len(names) > max_nodes:
        raise NodeListError(f"node list {text[:80]!r} names {len(names)} nodes (limit {max_nodes})")
    if not names:
        raise NodeListError(f"node list {text[:80]!r} names no node")
    return names


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _estimate_count(text: str) -> int:
    """How many names ``text`` expands to (an upper bound, computed without expanding), so a
    range like ``n[1-999999999]`` is refused before it is materialised. Malformed pieces count
    as 1 (the expansion then reports them)."""
    total, depth, start = 0, 0, 0
    pieces = []
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    for piece in pieces:
        n = 1
        for group in _GROUP.findall(piece):
            size = 0
            for part in group.split(","):
                lo, sep, hi = part.partition("-")
                if sep and lo.strip().isdigit() and hi.strip().isdigit():
                    size += max(int(hi) - int(lo) + 1, 1)
                else:
                    size += 1
            n *= max(size, 1)
        total += n
    return total



def slurm_number(v: Any, what: str = "value", error: type[Exception] = ValueError) -> float:
    """A Slurm number: plain, a numeric string, or ``{"set", "infinite", "number"}`` (0 when
    unset, None or empty; ``math.inf`` when infinite). ``what`` names it in errors.

    Raises:
        ``error`` (ValueError unless given): a string that is not a number, or a value of
            another type.
    """
    if v is None or v == "":
        return 0.0
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            raise error(f"{what} {v[:40]!r} is not a number") from None
    if isinstance(v, Mapping):
        if v.get("infinite"):
            return math.inf
        if "set" in v and not v.get("set"):
            return 0.0
        return slurm_number(v.get("number"), what, error)
    raise error(f"{what} {v!r:.60} is not a number")


def reported_errors(doc: Mapping) -> str:
    """The errors a JSON answer of Slurm reports in its ``errors`` list (strings in 22.05,
    ``{"error", "description", "error_number", "source"}`` objects from 23.02), joined by
    ``; `` and cut at 300 characters; ``""`` when none."""
    errors = doc.get("errors")
    if not errors:
        return ""
    shown = []
    for e in errors if isinstance(errors, list) else [errors]:
        if isinstance(e, Mapping):
            shown.append(str(e.get("error") or e.get("description") or e.get("errno") or e))
        else:
            shown.append(str(e))
    return "; ".join(shown)[:300]


def slurm_time_arg(epoch_s: float) -> str:
    """A time as Slurm's commands read it on this host (``--starttime``, ``Start=``):
    ``YYYY-MM-DDTHH:MM:SS`` in the host's local time zone (Slurm interprets such times as
    local), from ``epoch_s`` [s since the epoch; negative taken as 0]."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(max(epoch_s, 0)))

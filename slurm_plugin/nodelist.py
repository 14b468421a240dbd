"""Slurm hostlists (``n[1-4]``) -> node names, and the daemon's node-name rule.

Imports only the standard library and python-hostlist, so the Slurm hooks stay fast.
"""

from __future__ import annotations

import re

from offcut.nodes import is_node_name

# A name outside the daemon's node-name rule (NODE_NAME_RE) would make it reject the whole
# event, so callers drop such names (with a warning) and send the rest.

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


def split_valid(names: list[str]) -> tuple[list[str], list[str]]:
    """``(valid, invalid)`` under :data:`NODE_NAME_RE` (order kept)."""
    good, bad = [], []
    for n in names:
        (good if is_node_name(n) else bad).append(n)
    return good, bad


def drop_invalid(names: list[str], log) -> list[str]:
    """The names of ``names`` the daemon accepts (:func:`split_valid`, order kept); the others
    are logged as a warning on ``log`` (a :class:`logging.Logger`), the first five shown."""
    good, bad = split_valid(names)
    if bad:
        log.warning("dropping %d node names the daemon would refuse: %s", len(bad),
                    ", ".join(repr(b)[:40] for b in bad[:5]))
    return good


def partition_set(values) -> frozenset[str]:
    """Partition names from repeatable, comma-separated option values
    (``["a,b", "c"]`` -> ``{"a", "b", "c"}``; blanks dropped)."""
    return frozenset(p.strip() for item in values for p in item.split(",") if p.strip())


def compress(names: list[str]) -> str:
    """The short hostlist form of ``names`` (for log lines)."""
    import hostlist

    if not names:
        return ""
    try:
        return hostlist.collect_hostlist(list(names))
    except Exception:  # noqa: BLE001 - a log helper must never fail
        return ",".join(names)

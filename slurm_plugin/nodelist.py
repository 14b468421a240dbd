"""Slurm hostlists (``n[1-4]``) -> node names, and the daemon's node-name rule.

Imports only the standard library and python-hostlist, so the Slurm hooks stay fast.
"""

from __future__ import annotations

from offcut.nodes import is_node_name
# the expansion (with its size guard) is shared with the replay: offcut.slurm_values
from offcut.slurm_values import MAX_NODES, NodeListError, expand_nodelist  # noqa: F401

# A name outside the daemon's node-name rule (NODE_NAME_RE) would make it reject the whole
# event, so callers drop such names (with a warning) and send the rest.


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

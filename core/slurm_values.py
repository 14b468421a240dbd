"""Values of Slurm's outputs read by both the Slurm plugin and the replay of a site's accounting
(so neither imports the other, docs/architecture.md, "Layers"): hostlists (``n[1-4]``) expanded with
a size guard, and the numbers of Slurm's JSON (plain, or ``{"set", "infinite", "number"}`` from
the data_parser plugins of 23.02+).

Imports only the standard library and python-hostlist (lazily), so the Slurm hooks stay fast.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Mapping

__all__ = ["MAX_NODES", "MAX_INPUT_NODES", "MAX_NODELIST_CHARS", "NodeListError",
           "NodeBudget", "count_nodelist", "expand_nodelist", "reported_errors", "slurm_number",
           "slurm_time_arg"]

#: Expansion guard: a garbage hostlist such as ``n[1-99999999]`` must not eat the hook's memory.
MAX_NODES = 1_000_000
#: most node names all the hostlists of one input file may name together (a window of a
#: site's accounting, one pass over a converted node log): :class:`NodeBudget`'s default,
#: counted before each hostlist is expanded, so a small hostile file cannot make the reader
#: expand (and hold) more (docs/security.md, "Round two: replay inputs and output injection")
MAX_INPUT_NODES = 20_000_000
#: longest hostlist text read [characters]
MAX_NODELIST_CHARS = 1_000_000
#: what :func:`count_nodelist` reports for a range whose bounds have more than 18 digits (no
#: real hostlist has one; the count stays a small integer)
_HUGE = 10 ** 19


class NodeListError(ValueError):
    """A hostlist that is empty, malformed or too large."""


def expand_nodelist(text: str | None, max_nodes: int = MAX_NODES) -> list[str]:
    """The node names of a Slurm hostlist, in order, without repeats. The names are counted
    first (:func:`count_nodelist`, without expanding), so a hostlist naming more than
    ``max_nodes`` is refused before python-hostlist builds any of them.

    Raises:
        NodeListError: empty/blank text, a malformed hostlist, text longer than
            :data:`MAX_NODELIST_CHARS`, or more than ``max_nodes`` names.
    """
    import hostlist  # python-hostlist: a single pure-Python module

    if text is None or not str(text).strip():
        raise NodeListError("empty node list")
    text = str(text).strip()
    _check_count(text, count_nodelist(text), max_nodes)
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


def _check_count(text: str, count: int, max_nodes: int) -> None:
    if count > max_nodes:
        shown = f"{count}" if count < _HUGE else "more than 10^18"
        raise NodeListError(f"node list {text[:80]!r} names {shown} nodes (limit {max_nodes})")


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _range_size(part: str) -> int:
    """Names of one range of a bracket group (``7``, ``01-16``); 1 for a malformed one (the
    expansion reports it), :data:`_HUGE` for bounds of more than 18 digits."""
    lo, sep, hi = part.partition("-")
    lo, hi = lo.strip(), hi.strip()
    if not sep or not lo.isdigit() or not hi.isdigit():
        return 1
    lo, hi = lo.lstrip("0") or "0", hi.lstrip("0") or "0"
    if len(lo) > 18 or len(hi) > 18:
        return _HUGE
    return max(int(hi) - int(lo) + 1, 1)


def count_nodelist(text: str) -> int:
    """How many names the hostlist ``text`` expands to, computed without expanding it (an
    upper bound: repeats are counted; a malformed piece counts as 1 and the expansion then
    reports it; the sum is capped at :data:`_HUGE`), so a range like ``n[1-999999999]`` or
    thousands of ``n[1-99999]`` pieces are refused before they are materialised.

    Raises:
        NodeListError: ``text`` longer than :data:`MAX_NODELIST_CHARS` characters.
    """
    if len(text) > MAX_NODELIST_CHARS:
        raise NodeListError(f"node list of {len(text)} characters (limit {MAX_NODELIST_CHARS})")
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
            size = sum(_range_size(part) for part in group.split(","))
            n = min(n * max(size, 1), _HUGE)
        total = min(total + n, _HUGE)
    return total


class NodeBudget:
    """The node names one input may name in all its hostlists together (``limit``, default
    :data:`MAX_INPUT_NODES`), charged with each hostlist's :func:`count_nodelist` *before* it
    is expanded: the one size guard of every reader of hostlists from a file (the replay of a
    site's accounting and of a converted node log). ``used``: the names charged so far.
    """

    def __init__(self, limit: int = MAX_INPUT_NODES):
        self.limit = int(limit)
        self.used = 0

    def charge(self, text: str, max_nodes: int = MAX_NODES) -> int:
        """Count the names of the hostlist ``text`` and add them to :attr:`used`; returns the
        count.

        Raises:
            NodeListError: ``text`` too long (:func:`count_nodelist`), naming more than
                ``max_nodes`` itself, or the names charged would pass :attr:`limit`
                (nothing is added then).
        """
        text = str(text).strip()
        n = count_nodelist(text)
        _check_count(text, n, max_nodes)
        if self.used + n > self.limit:
            raise NodeListError(f"the hostlists of this input name more than {self.limit:,} "
                                "nodes in all (its size guard: hostlists are counted before "
                                "they are expanded)")
        self.used += n
        return n

    def expand(self, text: str, max_nodes: int = MAX_NODES) -> list[str]:
        """:meth:`charge` then :func:`expand_nodelist` (at most ``max_nodes`` names).

        Raises:
            NodeListError: as :meth:`charge` and :func:`expand_nodelist`.
        """
        self.charge(text, max_nodes)
        return expand_nodelist(text, max_nodes)



def slurm_number(v: Any, what: str = "value", error: type[Exception] = ValueError) -> float:
    """A Slurm number: plain, a numeric string, or ``{"set", "infinite", "number"}`` (0 when
    unset, None or empty; ``math.inf`` when infinite). ``what`` names it in errors.

    Raises:
        ``error`` (ValueError unless given): a string that is not a number, an integer past
            the float range, or a value of another type.
    """
    if v is None or v == "":
        return 0.0
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an int past the float range (JSON numbers are unbounded)
            raise error(f"{what}: an integer of {int(v).bit_length()} bits is past the "
                        "float range") from None
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

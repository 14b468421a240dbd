"""Node identities once the node counts are chosen (docs/architecture.md,
"Departures from BFTrainer").

A task never migrates: a shrinking task keeps a subset of its nodes, a growing task keeps all
of its nodes and takes free ones. Choices are deterministic and prefer locality:

* shrinking keeps the nodes in the cabinets where the task has the most nodes;
* growing first fills the cabinets the task already uses, then whole cabinets in the order of
  their longest-idle free node; inside a cabinet the longest-idle node goes first.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from typing import Mapping

_CABINET_RE = re.compile(r"^(.*?\d)[A-Za-z_.-]+\d+$")
_TRAILING_DIGITS_RE = re.compile(r"\d+$")


@functools.lru_cache(maxsize=65536)
def cabinet_of(node: str) -> str:
    """Cabinet prefix of a node name: ``c05n06`` -> ``c05``, ``nid00012`` -> ``nid``.

    The part before the last letters-then-digits group when the name has two numbers,
    otherwise the name without its trailing digits.
    """
    m = _CABINET_RE.match(node)
    if m:
        return m.group(1)
    return _TRAILING_DIGITS_RE.sub("", node) or node


def shrink(nodes: list[str], keep: int) -> tuple[list[str], list[str]]:
    """Split ``nodes`` into (kept, released) with ``len(kept) == keep``, keeping whole cabinets.

    Raises ``ValueError`` if ``keep`` is negative or larger than ``len(nodes)``.
    """
    if not 0 <= keep <= len(nodes):
        raise ValueError(f"cannot keep {keep} of {len(nodes)} nodes")
    per_cab: dict[str, int] = defaultdict(int)
    for n in nodes:
        per_cab[cabinet_of(n)] += 1
    ordered = sorted(nodes, key=lambda n: (-per_cab[cabinet_of(n)], cabinet_of(n), n))
    return sorted(ordered[:keep]), sorted(ordered[keep:])


def grow(nodes: list[str], extra: int, free: list[str], idle_since: Mapping[str, float]) -> list[str]:
    """Pick ``extra`` nodes from ``free`` for a task that holds ``nodes``.

    ``idle_since`` gives each free node's idle start [s since epoch]. Returns the picked names
    (in pick order). Raises ``ValueError`` if fewer than ``extra`` nodes are free.
    """
    if extra > len(free):
        raise ValueError(f"need {extra} free nodes, only {len(free)} free")
    if extra <= 0:
        return []
    own: dict[str, int] = defaultdict(int)
    for n in nodes:
        own[cabinet_of(n)] += 1
    groups: dict[str, list[str]] = defaultdict(list)
    for n in free:
        groups[cabinet_of(n)].append(n)
    for members in groups.values():
        members.sort(key=lambda n: (idle_since[n], n))

    def cabinet_key(cab: str) -> tuple:
        first = groups[cab][0]
        return (0 if cab in own else 1, -own.get(cab, 0), idle_since[first], cab)

    picked: list[str] = []
    for cab in sorted(groups, key=cabinet_key):
        take = groups[cab][: extra - len(picked)]
        picked.extend(take)
        if len(picked) == extra:
            break
    return picked


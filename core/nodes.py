"""The node-name rule shared by the daemon and the Slurm hooks (standard library only, so the
hooks import it fast)."""

from __future__ import annotations

import re
from typing import Sequence

#: A node name: letters, digits, ``.``, ``_``, ``-``; 1-128 characters, not starting with a
#: punctuation mark. The daemon rejects an event naming anything else (INVALID_ARGUMENT).
#: Match whole strings only (:func:`is_node_name`): ``$`` would also accept a trailing newline.
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: The largest message of a ``StreamNodes`` stream the daemon accepts [bytes] (1 MiB; a
#: larger one ends the stream RESOURCE_EXHAUSTED): a sender puts a larger node event in one
#: ``ReportNodes`` call, whose limit is the daemon's ``max_message_mb``.
STREAM_MESSAGE_BYTES = 1 << 20


def is_node_name(name: object) -> bool:
    """True when ``name`` is a string that is a node name as a whole (:data:`NODE_NAME_RE`)."""
    return isinstance(name, str) and NODE_NAME_RE.fullmatch(name) is not None


#: node names joined by newlines (a character no name has): all valid in one match
_NODE_LINES_RE = re.compile(rf"{NODE_NAME_RE.pattern}(?:\n{NODE_NAME_RE.pattern})*")


def all_node_names(names: Sequence[object]) -> bool:
    """True when every entry of ``names`` is a node name (:func:`is_node_name`; an empty list
    is). One regular-expression pass over the names joined by newlines instead of a call per
    name (SyncNodes carries the whole idle set, up to ``max_event_nodes``); a name that holds
    a newline itself is caught by counting them."""
    try:
        joined = "\n".join(names)  # type: ignore[arg-type]  (a non-str entry: TypeError)
    except TypeError:
        return False
    if not names:
        return True
    return joined.count("\n") == len(names) - 1 and _NODE_LINES_RE.fullmatch(joined) is not None

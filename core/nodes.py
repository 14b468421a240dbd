"""The node-name rule shared by the daemon and the Slurm hooks (standard library only, so the
hooks import it fast)."""

from __future__ import annotations

import re

#: A node name: letters, digits, ``.``, ``_``, ``-``; 1-128 characters, not starting with a
#: punctuation mark. The daemon rejects an event naming anything else (INVALID_ARGUMENT).
#: Match whole strings only (:func:`is_node_name`): ``$`` would also accept a trailing newline.
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_node_name(name: object) -> bool:
    """True when ``name`` is a string that is a node name as a whole (:data:`NODE_NAME_RE`)."""
    return isinstance(name, str) and NODE_NAME_RE.fullmatch(name) is not None

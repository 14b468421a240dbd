"""The node-name rule shared by the daemon and the Slurm hooks (standard library only, so the
hooks import it fast)."""

from __future__ import annotations

import re

#: A node name: letters, digits, ``.``, ``_``, ``-``; 1-128 characters, not starting with a
#: punctuation mark. The daemon rejects an event naming anything else (INVALID_ARGUMENT).
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

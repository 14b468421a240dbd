"""Upgrades of state files from one released format to the next (docs/architecture.md,
"Durability").

Format 4 is the first released format (Offcut 0.1.0; :data:`offcut.daemon.app.state_file.SCHEMA_VERSION`,
CHANGELOG.md). Files of the pre-release formats 1-3 are refused in one line
(:func:`offcut.daemon.app.state_file.format_refusal`); their upgrades are not carried.

When a release changes the format it raises ``SCHEMA_VERSION`` to N + 1 and registers here
the upgrade of a format-N file: ``UPGRADES[N] = upgrade_N_to_N1``, a function of the open
``sqlite3.Connection`` that rewrites the file in place. :class:`offcut.daemon.app.store.Store`
runs the registered upgrades one format at a time, each in its own transaction (an upgrade
that raises leaves the file as it was), after saving a copy of the file as
``<name>.format<N>.bak``, and stamps each step's format in ``meta``. Every format from
:data:`offcut.daemon.app.state_file.FIRST_RELEASED_FORMAT` up to ``SCHEMA_VERSION`` - 1 must have an
upgrade, or a file of it is refused (tests/test_state_upgrade.py shows the mechanism with a
synthetic format 5).
"""

from __future__ import annotations

from offcut.daemon.app.state_file import Upgrade

#: format N -> the upgrade of a format-N state file to format N + 1 (``Store(upgrades=...)``;
#: offcutd passes this registry). Empty: 4, the first released format, is still the newest.
UPGRADES: dict[int, Upgrade] = {}

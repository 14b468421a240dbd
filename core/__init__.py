"""Offcut: elastic DL training on the idle offcuts of a supercomputer's schedule.

Sub-packages: ``offcut.daemon`` (the gRPC daemon ``offcutd``), ``offcut.client`` (Python API and
the ``offcut`` CLI), ``offcut.replay`` (recorded-log replays), ``offcut.slurm_plugin`` (Slurm
hooks), ``offcut.v1`` (generated protocol code). This top package only holds what they share:
errors, addresses and the node-name rule.
"""

__version__ = "0.1.0"

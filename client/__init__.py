"""Python API (:class:`Client`) and the ``offcut`` command-line interface."""

from offcut.client.api import Client

__all__ = ["Client"]

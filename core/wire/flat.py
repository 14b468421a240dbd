"""The conversion of a flat form: a dataclass whose every field is a scalar that its
``offcut.v1`` message carries under the same name (Zeus's predictions, resumed trials,
verdicts, power plans and measurements, trials). Forms with nested, repeated, optional or
renamed fields keep their own conversion in :mod:`offcut.wire.tasks` / :mod:`offcut.wire.zeus`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["flat_from_pb", "flat_to_pb"]

V = TypeVar("V")


def flat_to_pb(view: Any, message_class: type) -> Any:
    """``message_class`` with each field of the dataclass ``view`` under its name. Raises
    ``ValueError`` (protobuf's) when the message has no field of that name."""
    return message_class(**{f.name: getattr(view, f.name) for f in dataclasses.fields(view)})


def flat_from_pb(message: Any, view_class: type[V]) -> V:
    """``view_class`` (a dataclass) with each of its fields read from ``message`` by name
    (unset scalars are protobuf's defaults). Raises ``AttributeError`` when the message has
    no field of that name."""
    return view_class(**{f.name: getattr(message, f.name)
                         for f in dataclasses.fields(view_class)})

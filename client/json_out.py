"""The one JSON form of every ``offcut ... --json`` output (docs/user-guide.md, "JSON output").

Rules, the same for tasks, placement updates and the status:

* field names as in the ``.proto`` files (``task_id``, ``rate_samples_per_s``);
* every field is present: an unset message or time is ``null``, an empty list ``[]``;
* enums are their value's name in lower case without the type's prefix
  (``TASK_STATE_RUNNING`` -> ``"running"``, ``PLACEMENT_CHANGE_GROW`` -> ``"grow"``), as
  ``offcut queue`` prints them;
* 64-bit integers (revisions, generations, sequence numbers) are JSON numbers, not strings;
* times are RFC 3339 strings in UTC (``2026-11-27T05:25:59.729419947Z``);
* the text is ASCII (:func:`json_text`): every control character and every non-ASCII
  character of a string is a ``\\uXXXX`` escape, so a task name or command holding an escape
  sequence reaches a terminal as inert text and a JSON reader gets it back exactly.

A command may add derived fields beside the message's (``offcut queue``: ``progress_pct``,
``progress_source``, ``progress_report_time`` and ``eta_s``; ``offcut status``:
``event_lag_s``), named in its ``--help``.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from offcut.wire.tasks import time_to_pb

__all__ = ["to_json", "enum_name", "json_text", "time_text"]


def json_text(doc: Any, indent: int | None = None) -> str:
    """``doc`` as the JSON text every ``--json`` output prints: ``json.dumps`` with
    ``ensure_ascii`` (module docstring: no raw control character, exact and valid JSON)."""
    return json.dumps(doc, indent=indent, ensure_ascii=True)


def time_text(t: float | None) -> str | None:
    """A time [s since epoch] as the JSON output writes it: RFC 3339 in UTC with the
    Timestamp's nanoseconds (``2026-11-27T05:25:59.729419947Z``); None for None."""
    return None if t is None else time_to_pb(t).ToJsonString()


def enum_name(enum_type, number: int) -> str:
    """The JSON name of enum value ``number``: its name without the type's prefix (the enum's
    name in UPPER_SNAKE plus ``_``), lower case; an unknown number is its decimal string."""
    value = enum_type.values_by_number.get(number)
    if value is None:
        return str(number)
    prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum_type.name).lstrip("_")
    return value.name.removeprefix(prefix + "_").lower()


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name == Timestamp.DESCRIPTOR.full_name:
            if value.seconds == 0 and value.nanos == 0:
                return None
            return value.ToJsonString()
        return to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_name(field.enum_type, value)
    return value


def to_json(msg: Message) -> dict[str, Any]:
    """``msg`` as a JSON-able dict by the module's rules."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _value(vfield, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not msg.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(field, value)
    return out

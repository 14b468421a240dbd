"""The one conversion between a task's spec (:class:`offcut.taskspec.TaskSpec`) and its wire
form (``offcut.v1.TaskSpec``), used by the daemon's gRPC edge (requests in, task replies out)
and by the client (what it sends, the views it returns) (docs/architecture.md, "Layers").

Values are checked once, by :meth:`TaskSpec.create` (the one validator): a message that breaks
a rule is :class:`offcut.errors.InvalidArgument` naming ``spec.<field>``. Units are the spec's:
node counts, samples, samples/s, s, W.
"""

from __future__ import annotations

import dataclasses

from offcut.taskspec import Limits, TaskSpec
from offcut.v1 import tasks_pb2

__all__ = ["SPEC_FIELDS", "spec_from_pb", "spec_to_pb", "spec_view_from_pb"]


#: the spec's fields, which ``offcut.v1.TaskSpec`` carries under the same names
#: (tests/test_spec_wire.py checks the two lists agree)
SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(TaskSpec))


def spec_to_pb(spec: TaskSpec) -> tasks_pb2.TaskSpec:
    """The ``offcut.v1.TaskSpec`` of ``spec``, field for field (no check: a :class:`TaskSpec`
    built by :meth:`TaskSpec.create` is valid)."""
    return tasks_pb2.TaskSpec(**{name: getattr(spec, name) for name in SPEC_FIELDS})


def _fields(msg: tasks_pb2.TaskSpec) -> dict:
    """The message's fields by the spec's names (its repeated fields as they are: the
    validator checks their sizes before it copies them)."""
    return {name: getattr(msg, name) for name in SPEC_FIELDS}


def spec_from_pb(msg: tasks_pb2.TaskSpec, limits: Limits | None = None) -> TaskSpec:
    """The validated :class:`TaskSpec` of a request's message: :meth:`TaskSpec.create` of its
    fields, within ``limits`` when given (the daemon passes its configured size limits;
    None: the value rules only).

    Raises:
        InvalidArgument: naming ``spec.<field>`` for the first rule (or limit) broken.
    """
    return TaskSpec.create(limits=limits, **_fields(msg))


def spec_view_from_pb(msg: tasks_pb2.TaskSpec) -> TaskSpec:
    """The spec of a task as a daemon answered it, field for field and unchecked: data to
    show (a daemon checked it when it was submitted; a hostile one's text is escaped where it
    is printed), unlike a request's spec, which :func:`spec_from_pb` validates."""
    return TaskSpec(**{k: tuple(v) if not isinstance(v, (str, int, float, bool)) else v
                       for k, v in _fields(msg).items()})

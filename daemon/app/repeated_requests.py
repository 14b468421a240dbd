"""Repeated requests: the journal's idempotency keys and the stored replies that answer a
repeat (docs/architecture.md, "Journal and snapshots" and "Recovery").

A node event is keyed by its ``(source, seq)``; an event with a ``request_id`` by
``[kind, caller, id]`` as JSON. The engine journals each applied event under its key with its
reply, and answers a repeat with that stored reply, flagged ``duplicate``, before anything is
validated or changed.
"""

from __future__ import annotations

import json

from offcut.daemon.app.model import (CancelEvent, EnergyEvent, Event, NodeEvent, ProgressEvent,
                                 SubmitEvent, TaskRunEvent)
from offcut.daemon.app.replies import Reply
from offcut.daemon.app.store import Store

#: the kind of each event that may carry a ``request_id`` (its idempotency namespace)
_REQUEST_KINDS = ((SubmitEvent, "submit"), (TaskRunEvent, "run"), (ProgressEvent, "progress"),
                  (CancelEvent, "cancel"), (EnergyEvent, "energy"))


def request_key(event: Event, caller: str) -> str | None:
    """The journal's idempotency key of an event with a ``request_id``: per caller and per
    kind (``["submit", caller, id]`` as JSON), so one caller's ids can never answer, block or
    reveal another's, and ids of different kinds never answer each other. None without one."""
    for cls, kind in _REQUEST_KINDS:
        if isinstance(event, cls) and event.request_id:
            return json.dumps([kind, caller, event.request_id], separators=(",", ":"))
    return None


def stored_reply(store: Store, event: Event, caller: str) -> Reply | None:
    """The journal's reply to ``event`` when it repeats one already applied (its
    ``(source, seq)``, or a request id ``caller`` sent before for this kind of event),
    flagged ``duplicate``; else None (call under the engine's lock)."""
    if isinstance(event, NodeEvent):
        stored = store.response_for_seq(event.source, event.seq)
        return _duplicate(stored) if stored is not None else None
    key = request_key(event, caller)
    if key is None:
        return None
    stored = store.response_for_request(key)
    return _duplicate(stored) if stored is not None else None


def _duplicate(stored: bytes) -> Reply:
    """A stored reply, flagged as the answer to a repeated request."""
    reply = Reply.from_record(stored)
    reply.duplicate = True
    return reply

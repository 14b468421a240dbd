"""Stored answers to request ids of the Zeus calls (docs/zeus.md, "Owners and request ids"):
their key, their stored form, and the check of a repeated power-window call.

The stored answer to a request id of Predict / ResumeTrial / DeleteJob / ReportWindow /
InterruptWindow is bound to (method, caller, job[, trial or batch size], request id)
(:func:`request_key`), so the same id from another caller, for another method, job, trial or
batch size is another request; a power-window call's id repeated with other arguments is
refused (:func:`check_repeat`). The answers are rows of ``zeus_requests``
(:class:`offcut.daemon.zeus.storage.ZeusStorage`), kept ``request_retention_s``.
"""

from __future__ import annotations

import json
from typing import Protocol

from offcut.zeus_views import Prediction, Resumed
from offcut.zeus_views import PowerPlan
from offcut.errors import InvalidArgument

#: the version of a stored answer (``zeus_requests.response``) written by this release:
#: ``{"format": 2, <the answer's fields>}`` (state-file format 4, the first released one)
ANSWER_FORMAT = 2


def stored_answer(answer: Prediction | Resumed | PowerPlan | None,
                  request: dict | None = None) -> bytes:
    """The stored form of an answer to a request with an id (format :data:`ANSWER_FORMAT`):
    the answer's fields (None: an empty answer, DeleteJob's) and, for the power-window calls,
    ``request``, the call's arguments outside its key (checked by :func:`check_repeat`)."""
    # (the answers' fields are scalars: their __dict__ is asdict's result, without its copying)
    fields = {} if answer is None else vars(answer)
    if request is not None:
        fields = {**fields, "request": request}
    return json.dumps({"format": ANSWER_FORMAT, **fields}, separators=(",", ":")).encode()


def stored_fields(stored: bytes) -> dict:
    """The answer's fields of :func:`stored_answer` (ValueError for another format)."""
    d = json.loads(bytes(stored).decode())
    if d.pop("format", None) != ANSWER_FORMAT:
        raise ValueError(f"stored Zeus answer is not of format {ANSWER_FORMAT}")
    return d


def check_repeat(method: str, stored: dict | None, request: dict) -> None:
    """A repeated request id must come with the arguments it was first used with
    (``stored``: those of :func:`stored_answer`; None: stored without, nothing to check).

    Raises:
        InvalidArgument: naming ``request_id``, with the first call's arguments.
    """
    if stored is not None and stored != request:
        first = ", ".join(f"{k} {v!r}" for k, v in stored.items())
        raise InvalidArgument(f"was used for another {method} ({first}); a new call needs a "
                              "new request id", "request_id")


class Caller(Protocol):
    """Who calls the registry (:class:`offcut.daemon.edge.auth.Principal` is one)."""

    @property
    def user(self) -> str: ...

    @property
    def is_admin(self) -> bool: ...


def request_key(method: str, who: Caller, job_id: str, *parts) -> str:
    """The key of a stored answer: JSON ``[method, caller's user, job, *parts]`` (``parts``:
    ResumeTrial's trial number or the power-window calls' batch size, then the request id).
    So the same request id from another caller, for another method, job, trial or batch size
    is another request, never the first answer."""
    return json.dumps([method, who.user, job_id, *parts], separators=(",", ":"))

"""Errors shared by the daemon and its clients.

The application raises these; each names the status the RPC edge answers with (``status``,
a gRPC status code name such as ``INVALID_ARGUMENT``). This module imports neither grpc nor
protobuf: the daemon's servicers map ``status`` to ``grpc.StatusCode`` (offcut.daemon.edge.service),
and clients turn a failed call back into one of these with :func:`from_rpc_error`.
"""

from __future__ import annotations

from typing import Any


class OffcutError(Exception):
    """Base class. ``status`` is the gRPC status name the daemon answers with; ``field`` names
    the offending request field where there is one (e.g. ``spec.max_nodes``), ``reason`` the
    message without it (the text is ``"<field>: <reason>"``).

    On an error received from the daemon (:func:`from_rpc_error`), ``code`` is the call's
    ``grpc.StatusCode`` and ``status`` its name; on an error raised locally ``code`` is None.
    """

    status: str = "INTERNAL"

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        self.reason = message
        self.code: Any = None
        super().__init__(f"{field}: {message}" if field else message)


class InvalidArgument(OffcutError):
    """The request is malformed (bad value, wrong shape); nothing was changed."""

    status = "INVALID_ARGUMENT"


class NotFound(OffcutError):
    """A named object (task id, job) does not exist."""

    status = "NOT_FOUND"


class FailedPrecondition(OffcutError):
    """The request is well-formed but not applicable in the current state (e.g. an event older
    than the last applied one, cancelling a completed task)."""

    status = "FAILED_PRECONDITION"


class AlreadyExists(OffcutError):
    """An object with this id exists with a different definition."""

    status = "ALREADY_EXISTS"


class PermissionDenied(OffcutError):
    """The caller's role does not allow this call."""

    status = "PERMISSION_DENIED"


class Unauthenticated(OffcutError):
    """No valid bearer token was sent (client side: configure ``$OFFCUT_TOKEN`` or a token
    file)."""

    status = "UNAUTHENTICATED"


class ResourceExhausted(OffcutError):
    """The caller holds as much of a shared resource as it may (e.g. open streams)."""

    status = "RESOURCE_EXHAUSTED"


class Unavailable(OffcutError):
    """The daemon cannot be reached (client side), or cannot serve now."""

    status = "UNAVAILABLE"


#: how an UNAVAILABLE raised by the daemon itself (e.g. its state cannot be written:
#: offcut.daemon.app.storage_errors) begins, so a client tells it from a daemon it cannot reach
DAEMON_SAYS = "offcutd: "

_BY_STATUS = {cls.status: cls for cls in (InvalidArgument, NotFound, FailedPrecondition,
                                          AlreadyExists, PermissionDenied, Unauthenticated,
                                          ResourceExhausted, Unavailable)}


def from_rpc_error(err: Any) -> OffcutError:
    """Turn a failed call (a ``grpc.RpcError`` raised by a stub: ``code()``, ``details()``)
    into the matching :class:`OffcutError`; ``code`` keeps the call's ``grpc.StatusCode``."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    status = getattr(code, "name", None) or "UNKNOWN"
    cls = _BY_STATUS.get(status, OffcutError)
    exc = cls(details or status)
    exc.code = code
    exc.status = status
    return exc

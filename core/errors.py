"""Errors shared by the daemon and its clients; each maps to one gRPC status code."""

from __future__ import annotations

import grpc


class OffcutError(Exception):
    """Base class. ``code`` is the gRPC status the daemon answers with; ``field`` names the
    offending request field where there is one (e.g. ``spec.max_nodes``)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class InvalidArgument(OffcutError):
    """The request is malformed (bad value, wrong shape); nothing was changed."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(OffcutError):
    """A named object (task id, job) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(OffcutError):
    """The request is well-formed but not applicable in the current state (e.g. an event older
    than the last applied one, cancelling a completed task)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(OffcutError):
    """An object with this id exists with a different definition."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(OffcutError):
    """The caller's role does not allow this call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(OffcutError):
    """No valid bearer token was sent (client side: configure ``$OFFCUT_TOKEN`` or a token
    file)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(OffcutError):
    """The daemon cannot be reached (client side)."""

    code = grpc.StatusCode.UNAVAILABLE


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, FailedPrecondition,
                                      AlreadyExists, PermissionDenied, Unauthenticated,
                                      Unavailable)}


def from_rpc_error(err: grpc.RpcError) -> OffcutError:
    """Turn a ``grpc.RpcError`` raised by a stub into the matching :class:`OffcutError`."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, OffcutError)
    exc = cls(details or code.name)
    exc.code = code
    return exc

"""How a client reaches the daemon: a bearer token (docs/architecture.md §8) and TLS for TCP.

Sources, first found wins: the ``token`` argument, ``$OFFCUT_TOKEN``, the file named by
``token_file`` or ``$OFFCUT_TOKEN_FILE`` (first line; the file must be private, mode 0600).
TLS: ``tls_ca`` or ``$OFFCUT_TLS_CA`` (PEM of the CA or self-signed certificate to trust);
``tls_server_name`` (``$OFFCUT_TLS_SERVER_NAME``) when the certificate's name differs from the
address's host. Tokens are sent as ``authorization: Bearer TOKEN`` metadata on every call
and are never put in error messages.
"""

from __future__ import annotations

import collections
import os
import stat
from pathlib import Path

import grpc

from offcut.errors import InvalidArgument


def resolve_token(token: str | None = None, token_file: str | None = None) -> str | None:
    """The token to send (None: none configured).

    Raises:
        InvalidArgument: the token file is missing, empty or readable by others (``token_file``).
    """
    token = token or os.environ.get("OFFCUT_TOKEN")
    if token:
        return token.strip()
    path = token_file or os.environ.get("OFFCUT_TOKEN_FILE")
    if not path:
        return None
    try:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise InvalidArgument(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; chmod 600 it",
                                  "token_file")
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc.strerror}", "token_file") from None
    if not text:
        raise InvalidArgument(f"{path} is empty", "token_file")
    return text.splitlines()[0].strip()


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer TOKEN`` to every call of a channel."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def __repr__(self) -> str:  # never show the token
        return "BearerToken(***)"

    def _details(self, d):
        metadata = list(d.metadata or []) + [self._header]
        return _Details(d.method, d.timeout, metadata, d.credentials,
                        getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def open_channel(address: str, *, token: str | None = None, tls_ca: str | None = None,
                 tls_server_name: str | None = None, options: list | None = None) -> grpc.Channel:
    """A channel to ``address``: TLS when a CA is configured (argument or
    ``$OFFCUT_TLS_CA``), with the bearer token when one is given.

    Raises:
        InvalidArgument: the CA file cannot be read (``tls_ca``).
    """
    options = list(options or [])
    tls_ca = tls_ca or os.environ.get("OFFCUT_TLS_CA")
    server_name = tls_server_name or os.environ.get("OFFCUT_TLS_SERVER_NAME")
    if tls_ca:
        try:
            root = Path(tls_ca).read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {tls_ca}: {exc.strerror}", "tls_ca") from None
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=root),
                                      options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if token:
        channel = grpc.intercept_channel(channel, BearerToken(token))
    return channel

"""How every client reaches the daemon (the Python API and CLI, the Slurm hooks, watcher and
launcher): a channel with TLS for TCP and a bearer token (docs/architecture.md, "Security").

Sources of the token, first found wins: the ``token`` argument, ``$OFFCUT_TOKEN``, the file
named by ``token_file`` or ``$OFFCUT_TOKEN_FILE`` (:func:`token_from_file`: first line, one
word; the file must be private, mode 0600).
TLS: ``tls_ca`` or ``$OFFCUT_TLS_CA`` (PEM of the CA or self-signed certificate to trust);
``tls_server_name`` (``$OFFCUT_TLS_SERVER_NAME``) when the certificate's name differs from the
address's host. Tokens are sent as ``authorization: Bearer TOKEN`` metadata on every call
and are never put in error messages.

A token goes only where only the daemon can listen: over TLS (the daemon proves its
certificate) or a unix socket (its folder checked: :func:`offcut.addresses.untrusted_socket`).
A TCP address without TLS (loopback included: any local process that takes the port, e.g.
while offcutd restarts, would receive the token) or an abstract unix socket (any local
process can bind its name) is refused with :class:`InvalidArgument` naming the address, unless
``insecure_token`` (``$OFFCUT_INSECURE_TOKEN=1``) accepts the risk
(:func:`insecure_token_refusal`; docs/security.md, "Round two: sockets and tokens").

Without a token, a client identifies its user with MUNGE as Slurm does (:mod:`offcut.munge`):
when munged's socket (``$OFFCUT_MUNGE_SOCKET``, else ``/run/munge/munge.socket.2``) exists,
every call carries a fresh credential bound to that call (``authorization: MUNGE CRED``,
:class:`MungeCredential`); a daemon with ``munge = true`` takes the uid from it, one without
ignores it.
"""

from __future__ import annotations

import collections
import os
import stat
from pathlib import Path

import grpc

from offcut import munge
from offcut.addresses import unix_socket_path, untrusted_socket
from offcut.errors import InvalidArgument, Unavailable


def token_from_file(path: str, field: str = "token_file") -> str:
    """The bearer token in the file ``path``: its first line, one word. The file must be
    private (no access for group or others).

    Raises:
        InvalidArgument: naming ``field``: the file is missing, unreadable, readable by others,
            empty, or its first line is not one word. The message never holds the token.
    """
    try:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise InvalidArgument(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; chmod 600 it",
                                  field)
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc.strerror}", field) from None
    token = text.splitlines()[0].strip() if text else ""
    if not token or any(c.isspace() for c in token):
        raise InvalidArgument(f"{path} holds no single-word token on its first line", field)
    return token


#: the environment variable that lets a token travel over TCP without TLS
#: (:func:`insecure_token_refusal`): ``1``, ``true`` or ``yes``
INSECURE_TOKEN_ENV = "OFFCUT_INSECURE_TOKEN"


def insecure_token_wanted(insecure_token: bool | None = None) -> bool:
    """``insecure_token`` when given, else whether ``$OFFCUT_INSECURE_TOKEN`` is ``1``,
    ``true`` or ``yes`` (any case)."""
    if insecure_token is not None:
        return bool(insecure_token)
    return os.environ.get(INSECURE_TOKEN_ENV, "").strip().lower() in ("1", "true", "yes")


def insecure_token_refusal(address: str, tls: bool) -> str | None:
    """Why a bearer token must not be sent to ``address`` (None: it may): a TCP address
    without TLS, or an abstract unix socket; the message names the address and the ways out.
    Never holds the token."""
    if tls or unix_socket_path(address) is not None:
        return None
    kind = ("an abstract unix socket (any local process can bind its name)"
            if address.startswith("unix-abstract:") else
            "TCP without TLS (any local process that takes the port, e.g. while offcutd "
            "restarts, would receive it)")
    return (f"refusing to send the token to {address}: {kind}; use the daemon's unix socket, "
            "or TLS (tls_ca: --tls-ca, $OFFCUT_TLS_CA, the daemon's CA), or accept the risk "
            f"with insecure_token (--insecure-token, ${INSECURE_TOKEN_ENV}=1)")


def resolve_token(token: str | None = None, token_file: str | None = None) -> str | None:
    """The token to send (None: none configured), from the sources in the module docstring.

    Raises:
        InvalidArgument: the token file is unusable (:func:`token_from_file`, ``token_file``).
    """
    token = token or os.environ.get("OFFCUT_TOKEN")
    if token:
        return token.strip()
    path = token_file or os.environ.get("OFFCUT_TOKEN_FILE")
    return token_from_file(path) if path else None


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class _Authorization(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                     grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the ``authorization`` metadata of :meth:`header` to every call of a channel."""

    def header(self, method: str) -> tuple[str, str]:
        """``("authorization", VALUE)`` for a call of ``method`` (full gRPC name)."""
        raise NotImplementedError

    def _details(self, d):
        method = d.method.decode() if isinstance(d.method, bytes) else d.method
        metadata = list(d.metadata or []) + [self.header(method)]
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


class BearerToken(_Authorization):
    """Adds ``authorization: Bearer TOKEN`` to every call of a channel."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def __repr__(self) -> str:  # never show the token
        return "BearerToken(***)"

    def header(self, method: str) -> tuple[str, str]:
        """The same header on every call."""
        return self._header


class MungeCredential(_Authorization):
    """Adds ``authorization: MUNGE CRED`` to every call of a channel: a new credential per
    call (munged accepts each once), its payload the call's method
    (:func:`offcut.munge.call_payload`), decodable only by ``decoder_uid`` when given (the
    unix socket's owner: the daemon's user).

    Args:
        socket: munged's socket (:func:`offcut.munge.socket_path`).
        decoder_uid: the only uid that may decode the credentials (None: any).

    A call raises :class:`offcut.errors.Unavailable` (field ``munge_socket``) when munged
    does not answer.
    """

    def __init__(self, socket: str | None = None, decoder_uid: int | None = None):
        self.socket = munge.socket_path(socket)
        self.decoder_uid = decoder_uid

    def header(self, method: str) -> tuple[str, str]:
        """A fresh credential for ``method``."""
        try:
            credential = munge.encode(munge.call_payload(method), socket=self.socket,
                                      decoder_uid=self.decoder_uid)
        except munge.MungeError as exc:
            raise Unavailable(f"cannot make a MUNGE credential with munged at {self.socket}: "
                              f"{exc}", "munge_socket") from None
        return ("authorization", f"MUNGE {credential}")


def munge_socket_if_running(socket: str | None = None) -> str | None:
    """munged's socket (:func:`offcut.munge.socket_path`) when it exists and libmunge loads,
    else None: the test a client makes before identifying itself with MUNGE."""
    path = munge.socket_path(socket)
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    return path if munge.available() is None else None


def open_channel(address: str, *, token: str | None = None, tls_ca: str | None = None,
                 tls_server_name: str | None = None, options: list | None = None,
                 munge_socket: str | None = None,
                 insecure_token: bool | None = None) -> grpc.Channel:
    """A channel to ``address``: TLS when a CA is configured (argument or
    ``$OFFCUT_TLS_CA``), with the bearer token when one is given, else with a MUNGE
    credential per call when munged runs here (``munge_socket``, see
    :func:`munge_socket_if_running`).

    Args:
        insecure_token: send ``token`` over TCP without TLS all the same (None:
            ``$OFFCUT_INSECURE_TOKEN``; :func:`insecure_token_refusal`).

    Raises:
        InvalidArgument: the CA file cannot be read (``tls_ca``); a unix socket whose folder
            another user could have planted (``address``; :func:`offcut.addresses.untrusted_socket`);
            a token for a TCP address without TLS or an abstract socket, unless
            ``insecure_token`` (``address``; :func:`insecure_token_refusal`). Nothing is sent
            then: no connection is made.
    """
    socket = unix_socket_path(address)
    if socket is not None:
        reason = untrusted_socket(socket)
        if reason:
            raise InvalidArgument(f"refusing to connect to {socket}: {reason}", "address")
    options = list(options or [])
    tls_ca = tls_ca or os.environ.get("OFFCUT_TLS_CA")
    if token and not insecure_token_wanted(insecure_token):
        refusal = insecure_token_refusal(address, bool(tls_ca))
        if refusal:
            raise InvalidArgument(refusal, "address")
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
        return grpc.intercept_channel(channel, BearerToken(token))
    munged = munge_socket_if_running(munge_socket)
    if munged is not None:
        owner = None
        if socket is not None:
            try:
                owner = os.stat(socket).st_uid
            except OSError:
                owner = None  # (no socket yet: the call fails as UNAVAILABLE anyway)
        channel = grpc.intercept_channel(channel, MungeCredential(munged, owner))
    return channel

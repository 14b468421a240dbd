"""MUNGE credentials (https://dun.github.io/munge/), as Slurm uses them to identify local users:
a credential made by ``munged`` on any node of a cluster proves the uid and gid of the process
that asked for it to every node sharing the cluster's key, needs no per-user set-up, expires
after its time-to-live (munged's default 300 s) and is accepted once: ``munged`` keeps a replay
cache, so a second decode of the same credential fails (:data:`REPLAYED`).

Offcut binds a credential to one call: its payload is ``offcut:`` + the full gRPC method name
(:func:`call_payload`), so a credential made for one call (or for anything else: a Slurm
job's) is refused for another (docs/security.md, "Threat model"). The client sends it as
``authorization: MUNGE CRED`` (:class:`offcut.channel.MungeCredential`); the daemon decodes it
(:class:`offcut.daemon.edge.auth.Authenticator`).

This module talks to ``libmunge.so.2`` (package ``libmunge2``; the ``munge`` package brings it
and ``munged``) through :mod:`ctypes`: no compiled extension, and the calls release the GIL
while ``munged`` answers. Without the library, :func:`available` says why and every other call
raises :class:`MungeUnavailable`. :mod:`ctypes` is imported on first use (a Slurm hook that
sends with a token never pays for it).
"""

from __future__ import annotations

import os
import threading

#: ``munge_err_t`` codes (munge.h) a caller may want to tell apart
SOCKET, BAD_CRED, CRED_INVALID, EXPIRED, REWOUND, REPLAYED, UNAUTHORIZED = 6, 8, 14, 15, 16, 17, 18
_OPT_SOCKET, _OPT_UID_RESTRICTION = 8, 9  # munge_opt_t
#: where munged listens unless told otherwise (Debian, RHEL: ``--localstatedir=/var`` with
#: ``/var/run`` a link to ``/run``)
DEFAULT_SOCKET = "/run/munge/munge.socket.2"
#: the environment variable naming munged's socket for Offcut's clients and hooks
SOCKET_ENV = "OFFCUT_MUNGE_SOCKET"
#: longest credential accepted for decoding [characters]; a credential of Offcut's payloads is
#: about 150-250 (base64 of a ~100-byte payload plus MUNGE's header, salt and MAC)
MAX_CREDENTIAL_CHARS = 4096
#: the prefix of every credential's payload (:func:`call_payload`)
PAYLOAD_PREFIX = "offcut:"


class MungeError(Exception):
    """A MUNGE call failed: ``code`` is libmunge's error number (:data:`REPLAYED`,
    :data:`EXPIRED` ...), the message libmunge's text for it."""

    def __init__(self, code: int, message: str):
        self.code = code
        super().__init__(message)


class MungeUnavailable(MungeError):
    """``libmunge.so.2`` cannot be loaded (MUNGE is not installed on this host)."""

    def __init__(self, message: str):
        super().__init__(-1, message)


class _Lib:
    """libmunge's functions with their C signatures (loaded once, on first use)."""

    def __init__(self):
        import ctypes

        name = "libmunge.so.2"  # the soname (ctypes.util.find_library would run ldconfig)
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise MungeUnavailable(f"MUNGE is not installed here ({name}: {exc}); install the "
                                   "munge package (Debian: apt install munge)") from None
        self.free = ctypes.CDLL(None).free  # the C library's, already in the process
        self.free.argtypes, self.free.restype = [ctypes.c_void_p], None
        self.ctx_create = lib.munge_ctx_create
        self.ctx_create.argtypes, self.ctx_create.restype = [], ctypes.c_void_p
        self.ctx_destroy = lib.munge_ctx_destroy
        self.ctx_destroy.argtypes, self.ctx_destroy.restype = [ctypes.c_void_p], None
        self.ctx_strerror = lib.munge_ctx_strerror
        self.ctx_strerror.argtypes, self.ctx_strerror.restype = [ctypes.c_void_p], ctypes.c_char_p
        self.strerror = lib.munge_strerror
        self.strerror.argtypes, self.strerror.restype = [ctypes.c_int], ctypes.c_char_p
        # munge_ctx_set is variadic: its value's type is given per call (argtypes stay unset)
        self.ctx_set = lib.munge_ctx_set
        self.ctx_set.restype = ctypes.c_int
        self.encode = lib.munge_encode
        self.encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p,
                                ctypes.c_char_p, ctypes.c_int]
        self.encode.restype = ctypes.c_int
        self.decode = lib.munge_decode
        self.decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint32),
                                ctypes.POINTER(ctypes.c_uint32)]
        self.decode.restype = ctypes.c_int


_lib: _Lib | None = None
_lib_error: MungeUnavailable | None = None
_lib_lock = threading.Lock()


def _library() -> _Lib:
    global _lib, _lib_error
    with _lib_lock:
        if _lib is None and _lib_error is None:
            try:
                _lib = _Lib()
            except MungeUnavailable as exc:
                _lib_error = exc
        if _lib_error is not None:
            raise _lib_error
        return _lib


def available() -> str | None:
    """None when libmunge loads, else why not (a sentence)."""
    try:
        _library()
    except MungeUnavailable as exc:
        return str(exc)
    return None


def socket_path(socket: str | None = None) -> str:
    """munged's socket: ``socket``, else ``$OFFCUT_MUNGE_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def call_payload(method: str) -> bytes:
    """The payload that binds a credential to one call: ``offcut:/pkg.Service/Method``."""
    return (PAYLOAD_PREFIX + method).encode("utf-8")


class _Context:
    """A libmunge context on ``socket`` (created and destroyed per call: a context must not be
    shared between threads, and creating one costs no round trip)."""

    def __init__(self, lib: _Lib, socket: str):
        import ctypes

        self.lib = lib
        self.ctx = lib.ctx_create()
        if not self.ctx:
            raise MungeError(5, "libmunge could not create a context (out of memory)")
        self._check(lib.ctx_set(ctypes.c_void_p(self.ctx), ctypes.c_int(_OPT_SOCKET),
                                ctypes.c_char_p(os.fsencode(socket))))

    def _check(self, code: int) -> None:
        if code:
            detail = self.lib.ctx_strerror(self.ctx) or self.lib.strerror(code)
            raise MungeError(code, detail.decode("utf-8", "replace"))

    def __enter__(self) -> "_Context":
        return self

    def __exit__(self, *exc) -> None:
        self.lib.ctx_destroy(self.ctx)


def encode(payload: bytes = b"", *, socket: str | None = None,
           decoder_uid: int | None = None) -> str:
    """A new credential of this process's uid and gid carrying ``payload``.

    Args:
        payload: bytes sealed into the credential (:func:`call_payload` for an Offcut call).
        socket: munged's socket (:func:`socket_path`).
        decoder_uid: only a process of this uid may decode it (None: any).

    Raises:
        MungeUnavailable: libmunge is missing.
        MungeError: munged did not answer (:data:`SOCKET`: not running, or another socket) or
            refused.
    """
    import ctypes

    lib = _library()
    with _Context(lib, socket_path(socket)) as ctx:
        if decoder_uid is not None:
            ctx._check(lib.ctx_set(ctypes.c_void_p(ctx.ctx), ctypes.c_int(_OPT_UID_RESTRICTION),
                                   ctypes.c_uint32(decoder_uid)))
        cred = ctypes.c_char_p()
        code = lib.encode(ctypes.byref(cred), ctx.ctx, payload, len(payload))
        try:
            ctx._check(code)
            return cred.value.decode("ascii")
        finally:
            if cred:
                lib.free(ctypes.cast(cred, ctypes.c_void_p))


def decode(credential: str, *, socket: str | None = None) -> tuple[int, int, bytes]:
    """``(uid, gid, payload)`` of a valid credential, which munged then remembers as used.

    Raises:
        MungeUnavailable: libmunge is missing.
        MungeError: with ``code`` :data:`REPLAYED` (decoded before), :data:`EXPIRED` (older
            than its time-to-live), :data:`REWOUND` (made in the future: clocks differ),
            :data:`CRED_INVALID` / :data:`BAD_CRED` (forged, damaged, or of another key),
            :data:`UNAUTHORIZED` (made for another decoder), :data:`SOCKET` (munged not
            reachable); also a credential longer than :data:`MAX_CREDENTIAL_CHARS` or not
            ASCII (:data:`BAD_CRED`, munged not asked).
    """
    if len(credential) > MAX_CREDENTIAL_CHARS or not credential.isascii():
        raise MungeError(BAD_CRED, "not a MUNGE credential (too long or not ASCII)")
    import ctypes

    lib = _library()
    with _Context(lib, socket_path(socket)) as ctx:
        buf, length = ctypes.c_void_p(), ctypes.c_int()
        uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
        code = lib.decode(credential.encode("ascii"), ctx.ctx, ctypes.byref(buf),
                          ctypes.byref(length), ctypes.byref(uid), ctypes.byref(gid))
        try:
            payload = ctypes.string_at(buf, length.value) if buf else b""
        finally:
            if buf:
                lib.free(buf)
        ctx._check(code)
        return uid.value, gid.value, payload

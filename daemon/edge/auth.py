"""Authentication and roles (docs/architecture.md, "Security").

Bearer tokens in the ``authorization`` metadata (``Bearer TOKEN``) map to a user and a role:

* ``admin``: everything (node events, every task, run reports, history export);
* ``slurm``: Slurm's side (the prolog/epilog hooks, the watcher, the launcher): node events,
  run reports, and reading every user's tasks, placements and the status; nothing else (no
  submissions, cancellations, progress reports, history export or Zeus calls);
* ``user``: submit tasks as themselves, see, watch and cancel only their own tasks, the
  Zeus optimizers, and an aggregate status (no node names, no other users' placements).

Which role may call which method is the explicit allow-list :data:`METHOD_ROLES`: a method
not listed there (a new RPC) is refused to ``slurm`` and ``user`` until it is listed.

The tokens file (``tokens_file`` in offcut.toml) is TOML with one ``[[tokens]]`` table per
token, storing only its SHA-256, never the token::

    [[tokens]]
    user = "alice"
    role = "user"
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

``offcut token new --user alice --role user --tokens-file FILE`` adds one and prints the
token once (``--role slurm`` for the hooks, the watcher and the launcher). The file must be
readable by its owner only (mode 0600 or stricter), else the daemon refuses to start. Without
a tokens file every caller is ``admin``: the unix socket's 0600 mode is then the only guard.

Unauthenticated calls get ``UNAUTHENTICATED``; a role that may not make a call gets
``PERMISSION_DENIED``; another user's task is ``NOT_FOUND`` (its existence is not leaked).
Tokens never appear in logs or error messages. The health service stays open.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from offcut.daemon.edge.handlers import SYNC, behavior_of, kind_of, rebuild, refusal
from offcut.errors import Unauthenticated
from offcut.munge import PAYLOAD_PREFIX
from offcut.toml_file import TomlFileError, read_toml

if TYPE_CHECKING:
    from offcut.daemon.edge.munge_auth import MungeIdentity

ADMIN, SLURM, USER = "admin", "slurm", "user"
ROLES = (ADMIN, SLURM, USER)

_ADMIN = frozenset({ADMIN})
_NODE_SIDE = frozenset({ADMIN, SLURM})   # Slurm's reports
_USERS = frozenset({ADMIN, USER})        # acting on tasks and Zeus jobs
_READERS = frozenset(ROLES)              # reads (service.py limits what a user sees)

#: The allow-list: full gRPC method name -> the roles that may call it (docs/architecture.md,
#: "Security"). ``admin`` may call everything, listed or not; a method missing here is refused to
#: every other role (tests/test_auth.py checks that every offcut.v1 method is listed). ``slurm``
#: gets what slurm_plugin/ calls: ReportNodes/SyncNodes (hooks, watcher), ReportTaskRun, ListTasks,
#: WatchPlacements and GetStatus (its revision) (launcher), plus GetTask (one task: a subset of
#: ListTasks, for an operator's checks with the same token).
METHOD_ROLES: dict[str, frozenset[str]] = {
    "/offcut.v1.NodeEvents/ReportNodes": _NODE_SIDE,
    "/offcut.v1.NodeEvents/SyncNodes": _NODE_SIDE,
    "/offcut.v1.NodeEvents/StreamNodes": _NODE_SIDE,
    "/offcut.v1.Tasks/SubmitTask": _USERS,
    "/offcut.v1.Tasks/GetTask": _READERS,
    "/offcut.v1.Tasks/ListTasks": _READERS,
    "/offcut.v1.Tasks/CancelTask": _USERS,
    "/offcut.v1.Tasks/WatchPlacements": _READERS,
    "/offcut.v1.Tasks/ReportTaskRun": _NODE_SIDE,
    "/offcut.v1.Tasks/ReportProgress": _USERS,
    "/offcut.v1.Tasks/ReportEnergy": _USERS,   # every process of a task, as its owner
    "/offcut.v1.Status/GetStatus": _READERS,
    "/offcut.v1.Status/ExportHistory": _ADMIN,
    "/offcut.v1.BatchSizeOptimizer/RegisterJob": _USERS,
    "/offcut.v1.BatchSizeOptimizer/Predict": _USERS,
    "/offcut.v1.BatchSizeOptimizer/ReportEpoch": _USERS,
    "/offcut.v1.BatchSizeOptimizer/EndTrial": _USERS,
    "/offcut.v1.BatchSizeOptimizer/ResumeTrial": _USERS,
    "/offcut.v1.BatchSizeOptimizer/DeleteJob": _USERS,
    "/offcut.v1.BatchSizeOptimizer/GetJob": _USERS,
    "/offcut.v1.PowerLimitOptimizer/GetPowerPlan": _USERS,
    "/offcut.v1.PowerLimitOptimizer/ReportWindow": _USERS,
    "/offcut.v1.PowerLimitOptimizer/InterruptWindow": _USERS,
    "/offcut.v1.PowerLimitOptimizer/GetProfile": _USERS,
    # server reflection (grpcurl): the schema only; Slurm's side does not use it
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": _USERS,
}
#: services that need no token at all
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


class TokensFileError(ValueError):
    """The tokens file is unreadable, malformed, or readable by others."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: ``user`` name and ``role`` (``admin`` | ``slurm`` | ``user``)."""

    user: str
    role: str

    @property
    def is_admin(self) -> bool:
        """True for the admin role."""
        return self.role == ADMIN

    @property
    def sees_all_tasks(self) -> bool:
        """True for the roles whose reads show every user's tasks and placements and the full
        status (admin, and slurm: the launcher runs every user's tasks)."""
        return self.role in (ADMIN, SLURM)

    def may_call(self, method: str) -> bool:
        """Whether this role may call the full gRPC method name ``method``
        (:data:`METHOD_ROLES`; admins everything)."""
        return self.role == ADMIN or self.role in METHOD_ROLES.get(method, ())


#: the caller when the daemon has no tokens file
LOCAL_ADMIN = Principal("local", ADMIN)

#: ``(authenticator, Principal)`` as :class:`AuthInterceptor` resolved them for the running
#: call, so that the handler's :meth:`Authenticator.of` takes the caller from here instead of
#: hashing the token again. ``grpc.aio`` runs a call's interceptors and its asyncio behaviour
#: in the call's own task, whose context holds the value; a plain behaviour runs on a worker
#: thread, which gets a copy of that context (:func:`_in_call_context`). Nothing else sets it,
#: so a value found is always the running call's; without one (no interceptor ran), ``of``
#: resolves the metadata itself.
_RESOLVED: contextvars.ContextVar[tuple["Authenticator", Principal]] = \
    contextvars.ContextVar("offcut_auth_resolved")


def token_digest(token: str) -> str:
    """SHA-256 hex digest of a token (what the tokens file stores)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_private(path: Path) -> None:
    """Raise :class:`TokensFileError` unless ``path`` is a regular file that only its owner
    may read or write (and that owner is this process's user or root)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise TokensFileError(f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TokensFileError(f"{path} is not a regular file")
    if st.st_mode & 0o077:
        raise TokensFileError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read "
                              f"it; chmod 600 {path}")
    if st.st_uid not in (os.geteuid(), 0):
        raise TokensFileError(f"{path} is owned by uid {st.st_uid}, not by this user")


def _valid_user(user) -> bool:
    """A user name is 1-200 printable characters."""
    return isinstance(user, str) and 0 < len(user) <= 200 and user.isprintable()


def load_tokens(path: str | Path) -> dict[str, Principal]:
    """``{sha256: Principal}`` from a tokens file.

    Raises:
        TokensFileError: permissions (see :func:`check_private`), TOML syntax, a missing or
            bad ``user``/``role``/``sha256``, or a digest listed twice.
    """
    path = Path(path)
    check_private(path)
    try:
        doc = read_toml(path, "tokens file")
    except TomlFileError as exc:
        raise TokensFileError(str(exc)) from None
    entries = doc.get("tokens", [])
    if not isinstance(entries, list):
        raise TokensFileError(f"{path}: 'tokens' must be an array of tables ([[tokens]])")
    unknown = set(doc) - {"tokens"}
    if unknown:
        raise TokensFileError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    out: dict[str, Principal] = {}
    for i, e in enumerate(entries, start=1):
        where = f"{path}: token {i}"
        if not isinstance(e, dict):
            raise TokensFileError(f"{where}: not a table")
        user, role, digest = e.get("user"), e.get("role"), e.get("sha256")
        if not _valid_user(user):
            raise TokensFileError(f"{where}: user must be 1-200 printable characters")
        if role not in ROLES:
            raise TokensFileError(f"{where}: role must be one of {', '.join(ROLES)}")
        if not (isinstance(digest, str) and len(digest) == 64
                and all(c in "0123456789abcdef" for c in digest)):
            raise TokensFileError(f"{where}: sha256 must be 64 lower-case hex digits")
        if digest in out:
            raise TokensFileError(f"{where}: the same token is listed twice")
        out[digest] = Principal(user, role)
    return out


def add_token(path: str | Path, user: str, role: str) -> str:
    """Create a random token for ``user`` with ``role``, append its digest to the tokens file
    (created with mode 0600 if missing) and return the token (shown once, stored nowhere).

    Raises:
        TokensFileError: bad role/user, or an existing file that :func:`load_tokens` refuses.
    """
    path = Path(path)
    if role not in ROLES:
        raise TokensFileError(f"role must be one of {', '.join(ROLES)}")
    if not _valid_user(user) or '"' in user or "\\" in user:  # (written into TOML as is)
        raise TokensFileError("user must be 1-200 printable characters without quotes")
    if path.exists():
        load_tokens(path)  # refuses a file readable by others or malformed
    token = secrets.token_urlsafe(32)
    entry = f'\n[[tokens]]\nuser = "{user}"\nrole = "{role}"\nsha256 = "{token_digest(token)}"\n'
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(entry)
    load_tokens(path)
    return token


def authorization(metadata, scheme: str) -> str | None:
    """The value of the first ``authorization: SCHEME VALUE`` metadata entry of ``scheme``
    (compared case-insensitively, as HTTP does), None if absent."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            given, _, credential = value.partition(" ")
            if given.lower() == scheme and credential.strip():
                return credential.strip()
    return None


def bearer_token(metadata) -> str | None:
    """The token of an ``authorization: Bearer TOKEN`` metadata entry (None if absent)."""
    return authorization(metadata, "bearer")


def munge_credential(metadata) -> str | None:
    """The credential of an ``authorization: MUNGE CRED`` metadata entry (None if absent)."""
    return authorization(metadata, "munge")


class Authenticator:
    """Resolves callers: ``tokens`` (``{sha256: Principal}``, from :func:`load_tokens`) and/or
    ``munge`` (MUNGE credentials, :class:`offcut.daemon.edge.munge_auth.MungeIdentity`); with
    neither, authentication is off and every caller is :data:`LOCAL_ADMIN`."""

    def __init__(self, tokens: dict[str, Principal] | None, munge: "MungeIdentity | None" = None):
        self.tokens = tokens
        self.munge = munge

    @property
    def enabled(self) -> bool:
        """Whether callers must prove who they are (a token or a MUNGE credential)."""
        return self.tokens is not None or self.munge is not None

    @property
    def wanted(self) -> str:
        """What a caller must send, in words (for the UNAUTHENTICATED message)."""
        ways = ([f"a MUNGE credential (authorization: MUNGE CRED, made by munge for "
                 f"'{PAYLOAD_PREFIX}' + the method)"] if self.munge is not None else []) \
            + (["a valid bearer token (authorization: Bearer TOKEN)"]
               if self.tokens is not None else [])
        return " or ".join(ways) + " is required"

    def principal(self, metadata, method: str = "") -> Principal | None:
        """The caller of a call of ``method`` (full gRPC name) with this metadata (``(key,
        value)`` pairs); None when it proves nobody (no or an unknown token, no credential).

        A token costs one SHA-256 and one dict lookup by the digest. The lookup's timing can
        tell an attacker at most something about the stored digests, never a token (SHA-256
        is preimage resistant), so no constant-time scan over all tokens is needed. A MUNGE
        credential is decoded by munged (blocking; the interceptor uses
        :meth:`principal_async`).

        Raises:
            offcut.errors.Unauthenticated: a MUNGE credential that is refused (the message
                says why: replayed, expired, another call's, an unknown uid).
        """
        if not self.enabled:
            return LOCAL_ADMIN
        credential = munge_credential(metadata) if self.munge is not None else None
        if credential is not None:
            return self.munge.principal(credential, method)
        token = bearer_token(metadata) if self.tokens is not None else None
        if token is None:
            return None
        return self.tokens.get(token_digest(token))

    async def principal_async(self, metadata, method: str) -> Principal | None:
        """:meth:`principal` for the event loop: a MUNGE credential is decoded on the
        decoding threads, a token at once."""
        credential = munge_credential(metadata) if self.munge is not None else None
        if credential is not None:
            return await self.munge.principal_async(credential, method)
        return self.principal(metadata, method)

    def of(self, context) -> Principal:
        """The caller of a running call (the interceptor has already refused anonymous ones):
        the one the interceptor resolved for this very call, else resolved from the call's
        metadata.

        Raises:
            offcut.errors.Unauthenticated: there is no valid token (cannot happen behind the
                interceptor; refused rather than assumed).
        """
        if not self.enabled:
            return LOCAL_ADMIN  # (without tokens every caller is; the metadata is not read)
        resolved = _RESOLVED.get(None)
        if resolved is not None and resolved[0] is self:
            return resolved[1]
        who = self.principal(context.invocation_metadata())
        if who is None:
            raise Unauthenticated("a valid bearer token is required")
        return who


#: calls held for their refusal delay at once per socket, at most; past it, refusals are
#: answered at once. A held call keeps its gRPC call state (measured: about 40 KiB each, RSS
#: +75 MiB for 1,800 held), so this bounds that memory to about 40 MiB
MAX_DELAYED_REFUSALS = 1024


class RefusalDelay:
    """Holds the UNAUTHENTICATED answers of calls that prove nobody for ``delay_s`` [s], at
    most ``max_waiting`` at once (then at once), on the event loop (no thread held): PAM's
    ``pam_faildelay``, so that a sender of junk credentials, whose calls must each be judged
    (a MUNGE credential by munged) before they can be refused, gets at most its calls in
    flight answered per delay instead of as many as the daemon can refuse (docs/security.md,
    "Round two: junk credentials"; ``python benchmarks/munge_junk.py`` measures it).

    Args:
        delay_s: the delay [s] (0: none; the ``refusal_delay_s`` setting).
        max_waiting: answers held at once, at most.
    """

    def __init__(self, delay_s: float, max_waiting: int = MAX_DELAYED_REFUSALS):
        self.delay_s = delay_s
        self.max_waiting = max_waiting
        #: answers held now (only the loop's thread changes it)
        self.waiting = 0

    async def hold(self) -> None:
        """Wait the delay, unless ``max_waiting`` answers are held already."""
        if self.delay_s <= 0 or self.waiting >= self.max_waiting:
            return
        self.waiting += 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.waiting -= 1


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a valid token (UNAUTHENTICATED) and methods the caller's role is
    not listed for in :data:`METHOD_ROLES` (PERMISSION_DENIED) before any handler runs, and
    before the request is read (:func:`offcut.daemon.edge.handlers.refusal`: an unauthenticated
    caller cannot make the daemon receive its message). Object-level rules (own tasks) are
    checked by the services with :meth:`Authenticator.of`. An UNAUTHENTICATED answer waits
    ``delay`` (:class:`RefusalDelay`; None: none)."""

    def __init__(self, auth: Authenticator, delay: RefusalDelay | None = None):
        self.auth = auth
        self.delay = delay or RefusalDelay(0.0)

    async def intercept_service(self, continuation, handler_call_details):
        """Pass the call on (its caller resolved for :meth:`Authenticator.of`), or answer it
        with the refusal."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not self.auth.enabled or method.startswith(OPEN_PREFIXES):
            return handler
        try:
            who = await self.auth.principal_async(handler_call_details.invocation_metadata,
                                                  method)
        except Unauthenticated as exc:
            await self.delay.hold()
            return refusal(handler, grpc.StatusCode.UNAUTHENTICATED, str(exc))
        if who is None:
            await self.delay.hold()
            return refusal(handler, grpc.StatusCode.UNAUTHENTICATED, self.auth.wanted)
        if not who.may_call(method):
            allowed = [r for r in ROLES if r != ADMIN and r in METHOD_ROLES.get(method, ())]
            return refusal(handler, grpc.StatusCode.PERMISSION_DENIED,
                           f"{method.rsplit('/', 1)[-1]} needs "
                           + " or ".join(f"the {r} role" for r in allowed + [ADMIN]))
        _RESOLVED.set((self.auth, who))  # this call's task: its asyncio behaviour sees it
        return _in_call_context(handler)


def _in_call_context(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` whose plain (worker-thread) behaviour runs in a copy of the running call's
    context, as asyncio's ``to_thread`` would do (``grpc.aio`` hands a worker none); asyncio
    behaviours run in the call's task already and stay as they are."""
    behavior = behavior_of(handler)
    if kind_of(behavior) != SYNC:
        return handler
    call_context = contextvars.copy_context()

    @functools.wraps(behavior)
    def in_call_context(request, context):
        return call_context.run(behavior, request, context)

    return rebuild(handler, in_call_context)

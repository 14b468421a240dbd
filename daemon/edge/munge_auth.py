"""Callers identified by MUNGE credentials, as Slurm identifies its users (docs/security.md,
"Threat model"; the credential itself: :mod:`offcut.munge`).

A call carries ``authorization: MUNGE CRED``. The daemon has its local ``munged`` decode the
credential: that proves the uid and gid of the process that made it on any node sharing the
cluster's MUNGE key, refuses it if it was decoded before (munged's replay cache), expired
(munged's time-to-live, 300 s by default) or made for another decoder uid, and yields its
payload, which must be ``offcut:`` + this call's method (:func:`offcut.munge.call_payload`):
a credential made for another call, or a Slurm job's, is refused. The uid becomes a
:class:`~offcut.daemon.edge.auth.Principal` named by the daemon host's user database:

* uid 0 (root): ``admin``;
* the ``slurm_user`` setting's uid (Slurm's ``SlurmUser``, which runs PrologSlurmctld and
  EpilogSlurmctld): ``slurm``, so the hooks need no token on disk;
* a user listed in ``admin_users``, or a member (primary group or supplementary) of a group in
  ``admin_groups``: ``admin``;
* any other user: ``user``;
* a uid without an account on the daemon's host: refused.

Decoding asks munged over its socket (about 0.1-0.3 ms), so it runs on a small thread pool of
its own (:data:`DECODE_THREADS`), never on the event loop: a munged that hangs holds at most
those threads, not the daemon.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
from concurrent.futures import ThreadPoolExecutor

from offcut import munge
from offcut.daemon.edge.auth import ADMIN, SLURM, USER, Principal
from offcut.errors import Unauthenticated

#: threads decoding credentials (each waits on munged's answer)
DECODE_THREADS = 4

#: why a credential is refused, by libmunge's error number (the caller sees it)
_REASONS = {
    munge.REPLAYED: "the MUNGE credential was used before (replayed); make a new one per call",
    munge.EXPIRED: "the MUNGE credential expired; make a new one per call",
    munge.REWOUND: "the MUNGE credential was made in the future: the clocks of the client's "
                   "and the daemon's hosts differ",
    munge.UNAUTHORIZED: "the MUNGE credential was made for another decoder (uid restriction)",
    munge.CRED_INVALID: "the MUNGE credential is not valid for this cluster's key",
    munge.BAD_CRED: "not a MUNGE credential",
}


class MungeRefused(Unauthenticated):
    """A credential that identifies nobody; the message says why (sent to the caller as
    UNAUTHENTICATED: it holds no secret)."""


class MungeIdentity:
    """Turns MUNGE credentials into principals (the rules in the module docstring).

    Args:
        socket: munged's socket on the daemon's host (None: libmunge's default,
            :data:`offcut.munge.DEFAULT_SOCKET`).
        slurm_user: the account whose credentials get the ``slurm`` role (Slurm's
            ``SlurmUser``); an unknown name gives nobody that role.
        admin_users: accounts whose credentials get the ``admin`` role.
        admin_groups: groups whose members get the ``admin`` role.

    Raises:
        offcut.munge.MungeUnavailable: libmunge is not installed.
    """

    def __init__(self, socket: str | None = None, slurm_user: str = "slurm",
                 admin_users: tuple[str, ...] | list[str] = (),
                 admin_groups: tuple[str, ...] | list[str] = ()):
        reason = munge.available()
        if reason is not None:
            raise munge.MungeUnavailable(reason)
        self.socket = munge.socket_path(socket)
        self.slurm_user = slurm_user
        self.admin_users = frozenset(admin_users)
        self.admin_groups = frozenset(admin_groups)
        self._pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="offcut-munge")

    def principal(self, credential: str, method: str) -> Principal:
        """The caller of ``method`` (full gRPC name) proven by ``credential``. Blocks for
        munged's answer.

        Raises:
            MungeRefused: replayed, expired, forged, made for another call or decoder, a uid
                without an account here, or munged not reachable.
        """
        try:
            uid, gid, payload = munge.decode(credential, socket=self.socket)
        except munge.MungeUnavailable as exc:
            raise MungeRefused(str(exc)) from None
        except munge.MungeError as exc:
            if exc.code == munge.SOCKET:
                raise MungeRefused(f"the daemon cannot reach munged ({exc})") from None
            raise MungeRefused(_REASONS.get(exc.code, f"MUNGE refused the credential: {exc}")
                               ) from None
        if payload != munge.call_payload(method):
            raise MungeRefused("the MUNGE credential was made for another call (its payload "
                               "must be 'offcut:' + the method's full name)")
        return self.role_of(uid, gid)

    async def principal_async(self, credential: str, method: str) -> Principal:
        """:meth:`principal` on this object's threads (for the event loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.principal, credential, method)

    def role_of(self, uid: int, gid: int) -> Principal:
        """The principal of a proven uid and primary gid (rules in the module docstring).
        Raises MungeRefused for a uid without an account on this host."""
        try:
            account = pwd.getpwuid(uid)
        except KeyError:
            raise MungeRefused(f"uid {uid} has no account on the daemon's host") from None
        name = account.pw_name
        if uid == 0:
            return Principal(name, ADMIN)
        if name == self.slurm_user:
            return Principal(name, SLURM)
        if name in self.admin_users or (self.admin_groups and self._in_admin_group(name, gid)):
            return Principal(name, ADMIN)
        return Principal(name, USER)

    def _in_admin_group(self, name: str, gid: int) -> bool:
        for g in os.getgrouplist(name, gid):
            try:
                if grp.getgrgid(g).gr_name in self.admin_groups:
                    return True
            except KeyError:
                continue
        return False

    def close(self) -> None:
        """Stop the decoding threads (calls being decoded finish first)."""
        self._pool.shutdown(wait=True)

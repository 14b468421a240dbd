"""Whose account runs a task's jobs: the task's owner (docs/security.md, "Tasks run as their
owners").

The daemon records every task's ``owner``: with ``tokens_file`` the user name of the token that
submitted it, without tokens the name the submitter gave (``offcut submit`` sends its login
name). The launcher maps that name to a local account through the system's user database
(NSS, :mod:`pwd`: the same database slurmd resolves a job's user with on the nodes) and submits
the task's jobs with ``sbatch --uid=UID --gid=GID``. Slurm permits those options to root only
(sbatch: ``--uid only permitted by root user``), then runs the job as that user and group (and
the user's supplementary groups); so the launcher runs as root, and a launcher that is not root
launches only the tasks of its own account (which need no ``--uid``).

A task is refused, never launched, when its owner

* has no local account (no such user in the launcher host's user database),
* is root (uid 0) or has root's group as primary group (gid 0),
* is a system account: uid below ``min_uid`` (1000 by default: Debian's and most distributions'
  ``UID_MIN`` in login.defs, the first uid ``useradd`` gives a person),
* is a service account that cannot log in (login shell ``nologin`` or ``false``: Debian's
  ``slurm``, uid 64030, and ``nobody``, uid 65534, are above ``min_uid``), or
* is another account than an unprivileged launcher's own.

:class:`OwnerRefused` carries the message (naming the owner) that the launcher reports as the
task's failed run. With ``run_as_owner = false`` every task runs as the launcher's own account,
as before this module existed: for single-user sites and tests only.

Standard library and pydantic only.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

#: the first uid of a person's account by default (login.defs ``UID_MIN`` on Debian, Ubuntu,
#: RHEL >= 7, SUSE); lower uids are system accounts
DEFAULT_MIN_UID = 1000
#: the largest valid uid (``(uid_t) -1`` is "no uid")
MAX_UID = 2**32 - 2
#: login shells of accounts nobody logs in with (service accounts: ``adduser --system`` gives
#: ``/usr/sbin/nologin``)
NO_LOGIN_SHELLS = frozenset({"nologin", "false"})
#: umask of a task's jobs (``SLURM_UMASK``): the files a job creates, its output file included,
#: are its owner's only (mode 0600 / 0700); a program may set its own umask
JOB_UMASK = "0077"


class RunAsPolicy(BaseModel):
    """Which account runs a task's jobs: the launcher's ``run_as_owner`` and ``min_uid``
    settings, as offcut.toml's ``[slurm]`` section documents them (``SlurmConfig``,
    docs/configuration.md); the same bounds are checked here for a policy built directly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_as_owner: bool = True
    min_uid: int = Field(DEFAULT_MIN_UID, ge=0, le=MAX_UID)

    @classmethod
    def of(cls, cfg: object) -> "RunAsPolicy":
        """The policy a ``[slurm]`` section sets: its ``run_as_owner`` and ``min_uid`` keys, the
        defaults for the keys it does not have."""
        return cls(**{name: getattr(cfg, name) for name in cls.model_fields
                      if hasattr(cfg, name)})


class OwnerRefused(Exception):
    """A task cannot run as its owner; the message names the owner and says why."""


@dataclass(frozen=True)
class Account:
    """The local account a task's jobs run as.

    Attributes:
        name: the user name (the task's owner).
        uid, gid: the user's id and primary group id.
        home: the user's home folder (the jobs' working folder unless ``[slurm] workdir``).
        switch: True when the launcher submits as this user (``sbatch --uid/--gid``: a root
            launcher); False when it is the launcher's own account.
    """

    name: str
    uid: int
    gid: int
    home: str
    switch: bool

    def sbatch_options(self) -> list[str]:
        """``--uid=UID --gid=GID`` (numeric: no second lookup by name), or nothing for the
        launcher's own account."""
        return [f"--uid={self.uid}", f"--gid={self.gid}"] if self.switch else []

    def environment(self) -> dict[str, str]:
        """The login variables of the account (``HOME``, ``USER``, ``LOGNAME``), which replace
        the launcher's in a job's environment."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def user_name(uid: int, getpwuid: Callable[[int], pwd.struct_passwd] = pwd.getpwuid) -> str:
    """The user name of ``uid`` (the number as text when the user database has no entry)."""
    try:
        return getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class OwnerAccounts:
    """Maps task owners to the accounts their jobs run as, by :class:`RunAsPolicy`.

    Args:
        policy: ``run_as_owner`` and ``min_uid``.
        uid: the launcher's user id (default: this process's real uid, which sbatch checks for
            ``--uid``); 0 = root, allowed to submit as any user.
        getpwnam, getpwuid: the user database (default: :mod:`pwd`; injectable for tests).
    """

    def __init__(self, policy: RunAsPolicy | None = None, *, uid: int | None = None,
                 getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
                 getpwuid: Callable[[int], pwd.struct_passwd] = pwd.getpwuid):
        self.policy = policy or RunAsPolicy()
        self.uid = os.getuid() if uid is None else int(uid)
        self._getpwnam = getpwnam
        self._getpwuid = getpwuid

    @property
    def privileged(self) -> bool:
        """Whether this launcher may submit jobs as other users (it is root)."""
        return self.uid == 0

    @property
    def launcher_name(self) -> str:
        """The launcher's own user name."""
        return user_name(self.uid, self._getpwuid)

    def account(self, owner: str) -> Account | None:
        """The account that runs the jobs of a task owned by ``owner``; None when
        ``run_as_owner`` is off (the launcher's own account, no ``--uid``).

        Raises:
            OwnerRefused: no owner, no local account, root, root's group, a system account
                (uid < ``min_uid``), a service account (shell nologin/false), or an owner
                other than an unprivileged launcher's own account. The message names the
                owner.
        """
        if not self.policy.run_as_owner:
            return None
        if not owner:
            raise OwnerRefused("the task has no owner, and tasks run as their owners "
                               "([slurm] run_as_owner)")
        try:
            pw = self._getpwnam(owner)
        except (KeyError, ValueError):  # ValueError: a name with a NUL character
            raise OwnerRefused(f"task owner {owner!r} has no local account (no such user on the "
                               "launcher's host), and tasks run as their owners ([slurm] "
                               "run_as_owner)") from None
        if pw.pw_uid == 0:
            raise OwnerRefused(f"task owner {owner!r} is root (uid 0): tasks never run as root")
        if pw.pw_gid == 0:
            raise OwnerRefused(f"task owner {owner!r} has root's group as primary group (gid 0): "
                               "tasks never run with it")
        if pw.pw_uid < self.policy.min_uid:
            raise OwnerRefused(f"task owner {owner!r} is a system account (uid {pw.pw_uid} < "
                               f"[slurm] min_uid {self.policy.min_uid}): tasks run as users' "
                               "accounts only")
        if os.path.basename(pw.pw_shell) in NO_LOGIN_SHELLS:
            raise OwnerRefused(f"task owner {owner!r} is a service account (login shell "
                               f"{pw.pw_shell}): tasks run as users' accounts only")
        if not self.privileged and pw.pw_uid != self.uid:
            raise OwnerRefused(f"task owner {owner!r} is not the launcher's own account "
                               f"{self.launcher_name!r}, and only root may submit jobs as "
                               "another user (sbatch --uid): run the launcher as root "
                               "(docs/security.md)")
        return Account(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir,
                       switch=self.privileged)

    def describe(self) -> tuple[bool, str]:
        """``(fine, text)``: whom this launcher runs tasks as, in words, for its start-up log;
        ``fine`` is False for a setting an operator should look at (tasks as the launcher's own
        account, or an unprivileged launcher that can run only its own tasks)."""
        me = self.launcher_name
        if not self.policy.run_as_owner:
            return False, (f"[slurm] run_as_owner = false: every task runs as this launcher's "
                           f"own account {me!r} (uid {self.uid}), whoever submitted it")
        if not self.privileged:
            return False, (f"not root: only tasks owned by {me!r} (uid {self.uid}) can be "
                           "launched, any other task fails (sbatch --uid needs root)")
        return True, (f"tasks run as their owners (sbatch --uid/--gid), accounts with uid >= "
                      f"{self.policy.min_uid} only")

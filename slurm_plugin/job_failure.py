"""The last lines of a failed run's stderr, for the launcher's failure report
(docs/execution.md, "Wasted work"; docs/security.md, "Round two: whose job it is, and
checkpoint folders").

When a process of a job fails, the job's supervisor (:mod:`offcut.slurm_plugin.node_run`)
leaves a note in the task's checkpoint folder, :data:`~offcut.slurm_plugin.node_run.FAILURE_FILE`:
``job JOB_ID local rank K exit CODE`` and the last lines the process wrote to its stderr.
:func:`stderr_tail` reads it back for the launcher's report of that job:

* **as the task's owner**, never as root: the folder is the owner's, so a link or a FIFO the
  owner planted there must not make a root launcher read ``/etc/shadow`` (or hang) into a
  message the owner sees. A root launcher runs ``dd`` with the owner's uid, gid and no
  supplementary groups, by util-linux's ``setpriv --reuid --regid --clear-groups`` (not
  ``subprocess.run(user=...)``, whose plain ``fork()`` runs gRPC's fork handlers: with the
  launcher's placement stream open in another thread they crash the child before it runs
  ``dd``; a ``setpriv`` child is started by ``vfork``, which runs none); a launcher whose
  jobs run as its own account (``run_as_owner = false``, or an unprivileged launcher) runs it
  as itself. ``dd`` opens the note with ``O_NOFOLLOW | O_NONBLOCK`` (a link is refused, a FIFO
  is not waited on), reads at most :data:`~offcut.slurm_plugin.node_run.MAX_NOTE_BYTES`, and
  is killed after :data:`READ_TIMEOUT_S`;
* only a note whose first line names the reported job counts (an older note is another run's);
* of its lines, the last ones that fit :data:`MAX_TAIL_CHARS` characters in all, each made
  safe for a terminal (:func:`offcut.text_safety.terminal_safe`), joined by ``" | "``.

What the note holds is only what the owner's own processes wrote; no secret of the launcher
is in a job's environment (:func:`offcut.slurm_plugin.job_submission.job_environment`).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

from offcut.slurm_plugin.node_run import FAILURE_FILE, MAX_NOTE_BYTES
from offcut.slurm_plugin.owners import Account
from offcut.text_safety import terminal_safe

log = logging.getLogger("offcut.slurm.launcher")

#: seconds the reading of a note may take before ``dd`` is killed
READ_TIMEOUT_S = 5.0
#: characters of stderr lines in a report at most (within the daemon's 2,000 for a run
#: report's message: offcut.daemon.app.scheduler.validation.MAX_MESSAGE_LEN)
MAX_TAIL_CHARS = 1000
#: the separator of the lines in a report
SEPARATOR = " | "

_HEAD = re.compile(r"job (?P<job>\S+) local rank \d+ exit \d+")
_PATH = "/usr/bin:/bin"


def read_note(path: str | os.PathLike, account: Account | None = None,
              timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The first :data:`~offcut.slurm_plugin.node_run.MAX_NOTE_BYTES` of the file at ``path``
    read by ``dd`` (no link followed, no FIFO waited on), as ``account`` when the launcher
    submits as it (``account.switch``: a root launcher; through ``setpriv``, module
    docstring), else as this process; ``b""`` when it cannot be read (missing, a link, not
    readable by that user, ``dd`` or ``setpriv`` missing or failed, or past ``timeout_s``
    [s])."""
    cmd = ["dd", f"if={os.fspath(path)}", f"bs={MAX_NOTE_BYTES}", "count=1",
           "iflag=fullblock,nofollow,nonblock", "status=none"]
    if account is not None and account.switch:
        cmd = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}",
               "--clear-groups", "--", *cmd]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout_s, cwd="/",
                              env={"PATH": _PATH, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError) as exc:  # TimeoutExpired: killed
        log.debug("failure note %s not read: %s", path, exc)
        return b""
    return done.stdout[:MAX_NOTE_BYTES] if done.returncode == 0 else b""


def tail_of(note: bytes, job_id: str, max_chars: int = MAX_TAIL_CHARS) -> str:
    """The last lines of ``note`` (a failure note) that fit ``max_chars`` characters joined
    by :data:`SEPARATOR`, each made safe for a terminal; a last line longer than that alone
    is cut (its start kept, ending in ``...``). ``""`` when the note's first line does not
    name ``job_id`` or it has no lines."""
    text = note.decode("utf-8", "replace")
    head, _, body = text.partition("\n")
    m = _HEAD.fullmatch(head.strip())
    if m is None or m["job"] != job_id:
        return ""
    lines = [terminal_safe(line.strip()) for line in body.split("\n") if line.strip()]
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        more = len(line) + (len(SEPARATOR) if kept else 0)
        if used + more > max_chars:
            if not kept:
                kept.append(line[:max_chars - 3] + "...")
            break
        kept.append(line)
        used += more
    return SEPARATOR.join(reversed(kept))


def stderr_tail(folder: str | os.PathLike, job_id: str, account: Account | None = None) -> str:
    """The last lines of stderr of job ``job_id``'s failed process, from the note in the
    task's checkpoint ``folder`` read as ``account`` (:func:`read_note`, :func:`tail_of`);
    ``""`` when there is none for that job."""
    return tail_of(read_note(Path(folder) / FAILURE_FILE, account), job_id)

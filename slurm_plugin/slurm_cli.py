"""The Slurm command line (``sinfo``, ``squeue``, ``sbatch``, ``scancel``, ``scontrol``) as
Python calls: the watcher, the epilog's check and the launcher (to come) share it.

Every call runs with a bounded time, an explicit ``SLURM_CONF`` when one is configured, and a
default ``PATH`` when the caller has none (Slurm runs its hooks without ``PATH``). Failures
raise :class:`SlurmCommandError` (command missing, non-zero exit, timeout) or
:class:`SlurmDataError` (output that is not the expected JSON) with one clear message.
Standard library only, so the hooks can import it cheaply.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from offcut.slurm_plugin.slurm_json import SlurmCommandError, SlurmDataError

#: scancel's words for a job that has ended already (Slurm 22.05-24.x)
_ENDED_JOB_ERRORS = ("already completing or completed", "Invalid job id specified")
from offcut.slurm_values import slurm_time_arg

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def default_slurm_conf() -> str | None:
    """``$SLURM_CONF`` if set, else ``/etc/slurm/slurm.conf`` if it exists, else None (Slurm may
    still find its configuration through DNS SRV records or configless mode)."""
    conf = os.environ.get("SLURM_CONF")
    if conf:
        return conf
    return "/etc/slurm/slurm.conf" if os.path.exists("/etc/slurm/slurm.conf") else None


@dataclass
class SlurmCLI:
    """Runs Slurm commands. Each command is a name looked up in ``PATH`` or an absolute path
    (the hooks get absolute paths, resolved when they are installed).

    Args:
        sinfo, squeue, sbatch, scancel, scontrol, sacct_command: the commands (name or
            path).
        slurm_conf: ``SLURM_CONF`` given to the commands (None: the caller's environment).
        timeout_s: default limit per command [s].
        extra_env: further environment variables of the commands (win over everything).
    """

    sinfo: str = "sinfo"
    squeue: str = "squeue"
    sbatch: str = "sbatch"
    scancel: str = "scancel"
    scontrol: str = "scontrol"
    sacct_command: str = "sacct"
    slurm_conf: str | None = None
    timeout_s: float = 10.0
    extra_env: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ plumbing
    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of the commands: ``base`` (default: this process's) with a default
        ``PATH``, ``SLURM_CONF`` and ``extra_env``."""
        env = dict(os.environ if base is None else base)
        env.setdefault("PATH", DEFAULT_PATH)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(self.extra_env)
        return env

    def resolve(self, command: str, path: str | None = None) -> str:
        """The absolute path of ``command``, looked up in ``path`` (default: the commands'
        ``PATH``, :meth:`env`); raises SlurmCommandError when not found."""
        if os.sep in command:
            if os.access(command, os.X_OK) and os.path.isfile(command):
                return command
            raise SlurmCommandError(f"{command}: not an executable file")
        found = shutil.which(command, path=self.env()["PATH"] if path is None else path)
        if not found:
            raise SlurmCommandError(f"{command}: not found in PATH (is Slurm installed here?)")
        return found

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None,
            input_text: str | None = None, env: Mapping[str, str] | None = None) -> str:
        """Run ``argv`` (``argv[0]`` resolved by :meth:`resolve`) in :meth:`env`, or in
        ``env`` (plus ``SLURM_CONF``, ``extra_env`` and a default ``PATH``) when given;
        returns stdout.

        Raises:
            SlurmCommandError: not found, not startable, timed out or non-zero exit (the
                message carries the end of stderr).
        """
        env = self.env(env)
        exe = self.resolve(argv[0], env["PATH"])
        limit = self.timeout_s if timeout_s is None else timeout_s
        name = os.path.basename(argv[0])
        try:
            proc = subprocess.run([exe, *argv[1:]], input=input_text, capture_output=True,
                                  text=True, timeout=limit, env=env,
                                  stdin=None if input_text is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"{name} did not answer within {limit:g} s") from None
        except OSError as exc:
            raise SlurmCommandError(f"{name} could not be started: {exc}") from None
        if proc.returncode != 0:
            err = " ".join((proc.stderr or proc.stdout or "").split())[-400:]
            raise SlurmCommandError(f"{name} exited with status {proc.returncode}: {err or 'no message'}")
        return proc.stdout

    def run_json(self, argv: Sequence[str], *, timeout_s: float | None = None) -> dict:
        """Run ``argv`` and decode its stdout as a JSON object.

        Raises:
            SlurmCommandError: as :meth:`run`.
            SlurmDataError: the output is not a JSON object.
        """
        out = self.run(argv, timeout_s=timeout_s)
        name = os.path.basename(argv[0])
        if not out.strip():
            raise SlurmDataError(f"{name} printed nothing (expected JSON)")
        try:
            doc = json.loads(out)
        except ValueError as exc:
            raise SlurmDataError(f"{name} printed something that is not JSON ({exc}; starts "
                                 f"with {out.strip()[:60]!r})") from None
        if not isinstance(doc, dict):
            raise SlurmDataError(f"{name} printed a JSON {type(doc).__name__}, not an object")
        return doc

    # ------------------------------------------------------------------ queries
    def sinfo_json(self) -> dict:
        """``sinfo --json`` (all nodes; Slurm 22.05 ignores filters with --json)."""
        return self.run_json([self.sinfo, "--json"])

    def squeue_json(self) -> dict:
        """``squeue --json`` (all jobs, finished ones included while Slurm keeps them)."""
        return self.run_json([self.squeue, "--json"])

    def sacct(self, names: Sequence[str], since: float) -> str:
        """Slurm's accounting of the jobs named ``names`` submitted since ``since`` [s since
        the epoch], every user's (``sacct -X -a --parsable2 --noheader``, columns
        :data:`offcut.slurm_plugin.slurm_json.SACCT_FIELDS`, times as epoch seconds). The
        text form rather than ``--json``: Slurm 22.05's JSON gives an allocation's exit code
        as 0 whatever the batch script returned. Raises SlurmCommandError (e.g. accounting
        storage disabled: no slurmdbd)."""
        from offcut.slurm_plugin.slurm_json import SACCT_FIELDS

        start = slurm_time_arg(since)
        return self.run([self.sacct_command, "-X", "-a", "--parsable2", "--noheader",
                         f"--format={','.join(SACCT_FIELDS)}", f"--name={','.join(names)}",
                         f"--starttime={start}"],
                        env={**os.environ, "SLURM_TIME_FORMAT": "%s"})

    def version(self) -> tuple[int, int, int]:
        """Slurm's version from ``sinfo --version`` (e.g. ``slurm-wlm 22.05.8`` -> (22, 5, 8))."""
        out = self.run([self.sinfo, "--version"])
        m = _VERSION_RE.search(out)
        if not m:
            raise SlurmDataError(f"sinfo --version printed {out.strip()[:60]!r}")
        return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)

    # ------------------------------------------------------------------ actions
    def submit(self, options: Sequence[str] = (), *, wrap: str | None = None,
               script: str | None = None, env: Mapping[str, str] | None = None) -> str:
        """``sbatch --parsable OPTIONS`` with ``--wrap`` or a script on stdin, in ``env``
        (:meth:`run`; the job inherits it); returns the job id."""
        if (wrap is None) == (script is None):
            raise ValueError("give exactly one of wrap= and script=")
        argv = [self.sbatch, "--parsable", *options]
        if wrap is not None:
            argv += ["--wrap", wrap]
        out = self.run(argv, input_text=script, env=env)
        job_id = out.strip().split(";")[0]  # "123" or "123;cluster"
        if not job_id.isdigit():
            raise SlurmDataError(f"sbatch printed {out.strip()[:60]!r}, not a job id")
        return job_id

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None,
               options: Sequence[str] = ()) -> None:
        """``scancel [--signal=S] OPTIONS JOB...`` (nothing to do for no job). A job that has
        already ended (scancel: "already completing or completed", "Invalid job id") is no
        error: what was asked is done.

        Raises:
            SlurmCommandError: scancel failed otherwise.
        """
        if not job_ids:
            return
        argv = [self.scancel, *([f"--signal={signal}"] if signal else []), *options, *map(str, job_ids)]
        try:
            self.run(argv)
        except SlurmCommandError as exc:
            if not any(gone in str(exc) for gone in _ENDED_JOB_ERRORS):
                raise

    def update(self, entity: str, name: str, **settings: str) -> None:
        """``scontrol update ENTITY=NAME KEY=VALUE ...`` (e.g. ``update("NodeName", "n4",
        State="DRAIN", Reason="test")``, ``update("JobId", "12", NumNodes="2")``)."""
        self.run([self.scontrol, "update", f"{entity}={name}",
                  *(f"{k}={v}" for k, v in settings.items())])

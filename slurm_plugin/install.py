"""Writes the shell wrappers that Slurm runs as ``PrologSlurmctld`` / ``EpilogSlurmctld``, and
the node ``Epilog`` that restores GPU power limits (:func:`write_power_epilog`).

Slurm runs them with no ``PATH`` and no ``SLURM_CONF``, so everything is absolute: the
wrapper runs this installation's Python (``sys.executable`` at install time, the virtual
environment's interpreter, not resolved through its symlink) in isolated mode (``-I``: no
``PYTHON*`` variables, no user site, no current directory on ``sys.path``), with the Slurm
commands and ``slurm.conf`` that the epilog's check needs resolved at install time. The wrapper
ends with ``exit 0`` so that even a Python that cannot start (a removed environment) does not
fail the job; Python's own stderr goes to the log file.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from offcut.slurm_plugin.slurm_cli import DEFAULT_PATH, default_slurm_conf

HOOK_FILES = {"prolog": "prolog_ctld.sh", "epilog": "epilog_ctld.sh"}
SLURM_KEYS = {"prolog": "PrologSlurmctld", "epilog": "EpilogSlurmctld"}


@dataclass
class HookConfig:
    """Settings baked into the wrappers (see ``offcut-slurm install-hooks --help`` and the
    options of ``python -m offcut.slurm_plugin.hooks --help``). ``timeout_s``: the hooks' bound
    on the daemon calls [s]; ``slurm_timeout_s``: the epilog's limit per Slurm query [s];
    ``check``: False writes ``--no-check`` (the epilog does not ask Slurm)."""

    address: str
    timeout_s: float = 2.0
    log_file: str | None = None          # default: DIR/offcut-hooks.log
    scavenger_partitions: list[str] = field(default_factory=lambda: ["scavenger"])
    python: str = field(default_factory=lambda: os.path.abspath(sys.executable))
    slurm_conf: str | None = None        # default: $SLURM_CONF or /etc/slurm/slurm.conf
    sinfo: str | None = None             # default: found in PATH now
    squeue: str | None = None
    token_file: str | None = None
    tls_ca: str | None = None
    munge_socket: str | None = None      # munged's socket, when not the default one
    check: bool = True
    slurm_timeout_s: float = 5.0
    job_name_prefix: str = ""
    job_comment: str = ""
    log_level: str = "info"


def _which(name: str) -> str:
    path = os.environ.get("PATH") or DEFAULT_PATH
    return shutil.which(name, path=path) or shutil.which(name, path=DEFAULT_PATH) or name


def hook_command(kind: str, cfg: HookConfig, log_file: str) -> list[str]:
    """The argv a wrapper runs for ``kind`` (prolog | epilog)."""
    argv = [cfg.python, "-I", "-m", "offcut.slurm_plugin.hooks", kind,
            "--address", cfg.address, "--timeout-s", f"{cfg.timeout_s:g}",
            "--log-file", log_file, "--log-level", cfg.log_level]
    for p in cfg.scavenger_partitions:
        argv += ["--scavenger-partition", p]
    if cfg.token_file:
        argv += ["--token-file", os.path.abspath(cfg.token_file)]
    if cfg.tls_ca:
        argv += ["--tls-ca", os.path.abspath(cfg.tls_ca)]
    if cfg.munge_socket:
        argv += ["--munge-socket", os.path.abspath(cfg.munge_socket)]
    if kind == "epilog":
        if not cfg.check:
            argv.append("--no-check")
        else:
            argv += ["--sinfo", cfg.sinfo or _which("sinfo"), "--squeue", cfg.squeue or _which("squeue"),
                     "--slurm-timeout-s", f"{cfg.slurm_timeout_s:g}"]
            conf = cfg.slurm_conf or default_slurm_conf()
            if conf:
                argv += ["--slurm-conf", os.path.abspath(conf)]
            if cfg.job_name_prefix:
                argv += ["--job-name-prefix", cfg.job_name_prefix]
            if cfg.job_comment:
                argv += ["--job-comment", cfg.job_comment]
    return argv


def wrapper_text(kind: str, cfg: HookConfig, log_file: str) -> str:
    """The shell wrapper for ``kind``."""
    cmd = " ".join(shlex.quote(a) for a in hook_command(kind, cfg, log_file))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        "#!/bin/sh\n"
        f"# Offcut {SLURM_KEYS[kind]} hook, written by `offcut-slurm install-hooks` ({when}).\n"
        "# Slurm runs it with no PATH and no SLURM_CONF, so every path below is absolute.\n"
        "# It always exits 0: Offcut must never block or fail a regular job.\n"
        f"{cmd} </dev/null >/dev/null 2>>{shlex.quote(log_file)}\n"
        "exit 0\n")


def write_hooks(directory: str | Path, cfg: HookConfig) -> dict[str, Path]:
    """Write ``prolog_ctld.sh`` and ``epilog_ctld.sh`` (mode 0755) into ``directory`` (created
    if needed) and create the log file's folder. Returns ``{kind: path}``."""
    d = Path(directory).absolute()
    d.mkdir(parents=True, exist_ok=True)
    log_file = os.path.abspath(cfg.log_file) if cfg.log_file else str(d / "offcut-hooks.log")
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind, name in HOOK_FILES.items():
        path = d / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(wrapper_text(kind, cfg, log_file))
        tmp.chmod(0o755)
        os.replace(tmp, path)  # atomic: slurmctld never runs a half-written script
        out[kind] = path
    return out


def prolog_epilog_timeout_s(timeout_s: float) -> int:
    """slurm.conf's ``PrologEpilogTimeout`` [s] for hooks of ``--timeout-s`` ``timeout_s``
    [s]: ``max(3 * timeout_s + 15, 30)`` (:func:`slurm_conf_lines` says why)."""
    return max(int(timeout_s * 3 + 15), 30)


def slurm_conf_lines(paths: dict[str, Path], timeout_s: float) -> list[str]:
    """The slurm.conf lines that wire the hooks, ``paths`` as :func:`write_hooks` returns them.

    ``PrologEpilogTimeout`` [s] = ``max(3 * timeout_s + 15, 30)``: well above the hooks' own
    bound (the watchdog in :mod:`~offcut.slurm_plugin.hooks`: ``timeout_s`` + 1 s for the
    prolog, ``timeout_s + 2 * slurm_timeout_s`` + 1 s for the epilog, i.e. ``timeout_s`` + 11 s
    with the default ``slurm_timeout_s`` of 5 s), plus the interpreter's start, so Slurm's
    kill is only a last resort."""
    return [f"{SLURM_KEYS[k]}={p}" for k, p in paths.items()] + [
        f"PrologEpilogTimeout={prolog_epilog_timeout_s(timeout_s)}"]


# ----------------------------------------------------------------------------- node epilog
POWER_EPILOG_FILE = "epilog_power.sh"


@dataclass
class PowerEpilogConfig:
    """Settings baked into the node ``Epilog`` wrapper that restores GPU power limits
    (``offcut-slurm power-restore --help``). ``socket``: the power helper's socket;
    ``gpus``: the helper's ``--gpus`` (``nvml`` or ``fake:FILE``), used when the helper cannot
    be reached; ``state``: the helper's limits record; ``node``: the helper's node name (only
    where several slurmd share one host, as in the test cluster; the epilog of another node
    then does nothing); ``timeout_s``: bound on the call to the helper [s]."""

    socket: str
    gpus: str = "nvml"
    state: str | None = None
    log_file: str | None = None          # default: DIR/offcut-power-epilog.log
    node: str | None = None
    timeout_s: float = 5.0
    python: str = field(default_factory=lambda: os.path.abspath(sys.executable))


def power_epilog_command(cfg: PowerEpilogConfig, log_file: str) -> list[str]:
    """The argv the node epilog wrapper runs (``offcut-slurm power-restore``)."""
    argv = [cfg.python, "-I", "-m", "offcut.slurm_plugin.cli", "power-restore",
            "--socket", os.path.abspath(cfg.socket), "--gpus", cfg.gpus,
            "--timeout-s", f"{cfg.timeout_s:g}", "--log-file", log_file]
    if cfg.state:
        argv += ["--state", os.path.abspath(cfg.state)]
    if cfg.node:
        argv += ["--node", cfg.node]
    return argv


def write_power_epilog(directory: str | Path, cfg: PowerEpilogConfig) -> Path:
    """Write ``epilog_power.sh`` (mode 0755, atomically) into ``directory`` (created if
    needed): slurmd runs it as root at the end of every job on the node (``Epilog=``), with
    ``SLURM_JOB_ID`` and ``SLURM_JOB_GPUS`` in its environment, and it always exits 0 so that
    a failure never drains the node (errors go to the log). Returns its path."""
    d = Path(directory).absolute()
    d.mkdir(parents=True, exist_ok=True)
    log_file = os.path.abspath(cfg.log_file) if cfg.log_file else str(d / "offcut-power-epilog.log")
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(shlex.quote(a) for a in power_epilog_command(cfg, log_file))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = ("#!/bin/sh\n"
            f"# Offcut node Epilog: restores the default GPU power limits of the ending job,\n"
            f"# written by `offcut-slurm install-power-epilog` ({when}). slurmd runs it as root\n"
            "# with SLURM_JOB_ID and SLURM_JOB_GPUS set. Every path is absolute; it always exits\n"
            "# 0: an error is logged, never a drained node.\n"
            f"{cmd} </dev/null >/dev/null 2>>{shlex.quote(log_file)}\n"
            "exit 0\n")
    path = d / POWER_EPILOG_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def power_epilog_conf_line(path: str | Path) -> str:
    """The slurm.conf line that runs the wrapper at every job end on a node (a site with an
    ``Epilog`` of its own calls the wrapper from it instead)."""
    return f"Epilog={Path(path).absolute()}"

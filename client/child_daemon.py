"""``offcutd`` as a child process: what replays, benchmarks and tests use to run a private
daemon (start it, wait until it serves, stop it cleanly). A client-side tool: it talks to the
daemon only through :class:`offcut.client.Client` (the daemon imports nothing of the client)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from offcut.client.api import Client
from offcut.errors import Unavailable


def offcutd_argv() -> list[str]:
    """The command that starts ``offcutd`` from this interpreter's environment: the console
    script beside ``sys.executable`` when installed, else ``python -m offcut.daemon``."""
    exe = shutil.which("offcutd", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "offcut.daemon"]


def start_offcutd(cmd: list[str], address: str, log_path: Path, *, append: bool = False,
                  timeout_s: float = 60.0) -> subprocess.Popen:
    """Start ``cmd`` (an ``offcutd`` command line listening on ``address``) with stdout and
    stderr in ``log_path`` (appended to with ``append``), and wait up to ``timeout_s`` [s]
    until it answers health checks. Returns the process.

    Raises :class:`Unavailable` with the tail of the log when it does not serve in time (the
    process is killed first)."""
    with open(log_path, "ab" if append else "wb") as log_fh:
        proc = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        with Client(address) as probe:
            probe.wait_ready(timeout_s)
    except Unavailable:
        proc.kill()
        proc.wait()
        tail = Path(log_path).read_text(errors="replace")[-2000:]
        raise Unavailable(f"offcutd did not start:\n{tail}") from None
    return proc


def stop_offcutd(proc: subprocess.Popen | None, grace_s: float = 30.0) -> None:
    """SIGTERM (a clean shutdown), SIGKILL when it has not exited after ``grace_s`` [s];
    reaps the process. Nothing for None or a process that already exited."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()

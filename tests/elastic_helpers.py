"""Helpers of tests/test_elastic.py: real training processes (one per rank, gloo on
127.0.0.1) with the environment of docs/execution.md, their output in files, and waits on
conditions with deadlines (daemon_helpers.wait_until; the suite runs on a loaded 2-core box:
never fixed sleeps)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from daemon_helpers import DEADLINE_S, wait_until

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "elastic_digits" / "train.py"

#: a process that only joins a rendezvous (logs at INFO, then says "up")
RENDEZVOUS_ONLY = (
    "import logging, sys\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
    "from offcut.client.elastic import ElasticRun\n"
    "ElasticRun.from_env(rendezvous_timeout_s=120).start()\n"
    "print('up', flush=True)\n")

#: a process that loads the latest checkpoint, says which, then does one collective
LOAD_ONLY = (
    "import logging, sys\n"
    "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
    "from offcut.client.elastic import ElasticRun\n"
    "with ElasticRun.from_env(timeout_s=30) as run:\n"
    "    ck = run.load_checkpoint()\n"
    "    print('loaded', None if ck is None else ck['samples_done'], flush=True)\n"
    "    run.should_stop()\n")

#: the example (argv as for train.py), whose rank ``$OFFCUT_TEST_SIGNAL_RANK`` sends itself the
#: stop signal (or ``$OFFCUT_TEST_SIGNAL``, e.g. ``KILL``) at the first step at which it has
#: trained ``$OFFCUT_TEST_SIGNAL_AT`` samples: a real signal (the same handler, flag and
#: collective as a signal from outside) at a deterministic step, so that a test never races a
#: training whose epochs take a fraction of a second (e.g. to stop in the middle of a given
#: Zeus epoch)
SIGNAL_AT_SAMPLES = (
    "import os, runpy, signal, sys, time\n"
    "from offcut.client.elastic import ElasticRun\n"
    "at = int(os.environ['OFFCUT_TEST_SIGNAL_AT'])\n"
    "mine = os.environ['RANK'] == os.environ.get('OFFCUT_TEST_SIGNAL_RANK', '0')\n"
    "name = os.environ.get('OFFCUT_TEST_SIGNAL', '')\n"
    "step = ElasticRun.step\n"
    "def step_signalled(self, samples_done, state):\n"
    "    if mine and samples_done >= at and not self.stop_requested:\n"
    "        signal.raise_signal(signal.Signals['SIG' + name] if name else self.env.stop_signal)\n"
    "        end = time.monotonic() + 10\n"
    "        while not self.stop_requested and time.monotonic() < end:\n"
    "            time.sleep(0.001)  # the handler runs in this (the main) thread\n"
    "    return step(self, samples_done, state)\n"
    "ElasticRun.step = step_signalled\n"
    f"sys.argv[0] = {str(EXAMPLE)!r}\n"
    f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\n")

_INHERITED_OUT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    """A TCP port nobody listens on now (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_listening(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Rank:
    """One process of a generation; stdout/stderr go to files under ``logs``."""

    def __init__(self, argv: list[str], env: dict[str, str], logs: Path, name: str):
        logs.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.out_path, self.err_path = logs / f"{name}.out", logs / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=REPO)
        self.started = time.monotonic()
        self.ended: float | None = None

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, pattern: str, stream: str = "err", timeout_s: float = DEADLINE_S):
        """The first match of ``pattern`` in the process's stream; fails early when the
        process ended without printing it."""
        rx = re.compile(pattern)

        def seen():
            m = rx.search(getattr(self, stream))
            if m:
                return m
            if self.proc.poll() is not None:  # one last look: it may have just printed it
                m = rx.search(getattr(self, stream))
                if m:
                    return m
                raise AssertionError(f"{self.name} exited {self.proc.returncode} without "
                                     f"printing {pattern!r}:\n{self.tail()}")
            return None

        return wait_until(seen, f"{pattern!r} from {self.name}", timeout_s)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = DEADLINE_S) -> int:
        """The exit status (negative: killed by that signal); AssertionError (after killing
        it) when it runs past ``timeout_s``."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} still running after {timeout_s:.0f} s:\n"
                                 f"{self.tail()}") from None
        if self.ended is None:
            self.ended = time.monotonic()
        return rc

    def tail(self, n: int = 3000) -> str:
        return f"--- {self.name} stdout:\n{self.out[-n:]}\n--- stderr:\n{self.err[-n:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rank_env(rank: int, world_size: int, port: int, checkpoint_dir: Path, *,
             generation: int | None = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one process (docs/execution.md; one process per node), without
    anything of that kind inherited from the test's own environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OFFCUT_") and k not in _INHERITED_OUT}
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OFFCUT_CHECKPOINT_DIR=str(checkpoint_dir), OFFCUT_NUM_NODES=str(world_size),
               OFFCUT_NODE=f"n{rank + 1}", OFFCUT_STOP_SIGNAL="USR1",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if generation is not None:
        env["OFFCUT_GENERATION"] = str(generation)
    env.update(extra or {})
    return env


class Generation:
    """All ranks of one generation of the example (or of another script)."""

    def __init__(self, world_size: int, checkpoint_dir: Path, logs: Path, args: list[str], *,
                 generation: int | None = 1, extra: dict[str, str] | None = None,
                 script: list[str] | None = None):
        self.port = free_port()
        self.generation = generation
        argv = [sys.executable, *(script or [str(EXAMPLE)]), *args]
        self.ranks = [Rank(argv, rank_env(r, world_size, self.port, checkpoint_dir,
                                          generation=generation, extra=extra),
                           logs, f"gen{generation}-rank{r}")
                      for r in range(world_size)]

    def wait(self, timeout_s: float = DEADLINE_S) -> list[int]:
        """Every rank's exit status (one shared deadline)."""
        end = time.monotonic() + timeout_s
        return [r.wait(max(0.1, end - time.monotonic())) for r in self.ranks]

    def tails(self) -> str:
        return "\n".join(r.tail() for r in self.ranks)

    def kill(self) -> None:
        for r in self.ranks:
            r.kill()


def final_accuracy(text: str) -> tuple[float, int]:
    """(accuracy [%], samples) of the example's ``final test accuracy`` line."""
    m = re.search(r"final test accuracy: (\d+\.\d+)% after (\d+) samples", text)
    assert m, f"no final accuracy line in:\n{text[-2000:]}"
    return float(m.group(1)), int(m.group(2))


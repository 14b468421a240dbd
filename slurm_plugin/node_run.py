"""``python -I .../offcut/slurm_plugin/node_run.py`` (or ``python -m
offcut.slurm_plugin.node_run``): the per-node supervisor of one job of a generation
(docs/execution.md, "Processes per node"). The launcher runs this file by its path with any
interpreter every user may run (``[slurm] node_python``), since it imports only the standard
library.

The batch script of a task's job on a node exports the generation's environment
(docs/execution.md, "What every process gets") and ``exec``-s this module, which starts the
node's ``--procs`` processes of the command and supervises them, as torchrun's agent does for
its workers but keeping the execution protocol's exit codes:

- process ``i`` (``LOCAL_RANK`` = i) gets ``RANK`` = node rank x procs + i, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE`` = procs, torchrun's ``GROUP_RANK`` / ``GROUP_WORLD_SIZE`` (the node's
  index and the node count) and ``OFFCUT_LOCAL_GPUS``: the positions, among the node's visible
  GPUs (``CUDA_VISIBLE_DEVICES``, set by Slurm from ``--gres``), of the ``--gpus-per-proc``
  GPUs that are its own (``i*k .. i*k+k-1``; empty for a CPU task). ``CUDA_VISIBLE_DEVICES``
  is left as Slurm set it, so a script written for torchrun (``cuda:LOCAL_RANK``) runs as is;
- the signals the batch shell gets (the stop signal, ``SIGTERM``, ``SIGINT``, ``SIGHUP``: sent
  by Slurm ahead of a preemption with ``--signal=B:SIG``, or by the launcher's ``scancel
  --batch --signal``) are forwarded to every process;
- the run's end is the worst of its processes': the first process that **fails** (an exit
  status other than 0 and 75, or killed by a signal) fails the run at once: the others get
  ``SIGTERM``, then ``SIGKILL`` after :data:`KILL_AFTER_S`, and this process ends as the failed
  one did (the same exit status, or killed by the same signal). Otherwise it waits for every
  process and exits **75** when any exited 75 (checkpointed, or saw a peer vanish), **0** when
  all exited 0;
- its processes die with it (``PR_SET_PDEATHSIG``), so a supervisor killed by Slurm at the end
  of the job's grace time leaves nothing running;
- each process's stderr comes through a pipe: a thread per process relays every byte to this
  process's stderr as it arrives (so the job's output file still has everything, in order per
  process) and keeps its last :data:`TAIL_LINES` lines (each cut to :data:`TAIL_LINE_CHARS`
  characters; a carriage return ends a line too). When a process fails, the run's first
  failure is written to ``--checkpoint-dir``/:data:`FAILURE_FILE` (:func:`write_failure_note`):
  ``job JOBID local rank K exit CODE`` and those lines, which the launcher adds to the run's
  failure report (:mod:`offcut.slurm_plugin.job_failure`; docs/execution.md, "Wasted work").

Why not torchrun or ``srun``: measured with torch 2.13, ``torchrun --signals-to-handle
SIGUSR1`` forwards the signal but exits 1 when its workers exit 75 (and when all exit 75 with
no signal, and when one crashes): it cannot tell a checkpointed stop from a failure. ``srun``
returns the highest exit status of its tasks, so a crash (1) next to peers that exited 75 reads
as 75 (Slurm's srun(1), "RETURN VALUE"). Both start processes the same way otherwise; this
module is only that part (no rendezvous: the processes still meet on ``MASTER_ADDR``).

Only the standard library is imported (Python 3.9 or later): the supervisor starts in a few
tens of milliseconds, under any interpreter of the node.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Mapping, Sequence

#: exit status of a process that checkpointed (or lost a peer): restart me (docs/execution.md)
EXIT_RESTART = 75
#: seconds the other processes of a failed run get after SIGTERM before SIGKILL
KILL_AFTER_S = 10.0
#: signals forwarded to every process, besides the stop signal
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: largest --procs (offcut.taskspec.MAX_PROCS_PER_NODE)
MAX_PROCS = 64

#: lines of a process's stderr kept for the failure note, and characters kept of each line
TAIL_LINES = 20
TAIL_LINE_CHARS = 300
#: the failure note in the task's checkpoint folder: one per folder, the latest failure's
FAILURE_FILE = "offcut-last-failure.txt"
#: largest failure note [bytes] (the oldest kept lines are dropped to fit)
MAX_NOTE_BYTES = 8192
#: seconds a failed process's relay may take to reach the end of its stderr before the note
#: is written (a child of the process may still hold the pipe open), and to drain the others'
#: at the end of the run
DRAIN_S = 2.0

_PR_SET_PDEATHSIG = 1
#: bytes of an unfinished line kept (a longer line is cut to :data:`TAIL_LINE_CHARS` anyway)
_LINE_BYTES = 4 * TAIL_LINE_CHARS
_READ_BYTES = 65536


def process_environment(base: Mapping[str, str], *, local_rank: int, procs: int, node_rank: int,
                        num_nodes: int, gpus_per_proc: int) -> dict[str, str]:
    """The environment of local process ``local_rank`` of ``procs`` on the node of index
    ``node_rank`` of ``num_nodes``: ``base`` plus ``RANK``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE`` (= nodes x procs), ``GROUP_RANK``,
    ``GROUP_WORLD_SIZE`` and ``OFFCUT_LOCAL_GPUS`` (comma-separated positions among the visible
    GPUs: ``gpus_per_proc`` of them from ``local_rank * gpus_per_proc``; empty without GPUs)."""
    env = dict(base)
    env.update(RANK=str(node_rank * procs + local_rank), LOCAL_RANK=str(local_rank),
               LOCAL_WORLD_SIZE=str(procs), WORLD_SIZE=str(num_nodes * procs),
               GROUP_RANK=str(node_rank), GROUP_WORLD_SIZE=str(num_nodes),
               OFFCUT_LOCAL_GPUS=",".join(str(local_rank * gpus_per_proc + j)
                                          for j in range(gpus_per_proc)))
    return env


def exit_status(returncode: int) -> int:
    """A ``Popen.returncode`` as a shell would report it (a signal S as 128 + S)."""
    return 128 - returncode if returncode < 0 else returncode


def run_outcome(returncodes: Sequence[int]) -> int | None:
    """The run's end from its processes' ``Popen.returncode`` values in the order they ended
    (negative: killed by that signal): the first failure (not 0, not 75); else 75 when any
    exited 75; else 0. None for no process."""
    if not returncodes:
        return None
    for rc in returncodes:
        if rc not in (0, EXIT_RESTART):
            return rc
    return EXIT_RESTART if EXIT_RESTART in returncodes else 0


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the supervisor dies; no signal blocked."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: Slurm's process tracking still ends them
        pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


class StderrTail:
    """Relays one process's stderr (the read end of its pipe, ``fd``, closed at its end) to
    ``out_fd`` unchanged, chunk by chunk as it arrives, under ``lock`` (one writer at a time),
    in a thread of its own; keeps the last :data:`TAIL_LINES` lines, each cut to
    :data:`TAIL_LINE_CHARS` characters (bounded however long a line or the output is: a line
    longer than that is kept by its start). A line ends at ``\\n`` or ``\\r`` (a progress
    bar's updates are lines); empty lines are not kept. A failed write to ``out_fd`` drops
    the chunk and the relay goes on (the process never blocks on a full pipe)."""

    def __init__(self, fd: int, out_fd: int, lock: threading.Lock):
        self.fd, self.out_fd, self.lock = fd, out_fd, lock
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = bytearray()
        self._thread = threading.Thread(target=self._relay, name=f"stderr-{fd}", daemon=True)

    def start(self) -> None:
        """Start relaying."""
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` [s] for the end of the stream; True when it ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _relay(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self.fd, _READ_BYTES)
                except OSError:
                    break
                if not data:
                    break
                with self.lock:
                    view = memoryview(data)
                    try:
                        while view:
                            view = view[os.write(self.out_fd, view):]
                    except OSError:
                        pass
                self.feed(data)
        finally:
            self._end_line()
            os.close(self.fd)

    def feed(self, data: bytes) -> None:
        """Take ``data`` (the next bytes of the stream) into the kept lines."""
        parts = data.replace(b"\r", b"\n").split(b"\n")
        for part in parts[:-1]:
            self._add(part)
            self._end_line()
        self._add(parts[-1])

    def _add(self, part: bytes) -> None:
        room = _LINE_BYTES - len(self._partial)
        if room > 0:
            self._partial += part[:room]

    def _end_line(self) -> None:
        line = bytes(self._partial).decode("utf-8", "replace").strip()
        self._partial.clear()
        if line:
            self.lines.append(line[:TAIL_LINE_CHARS])


def failure_note(job_id: str, local_rank: int, returncode: int, lines: Sequence[str]) -> bytes:
    """The failure note (UTF-8): ``job JOB_ID local rank K exit CODE`` (the exit status as a
    shell reports it: 128 + S for signal S), then ``lines``, one a line, the oldest dropped
    until it fits :data:`MAX_NOTE_BYTES`."""
    head = f"job {job_id} local rank {local_rank} exit {exit_status(returncode)}\n".encode()
    body = [line.replace("\n", " ").encode("utf-8", "replace") + b"\n" for line in lines]
    while body and len(head) + sum(map(len, body)) > MAX_NOTE_BYTES:
        body.pop(0)
    return head + b"".join(body)


def write_failure_note(folder: str, note: bytes) -> None:
    """Write ``note`` as ``folder``/:data:`FAILURE_FILE`, atomically (a temporary file made
    with ``O_EXCL | O_NOFOLLOW``, mode 0600, then renamed over the old note), as this
    process's user.

    Raises:
        OSError: it cannot be written (the temporary file is removed).
    """
    tmp = os.path.join(folder, f".{FAILURE_FILE}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)  # left by an earlier supervisor of the same pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        try:
            view = memoryview(note)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(folder, FAILURE_FILE))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class NodeRun:
    """The processes of one node of a generation.

    Args:
        line: the shell line each process runs (``bash -c 'exec LINE'``).
        procs: processes to start, 1 to :data:`MAX_PROCS`.
        node_rank, num_nodes: the node's index in the generation and the node count.
        gpus_per_proc: GPUs of each process (0: a CPU task).
        stop_signal: the launcher's stop signal, forwarded like :data:`FORWARDED`.
        environ: the environment every process starts from (default ``os.environ``).
        kill_after_s: seconds between SIGTERM and SIGKILL of the others after a failure [s].
        failure_dir: the folder of the failure note (:func:`write_failure_note`; None: none
            is written), normally the task's checkpoint folder.
    """

    def __init__(self, line: str, *, procs: int, node_rank: int, num_nodes: int,
                 gpus_per_proc: int = 0, stop_signal: signal.Signals = signal.SIGUSR1,
                 environ: Mapping[str, str] | None = None, kill_after_s: float = KILL_AFTER_S,
                 failure_dir: str | None = None):
        if not 1 <= procs <= MAX_PROCS:
            raise ValueError(f"--procs must be 1 to {MAX_PROCS}, got {procs}")
        if not 0 <= node_rank < num_nodes:
            raise ValueError(f"--node-rank must be 0 to {num_nodes - 1}, got {node_rank}")
        self.line, self.procs = line, procs
        self.node_rank, self.num_nodes, self.gpus_per_proc = node_rank, num_nodes, gpus_per_proc
        self.signals = sorted({int(stop_signal), *(int(s) for s in FORWARDED)})
        self.environ = os.environ if environ is None else environ
        self.kill_after_s = kill_after_s
        self.failure_dir = failure_dir
        self.children: list[subprocess.Popen] = []
        self.tails: list[StderrTail] = []  # per process, as self.children
        self._out_lock = threading.Lock()
        self.ended: list[int] = []  # returncodes in the order the processes ended

    def _forward(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        print(f"offcut node_run: got {name}, forwarding it to {self._alive_count()} "
              f"process(es)", file=sys.stderr, flush=True)
        self._send(signum)

    def _alive_count(self) -> int:
        return sum(1 for c in self.children if c.returncode is None)

    def _send(self, signum: int) -> None:
        for child in self.children:
            if child.returncode is None:
                try:
                    os.kill(child.pid, signum)
                except ProcessLookupError:  # ended, not reaped yet
                    pass

    def start(self) -> None:
        """Start the processes, with the forwarded signals held until all exist (a signal
        that came meanwhile reaches every one of them), and the relays of their stderr
        (:class:`StderrTail`, whose threads keep the signals held: they reach this thread)."""
        for s in self.signals:
            signal.signal(s, self._forward)
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        try:
            for i in range(self.procs):
                env = process_environment(self.environ, local_rank=i, procs=self.procs,
                                          node_rank=self.node_rank, num_nodes=self.num_nodes,
                                          gpus_per_proc=self.gpus_per_proc)
                child = subprocess.Popen(["/bin/bash", "-c", "exec " + self.line], env=env,
                                         stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
                self.children.append(child)
                tail = StderrTail(os.dup(child.stderr.fileno()), sys.stderr.fileno(),
                                  self._out_lock)
                child.stderr.close()
                self.tails.append(tail)
                tail.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)

    def _reap(self, block: bool) -> bool:
        """Reap one ended process (``block``: wait for one). False when none ended."""
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return False
        for child in self.children:
            if child.pid == pid and child.returncode is None:
                child.returncode = os.waitstatus_to_exitcode(status)
                self.ended.append(child.returncode)
                return True
        return True  # not ours (cannot happen: we start no other child)

    def _stop_the_rest(self) -> None:
        """SIGTERM to the processes still running, SIGKILL after ``kill_after_s``."""
        self._send(signal.SIGTERM)
        deadline = time.monotonic() + self.kill_after_s
        while self._alive_count() and time.monotonic() < deadline:
            if not self._reap(block=False):
                time.sleep(0.05)
        if self._alive_count():
            self._send(signal.SIGKILL)
            while self._alive_count() and self._reap(block=True):
                pass

    def wait(self) -> int:
        """Wait for the run's end (:func:`run_outcome`); returns the winning returncode."""
        while self._alive_count():
            self._reap(block=True)
            last = self.ended[-1] if self.ended else 0
            if last not in (0, EXIT_RESTART):
                i = next(c for c in self.children if c.returncode == last)
                rank = self.children.index(i)
                self._stop_the_rest()  # at once: the peers wait for nothing of the failed rank
                # then its stderr (its last line may not have reached the output yet: the
                # message must not land inside it), at most DRAIN_S
                self.tails[rank].join(DRAIN_S)
                with self._out_lock:
                    print(f"offcut node_run: local rank {rank} failed "
                          f"({_describe(last)}); the other processes were stopped",
                          file=sys.stderr, flush=True)
                self._note_failure(rank, last)
                break
        deadline = time.monotonic() + DRAIN_S  # the last lines reach the output file
        for tail in self.tails:
            tail.join(max(0.0, deadline - time.monotonic()))
        outcome = run_outcome(self.ended)
        return 0 if outcome is None else outcome

    def _note_failure(self, rank: int, returncode: int) -> None:
        """Write the failure note of local rank ``rank`` (ended with ``returncode``) when
        there is a folder for it, after its stderr's end (at most :data:`DRAIN_S`); a write
        that fails is one line on stderr."""
        if self.failure_dir is None:
            return
        tail = self.tails[rank]
        tail.join(DRAIN_S)
        note = failure_note(self.environ.get("SLURM_JOB_ID", "-"), rank, returncode,
                            list(tail.lines))
        try:
            write_failure_note(self.failure_dir, note)
        except OSError as exc:
            with self._out_lock:
                print(f"offcut node_run: cannot write the failure note in "
                      f"{self.failure_dir}: {exc}", file=sys.stderr, flush=True)


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def end_as(returncode: int) -> None:
    """End this process as a process with ``returncode`` ended: that exit status, or killed
    by the same signal (so Slurm records the job as its process ended)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if returncode < 0:
        sig = -returncode
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the signal is delivered before this returns; a stopped-only one is not
        os._exit(exit_status(returncode))
    os._exit(returncode)


class UnsafeFolder(Exception):
    """A checkpoint folder cannot be used safely; the message names the path component."""


def make_private_dir(path: str, uid: int | None = None) -> None:
    """Create (or check) the task's checkpoint folder ``path`` safely, as the job's user
    (``uid``, default this process's effective uid), walking it from ``/`` one component at a
    time with ``open(O_NOFOLLOW | O_DIRECTORY)`` relative to the folder above (``openat``), so
    no component can be swapped for a link between its check and its use:

    - a component that is a symbolic link, or not a folder, is refused (anywhere on the path,
      not only the last: a link planted at ``/scratch/USER`` would steer everything below);
    - every existing component must belong to root or to ``uid``, and must not be writable by
      group or others unless it is sticky (``/tmp``-like): otherwise its owner or group could
      rename what lies below it;
    - a missing component is created with mode 0700 (the job's umask cannot widen it), then
      opened the same way (a link planted in between is refused);
    - the last component (the task's folder) must belong to ``uid``; it is set to mode 0700.

    Raises:
        UnsafeFolder: a relative path, a ``..`` component, a link, a non-folder, a component
            of another user or writable by others, or an ``OSError`` while walking; the message
            names the component.
    """
    import stat

    uid = os.geteuid() if uid is None else uid
    if not path.startswith("/"):
        raise UnsafeFolder(f"{path!r} is not an absolute path")
    parts = [c for c in path.split("/") if c and c != "."]
    if ".." in parts:
        raise UnsafeFolder(f"{path!r} has a '..' component")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    here = "/"
    try:
        for i, name in enumerate(parts):
            here = os.path.join(here, name)
            last = i == len(parts) - 1
            try:
                child = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:  # made by another node's job a moment ago
                    pass
                try:
                    child = os.open(name, flags, dir_fd=fd)
                except OSError as exc:
                    raise UnsafeFolder(f"{here}: {exc.strerror or exc} (a link is refused)") \
                        from None
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
                raise UnsafeFolder(f"{here} is a link or not a folder ({exc.strerror or exc})") \
                    from None
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            if last:
                if st.st_uid != uid:
                    raise UnsafeFolder(f"{here} belongs to uid {st.st_uid}, not to the task's "
                                       f"owner (uid {uid})")
                if stat.S_IMODE(st.st_mode) != 0o700:
                    os.fchmod(fd, 0o700)
            elif st.st_uid not in (0, uid):
                raise UnsafeFolder(f"{here} belongs to uid {st.st_uid}, neither root nor the "
                                   f"task's owner (uid {uid}), who could replace what is below it")
            elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                raise UnsafeFolder(f"{here} is writable by group or others and not sticky "
                                   f"(mode {stat.S_IMODE(st.st_mode):04o}): others could replace "
                                   "what is below it")
    except OSError as exc:
        raise UnsafeFolder(f"{here}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _parse_signal(text: str) -> signal.Signals:
    name = text.strip().upper()
    if name.isdigit():
        return signal.Signals(int(name))
    return signal.Signals[name if name.startswith("SIG") else "SIG" + name]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``node_run --procs N --node-rank R --num-nodes M [--gpus-per-proc K]
    [--stop-signal USR1] [--checkpoint-dir PATH] -- LINE``; with ``--checkpoint-dir`` the
    task's checkpoint folder is made safely first (:func:`make_private_dir`; exit 1 with one
    line when it cannot be used); ends as :meth:`NodeRun.wait` says (:func:`end_as`)."""
    p = argparse.ArgumentParser(
        prog="python -m offcut.slurm_plugin.node_run",
        description="Start the processes of one node of an Offcut generation and supervise "
                    "them (docs/execution.md, 'Processes per node').")
    p.add_argument("--procs", type=int, required=True, help=f"processes, 1-{MAX_PROCS}")
    p.add_argument("--node-rank", type=int, required=True, help="the node's index in the generation")
    p.add_argument("--num-nodes", type=int, required=True, help="the generation's node count")
    p.add_argument("--gpus-per-proc", type=int, default=0, help="GPUs of each process (0: CPU)")
    p.add_argument("--stop-signal", default="USR1", help="the launcher's stop signal")
    p.add_argument("--kill-after-s", type=float, default=KILL_AFTER_S,
                   help="seconds between SIGTERM and SIGKILL of the others after a failure")
    p.add_argument("--checkpoint-dir", default=None,
                   help="create (or check) the task's checkpoint folder safely first "
                        "(make_private_dir); exit 1 when it cannot be used")
    p.add_argument("line", nargs=argparse.REMAINDER, help="-- then the shell line to run")
    args = p.parse_args(argv)
    line = args.line[1:] if args.line[:1] == ["--"] else args.line
    if not line:
        p.error("no command (give it after --)")
    if args.checkpoint_dir is not None:
        try:
            make_private_dir(args.checkpoint_dir)
        except UnsafeFolder as exc:
            print(f"offcut: cannot use the checkpoint folder: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)
    try:
        stop = _parse_signal(args.stop_signal)
        run = NodeRun(" ".join(line), procs=args.procs, node_rank=args.node_rank,
                      num_nodes=args.num_nodes, gpus_per_proc=args.gpus_per_proc,
                      stop_signal=stop, kill_after_s=args.kill_after_s,
                      failure_dir=args.checkpoint_dir)
    except (ValueError, KeyError) as exc:
        p.error(str(exc))
    run.start()
    end_as(run.wait())


if __name__ == "__main__":
    main()

"""Training side of the execution protocol (docs/execution.md): a few lines that turn a script
written for plain ``torchrun`` into one that trains through Offcut's grows, shrinks and
preemptions.

Every change of a task's nodes is a restart: the launcher starts a new **generation** of
processes (a fixed set of nodes, a fixed world size, one **rendezvous** on
``MASTER_ADDR:MASTER_PORT``), which resumes from the latest **checkpoint** in
``OFFCUT_CHECKPOINT_DIR``. :class:`ElasticRun` does the script's part of that contract:

- reads the environment (:meth:`ElasticEnv.from_env`),
- joins the generation's rendezvous and sets up the ``torch.distributed`` process group
  (gloo on CPU, nccl on the ``LOCAL_RANK`` GPU) with a bounded collective timeout,
- finds and loads the latest complete checkpoint, writes new ones atomically (rank 0 only,
  the last ``keep`` kept) and reports ``samples_done`` as of each to the daemon,
- turns the stop signal (``OFFCUT_STOP_SIGNAL``, and ``SIGTERM``) into a flag that every rank
  sees at the same step (:meth:`ElasticRun.should_stop`, one ``all_reduce``),
- exits with the protocol's codes: **75** (checkpointed, or a peer vanished: restart me),
  **0** (done); any other exception propagates (exit 1: a failure of the run). The exits skip
  ``with`` blocks and ``finally`` clauses: ``on_restart=`` runs before every exit 75 (e.g. to
  suspend a Zeus trial, examples/elastic_digits).

Minimal loop (one process per rank, under ``offcut-slurm launch`` or ``torchrun``)::

    from offcut.client.elastic import ElasticRun

    with ElasticRun.from_env(checkpoint_every_s=300) as run:   # rendezvous happens here
        model = DDP(Net().to(run.device))
        ckpt = run.load_checkpoint()                         # None on the first generation
        if ckpt is not None:
            model.module.load_state_dict(ckpt["state"]["model"])
            opt.load_state_dict(ckpt["state"]["opt"])
        done = run.samples_done                               # cumulative samples [samples]
        while done < total:
            train_step(global_batch(done))                    # data order by sample index
            done += global_batch_size
            run.step(done, lambda: {"model": model.module.state_dict(),
                                    "opt": opt.state_dict()})  # every rank, every step
        run.save_checkpoint({...}, done)                      # the final one completes the task
        evaluate_and_print(model)
    # not reached: the end of the block exits 0

:meth:`ElasticRun.step` is the one collective per step: on a stop it writes a checkpoint on
rank 0 and exits 75 on every rank; otherwise it writes one when ``checkpoint_every_s`` or
``checkpoint_every_steps`` says so. The context manager maps the block's outcome to the exit
codes: its end to 0, a lost peer (a collective that raises a connection error or times out)
to 75; every other exception goes through (exit 1). The exits skip the interpreter's teardown
(``hard_exit``), where torch.distributed's C++ objects occasionally abort the process.

Signals: until the process group is up (during the rendezvous, which blocks in C++ where
Python handlers cannot run) the stop signal and ``SIGTERM`` keep their default action, so a
generation replaced during its rendezvous dies at once; afterwards they only set a flag.

Outside the launcher (local runs) set ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` (``torchrun`` does) and ``OFFCUT_CHECKPOINT_DIR`` or ``checkpoint_dir=``;
without ``OFFCUT_TASK_ID`` and ``OFFCUT_ADDRESS`` nothing is reported.

``torch`` is imported only by what needs it (the process group and checkpoint I/O), so the
environment and checkpoint-selection helpers work without it.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

log = logging.getLogger("offcut.client.elastic")

#: exit code of a run whose task's work is done (the task is COMPLETED)
EXIT_DONE = 0
#: exit code of a run that checkpointed (or had nothing to save, or lost a peer): restart me
EXIT_RESTART = 75  # EX_TEMPFAIL

#: name of a complete checkpoint: ``ckpt-<samples_done>.pt``
CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.pt")

#: phrases of the errors torch.distributed backends raise when a peer vanished or hangs
_PEER_LOSS_RE = re.compile(
    r"connection (?:closed|reset|refused|aborted)|(?:closed|reset) by peer|broken pipe"
    r"|timed out|socket timeout|ECONNRESET|EPIPE|gloo/transport|communicator was aborted"
    r"|remote process exited|network error", re.IGNORECASE)

StateArg = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


# ----------------------------------------------------------------------------- environment
def parse_signal(value: str, variable: str = "OFFCUT_STOP_SIGNAL") -> signal.Signals:
    """A signal from ``USR1``, ``SIGUSR1`` or a number (``10``); ``ValueError`` naming
    ``variable`` otherwise."""
    text = value.strip()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        name = text.upper()
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise ValueError(f"{variable} must be a signal name (USR1, SIGUSR1) or number, "
                         f"got {value!r}") from None


def _int_var(env: Mapping[str, str], name: str, *, default: int | None = None,
             minimum: int = 0, maximum: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ValueError(f"{name} is not set (an integer >= {minimum}; run under "
                             f"offcut-slurm launch or torchrun, or set it)")
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if v < minimum or (maximum is not None and v > maximum):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {v}")
    return v


@dataclass(frozen=True)
class ElasticEnv:
    """What one process of a generation gets (docs/execution.md, "What every process gets").

    Attributes:
        rank, world_size: this process's rank in ``0 .. world_size - 1`` and the generation's
            process count (``RANK``, ``WORLD_SIZE``).
        local_rank, local_world_size: the process's index on its node and the count there
            (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; default 0 and 1).
        master_addr, master_port: the generation's rendezvous (``MASTER_ADDR``,
            ``MASTER_PORT``), hosted by rank 0.
        checkpoint_dir: the task's checkpoints (``OFFCUT_CHECKPOINT_DIR``), on storage every
            node sees.
        generation: ``OFFCUT_GENERATION`` (>= 1 under the launcher; 0 for a local run).
        stop_signal: ``OFFCUT_STOP_SIGNAL`` (default ``SIGUSR1``).
        task_id, address: the task and the daemon (``OFFCUT_TASK_ID``, ``OFFCUT_ADDRESS``);
            None for a local run (then nothing is reported).
        num_nodes: the generation's node count (``OFFCUT_NUM_NODES``; default ``world_size //
            local_world_size``): the ``nodes`` of progress reports.
        task_name, node, nodelist: ``OFFCUT_TASK_NAME``, ``OFFCUT_NODE``, ``OFFCUT_NODELIST``
            (informational; None when unset).
    """

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    checkpoint_dir: Path
    local_rank: int = 0
    local_world_size: int = 1
    generation: int = 0
    stop_signal: signal.Signals = signal.SIGUSR1
    task_id: str | None = None
    address: str | None = None
    num_nodes: int = 1
    task_name: str | None = None
    node: str | None = None
    nodelist: str | None = None

    @property
    def reports_progress(self) -> bool:
        """True when both the task and the daemon are known (``OFFCUT_TASK_ID`` and
        ``OFFCUT_ADDRESS``)."""
        return bool(self.task_id and self.address)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 checkpoint_dir: str | os.PathLike | None = None) -> "ElasticEnv":
        """Read the protocol's variables from ``environ`` (default ``os.environ``).

        Args:
            checkpoint_dir: used when ``OFFCUT_CHECKPOINT_DIR`` is unset or empty (local runs).

        Raises:
            ValueError: naming the first missing or malformed variable: ``RANK``,
                ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the checkpoint directory
                are required; ``RANK`` must be below ``WORLD_SIZE``, ``MASTER_PORT`` in
                1..65535, ``OFFCUT_GENERATION`` >= 1 when set, ``OFFCUT_NUM_NODES`` >= 1,
                ``OFFCUT_STOP_SIGNAL`` a signal.
        """
        env = os.environ if environ is None else environ
        world_size = _int_var(env, "WORLD_SIZE", minimum=1)
        rank = _int_var(env, "RANK", maximum=world_size - 1)
        master_addr = (env.get("MASTER_ADDR") or "").strip()
        if not master_addr:
            raise ValueError("MASTER_ADDR is not set (the host of rank 0's rendezvous)")
        master_port = _int_var(env, "MASTER_PORT", minimum=1, maximum=65535)
        local_world_size = _int_var(env, "LOCAL_WORLD_SIZE", default=1, minimum=1)
        local_rank = _int_var(env, "LOCAL_RANK", default=0, maximum=local_world_size - 1)
        ckpt = (env.get("OFFCUT_CHECKPOINT_DIR") or "").strip() or checkpoint_dir
        if not ckpt:
            raise ValueError("OFFCUT_CHECKPOINT_DIR is not set (the task's checkpoint "
                             "directory on shared storage; or pass checkpoint_dir=)")
        generation = 0
        if (env.get("OFFCUT_GENERATION") or "").strip():
            generation = _int_var(env, "OFFCUT_GENERATION", minimum=1)
        stop = parse_signal(env.get("OFFCUT_STOP_SIGNAL") or "USR1")
        num_nodes = _int_var(env, "OFFCUT_NUM_NODES",
                             default=max(1, world_size // local_world_size), minimum=1)
        return cls(rank=rank, world_size=world_size, master_addr=master_addr,
                   master_port=master_port, checkpoint_dir=Path(ckpt), local_rank=local_rank,
                   local_world_size=local_world_size, generation=generation, stop_signal=stop,
                   task_id=env.get("OFFCUT_TASK_ID") or None,
                   address=env.get("OFFCUT_ADDRESS") or None, num_nodes=num_nodes,
                   task_name=env.get("OFFCUT_TASK_NAME") or None,
                   node=env.get("OFFCUT_NODE") or None,
                   nodelist=env.get("OFFCUT_NODELIST") or None)


# ----------------------------------------------------------------------------- checkpoints
def checkpoint_files(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints in ``directory``: ``(samples_done, path)`` sorted by samples,
    oldest first. Temporary files of writers (``.ckpt-*.tmp``) and other names are ignored;
    a missing directory has none."""
    d = Path(directory)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = CHECKPOINT_RE.fullmatch(name)
        if m:
            found.append((int(m.group(1)), d / name))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> tuple[int, Path] | None:
    """The complete checkpoint with the most samples, ``(samples_done, path)``, or None."""
    files = checkpoint_files(directory)
    return files[-1] if files else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(directory: str | os.PathLike, samples_done: int, payload: Any, *,
                     keep: int = 2) -> Path:
    """Write ``payload`` (anything ``torch.save`` takes) as ``ckpt-<samples_done>.pt``
    atomically: a temporary file in the same directory, ``fsync``, ``os.replace``, ``fsync``
    of the directory. Then remove all but the ``keep`` complete checkpoints with the most
    samples. Creates the directory. Returns the path.

    Raises ``ValueError`` for ``samples_done`` < 0 or ``keep`` < 1, and ``OSError`` /
    torch's errors for a failed write (the temporary file is removed; older checkpoints are
    untouched).
    """
    import torch

    samples_done = int(samples_done)
    if samples_done < 0:
        raise ValueError(f"samples_done must be >= 0, got {samples_done}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"ckpt-{samples_done}.pt"
    fd, tmp = tempfile.mkstemp(prefix=f".ckpt-{samples_done}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(d)
    old = checkpoint_files(d)[:-keep]
    for _, path in old:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    if old:
        _fsync_dir(d)
    return final


# ----------------------------------------------------------------------------- errors
def is_peer_loss(exc: BaseException) -> bool:
    """True when ``exc`` looks like a collective that failed because a peer vanished or
    stopped answering: a ``torch.distributed.DistError`` (``DistBackendError``,
    ``DistNetworkError``, ``DistStoreError``), or a ``RuntimeError`` / ``OSError`` whose
    message is a transport error (gloo's "Connection closed by peer", "Connection reset by
    peer", "Timed out waiting ... for recv operation", a broken pipe, an aborted NCCL
    communicator). Looks through ``__cause__`` / ``__context__``."""
    dist_error = None
    if "torch" in sys.modules:
        try:
            from torch.distributed import DistError as dist_error
        except ImportError:  # torch built without distributed
            dist_error = None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if dist_error is not None and isinstance(exc, dist_error):
            return True
        if isinstance(exc, (RuntimeError, OSError)) and _PEER_LOSS_RE.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# ----------------------------------------------------------------------------- the run
class ElasticRun:
    """One process of one generation of an elastic task (docs/execution.md).

    Args:
        env: the process's environment (:meth:`ElasticEnv.from_env`).
        timeout_s: the collective timeout [s]: a collective that waits this long for a
            silent peer raises (and the run exits 75) instead of hanging (torch's default is
            30 min). Default 120.
        rendezvous_timeout_s: how long the rendezvous waits for every rank [s] (default
            600); a rendezvous that times out raises (exit 1: a failure of the run, e.g. an
            unreachable ``MASTER_ADDR``).
        backend: ``"gloo"`` or ``"nccl"``; None: nccl when CUDA is available and the
            ``LOCAL_RANK`` device exists, else gloo.
        keep: complete checkpoints kept (default 2).
        checkpoint_every_s: :meth:`step` writes a checkpoint when this many seconds [s] have
            passed on rank 0 since the last one (the decision travels with the stop flag, so
            every rank agrees); None: no time-based checkpoints.
        checkpoint_every_steps: :meth:`step` writes a checkpoint every this many calls;
            None: no step-based checkpoints.
        report_timeout_s: deadline of one progress report [s] (rank 0 waits for it while the
            other ranks wait in the next collective: keep it well below ``timeout_s``).
        weights_only: passed to ``torch.load`` (default True: tensors, containers and
            primitive types only; set False for checkpoints holding arbitrary objects you
            trust).
        hard_exit: how :meth:`exit_restart`, :meth:`exit_done` and the context manager end
            the process. True (default): flush stdout/stderr, run the ``atexit`` handlers
            (logging's flush among them), then ``os._exit(code)``, skipping the interpreter's
            teardown, in which torch.distributed's C++ objects (a process group still
            referenced by a DDP module) can abort the process (``terminate called without an
            active exception``, SIGABRT) or hang, turning a clean 0 or 75 into a failure.
            False: raise ``SystemExit(code)`` (for tests in one process, or to run code after
            the block).
        on_restart: called (no arguments) once, before this process exits 75: after the stop's
            checkpoint (:meth:`step`, :meth:`exit_restart`) or on a lost peer (the context
            manager). The exits skip ``with`` blocks and ``finally`` clauses (``hard_exit``),
            so this is where a script ends what must not outlive the process, e.g. suspends its
            Zeus trial (``ZeusTraining.interrupt``). Its exceptions are logged, never raised:
            the exit stays 75. Also settable as the attribute :attr:`on_restart`.

    Attributes:
        samples_done: cumulative samples [samples] of the latest checkpoint this run loaded
            or wrote (0 before any).
        stop_requested: True once this process got the stop signal (or SIGTERM).
        checkpoint_due: the agreed time-based decision of the last :meth:`should_stop`.

    Not thread-safe; create, start and use it in the main thread (signal handlers are
    installed there).
    """

    def __init__(self, env: ElasticEnv, *, timeout_s: float = 120.0,
                 rendezvous_timeout_s: float = 600.0, backend: str | None = None,
                 keep: int = 2, checkpoint_every_s: float | None = None,
                 checkpoint_every_steps: int | None = None, report_timeout_s: float = 5.0,
                 weights_only: bool = True, hard_exit: bool = True,
                 on_restart: Callable[[], Any] | None = None):
        for name, v in (("timeout_s", timeout_s), ("rendezvous_timeout_s", rendezvous_timeout_s),
                        ("report_timeout_s", report_timeout_s)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {v!r}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if checkpoint_every_s is not None and not checkpoint_every_s > 0:
            raise ValueError(f"checkpoint_every_s must be > 0 or None, got {checkpoint_every_s!r}")
        if checkpoint_every_steps is not None and checkpoint_every_steps < 1:
            raise ValueError(f"checkpoint_every_steps must be >= 1 or None, "
                             f"got {checkpoint_every_steps!r}")
        if backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
        self.env = env
        self.timeout_s, self.rendezvous_timeout_s = float(timeout_s), float(rendezvous_timeout_s)
        self.keep, self.report_timeout_s = int(keep), float(report_timeout_s)
        self.checkpoint_every_s = checkpoint_every_s
        self.checkpoint_every_steps = checkpoint_every_steps
        self.weights_only, self.hard_exit = weights_only, hard_exit
        self.on_restart = on_restart
        self._on_restart_done = False
        self._backend = backend
        self.samples_done = 0
        self._has_checkpoint = False
        self.stop_requested = False
        self.checkpoint_due = False
        self._signal_received: int | None = None
        self._saved_handlers: dict[int, Any] = {}
        self._started = self._closed = False
        self._steps = 0
        self._last_checkpoint_t = time.monotonic()
        self._device = None
        self._store = None
        self._reporter = None
        self._report_client = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 checkpoint_dir: str | os.PathLike | None = None, **kwargs) -> "ElasticRun":
        """A run for this process from its environment (:meth:`ElasticEnv.from_env`, whose
        ``ValueError`` it raises); ``kwargs`` go to the constructor."""
        return cls(ElasticEnv.from_env(environ, checkpoint_dir=checkpoint_dir), **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def rank(self) -> int:
        """This process's rank in the generation."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """The generation's process count."""
        return self.env.world_size

    @property
    def generation(self) -> int:
        """The generation (``OFFCUT_GENERATION``; 0 for a local run)."""
        return self.env.generation

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the rank that writes checkpoints and reports)."""
        return self.env.rank == 0

    @property
    def backend(self) -> str:
        """The process group's backend (``gloo`` or ``nccl``), chosen as the constructor
        says."""
        if self._backend is None:
            import torch
            cuda = torch.cuda.is_available() and self.env.local_rank < torch.cuda.device_count()
            self._backend = "nccl" if cuda else "gloo"
        return self._backend

    @property
    def device(self):
        """The ``torch.device`` to train on: ``cuda:LOCAL_RANK`` with nccl, else ``cpu``."""
        if self._device is None:
            import torch
            self._device = (torch.device("cuda", self.env.local_rank)
                            if self.backend == "nccl" else torch.device("cpu"))
        return self._device

    # ------------------------------------------------------------------ start
    def start(self) -> "ElasticRun":
        """Join the generation's rendezvous and create the default process group; returns
        self (idempotent).

        The rendezvous is ``env://``'s: a ``TCPStore`` on ``MASTER_ADDR:MASTER_PORT`` hosted
        by rank 0, then a barrier of all ``world_size`` ranks (``rendezvous_timeout_s``); the
        process group gets ``timeout_s``. Until it is up the stop signal and ``SIGTERM`` keep
        their default action (the process dies at once); afterwards they set
        :attr:`stop_requested`. Raises ``torch.distributed.DistError`` (e.g.
        ``DistStoreError`` on a rendezvous timeout, ``DistNetworkError`` when the port is
        taken), ``RuntimeError`` when a process group already exists, ``ValueError`` outside
        the main thread.
        """
        if self._closed:
            raise RuntimeError("this ElasticRun was closed; create a new one")
        if self._started:
            return self
        import torch.distributed as dist

        if dist.is_initialized():
            raise RuntimeError("a default process group already exists; ElasticRun creates it")
        env = self.env
        signals = sorted({int(env.stop_signal), int(signal.SIGTERM)})
        for s in signals:  # die at once while blocked in the rendezvous (C++)
            self._saved_handlers[s] = signal.signal(s, signal.SIG_DFL)
        log.info("rendezvous of generation %d at %s:%d as rank %d of %d (%s)", env.generation,
                 env.master_addr, env.master_port, env.rank, env.world_size, self.backend)
        t0 = time.monotonic()
        rdzv = timedelta(seconds=self.rendezvous_timeout_s)
        try:
            store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                                  is_master=env.rank == 0, timeout=rdzv, wait_for_workers=False)
            key = f"offcut/rendezvous/{env.generation}"
            if store.add(key, 1) == env.world_size:
                store.set(key + "/complete", "1")
            store.wait([key + "/complete"], rdzv)
            if self.backend == "nccl":
                import torch
                torch.cuda.set_device(env.local_rank)
            dist.init_process_group(self.backend, store=store, rank=env.rank,
                                    world_size=env.world_size,
                                    timeout=timedelta(seconds=self.timeout_s))
        except BaseException:
            self.close()  # the previous handlers back; nothing else to undo
            raise
        self._store = store  # rank 0 hosts it: keep it alive for the run
        for s in signals:
            signal.signal(s, self._on_signal)
        self._started = True
        self._last_checkpoint_t = time.monotonic()
        log.info("rank %d of %d: generation %d up in %.1f s", env.rank, env.world_size,
                 env.generation, time.monotonic() - t0)
        return self

    def _on_signal(self, signum, frame) -> None:
        self.stop_requested = True
        self._signal_received = signum

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("call start() (or enter the with block) first")
        if self._closed:
            raise RuntimeError("this ElasticRun was closed")

    # ------------------------------------------------------------------ checkpoints
    def load_checkpoint(self, map_location: Any = "cpu") -> dict | None:
        """Load the latest complete checkpoint on every rank (a collective: call it on all
        ranks): rank 0 picks it (:func:`latest_checkpoint`) and broadcasts its samples, every
        rank opens ``ckpt-<samples>.pt`` by name (on NFS an open revalidates, a directory
        listing may be stale). Returns its dict (``state``: what :meth:`save_checkpoint` got,
        ``samples_done``, ``generation``, ``world_size`` that wrote it) or None when there is
        none; sets :attr:`samples_done`.

        Raises ``RuntimeError`` when a rank cannot find rank 0's checkpoint (the directory is
        not on storage every node sees) or the file is not such a checkpoint, and
        ``torch.load``'s errors for an unreadable file (never silently starts over).
        """
        self._require_started()
        import torch
        import torch.distributed as dist

        d = self.env.checkpoint_dir
        found = latest_checkpoint(d) if self.is_main else None
        t = torch.tensor([-1 if found is None else found[0]], dtype=torch.int64,
                         device=self.device)
        dist.broadcast(t, src=0)
        samples = int(t[0])
        if samples < 0:
            log.info("rank %d: no checkpoint in %s: starting from 0 samples", self.rank, d)
            return None
        path = d / f"ckpt-{samples}.pt"
        try:
            ckpt = torch.load(path, map_location=map_location, weights_only=self.weights_only)
        except FileNotFoundError:
            raise RuntimeError(f"rank {self.rank}: {path}, rank 0's latest checkpoint, is not "
                               f"here: OFFCUT_CHECKPOINT_DIR must be on storage every node "
                               f"sees") from None
        if not isinstance(ckpt, dict) or "state" not in ckpt or "samples_done" not in ckpt:
            raise RuntimeError(f"{path} is not an offcut.client.elastic checkpoint (a dict "
                               f"with 'state' and 'samples_done')")
        self.samples_done = int(ckpt["samples_done"])
        self._has_checkpoint = True
        log.info("rank %d: resumed from %s (%d samples, written by generation %s on %s "
                 "ranks)", self.rank, path.name, self.samples_done, ckpt.get("generation"),
                 ckpt.get("world_size"))
        return ckpt

    def save_checkpoint(self, state: StateArg, samples_done: int) -> Path | None:
        """Record a checkpoint at ``samples_done`` cumulative samples [samples]: rank 0 writes
        ``ckpt-<samples_done>.pt`` (:func:`write_checkpoint`: atomic, the last ``keep`` kept)
        holding ``{"state": state, "samples_done", "generation", "world_size"}`` and reports
        ``samples_done`` to the daemon; the other ranks only note the figure. Not a
        collective, but call it on every rank at the same step.

        ``state`` is a mapping, or a callable returning one (called on rank 0 only). Nothing
        is written when ``samples_done`` equals the latest checkpoint's (nothing new to save).
        Returns the path on rank 0, None elsewhere.

        Raises ``ValueError`` when ``samples_done`` is below the latest checkpoint's (this
        run's, or on rank 0 the latest on disk: call :meth:`load_checkpoint` first, or use an
        empty directory), and the write's ``OSError``.
        """
        self._require_started()
        samples_done = int(samples_done)
        if samples_done < 0:
            raise ValueError(f"samples_done must be >= 0, got {samples_done}")
        if self._has_checkpoint and samples_done < self.samples_done:
            raise ValueError(f"samples_done went down from {self.samples_done} (the latest "
                             f"checkpoint's) to {samples_done}")
        unchanged = self._has_checkpoint and samples_done == self.samples_done
        d = self.env.checkpoint_dir
        if not self.is_main:
            self.samples_done, self._has_checkpoint = samples_done, True
            self._last_checkpoint_t = time.monotonic()
            return None
        if unchanged:
            self._last_checkpoint_t = time.monotonic()
            return d / f"ckpt-{samples_done}.pt"
        latest = latest_checkpoint(d)
        if latest is not None and latest[0] > samples_done:
            raise ValueError(f"{latest[1]} holds more samples ({latest[0]}) than this "
                             f"checkpoint ({samples_done}): call load_checkpoint() first, or "
                             f"use an empty OFFCUT_CHECKPOINT_DIR")
        payload = {"state": state() if callable(state) else state,
                   "samples_done": samples_done, "generation": self.generation,
                   "world_size": self.world_size}
        t0 = time.monotonic()
        path = write_checkpoint(d, samples_done, payload, keep=self.keep)
        self.samples_done, self._has_checkpoint = samples_done, True
        self._last_checkpoint_t = time.monotonic()
        log.info("checkpoint %s: %d samples, generation %d, world size %d (%.2f s)",
                 path.name, samples_done, self.generation, self.world_size,
                 time.monotonic() - t0)
        self.report_progress(samples_done)
        return path

    # ------------------------------------------------------------------ progress
    def report_progress(self, samples_done: int | float | None = None) -> bool:
        """On rank 0, report ``samples_done`` (default: :attr:`samples_done`, the latest
        checkpoint's) with ``nodes = OFFCUT_NUM_NODES`` to the daemon; :meth:`save_checkpoint`
        calls it. Returns True when the daemon accepted it; False on other ranks, for a local
        run (no ``OFFCUT_TASK_ID``/``OFFCUT_ADDRESS``) and when the report failed (logged,
        never raised: training goes on and the next checkpoint's report carries the total).
        """
        if not (self.is_main and self.env.reports_progress):
            return False
        figure = self.samples_done if samples_done is None else samples_done
        try:
            if self._reporter is None:
                from offcut.client.api import Client
                from offcut.client.progress import ProgressReporter
                self._report_client = Client(self.env.address, timeout_s=self.report_timeout_s)
                self._reporter = ProgressReporter(self._report_client, self.env.task_id,
                                                  self.env.num_nodes, every_s=math.inf,
                                                  samples_done=figure)
            self._reporter.set_samples_done(figure)
            self._reporter.report()
            log.info("reported %s samples on %d nodes for %s", figure, self.env.num_nodes,
                     self.env.task_id)
            return True
        except Exception as exc:  # OffcutError mostly; a report never stops training
            log.warning("progress report of %s samples for %s failed: %s", figure,
                        self.env.task_id, exc)
            return False

    # ------------------------------------------------------------------ the step
    def should_stop(self) -> bool:
        """Whether any rank got the stop signal: one ``all_reduce`` (MAX) of the local flags,
        so call it on every rank at the same step. Also agrees :attr:`checkpoint_due` (rank
        0's clock against ``checkpoint_every_s``). Raises the collective's error when a peer
        vanished (the context manager turns it into exit 75)."""
        self._require_started()
        import torch
        import torch.distributed as dist

        due = (self.is_main and self.checkpoint_every_s is not None
               and time.monotonic() - self._last_checkpoint_t >= self.checkpoint_every_s)
        t = torch.tensor([int(self.stop_requested), int(due)], dtype=torch.int64,
                         device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        stop, due = t.tolist()  # one device-to-host copy (not one per flag)
        self.checkpoint_due = bool(due)
        return bool(stop)

    def step(self, samples_done: int, state: StateArg) -> bool:
        """Call on every rank after each training step with the cumulative samples
        [samples] trained so far and the state to checkpoint (a mapping or a callable
        returning one, called on rank 0 only when a checkpoint is written).

        One :meth:`should_stop` collective; on a stop: :meth:`save_checkpoint` then
        :meth:`exit_restart` (:attr:`on_restart`, exit 75, never returns). Otherwise writes a checkpoint when
        ``checkpoint_every_s`` / ``checkpoint_every_steps`` say so. Returns True when it wrote
        one.
        """
        self._steps += 1
        if self._steps == 1:  # (benchmarks/rescale_cost.py: the end of a rescale)
            log.info("rank %d: first step of generation %d at %d samples", self.rank,
                     self.generation, int(samples_done))
        if self.should_stop():
            log.warning("rank %d: stop requested%s: stopping at %d samples", self.rank,
                        f" (got {signal.Signals(self._signal_received).name})"
                        if self._signal_received else " (by a peer)", int(samples_done))
            self.save_checkpoint(state, samples_done)
            self.exit_restart()
        every = self.checkpoint_every_steps
        if self.checkpoint_due or (every is not None and self._steps % every == 0):
            self.save_checkpoint(state, samples_done)
            return True
        return False

    # ------------------------------------------------------------------ exits
    def close(self) -> None:
        """Destroy the process group, restore the previous signal handlers, close the
        daemon connection. Idempotent; errors of a broken process group are ignored."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            try:
                import torch.distributed as dist
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception as exc:  # a broken group: nothing left to tear down cleanly
                log.debug("destroy_process_group: %s", exc)
            self._store = None
        for s, handler in self._saved_handlers.items():
            try:
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass
        self._saved_handlers.clear()
        if self._report_client is not None:
            self._report_client.close()
            self._report_client = self._reporter = None

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass

    def _exit(self, code: int) -> NoReturn:
        """:meth:`close`, then end the process with ``code`` as ``hard_exit`` says."""
        self.close()
        self._flush()
        if not self.hard_exit:
            raise SystemExit(code)
        try:
            atexit._run_exitfuncs()  # what a normal exit runs first (logging.shutdown ...)
        finally:
            self._flush()
            os._exit(code)

    def _run_on_restart(self) -> None:
        """Call :attr:`on_restart` once; log (never raise) its exception."""
        hook, self._on_restart_done = (None if self._on_restart_done else self.on_restart), True
        if hook is None:
            return
        try:
            hook()
        except Exception as exc:  # the exit stays 75: the next generation copes
            log.warning("rank %d: on_restart failed: %s: %s", self.rank, type(exc).__name__, exc)

    def exit_restart(self) -> NoReturn:
        """End this process with exit 75 (checkpointed, or nothing to save: restart me):
        :attr:`on_restart`, :meth:`close`, then exit as ``hard_exit`` says. Write the
        checkpoint first (:meth:`step` does both)."""
        self._run_on_restart()
        self._exit(EXIT_RESTART)

    def exit_done(self) -> NoReturn:
        """End this process with exit 0 (the task's work is done): :meth:`close`, then exit as
        ``hard_exit`` says. Write the final checkpoint first: its report completes the
        task."""
        self._exit(EXIT_DONE)

    def __enter__(self) -> "ElasticRun":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        """Map the block's outcome to the protocol's exit codes (the block is the whole run:
        code after it does not run unless ``hard_exit`` is False):

        - normal end: :meth:`exit_done` (exit 0);
        - a lost peer (:func:`is_peer_loss`, once the process group is up): :attr:`on_restart`,
          then exit 75;
        - ``SystemExit`` (e.g. from :meth:`exit_restart` with ``hard_exit=False``),
          ``KeyboardInterrupt`` and any other exception: :meth:`close` and let it through
          (an exception ends the process with 1: a failure of the run).
        """
        started = self._started
        if exc is None:
            self.exit_done()
        self.close()
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return None
        if started and is_peer_loss(exc):
            log.warning("rank %d: a peer of generation %d vanished (%s: %s); exiting %d",
                        self.rank, self.generation, type(exc).__name__,
                        str(exc).splitlines()[0][:300] if str(exc) else "", EXIT_RESTART)
            self.exit_restart()
        return None

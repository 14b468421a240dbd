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
        run.save_checkpoint({...}, done)                      # the work is reached
        evaluate_and_print(model)                             # runs to its end: the task is
    # not reached: the end of the block exits 0             # COMPLETED when every rank exits 0

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

The parts of :class:`ElasticRun` live in modules of their own, whose public names this module
re-exports: the environment (:mod:`offcut.client.elastic.env`), the checkpoints
(:mod:`offcut.client.elastic.checkpoints`), the process group and its collectives
(:mod:`offcut.client.elastic.group`), the stop signals and their agreement
(:mod:`offcut.client.elastic.stop`), the progress reports (:mod:`offcut.client.elastic.report`),
the measured energy (:mod:`offcut.client.elastic.energy`) and the exits
(:mod:`offcut.client.elastic.exit`).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from offcut.client.delegation import delegated
from offcut.client.elastic.checkpoints import (CHECKPOINT_RE, RunCheckpoints, StateArg,
                                               checkpoint_files, latest_checkpoint,
                                               write_checkpoint)
from offcut.client.elastic.checkpoints import _fsync_dir  # noqa: F401 - re-exported
from offcut.client.elastic.env import ElasticEnv, parse_signal
from offcut.client.elastic.env import _int_var  # noqa: F401 - re-exported
from offcut.client.elastic.exit import (EXIT_DONE, EXIT_RESTART, call_restart_hook, end_process,
                                        is_peer_loss, log_peer_loss)
from offcut.client.elastic.exit import _PEER_LOSS_RE  # noqa: F401 - re-exported
from offcut.client.elastic.group import ProcessGroup
from offcut.client.elastic.heartbeat import PeerWatch
from offcut.client.elastic.report import DaemonProgress
from offcut.client.elastic.energy import EnergyMeter, GenerationEnergy  # docs/execution.md, "Energy"
from offcut.client.elastic.stop import StopSignals

log = logging.getLogger("offcut.client.elastic")

__all__ = ["CHECKPOINT_RE", "EXIT_DONE", "EXIT_RESTART", "ElasticEnv", "ElasticRun", "StateArg",
           "checkpoint_files", "is_peer_loss", "latest_checkpoint", "parse_signal",
           "write_checkpoint"]


# ----------------------------------------------------------------------------- the run
def _check_arguments(timeout_s: float, rendezvous_timeout_s: float, report_timeout_s: float,
                     keep: int, checkpoint_every_s: float | None,
                     checkpoint_every_steps: int | None, backend: str | None) -> None:
    """Check :class:`ElasticRun`'s arguments (see there); ``ValueError`` naming the first
    out of range: a timeout [s] that is not finite and > 0, ``keep`` < 1,
    ``checkpoint_every_s`` <= 0, ``checkpoint_every_steps`` < 1, an unknown ``backend``."""
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


class ElasticRun:
    """One process of one generation of an elastic task (docs/execution.md).

    Args:
        env: the process's environment (:meth:`ElasticEnv.from_env`).
        timeout_s: the collective timeout [s]: a collective that waits this long for a
            silent peer raises (and the run exits 75) instead of hanging (torch's default is
            30 min). Default: the peer timeout (``OFFCUT_PEER_TIMEOUT_S``, 60 s) with gloo,
            twice it with nccl (whose watchdog aborts the process on a timeout: the heartbeat
            below acts first and exits 75). Besides, every process beats a heartbeat on the
            generation's store (:class:`~offcut.client.elastic.heartbeat.PeerWatch`): when a
            peer's stops for the peer timeout, the process exits 75 from the watch's thread
            (after ``on_restart``), whatever its main thread is doing; with ``hard_exit=False``
            the loss is only logged.
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
        energy_meter: what measures this process's GPUs (docs/execution.md, "Energy"): None
            (default) ZeusMonitor or NVML on the process's own GPUs from :meth:`start`, nothing
            without a GPU; an :class:`~offcut.client.elastic.energy.EnergyMeter` (``read_j()``:
            cumulative J); False: none. Every rank reports its joules at each checkpoint and
            when it ends (:meth:`close`), bounded by ``report_timeout_s``, never raising.

    Attributes:
        samples_done: cumulative samples [samples] of the latest checkpoint this run loaded
            or wrote (0 before any).
        stop_requested: True once this process got the stop signal (or SIGTERM).
        checkpoint_due: the agreed time-based decision of the last :meth:`should_stop`.
        on_restart: the callable (no arguments; its return value is ignored) run once
            before an exit 75, or None (the default): the constructor's ``on_restart``,
            replaceable at any time before the exit (e.g. once the Zeus trial exists). Run
            by :meth:`exit_restart` (so by :meth:`step` on a stop), by the context manager on
            a lost peer, and by the heartbeat's thread when a peer goes silent; never twice,
            never before an exit 0 or 1. An exception it raises is logged with the rank and
            swallowed (the exit stays 75); it should return within seconds: the grace after
            the stop signal bounds the whole exit (docs/execution.md, "Signals and exit
            codes": ``[slurm] rescale_grace_s`` on a rescale, the partition's ``GraceTime``
            on a preemption).

    Not thread-safe; create, start and use it in the main thread (signal handlers are
    installed there).
    """

    def __init__(self, env: ElasticEnv, *, timeout_s: float | None = None,
                 rendezvous_timeout_s: float = 600.0, backend: str | None = None,
                 keep: int = 2, checkpoint_every_s: float | None = None,
                 checkpoint_every_steps: int | None = None, report_timeout_s: float = 5.0,
                 weights_only: bool = True, hard_exit: bool = True,
                 on_restart: Callable[[], Any] | None = None,
                 energy_meter: EnergyMeter | bool | None = None):
        _check_arguments(env.peer_timeout_s if timeout_s is None else timeout_s,
                         rendezvous_timeout_s, report_timeout_s, keep,
                         checkpoint_every_s, checkpoint_every_steps, backend)
        self.env = env
        self._timeout_s = timeout_s
        self.rendezvous_timeout_s = float(rendezvous_timeout_s)
        self.keep, self.report_timeout_s = int(keep), float(report_timeout_s)
        self.checkpoint_every_s = checkpoint_every_s
        self.checkpoint_every_steps = checkpoint_every_steps
        self.weights_only, self.hard_exit = weights_only, hard_exit
        self.on_restart = on_restart
        self._on_restart_done = False
        self.checkpoint_due = False
        self._started = self._closed = False
        self._steps = 0
        self._group = ProcessGroup(env, backend)
        self._checkpoints = RunCheckpoints(env.checkpoint_dir, env.rank)
        self._stop = StopSignals(env.stop_signal)
        self._watch: PeerWatch | None = None
        self._progress = DaemonProgress(env)
        self._energy = GenerationEnergy(env, energy_meter)  # measured energy, every rank

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 checkpoint_dir: str | os.PathLike | None = None, **kwargs) -> "ElasticRun":
        """A run for this process from its environment (:meth:`ElasticEnv.from_env`, whose
        ``ValueError`` it raises); ``kwargs`` go to the constructor."""
        return cls(ElasticEnv.from_env(environ, checkpoint_dir=checkpoint_dir), **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def rank(self) -> int:
        """This process's rank in the generation: an int in ``0 .. world_size - 1``
        (``RANK``, checked by :meth:`ElasticEnv.from_env`, which raises ValueError otherwise).
        Fixed for the process's life; the next generation may give the same node another
        rank. Rank 0 (:attr:`is_main`) hosts the rendezvous, writes the checkpoints and sends
        the progress reports. Readable before :meth:`start`."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """The generation's process count, an int >= 1 (``WORLD_SIZE``): its node count
        (``OFFCUT_NUM_NODES``) times the processes per node (``LOCAL_WORLD_SIZE``). Fixed for
        the generation: a grow or shrink starts a new generation with a new world size, so
        a script derives its per-rank batch and data shard from it after each
        :meth:`load_checkpoint` (the sample count, not the step, is what carries over).
        Readable before :meth:`start`."""
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
        """The process group's backend (``gloo`` or ``nccl``), chosen as the constructor says."""
        return self._group.backend

    @property
    def timeout_s(self) -> float:
        """The collective timeout [s]: as given, else the peer timeout with gloo and twice it
        with nccl (see the class)."""
        if self._timeout_s is not None:
            return float(self._timeout_s)
        return self.env.peer_timeout_s * (2 if self.backend == "nccl" else 1)

    @property
    def device(self):
        """The ``torch.device`` to train on: ``cuda:LOCAL_RANK`` with nccl, else ``cpu``."""
        return self._group.device

    @property
    def energy_j(self) -> float | None:
        """Joules [J] this process's GPUs drew since :meth:`start` (docs/execution.md,
        "Energy"); None when they are not measured."""
        return self._energy.joules()

    samples_done = delegated("_checkpoints", "samples_done", "Cumulative samples [samples] of "
                             "the latest checkpoint loaded or written (0 before any).")
    stop_requested = delegated("_stop", "requested",
                               "True once this process got the stop signal (or SIGTERM).")

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
        self._group.check_none_yet()
        self._stop.hold_default()  # die at once while blocked in the rendezvous (C++)
        try:
            self._group.join(self.timeout_s, self.rendezvous_timeout_s)
        except BaseException:
            self.close()  # the previous handlers back; nothing else to undo
            raise
        self._stop.arm()
        self._started = True
        self._energy.start()  # measured energy: from here
        self._watch = PeerWatch(self.env.master_addr, self.env.master_port, rank=self.rank,
                                world_size=self.world_size, generation=self.generation,
                                timeout_s=self.env.peer_timeout_s, on_lost=self._peer_lost)
        try:
            self._watch.start()
        except Exception as exc:  # the store went away since the rendezvous: a lost peer
            self._watch = None
            self.close()
            raise RuntimeError(f"rank {self.rank}: cannot reach the generation's store for "
                               f"the heartbeat: {exc}") from exc
        self._checkpoints.mark()
        return self

    def _peer_lost(self, why: str) -> None:
        """The heartbeat found a peer lost (:class:`PeerWatch`; runs in its thread): log, then
        :attr:`on_restart` and exit 75 without tearing the process group down (the main
        thread may be blocked in it); with ``hard_exit=False`` only log."""
        log.warning("rank %d: a peer of generation %d is lost: %s; exiting %d", self.rank,
                    self.generation, why, EXIT_RESTART)
        if not self.hard_exit:
            return
        hook, self._on_restart_done = (None if self._on_restart_done else self.on_restart), True
        call_restart_hook(hook, self.rank)
        end_process(EXIT_RESTART, True)

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
        samples = self._group.broadcast_from_main(self._checkpoints.latest_samples())
        return self._checkpoints.load(samples, map_location, self.weights_only)

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
        path, written = self._checkpoints.save(state, samples_done, generation=self.generation,
                                               world_size=self.world_size, keep=self.keep)
        if written:
            self.report_progress(int(samples_done))
        self._energy.report(self.report_timeout_s)  # measured energy: every rank
        return path

    # ------------------------------------------------------------------ progress
    def report_progress(self, samples_done: int | float | None = None) -> bool:
        """On rank 0, report ``samples_done`` (default: :attr:`samples_done`, the latest
        checkpoint's) with ``nodes = OFFCUT_NUM_NODES`` to the daemon; :meth:`save_checkpoint`
        calls it. Returns True when the daemon accepted it; False on other ranks, for a local
        run (no ``OFFCUT_TASK_ID``/``OFFCUT_ADDRESS``) and when the report failed (logged,
        never raised: training goes on and the next checkpoint's report carries the total).
        """
        figure = self.samples_done if samples_done is None else samples_done
        return self._progress.report(figure, self.report_timeout_s)

    # ------------------------------------------------------------------ the step
    def should_stop(self) -> bool:
        """Whether any rank got the stop signal (``OFFCUT_STOP_SIGNAL`` or SIGTERM): one
        ``all_reduce`` (MAX) of a 2-element tensor of the local flags, so every rank must call
        it at the same step (a rank that skips it leaves the others waiting up to
        :attr:`timeout_s`). The answer is the same bool on every rank. Also agrees
        :attr:`checkpoint_due` (rank 0's clock against ``checkpoint_every_s``). It does not
        checkpoint or exit: :meth:`step` does both; a loop that calls this directly must
        :meth:`save_checkpoint` and :meth:`exit_restart` itself when it returns True, within
        the grace after the signal (docs/execution.md, "Signals and exit codes"), else the
        job is killed and the work since the last checkpoint is lost.

        Raises:
            RuntimeError: before :meth:`start` or after :meth:`close`.
            The collective's error (``RuntimeError`` / ``DistBackendError``) when a peer
            vanished or :attr:`timeout_s` passed; the context manager turns it into exit 75.
        """
        self._require_started()
        stop, self.checkpoint_due = self._stop.agree(
            self._group, self._checkpoints.due(self.checkpoint_every_s))
        return stop

    def step(self, samples_done: int, state: StateArg) -> bool:
        """Call on every rank after each training step with the cumulative samples
        [samples] trained so far and the state to checkpoint (a mapping or a callable
        returning one, called on rank 0 only when a checkpoint is written).

        One :meth:`should_stop` collective; on a stop: :meth:`save_checkpoint` then
        :meth:`exit_restart` (:attr:`on_restart`, exit 75, never returns). Otherwise writes a
        checkpoint when ``checkpoint_every_s`` / ``checkpoint_every_steps`` say so. Returns
        True when it wrote one.
        """
        self._steps += 1
        if self._steps == 1:  # (benchmarks/rescale_cost.py: the end of a rescale)
            log.info("rank %d: first step of generation %d at %d samples", self.rank,
                     self.generation, int(samples_done))
        if self.should_stop():
            log.warning("rank %d: stop requested%s: stopping at %d samples", self.rank,
                        self._stop.cause(), int(samples_done))
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
        if self._watch is not None:
            self._watch.stop(left=True)
        if self._started:
            self._group.destroy()
        self._stop.restore()
        self._energy.close(self.report_timeout_s)  # measured energy: the last report
        self._progress.close()

    def exit_restart(self) -> NoReturn:
        """End this process with exit 75 (:data:`EXIT_RESTART`: checkpointed, or nothing to
        save; restart me from the latest checkpoint): :attr:`on_restart` (once), :meth:`close`,
        then exit as ``hard_exit`` says. Never returns: with ``hard_exit`` (the default) the
        process ends in ``os._exit(75)`` after the ``atexit`` handlers, skipping ``with``
        blocks and ``finally`` clauses; with ``hard_exit=False`` it raises
        ``SystemExit(75)``. Write the checkpoint first (:meth:`step` does both): the next
        generation resumes from the latest complete one, and the samples after it are
        trained again. Every rank of a stopped generation should exit 75, as :meth:`step`
        makes them. Exit 75 is not a failure of the run (docs/execution.md, "Signals and exit
        codes")."""
        hook, self._on_restart_done = (None if self._on_restart_done else self.on_restart), True
        call_restart_hook(hook, self.rank)  # once
        self.close()
        log.info("rank %d: exiting %d%s", self.rank, EXIT_RESTART, self._stop.cause())
        end_process(EXIT_RESTART, self.hard_exit)

    def exit_done(self) -> NoReturn:
        """End this process with exit 0 (the task's work is done): :meth:`close`, then exit as
        ``hard_exit`` says. Write the final checkpoint first: its report completes the task."""
        self.close()
        end_process(EXIT_DONE, self.hard_exit)

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
          (an exception ends the process with 1: a failure of the run). For a failure (with
          ``hard_exit``) the stop signals are ignored from here on and the peers are not told
          this process left (the
          heartbeat's "left" mark), so the run ends with its own status: a peer that exits 75
          on the loss makes the launcher stop the generation, and that stop must not turn the
          failure into a kill by the stop signal.
        """
        started = self._started
        if exc is None:
            self.exit_done()
        failure = not isinstance(exc, (SystemExit, KeyboardInterrupt)) \
            and not (started and is_peer_loss(exc))
        if failure:
            if self.hard_exit:  # the process is ending (hard_exit=False: it goes on)
                self._stop.ignore()
            if self._watch is not None:
                self._watch.stop(left=False)
        self.close()
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return None
        if started and is_peer_loss(exc):
            log_peer_loss(exc, self.rank, self.generation)
            self.exit_restart()
        return None

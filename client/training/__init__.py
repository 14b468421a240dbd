"""Training side of the daemon's Zeus optimizers (Zeus, NSDI '23; docs/zeus.md,
"From a training script").

A training loop asks the daemon's batch-size optimizer for its batch size, measures each
epoch's time [s] and GPU energy [J], reports the trial's *cumulative* figures with the
validation metric after every epoch, and stops when the daemon says so (target reached, cost
bound ``beta_knob x min_cost`` crossed, or ``max_epochs``). When the job has a power spec, the
step hooks also profile GPU power limits as the daemon's power-limit optimizer plans them
(Zeus's ``GlobalPowerLimitOptimizer`` state machine, with the plan and the choice kept by the
daemon), then run at the chosen limit.

Minimal PyTorch-style loop (under ``offcut recur``, which sets the ``OFFCUT_*`` variables)::

    from offcut.client.training import ZeusTraining

    with ZeusTraining.from_env() as zt:          # backend: zeus, else pynvml
        loader = DataLoader(train_set, batch_size=zt.batch_size, shuffle=True)
        while not zt.should_stop:
            zt.on_epoch_begin()
            model.train()
            for x, y in loader:
                zt.on_step_begin()               # power-limit profiling
                optimizer.zero_grad()
                loss_fn(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            zt.on_epoch_end(validate(model))     # reports; zt.verdict says why it stopped

Without the driver, register the job once (``Client.register_zeus_job``) and construct
``ZeusTraining(address, job_id)``: it predicts a batch size and opens a trial itself.

Environment variables (the contract with ``offcut recur``, :mod:`offcut.client.recur`):

- ``OFFCUT_ADDRESS``: the daemon's address (``unix:///path.sock`` or ``HOST:PORT``); unset =
  the default socket.
- ``OFFCUT_ZEUS_JOB_ID``: the recurring job's id (required by :meth:`ZeusTraining.from_env`).
- ``OFFCUT_ZEUS_TRIAL``: the trial already opened for this run; unset = predict one.
- ``OFFCUT_ZEUS_RESUME_TRIAL``: the trial of a previous generation to resume (ResumeTrial);
  exclusive with ``OFFCUT_ZEUS_TRIAL``. The elastic helper stores :attr:`ZeusTraining.
  trial_number` in its checkpoint and sets this (or passes ``resume_trial=``) when it restarts.
- ``OFFCUT_BATCH_SIZE``: the trial's (global) batch size (checked against the daemon's record).
- ``OFFCUT_GENERATION``: this process's generation (set by the launcher, docs/execution.md);
  sent with every call so that the daemon fences the trial to its current generation.
- ``OFFCUT_TASK_ID``: with ``OFFCUT_GENERATION``, makes Predict's and ResumeTrial's default
  idempotency key ``offcut-task:<task>:g<generation>`` (a retried call gets the same trial).

A process restarted with the same ``OFFCUT_ZEUS_TRIAL`` continues the trial: epochs, time and
energy continue from what the daemon last recorded, and profiling continues where the daemon's
power profile is. Work done after the last reported epoch of the previous process is not
counted unless that process ended with ``interrupted`` (below).

Generations (a placed task, docs/execution.md): every grow, shrink or preemption stops the
processes (they checkpoint and exit 75) and starts a new generation. A Zeus trial spans them:

- On the stop signal, end the run with :meth:`ZeusTraining.interrupt` (or
  ``close(interrupted=True)``, or leave the ``with`` block by ``sys.exit(75)``): the epoch cut
  short is measured and counted, and the trial is *suspended* (EndTrial with interrupted) with
  its cumulative time and energy; it is not a failure and prunes no batch size.
- The next generation passes ``resume_trial=<the checkpoint's trial number>`` (and
  ``generation=``): ResumeTrial returns the trial's stored epochs, time [s] and energy [J], the
  process numbers its epochs on and adds its own measurements to them, so the trial's cost is
  zeus_cost (Zeus, Section 3.1, Eq. 2) of the sums over all its generations.
- A real failure (any other exception leaving the ``with`` block) ends the trial as not
  converged, as before; a later ``resume_trial`` of it raises ``FailedPrecondition``: start a
  new trial (and the training from scratch).
- The batch size of a trial is the *global* batch size; each rank trains
  :func:`per_rank_batch_size` samples per step, which follows the generation's world size.

Sketch of one generation's rank 0 (the other ranks get the batch size and ``should_stop`` by
broadcast)::

    ckpt = latest_checkpoint()                    # None in the task's first generation
    with ZeusTraining.from_env(resume_trial=ckpt["zeus_trial"] if ckpt else None) as zt:
        per_rank = zt.per_rank_batch_size()       # from $WORLD_SIZE, $RANK
        while not zt.should_stop:
            zt.on_epoch_begin()
            if not train_one_epoch(per_rank):     # the stop signal came: checkpoint written
                save_checkpoint(zeus_trial=zt.trial_number)
                sys.exit(75)                      # suspends the trial
            zt.on_epoch_end(validate())

Measurement and actuation go through a :class:`MeasurementBackend`: :class:`ZeusMonitorBackend`
(the ``zeus`` package), :class:`NvmlBackend` (``nvidia-ml-py``), :class:`HelperBackend`
(power limits through the node's privileged power helper, zeusd's API on ``ZEUSD_SOCK_PATH``,
so no root is needed; :func:`default_backend` picks it when that variable is set) or
:class:`ManualBackend` (injected clock and energy, for tests and machines without a GPU).
Neither ``zeus`` nor ``pynvml`` is imported until a backend that needs it is created. Setting
power limits directly (NVML, zeus without the helper) needs root or the SYS_ADMIN capability.

Power limits with one process per GPU (docs/execution.md, "Power limits"): rank 0 creates this
object with ``sync=TorchRankSync(run.device)`` and ``power_backend=`` a backend of its own GPU;
every other rank creates a :class:`PowerLimitFollower` with a backend of its own GPU and calls
its hooks at the same steps. Rank 0 asks the daemon's power-limit optimizer and shares each
plan (one broadcast), every process sets the limit on its own GPU, and a profiling window is
measured on all of them (time: the slowest rank's; energy: the sum). Across generations the
daemon keeps the profile: a window cut short by the stop signal is reported interrupted
(:meth:`ZeusTraining.interrupt`) and measured again by the next generation, the limits already
measured are not, and once the optimizer has chosen every later generation starts at the
chosen limit.

Not thread-safe: call the hooks from the training loop's thread. With data parallelism, create
one object on rank 0 and broadcast :attr:`ZeusTraining.should_stop` to the other ranks; its
``backend`` measures the epochs (e.g. all the GPUs of the node).

The parts live in modules of their own, whose public names this module re-exports: the
errors (:mod:`offcut.client.training.errors`), the measurement backends
(:mod:`offcut.client.training.backends`), the power helper's client and backend
(:mod:`offcut.client.training.zeusd`), the ranks' collectives
(:mod:`offcut.client.training.ranks`), the trial's record and its calls
(:mod:`offcut.client.training.trial`) and the power-limit control (:mod:`offcut.client.training.power`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from offcut.client.api import Client
from offcut.client.delegation import delegated
from offcut.client.training.backends import (ManualBackend, MeasurementBackend, NvmlBackend,
                                         ZeusMonitorBackend, default_backend,
                                         measuring_backend, nvml_power_limit_range)
from offcut.client.training.errors import (BackendUnavailable, PowerHelperError,
                                           PowerLimitError, RankSyncError, TrainingSetupError,
                                           TrialEndedError)
from offcut.client.training.power import (PowerLimitControl, PowerLimitFollower,
                                          profiled_max_limit_w)
from offcut.client.training.ranks import RankSync, TorchRankSync
from offcut.client.training.zeusd import (HelperBackend, ZeusdHttpClient, connect_helper,
                                          node_gpu_ids)
from offcut.client.training.trial import Verdict, ZeusTrial
from offcut.client.training.trial import _call, _Calls  # noqa: F401 - re-exported

logger = logging.getLogger("offcut.training")

# ----------------------------------------------------------------------------- env contract
ENV_ADDRESS = "OFFCUT_ADDRESS"
"""The daemon's address (``unix:///path.sock`` or ``HOST:PORT``)."""
ENV_JOB_ID = "OFFCUT_ZEUS_JOB_ID"
"""The recurring job's id."""
ENV_TRIAL = "OFFCUT_ZEUS_TRIAL"
"""The trial number opened by the driver for this run."""
ENV_BATCH_SIZE = "OFFCUT_BATCH_SIZE"
"""The trial's (global) batch size."""
ENV_RESUME_TRIAL = "OFFCUT_ZEUS_RESUME_TRIAL"
"""The trial of a previous generation to resume (from the elastic helper's checkpoint)."""
ENV_GENERATION = "OFFCUT_GENERATION"
"""This process's generation (docs/execution.md), an integer >= 1."""
ENV_TASK_ID = "OFFCUT_TASK_ID"
"""The placed task running this process."""
ENV_VARS = (ENV_ADDRESS, ENV_JOB_ID, ENV_TRIAL, ENV_BATCH_SIZE, ENV_RESUME_TRIAL, ENV_GENERATION,
            ENV_TASK_ID)
EXIT_INTERRUPTED = 75
"""The exit status of a process that checkpointed and stops for a new generation
(``EX_TEMPFAIL``, docs/execution.md); ``sys.exit(75)`` inside the ``with`` block suspends the
trial."""


# ----------------------------------------------------------------------------- batch size
def per_rank_batch_size(global_batch_size: int, world_size: int, rank: int, *,
                        strict: bool = False) -> int:
    """The samples per step of ``rank`` when a generation of ``world_size`` ranks trains the
    trial's global batch size ``global_batch_size`` (the batch size the daemon's optimizer
    chose; it stays the same across generations, only the split changes).

    Rule: the global batch is split evenly: every rank gets ``B // W`` and the first
    ``B % W`` ranks one more, so the ranks' batches add up to ``B`` exactly. With an uneven
    split, DDP's gradient mean over ranks weighs a sample on a smaller rank slightly more
    (by ``(B // W + 1) / (B // W)`` at most); ``strict=True`` refuses uneven splits instead.

    Raises:
        ValueError: ``world_size`` < 1, ``rank`` not in ``[0, world_size)``,
            ``global_batch_size`` < ``world_size`` (a rank would train on nothing), or with
            ``strict`` a batch that ``world_size`` does not divide.
    """
    b, w, r = int(global_batch_size), int(world_size), int(rank)
    if w < 1:
        raise ValueError(f"world_size must be >= 1, got {w}")
    if not 0 <= r < w:
        raise ValueError(f"rank must be in [0, {w}), got {r}")
    if b < w:
        raise ValueError(f"the global batch size {b} is smaller than the world size {w}: some "
                         "ranks would get no sample; use fewer ranks or a larger batch size")
    if strict and b % w:
        raise ValueError(f"the global batch size {b} does not split evenly over {w} ranks")
    return b // w + (1 if r < b % w else 0)


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise TrainingSetupError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise TrainingSetupError(f"{name}={raw!r} must be >= 1")
    return value


def _env_arguments(env: Mapping[str, str], kwargs: dict
                   ) -> tuple[str | None, str, int | None, int | None, int | None, int | None]:
    """:meth:`ZeusTraining.from_env`'s reading of the ``OFFCUT_*`` variables of ``env``:
    ``(address, job_id, trial, resume_trial, generation, batch_size)`` (None: unset), taking
    ``resume_trial`` and ``generation`` out of ``kwargs`` (which take precedence) and
    setting its default ``request_id``. Raises :class:`TrainingSetupError` as ``from_env``
    says."""
    job_id = env.get(ENV_JOB_ID, "").strip()
    if not job_id:
        raise TrainingSetupError(f"{ENV_JOB_ID} is not set: run under `offcut recur` or "
                                 "construct ZeusTraining(address, job_id)")
    trial = _env_int(env, ENV_TRIAL)
    resume = kwargs.pop("resume_trial", None)
    resume = _env_int(env, ENV_RESUME_TRIAL) if resume is None else resume
    generation = kwargs.pop("generation", None)
    generation = _env_int(env, ENV_GENERATION) if generation is None else generation
    batch_size = _env_int(env, ENV_BATCH_SIZE)
    if trial is not None and resume is not None:
        raise TrainingSetupError(f"{ENV_TRIAL} and {ENV_RESUME_TRIAL} are both set: a run "
                                 "either continues the trial its driver opened or resumes "
                                 "the one of its checkpoint")
    if batch_size is not None and trial is None and resume is None:
        raise TrainingSetupError(f"{ENV_BATCH_SIZE} is set but {ENV_TRIAL} is not: the batch "
                                 "size comes with a trial opened by the driver")
    task_id = env.get(ENV_TASK_ID, "").strip()
    if generation is not None and task_id and "request_id" not in kwargs:
        kwargs["request_id"] = f"offcut-task:{task_id}:g{generation}"[:200]
    return env.get(ENV_ADDRESS) or None, job_id, trial, resume, generation, batch_size


# ----------------------------------------------------------------------------- training
def _check_arguments(wait_steps: int, trial_number: int | None, resume_trial: int | None,
                     generation: int) -> None:
    """Check :class:`ZeusTraining`'s arguments: ``ValueError`` for ``wait_steps`` < 0,
    :class:`TrainingSetupError` for both ``trial_number`` and ``resume_trial``, or a
    negative ``generation``."""
    if wait_steps < 0:
        raise ValueError(f"wait_steps must be >= 0, got {wait_steps}")
    if trial_number is not None and resume_trial is not None:
        raise TrainingSetupError(f"trial_number ({ENV_TRIAL}) and resume_trial "
                                 f"({ENV_RESUME_TRIAL}) exclude each other")
    if int(generation) < 0:
        raise TrainingSetupError(f"generation must be >= 0, got {generation}")


class _Steps:
    """The steps of :meth:`ZeusTraining.close`, all tried: call with each; a step's exception
    is logged and the first one kept in :attr:`first_error` (raised once all were tried)."""

    def __init__(self, trial_number: int):
        self.trial_number = trial_number
        self.first_error: BaseException | None = None

    def __call__(self, step: Callable[[], Any]) -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - all steps run; the first error is raised
            logger.warning("while closing trial %d: %s", self.trial_number, exc)
            self.first_error = self.first_error or exc


_IDLE, _OFF, _READY, _WARMUP, _WINDOW, _DONE = "idle", "off", "ready", "warmup", "window", "done"
class ZeusTraining:
    """One run (trial) of a recurring job, driven by the daemon's Zeus optimizers.

    Construction resolves the backend, reads the job (GetJob), then opens a trial (Predict),
    or, given ``trial_number``, continues that trial from the daemon's record of its epochs,
    time and energy, or, given ``resume_trial``, resumes the trial of a previous generation
    (ResumeTrial). Call :meth:`on_epoch_begin` / :meth:`on_epoch_end` around every epoch
    (validation included) and :meth:`on_step_begin` before every training step; stop when
    :attr:`should_stop`. :meth:`close` (or leaving the ``with`` block) ends a trial that has
    no final verdict (EndTrial) and gives the GPUs their maximum power limit back;
    :meth:`interrupt` (or ``sys.exit(75)`` in the ``with`` block) suspends it for the next
    generation instead.

    Args:
        client: a :class:`Client`, or the daemon's address (None = default socket); an
            address makes this object own (and close) the client.
        job_id: the registered job.
        trial_number: continue this trial (opened by a driver for this run; a suspended one
            is resumed); None = open one with Predict.
        resume_trial: resume this trial of a previous generation (the number the elastic
            helper stored in its checkpoint): it must be open (suspended; or running and held
            by an older ``generation``). Exclusive with ``trial_number``.
        generation: this process's generation (``OFFCUT_GENERATION``, >= 1; 0 = none): sent
            with every call, the daemon refuses calls of a replaced generation.
        backend: measurement backend; None = :func:`default_backend`.
        request_id: the idempotency key of Predict or ResumeTrial (a retried construction
            gets the same trial); empty: Predict has none, ResumeTrial a fresh one.
        expected_batch_size: if given, must equal the trial's (global) batch size.
        power: profile and set power limits: None = when the job has a power spec; False =
            never; True = required (error if the job has no power spec).
        wait_steps: steps before the first profiling warm-up (Zeus's ``wait_steps``: the
            first iterations are often unrepresentative).
        end_trial_on_close: whether :meth:`close` ends an unfinished trial (set False when a
            supervisor restarts this process on the same trial and ends it itself).
        restore_power_limit: whether :meth:`close` sets the GPUs' maximum limit again.
        power_backend: sets this process's power limits and measures the profiling windows
            (default: ``backend``); e.g. a :class:`HelperBackend` of this process's GPU while
            ``backend`` measures the epochs of more (or models them).
        sync: the generation's ranks (:class:`TorchRankSync`) when every process sets the
            limit on its own GPUs (one process per GPU): this object (rank 0) shares every
            plan with the others' :class:`PowerLimitFollower`, and a profiling window's time
            is the slowest rank's and its energy the sum of the ranks' (Zeus's
            ``GlobalPowerLimitOptimizer``); None: this process alone sets limits. Epochs are
            measured by ``backend`` alone either way.

    Raises:
        NotFound: unknown job or trial (from the daemon).
        FailedPrecondition: Predict found every batch size failed; ``resume_trial`` names a
            trial that already ended (converged, failed, abandoned: start a new trial) or
            that another process holds.
        Unavailable: the daemon cannot be reached.
        TrainingSetupError: a batch size that is not the trial's, ``power=True`` without a
            power spec, a power range outside the GPUs', both ``trial_number`` and
            ``resume_trial``, a negative ``generation``, a ``sync`` whose rank is not 0.
        BackendUnavailable: no backend given and none available.
        PowerLimitError: the power helper could not say the GPUs' power limit range.
    """

    EPOCH_WINDOW = "offcut.epoch"

    def __init__(self, client: Client | str | None, job_id: str, trial_number: int | None = None,
                 *, resume_trial: int | None = None, generation: int = 0,
                 backend: MeasurementBackend | None = None, request_id: str = "",
                 expected_batch_size: int | None = None, power: bool | None = None,
                 wait_steps: int = 1, end_trial_on_close: bool = True,
                 restore_power_limit: bool = True,
                 power_backend: MeasurementBackend | None = None,
                 sync: RankSync | None = None):
        _check_arguments(wait_steps, trial_number, resume_trial, generation)
        if sync is not None and sync.rank != 0:
            raise TrainingSetupError(f"ZeusTraining runs on rank 0 (this is rank {sync.rank}); "
                                     "the other ranks use PowerLimitFollower")
        self.generation = int(generation)
        self._owns_client = not isinstance(client, Client)
        self.client = client if isinstance(client, Client) else Client(client)
        self.job_id = job_id
        self.end_trial_on_close = end_trial_on_close
        self.restore_power_limit = restore_power_limit
        self._closed = False
        trial = None
        try:
            self.backend = backend if backend is not None else default_backend()
            self.power_backend = power_backend if power_backend is not None else self.backend
            job = self.client.get_zeus_job(job_id)
            max_limit_w = profiled_max_limit_w(job, job_id, power, self.power_backend)
            trial = ZeusTrial(self.client, job_id, self.generation, self.backend,
                              self.EPOCH_WINDOW)
            trial.open(job, trial_number, resume_trial, request_id)
            if expected_batch_size is not None and expected_batch_size != trial.batch_size:
                raise TrainingSetupError(
                    f"{ENV_BATCH_SIZE}={expected_batch_size} but trial {trial.trial_number} of "
                    f"job {job_id!r} runs batch size {trial.batch_size}")
        except BaseException:
            if trial is not None:
                trial.release()
            if self._owns_client:
                self.client.close()
            raise
        self._trial = trial
        self.trial_number, self.batch_size = trial.trial_number, trial.batch_size
        self.resumed, self.taken_over = trial.resumed, trial.taken_over
        self._power = PowerLimitControl(self.client, self.power_backend, job_id,
                                        self.batch_size, max_limit_w, wait_steps=wait_steps,
                                        sync=sync)

    @classmethod
    def from_env(cls, backend: MeasurementBackend | None = None, *,
                 environ: Mapping[str, str] | None = None, **kwargs) -> "ZeusTraining":
        """Construct from the ``OFFCUT_*`` variables set by ``offcut recur`` (see the module
        docstring); ``kwargs`` go to the constructor.

        ``OFFCUT_ZEUS_RESUME_TRIAL`` resumes that trial (``resume_trial``),
        ``OFFCUT_GENERATION`` gives ``generation`` (``resume_trial=`` and ``generation=``
        given here take precedence, e.g. the trial number of the checkpoint), and with
        ``OFFCUT_TASK_ID`` the default ``request_id`` is ``offcut-task:<task>:g<generation>``.

        Raises:
            TrainingSetupError: ``OFFCUT_ZEUS_JOB_ID`` unset, a non-integer (or < 1) trial,
                resume trial, generation or batch size, ``OFFCUT_BATCH_SIZE`` without
                ``OFFCUT_ZEUS_TRIAL`` or ``OFFCUT_ZEUS_RESUME_TRIAL``, both of these; and
                whatever the constructor raises.
        """
        address, job_id, trial, resume, generation, batch_size = _env_arguments(
            os.environ if environ is None else environ, kwargs)
        return cls(address, job_id, trial, resume_trial=resume, generation=generation or 0,
                   backend=backend, expected_batch_size=batch_size, **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def epoch(self) -> int:
        """Epochs of the trial reported so far (across restarts)."""
        return self._trial.epochs

    @property
    def time_s(self) -> float:
        """Cumulative time of the trial [s]: the daemon's record when this object started plus
        this process's epochs."""
        return self._trial.time_s

    @property
    def energy_j(self) -> float:
        """Cumulative GPU energy of the trial [J]."""
        return self._trial.energy_j

    @property
    def verdict(self) -> Verdict | None:
        """The daemon's last verdict (None before the first report of a new trial)."""
        return self._trial.verdict

    @property
    def should_stop(self) -> bool:
        """Whether the daemon said to stop (converged, cost bound, max_epochs, or ended)."""
        return self.verdict is not None and self.verdict.stop

    @property
    def converged(self) -> bool:
        """Whether the trial finished having reached the target metric."""
        return self._trial.finished and self.verdict.converged

    @property
    def power_limit_w(self) -> float | None:
        """The power limit [W] this object last set (None if none)."""
        return self._power.current_limit_w

    @property
    def suspended(self) -> bool:
        """Whether this run ended interrupted and the trial waits for the next generation."""
        return self.verdict is not None and self.verdict.suspended

    power_enabled = delegated("_power", "enabled", "Whether power limits are profiled and set "
                              "(the constructor's ``power``).")
    wait_steps = delegated("_power", "wait_steps", "Steps before the first profiling warm-up "
                           "(the constructor's ``wait_steps``).")

    def per_rank_batch_size(self, world_size: int | None = None, rank: int | None = None, *,
                            strict: bool = False) -> int:
        """This rank's samples per step: :func:`per_rank_batch_size` of the trial's global
        :attr:`batch_size` (``world_size``/``rank`` default to ``$WORLD_SIZE``/``$RANK``, else
        1 and 0). Raises ValueError as that function does (e.g. batch size < world size),
        and naming the variable for a malformed ``$WORLD_SIZE``/``$RANK``."""
        from offcut.client.elastic.env import _int_var  # the launcher's variables, parsed once

        if world_size is None:
            world_size = _int_var(os.environ, "WORLD_SIZE", default=1, minimum=1)
        if rank is None:
            rank = _int_var(os.environ, "RANK", default=0)
        return per_rank_batch_size(self.batch_size, world_size, rank, strict=strict)

    # ------------------------------------------------------------------ epoch hooks
    def on_epoch_begin(self) -> None:
        """Start measuring an epoch (and the power plan, on the first call).

        Raises:
            TrialEndedError: the trial already has a final verdict.
            RuntimeError: an epoch is already open, or the object is closed.
        """
        self._check_open()
        self._trial.check_epoch_begin()
        self._power.start_if_idle()
        self._trial.begin_epoch()

    def on_epoch_end(self, metric: float) -> Verdict:
        """End the epoch: a warm-up or profiling window still open is interrupted
        (InterruptWindow; the limit goes back to the maximum, as in Zeus), the epoch's time
        [s] and energy [J] are added to the trial's, and the cumulative figures are reported
        with ``metric`` (ReportEpoch).

        Returns:
            The verdict (also in :attr:`verdict`, :attr:`should_stop`).

        Raises:
            ValueError: ``metric`` is NaN or infinite (nothing changes; call again).
            RuntimeError: no epoch is open.
            OffcutError: the daemon refused or is unreachable (the epoch stays counted and
                goes into the next report's cumulative figures).
        """
        self._check_open()
        metric = self._trial.check_epoch_end(metric)
        self._power.interrupt(follow=True)
        return self._trial.end_epoch(metric)

    # ------------------------------------------------------------------ power limits
    def on_step_begin(self) -> None:
        """Mark the beginning of a training step: advances power-limit profiling (Zeus's
        ``GlobalPowerLimitOptimizer``): after ``wait_steps`` steps, set the planned limit, run
        ``warmup_steps`` steps, measure ``profile_steps`` steps, report the window
        (ReportWindow) and follow the next plan; at a ``use`` plan, set that limit once.
        Does nothing when power limits are off.

        Raises:
            PowerLimitError: the GPU refused the limit (e.g. no root/SYS_ADMIN).
            OffcutError: the daemon refused or is unreachable.
        """
        self._check_open()
        self._power.on_step()

    # ------------------------------------------------------------------ closing
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ZeusTraining is closed")

    def interrupt(self) -> Verdict | None:
        """End this process's part of the trial because the run is interrupted (the stop
        signal of a preemption or rescale): ``close(interrupted=True)``. The trial is suspended
        for the next generation (:attr:`suspended`); store :attr:`trial_number` in the
        checkpoint and pass it as ``resume_trial`` there."""
        return self.close(interrupted=True)

    def close(self, end_trial: bool | None = None, *, interrupted: bool = False
              ) -> Verdict | None:
        """Finish the run: cancel an open epoch (not reported), interrupt an open profiling
        window, end the trial if it has no final verdict (EndTrial: counted as not converged
        with at least one epoch reported, abandoned without), set the GPUs' maximum limit
        again, and close an owned client. Idempotent.

        With ``interrupted`` (a preemption or rescale, not a failure) the open epoch is
        measured instead and its time [s] and energy [J] count for the trial (they were spent
        on it, though the epoch is trained again from the checkpoint), and the trial is
        suspended with its cumulative figures (EndTrial with interrupted): it stays open for
        ``resume_trial`` in the next generation and no batch size is pruned.

        Args:
            end_trial: override ``end_trial_on_close`` (False: leave the trial open for a
                restarted process). Ignored with ``interrupted``.
            interrupted: suspend the trial instead of ending it.

        Returns:
            The last verdict (None if the trial was left open without any report).

        Raises:
            OffcutError, PowerLimitError: the first failure of these steps (all are tried).
        """
        if self._closed:
            return self.verdict
        self._closed = True
        end = self.end_trial_on_close if end_trial is None else end_trial
        attempt = _Steps(self.trial_number)
        if self._trial.in_epoch:
            attempt(lambda: self._trial.cut_epoch(count=interrupted))
        attempt(lambda: self._power.interrupt(follow=False))
        if (interrupted or end) and not self._trial.finished:
            attempt(lambda: self._trial.end(interrupted))
        if self.restore_power_limit and self._power.current_limit_w is not None:
            attempt(self._power.restore_max)
        if self._owns_client:
            attempt(self.client.close)
        if attempt.first_error is not None:
            raise attempt.first_error
        return self.verdict

    def __enter__(self) -> "ZeusTraining":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Close; leaving by ``sys.exit(75)`` (:data:`EXIT_INTERRUPTED`) suspends the trial
        (``close(interrupted=True)``), any other exception ends it as a failure."""
        if exc_type is None:
            self.close()
            return
        interrupted = (isinstance(exc, SystemExit) and exc.code == EXIT_INTERRUPTED)
        try:
            self.close(interrupted=interrupted)
        except Exception as close_error:  # noqa: BLE001 - do not hide the original error
            logger.warning("closing after %s failed: %s", exc_type.__name__, close_error)


__all__ = ["ENV_ADDRESS", "ENV_BATCH_SIZE", "ENV_GENERATION", "ENV_JOB_ID", "ENV_RESUME_TRIAL",
           "ENV_TASK_ID", "ENV_TRIAL", "ENV_VARS", "EXIT_INTERRUPTED",
           "BackendUnavailable", "HelperBackend", "ManualBackend", "MeasurementBackend",
           "NvmlBackend", "PowerHelperError", "PowerLimitError", "PowerLimitFollower",
           "RankSync", "RankSyncError", "TorchRankSync", "TrainingSetupError",
           "TrialEndedError", "Verdict", "ZeusMonitorBackend", "ZeusTraining",
           "ZeusdHttpClient", "connect_helper", "default_backend", "measuring_backend",
           "node_gpu_ids", "nvml_power_limit_range", "per_rank_batch_size"]

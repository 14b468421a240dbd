"""GPU power limits from the training side of Zeus's power-limit optimizer
(:mod:`offcut.client.training`; Zeus's ``GlobalPowerLimitOptimizer`` state machine, with the
plan and the choice kept by the daemon): profile the limits the daemon plans, one measurement
window each, then run at the limit it chooses.

With several processes (a :class:`~offcut.client.training.ranks.RankSync`), every process runs
the same state machine at the same steps and sets the limit on its own GPUs: rank 0
(:class:`~offcut.client.training.ZeusTraining`) asks the daemon and shares each plan, the
others (:class:`PowerLimitFollower`) receive it; a window's time is the slowest rank's and its
energy the sum of all ranks' (Zeus's rule). Across generations the daemon keeps the profile
(per job and batch size): a window cut short by the stop signal is reported interrupted and
planned again, so the next generation measures it (and only the limits not yet measured), and
once the limit is chosen every later generation starts at it.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

from offcut.client.api import Client
from offcut.client.training.backends import MeasurementBackend
from offcut.client.training.errors import RankSyncError, TrainingSetupError
from offcut.client.training.ranks import RankSync
from offcut.errors import FailedPrecondition
from offcut.zeus_views import PowerPlan, ZeusJob

logger = logging.getLogger("offcut.training")

_IDLE, _OFF, _READY, _WARMUP, _WINDOW, _DONE = "idle", "off", "ready", "warmup", "window", "done"

# ----------------------------------------------------------------------------- shared plans
#: a plan as rank 0 shares it: (kind, power_limit_w [W], warmup_steps, profile_steps,
#: max_limit_w [W], wait_steps)
PLAN_LENGTH = 6
_KIND_ERROR, _KIND_OFF, _KIND_USE, _KIND_PROFILE = 0.0, 1.0, 2.0, 3.0
_ACTIONS = {"use": _KIND_USE, "profile": _KIND_PROFILE}


def _encode(plan: PowerPlan | None, max_limit_w: float | None,
            wait_steps: int) -> list[float]:
    """A plan (None: power limits are off) as the floats rank 0 shares."""
    if plan is None:
        return [_KIND_OFF, 0.0, 0.0, 0.0, 0.0, float(wait_steps)]
    kind = _ACTIONS.get(plan.action)
    if kind is None:
        raise RuntimeError(f"the daemon sent an unknown power plan action {plan.action!r}")
    return [kind, plan.power_limit_w, float(plan.warmup_steps), float(plan.profile_steps),
            float(max_limit_w or 0.0), float(wait_steps)]


def _decode(values: list[float]) -> tuple[PowerPlan | None, float, int]:
    """(plan or None when off, max_limit_w [W], wait_steps) of rank 0's shared floats.

    Raises:
        RankSyncError: rank 0 said its step failed.
    """
    kind, limit, warmup, profile, max_limit, wait = values
    if kind == _KIND_ERROR:
        raise RankSyncError("rank 0 could not get the daemon's power plan (its log says why)")
    if kind not in (_KIND_OFF, _KIND_USE, _KIND_PROFILE):
        raise RankSyncError(f"rank 0 shared a power plan of unknown kind {kind!r}")
    if kind == _KIND_OFF:
        return None, 0.0, int(wait)
    action = "use" if kind == _KIND_USE else "profile"
    return (PowerPlan(action=action, power_limit_w=limit, warmup_steps=int(warmup),
                      profile_steps=int(profile)), max_limit, int(wait))


def profiled_max_limit_w(job: ZeusJob, job_id: str, power: bool | None,
                         backend: MeasurementBackend) -> float | None:
    """The maximum power limit [W] of ``job``'s power spec when its power limits are to be
    profiled and set (``power``: None = when the job has a power spec; False = never; True =
    required), else None.

    Raises:
        TrainingSetupError: ``power=True`` without a power spec, or a spec's range outside the
            GPUs' (``backend.power_limit_range()``).
    """
    has_spec = job.power is not None
    if power and not has_spec:
        raise TrainingSetupError(f"power=True but job {job_id!r} was registered "
                                 "without a power spec")
    if not (has_spec if power is None else bool(power)):
        return None
    spec = job.power
    lo, hi = backend.power_limit_range()
    if spec.min_power_limit_w < lo - 1e-6 or spec.max_power_limit_w > hi + 1e-6:
        raise TrainingSetupError(
            f"job {job_id!r} profiles power limits {spec.min_power_limit_w:g}-"
            f"{spec.max_power_limit_w:g} W but the GPUs accept {lo:g}-{hi:g} W")
    return spec.max_power_limit_w




class PowerLimitControl:
    """The power limits of one batch size's runs on this process's GPUs: at the first epoch or
    step, the daemon's plan (PowerPlan); then, step by step, ``wait_steps`` steps at the
    maximum limit, and for every limit to profile ``warmup_steps`` steps at it and a window of
    ``profile_steps`` steps measured and reported (ReportWindow), until a ``use`` plan sets the
    chosen limit once.

    With ``sync`` (several processes, the module docstring) the control on rank 0 asks the
    daemon and shares every plan; on another rank (:meth:`follower`) it receives them, and a
    window's figures are reduced over the ranks before rank 0 reports them. The shared steps
    are the first plan (:meth:`start_if_idle`), a window's end (:meth:`on_step`) and a cut
    short window followed on (:meth:`interrupt` with ``follow``); :meth:`interrupt` without
    ``follow`` (closing) is local.

    Args:
        client: the daemon's client (None only on a follower).
        backend: measures the windows and sets this process's limits.
        job_id, batch_size: the job and the trial's (global) batch size.
        max_limit_w: the job's maximum power limit [W]; None: power limits are off.
        wait_steps: steps before the first profiling warm-up.
        sync: the generation's ranks; None: this process alone.

    Attributes:
        enabled: power limits are profiled and set (on a follower: known after the first
            plan).
        wait_steps: as given (read when the plan is first fetched; a follower gets rank 0's).
        current_limit_w: the limit [W] this object last set (None if none).
        main: whether this control talks to the daemon (rank 0, or no ``sync``).
    """

    def __init__(self, client: Client | None, backend: MeasurementBackend | None, job_id: str,
                 batch_size: int, max_limit_w: float | None, *, wait_steps: int,
                 sync: RankSync | None = None):
        self.client, self.backend = client, backend
        self.job_id, self.batch_size = job_id, batch_size
        self.max_limit_w = max_limit_w
        self.enabled = max_limit_w is not None
        self.wait_steps = wait_steps
        self.sync = sync
        self.main = sync is None or sync.rank == 0
        if self.main and self.enabled and client is None:
            raise ValueError("the control that talks to the daemon needs a client")
        self.current_limit_w: float | None = None
        self._phase = _IDLE if (self.enabled or sync is not None) else _OFF
        self._plan: PowerPlan | None = None
        self._steps_left = 0
        self._window_open = False

    @classmethod
    def follower(cls, backend: MeasurementBackend | None, sync: RankSync) -> "PowerLimitControl":
        """The control of a rank other than 0: everything it does comes from rank 0's shared
        plans (``backend`` may be None when rank 0 keeps power limits off).

        Raises:
            ValueError: ``sync.rank`` is 0.
        """
        if sync.rank == 0:
            raise ValueError("rank 0 talks to the daemon (ZeusTraining); a follower is another "
                             "rank")
        return cls(None, backend, "", 0, None, wait_steps=0, sync=sync)

    # ------------------------------------------------------------------ plans
    def _ask(self, call: Callable[[], PowerPlan]) -> PowerPlan | None:
        """The next plan: on the main control ``call()`` (the daemon), shared with the other
        ranks (an error is shared as such, then raised); on a follower rank 0's. None: power
        limits are off (a follower's first plan only)."""
        if not self.main:
            plan, max_limit_w, wait = _decode(self.sync.share(None, PLAN_LENGTH))
            if self._phase == _IDLE:
                self.max_limit_w, self.wait_steps = max_limit_w, wait
                self.enabled = plan is not None
            return plan
        try:
            plan = call()
            shared = _encode(plan, self.max_limit_w, self.wait_steps)
        except BaseException:
            if self.sync is not None:
                try:  # the other ranks raise RankSyncError instead of waiting for a plan
                    self.sync.share([_KIND_ERROR] + [0.0] * (PLAN_LENGTH - 1), PLAN_LENGTH)
                except Exception as exc:  # noqa: BLE001 - the daemon's error matters more
                    logger.warning("could not tell the other ranks: %s", exc)
            raise
        if self.sync is not None:
            self.sync.share(shared, PLAN_LENGTH)
        return plan

    def start_if_idle(self) -> None:
        """Fetch the daemon's plan (rank 0's, shared) and follow it, unless that was done (or
        limits are off).

        Raises:
            PowerLimitError: the GPU refused the limit.
            OffcutError: the daemon refused or is unreachable.
            RankSyncError: (a follower) rank 0 could not get the plan.
        """
        if self._phase == _IDLE:
            self._start()

    def on_step(self) -> None:
        """Advance by one training step (see the class); :meth:`start_if_idle` first.

        Raises:
            PowerLimitError: the GPU refused the limit (e.g. no root/SYS_ADMIN).
            OffcutError: the daemon refused or is unreachable.
            RankSyncError: (a follower) rank 0 could not report the window.
        """
        self.start_if_idle()
        if self._phase == _READY:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._begin_warmup(self._plan)
        elif self._phase == _WARMUP:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._begin_profile_window()
        elif self._phase == _WINDOW:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._window_open = False
                time_s, energy_j = self.backend.end_window(self._window_name())
                if self.sync is not None:
                    time_s, energy_j = self.sync.reduce_window(time_s, energy_j)
                self._follow(self._ask(lambda: self._report_window(time_s, energy_j)),
                             wait=None)

    def restore_max(self) -> None:
        """Set the GPUs' maximum limit [W] again (``backend.power_limit_range()``). Raises
        :class:`~offcut.client.training.PowerLimitError`."""
        self._set_limit(self.backend.power_limit_range()[1])

    def _window_name(self) -> str:
        return f"offcut.power.{self._plan.power_limit_w:g}W"

    def _set_limit(self, watts: float) -> None:
        if self.current_limit_w is not None and abs(self.current_limit_w - watts) < 1e-9:
            return
        logger.info("setting the power limit to %g W", watts)
        self.backend.set_power_limit(watts)
        self.current_limit_w = watts

    def _start(self) -> None:
        if self.main and not self.enabled:
            self._phase = _OFF
            if self.sync is not None:  # the other ranks learn that limits are off
                self.sync.share(_encode(None, None, self.wait_steps), PLAN_LENGTH)
            return
        plan = self._ask(lambda: self.client.power_plan(self.job_id, self.batch_size))
        if plan is None:
            self._phase = _OFF
            return
        if self.backend is None:
            raise TrainingSetupError("rank 0 profiles power limits but this process has no "
                                     "power-limit backend (give every rank one)")
        self._follow(plan, wait=self.wait_steps + 1)

    def _follow(self, plan: PowerPlan, wait: int | None) -> None:
        """Act on a plan: ``use`` sets the limit; ``profile`` starts the warm-up now
        (``wait`` None: inside a step) or after ``wait`` more steps at the maximum limit."""
        self._plan = plan
        if plan.action == "use":
            self._set_limit(plan.power_limit_w)
            self._phase = _DONE
            if self.main:
                logger.info("power profile of batch size %d done: %g W", self.batch_size,
                            plan.power_limit_w)
            else:
                logger.info("power profile done (rank 0's plan): %g W", plan.power_limit_w)
        elif plan.action == "profile":
            if wait is None:
                self._begin_warmup(plan)
            else:
                self._set_limit(self.max_limit_w)
                self._phase, self._steps_left = _READY, wait
        else:
            raise RuntimeError(f"the daemon sent an unknown power plan action {plan.action!r}")

    def _begin_warmup(self, plan: PowerPlan) -> None:
        self._set_limit(plan.power_limit_w)
        if plan.warmup_steps > 0:
            self._phase, self._steps_left = _WARMUP, plan.warmup_steps
        else:
            self._begin_profile_window()

    def _begin_profile_window(self) -> None:
        self.backend.begin_window(self._window_name())
        self._window_open = True
        self._phase, self._steps_left = _WINDOW, max(1, self._plan.profile_steps)

    def _report_window(self, time_s: float, energy_j: float) -> PowerPlan:
        limit = self._plan.power_limit_w
        try:
            if not (math.isfinite(time_s) and math.isfinite(energy_j)
                    and time_s > 0 and energy_j > 0):
                logger.warning("window at %g W measured %.3g s, %.3g J (too short for the "
                               "energy counter?); profiling it again", limit, time_s, energy_j)
                return self.client.interrupt_power_window(self.job_id, self.batch_size, limit)
            logger.info("window at %g W: %.3f s, %.1f J", limit, time_s, energy_j)
            return self.client.report_power_window(self.job_id, self.batch_size, limit, time_s,
                                                   energy_j)
        except FailedPrecondition as exc:
            # another run of this batch size moved the profile on (or finished it)
            logger.info("window at %g W not recorded (%s); following the current plan", limit, exc)
            return self.client.power_plan(self.job_id, self.batch_size)

    def _interrupt_window(self, limit: float) -> PowerPlan:
        try:
            return self.client.interrupt_power_window(self.job_id, self.batch_size, limit)
        except FailedPrecondition:
            return self.client.power_plan(self.job_id, self.batch_size)

    def interrupt(self, follow: bool) -> None:
        """Cut short a warm-up or window (the end of an epoch, or close): the window's
        measurement is cancelled and, on the main control, reported as interrupted
        (InterruptWindow; a profile another run moved on is taken as it is now); with
        ``follow``, acts on the next plan (a ``profile`` one after a step at the maximum
        limit), shared with the other ranks. Does nothing outside a warm-up or window.

        Raises:
            PowerLimitError: the GPU refused the next plan's limit.
            OffcutError: the daemon refused or is unreachable.
            RankSyncError: (a follower, with ``follow``) rank 0 could not get the plan.
        """
        if self._phase not in (_WARMUP, _WINDOW):
            return
        limit = self._plan.power_limit_w
        if self._window_open:
            self._window_open = False
            self.backend.end_window(self._window_name(), cancel=True)
        logger.info("%s at %g W interrupted", "window" if self._phase == _WINDOW else "warm-up",
                    limit)
        self._phase = _READY
        if follow:
            self._follow(self._ask(lambda: self._interrupt_window(limit)), wait=1)
        elif self.main:
            self._interrupt_window(limit)


class PowerLimitFollower:
    """The power limits of a rank other than 0 (one process per GPU): it sets the limits that
    rank 0's :class:`~offcut.client.training.ZeusTraining` (created with the same kind of
    ``sync``) gets from the daemon's power-limit optimizer on this process's own GPUs, and
    measures its share of every profiling window. It never talks to the daemon.

    Call its hooks where rank 0 calls ZeusTraining's, at the same steps (they are
    collectives when a plan can change)::

        follower.on_epoch_begin()      # rank 0: zt.on_epoch_begin()
        follower.on_step_begin()       # rank 0: zt.on_step_begin(), before every step
        follower.on_epoch_end()        # rank 0: zt.on_epoch_end(metric)
        follower.close()               # rank 0: zt.close() / zt.interrupt(); local

    Args:
        backend: sets this process's limits and measures its windows (e.g.
            :class:`~offcut.client.training.HelperBackend` of ``[LOCAL_RANK]``); None is
            allowed when rank 0 keeps power limits off (else its first plan raises
            :class:`TrainingSetupError`).
        sync: the generation's ranks (:class:`~offcut.client.training.TorchRankSync`).
        restore_power_limit: whether :meth:`close` sets the GPUs' maximum limit again.

    Raises:
        ValueError: ``sync.rank`` is 0 (rank 0 runs ZeusTraining).
    """

    def __init__(self, backend: MeasurementBackend | None, sync: RankSync, *,
                 restore_power_limit: bool = True):
        self._control = PowerLimitControl.follower(backend, sync)
        self.restore_power_limit = restore_power_limit
        self._closed = False

    @property
    def enabled(self) -> bool:
        """Whether rank 0 profiles and sets power limits (known after :meth:`on_epoch_begin`)."""
        return self._control.enabled

    @property
    def power_limit_w(self) -> float | None:
        """The limit [W] this object last set on this process's GPUs (None if none)."""
        return self._control.current_limit_w

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this PowerLimitFollower is closed")

    def on_epoch_begin(self) -> None:
        """Rank 0's first plan, on the first call (a collective), and its limit set.

        Raises:
            RankSyncError: rank 0 could not get the plan.
            PowerLimitError: the GPU (or the power helper) refused the limit.
            TrainingSetupError: rank 0 profiles power limits but this object has no backend.
        """
        self._check_open()
        self._control.start_if_idle()

    def on_step_begin(self) -> None:
        """Mark the beginning of a training step (at a window's end: a collective). Raises as
        :meth:`on_epoch_begin`."""
        self._check_open()
        self._control.on_step()

    def on_epoch_end(self) -> None:
        """A warm-up or window still open is cut short, and rank 0's next plan followed (a
        collective). Raises as :meth:`on_epoch_begin`."""
        self._check_open()
        self._control.interrupt(follow=True)

    def close(self, interrupted: bool = False) -> None:
        """Cancel an open window and set the GPUs' maximum limit again (when this object set
        one and ``restore_power_limit``). Local (no collective): call it before any exit,
        e.g. from ``ElasticRun(on_restart=...)``. Idempotent. ``interrupted`` is for symmetry
        with rank 0 (it changes nothing here: rank 0 reports the window interrupted).

        Raises:
            PowerLimitError: the GPU refused the maximum limit.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._control.interrupt(follow=False)
        finally:
            if self.restore_power_limit and self._control.current_limit_w is not None:
                self._control.restore_max()

    def interrupt(self) -> None:
        """``close(interrupted=True)`` (the stop signal of a preemption or rescale)."""
        self.close(interrupted=True)

    def __enter__(self) -> "PowerLimitFollower":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(interrupted=exc_type is not None)

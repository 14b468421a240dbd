"""GPU power limits from the training side of Zeus's power-limit optimizer
(:mod:`offcut.client.training`; Zeus's ``GlobalPowerLimitOptimizer`` state machine, with the
plan and the choice kept by the daemon): profile the limits the daemon plans, one measurement
window each, then run at the limit it chooses.
"""

from __future__ import annotations

import logging
import math

from offcut.client.api import Client
from offcut.client.training.backends import MeasurementBackend
from offcut.client.training.errors import TrainingSetupError
from offcut.errors import FailedPrecondition
from offcut.v1 import zeus_pb2

logger = logging.getLogger("offcut.training")

_IDLE, _OFF, _READY, _WARMUP, _WINDOW, _DONE = "idle", "off", "ready", "warmup", "window", "done"


def profiled_max_limit_w(job: zeus_pb2.ZeusJob, job_id: str, power: bool | None,
                         backend: MeasurementBackend) -> float | None:
    """The maximum power limit [W] of ``job``'s power spec when its power limits are to be
    profiled and set (``power``: None = when the job has a power spec; False = never; True =
    required), else None.

    Raises:
        TrainingSetupError: ``power=True`` without a power spec, or a spec's range outside the
            GPUs' (``backend.power_limit_range()``).
    """
    has_spec = job.spec.HasField("power")
    if power and not has_spec:
        raise TrainingSetupError(f"power=True but job {job_id!r} was registered "
                                 "without a power spec")
    if not (has_spec if power is None else bool(power)):
        return None
    spec = job.spec.power
    lo, hi = backend.power_limit_range()
    if spec.min_power_limit_w < lo - 1e-6 or spec.max_power_limit_w > hi + 1e-6:
        raise TrainingSetupError(
            f"job {job_id!r} profiles power limits {spec.min_power_limit_w:g}-"
            f"{spec.max_power_limit_w:g} W but the GPUs accept {lo:g}-{hi:g} W")
    return spec.max_power_limit_w


class PowerLimitControl:
    """The power limits of one batch size's runs: at the first epoch or step, the daemon's
    plan (PowerPlan); then, step by step, ``wait_steps`` steps at the maximum limit, and for
    every limit to profile ``warmup_steps`` steps at it and a window of ``profile_steps`` steps
    measured and reported (ReportWindow), until a ``use`` plan sets the chosen limit once.

    Args:
        client: the daemon's client.
        backend: measures the windows and sets the limits.
        job_id, batch_size: the job and the trial's (global) batch size.
        max_limit_w: the job's maximum power limit [W]; None: power limits are off.
        wait_steps: steps before the first profiling warm-up.

    Attributes:
        enabled: power limits are profiled and set (checked when the plan is first fetched).
        wait_steps: as given (read when the plan is first fetched).
        current_limit_w: the limit [W] this object last set (None if none).
    """

    def __init__(self, client: Client, backend: MeasurementBackend, job_id: str,
                 batch_size: int, max_limit_w: float | None, *, wait_steps: int):
        self.client, self.backend = client, backend
        self.job_id, self.batch_size = job_id, batch_size
        self.max_limit_w = max_limit_w
        self.enabled = max_limit_w is not None
        self.wait_steps = wait_steps
        self.current_limit_w: float | None = None
        self._phase = _IDLE if self.enabled else _OFF
        self._plan: zeus_pb2.PowerPlan | None = None
        self._steps_left = 0

    def start_if_idle(self) -> None:
        """Fetch the daemon's plan and follow it, unless that was done (or limits are off).

        Raises:
            PowerLimitError: the GPU refused the limit.
            OffcutError: the daemon refused or is unreachable.
        """
        if self._phase == _IDLE:
            self._start()

    def on_step(self) -> None:
        """Advance by one training step (see the class); :meth:`start_if_idle` first.

        Raises:
            PowerLimitError: the GPU refused the limit (e.g. no root/SYS_ADMIN).
            OffcutError: the daemon refused or is unreachable.
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
                time_s, energy_j = self.backend.end_window(self._window_name())
                self._follow(self._report_window(time_s, energy_j), wait=None)

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
        if not self.enabled:
            self._phase = _OFF
            return
        self._follow(self.client.power_plan(self.job_id, self.batch_size),
                     wait=self.wait_steps + 1)

    def _follow(self, plan: zeus_pb2.PowerPlan, wait: int | None) -> None:
        """Act on a plan: ``use`` sets the limit; ``profile`` starts the warm-up now
        (``wait`` None: inside a step) or after ``wait`` more steps at the maximum limit."""
        self._plan = plan
        if plan.action == "use":
            self._set_limit(plan.power_limit_w)
            self._phase = _DONE
            logger.info("power profile of batch size %d done: %g W", self.batch_size,
                        plan.power_limit_w)
        elif plan.action == "profile":
            if wait is None:
                self._begin_warmup(plan)
            else:
                self._set_limit(self.max_limit_w)
                self._phase, self._steps_left = _READY, wait
        else:
            raise RuntimeError(f"the daemon sent an unknown power plan action {plan.action!r}")

    def _begin_warmup(self, plan: zeus_pb2.PowerPlan) -> None:
        self._set_limit(plan.power_limit_w)
        if plan.warmup_steps > 0:
            self._phase, self._steps_left = _WARMUP, plan.warmup_steps
        else:
            self._begin_profile_window()

    def _begin_profile_window(self) -> None:
        self.backend.begin_window(self._window_name())
        self._phase, self._steps_left = _WINDOW, max(1, self._plan.profile_steps)

    def _report_window(self, time_s: float, energy_j: float) -> zeus_pb2.PowerPlan:
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

    def interrupt(self, follow: bool) -> None:
        """Cut short a warm-up or window (the end of an epoch, or close): the window's
        measurement is cancelled and reported as interrupted (InterruptWindow; a profile
        another run moved on is taken as it is now); with ``follow``, acts on the next plan
        (a ``profile`` one after a step at the maximum limit). Does nothing outside a warm-up
        or window.

        Raises:
            PowerLimitError: the GPU refused the next plan's limit.
            OffcutError: the daemon refused or is unreachable.
        """
        if self._phase not in (_WARMUP, _WINDOW):
            return
        limit = self._plan.power_limit_w
        if self._phase == _WINDOW:
            self.backend.end_window(self._window_name(), cancel=True)
        logger.info("%s at %g W interrupted", "window" if self._phase == _WINDOW else "warm-up",
                    limit)
        self._phase = _READY
        try:
            plan = self.client.interrupt_power_window(self.job_id, self.batch_size, limit)
        except FailedPrecondition:
            plan = self.client.power_plan(self.job_id, self.batch_size)
        if follow:
            self._follow(plan, wait=1)

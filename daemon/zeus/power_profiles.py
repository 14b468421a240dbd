"""The power-limit profiles of the registry's Zeus jobs, one per (job, batch size), durable in
the Zeus storage (docs/zeus.md, "The power-limit optimizer"; Zeus, NSDI '23, Section 4.1).

:class:`PowerProfiles` is the registry's collaborator for the ``PowerLimitOptimizer`` calls
(:attr:`offcut.daemon.zeus.registry.ZeusRegistry.power`): it shares the registry's lock,
storage and clock, and asks the registry only who may act on a job (``entry``: NOT_FOUND
otherwise; a job's profiles are its owner's) and to reload memory after a failed commit
(``recover``). A call changes a copy of the profile, queues its row with the answer to its
request id and swaps the copy in; it answers once the row is durable.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from offcut.daemon.zeus.answers import Caller, check_repeat, request_key, stored_answer
from offcut.daemon.zeus.plo import PowerLimitProfile
from offcut.zeus_views import PowerPlan
from offcut.daemon.zeus.storage import ZeusStorage, ZeusWrite
from offcut.errors import FailedPrecondition, NotFound
from offcut.zeus_views import PowerProfile

if TYPE_CHECKING:  # (the registry imports this module)
    from offcut.daemon.zeus.registry import _Entry

#: ``zeus_state.kind`` of a power profile's row (its ``batch_size`` column is the profile's)
PLO = "plo"


class PowerProfiles:
    """The profiles (``profiles``: (job id, batch size) -> :class:`PowerLimitProfile`; a
    profile not stored yet is a fresh one of the job's power spec).

    Args:
        storage: the Zeus tables (rows of kind :data:`PLO`).
        lock: the registry's lock (every call runs its memory part under it).
        clock: wall-clock seconds stamping stored answers.
        entry: the registry's job ``(job id, caller) -> entry`` if the caller may act on it;
            raises NotFound otherwise.
        recover: reloads the registry's memory after a failed commit (nothing otherwise).

    Raises (from its methods): NotFound (job, or a batch size not the job's),
    FailedPrecondition (a job without a power spec, a batch size never predicted), and
    InvalidArgument for a repeated request id with other arguments or bad values
    (:class:`PowerLimitProfile`), all before any state changes.
    """

    def __init__(self, storage: ZeusStorage, lock: threading.RLock,
                 clock: Callable[[], float], entry: "Callable[[str, Caller], _Entry]",
                 recover: Callable[[], None]):
        self.storage = storage
        self.lock = lock
        self.clock = clock
        self._entry = entry
        self._recover = recover
        self.profiles: dict[tuple[str, int], PowerLimitProfile] = {}

    def forget_job(self, job_id: str) -> None:
        """Drop a deleted job's profiles from memory (call under the lock)."""
        for key in [k for k in self.profiles if k[0] == job_id]:
            del self.profiles[key]

    def _profile(self, job_id: str, batch_size: int, who: Caller) -> PowerLimitProfile:
        entry = self._entry(job_id, who)  # a job's profiles are its owner's
        if entry.power is None:
            raise FailedPrecondition(f"job {job_id!r} was registered without a power spec",
                                     "job_id")
        if batch_size not in entry.job.spec.batch_sizes:
            raise NotFound(f"batch size {batch_size} is not one of job {job_id!r}'s "
                           f"{list(entry.job.spec.batch_sizes)}", "batch_size")
        if batch_size not in entry.job.ledger.predicted:
            raise FailedPrecondition(f"batch size {batch_size} was never predicted for job "
                                     f"{job_id!r}; call Predict first", "batch_size")
        return (self.profiles.get((job_id, batch_size))
                or PowerLimitProfile(entry.power, entry.job.spec.max_power_w))

    def _mutate(self, job_id: str, batch_size: int, who: Caller,
                op: Callable[[PowerLimitProfile], PowerPlan], *, key: str = "",
                request: dict | None = None) -> tuple[PowerPlan, int]:
        """Run ``op`` on a copy of the profile, swap it in and queue its row (with the answer
        to ``key`` and the call's ``request`` arguments, :func:`stored_answer`); (the plan,
        the write's ticket). Call under the lock."""
        self._recover()
        copy = PowerLimitProfile.from_dict(self._profile(job_id, batch_size, who).to_dict())
        plan = op(copy)
        ticket = self.storage.submit(ZeusWrite(
            PLO, job_id, batch_size, copy.to_dict(), request_id=key or None,
            response=stored_answer(plan, request) if key else None,
            created_at=self.clock()), (plan, request))
        self.profiles[(job_id, batch_size)] = copy
        return plan, ticket

    def _window_call(self, method: str, job_id: str, batch_size: int, who: Caller,
                     request_id: str, request: dict,
                     op: Callable[[PowerLimitProfile], PowerPlan]) -> PowerPlan:
        """A power-window call (``method`` ReportWindow / InterruptWindow, its arguments
        outside the key ``request``): a repeated ``request_id`` of the same caller for the
        same job and batch size returns the first plan and changes nothing (within
        ``request_retention_s``); with other arguments it is InvalidArgument
        (:func:`check_repeat`)."""
        with self.lock:
            self._entry(job_id, who)
            key = request_key(method, who, job_id, batch_size, request_id) if request_id else ""
            first = self.storage.answer(key, job_id)
            if first is not None and not first[0]:  # (a durable answer: its fields)
                fields = first[1]
                check_repeat(method, fields.pop("request", None), request)
                return PowerPlan(**fields)
            if first is not None:  # (not durable yet: the plan and the call's arguments)
                ticket, (plan, asked) = first
                check_repeat(method, asked, request)
            else:
                plan, ticket = self._mutate(job_id, batch_size, who, op, key=key,
                                            request=request)
        try:
            self.storage.wait(ticket, key)
        except Exception:
            self._recover()
            raise
        return plan

    def power_plan(self, job_id: str, batch_size: int, who: Caller) -> PowerPlan:
        """What to run next at this batch size: a window to profile, or the chosen limit."""
        with self.lock:
            return self._profile(job_id, batch_size, who).plan()

    def report_window(self, job_id: str, batch_size: int, power_limit_w: float, time_s: float,
                      energy_j: float, who: Caller, request_id: str = "") -> PowerPlan:
        """Record a measured profiling window (``power_limit_w`` [W], ``time_s`` [s],
        ``energy_j`` [J]); returns the next plan. ``request_id``: see :meth:`_window_call`."""
        return self._window_call(
            "ReportWindow", job_id, batch_size, who, request_id,
            {"power_limit_w": power_limit_w, "time_s": time_s, "energy_j": energy_j},
            lambda p: p.report_window(power_limit_w, time_s, energy_j))

    def interrupt_window(self, job_id: str, batch_size: int, power_limit_w: float,
                         who: Caller, request_id: str = "") -> PowerPlan:
        """The window at ``power_limit_w`` [W] was cut short: plan it again. ``request_id``:
        see :meth:`_window_call` (a retry is not counted as another interruption)."""
        return self._window_call("InterruptWindow", job_id, batch_size, who, request_id,
                                 {"power_limit_w": power_limit_w},
                                 lambda p: p.interrupt(power_limit_w))

    def profile(self, job_id: str, batch_size: int, who: Caller) -> PowerProfile:
        """The (possibly unfinished) profile of a job's batch size, as GetProfile shows it
        (:meth:`PowerLimitProfile.view`, taken under the lock)."""
        with self.lock:
            return self._profile(job_id, batch_size, who).view(job_id, batch_size)

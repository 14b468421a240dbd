"""A Zeus trial as one training process records it (:mod:`offcut.client.training`, which
re-exports :class:`Verdict`): the daemon's verdicts, the batch-size optimizer's calls with the
fields :class:`~offcut.client.api.Client`'s methods do not send (generation, interrupted), and
:class:`ZeusTrial`, the trial's number and batch size with its cumulative epochs, time [s] and
GPU energy [J] across the generations that trained it.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any, Callable

import grpc

from offcut.client.api import Client
from offcut.client.training.backends import MeasurementBackend
from offcut.client.training.errors import TrialEndedError
from offcut.errors import NotFound, Unavailable
from offcut.trial_verdict import Verdict
from offcut.v1 import zeus_pb2
from offcut.wire import zeus as zeus_wire
from offcut.zeus_views import Prediction, Resumed, ZeusJob

logger = logging.getLogger("offcut.training")


# ----------------------------------------------------------------------------- calls
# Calls with the fields Client's methods do not send (generation, interrupted). Their names
# are Client's, so a RetryPolicy treats them alike: predict_batch_size is retried with a
# request id, report_epoch reconciled, end_trial always (an interrupted EndTrial carries
# cumulative figures: repeating it changes nothing).
class _Calls:
    """The calls, named as Client's methods (see above); a namespace, so that they do not
    clash with parameters such as ``close(end_trial=...)``."""

    @staticmethod
    def predict_batch_size(client: Client, job_id: str, request_id: str = "",
                           generation: int = 0) -> Prediction:
        """``Predict``: the next trial's batch size (``request_id`` makes a retry safe)."""
        return zeus_wire.prediction_from_pb(client.bso.Predict(zeus_pb2.PredictRequest(
            job_id=job_id, request_id=request_id, generation=generation),
            timeout=client.timeout_s))

    @staticmethod
    def report_epoch(client: Client, job_id: str, trial_number: int, epoch: int, time_s: float,
                     energy_j: float, metric: float, batch_size: int = 0,
                     generation: int = 0) -> Verdict:
        """``ReportEpoch``: cumulative ``time_s`` [s] and ``energy_j`` [J] and the metric
        after ``epoch``; the verdict (stop, converged)."""
        return zeus_wire.verdict_from_pb(client.bso.ReportEpoch(zeus_pb2.ReportEpochRequest(
            job_id=job_id, trial_number=trial_number, epoch=epoch, time_s=time_s,
            energy_j=energy_j, metric=metric, batch_size=batch_size, generation=generation),
            timeout=client.timeout_s))

    @staticmethod
    def end_trial(client: Client, job_id: str, trial_number: int, interrupted: bool = False,
                  time_s: float | None = None, energy_j: float | None = None,
                  generation: int = 0) -> Verdict:
        """``EndTrial``: close the trial, or suspend it (``interrupted``, with its cumulative
        ``time_s`` [s] and ``energy_j`` [J] when known)."""
        request = zeus_pb2.EndTrialRequest(job_id=job_id, trial_number=trial_number,
                                           interrupted=interrupted, generation=generation)
        if time_s is not None:
            request.time_s = time_s
        if energy_j is not None:
            request.energy_j = energy_j
        return zeus_wire.verdict_from_pb(client.bso.EndTrial(request, timeout=client.timeout_s))

    @staticmethod
    def resume_trial(client: Client, job_id: str, trial_number: int, request_id: str = "",
                     generation: int = 0) -> Resumed:
        """``ResumeTrial``: reopen a suspended trial for ``generation``; its totals so far."""
        return zeus_wire.resumed_from_pb(client.bso.ResumeTrial(zeus_pb2.ResumeTrialRequest(
            job_id=job_id, trial_number=trial_number, request_id=request_id,
            generation=generation), timeout=client.timeout_s))


def _call(client: Client, method: Callable, *args: Any, **kwargs: Any) -> Any:
    """``method(client, ...)`` as a ``Client`` method would run it: through the client's
    RetryPolicy when it has one, gRPC errors raised as :mod:`offcut.errors` exceptions. A
    ``resume_trial`` with a request id is retried on UNAVAILABLE too (the daemon replays the
    first answer to a repeated id)."""
    policy = getattr(client, "retry", None)
    if policy is not None and method is not _Calls.resume_trial:
        return policy.call(client, method, args, kwargs)
    waits = policy.backoffs() if policy is not None and kwargs.get("request_id") else None
    started = time.monotonic()
    while True:
        try:
            return method(client, *args, **kwargs)
        except grpc.RpcError as err:
            exc = client._error(err)
            wait = next(waits) if waits is not None and isinstance(exc, Unavailable) else None
            if wait is None or time.monotonic() + wait - started > policy.deadline_s:
                raise exc from None
            policy.sleep(wait)



class ZeusTrial:
    """This process's part of one trial of a recurring job: which trial (number, global batch
    size), its cumulative epochs, time [s] and GPU energy [J] (the daemon's record when it was
    opened here plus this process's epochs), the epoch being measured and the daemon's last
    verdict. :class:`~offcut.client.training.ZeusTraining` drives it.

    Args:
        client: the daemon's client.
        job_id: the registered job.
        generation: this process's generation (0 = none), sent with every call.
        backend: measures the epochs (a window named ``window``).
        window: the name of the epoch's measurement window.

    Attributes:
        trial_number, batch_size: the trial and its (global) batch size, once :meth:`open`.
        epochs, time_s, energy_j: the trial's epochs reported, time [s] and energy [J].
        verdict: the daemon's last :class:`Verdict` (None before the first report of a new
            trial).
        opened: this object opened the trial (Predict).
        resumed, taken_over: it resumed a suspended trial (ResumeTrial), taken over from a
            replaced generation.
        in_epoch: an epoch is being measured.
    """

    def __init__(self, client: Client, job_id: str, generation: int, backend: MeasurementBackend,
                 window: str):
        self.client, self.job_id, self.generation = client, job_id, generation
        self.backend, self.window = backend, window
        self.trial_number = self.batch_size = 0
        self.epochs, self.time_s, self.energy_j = 0, 0.0, 0.0
        self.verdict: Verdict | None = None
        self.opened = self.resumed = self.taken_over = self.in_epoch = False

    @property
    def finished(self) -> bool:
        """Whether the trial has a final verdict."""
        return self.verdict is not None and self.verdict.finished

    # ------------------------------------------------------------------ opening
    def open(self, job: ZeusJob, trial_number: int | None, resume_trial: int | None,
             request_id: str) -> None:
        """Resume ``resume_trial`` (ResumeTrial), else open a trial (Predict with
        ``request_id``) when ``trial_number`` is None, else continue ``trial_number`` from
        ``job``'s record of it (resumed when suspended).

        Raises:
            NotFound: ``job`` has no trial ``trial_number``.
            OffcutError: the daemon refused (e.g. ``FailedPrecondition``) or is unreachable.
        """
        if resume_trial is not None:
            self._resume(resume_trial, request_id)
        elif trial_number is None:
            pred = _call(self.client, _Calls.predict_batch_size, self.job_id,
                         request_id=request_id, generation=self.generation)
            self.opened = True
            self.trial_number, self.batch_size = pred.trial_number, pred.batch_size
            self.epochs, self.time_s, self.energy_j = 0, 0.0, 0.0
            logger.info("job %s: trial %d, batch size %d", self.job_id, self.trial_number,
                        self.batch_size)
        else:
            self._continue(job, trial_number, request_id)

    def _resume(self, trial_number: int, request_id: str) -> None:
        """ResumeTrial: continue the trial from its stored epochs, time and energy."""
        r = _call(self.client, _Calls.resume_trial, self.job_id, trial_number,
                  request_id=request_id or f"zt-{uuid.uuid4().hex}", generation=self.generation)
        self.resumed, self.taken_over = True, r.taken_over
        self.trial_number, self.batch_size = r.trial_number, r.batch_size
        self.epochs, self.time_s, self.energy_j = r.epochs, r.time_s, r.energy_j
        logger.info("job %s: resumed trial %d (batch size %d%s) after epoch %d, %.1f s, %.1f J",
                    self.job_id, r.trial_number, r.batch_size,
                    ", taken over from a replaced generation" if r.taken_over else "",
                    r.epochs, r.time_s, r.energy_j)

    def _continue(self, job: ZeusJob, trial_number: int, request_id: str) -> None:
        trial = next((t for t in job.trials if t.trial_number == trial_number), None)
        if trial is None and trial_number > 0:  # (GetJob pages: an older trial, by number)
            page = self.client.get_zeus_job(self.job_id, page_size=1,
                                            before_trial_number=trial_number + 1)
            trial = next((t for t in page.trials if t.trial_number == trial_number), None)
        if trial is None:
            raise NotFound(f"job {self.job_id!r} has no trial {trial_number}", "trial_number")
        if trial.status == "suspended":  # a previous process of this run was interrupted
            self._resume(trial_number, request_id)
            return
        self.trial_number, self.batch_size = trial.trial_number, trial.batch_size
        self.epochs, self.time_s, self.energy_j = trial.epochs, trial.time_s, trial.energy_j
        if trial.status != "running":
            self.verdict = Verdict(True, trial.status == "converged", trial.cost_j,
                                   f"trial {trial_number} already ended ({trial.status})", True)
        logger.info("job %s: continuing trial %d (batch size %d) after epoch %d, %.1f s, %.1f J",
                    self.job_id, trial_number, self.batch_size, self.epochs, self.time_s,
                    self.energy_j)

    def release(self) -> None:
        """After a failed setup, do not leave a trial open that will never run: end one this
        object opened, suspend again one it resumed (the next attempt can resume it). Errors
        are ignored (the setup's error matters more)."""
        if self.opened or self.resumed:
            try:
                _call(self.client, _Calls.end_trial, self.job_id, self.trial_number,
                      interrupted=self.resumed, generation=self.generation)
            except Exception:  # noqa: BLE001 - the original error matters more
                pass

    # ------------------------------------------------------------------ epochs
    def check_epoch_begin(self) -> None:
        """Raise :class:`TrialEndedError` when the trial has a final verdict, RuntimeError
        when an epoch is open."""
        if self.finished:
            raise TrialEndedError(f"trial {self.trial_number} of job {self.job_id!r} already "
                                  f"ended: {self.verdict.message}; check should_stop first")
        if self.in_epoch:
            raise RuntimeError("on_epoch_begin called twice without on_epoch_end")

    def begin_epoch(self) -> None:
        """Start measuring an epoch (the backend's window)."""
        self.backend.begin_window(self.window)
        self.in_epoch = True

    def check_epoch_end(self, metric: float) -> float:
        """``metric`` as a float; RuntimeError when no epoch is open, ValueError when
        ``metric`` is NaN or infinite."""
        if not self.in_epoch:
            raise RuntimeError("on_epoch_end called without on_epoch_begin")
        metric = float(metric)
        if not math.isfinite(metric):
            raise ValueError(f"metric must be a finite number, got {metric}")
        return metric

    def end_epoch(self, metric: float) -> Verdict:
        """End the epoch's window, add its time [s] and energy [J] to the trial's, report the
        cumulative figures with ``metric`` (ReportEpoch) and keep the verdict.

        Raises:
            OffcutError: the daemon refused or is unreachable (the epoch stays counted).
        """
        dt, de = self.backend.end_window(self.window)
        self.in_epoch = False
        self.epochs += 1
        self.time_s += dt
        self.energy_j += de
        self.verdict = _call(self.client, _Calls.report_epoch, self.job_id, self.trial_number,
                             self.epochs, self.time_s, self.energy_j, metric,
                             generation=self.generation)
        logger.info("trial %d epoch %d: %.1f s, %.1f J, metric %g -> %s", self.trial_number,
                    self.epochs, self.time_s, self.energy_j, metric, self.verdict.message)
        return self.verdict

    def cut_epoch(self, count: bool) -> None:
        """Close the open epoch without reporting it: with ``count`` its time [s] and energy
        [J] are added to the trial's (an interrupted run spent them on it), else cancelled.
        Raises the backend's errors."""
        self.in_epoch = False
        if not count:
            self.backend.end_window(self.window, cancel=True)
            return
        time_s, energy_j = self.backend.end_window(self.window)
        self.time_s += max(0.0, time_s)
        self.energy_j += max(0.0, energy_j)

    def end(self, interrupted: bool) -> None:
        """EndTrial: counted as not converged with at least one epoch reported, abandoned
        without; with ``interrupted``, suspended with its cumulative time [s] and energy [J]
        for ``resume_trial`` in the next generation. Keeps the verdict.

        Raises:
            OffcutError: the daemon refused or is unreachable.
        """
        figures = {"time_s": self.time_s, "energy_j": self.energy_j} if interrupted else {}
        self.verdict = _call(self.client, _Calls.end_trial, self.job_id, self.trial_number,
                             interrupted=interrupted, generation=self.generation, **figures)
        if interrupted:
            logger.info("trial %d suspended after epoch %d: %.1f s, %.1f J so far",
                        self.trial_number, self.epochs, self.time_s, self.energy_j)

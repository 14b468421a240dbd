"""Retrying idempotent calls while the daemon restarts (``UNAVAILABLE``).

A :class:`~offcut.client.api.Client` built with ``retry=RetryPolicy()`` repeats a call that
failed with gRPC ``UNAVAILABLE`` (the daemon is down or restarting: connection refused, the
socket missing, the connection dropped while the call was in flight) **only when repeating it
cannot apply it twice**:

* always: node events (``report_nodes``, ``sync_nodes``: the daemon answers a repeated
  ``(source, seq)`` from its journal), reads (``status``, ``get_task``, ``list_tasks``,
  ``get_zeus_job``, ``power_plan``, ``power_profile``), ``register_zeus_job`` (the same spec
  again returns the stored job) and ``end_trial`` (an ended trial returns its stored verdict,
  whose ``message`` says it had already ended);
* with a non-empty ``request_id`` only: ``submit``, ``report_task_run``, ``report_progress``,
  ``predict_batch_size``, ``cancel``, ``delete_zeus_job``, ``report_power_window``,
  ``interrupt_power_window``, ``report_energy`` (the daemon answers a repeated id with the
  stored reply; the last four get a fresh id per call unless given ``request_id=""``);
* ``report_epoch``: repeated; if the repeat is refused because the trial already holds this
  epoch (the first attempt was applied, its answer lost) and the job's stored trial shows
  exactly this report (epoch, cumulative time and energy) still running, the answer is the
  one the daemon gave then, "keep training" (any stopping verdict would have ended the trial,
  and a report on an ended trial is answered with its stored verdict);
* never: the streams ``watch`` / ``export_history`` (resume them with ``after_revision``),
  and every call above without what makes it safe. These raise
  :class:`~offcut.errors.Unavailable` at once, as without a policy.

Backoff and deadline: :class:`offcut.retry.Backoff`, the policy every client shares (the
Slurm hooks and watcher too): waits from ``initial_backoff_s`` (0.05 s) doubling to
``max_backoff_s`` (1 s), jittered, until ``deadline_s`` (60 s) after the first attempt; one
attempt may itself run up to the client's ``timeout_s``, so a call returns or fails within
``deadline_s + timeout_s``. Only ``UNAVAILABLE`` is retried: ``DEADLINE_EXCEEDED`` (a daemon
that is up but slow) and every other error are raised at once.

With a policy the client also shortens gRPC's own reconnect backoff (:meth:`RetryPolicy.
channel_options`), so a restarted daemon is found within about ``max_backoff_s``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import grpc

from offcut.errors import FailedPrecondition, OffcutError
from offcut.retry import Backoff, is_unavailable
from offcut.trial_verdict import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from offcut.client.api import Client

log = logging.getLogger("offcut.client")

__all__ = ["RetryPolicy", "ALWAYS", "WITH_REQUEST_ID", "RECONCILED", "NEVER", "retryable"]

#: ``Client`` methods retried on UNAVAILABLE whatever their arguments
ALWAYS = frozenset({"report_nodes", "sync_nodes", "status", "get_task", "list_tasks",
                    "get_zeus_job", "power_plan", "power_profile", "register_zeus_job",
                    "end_trial"})
#: methods retried only when called with a non-empty ``request_id``
WITH_REQUEST_ID = frozenset({"submit", "report_task_run", "predict_batch_size",
                             "report_progress", "cancel", "delete_zeus_job",
                             "report_power_window", "interrupt_power_window",
                             "report_energy"})
#: methods retried with a check of the daemon's state when the repeat is refused
RECONCILED = frozenset({"report_epoch"})
#: methods never retried (not idempotent): none now (the streams are not retried either)
NEVER: frozenset[str] = frozenset()


def retryable(name: str, arguments: dict[str, Any]) -> bool:
    """Whether the ``Client`` method ``name`` called with ``arguments`` (by parameter name)
    may be repeated after UNAVAILABLE without being applied twice."""
    if name in ALWAYS or name in RECONCILED:
        return True
    if name in WITH_REQUEST_ID:
        return bool(arguments.get("request_id"))
    return False


@dataclass
class RetryPolicy(Backoff):
    """How a :class:`~offcut.client.api.Client` retries idempotent calls on UNAVAILABLE
    (module docstring: which calls, and why each is safe); the backoff parameters and their
    bounds are :class:`offcut.retry.Backoff`'s.

    Attributes:
        retries: retries made so far through this policy (all calls).
        reconciled: repeated calls answered from the daemon's state instead (``report_epoch``
            whose first attempt had been applied).
    """

    reconciled: int = field(default=0, init=False, compare=False)

    def call(self, client: "Client", method: Callable, args: tuple, kwargs: dict) -> Any:
        """Run ``method(client, *args, **kwargs)`` (an undecorated ``Client`` method),
        retrying UNAVAILABLE as this policy and the method allow; gRPC errors are raised as
        :mod:`offcut.errors` exceptions (``client._error``)."""
        name = method.__name__
        bound = _bind(method, client, args, kwargs)
        allowed = retryable(name, bound)
        attempts = 0

        def attempt(_left: float | None) -> Any:
            nonlocal attempts
            attempts += 1
            return method(client, *args, **kwargs)

        try:
            return self.run(attempt, lambda err: allowed and is_unavailable(err), name,
                            logger=log)
        except grpc.RpcError as err:
            exc = client._error(err)
            if attempts > 1 and name in RECONCILED and not is_unavailable(err):
                answer = _RECONCILERS[name](client, bound, exc)
                if answer is not None:
                    self.reconciled += 1
                    return answer
            raise exc from None


_signature = functools.cache(inspect.signature)  # of the few ``Client`` methods, once each


def _bind(method: Callable, client: "Client", args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in (``{"self": client, ...}``);
    just ``kwargs`` when they do not fit the signature."""
    try:
        bound = _signature(method).bind(client, *args, **kwargs)
    except TypeError:
        return dict(kwargs)  # the call itself will raise the TypeError
    bound.apply_defaults()
    return dict(bound.arguments)


def _reconcile_report_epoch(client: "Client", a: dict[str, Any], exc: OffcutError):
    """A repeated ``report_epoch`` refused with FAILED_PRECONDITION on ``epoch``: if the trial
    holds exactly this report and still runs, the lost answer was "keep training"."""
    if not isinstance(exc, FailedPrecondition) or not str(exc).startswith("epoch:"):
        return None  # (the daemon names the offending field first in the details)
    job = client.get_zeus_job(a["job_id"], page_size=1,  # (the page of that trial)
                              before_trial_number=int(a["trial_number"]) + 1)
    trial = next((t for t in job.trials if t.trial_number == a["trial_number"]), None)
    if (trial is None or trial.status != "running" or trial.epochs != a["epoch"]
            or trial.time_s != a["time_s"] or trial.energy_j != a["energy_j"]):
        return None
    try:  # the metric is only in the optimizer's state dump; compare it when present
        state = job.state()
        stored = next(t for t in state.get("trials", [])
                      if t.get("trial_number") == a["trial_number"])
        if "metric" in stored and stored["metric"] != a["metric"]:
            return None
    except (ValueError, StopIteration, AttributeError, TypeError):
        pass
    log.info("report_epoch: epoch %d of trial %d was applied before the daemon restarted",
             a["epoch"], a["trial_number"])
    return Verdict(stop=False, converged=False, cost_j=trial.cost_j, message="keep training",
                   finished=False)


_RECONCILERS: dict[str, Callable[["Client", dict[str, Any], OffcutError], Any]] = {
    "report_epoch": _reconcile_report_epoch,
}

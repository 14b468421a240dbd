"""The batch-size optimizer's answer to a training report (Zeus, NSDI '23, Section 4: the
trial stops at convergence or at its cost bound): one form for the daemon, which decides it
(:mod:`offcut.daemon.zeus.bso`), and the training side, which reads it
(:mod:`offcut.client.training.trial`); on the wire it is ``offcut.v1.TrialVerdict``
(docs/zeus.md, "The batch-size optimizer")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """The answer to a report: ``stop`` training; ``converged`` (meaningful once ``finished``:
    the trial reached the target metric within the cost bound); the trial's zeus_cost
    ``cost_j`` [J] so far; a readable ``message``; ``finished`` (the trial is closed);
    ``suspended`` (the run was interrupted and the trial stays open for the next generation:
    :meth:`offcut.daemon.zeus.bso.BatchSizeJob.resume`)."""

    stop: bool
    converged: bool
    cost_j: float
    message: str
    finished: bool
    suspended: bool = False

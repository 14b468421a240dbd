"""Training side of progress reporting (``Tasks.ReportProgress``): an elastic task tells the
daemon how many samples it has processed, on how many nodes, and optionally the energy its
nodes drew, so that the daemon can learn its scalability, power and rescale costs online
(issue "Learn scalability online"; Pollux OSDI '21 and MalleTrain ICPE '24 learn throughput
from the job's own measurements the same way).

Minimal loop (one reporter per task, on rank 0; under ``offcut-slurm launch`` the
``OFFCUT_*`` variables are set by the launcher)::

    from offcut.client.progress import ProgressReporter

    with ProgressReporter.from_env() as progress:
        for x, y in loader:
            train_step(x, y)
            progress.add(len(x) * world_size)     # samples processed by all nodes

The reporter sends a report at most every ``every_s`` seconds (and on :meth:`close`); the
counters are cumulative since the task began and continue across restarts (a new process
starts from the daemon's last accepted report). Submit the task with ``reports_progress`` (or
without a curve): only reports complete it, when ``samples_done`` reaches its total work.

A script that restarts from checkpoints (docs/execution.md) reports the figure *as of its
latest checkpoint* instead of counting: pass ``samples_done=`` (the checkpoint's) to the
constructor and call :meth:`ProgressReporter.set_samples_done` then
:meth:`ProgressReporter.report` at every checkpoint (:mod:`offcut.client.elastic` does this).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Callable, Mapping

from offcut.client.api import Client
from offcut.errors import OffcutError

log = logging.getLogger("offcut.client.progress")


def _check_samples(samples_done: float) -> float:
    """``samples_done`` as a float; ValueError unless finite and >= 0."""
    v = float(samples_done)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"samples_done must be finite and >= 0, got {samples_done!r}")
    return v


class ProgressReporter:
    """Cumulative progress (and energy) of one task, reported to the daemon.

    Args:
        client: a :class:`Client` or an address (None: ``$OFFCUT_ADDRESS`` / the default).
        task_id: the task's id.
        nodes: the node count the task runs on now (``OFFCUT_NUM_NODES`` under the launcher);
            call :meth:`set_nodes` when it changes in-process.
        every_s: shortest time between reports [s] (default 30).
        energy_j: optional callable returning the energy [J] the task's nodes have drawn
            since this process started (e.g. from NVML counters); added to the energy already
            reported by earlier processes.
        clock: wall clock [s since epoch] (injected in tests).
        samples_done: the cumulative samples to start from [samples], e.g. those of the
            checkpoint the process resumed from; None (default): the daemon's last accepted
            report (0 before the first).

    Raises :class:`offcut.errors.NotFound` when the task does not exist, ``ValueError`` for a
    negative ``nodes`` or a negative or non-finite ``samples_done``. Report failures while
    training are logged and retried at the next report, never raised from :meth:`add`.
    """

    def __init__(self, client: Client | str | None, task_id: str, nodes: int, *,
                 every_s: float = 30.0, energy_j: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.time, samples_done: float | None = None):
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        if samples_done is not None:
            samples_done = _check_samples(samples_done)
        self._own_client = not isinstance(client, Client)
        self.client = client if isinstance(client, Client) else Client(client)
        self.task_id, self.nodes, self.every_s = task_id, int(nodes), float(every_s)
        self._energy_fn, self._clock = energy_j, clock
        model = self.client.get_task(task_id).model
        reported = model is not None and model.has_report
        if samples_done is None:
            samples_done = model.last_samples_done if reported else 0.0
        self._base_samples = samples_done
        self._base_energy = (model.last_energy_j
                             if reported and model.last_energy_j is not None else 0.0)
        self.samples = 0.0  # processed by this process since the base (set_samples_done)
        self._last_sent = self._clock()
        self.reports = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs) -> "ProgressReporter":
        """A reporter for the task the Slurm launcher started (``OFFCUT_TASK_ID``,
        ``OFFCUT_NUM_NODES``, ``OFFCUT_ADDRESS``); raises ``ValueError`` naming a missing or
        malformed variable."""
        env = os.environ if environ is None else environ
        task_id = env.get("OFFCUT_TASK_ID", "")
        if not task_id:
            raise ValueError("OFFCUT_TASK_ID is not set (run under offcut-slurm launch, or "
                             "construct ProgressReporter(address, task_id, nodes))")
        try:
            nodes = int(env.get("OFFCUT_NUM_NODES", ""))
        except ValueError:
            raise ValueError("OFFCUT_NUM_NODES must be an integer node count") from None
        return cls(env.get("OFFCUT_ADDRESS") or None, task_id, nodes, **kwargs)

    @property
    def samples_done(self) -> float:
        """Cumulative samples since the task began [samples]."""
        return self._base_samples + self.samples

    def set_samples_done(self, samples_done: float) -> None:
        """Set the cumulative figure [samples] the next report sends, e.g. that of the
        checkpoint just written; later :meth:`add` calls count on from it. Sends nothing (call
        :meth:`report`). Raises ``ValueError`` for a negative or non-finite figure; a figure
        below the daemon's last accepted one is refused by the daemon at the next report."""
        self._base_samples = _check_samples(samples_done)
        self.samples = 0.0

    def set_nodes(self, nodes: int) -> None:
        """The task now runs on ``nodes`` nodes (reports what it ran on so far first)."""
        if nodes != self.nodes:
            self.report()
            self.nodes = int(nodes)

    def add(self, samples: float) -> None:
        """Count ``samples`` more processed samples; reports when ``every_s`` has passed."""
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        self.samples += samples
        if self._clock() - self._last_sent >= self.every_s:
            try:
                self.report()
            except OffcutError as exc:  # keep training; the next report carries the total
                log.warning("progress report for %s failed: %s", self.task_id, exc)

    def report(self):
        """Send a report now; returns the daemon's answer (:class:`~offcut.views.ProgressReply`). Raises
        :class:`OffcutError` (e.g. FailedPrecondition once the task is finished)."""
        now = self._clock()
        r = {"task_id": self.task_id, "time": now, "samples_done": self.samples_done,
             "nodes": self.nodes}
        if self._energy_fn is not None:
            r["energy_j"] = self._base_energy + float(self._energy_fn())
        reply = self.client.report_progress([r])
        self._last_sent = now
        self.reports += 1
        return reply

    def close(self) -> None:
        """Send a last report (errors logged) and close a client this object opened."""
        try:
            self.report()
        except OffcutError as exc:
            log.warning("last progress report for %s failed: %s", self.task_id, exc)
        finally:
            if self._own_client:
                self.client.close()

    def __enter__(self) -> "ProgressReporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

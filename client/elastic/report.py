"""Rank 0's progress reports of an elastic task (docs/execution.md): ``samples_done`` as of
each checkpoint, sent to the daemon with the generation's node count. Part of
:mod:`offcut.client.elastic`; the daemon client is created at the first report.
"""

from __future__ import annotations

import logging
import math

from offcut.client.elastic.env import ElasticEnv

log = logging.getLogger("offcut.client.elastic")


class DaemonProgress:
    """Rank 0's reports of its task's ``samples_done`` to the daemon (``OFFCUT_ADDRESS``,
    ``OFFCUT_TASK_ID``, ``nodes = OFFCUT_NUM_NODES``) through a
    :class:`~offcut.client.progress.ProgressReporter` that reports only when asked; the
    connection opens at the first report.

    Args:
        env: the process's environment (its rank, the task, the daemon, the node count).
    """

    def __init__(self, env: ElasticEnv):
        self.env = env
        self._client = None
        self._reporter = None

    def report(self, figure: int | float, timeout_s: float) -> bool:
        """Report ``figure`` cumulative samples [samples] (``timeout_s`` [s]: the deadline of
        a report, set when the connection opens). Returns True when the daemon accepted it;
        False on ranks other than 0, for a local run (no ``OFFCUT_TASK_ID`` /
        ``OFFCUT_ADDRESS``) and when the report failed (logged, never raised: training goes
        on and the next checkpoint's report carries the total)."""
        env = self.env
        if not (env.rank == 0 and env.reports_progress):
            return False
        try:
            if self._reporter is None:
                from offcut.client.api import Client
                from offcut.client.progress import ProgressReporter
                self._client = Client(env.address, timeout_s=timeout_s)
                self._reporter = ProgressReporter(self._client, env.task_id, env.num_nodes,
                                                  every_s=math.inf, samples_done=figure)
            self._reporter.set_samples_done(figure)
            self._reporter.report()
            log.info("reported %s samples on %d nodes for %s", figure, env.num_nodes,
                     env.task_id)
            return True
        except Exception as exc:  # OffcutError mostly; a report never stops training
            log.warning("progress report of %s samples for %s failed: %s", figure,
                        env.task_id, exc)
            return False

    def close(self) -> None:
        """Close the daemon connection, if one was opened (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = self._reporter = None

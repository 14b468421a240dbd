"""The watcher (``offcut-slurm watch``): polls Slurm and sends the daemon full idle-set
snapshots (``SyncNodes``), so drift (a lost hook event, a node drained or back from down) and
daemon downtime repair themselves (docs/architecture.md, "Slurm integration").

Each snapshot carries the time at which Slurm was asked (before the first query) and
``seq = max(time_ns, previous seq + 1)`` under one source (default ``slurm-watch``): monotone
per process and across restarts while the wall clock is. A snapshot older than an event the
daemon has already applied (a hook that ran while Slurm was being asked) is refused with
FAILED_PRECONDITION; the watcher then asks Slurm again and sends the new observation (never
the old one with a new time). Bad Slurm output or a failing command sends nothing: one clear
error is logged (repeats of the same error are not), and the loop goes on.

Only changes are sent (the daemon journals every snapshot; docs/operations.md, "Retention: what
is kept, and for how long"): an observation equal to the last accepted one is sent again only
``resync_s`` (600 s) after that one, as the periodic repair of what the hooks may have missed,
and at once after a snapshot could not be delivered (the daemon was down and may have missed
hook events); ``resync_s = 0`` sends every observation.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from offcut.slurm_plugin.nodelist import compress, drop_invalid
from offcut.slurm_plugin.rpc import DaemonError, NodeEventSender
from offcut.slurm_plugin.slurm_json import OwnJobRule, SlurmError
from offcut.slurm_plugin.sources import Observation, Source, observe

log = logging.getLogger("offcut.slurm.watch")


@dataclass
class Watcher:
    """One watcher. ``step()`` makes one observation and sends it; ``run()`` loops.

    Args:
        source: where Slurm is read from (:func:`~offcut.slurm_plugin.sources.choose_source`).
        sender: the daemon (None: dry run, observe and log only).
        rule: which jobs are Offcut's own (their nodes still count as idle).
        node_partitions: a node must be in one of these to count as idle.
        source_name: the event source of the snapshots (one per watcher).
        last_seq: seq of the last snapshot sent (time-based, ns since the epoch; module
            docstring).
        last_idle: the idle set of the last accepted (or dry-run) snapshot, sorted names.
        resync_s: an observation equal to ``last_idle`` is sent only when the last accepted
            snapshot is this old [s] (0: always sent).
        monotonic: the clock [s] of ``resync_s`` (injectable for tests).
    """

    source: Source
    sender: NodeEventSender | None  # None: dry run (observe and log only)
    rule: OwnJobRule = field(default_factory=OwnJobRule)
    node_partitions: frozenset[str] = frozenset({"scavenger"})
    source_name: str = "slurm-watch"
    last_seq: int = 0
    last_idle: list[str] | None = None
    last_kinds: dict | None = None  # the node kinds of the last accepted snapshot
    resync_s: float = 600.0
    monotonic: Callable[[], float] = time.monotonic
    _sent_at: float | None = None  # monotonic time of the last accepted snapshot
    _last_error: str | None = None
    _unknown_seen: set = field(default_factory=set)

    def _error(self, message: str) -> None:
        if message != self._last_error:
            log.error("%s (nothing sent; will retry)", message)
        else:
            log.debug("still failing: %s", message)
        self._last_error = message

    def _ok(self) -> None:
        if self._last_error is not None:
            log.info("recovered after: %s", self._last_error)
        self._last_error = None

    def observe(self) -> Observation:
        """One observation; raises SlurmError."""
        obs = observe(self.source, self.rule, node_partitions=self.node_partitions)
        new = obs.view.unknown_tokens - self._unknown_seen
        if new:
            self._unknown_seen |= new
            log.warning("unknown Slurm node state(s) %s: such nodes are treated as not idle",
                        ", ".join(sorted(new)))
        return obs

    def _seq(self, time_ns: int) -> int:
        self.last_seq = max(time_ns, self.last_seq + 1)
        return self.last_seq

    def step(self) -> bool:
        """Observe Slurm and send the snapshot when it changed or ``resync_s`` passed; True
        when the daemon accepted it or nothing needed sending. Never raises for Slurm or
        daemon failures (they are logged)."""
        for attempt in (1, 2):
            try:
                obs = self.observe()
            except SlurmError as exc:
                self._error(f"cannot read Slurm: {exc}")
                return False
            idle = drop_invalid(obs.view.idle, log)
            if self.sender is None:
                log.info("dry run: %d of %d nodes idle: %s", len(idle), obs.view.total,
                         compress(idle) or "-")
                self.last_idle = idle
                self._ok()
                return True
            if (idle == self.last_idle and obs.kinds == self.last_kinds
                    and self._sent_at is not None
                    and self.monotonic() - self._sent_at < self.resync_s):
                log.debug("no change: %d of %d nodes idle (not sent)", len(idle), obs.view.total)
                self._ok()
                return True
            seq = self._seq(obs.time_ns)
            try:
                sent = self.sender.sync(time_ns=obs.time_ns, source=self.source_name, seq=seq,
                                        idle=idle, kinds=obs.kinds)
            except DaemonError as exc:
                if exc.code == "FAILED_PRECONDITION" and attempt == 1:
                    log.info("snapshot refused (%s); asking Slurm again", exc.details)
                    continue
                self._error(f"snapshot not delivered: {exc}")
                self._sent_at = None  # the daemon may have missed events: send the next one
                return False
            changed = idle != self.last_idle
            (log.info if changed or sent.nodes_left or sent.nodes_joined else log.debug)(
                "snapshot seq %d: %d of %d nodes idle (%s): %s", seq, len(idle), obs.view.total,
                compress(idle) or "-", sent)
            self.last_idle = idle
            self.last_kinds = obs.kinds
            self._sent_at = self.monotonic()
            self._ok()
            return True
        return False

    def run(self, interval_s: float, once: bool = False,
            stop: threading.Event | None = None) -> bool:
        """Step every ``interval_s`` seconds until ``stop`` is set (or once). Returns the last
        step's result."""
        stop = stop or threading.Event()
        while True:
            t0 = time.monotonic()
            ok = self.step()
            if once:
                return ok
            if stop.wait(max(interval_s - (time.monotonic() - t0), 0.0)):
                return ok

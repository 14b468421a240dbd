"""Which time the daemon applies an event at (docs/security.md, "Time"; docs/architecture.md,
"Time and events"): the gRPC edge's rule, between the request's conversion and :meth:`Engine.apply`.

* ``live`` (the default, a daemon beside Slurm): every event is applied at the daemon's own
  receive time, made monotonic under the engine's lock (the later of the wall clock when the
  request arrived and the event clock) and journaled with the event. A time the sender put
  in the request (a node event's ``time``, ``submit_time``, a cancellation's or run report's
  ``time``) is data: bounded by the protocol, kept as the event's ``sent_time``, shown in the
  reply's ``Decision.sent_time``; it never moves the clock, so no user can freeze or advance
  it for others, and node events are never refused as "older" than someone's submission.
  Node events (which only Slurm's side, the ``slurm`` and ``admin`` roles, may send) are
  still ordered among themselves by their observation times (``Scheduler.node_clock``): one
  observed before the newest applied observation is stale (FAILED_PRECONDITION; the hooks
  and the watcher observe again), so a late snapshot cannot undo a newer preemption; a node
  event stamped more than :data:`MAX_SKEW_S` after the daemon's wall clock is
  INVALID_ARGUMENT.
* ``replay`` (``offcutd --clock replay``, for ``offcut replay`` and evaluations of recorded
  logs): the sender's times are the event clock, as the log recorded them; an event older
  than the clock is FAILED_PRECONDITION. With tokens, only admins may send events to such a
  daemon (anyone else's is PERMISSION_DENIED): its clock is the admin's.
"""

from __future__ import annotations

import dataclasses

from offcut.errors import InvalidArgument, PermissionDenied
from offcut.daemon.edge.auth import Principal
from offcut.daemon.app.model import Event, NodeEvent, ProgressEvent, SubmitEvent

#: the daemon's clock modes (``DaemonConfig.clock``)
CLOCK_MODES = ("live", "replay")

#: how far [s] a live daemon's node event may be stamped after its wall clock: observation
#: times order node events among themselves (``Scheduler.node_clock``), so one from the
#: future would make every later one stale; Slurm's own limit on clock skew (MUNGE's TTL) is 5 min
MAX_SKEW_S = 300.0


class EventTimes:
    """Sets the time an event is applied at, by ``mode`` (one of :data:`CLOCK_MODES`).

    Raises:
        ValueError: an unknown mode.
    """

    def __init__(self, mode: str = "live", *, auth_enabled: bool = False):
        if mode not in CLOCK_MODES:
            raise ValueError(f"clock must be one of {', '.join(CLOCK_MODES)}, got {mode!r}")
        self.mode = mode
        self.auth_enabled = auth_enabled

    def place(self, event: Event, now: float, who: Principal) -> tuple[Event, bool]:
        """``(event to apply, stamp)`` for :meth:`Engine.apply` from a converted request
        (whose ``time`` is the sender's time, or ``now`` when it gave none) received at
        ``now`` [s since epoch, the daemon's wall clock]. ``stamp`` tells the engine to apply
        it no earlier than its event clock.

        Raises:
            InvalidArgument: a replay daemon's node event without ``time``.
            PermissionDenied: an event from a caller other than an admin on a replay daemon
                with tokens.
        """
        if self.mode == "live":
            if isinstance(event, NodeEvent) and event.sent_time is not None and \
                    event.sent_time > now + MAX_SKEW_S:
                raise InvalidArgument(
                    f"{event.sent_time:.3f} is {event.sent_time - now:.0f} s after the daemon's "
                    f"clock ({now:.3f}); Slurm's hosts and the daemon's need synchronised "
                    "clocks, as MUNGE does", "time")
            return dataclasses.replace(event, time=now), True
        if self.auth_enabled and not who.is_admin:
            raise PermissionDenied(
                "this daemon replays a log (clock = replay): only admins send events to it",
                _time_field(event))
        if isinstance(event, ProgressEvent):
            return event, False  # at its latest report's time (the replay's progress model)
        if event.sent_time is None:
            if isinstance(event, NodeEvent):
                raise InvalidArgument("is required on a replay daemon (clock = replay)", "time")
            return event, True  # at the event clock
        # the sender's time is the event's time here, not data beside it
        return dataclasses.replace(event, sent_time=None), False


def _time_field(event: Event) -> str:
    """The request field that carries ``event``'s time."""
    if isinstance(event, SubmitEvent):
        return "submit_time"
    if isinstance(event, ProgressEvent):
        return "reports"
    return "time"

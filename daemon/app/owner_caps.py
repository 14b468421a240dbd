"""The per-owner caps on submissions (docs/configuration.md: ``max_active_tasks_per_owner``,
``max_retained_tasks_per_owner``, ``max_retained_task_bytes_per_owner``).

A ``capped`` caller's submission (a user, not an admin: daemon/edge/service.py) is refused with
RESOURCE_EXHAUSTED naming the setting when its owner already holds as much as the daemon
allows. The engine checks them under its lock, after a repeated request id was answered and
before anything changes; never when the journal is re-applied (rows met the caps of their time).
"""

from __future__ import annotations

import dataclasses
import math

from offcut.daemon.app.model import SubmitEvent, Task
from offcut.daemon.app.scheduler import Scheduler
from offcut.daemon.app.scheduler.state import retained_bytes
from offcut.errors import ResourceExhausted


@dataclasses.dataclass(frozen=True)
class OwnerCaps:
    """What one owner may hold when a capped caller submits (None: no cap).

    Attributes:
        max_active_tasks: unfinished (queued, admitted, running) tasks of one owner.
        max_retained_tasks: tasks of one owner in the scheduler's state (unfinished, and
            finished ones not yet retired).
        max_retained_task_bytes: the bytes those tasks may count together
            (:func:`offcut.daemon.app.scheduler.state.retained_bytes`, the new task's included)
            [bytes].
    """

    max_active_tasks: int | None = None
    max_retained_tasks: int | None = None
    max_retained_task_bytes: int | None = None

    def check(self, scheduler: Scheduler, event: SubmitEvent) -> None:
        """Refuse ``event`` when its owner is at a cap in ``scheduler``'s state (read only;
        call under the engine's lock, before anything changes).

        Raises:
            ResourceExhausted: the owner has ``max_active_tasks`` unfinished tasks,
                ``max_retained_tasks`` tasks in the state, or the new task would bring the
                bytes of its tasks in the state past ``max_retained_task_bytes``; the field
                names the setting (``max_active_tasks_per_owner`` ...).
        """
        owner = event.owner
        cap = self.max_active_tasks
        held = scheduler.active_owners.get(owner, 0)
        if cap is not None and held >= cap:
            raise ResourceExhausted(
                f"owner {owner!r} has {held} queued or running tasks, the most this daemon "
                f"allows ({cap}); cancel some or wait until they finish",
                "max_active_tasks_per_owner")
        kept, size = scheduler.retained_owners.get(owner, (0, 0))
        finished = _finished_text(scheduler.finished_task_retention_s)
        cap = self.max_retained_tasks
        if cap is not None and kept >= cap:
            raise ResourceExhausted(
                f"owner {owner!r} has {kept} tasks in the daemon's memory (queued, running, "
                f"and {finished}), the most this daemon allows ({cap}); "
                "finished tasks leave memory that long after they finished",
                "max_retained_tasks_per_owner")
        cap = self.max_retained_task_bytes
        if cap is not None:
            new = retained_bytes(Task(task_id="", spec=event.spec, owner=owner,
                                      submit_time=event.time, request_id=event.request_id))
            if size + new > cap:
                raise ResourceExhausted(
                    f"owner {owner!r} has tasks of {size:,} bytes in the daemon's memory "
                    f"(queued, running, and {finished}); this one's "
                    f"{new:,} bytes would pass the {cap:,} this daemon allows; finished tasks "
                    "leave memory that long after they finished",
                    "max_retained_task_bytes_per_owner")


def _finished_text(seconds: float) -> str:
    """Which finished tasks stay in memory, for a message: ``"finished in the last 1 day"``
    (``seconds``: finished_task_retention_s [s])."""
    if not math.isfinite(seconds):
        return "finished at any time (finished_task_retention_s is unlimited)"
    return f"finished in the last {_duration_text(seconds)}"


def _duration_text(seconds: float) -> str:
    """``seconds`` in words for a message: ``"1 day"``, ``"3 h"``, ``"90 s"``."""
    if seconds >= 86400 and seconds % 86400 == 0:
        days = int(seconds // 86400)
        return f"{days} day" + ("s" if days != 1 else "")
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return f"{seconds:g} s"

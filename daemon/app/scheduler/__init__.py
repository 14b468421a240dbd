"""The application core: the deterministic scheduler and what applying an event yields
(docs/architecture.md, "Time and events", "Tasks and the progress model" and "Allocation"). No I/O,
no wall clock, no wire types."""

from offcut.daemon.app.scheduler.outcome import Allocate, Outcome, SolveRecord
from offcut.daemon.app.scheduler.scheduler import Scheduler

__all__ = ["Allocate", "Outcome", "Scheduler", "SolveRecord"]

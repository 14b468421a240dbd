"""Recovery: the scheduler rebuilt from the state file (docs/architecture.md, "Recovery").

The newest good snapshot is loaded (or an empty scheduler made) and every later journal row is
re-applied in order with the allocation answers it recorded (:func:`journal_solves` writes
them, :class:`Replayed` hands them back), so no solver runs and the recovered state equals the
state before a crash whatever the solver or its time limit.
"""

from __future__ import annotations

import logging

from offcut.daemon.app.model import event_from_dict
from offcut.taskspec import Limits
from offcut.daemon.app.policies.guard import PolicyGuard
from offcut.daemon.app.scheduler import Outcome, Scheduler, SolveRecord
from offcut.daemon.app.solvers.problem import AllocationProblem
from offcut.daemon.app.store import Store

log = logging.getLogger("offcut.daemon")


class Replayed:
    """Allocation answers recorded in the journal, handed back in order on recovery.

    A row may also carry a third-party policy's answers (entries with a ``"policy"`` key,
    after the solves of their decision; :meth:`PolicyRunner.counts`): a solve is
    never handed out past one, and :meth:`policy_answer` skips to the next.

    Args:
        solves: the row's ``solves`` as :func:`journal_solves` wrote them.
    """

    def __init__(self, solves: list[dict]):
        self._entries = solves
        self._i = 0
        #: the row carries policy answers (written since they are journaled)
        self.replaying_answers = any("policy" in e for e in solves)

    def __call__(self, problem: AllocationProblem) -> SolveRecord:
        """The next recorded solve (``problem`` is not solved again).

        Raises:
            RuntimeError: the row has no solve left before its next policy answer.
        """
        entries, i = self._entries, self._i
        if i >= len(entries) or "policy" in entries[i]:
            raise RuntimeError("journal has fewer allocation answers than the event needs")
        self._i = i + 1
        return SolveRecord(**entries[i])

    def policy_answer(self) -> dict | None:
        """The next policy answer of the row (the solves before it skipped), else None."""
        entries = self._entries
        while self._i < len(entries) and "policy" not in entries[self._i]:
            self._i += 1
        if self._i >= len(entries):
            return None
        self._i += 1
        return entries[self._i - 1]


def journal_solves(out: Outcome) -> list[dict]:
    """The journal's ``solves`` of an event: its solves in order, each policy answer at its
    place among them (read back by :class:`Replayed`)."""
    entries = [s.to_dict() for s in out.solves]
    for at, answer in reversed(out.policy_answers):
        entries.insert(at, answer)
    return entries


def recover(store: Store, *, policy_guard: PolicyGuard, limits: Limits,
            fresh_retention_s: float | None) -> Scheduler:
    """The scheduler of ``store``'s state: its newest good snapshot with the later journal
    rows re-applied (their retired tasks archived again, in case the retention changed).

    Args:
        store: the open state file.
        policy_guard: the guard of allocation policies the scheduler uses (kept across
            reloads by the engine).
        limits: the request size limits put on the recovered scheduler for new events (the
            journal is re-applied without them: rows met the limits of their time).
        fresh_retention_s: ``finished_task_retention_s`` [s] of a new state (None: the
            scheduler's default); a stored state keeps its own.

    Raises:
        RuntimeError: a row has fewer recorded allocation answers than it needs; whatever
            :meth:`Store.load` or :meth:`Scheduler.apply` raise for a damaged state.
    """
    state, rows = store.load()
    if state:
        scheduler = Scheduler.from_dict(state)
    elif fresh_retention_s is not None:  # a new state: the configured retention
        scheduler = Scheduler(finished_task_retention_s=fresh_retention_s)
    else:
        scheduler = Scheduler()
    scheduler.policy_guard = policy_guard
    n, retired = 0, []
    for event, solves in rows:
        retired += scheduler.apply(event_from_dict(event), Replayed(solves)).retired
        n += 1
    if retired:  # archived when first applied; again in case the retention changed since
        store.archive_tasks(t.to_dict() for t in retired)
    if state and (not store.loaded_incremental or store.bad_snapshots):
        scheduler.mark_all_changed()  # the next snapshot writes every task
    if state or n:
        log.info("state %s: revision %d (%d journal rows re-applied after the snapshot)",
                 store.path, scheduler.revision, n)
    scheduler.limits = limits  # new events only: the journal was checked when it was written
    return scheduler

"""The launcher's desired state (every running task's current generation and nodes), kept
from one long-lived ``WatchPlacements`` stream (:class:`PlacementWatch`) instead of a
``ListTasks`` per pass.

What the stream carries (protos/offcut/v1/tasks.proto ``PlacementUpdate``, decision.proto
``Placement``): per revision, each changed task's node set *after* the change, its generation
after it and the kind of change. That is enough to follow a task once its static parts (its
spec, owner, submit time: what a job's script needs) are known, because a placement is
absolute (the node set and generation, not a difference) and generations are monotone:
every change but a finish starts the next one (daemon/app/scheduler/lifecycle.py,
``TaskLifecycle.change``), and a finish (``completed``, ``cancelled``, ``failed``) keeps the
generation and leaves no nodes. So:

* at start and after each reconnect the launcher reads the daemon's revision
  (``GetStatus``), opens the stream from it (``after_revision``: the daemon replays the
  updates it retains after it, then streams new ones; daemon/app/engine.py ``updates_after``),
  and only then lists the running tasks (``ListTasks``): the list is at least as new as the
  revision, and every update after the revision arrives after it;
* a placement whose generation is not above the one known is stale (its change is already
  in what was read) and skipped; a higher one replaces the task's generation and nodes;
  a finish removes the task (the launcher's view of finished tasks: absent = not running,
  its jobs are stopped);
* a task the launcher has not read yet (placed after the list) is read once
  (``GetTask``) before its jobs are submitted; that read is at least as new as the
  placement that named it. A task read as finished is kept as finished until the stream
  brings its finish (an older placement of it may still be on the way), then forgotten;
* the stream has no gap marker, but one shows: on the ordered stream each placement of a
  task but its finish is exactly one generation above the previous one, so a task that
  skips a generation means updates were lost (the daemon keeps the last
  ``RETAINED_UPDATES``), and the stream is re-opened and the tasks listed again. Placements
  learnt from the launcher's own calls' replies (``ReportTaskRun``, ``ReportNodes``) are
  applied at once, without that check, when they are newer than what the stream has
  delivered so far; a reply no newer than that (the stream was quicker) never brings back a
  task the state does not hold (its finish may already have been applied). A
  ``ReportTaskRun`` reply's task is merged like a read (:meth:`DesiredState.fill`);
* what shows no gap is repaired thus: a lost finish, by a report the daemon refuses about
  the task (it is finished: the task is read again before it counts as running), and
  otherwise, like a lost first placement (a task never seen), by the periodic re-list: every
  ``resync_s`` (:data:`RESYNC_S`, 300 s) while synced the stream is opened afresh at the
  daemon's revision and the tasks listed again (the state stays synced meanwhile), so
  nothing lost stays wrong longer than that;
* when the stream breaks (the daemon restarts, the connection drops, the daemon ends it on
  shutdown) the state is marked not synced and the watch reconnects with the clients'
  backoff (:class:`offcut.retry.Backoff`; reset at each new outage). A pass then fails as
  with the daemon down (Slurm is not touched), unless the stream cannot be followed
  (:meth:`PlacementWatch.must_list`): the daemon refuses it (``RESOURCE_EXHAUSTED``: its
  stream slots, ``max_streams`` / ``max_streams_per_caller``, are taken, perhaps by a
  hostile user), or it has been down for :data:`FALLBACK_AFTER_S`; then each pass lists the
  running tasks itself, as a pass alone does (the level-triggered fallback). The reason is
  logged once per outage.

Retention: an entry lives until its task's finish arrives or the next re-list (at most the
daemon's unfinished tasks, plus the finished ones awaiting their finish on the stream).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple

from offcut.errors import NotFound, OffcutError, ResourceExhausted, Unavailable
from offcut.retry import Backoff

if TYPE_CHECKING:  # pragma: no cover
    from offcut.views import PlacementChange, TaskView

log = logging.getLogger("offcut.slurm.launcher")

#: how the watch reconnects after its stream broke: waits from 0.1 s doubling to 5 s
#: (jittered), reset at each new outage (not by a refusal's list); the deadline is not used
#: (it never gives up)
RECONNECT_BACKOFF = Backoff(initial_backoff_s=0.1, max_backoff_s=5.0)
#: seconds between two full re-lists while synced (the stream is opened afresh): the longest
#: a lost update that shows no gap (a first placement, a finish) stays wrong
RESYNC_S = 300.0
#: seconds the stream may be down (reconnecting) before passes list for themselves (a daemon
#: restart takes a few: meanwhile passes fail, nothing is done in Slurm)
FALLBACK_AFTER_S = 30.0

#: ``PlacementChange.change`` names of a finish (the task's nodes are released for good)
_FINISHES = frozenset({"completed", "cancelled", "failed"})


def _is_finish(placement: "PlacementChange") -> bool:
    return placement.change in _FINISHES


def _is_finished(task: "TaskView") -> bool:
    return task.state.finished


#: one running task: its last read (a :class:`~offcut.views.TaskView`: spec, owner, submit
#: time), its current generation and its nodes (sorted)
Running = tuple["TaskView", int, tuple[str, ...]]


class Snapshot(NamedTuple):
    """What :meth:`DesiredState.running` saw at one instant."""

    ready: dict[str, Running]   # task id -> the running task
    unread: list[str]           # tasks that hold nodes but were not read yet
    version: int                # :attr:`DesiredState.version` then


@dataclass
class _Entry:
    """What the launcher knows of one task: its generation and nodes (sorted; empty: it holds
    none now), its last full read (None: to be read), and whether it was read finished."""

    generation: int
    nodes: tuple[str, ...]
    task: "TaskView | None" = None
    finished: bool = False


class DesiredState:
    """Every task's current generation and nodes, as placements and reads tell them
    (thread-safe: the watch's thread applies the stream, the launcher's passes read it).

    Attributes:
        synced: whether the state was read (listed) and followed since: False before the
            first list and while the stream is broken.
        revision: the daemon revision up to which every update is applied: the newest of
            the stream (or the last list's); replies do not move it.
        version: bumped on every change of what :meth:`running` returns, and of ``synced``
            (what :meth:`wait` waits for).
        resets: how many times the state was listed afresh (:meth:`reset`).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self.synced = False
        self.revision = 0
        self.version = 0
        self.resets = 0

    def _changed(self) -> None:
        """(lock held) A change: wake :meth:`wait`."""
        self.version += 1
        self._cond.notify_all()

    def reset(self, tasks: Iterable["TaskView"], revision: int = 0) -> None:
        """Replace everything by ``tasks`` (``ListTasks`` of the running tasks, read at or
        after ``revision``); the state is synced from now on."""
        entries = {t.task_id: _Entry(int(t.generation), tuple(sorted(t.nodes)), t)
                   for t in tasks if not _is_finished(t)}
        with self._cond:
            self._entries = entries
            self.synced = True
            self.revision = revision
            self.resets += 1
            self._changed()

    def lose(self) -> None:
        """The stream broke: not synced until the next :meth:`reset` (what is known is
        dropped: it will be listed again)."""
        with self._cond:
            if self.synced or self._entries:
                self._entries = {}
                self.synced = False
                self._changed()

    def apply(self, placements: Iterable["PlacementChange"], revision: int = 0,
              ordered: bool = True) -> str:
        """Apply the placements of one update (or one reply's decision) of ``revision``
        (0: none to note); ``ordered``: they come from the stream in revision order, so a
        task that skips a generation is a gap, and :attr:`revision` moves on. Else (a reply)
        a placement of a task the state does not hold is taken only from a reply newer than
        :attr:`revision` (an older one may be of a task whose finish was applied). Returns ""
        or, on a gap, which task skipped what (the state is then to be listed again)."""
        gap = ""
        with self._cond:
            changed = False
            for p in placements:
                e = self._entries.get(p.task_id)
                if _is_finish(p):
                    if e is not None:
                        del self._entries[p.task_id]
                        changed = changed or (bool(e.nodes) and not e.finished)
                    continue
                generation, nodes = int(p.generation), tuple(sorted(p.nodes))
                if e is None:
                    if not ordered and revision <= self.revision:
                        continue  # stale news of a task the stream has finished (or never had)
                    self._entries[p.task_id] = _Entry(generation, nodes)
                    changed = changed or bool(nodes)
                elif not e.finished and generation > e.generation:
                    if ordered and generation > e.generation + 1 and not gap:
                        gap = (f"task {p.task_id} went from generation {e.generation} to "
                               f"{generation} at revision {revision}")
                    e.generation, e.nodes = generation, nodes
                    changed = True
            if ordered and revision > self.revision:
                self.revision = revision
            if changed:
                self._changed()
        return gap

    def fill(self, task_id: str, task: "TaskView | None") -> None:
        """Merge one read of ``task_id`` (``GetTask``, or the task a ``ReportTaskRun`` reply
        carries; None: the daemon does not know it), at least as new as every placement
        applied before the read began. Only a task still followed is filled (one whose
        finish arrived meanwhile stays forgotten)."""
        with self._cond:
            e = self._entries.get(task_id)
            if e is None or e.finished:
                return
            changed = e.task is None  # (a fresher read of a task known: no news)
            if task is None or _is_finished(task):
                e.finished, e.task, changed = True, None, True
            else:
                e.task = task
                if int(task.generation) > e.generation:
                    e.generation, e.nodes = int(task.generation), tuple(sorted(task.nodes))
                    changed = True
            if changed:
                self._changed()

    def reread(self, task_id: str) -> None:
        """Read ``task_id`` again before it counts as running (the daemon refused a report
        about it: it may have finished with its finish lost on the way)."""
        with self._cond:
            e = self._entries.get(task_id)
            if e is not None and not e.finished and e.task is not None:
                e.task = None
                self._changed()

    def running(self) -> Snapshot:
        """The running tasks (task id -> (its last read, current generation, nodes)), the
        ids of tasks that hold nodes but were not read yet (to :meth:`fill`), and the
        version they are of.

        Raises:
            Unavailable: the state is not synced (the stream is down, or never listed).
        """
        with self._cond:
            if not self.synced:
                raise Unavailable("the daemon's placement stream is not connected "
                                  "(reconnecting)")
            ready = {tid: (e.task, e.generation, e.nodes) for tid, e in self._entries.items()
                     if e.nodes and not e.finished and e.task is not None}
            unread = [tid for tid, e in self._entries.items()
                      if e.nodes and not e.finished and e.task is None]
            return Snapshot(ready, unread, self.version)

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the state is synced or ``timeout_s`` [s] pass; returns :attr:`synced`."""
        with self._cond:
            return self._cond.wait_for(lambda: self.synced, timeout=max(timeout_s, 0.0))

    def wait(self, version: int, timeout_s: float) -> int:
        """Block until :attr:`version` differs from ``version`` or ``timeout_s`` [s] pass;
        returns the version then."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != version, timeout=max(timeout_s, 0.0))
            return self.version


class _Resync(Exception):
    """The stream skipped updates: list again."""


#: the outage's reason when the daemon refuses the stream (``RESOURCE_EXHAUSTED``)
_REFUSED = "the daemon refuses the stream ({}); passes list the running tasks meanwhile"


class PlacementWatch:
    """One long-lived ``WatchPlacements`` stream that keeps ``state`` up to date, read by a
    daemon thread (module docstring: the order of the reads, the merge rules, reconnects).

    Args:
        client: the daemon's client (:class:`offcut.client.Client`: ``status``, ``watch``,
            ``list_tasks``); calls from this thread and the launcher's may overlap.
        state: what the stream keeps up to date.
        list_running: the running tasks (``ListTasks`` of ``TASK_STATE_RUNNING``).
        backoff: waits between reconnects (:data:`RECONNECT_BACKOFF`).
        wait: how the thread waits between reconnects (``threading.Event.wait`` of its
            stop event; injectable for tests).
        resync_s: while synced, the stream is opened afresh and the tasks listed again
            every ``resync_s`` [s] (:data:`RESYNC_S`; the stream's own time limit).
        fallback_after_s: how long [s] the stream may be down before :meth:`must_list`
            (:data:`FALLBACK_AFTER_S`).

    Attributes:
        connects: streams opened so far (each followed by one list).
        refused: while the daemon refuses the stream (``RESOURCE_EXHAUSTED``), why; else "".
    """

    def __init__(self, client, state: DesiredState,
                 list_running: Callable[[], list["TaskView"]],
                 backoff: Backoff = RECONNECT_BACKOFF,
                 wait: Callable[[float], object] | None = None,
                 resync_s: float = RESYNC_S, fallback_after_s: float = FALLBACK_AFTER_S):
        self.client = client
        self.state = state
        self.list_running = list_running
        self.backoff = backoff
        self.resync_s = resync_s
        self.fallback_after_s = fallback_after_s
        self.connects = 0
        self.refused = ""
        self._down_since = time.monotonic()  # when the current outage began
        self._closed = threading.Event()
        self._wait = wait or self._closed.wait
        self._lock = threading.Lock()
        self._stream = None
        self._thread: threading.Thread | None = None

    def start(self) -> "PlacementWatch":
        """Start the reading thread (once); the state is not synced until its first list
        (whatever was listed before is dropped)."""
        if self._thread is None:
            self.state.lose()
            self._down_since = time.monotonic()
            self._thread = threading.Thread(target=self._follow, name="offcut-placements",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop: cancel the stream, wait up to ``timeout_s`` [s] for the thread."""
        self._closed.set()
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def __enter__(self) -> "PlacementWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def must_list(self) -> bool:
        """Whether a pass is to list the running tasks itself (the state is not synced and
        the stream cannot be followed: the daemon refuses it, or it has been down for
        ``fallback_after_s``) rather than fail until the stream is back."""
        return not self.state.synced and bool(
            self.refused or time.monotonic() - self._down_since >= self.fallback_after_s)

    def _follow(self) -> None:
        """The thread: connect, list, follow; after a break, reconnect with backoff."""
        waits = self.backoff.backoffs()
        down = ""  # why the stream is down, logged once per outage
        planned = False  # the last stream's time was up (a re-list is no news)
        while not self._closed.is_set():
            refused_before = self.refused
            error: Exception | None = None
            refused = ""
            try:
                planned = self._connect(planned)
                if planned:
                    continue  # the resync time is up: open afresh and list, still synced
                why = "the daemon ended the stream (it stops)"
            except _Resync as gap:
                why = f"updates were lost ({gap}); listing again"
            except ResourceExhausted as exc:  # at the stream's opening (after the list)
                why = refused = _REFUSED.format(exc)
            except OffcutError as exc:
                why = str(exc)
            except Exception as exc:  # a bug must not end the launcher's view for good
                why, error = f"unexpected {type(exc).__name__}: {exc}", exc
            planned = False
            # it was synced (listed, also before a planned re-list), unless refused again:
            # a fresh outage
            if self.state.synced and not (refused and refused_before):
                waits, down = self.backoff.backoffs(), ""
                self._down_since = time.monotonic()
            self.refused = refused
            self.state.lose()
            if self._closed.is_set():
                return
            if why != down:
                log.warning("placement stream: %s; reconnecting", why, exc_info=error)
                down = why
            self._wait(next(waits))

    def _connect(self, planned: bool = False) -> bool:
        """Open the stream from the daemon's revision, list, then apply every update until
        it ends: True when its time (``resync_s``) is up, False when the daemon ended it.
        ``planned``: the last stream's time was up (not logged as a reconnect)."""
        revision = int(self.client.status().revision)
        opened = time.monotonic()
        stream = self.client.watch(after_revision=revision, timeout_s=self.resync_s)
        with self._lock:
            if self._closed.is_set():
                stream.cancel()
                return False
            self._stream = stream
        self.connects += 1
        try:
            self.state.reset(self.list_running(), revision)
            if self.connects > 1 and not (self.refused or planned):  # (refused: once accepted)
                log.info("placement stream reconnected at revision %d", revision)
            elif planned:
                log.debug("placement stream opened afresh, tasks listed at revision %d",
                          revision)
            for update in stream:
                if self.refused:
                    log.info("placement stream accepted at revision %d", revision)
                    self.refused = ""
                gap = self.state.apply(update.placements, int(update.revision))
                if gap:
                    raise _Resync(gap)
            # (the stream's time limit, measured by gRPC from a moment later, with slack)
            ended = time.monotonic() - opened >= 0.9 * self.resync_s
            if ended:
                self.refused = ""
            return ended
        finally:
            with self._lock:
                if self._stream is stream:
                    self._stream = None
            stream.cancel()


def read_unread(state: DesiredState, get_task: Callable[[str], "TaskView"],
                rounds: int = 3) -> Snapshot:
    """:meth:`DesiredState.running` after reading each task that holds nodes and was not
    read yet (``get_task``; NotFound: unknown to the daemon), ``rounds`` times at most (a
    task placed meanwhile and still unread is read on the next pass).

    Raises:
        Unavailable: not synced. OffcutError: a read failed (the pass is retried).
    """
    for _ in range(rounds):
        snapshot = state.running()
        if not snapshot.unread:
            return snapshot
        for task_id in snapshot.unread:
            try:
                task = get_task(task_id)
            except NotFound:
                task = None
            state.fill(task_id, task)
    return state.running()

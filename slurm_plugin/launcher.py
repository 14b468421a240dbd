"""``offcut-slurm launch``: makes the daemon's placements real as Slurm jobs, generation by
generation (the execution protocol: docs/execution.md).

Each generation of a running task (a fixed node set; the daemon numbers them) runs as one
Slurm job per node in the preemptible partition (``sbatch -p PARTITION -w NODE -N1
--exclusive --no-requeue``: the task owns the whole node), named
``PREFIX-TASKID.GENERATION-NODE``, with the task's command (``slurm.command_template``) and
the environment of docs/execution.md: ``OFFCUT_*`` (task, generation, node list, checkpoint
folder, stop signal, daemon address, Zeus job) and torch.distributed's ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``: the job runs
the task's ``procs_per_node`` processes (one per GPU by default) under the per-node
supervisor :mod:`offcut.slurm_plugin.node_run`, which forwards the stop signal to each and
ends the job with the protocol's exit code.

Each task's jobs run as the task's owner (``sbatch --uid=UID --gid=GID`` from a root launcher:
:mod:`offcut.slurm_plugin.owners`), with the owner's ``HOME``/``USER``/``LOGNAME``, in
``[slurm] workdir`` or else the owner's home folder, under umask 0077 (``SLURM_UMASK``); the job
itself, as the owner, creates the task's checkpoint folder. A task whose owner cannot run it
(no local account, root, a system or service account, or not the account of an unprivileged
launcher) is not launched: the launcher reports it failed, without a generation, which fails
the task at once with the reason (docs/security.md).

The launcher is a level-triggered reconciler: each pass compares what should run with what
Slurm shows, so a launcher restart (its jobs are adopted) and a failed Slurm or daemon call
are repaired on the next pass. A placement update the stream lost is repaired as
:mod:`offcut.slurm_plugin.placements` says: a gap (a skipped generation) by listing again at
once; a lost finish by re-reading the task when the daemon refuses a report about it; any
other (a lost first placement, a finish with no report) by the full re-list every
``resync_s`` (300 s by default) while the stream is followed.

* desired = every running task's current generation and nodes, kept from one long-lived
  ``WatchPlacements`` stream (:mod:`offcut.slurm_plugin.placements`): listed
  (``ListTasks``) at start and after each reconnect, then followed placement by placement
  (a task placed since is read once, ``GetTask``), listed afresh every ``resync_s``; one
  pass alone (``--once``) lists, and so does each pass while the stream cannot be followed
  (see below);
* actual = Offcut's jobs that ``squeue`` shows, recognised by partition and name, and counted
  only when Slurm says they run as the task's owner and this launcher submitted them (job id
  recorded at submit, or its key's tag in the comment: "Whose job it is",
  :class:`~offcut.slurm_plugin.job_ownership.JobOwnership`):
  a restarted launcher adopts them and never submits a (task, generation, node) twice;
* a job of an older generation, or of a task that no longer runs, still active -> the stop
  signal (``scancel --batch --signal``; a pending job is cancelled at once), then after
  ``slurm.rescale_grace_s`` ``scancel``: the old generation checkpoints and exits 75;
* a task's current generation is submitted once no job of an older one is active (they
  held the nodes and the checkpoint) and none of its nodes is *held*: a node whose job
  Slurm preempted waits until the daemon's placement has dropped it (the prolog or the
  watcher tells the daemon), so there is no tug of war with the job that preempted it;
* a job of a current generation still pending after ``slurm.pending_timeout_s`` (its node
  is held by a job the daemon was not told about, or the partition cannot start it) is given
  back: the node is reported taken back (``ReportNodes``, source ``slurm-launcher``), which
  makes the daemon re-place the task without it, and then the job is cancelled;
* a (task, generation, node) of a current generation that this launcher has not seen and
  that ``squeue`` does not show (the launcher was down while its job ran and ended, and
  Slurm has forgotten it after ``MinJobAge``) is looked up once in Slurm's accounting
  (``sacct``, :class:`~offcut.slurm_plugin.job_accounting.AccountingLookup`): an ended job
  found there is reported like one ``squeue`` shows, and never submitted again; without
  accounting (no slurmdbd) this is logged once and the job is submitted as before;
* a task that cannot run as its owner is reported ``failed`` once, with the reason (the
  daemon fails it) and nothing is submitted for it;
* every job that started or ended is reported once to the daemon (``Tasks.ReportTaskRun``
  with its generation, idempotent by request id ``JOBID:STATE`` across restarts): exit 0 ->
  ``finished`` (the task's work is done); exit 75, or ended after this launcher's stop signal
  -> ``interrupted``; preempted by Slurm, or cancelled by someone else -> ``preempted``;
  anything else -> ``failed``, with the last lines of the failed process's stderr (the
  supervisor's note in the checkpoint folder, read as the job's user:
  :mod:`offcut.slurm_plugin.job_failure`). The daemon restarts the current generation after an
  interruption or a failure (docs/execution.md) and fails the task after
  ``max_failed_generations`` failures in a row; a run of a replaced generation is never a
  task failure.

Ahead of a preemption Slurm sends the same signal to the job's batch shell
(``--signal=B:SIG@LEAD`` with ``SlurmctldParameters=preempt_send_user_signal``), then waits
the partition's GraceTime. The batch shell ``exec``-s the per-node supervisor, which forwards
the signal to every process of the node.

Passes run when a placement update changes the desired state, at least every ``--poll-s``
seconds, and every second while a generation is being replaced. While the stream is down
(the daemon restarting) the desired state is not known: passes fail as with the daemon
unreachable, nothing is done in Slurm, and the stream reconnects with backoff and lists
again. While the daemon refuses the stream (``RESOURCE_EXHAUSTED``: its stream slots are
taken, perhaps by a hostile user's streams), or once it has been down for 30 s, each pass
lists the running tasks itself as a pass alone does (the level-triggered fallback), so the
launcher goes on; the refusal is logged once per outage. Errors of Slurm or the daemon are
logged once per kind and retried on the next pass.

:class:`Launcher` runs the passes and composes one collaborator per concern: whose job it is
(:mod:`~offcut.slurm_plugin.job_ownership`), the accounting lookup
(:mod:`~offcut.slurm_plugin.job_accounting`), the reports to the daemon
(:mod:`~offcut.slurm_plugin.launch_reports`), stopping jobs
(:mod:`~offcut.slurm_plugin.job_stops`) and submitting them
(:mod:`~offcut.slurm_plugin.job_submission`), over the names they share
(:mod:`~offcut.slurm_plugin.launch_types`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterator

from offcut.daemon.config import SlurmConfig
from offcut.errors import OffcutError
from offcut.slurm_plugin.job_accounting import AccountingLookup
from offcut.slurm_plugin.job_ownership import JobOwnership, older_than_task
from offcut.slurm_plugin.job_stops import JobStopper
from offcut.slurm_plugin.job_submission import JobSubmitter
from offcut.slurm_plugin.launch_reports import RunReporter
from offcut.slurm_plugin.launch_types import (Generation, JobName, OnceLog, PassResult,
                                              generation_of, parse_job_name)
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.owners import OwnerAccounts, OwnerRefused, RunAsPolicy
from offcut.slurm_plugin.placements import RESYNC_S, DesiredState, PlacementWatch, read_unread
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import JobInfo, SlurmError, parse_nodes

#: what other packages import from here: the launcher, what a pass returns, and the job
#: names' parser (benchmarks/); the rest lives in the collaborators' modules
__all__ = ["Generation", "Launcher", "PassResult", "parse_job_name"]

log = logging.getLogger("offcut.slurm.launcher")

#: seconds between passes while a generation is being replaced or waits for one
BUSY_POLL_S = 1.0
#: longest wait [s] between two looks at ``run``'s stop event
STOP_CHECK_S = 0.5


class Launcher:
    """The reconciler. ``client`` is an :class:`offcut.client.Client`; ``cli`` runs Slurm.

    Args:
        client: the daemon's client (its address is passed to the jobs).
        cfg: the ``[slurm]`` section of the daemon's config.
        cli: Slurm commands.
        clock: wall clock [s] for run reports (injectable for tests).
        monotonic: clock [s] of the rescale grace periods (injectable for tests).
        accounts: whose account runs each task's jobs (default: the task's owner, by the
            ``run_as_owner`` / ``min_uid`` policy of ``cfg``, :meth:`RunAsPolicy.of`).
        key: the launcher's secret (default: loaded, or created, from ``[slurm]
            launcher_key`` on first use: :meth:`LauncherKey.load`), which tags its jobs and
            names the checkpoint folders.

    Attributes:
        state: the desired state (:class:`~offcut.slurm_plugin.placements.DesiredState`),
            kept by the placement stream while :meth:`run` (or :meth:`watching`) runs, else
            listed by each pass (while the stream cannot be followed, each pass lists into a
            state of its own instead).
        ownership: whose job it is (:class:`~offcut.slurm_plugin.job_ownership.JobOwnership`).
        accounting: jobs ended while the launcher was away
            (:class:`~offcut.slurm_plugin.job_accounting.AccountingLookup`).
        reports: the reports to the daemon
            (:class:`~offcut.slurm_plugin.launch_reports.RunReporter`).
        stops: stopping jobs (:class:`~offcut.slurm_plugin.job_stops.JobStopper`).
        submitter: submitting jobs (:class:`~offcut.slurm_plugin.job_submission.JobSubmitter`).
        held: (task, node) whose job Slurm preempted, not submitted again until the daemon's
            placement has dropped the node; retention: the current placements.
        passes, failed_passes: passes begun by :meth:`run`, and those of them that failed
            (logged, retried).
    """

    def __init__(self, client, cfg: SlurmConfig, cli: SlurmCLI,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 accounts: OwnerAccounts | None = None, key: LauncherKey | None = None):
        self.client = client
        self.cfg = cfg
        self.cli = cli
        self.accounts = accounts or OwnerAccounts(RunAsPolicy.of(cfg))
        self._key = key
        self.errors = OnceLog()
        self.state = DesiredState()
        self.ownership = JobOwnership(cfg, cli, self.accounts, lambda: self.key,
                                      started=clock())
        self.accounting = AccountingLookup(cfg, cli, self.ownership, self.errors)
        self.stops = JobStopper(cfg, cli, clock, monotonic,
                                report_taken=lambda nodes: self.reports.report_taken(nodes))
        self.reports = RunReporter(client, cfg, self.accounts, lambda: self.key, self.state,
                                   clock, lambda: (self.stops.cancelled, self.stops.signalled))
        self.submitter = JobSubmitter(cfg, cli, client.address, self.accounts,
                                      lambda: self.key, self.errors, self.ownership.record)
        self.held: set[tuple[str, str]] = set()
        self._first = True
        self._watch: PlacementWatch | None = None
        self._view = self.state  # the desired state this pass reads (:meth:`desired`)
        self._seen = 0  # the state's version of the last pass's desired state
        self.passes = 0
        self.failed_passes = 0

    @property
    def key(self) -> LauncherKey:
        """The launcher's secret (loaded on first use).

        Raises:
            LauncherKeyError: the key file is unsafe or cannot be made (an OSError: the pass
                fails and is retried, logged once).
        """
        if self._key is None:
            self._key = LauncherKey.load(self.cfg.launcher_key)
        return self._key

    # ------------------------------------------------------------------ what to run, where
    def list_running(self) -> list:  # of offcut.views.TaskView
        """The running tasks (``ListTasks`` of the running state, every page)."""
        from offcut.views import TaskState

        return self.client.list_tasks(states=[TaskState.RUNNING])

    def desired(self) -> dict[str, Generation]:
        """task id -> the current generation of every running task: the placement stream's
        state while :meth:`watching` (tasks placed since they were listed are read first,
        ``GetTask``), else listed now (``ListTasks``: a pass alone). While watching and the
        stream cannot be followed (:meth:`PlacementWatch.must_list`: the daemon refuses it,
        or it is down too long) listed now too, into a state of this pass's own (the
        level-triggered fallback). The replies of the pass's reports go to the same state.

        Raises:
            Unavailable: the placement stream is down (reconnecting, not refused, for less
                than :data:`~offcut.slurm_plugin.placements.FALLBACK_AFTER_S`).
            OffcutError: the daemon cannot be reached or refused a read.
        """
        self._view = self.state
        if self._watch is None:
            self.state.reset(self.list_running())
        elif self._watch.must_list():
            self._view = DesiredState()
            self._view.reset(self.list_running())
        self.reports.state = self._view
        return self._current()

    def _current(self) -> dict[str, Generation]:
        """:meth:`desired` from the pass's state as it is (tasks placed since they were
        listed read first); notes the stream state's version (changes after it wake
        :meth:`run`)."""
        snapshot = read_unread(self._view, self.client.get_task)
        if self._view is self.state:
            self._seen = snapshot.version
        return {tid: generation_of(running) for tid, running in snapshot.ready.items()}

    def node_addresses(self) -> dict[str, str]:
        """node -> the address Slurm knows for it (``NodeAddr``; the name when unknown)."""
        return {n: info.address or n for n, info in parse_nodes(self.cli.sinfo_json()).items()}

    # ------------------------------------------------------------------ one pass
    def reconcile(self) -> PassResult:
        """One pass: read Slurm and the daemon, report runs, stop replaced generations,
        submit current ones.

        Raises:
            OffcutError: the daemon cannot be reached or refused a call (Unavailable also
                while :meth:`watching` and its stream is briefly down: nothing is done in
                Slurm; :meth:`desired`).
            SlurmError: squeue or sinfo failed or answered garbage (nothing is submitted then).
        """
        result = PassResult()
        desired = self.desired()
        jobs = {j: (name, job) for j, (name, job) in self.ownership.own_jobs(desired).items()
                if not older_than_task(job, desired.get(name.task_id))}
        jobs.update(self.accounting.accounted(desired, jobs, self.submitter.submitted))
        for name, _ in jobs.values():
            self.submitter.seen(name)
        active, ended, preempted = self.reports.report_runs(jobs, result)
        # a report (or a node taken) may have started a new generation or ended a task: the
        # placements of their replies are in the state now (no second list)
        desired = self._current()
        wanted = {(g.task_id, n) for g in desired.values() for n in g.nodes}
        # a newly preempted (task, node) waits until the daemon has dropped that node
        self.held = {k for k in self.held | preempted if k in wanted}
        if self._first:
            result.adopted = len(active)
            if active:
                log.info("adopted %d running job(s) of Offcut", len(active))
            self._first = False
        for job_id, (name, job) in active.items():
            gen = desired.get(name.task_id)
            if gen is not None and gen.generation == name.generation \
                    and self.stops.pending_too_long(job):
                self.stops.give_back(job_id, name, result)
        draining: set[str] = set()  # tasks with a job of a replaced generation still active
        for job_id, (name, job) in active.items():
            gen = desired.get(name.task_id)
            group = (name.task_id, name.generation)
            if gen is not None and gen.generation == name.generation and group not in ended:
                continue
            # a replaced generation, a task that no longer runs, or a generation one of whose
            # runs ended (its peers cannot go on without it)
            draining.add(name.task_id)
            self.stops.stop(job_id, name, job, result)
        self._submit(desired, draining, result)
        self._forget(jobs, desired)
        return result

    def _submit(self, desired: dict[str, Generation], draining: set[str],
                result: PassResult) -> None:
        """Submit the jobs of the current generations not yet submitted or seen: as each
        task's owner (a task that cannot run as its owner is refused); a generation waits
        while a job of an older one is still active (``draining``: task ids) or one of its
        nodes is held."""
        addresses: dict[str, str] | None = None
        for task_id, gen in sorted(desired.items()):
            todo = self.submitter.todo(gen)
            if not todo:
                continue
            try:
                account = self.accounts.account(gen.owner)
            except OwnerRefused as exc:
                self.reports.refuse(gen, str(exc), result)
                continue
            if task_id in draining or any((task_id, n) in self.held for n in gen.nodes):
                result.waiting.append(task_id)
                result.held += sorted((task_id, n) for n in gen.nodes if (task_id, n) in self.held)
                continue
            if addresses is None:
                addresses = self.node_addresses()
            for node in todo:
                self.submitter.submit(gen, node, addresses, result, account)

    def _forget(self, jobs: dict[str, tuple[JobName, JobInfo]],
                desired: dict[str, Generation]) -> None:
        """Retention: what this launcher remembers is bounded by the jobs squeue still shows
        and the current generations (a job Slurm no longer shows is never reported again)."""
        self.reports.forget(jobs.keys(), desired)
        self.stops.forget(jobs.keys())
        self.submitter.forget(desired)
        self.accounting.forget(desired)
        self.errors.retain(lambda kind: not kind.startswith("script-")
                           or kind.removeprefix("script-") in desired)

    # ------------------------------------------------------------------ the loop
    def run(self, poll_s: float = 5.0, stop: threading.Event | None = None,
            on_pass: Callable[[PassResult], None] | None = None,
            resync_s: float = RESYNC_S) -> None:
        """Reconcile whenever a placement update changes the desired state (one
        ``WatchPlacements`` stream for the whole run, opened afresh with a full re-list every
        ``resync_s`` seconds: :meth:`watching`), at least every ``poll_s`` seconds (every
        :data:`BUSY_POLL_S` while a generation is being replaced), until ``stop`` is set
        (seen within :data:`STOP_CHECK_S`). The first pass waits up to ``poll_s`` for the
        first list. Never raises for Slurm or daemon errors (logged, retried); ``on_pass``
        gets each successful pass's result."""
        stop = stop or threading.Event()
        fine, identity = self.accounts.describe()
        log.log(logging.INFO if fine else logging.WARNING, "%s", identity)
        with self.watching(resync_s):
            end = time.monotonic() + poll_s
            while not (stop.is_set() or self.state.synced) and time.monotonic() < end:
                self.state.wait_synced(min(STOP_CHECK_S, end - time.monotonic()))
            while not stop.is_set():
                wait_s = poll_s
                self._seen = self.state.version  # (each view the pass takes moves it on)
                self.passes += 1
                try:
                    result = self.reconcile()
                    self.errors.ok("pass")
                    if result.busy:
                        wait_s = min(poll_s, BUSY_POLL_S)
                    if on_pass:
                        on_pass(result)
                except (OffcutError, SlurmError, OSError) as exc:  # OSError: e.g. the
                    self.failed_passes += 1                        # checkpoint root
                    self.errors.error("pass", "reconciliation failed (retrying every "
                                             f"{poll_s:g} s): {exc}")
                self._wait(wait_s, stop)

    @contextlib.contextmanager
    def watching(self, resync_s: float = RESYNC_S) -> Iterator[PlacementWatch]:
        """Keep :attr:`state` from one long-lived placement stream while the block runs
        (:class:`~offcut.slurm_plugin.placements.PlacementWatch`: listed at start, after
        each reconnect and every ``resync_s`` [s]); passes read it instead of listing."""
        with PlacementWatch(self.client, self.state, self.list_running,
                            resync_s=resync_s) as watch:
            self._watch = watch
            try:
                yield watch
            finally:
                self._watch = None

    def _wait(self, wait_s: float, stop: threading.Event) -> None:
        """Until the desired state changes from the last pass's view, ``wait_s`` [s] pass, or
        ``stop`` is set."""
        end = time.monotonic() + wait_s
        while not stop.is_set():
            left = end - time.monotonic()
            if left <= 0 or self.state.wait(self._seen, min(left, STOP_CHECK_S)) != self._seen:
                return

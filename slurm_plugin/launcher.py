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

The launcher is a level-triggered reconciler, so a restart, a missed update or a failed
Slurm call repairs itself on the next pass:

* desired = every running task's current generation and nodes, kept from one long-lived
  ``WatchPlacements`` stream (:mod:`offcut.slurm_plugin.placements`): listed
  (``ListTasks``) at start and after each reconnect, then followed placement by placement
  (a task placed since is read once, ``GetTask``); one pass alone (``--once``) lists;
* actual = Offcut's jobs that ``squeue`` shows, recognised by partition and name, and counted
  only when Slurm says they run as the task's owner and this launcher submitted them (job id
  recorded at submit, or its key's tag in the comment: :class:`Launcher`, "Whose job it is"):
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
  (``sacct``, :meth:`Launcher.accounted`): an ended job found there is reported like one
  ``squeue`` shows, and never submitted again; without accounting (no slurmdbd) this is
  logged once and the job is submitted as before;
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
again. Errors of Slurm or the daemon are logged once per kind and retried on the next pass.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shlex
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, NamedTuple

import hostlist

from offcut.daemon.config import SlurmConfig
from offcut.errors import FailedPrecondition, NotFound, OffcutError
from offcut.slurm_plugin import job_failure, node_run
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.owners import (JOB_UMASK, Account, OwnerAccounts, OwnerRefused,
                                        RunAsPolicy, user_name)
from offcut.slurm_plugin.placements import (DesiredState, PlacementWatch, Running,
                                            read_unread)
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import (FINISHED_JOB_STATES, JobInfo, SlurmError,
                                            parse_jobs, parse_nodes, parse_sacct)

log = logging.getLogger("offcut.slurm.launcher")

#: the exit code of a process that checkpointed (or had nothing to save) and asks to be
#: restarted (EX_TEMPFAIL; docs/execution.md)
EXIT_RESTART = 75
#: seconds between passes while a generation is being replaced or waits for one
BUSY_POLL_S = 1.0
#: longest wait [s] between two looks at ``run``'s stop event
STOP_CHECK_S = 0.5

#: how much earlier [s] than its task a job may have been submitted and still be the task's
#: (slurmctld's and the daemon's clocks may differ a little)
CLOCK_SLACK_S = 5.0

#: the order in which the ended runs of one generation are reported: the failure that broke
#: it before the peers that lost it (and exited 75)
_REPORT_ORDER = {"failed": 0, "preempted": 1, "interrupted": 2}

_TASK_GEN = re.compile(r"(?P<task>[^.\-]+)(?:\.(?P<gen>[0-9]{1,18}))?")


class JobName(NamedTuple):
    """What an Offcut job's name says: its task, generation (0: a job named before
    generations existed) and node."""

    task_id: str
    generation: int
    node: str


def job_name(cfg: SlurmConfig, task_id: str, generation: int, node: str) -> str:
    """``PREFIX-TASKID.GENERATION-NODE``: how Offcut's per-node jobs are named (and
    recognised)."""
    return f"{cfg.job_name_prefix}-{task_id}.{generation}-{node}"


def parse_job_name(cfg: SlurmConfig, name: str) -> JobName | None:
    """The :class:`JobName` of one of Offcut's job names (``PREFIX-TASKID.GEN-NODE``, or the
    older ``PREFIX-TASKID-NODE``), None for any other name."""
    prefix = cfg.job_name_prefix + "-"
    if not name.startswith(prefix):
        return None
    head, sep, node = name[len(prefix):].partition("-")
    m = _TASK_GEN.fullmatch(head)
    if not (sep and node and m):
        return None
    return JobName(m["task"], int(m["gen"] or 0), node)


def master_port(cfg: SlurmConfig, task_id: str, generation: int) -> int:
    """The rendezvous port of a task's generation: drawn from ``cfg.master_ports`` by a hash of
    ``(task, generation)``, so consecutive generations on the same first node use different
    ports (a port held in TIME_WAIT by the previous generation is not reused)."""
    low, high = cfg.port_range()
    return low + zlib.crc32(f"{task_id}.{generation}".encode()) % (high - low + 1)


def expand_user(path: str, account: Account | None) -> str:
    """``path`` with ``%u`` (Slurm's filename pattern for the user name, as in ``--output``)
    replaced by the name of the user the jobs run as: ``account``'s, else the launcher's."""
    if "%u" not in path:
        return path
    return path.replace("%u", account.name if account else user_name(os.getuid()))


def job_workdir(cfg: SlurmConfig, account: Account | None = None) -> str | None:
    """The jobs' working folder (``sbatch --chdir``): ``workdir`` (``%u`` expanded), else the
    home folder of the owner the jobs run as, else None (the launcher's folder)."""
    if cfg.workdir:
        return expand_user(cfg.workdir, account)
    return account.home if account else None


def checkpoint_dir(cfg: SlurmConfig, task_id: str, account: Account | None = None,
                   key: LauncherKey | None = None) -> Path:
    """The task's checkpoint folder: ``checkpoint_root/TASKID-SUFFIX`` (``%u`` expanded), a
    relative root taken from the jobs' working folder (:func:`job_workdir`: ``workdir``, else
    the owner's home when the jobs run as ``account``, else the launcher's folder), as an
    absolute path without ``..``. ``SUFFIX`` is the launcher key's
    :meth:`~offcut.slurm_plugin.launcher_key.LauncherKey.checkpoint_suffix` of the task and
    the user its jobs run as (16 hex characters: task ids are sequential, so a bare
    ``TASK_ID`` could be pre-created by another user in a shared root); the same for every
    generation of the task. Without ``key``: ``checkpoint_root/TASK_ID`` (tests only)."""
    root = Path(expand_user(cfg.checkpoint_root, account))
    if not root.is_absolute():
        root = Path(job_workdir(cfg, account) or os.getcwd()) / root
    name = task_id
    if key is not None:
        name += "-" + key.checkpoint_suffix(task_id, account.name if account
                                            else user_name(os.getuid()))
    return Path(os.path.abspath(root / name))


@dataclass(frozen=True)
class Generation:
    """One generation of a running task, as the daemon placed it."""

    task_id: str
    task_name: str
    generation: int
    nodes: tuple[str, ...]     # sorted: the node's index is its rank
    command: tuple[str, ...]
    zeus_job_id: str = ""
    submit_time: float = 0.0  # the task's [s since epoch]
    owner: str = ""           # the task's owner (a user name), whose account runs its jobs
    gpus_per_node: int = 0    # the task's spec.gpus_per_node: the jobs' --gres=gpu:N
    constraint: tuple[str, ...] = ()  # the task's spec.constraint: the jobs' --constraint
    procs_per_node: int = 1   # processes on each node (TaskSpec.local_world_size)
    total_work: float = 0.0   # the task's total_work_samples: the jobs' OFFCUT_TOTAL_WORK


def generation_of(running: Running) -> Generation:
    """The :class:`Generation` of one running task of the desired state (its last read, its
    current generation and nodes: :data:`offcut.slurm_plugin.placements.Running`)."""
    t, generation, nodes = running
    return Generation(t.task_id, t.spec.name, generation, nodes, tuple(t.spec.command),
                      t.spec.zeus_job_id, t.submit_time.seconds + t.submit_time.nanos / 1e9,
                      t.owner, t.spec.gpus_per_node, tuple(t.spec.constraint),
                      t.spec.procs_per_node or t.spec.gpus_per_node or 1,
                      t.spec.total_work_samples)


def _older_than_task(job: JobInfo, gen: Generation | None) -> bool:
    """A job named like one of a task's but submitted before the task existed: left by a
    daemon whose state was reset (task ids start again), never the task's."""
    return (gen is not None and job.submit_time > 0 and gen.submit_time > 0
            and job.submit_time < gen.submit_time - CLOCK_SLACK_S)


#: the per-node supervisor a job's batch script runs (one file of the standard library, so any
#: Python 3.9+ runs it: docs/execution.md, "Processes per node")
NODE_RUN = Path(node_run.__file__).resolve()
#: the interpreter of the supervisor when the launcher's own cannot be run by every user
SYSTEM_PYTHON = "/usr/bin/python3"


def _everyone_may(path: str, bits: int) -> bool:
    """Whether every user may use ``path`` (its real path) as ``bits`` says (``S_IXOTH`` to
    run, ``S_IROTH`` to read) and pass through every folder above it."""
    import stat

    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & bits:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


def supervisor_python(cfg: SlurmConfig) -> str:
    """The interpreter that runs :data:`NODE_RUN` in the jobs (which run as the tasks'
    owners): ``[slurm] node_python`` when set; else the launcher's own interpreter when every
    user may run it; else :data:`SYSTEM_PYTHON` when it exists (a launcher in a virtual
    environment whose base interpreter lives in a private folder, e.g. root's home)."""
    return cfg.node_python or _default_supervisor_python()


@functools.lru_cache(maxsize=1)
def _default_supervisor_python() -> str:
    """:func:`supervisor_python` without ``node_python``, found once (every job's batch script
    asks: the folders above the interpreter are not walked again for each)."""
    import stat

    if _everyone_may(sys.executable, stat.S_IXOTH) or not os.access(SYSTEM_PYTHON, os.X_OK):
        return sys.executable
    return SYSTEM_PYTHON


def batch_script(cfg: SlurmConfig, gen: Generation, node: str, *, address: str,
                 master_addr: str, account: Account | None = None,
                 key: LauncherKey | None = None) -> str:
    """The batch script of ``gen``'s job on ``node``: the environment of docs/execution.md,
    then ``exec`` of the per-node supervisor (:data:`NODE_RUN`, by :func:`supervisor_python`),
    which starts ``gen.procs_per_node`` processes of
    ``cfg.command_template`` (placeholders filled; ``{command}`` is the task's argv,
    shell-quoted; ``{rank}`` is the node's index, each process's own rank is its ``RANK``).
    The supervisor first creates the task's checkpoint folder (:func:`checkpoint_dir`, named
    with ``key``) as the job's user, safely along the whole path
    (:func:`offcut.slurm_plugin.node_run.make_private_dir`: no link anywhere, every component
    root's or the user's), and the job exits 1 with a message when it cannot be used.

    Raises:
        ValueError: the task has no command and the template needs one.
    """
    if not gen.command and "{command}" in cfg.command_template:
        raise ValueError(f"task {gen.task_id} has no command (submit it with -- COMMAND...)")
    node_rank, nodes = gen.nodes.index(node), len(gen.nodes)
    procs = gen.procs_per_node
    world = nodes * procs
    nodelist = hostlist.collect_hostlist(list(gen.nodes))
    port = master_port(cfg, gen.task_id, gen.generation)
    ckpt = str(checkpoint_dir(cfg, gen.task_id, account, key))
    line = cfg.command_template.format(
        command=shlex.join(gen.command), task_id=gen.task_id,
        task_name=shlex.quote(gen.task_name), node=node, rank=node_rank, nodes=nodelist,
        num_nodes=nodes, generation=gen.generation, master_addr=master_addr, master_port=port,
        world_size=world, checkpoint_dir=shlex.quote(ckpt))
    env = {"OFFCUT_TASK_ID": gen.task_id, "OFFCUT_TASK_NAME": gen.task_name,
           "OFFCUT_ADDRESS": address, "OFFCUT_GENERATION": str(gen.generation),
           "OFFCUT_NODE": node, "OFFCUT_NODE_RANK": str(node_rank), "OFFCUT_NODELIST": nodelist,
           "OFFCUT_NUM_NODES": str(nodes), "OFFCUT_CHECKPOINT_DIR": ckpt,
           "OFFCUT_STOP_SIGNAL": cfg.signal, "OFFCUT_PEER_TIMEOUT_S": f"{cfg.peer_timeout_s:g}",
           "OFFCUT_TOTAL_WORK": f"{gen.total_work:.17g}",
           "MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(procs)}
    if gen.zeus_job_id:
        env["OFFCUT_ZEUS_JOB_ID"] = gen.zeus_job_id
    if cfg.power_socket and gen.gpus_per_node:
        env["ZEUSD_SOCK_PATH"] = cfg.power_socket
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    head = (f"#!/bin/bash\n# Offcut task {gen.task_id}, generation {gen.generation}, on {node} "
            f"(node {node_rank} of {nodes}, {procs} process(es) each)")
    run = shlex.join([supervisor_python(cfg), "-I", str(NODE_RUN),
                      "--procs", str(procs), "--node-rank", str(node_rank),
                      "--num-nodes", str(nodes),
                      "--gpus-per-proc", str(gen.gpus_per_node // procs),
                      "--stop-signal", cfg.signal, "--checkpoint-dir", ckpt, "--", line])
    if account is None:  # the launcher made the folder (its own account runs the jobs)
        return f"{head}\n{exports}\nexec {run}\n"
    return f"{head}, as {account.name}\n{exports}\nexec {run}\n"


def job_environment(cfg: SlurmConfig, environ: Mapping[str, str] | None = None,
                    account: Account | None = None) -> dict[str, str]:
    """The environment ``sbatch`` runs in, which a task's job inherits (Slurm's default
    ``--export=ALL``): the launcher's variables named in ``[slurm] export_env`` only, so no
    secret of the launcher (``OFFCUT_TOKEN``, ``OFFCUT_TOKEN_FILE``, credentials) reaches user
    code; with ``account`` (the jobs run as the task's owner) the owner's ``HOME``, ``USER``
    and ``LOGNAME`` instead of the launcher's; and ``SLURM_UMASK`` = :data:`JOB_UMASK`, so the
    job's output file and what it creates are its owner's only. The job's own variables
    (docs/execution.md) are set by its batch script."""
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in cfg.export_env if k in environ}
    env["SLURM_UMASK"] = JOB_UMASK
    if account is not None:
        env.update(account.environment())
    return env


def sbatch_options(cfg: SlurmConfig, name: str, node: str,
                   account: Account | None = None, gen: Generation | None = None,
                   comment: str = "") -> list[str]:
    """The sbatch options of one per-node job; with ``account``, the job runs as that user
    (``--uid``/``--gid`` last, after ``sbatch_args``, from a root launcher) in
    :func:`job_workdir`; ``gen``'s node needs as Slurm's ``--gres=gpu:N`` (Slurm then sets
    ``CUDA_VISIBLE_DEVICES``) and ``--constraint=F1&F2``; ``comment`` (the launcher's tag of
    the job, :meth:`LauncherKey.job_tag`) as ``--comment``, after ``sbatch_args`` (which
    may not set one: offcut.daemon.config.SlurmConfig)."""
    opts = ["-p", cfg.partition, "-w", node, "-N", "1", "--exclusive", "-J", name, "--no-requeue",
            f"--signal=B:{cfg.signal}@{cfg.signal_lead_s}", "-o", cfg.output]
    if gen is not None and gen.gpus_per_node:
        opts.append(f"--gres=gpu:{gen.gpus_per_node}")
    if gen is not None and gen.constraint:
        opts.append(f"--constraint={'&'.join(gen.constraint)}")
    if cfg.account:
        opts.append(f"--account={cfg.account}")
    workdir = job_workdir(cfg, account)
    if workdir:
        opts.append(f"--chdir={workdir}")
    opts += list(cfg.sbatch_args)
    if comment:
        opts.append(f"--comment={comment}")
    return opts + (account.sbatch_options() if account is not None else [])


def run_state(job: JobInfo, *, cancelled_by_us: bool = False,
              signalled_by_us: bool = False) -> str | None:
    """The run state to report for a job (None: nothing to report yet / at all).

    An ended job: ``finished`` (COMPLETED: exit 0); None (cancelled by this launcher without
    a stop signal first: it never ran, or was given back); ``interrupted`` (exit 75, killed
    by a signal after this launcher's stop signal, or cancelled by it after the signal's
    grace: it ignored the signal);
    ``preempted`` (PREEMPTED, ended while Slurm was preempting it, or CANCELLED by someone
    else); ``failed`` (any other end: a non-zero exit other than 75, also after this
    launcher's stop signal, where it is the run's own status: a rank that crashed while its
    peers' end made the launcher stop the generation; a signal, TIMEOUT, OUT_OF_MEMORY,
    NODE_FAIL ...). The daemon counts a failure only for the task's current generation
    (docs/execution.md). A running job: ``started``."""
    s = job.states
    if s & FINISHED_JOB_STATES:
        if "COMPLETED" in s:
            return "finished"
        if "CANCELLED" in s and cancelled_by_us:
            return "interrupted" if signalled_by_us else None
        if job.exit_code == EXIT_RESTART and not job.signal:
            return "interrupted"
        if signalled_by_us and (job.signal or not job.exit_code):
            return "interrupted"
        if "PREEMPTED" in s or "CANCELLED" in s or job.being_preempted:
            return "preempted"
        return "failed"
    if "RUNNING" in s:
        return "started"
    return None


@dataclass
class PassResult:
    """What one reconciliation pass did (for logs and tests)."""

    submitted: list[tuple[str, str, str]] = field(default_factory=list)   # (task, node, job)
    cancelled: list[tuple[str, str, str]] = field(default_factory=list)
    signalled: list[tuple[str, str, str]] = field(default_factory=list)   # stop signal sent
    reported: list[tuple[str, str, str]] = field(default_factory=list)    # (task, job, state)
    adopted: int = 0
    held: list[tuple[str, str]] = field(default_factory=list)             # preempted, waiting
    waiting: list[str] = field(default_factory=list)  # tasks whose new generation waits
    refused: list[tuple[str, str]] = field(default_factory=list)  # (task, why): not launched
    given_back: list[tuple[str, str, str]] = field(default_factory=list)  # pending too long

    @property
    def busy(self) -> bool:
        """A generation is being replaced or waits: the next pass should come soon."""
        return bool(self.waiting or self.signalled)


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
            listed by each pass.
        passes, failed_passes: passes begun by :meth:`run`, and those of them that failed
            (logged, retried).

    Whose job it is (docs/execution.md, "Whose job it is"): a job in the partition named like
    one of Offcut's counts for a task only if (1) Slurm says its user id is the one the task's
    jobs run as (the owner's account, or the launcher's own with ``run_as_owner = false``),
    and (2) this launcher submitted it: its job id was recorded at submit, or its comment is
    the launcher key's tag of its name and user id (:meth:`LauncherKey.job_tag`; how a
    restarted launcher adopts its jobs). For a job of a task that no longer runs only (2) is
    asked (the tag binds the uid the launcher submitted it as). A job that fails is ignored:
    never adopted, reported, stopped or cancelled; logged once.
    """

    def __init__(self, client, cfg: SlurmConfig, cli: SlurmCLI,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 accounts: OwnerAccounts | None = None, key: LauncherKey | None = None):
        self.client = client
        self.cfg = cfg
        self.cli = cli
        self.clock = clock
        self.monotonic = monotonic
        self.accounts = accounts or OwnerAccounts(RunAsPolicy.of(cfg))
        self.refused: set[str] = set()          # tasks reported as not launchable
        self.cancelled: set[str] = set()        # job ids this launcher cancelled
        self.signalled: dict[str, float] = {}   # job id -> when this launcher sent the stop signal
        self.reported: set[tuple[str, str]] = set()  # (job id, state) sent to the daemon
        self.held: set[tuple[str, str]] = set()      # (task, node) preempted, not resubmitted
        self.submitted: set[tuple[str, int, str]] = set()  # (task, generation, node)
        self.looked_up: set[tuple[str, int]] = set()  # (task, generation) asked of sacct
        self.mine: set[str] = set()      # job ids this launcher submitted or adopted
        self.ignored: set[str] = set()   # job ids named like Offcut's but not its (logged)
        self.started = clock()           # [s] jobs submitted later are its own only by id
        self._key = key
        self._errors: set[str] = set()
        self._first = True
        self._node_seq = 0  # seq of the last node event sent (time-based, ns)
        self.state = DesiredState()
        self._watch: PlacementWatch | None = None
        self._seen = 0  # the state's version of the last pass's desired state
        self.passes = 0
        self.failed_passes = 0

    # ------------------------------------------------------------------ helpers
    def _error(self, kind: str, message: str) -> None:
        if kind not in self._errors:
            log.error("%s", message)
            self._errors.add(kind)

    def _ok(self, kind: str) -> None:
        if kind in self._errors:
            log.info("%s: recovered", kind)
            self._errors.discard(kind)

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

    def _run_as_uid(self, gen: Generation) -> int | None:
        """The uid ``gen``'s jobs run as (None: the task cannot run as its owner)."""
        try:
            account = self.accounts.account(gen.owner)
        except OwnerRefused:
            return None
        return account.uid if account is not None else self.accounts.uid

    def _not_ours(self, job: JobInfo, gen: Generation | None, *,
                  ended_unseen: bool = False) -> str:
        """Why ``job`` (named like one of ``gen``'s task's) is not this launcher's job of that
        task ("" when it is): the rule of the class docstring. ``ended_unseen``: a job found
        in Slurm's accounting, which keeps no comment by default (``AccountingStoreFlags=
        job_comment``): besides its id or tag, one submitted before this launcher started
        (+ :data:`CLOCK_SLACK_S`) counts, since a job submitted later that it does not know
        by its id is not its own."""
        if job.uid is None:
            return "Slurm did not say its user id"
        if gen is not None:
            want = self._run_as_uid(gen)
            if job.uid != want:
                return (f"it runs as uid {job.uid}, task {gen.task_id}'s jobs as "
                        f"{'nobody' if want is None else f'uid {want}'}")
        if job.job_id in self.mine or self.key.is_tag(job.comment, job.name, job.uid):
            return ""
        if ended_unseen and gen is not None and 0 < job.submit_time <= \
                self.started + CLOCK_SLACK_S:
            return ""
        return "this launcher did not submit it (no tag of its key in the comment)"

    def _ignore(self, job: JobInfo, why: str) -> None:
        """Log once that ``job`` is not Offcut's although named so."""
        if job.job_id not in self.ignored:
            self.ignored.add(job.job_id)
            log.warning("job %s (%s, user %s) is named like Offcut's but is not this "
                        "launcher's: %s; ignored", job.job_id, job.name,
                        job.user or job.uid, why)

    def own_jobs(self, desired: Mapping[str, Generation] | None = None
                 ) -> dict[str, tuple[JobName, JobInfo]]:
        """Offcut's jobs that squeue knows: job id -> (its name's parts, the job); only the
        jobs the rule of the class docstring says are this launcher's (``desired``: the
        running tasks, whose owners the jobs must run as). Others named so are ignored
        (logged once; retention: the ids squeue still shows)."""
        desired = desired or {}
        out = {}
        shown: set[str] = set()
        for job in parse_jobs(self.cli.squeue_json()):
            if self.cfg.partition not in job.partition.split(","):
                continue
            parsed = parse_job_name(self.cfg, job.name)
            if not parsed:
                continue
            shown.add(job.job_id)
            why = self._not_ours(job, desired.get(parsed.task_id))
            if why:
                self._ignore(job, why)
                continue
            out[job.job_id] = (parsed, job)
        self.mine = (self.mine & shown) | out.keys()
        self.ignored &= shown
        return out

    def list_running(self) -> list:  # of offcut.v1.Task
        """The running tasks (``ListTasks`` of ``TASK_STATE_RUNNING``, every page)."""
        from offcut.v1 import tasks_pb2

        return self.client.list_tasks(states=[tasks_pb2.TASK_STATE_RUNNING])

    def desired(self) -> dict[str, Generation]:
        """task id -> the current generation of every running task: the placement stream's
        state while :meth:`watching` (tasks placed since they were listed are read first,
        ``GetTask``), else listed now (``ListTasks``: a pass alone).

        Raises:
            Unavailable: the placement stream is down (reconnecting).
            OffcutError: the daemon cannot be reached or refused a read.
        """
        if self._watch is None:
            self.state.reset(self.list_running())
        return self._current()

    def _current(self) -> dict[str, Generation]:
        """:meth:`desired` from the state as it is (tasks placed since they were listed
        read first); notes its version (changes after it wake :meth:`run`)."""
        snapshot = read_unread(self.state, self.client.get_task)
        self._seen = snapshot.version
        return {tid: generation_of(running) for tid, running in snapshot.ready.items()}

    def _placed(self, decision) -> None:
        """Apply the placements of a decision the launcher's own call got back (newer than
        what the stream has brought so far; a duplicate's stored answer is old news)."""
        if not decision.duplicate:
            self.state.apply(decision.placements, int(decision.revision), ordered=False)

    def node_addresses(self) -> dict[str, str]:
        """node -> the address Slurm knows for it (``NodeAddr``; the name when unknown)."""
        return {n: info.address or n for n, info in parse_nodes(self.cli.sinfo_json()).items()}

    def _report(self, name: JobName, job: JobInfo, state: str, result: PassResult) -> bool:
        """Send one run report (once per job and state; the daemon dedups retries by
        request id, also across launcher restarts). True when the daemon took it as new
        (False: a repeat, or refused as not applicable)."""
        key = (job.job_id, state)
        if key in self.reported:
            return False
        text = ""
        by_slurm = job.being_preempted or "PREEMPTED" in job.states
        # killed after the grace time: this launcher cancelled it after its stop signal, or
        # Slurm's preemption ended it by a signal (it did not exit 75 within GraceTime)
        ignored = (state == "interrupted" and job.job_id in self.signalled
                   and job.job_id in self.cancelled) or (
            state == "preempted" and by_slurm and bool(job.signal))
        if state == "preempted":
            text = "preempted by Slurm" if by_slurm else "cancelled outside Offcut"
        elif state == "interrupted":
            text = ("stopped for a new generation" if job.job_id in self.signalled
                    else "checkpointed, restart requested")
        if ignored:
            text += ("; it ignored the stop signal: cancelled after rescale_grace_s"
                     if state == "interrupted" else
                     "; it ignored the stop signal: killed when the preemption's GraceTime ended")
        if job.signal and state in ("failed", "interrupted"):
            text = (text + f"; killed by signal {job.signal}").lstrip("; ")
        if state == "failed":
            tail = self._stderr_tail(name, job)
            if tail:
                text = (text + f"; last lines of its stderr: {tail}").lstrip("; ")
        try:
            reply = self.client.report_task_run(
                name.task_id, state, node=name.node, job_id=job.job_id,
                exit_code=job.exit_code, message=text, time=self.clock(),
                request_id=f"{job.job_id}:{state}", generation=name.generation or None,
                stop_ignored=ignored)
            new = not reply.decision.duplicate  # known before a launcher restart
            self._placed(reply.decision)
        except (NotFound, FailedPrecondition) as exc:  # the task is gone or already finished,
            # or the job is not the task's (a generation it never had): nothing happened, so
            # nothing follows from it (no node is held for a refused preemption report); the
            # task is read again (in case the stream lost its finish)
            log.debug("run report %s of job %s not needed: %s", state, job.job_id, exc)
            self.state.reread(name.task_id)
            new = False
        self.reported.add(key)
        if not new:
            return False
        result.reported.append((name.task_id, job.job_id, state))
        log.info("task %s generation %d: job %s on %s %s", name.task_id, name.generation,
                 job.job_id, name.node, state)
        return True

    def _stderr_tail(self, name: JobName, job: JobInfo) -> str:
        """The last lines of stderr of ``job``'s failed process, from the failure note in the
        task's checkpoint folder, read with the rights of the user Slurm says the job ran as
        (:func:`offcut.slurm_plugin.job_failure.stderr_tail`; never as root for an owner's
        job); "" when there is none, or that user is not one the launcher runs jobs as."""
        if job.uid is None:
            return ""
        try:
            account = self.accounts.account(user_name(job.uid))
            folder = checkpoint_dir(self.cfg, name.task_id, account, self.key)
        except (OwnerRefused, OSError) as exc:
            log.debug("no stderr lines for job %s: %s", job.job_id, exc)
            return ""
        return job_failure.stderr_tail(folder, job.job_id, account)

    # ------------------------------------------------------------------ one pass
    def reconcile(self) -> PassResult:
        """One pass: read Slurm and the daemon, report runs, stop replaced generations,
        submit current ones.

        Raises:
            OffcutError: the daemon cannot be reached or refused a call (Unavailable also
                while :meth:`watching` and its stream is down: nothing is done in Slurm).
            SlurmError: squeue or sinfo failed or answered garbage (nothing is submitted then).
        """
        result = PassResult()
        desired = self.desired()
        jobs = {j: (name, job) for j, (name, job) in self.own_jobs(desired).items()
                if not _older_than_task(job, desired.get(name.task_id))}
        jobs.update(self.accounted(desired, jobs))
        active, ended, preempted = self._report_runs(jobs, result)
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
                    and self._pending_too_long(job):
                self._give_back(job_id, name, job, result)
        draining: set[str] = set()  # tasks with a job of a replaced generation still active
        for job_id, (name, job) in active.items():
            gen = desired.get(name.task_id)
            group = (name.task_id, name.generation)
            if gen is not None and gen.generation == name.generation and group not in ended:
                continue
            # a replaced generation, a task that no longer runs, or a generation one of whose
            # runs ended (its peers cannot go on without it)
            draining.add(name.task_id)
            self._stop(job_id, name, job, result)
        addresses: dict[str, str] | None = None
        for task_id, gen in sorted(desired.items()):
            todo = [n for n in gen.nodes if (task_id, gen.generation, n) not in self.submitted]
            if not todo:
                continue
            try:
                account = self.accounts.account(gen.owner)
            except OwnerRefused as exc:
                self._refuse(gen, str(exc), result)
                continue
            if task_id in draining or any((task_id, n) in self.held for n in gen.nodes):
                result.waiting.append(task_id)
                result.held += sorted((task_id, n) for n in gen.nodes if (task_id, n) in self.held)
                continue
            if addresses is None:
                addresses = self.node_addresses()
            for node in todo:
                self._submit(gen, node, addresses, result, account)
        self._forget(jobs, desired)
        return result

    def accounted(self, desired: dict[str, Generation],
                  jobs: dict[str, tuple[JobName, JobInfo]]) -> dict[str, tuple[JobName, JobInfo]]:
        """Ended jobs of current generations that ``squeue`` no longer shows, from Slurm's
        accounting: job id -> (name, job). Asked once per (task, generation) this launcher
        has not submitted or seen (a restarted launcher's first look at a generation), in
        one ``sacct`` call; a generation with a job accounting still shows active is asked
        again next pass. Only jobs the rule of the class docstring says are this launcher's
        count (the user id, always recorded; others are ignored, logged once). Without
        accounting: nothing (logged once)."""
        shown = {(n.task_id, n.generation, n.node) for n, _ in jobs.values()}
        missing = {job_name(self.cfg, t, g.generation, n): g
                   for t, g in desired.items() if (t, g.generation) not in self.looked_up
                   for n in g.nodes
                   if (t, g.generation, n) not in self.submitted | shown}
        if not missing:
            return {}
        groups = {(g.task_id, g.generation) for g in missing.values()}
        try:
            records = parse_sacct(self.cli.sacct(
                sorted(missing), min(g.submit_time for g in missing.values()) - CLOCK_SLACK_S))
            self._ok("sacct")
        except SlurmError as exc:
            if "disabled" in str(exc) and "sacct" not in self._errors:  # no slurmdbd: a choice
                log.warning("Slurm's accounting is off (%s); jobs that ended while the "
                            "launcher was down and that squeue no longer shows cannot be told "
                            "from jobs never submitted (docs/deployment.md, \"Accounting\")",
                            exc)
                self._errors.add("sacct")
            self._error("sacct", f"Slurm's accounting cannot be read ({exc}); jobs that ended "
                                 "while the launcher was down and that squeue no longer shows "
                                 "cannot be told from jobs never submitted")
            self.looked_up |= groups
            return {}
        found: dict[str, tuple[JobName, JobInfo]] = {}
        for job in records:
            gen = missing.get(job.name)
            parsed = parse_job_name(self.cfg, job.name)
            if gen is None or parsed is None or job.job_id in jobs \
                    or self.cfg.partition not in job.partition.split(",") \
                    or _older_than_task(job, gen):
                continue
            why = self._not_ours(job, gen, ended_unseen=True)
            if why:
                self._ignore(job, why)
                continue
            if not job.states & FINISHED_JOB_STATES:  # (squeue and sacct asked a moment apart)
                groups.discard((gen.task_id, gen.generation))
                continue
            found[job.job_id] = (parsed, job)
            log.info("task %s generation %d: job %s on %s ended while the launcher was away "
                     "(%s in Slurm's accounting)", parsed.task_id, parsed.generation, job.job_id,
                     parsed.node, ",".join(sorted(job.states)))
        self.looked_up |= groups
        return found

    def _report_runs(self, jobs: dict[str, tuple[JobName, JobInfo]], result: PassResult
                     ) -> tuple[dict[str, tuple[JobName, JobInfo]],
                                dict[tuple[str, int], list[tuple[JobName, JobInfo, str]]],
                                set[tuple[str, str]]]:
        """Report what the jobs did: starts and finishes at once, the other ends of a
        generation once all its jobs have ended (the failure that broke it first, then the
        peers that lost it). Returns the active jobs (job id -> (name, job)), the ended runs
        by (task, generation), and the (task, node) pairs Slurm is taking (newly preempted)."""
        active: dict[str, tuple[JobName, JobInfo]] = {}
        live: set[tuple[str, int]] = set()  # (task, generation) with a job still active
        ended: dict[tuple[str, int], list[tuple[JobName, JobInfo, str]]] = {}
        for job_id, (name, job) in sorted(jobs.items(), key=lambda kv: int(kv[0])):
            self.submitted.add((name.task_id, name.generation, name.node))
            state = run_state(job, cancelled_by_us=job_id in self.cancelled,
                              signalled_by_us=job_id in self.signalled)
            if state is not None or "COMPLETING" in job.states:  # it ran (a short job may
                self._report(name, job, "started", result)     # never be seen RUNNING)
            if not (job.states & FINISHED_JOB_STATES):
                active[job_id] = (name, job)
                live.add((name.task_id, name.generation))
            elif state == "finished":  # the work is done: at once
                self._report(name, job, state, result)
            elif state is not None:
                ended.setdefault((name.task_id, name.generation), []).append((name, job, state))
        preempted: set[tuple[str, str]] = set()
        for group, runs in ended.items():
            if group in live:
                continue
            # the nodes Slurm is taking first: the daemon's restart of this generation must
            # not place the next one on them (a generation this launcher would hold, never
            # submitted, until the preempting job's PrologSlurmctld reports them; issue 38).
            # Idempotent with that prolog's report; the preempting job's epilog (or the
            # watcher) gives them back.
            taken = sorted({name.node for name, job, state in runs
                            if (job.being_preempted or "PREEMPTED" in job.states)
                            and (job.job_id, state) not in self.reported})
            if taken:
                self._report_taken(taken)
            for name, job, state in sorted(runs, key=lambda r: _REPORT_ORDER[r[2]]):
                if self._report(name, job, state, result) and (
                        state == "preempted" or job.being_preempted):
                    preempted.add((name.task_id, name.node))  # Slurm is taking the node
        return active, ended, preempted

    def _forget(self, jobs: dict[str, tuple[JobName, JobInfo]],
                desired: dict[str, Generation]) -> None:
        """Retention: what this launcher remembers is bounded by the jobs squeue still shows
        and the current generations (a job Slurm no longer shows is never reported again)."""
        self.reported = {k for k in self.reported if k[0] in jobs}
        self.cancelled &= jobs.keys()
        self.signalled = {j: t for j, t in self.signalled.items() if j in jobs}
        self.submitted = {k for k in self.submitted
                          if k[0] in desired and k[1] == desired[k[0]].generation}
        self.looked_up = {k for k in self.looked_up
                          if k[0] in desired and k[1] == desired[k[0]].generation}
        self.refused &= desired.keys()

    def _pending_too_long(self, job: JobInfo) -> bool:
        """Whether ``job`` is pending for longer than ``pending_timeout_s`` (by Slurm's
        submit time and this host's clock; never when either is unknown or the limit 0)."""
        limit = self.cfg.pending_timeout_s
        return bool(limit and "PENDING" in job.states and job.submit_time
                    and self.clock() - job.submit_time > limit
                    and job.job_id not in self.cancelled)

    def _report_taken(self, nodes: list[str]) -> None:
        """Report ``nodes`` taken back to the daemon (``ReportNodes`` preempted, source
        ``slurm-launcher``, a fresh monotone seq). Raises what ``report_nodes`` raises (the
        pass is retried)."""
        now_ns = time.time_ns()
        self._node_seq = max(now_ns, self._node_seq + 1)
        self._placed(self.client.report_nodes(now_ns / 1e9, "slurm-launcher", self._node_seq,
                                              preempted=nodes))

    def _give_back(self, job_id: str, name: JobName, job: JobInfo, result: PassResult) -> None:
        """Report ``name.node`` taken back to the daemon (source ``slurm-launcher``), then
        cancel the pending job. The report comes first: if it fails, the job stays and the
        next pass tries again, so a task never waits on a node the daemon still counts."""
        self._report_taken([name.node])
        self.cli.cancel([job_id])
        self.cancelled.add(job_id)
        result.given_back.append((name.task_id, name.node, job_id))
        log.warning("task %s generation %d: job %s pending on %s for over %g s; node given "
                    "back to the daemon, job cancelled", name.task_id, name.generation, job_id,
                    name.node, self.cfg.pending_timeout_s)

    def _refuse(self, gen: Generation, reason: str, result: PassResult) -> None:
        """Report once that ``gen``'s task cannot run as its owner (``reason``): a ``failed``
        run without a generation, which fails the task at once (a retry cannot help), with
        the message ``not launched: REASON``; idempotent by request id ``TASK:not-launched``."""
        if gen.task_id in self.refused:
            return
        log.error("task %s not launched: %s", gen.task_id, reason)
        try:
            self._placed(self.client.report_task_run(
                gen.task_id, "failed", message=f"not launched: {reason}", time=self.clock(),
                request_id=f"{gen.task_id}:not-launched").decision)
        except (NotFound, FailedPrecondition) as exc:  # the task is gone or already finished
            log.debug("failure report of task %s not needed: %s", gen.task_id, exc)
        self.refused.add(gen.task_id)
        result.refused.append((gen.task_id, reason))

    def _stop(self, job_id: str, name: JobName, job: JobInfo, result: PassResult) -> None:
        """Stop a job of a replaced generation (or of a task that no longer runs): the stop
        signal first (a job that has not started is cancelled at once), ``scancel`` after
        ``rescale_grace_s``."""
        if job_id in self.cancelled:
            return
        now = self.monotonic()
        started = "RUNNING" in job.states
        if started and job_id not in self.signalled and self.cfg.rescale_grace_s > 0:
            self.cli.cancel([job_id], signal=self.cfg.signal, options=["--batch"])
            self.signalled[job_id] = now
            result.signalled.append((name.task_id, name.node, job_id))
            log.info("task %s: generation %d on %s (job %s) asked to stop (%s)", name.task_id,
                     name.generation, name.node, job_id, self.cfg.signal)
            return
        if started and now - self.signalled.get(job_id, now) < self.cfg.rescale_grace_s:
            return
        self.cli.cancel([job_id])
        self.cancelled.add(job_id)
        result.cancelled.append((name.task_id, name.node, job_id))
        log.info("task %s: cancelled job %s on %s (generation %d replaced)", name.task_id,
                 job_id, name.node, name.generation)

    def _submit(self, gen: Generation, node: str, addresses: dict[str, str],
                result: PassResult, account: Account | None = None) -> None:
        """Submit ``gen``'s job on ``node``, as ``account`` (None: as the launcher's own
        account); logged once and skipped when the task cannot be launched, e.g. it has no
        command. The launcher creates the checkpoint folder only for its own account's jobs
        (a job that runs as the owner creates it itself: root never creates folders where a
        user could have planted a link)."""
        try:
            script = batch_script(self.cfg, gen, node, address=self.client.address,
                                  master_addr=addresses.get(gen.nodes[0], gen.nodes[0]),
                                  account=account, key=self.key)
        except ValueError as exc:
            self._error(f"script-{gen.task_id}", f"cannot launch task {gen.task_id}: {exc}")
            return
        if node == gen.nodes[0] and account is None:
            try:
                node_run.make_private_dir(str(checkpoint_dir(self.cfg, gen.task_id, None,
                                                             self.key)))
            except node_run.UnsafeFolder as exc:
                raise OSError(f"cannot use the checkpoint folder: {exc}") from None
        name = job_name(self.cfg, gen.task_id, gen.generation, node)
        uid = account.uid if account is not None else self.accounts.uid
        job_id = self.cli.submit(sbatch_options(self.cfg, name, node, account, gen,
                                                comment=self.key.job_tag(name, uid)),
                                 script=script, env=job_environment(self.cfg, account=account))
        self.mine.add(job_id)
        self.submitted.add((gen.task_id, gen.generation, node))
        result.submitted.append((gen.task_id, node, job_id))
        log.info("task %s generation %d: submitted job %s on %s (rank %d of %d) as %s",
                 gen.task_id, gen.generation, job_id, node, gen.nodes.index(node),
                 len(gen.nodes), account.name if account else self.accounts.launcher_name)

    # ------------------------------------------------------------------ the loop
    def run(self, poll_s: float = 5.0, stop: threading.Event | None = None,
            on_pass: Callable[[PassResult], None] | None = None) -> None:
        """Reconcile whenever a placement update changes the desired state (one
        ``WatchPlacements`` stream for the whole run: :meth:`watching`), at least every
        ``poll_s`` seconds (every :data:`BUSY_POLL_S` while a generation is being replaced),
        until ``stop`` is set (seen within :data:`STOP_CHECK_S`). The first pass waits up to
        ``poll_s`` for the first list. Never raises for Slurm or daemon errors (logged,
        retried); ``on_pass`` gets each successful pass's result."""
        stop = stop or threading.Event()
        fine, identity = self.accounts.describe()
        log.log(logging.INFO if fine else logging.WARNING, "%s", identity)
        with self.watching():
            end = time.monotonic() + poll_s
            while not (stop.is_set() or self.state.synced) and time.monotonic() < end:
                self.state.wait_synced(min(STOP_CHECK_S, end - time.monotonic()))
            while not stop.is_set():
                wait_s = poll_s
                self._seen = self.state.version  # (each view the pass takes moves it on)
                self.passes += 1
                try:
                    result = self.reconcile()
                    self._ok("pass")
                    if result.busy:
                        wait_s = min(poll_s, BUSY_POLL_S)
                    if on_pass:
                        on_pass(result)
                except (OffcutError, SlurmError, OSError) as exc:  # OSError: e.g. the
                    self.failed_passes += 1                        # checkpoint root
                    self._error("pass", f"reconciliation failed (retrying every {poll_s:g} s): "
                                        f"{exc}")
                self._wait(wait_s, stop)

    @contextlib.contextmanager
    def watching(self) -> Iterator[PlacementWatch]:
        """Keep :attr:`state` from one long-lived placement stream while the block runs
        (:class:`~offcut.slurm_plugin.placements.PlacementWatch`: listed at start and after
        each reconnect); passes read it instead of listing."""
        watch = PlacementWatch(self.client, self.state, self.list_running)
        self._watch = watch.start()
        try:
            yield watch
        finally:
            self._watch = None
            watch.close()

    def _wait(self, wait_s: float, stop: threading.Event) -> None:
        """Until the desired state changes from the last pass's view, ``wait_s`` [s] pass, or
        ``stop`` is set."""
        end = time.monotonic() + wait_s
        while not stop.is_set():
            left = end - time.monotonic()
            if left <= 0 or self.state.wait(self._seen, min(left, STOP_CHECK_S)) != self._seen:
                return

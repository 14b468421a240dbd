"""Submitting a generation's per-node jobs (the launcher's part that writes to Slurm:
:mod:`offcut.slurm_plugin.launcher`): each job's batch script (the environment of
docs/execution.md, then the per-node supervisor :mod:`offcut.slurm_plugin.node_run`), the
environment ``sbatch`` runs in, its ``sbatch`` options, the task's checkpoint folder and the
jobs' working folder, and :class:`JobSubmitter`, which submits each (task, generation, node)
once.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys
import zlib
from pathlib import Path
from typing import Callable, Mapping

import hostlist

from offcut.daemon.config import SlurmConfig
from offcut.slurm_plugin import node_run
from offcut.slurm_plugin.launch_types import (Generation, JobName, OnceLog, PassResult,
                                              job_name)
from offcut.slurm_plugin.launcher_key import LauncherKey
from offcut.slurm_plugin.owners import JOB_UMASK, Account, OwnerAccounts, user_name
from offcut.slurm_plugin.slurm_cli import SlurmCLI

log = logging.getLogger("offcut.slurm.launcher")


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




class JobSubmitter:
    """Submits the per-node jobs of the current generations, each (task, generation, node)
    once: as the task's owner (``sbatch --uid/--gid``) or the launcher's own account, tagged
    with the launcher key (:meth:`LauncherKey.job_tag`, how a restarted launcher knows its
    jobs: :mod:`offcut.slurm_plugin.job_ownership`).

    Args:
        cfg: the ``[slurm]`` section of the daemon's config.
        cli: Slurm commands (``sbatch``).
        address: the daemon's address, passed to the jobs (``OFFCUT_ADDRESS``).
        accounts: whose account runs each task's jobs (the launcher's uid and name).
        key: the launcher's secret, asked for on first use (it may fail: an OSError).
        errors: the launcher's log of errors once per kind.
        record: called with the id of each job submitted (the launcher's jobs by id).

    Attributes:
        submitted: (task, generation, node) submitted by this launcher or seen in Slurm (its
            job then is not submitted again); retention: the current generations
            (:meth:`forget`).
    """

    def __init__(self, cfg: SlurmConfig, cli: SlurmCLI, address: str, accounts: OwnerAccounts,
                 key: Callable[[], LauncherKey], errors: OnceLog,
                 record: Callable[[str], None]):
        self.cfg = cfg
        self.cli = cli
        self.address = address
        self.accounts = accounts
        self.key = key
        self.errors = errors
        self.record = record
        self.submitted: set[tuple[str, int, str]] = set()

    def seen(self, name: JobName) -> None:
        """``name``'s job exists in Slurm (shown by squeue or found in its accounting): never
        submitted again."""
        self.submitted.add((name.task_id, name.generation, name.node))

    def todo(self, gen: Generation) -> list[str]:
        """The nodes of ``gen`` whose job has been neither submitted nor seen, in rank order."""
        return [n for n in gen.nodes if (gen.task_id, gen.generation, n) not in self.submitted]

    def forget(self, desired: Mapping[str, Generation]) -> None:
        """Retention: keep what is known of the current generations (``desired``) only."""
        self.submitted = {k for k in self.submitted
                          if k[0] in desired and k[1] == desired[k[0]].generation}

    def submit(self, gen: Generation, node: str, addresses: Mapping[str, str],
               result: PassResult, account: Account | None = None) -> None:
        """Submit ``gen``'s job on ``node``, as ``account`` (None: as the launcher's own
        account); ``addresses``: node -> its address (``MASTER_ADDR`` is the first node's).
        Logged once and skipped when the task cannot be launched, e.g. it has no command.
        The launcher creates the checkpoint folder only for its own account's jobs (a job
        that runs as the owner creates it itself: root never creates folders where a user
        could have planted a link).

        Raises:
            SlurmError: ``sbatch`` failed.
            OSError: the checkpoint folder cannot be used, or the key cannot be loaded.
        """
        key = self.key()
        try:
            script = batch_script(self.cfg, gen, node, address=self.address,
                                  master_addr=addresses.get(gen.nodes[0], gen.nodes[0]),
                                  account=account, key=key)
        except ValueError as exc:
            self.errors.error(f"script-{gen.task_id}", f"cannot launch task {gen.task_id}: {exc}")
            return
        if node == gen.nodes[0] and account is None:
            try:
                node_run.make_private_dir(str(checkpoint_dir(self.cfg, gen.task_id, None, key)))
            except node_run.UnsafeFolder as exc:
                raise OSError(f"cannot use the checkpoint folder: {exc}") from None
        name = job_name(self.cfg, gen.task_id, gen.generation, node)
        uid = account.uid if account is not None else self.accounts.uid
        job_id = self.cli.submit(sbatch_options(self.cfg, name, node, account, gen,
                                                comment=key.job_tag(name, uid)),
                                 script=script, env=job_environment(self.cfg, account=account))
        self.record(job_id)
        self.submitted.add((gen.task_id, gen.generation, node))
        result.submitted.append((gen.task_id, node, job_id))
        log.info("task %s generation %d: submitted job %s on %s (rank %d of %d) as %s",
                 gen.task_id, gen.generation, job_id, node, gen.nodes.index(node),
                 len(gen.nodes), account.name if account else self.accounts.launcher_name)

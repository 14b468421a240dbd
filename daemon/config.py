"""Daemon settings: one TOML file, every key also a ``offcutd`` flag (flags win). Every
option, its default and meaning: ``docs/configuration.md`` (generated from
:class:`DaemonConfig` by ``offcutd --print-config markdown``).

Example ``offcut.toml``::

    listen = "unix:///run/offcut/offcutd.sock"   # or "127.0.0.1:50051" (TCP)
    state = "/var/lib/offcut/state.sqlite"
    solver = "dp"              # dp | gurobi | cbc | auto | greedy
    policy = "throughput"      # throughput | energy | zeus_cost | fair_share | a plugin's name
    solver_time_limit_s = 10.0
    tfwd_s = 60.0              # the look-ahead Tfwd (BFTrainer's replayer used 10)
    max_running_tasks = 10     # maxJ
    metrics_listen = "127.0.0.1:9464"   # Prometheus /metrics (unset: no endpoint)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from offcut.addresses import default_socket, normalize_address
from offcut.toml_file import TomlFileError, read_toml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)


def default_state() -> str:
    """``$XDG_STATE_HOME/offcut/state.sqlite`` (``~/.local/state/offcut/`` without it)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "offcut" / "state.sqlite")


def split_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> ``(host, port)``; port 0 = any free port.

    Raises:
        ValueError: no host, no port, or a port outside 0-65535.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"{value!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 host in brackets, [::1]:PORT")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"{value!r} is not HOST:PORT")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port {port} is outside 0-65535")
    return host, int(port)


def _doc(default: str) -> dict:
    """``json_schema_extra`` naming a computed default in the documentation."""
    return {"default_doc": default}


#: placeholders of ``slurm.command_template``
COMMAND_PLACEHOLDERS = ("command", "task_id", "task_name", "node", "rank", "nodes", "num_nodes",
                        "generation", "master_addr", "master_port", "world_size",
                        "checkpoint_dir")


#: worker threads of the daemon's unary calls (offcut.daemon.edge.workers; node events have
#: threads of their own besides, and streams wait on the event loop, holding none)
RPC_WORKERS = 32

#: the largest ``max_streams`` / ``max_streams_per_caller`` accepted (memory: about 25 KiB
#: per open stream, benchmarks/watch_streams.py)
MAX_STREAMS_BOUND = 65_536

#: the launcher's variables a task's jobs get by default (``[slurm] export_env``)
DEFAULT_EXPORT_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR")
#: variables never exported to a task's jobs: the launcher's credentials
SECRET_ENV_PREFIXES = ("OFFCUT_TOKEN", "OFFCUT_TLS", "MUNGE", "SLURM_JWT", "AWS_", "GOOGLE_")
SECRET_ENV_NAMES = frozenset({"SSH_AUTH_SOCK", "KRB5CCNAME"})
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SlurmConfig(BaseModel):
    """Site settings of the Slurm launcher (``[slurm]`` in offcut.toml; read by
    ``offcut-slurm launch --config``). docs/architecture.md, "Slurm integration"."""

    model_config = ConfigDict(extra="forbid")

    partition: str = Field("scavenger", min_length=1, description=(
        "preemptible partition of Offcut's per-node jobs; regular jobs in other partitions "
        "preempt them (the hooks ignore jobs in this partition)"))
    account: str | None = Field(None, examples=["offcut"],
                                description="sbatch --account of Offcut's jobs; unset = the user's default")
    job_name_prefix: str = Field("offcut", pattern=r"^[A-Za-z0-9_.]+$", description=(
        "Offcut's jobs are named PREFIX-TASKID.GENERATION-NODE; the launcher adopts and the "
        "watcher counts as idle only jobs named so in the partition"))
    signal: str = Field("USR1", pattern=r"^[A-Z0-9]+$", description=(
        "signal that asks a task's processes to checkpoint and exit 75: sent by Slurm ahead "
        "of a preemption (sbatch --signal=B:SIG@LEAD) and by the launcher before it replaces "
        "a generation (scancel --batch --signal); docs/execution.md"))
    signal_lead_s: int = Field(60, ge=0, le=65535, description=(
        "seconds between the signal and the end of the job when its time limit runs out; "
        "on preemption Slurm sends it at once and kills after the partition's GraceTime"))
    rescale_grace_s: float = Field(60.0, ge=0, le=86400, description=(
        "seconds a generation being replaced (grow, shrink, restart) has, after the signal, to "
        "checkpoint and exit before its jobs are cancelled; the new generation starts after"))
    pending_timeout_s: float = Field(300.0, ge=0, le=604800, description=(
        "a job of Offcut's still pending after this long [s] (its node was taken by a job "
        "Offcut was not told about, or the partition cannot start it) is cancelled and its "
        "node reported taken back, so the daemon re-places the task without it; 0 = wait "
        "for ever"))
    checkpoint_root: str = Field("offcut-checkpoints", min_length=1, description=(
        "folder of the tasks' checkpoints, one sub-folder per task (OFFCUT_CHECKPOINT_DIR), "
        "named TASKID-SUFFIX (16 hex of the launcher key: others cannot guess it) and made by "
        "the task's job as its owner (mode 0700; no link and no other user's folder anywhere "
        "on the path: docs/execution.md); must be on storage every node sees; "
        "%u is the owner's user name; a relative path is taken from the jobs' working folder "
        "(workdir, else the owner's home; with run_as_owner = false the launcher's folder)"))
    master_ports: str = Field("29400-29999", pattern=r"^[0-9]{1,5}-[0-9]{1,5}$", description=(
        "TCP ports of the generations' rendezvous (MASTER_PORT on the generation's first "
        "node), LOW-HIGH; each (task, generation) draws one"))
    command_template: str = Field("{command}", description=(
        "command run on each node (a shell line; placeholders {command} {task_id} "
        "{task_name} {node} {rank} {nodes} {num_nodes} {generation} {master_addr} "
        "{master_port} {world_size} {checkpoint_dir}); run once for every process of the "
        "node (procs_per_node of the task), docs/execution.md"))
    peer_timeout_s: float = Field(60.0, ge=5, le=3600, description=(
        "seconds after which a task's processes give up on a silent peer (a vanished node, a "
        "hung collective) and exit 75: the collective timeout and the heartbeat deadline of "
        "offcut.client.elastic (OFFCUT_PEER_TIMEOUT_S); docs/execution.md, \"A lost peer\""))
    power_socket: str | None = Field(None, examples=["/run/offcut/power.sock"], description=(
        "unix socket of the node power helper (offcut-slurm power-helper) on every GPU node; "
        "the jobs get it as ZEUSD_SOCK_PATH, so power limits are set through it without root "
        "(docs/deployment.md); unset = tasks cannot set power limits"))
    node_python: str | None = Field(None, examples=["/opt/offcut/venv/bin/python"], description=(
        "Python interpreter (3.9 or later), on every node and runnable by every user, of the "
        "per-node supervisor that starts a job's processes (offcut/slurm_plugin/node_run.py, "
        "standard library only); unset = the launcher's own when every user may run it, else "
        "/usr/bin/python3"))
    sbatch_args: list[str] = Field(default_factory=list, examples=[["--qos=scavenger"]],
                                   description="extra sbatch arguments of every job (not "
                                               "--comment: the launcher tags its jobs with it)")
    launcher_key: str | None = Field(None, examples=["/var/lib/offcut/launcher.key"], description=(
        "the launcher's secret key file (created on first use, mode 0600, 32 random bytes): "
        "it tags the launcher's jobs (sbatch --comment), so a restarted launcher adopts only "
        "its own, and names the checkpoint folders so no other user can guess them; back it "
        "up (without it running jobs are not adopted and tasks get new checkpoint folders); "
        "unset = $XDG_STATE_HOME/offcut/launcher.key (~/.local/state/offcut/ without it)"))
    export_env: list[str] = Field(
        default_factory=lambda: list(DEFAULT_EXPORT_ENV), examples=[["PATH", "LANG"]],
        description=(
            "the launcher's environment variables a task's jobs get (sbatch runs with these "
            "only, and the job inherits them), besides the OFFCUT_*, MASTER_*, RANK ... of "
            "docs/execution.md; an allow-list, so no secret of the launcher (OFFCUT_TOKEN, "
            "OFFCUT_TOKEN_FILE, credentials) reaches user code: those names are refused"))
    output: str = Field("%x-%j.out", description=(
        "sbatch --output of the jobs (Slurm patterns: %u user, %x job name: "
        "job_name_prefix-TASK.GENERATION-NODE, %j job id); relative to the jobs' working folder; "
        "written by the job's owner (mode 0600)"))
    workdir: str | None = Field(None, examples=["/scratch/%u/offcut"], description=(
        "sbatch --chdir of the jobs (%u: the owner's user name), a folder the owner can "
        "write; unset = the owner's home (with run_as_owner = false: the launcher's folder)"))
    run_as_owner: bool = Field(True, description=(
        "run each task's jobs as the task's owner (sbatch --uid/--gid; the launcher must be "
        "root); a task whose owner has no local account, is root or a system account (uid < "
        "min_uid) is not launched and fails with the reason. false: every task runs as the "
        "launcher's own account (single-user sites and tests only)"))
    min_uid: int = Field(1000, ge=0, le=2**32 - 2, description=(
        "lowest uid a task may run as (login.defs UID_MIN): owners with a lower uid are "
        "system accounts and their tasks are refused; root (uid 0) is always refused"))

    @field_validator("export_env")
    @classmethod
    def _check_export_env(cls, value: list[str]) -> list[str]:
        for name in value:
            if not ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.startswith(SECRET_ENV_PREFIXES) or name in SECRET_ENV_NAMES:
                raise ValueError(f"{name} may hold a secret of the launcher; a task's jobs "
                                 "never get it")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _check_sbatch_args(cls, value: list[str]) -> list[str]:
        for arg in value:
            if arg == "--comment" or arg.startswith("--comment="):
                raise ValueError("--comment is the launcher's own (it tags Offcut's jobs with "
                                 "it: docs/execution.md, \"Whose job it is\")")
        return value

    @field_validator("master_ports")
    @classmethod
    def _check_ports(cls, value: str) -> str:
        low, high = (int(x) for x in value.split("-"))
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, got {value}")
        return value

    def port_range(self) -> tuple[int, int]:
        """``master_ports`` as ``(low, high)``, both included."""
        low, high = (int(x) for x in self.master_ports.split("-"))
        return low, high

    @field_validator("command_template")
    @classmethod
    def _check_template(cls, value: str) -> str:
        import string

        names = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
        unknown = names - set(COMMAND_PLACEHOLDERS)
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(COMMAND_PLACEHOLDERS)}")
        return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: the built-in allocation policies (``policy``; offcut.daemon.app.model.ObjectiveSettings,
#: offcut.daemon.app.policies.BUILTIN_POLICIES); third-party ones come from entry points
OBJECTIVES = ("throughput", "energy", "zeus_cost", "fair_share")
#: what a policy name looks like (an entry-point name)
POLICY_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,100}$"


class PowerConfig(BaseModel):
    """Power figures of the site's nodes for the energy objectives (``[power]`` in
    offcut.toml; :class:`offcut.daemon.app.model.ObjectiveSettings`)."""

    model_config = ConfigDict(extra="forbid")

    node_power_w: float = Field(1000.0, gt=0, le=1e6, description=(
        "prior draw of one node running a task, W (until the task's power_w curve or its "
        "energy reports say otherwise)"))
    idle_node_power_w: float = Field(250.0, ge=0, le=1e6, description=(
        "draw of an idle node no task uses, W (it stays on; charged to the pool's energy)"))
    node_max_power_w: float = Field(1600.0, gt=0, le=1e6, description=(
        "maximum power of one node, W (Zeus's MAXPOWER in zeus_cost, per node)"))


#: the DaemonConfig options that are request size limits (offcut.taskspec.Limits)
LIMIT_FIELDS = ("max_event_nodes", "max_idle_nodes", "max_task_nodes", "max_curve_points",
                "max_command_args", "max_command_bytes", "max_batch_sizes", "max_power_limits",
                "max_progress_reports")


class DaemonConfig(BaseModel):
    """Validated daemon settings (units in the key names: ``_s`` seconds, ``_mb`` MiB).

    Every option is documented by its ``description`` here; ``offcutd --print-config``
    renders them with their defaults (TOML, or Markdown for ``docs/configuration.md``).
    """

    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default_factory=default_socket, json_schema_extra=_doc(
        "unix://$XDG_RUNTIME_DIR/offcut/offcutd.sock (/tmp/offcut-$UID/offcut/ without it)"),
        examples=["unix:///run/offcut/offcutd.sock"],
        description="gRPC address: unix:///path.sock (mode 0600) or HOST:PORT for TCP")
    state: str = Field(default_factory=default_state, json_schema_extra=_doc(
        "$XDG_STATE_HOME/offcut/state.sqlite (~/.local/state/offcut/ without it)"),
        examples=["/var/lib/offcut/state.sqlite"],
        description="SQLite state file (journal + snapshots; in a private 0700 folder, one daemon per file; back it up with offcutd backup: docs/operations.md)")
    solver: Literal["auto", "gurobi", "cbc", "dp", "greedy"] = Field(
        "dp", description="allocation backend: dp = exact count-level dynamic programming, "
                          "fast and the same decisions on every install; gurobi (the gurobi "
                          "extra) / cbc = the MILP forms, for comparisons; auto = gurobi when "
                          "installed and the model fits its licence, else cbc; greedy = "
                          "BFTrainer's heuristic. offcutd refuses to start with gurobi when "
                          "gurobipy is not installed")
    solver_time_limit_s: float = Field(
        10.0, gt=0, le=3600, description="limit per MILP solve, s; the incumbent is used when it "
                                         "is hit (flag --time-limit)")
    isolate_solver: bool = Field(True, description="run MILP backends in a guarded child process "
                                                   "(flag --isolate-solver/--in-process-solver)")
    solver_trip_after: int = Field(
        5, ge=1, le=1000, description="a backend that failed (timed out, crashed, answered "
                                      "wrong) this many solves in a row is tripped: exact dp "
                                      "answers at once until it is tried again (health service "
                                      "offcut.solver NOT_SERVING meanwhile)")
    solver_cooldown_s: float = Field(
        60.0, gt=0, le=900, description="how long a tripped backend is skipped before it is "
                                        "tried again, s; doubled at each trip in a row (at most "
                                        "900 s)")
    tfwd_s: float = Field(60.0, gt=0, le=86400,
                          description="BFTrainer look-ahead Tfwd, s (flag --tfwd); 60 s from "
                                      "the sweep on the real log (docs/architecture.md, \"The "
                                      "horizon\": python benchmarks/tfwd_sweep.py); replays "
                                      "keep BFTrainer's 10 s unless --tfwd is given")
    max_running_tasks: int = Field(10, ge=1, le=100000,
                                   description="maxJ: tasks admitted at once, in submit order")
    max_failed_generations: int = Field(3, ge=1, le=1000, description=(
        "a task fails when this many of its runs fail in a row without progress beyond the "
        "previous failure's reported samples (each failure restarts it on the same nodes as a "
        "new generation; every failed run counts in FailedRuns); docs/execution.md, \"Wasted "
        "work\""))
    final_grace_s: float = Field(600.0, ge=0, le=7 * 86400, description=(
        "how long a task run by the launcher keeps its nodes after a progress report reached "
        "its work, for its processes to finish (a final evaluation) and exit 0, s: it is "
        "COMPLETED when they exit 0, or after this long (then stopped, with a warning); 0 = "
        "COMPLETED at the report, its processes stopped; docs/execution.md, \"Completion\""))
    finished_task_retention_s: float = Field(86400.0, ge=60, le=10 * 365 * 86400, description=(
        "a finished task leaves the daemon's memory and snapshots this long after it "
        "finished, s; it stays readable (offcut show, ListTasks) from the state file's "
        "archive; docs/operations.md"))
    task_archive_retention_s: float = Field(400 * 86400.0, ge=86400, le=100 * 365 * 86400,
                                            description=(
        "an archived task is deleted from the state file this long after it finished, s "
        "(default 400 days); docs/operations.md"))
    journal_retention_s: float = Field(7 * 86400.0, ge=3600, le=100 * 365 * 86400, description=(
        "journal rows (one per applied event) are deleted this long after their event, s "
        "(at each snapshot; rows a kept snapshot needs stay): the window in which a repeated "
        "request id is answered as a duplicate and offcut history reaches back; "
        "docs/operations.md"))
    policy: str = Field(
        "throughput", pattern=POLICY_NAME_PATTERN, description=(
            "allocation policy, what the allocation maximises: throughput (BFTrainer's samples "
            "over the look-ahead), energy (samples per joule of the idle pool), zeus_cost "
            "(samples per unit of eta * energy + (1 - eta) * MAXPOWER * time; both energy "
            "policies are solved exactly, Dinkelbach over the exact backends), fair_share "
            "(max-min fair node-hours per task owner, throughput within each share) or the "
            "name of a third-party policy (entry point of the group offcut.policies); "
            "checked when offcutd starts"))
    eta: float = Field(0.5, ge=0, le=1, description=(
        "eta_knob of policy = zeus_cost: 0 = time only (throughput), 1 = energy only"))
    prior_rate_per_node: float = Field(1.0, gt=0, description=(
        "throughput per node, samples/s, assumed for a task submitted without a curve before "
        "any task has been measured (then: the median measured per-node rate)"))
    snapshot_every: int = Field(1000, ge=1, description="journal rows between state snapshots")
    durability: Literal["full", "normal"] = Field(
        "full", description="full: fsync every commit (survives power loss); normal: survives "
                            "kill -9, about 1 ms per event faster")
    zeus_trial_retention: int = Field(1000, ge=0, le=1_000_000, description=(
        "trial records a Zeus job keeps in memory, 0 to 1,000,000: its open trials and the "
        "newest finished ones; older finished trials stay in the state file for "
        "zeus_trial_rows_retention (GetJob pages them, a report naming one reads it); the "
        "optimizer's decisions do not depend on it"))
    zeus_trial_rows_retention: int = Field(10_000, ge=1, le=10_000_000, description=(
        "trial records a Zeus job keeps in the state file, 1 to 10,000,000 (at least "
        "zeus_trial_retention): its open trials and the finished ones among its newest this "
        "many; older finished trials are deleted (in batches of at most 1,000 rows, in the "
        "transaction of a later call on the job): GetJob no longer lists them and a report "
        "naming one is NOT_FOUND. The optimizer never reads trial records, so its decisions do "
        "not depend on it"))
    zeus_observation_retention: int = Field(10_000, ge=100, le=10_000_000, description=(
        "observed runs a Zeus job keeps per batch size (memory and state file), 100 to "
        "10,000,000: Thompson sampling fits each batch size to its newest this many runs "
        "(never fewer than the job's window_size or mab_num_explorations); decisions are "
        "unchanged for a job with a window_size up to it and for every batch size with no more "
        "runs; older runs' rows are deleted with a later call on the job; docs/operations.md"))
    max_zeus_jobs_per_owner: int = Field(1000, ge=1, le=1_000_000, description=(
        "Zeus jobs one owner may have registered, 1 to 1,000,000; one more RegisterJob is "
        "RESOURCE_EXHAUSTED (registering an identical spec again still answers); admins are "
        "not capped (docs/security.md)"))
    max_active_tasks_per_owner: int = Field(10_000, ge=1, le=10_000_000, description=(
        "queued and running tasks one owner may have, 1 to 10,000,000; one more SubmitTask "
        "from a user is RESOURCE_EXHAUSTED (a retried request id still gets its stored "
        "reply); admins are not capped (docs/security.md)"))
    max_retained_tasks_per_owner: int = Field(20_000, ge=1, le=10_000_000, description=(
        "tasks of one owner the daemon keeps in memory, 1 to 10,000,000: its queued and "
        "running tasks and its finished ones until they leave memory (finished_task_retention_s "
        "after they finished; then they are read from the archive); one more SubmitTask from a "
        "user is RESOURCE_EXHAUSTED naming it, until some leave; admins are not capped "
        "(docs/security.md)"))
    max_retained_task_bytes_per_owner: int = Field(64 * 1_048_576, ge=1_048_576,
                                                   le=1 << 40, description=(
        "bytes of the tasks one owner has in memory (those max_retained_tasks_per_owner "
        "counts), 1 MiB to 1 TiB: each task counts its command, name and curve with a fixed "
        "2 KiB of overhead; a SubmitTask from a user that would pass it is RESOURCE_EXHAUSTED "
        "naming it, until some of the owner's finished tasks leave memory (default 64 MiB: "
        "with finished_task_retention_s, it bounds what one user adds to the journal and the "
        "archive per day; docs/security.md); admins are not capped"))
    zeus_request_retention_s: float = Field(7 * 86400.0, ge=3600, le=3650 * 86400.0, description=(
        "seconds a stored answer to a Zeus request id (Predict, ResumeTrial) is kept, 1 hour "
        "to 10 years: a retry within it gets the first answer, a later one is a new request; "
        "expired answers are deleted at most once a minute"))
    record_instances: str | None = Field(
        None, examples=["/var/lib/offcut/instances.jsonl"],
        description="append every allocation problem to this JSONL file (offcut solve "
                          "re-solves it); unset = not recorded")
    max_streams: int = Field(4096, ge=1, le=MAX_STREAMS_BOUND, description=(
        "open server streams (WatchPlacements, StreamNodes, health Watch) in all, at most "
        f"{MAX_STREAMS_BOUND:,}; a waiting stream holds no thread (it waits on the event "
        "loop), only memory; a stream over it is RESOURCE_EXHAUSTED"))
    max_streams_per_caller: int = Field(64, ge=1, le=MAX_STREAMS_BOUND, description=(
        "open streams of one caller (a user with tokens; all unauthenticated health watchers "
        "together; without tokens_file only max_streams applies); one more is "
        "RESOURCE_EXHAUSTED"))
    max_message_mb: int = Field(64, ge=1, le=1024, description=(
        "largest gRPC message accepted (and sent), MiB: the request size limit of node "
        "events (ReportNodes, SyncNodes); every other method has a smaller one (1 MiB, or what "
        "its configured list limits need; docs/security.md); a larger request is answered "
        "RESOURCE_EXHAUSTED"))
    # Request size limits (offcut.taskspec.Limits): a request over one is answered
    # INVALID_ARGUMENT naming the field and the limit, and changes nothing.
    max_event_nodes: int = Field(200_000, ge=1, description=(
        "most node names in one ReportNodes (idle + preempted) or SyncNodes request (the "
        "whole idle set); more is INVALID_ARGUMENT"))
    max_idle_nodes: int = Field(200_000, ge=1, description=(
        "most nodes the idle pool may hold; a report that would grow it further is "
        "FAILED_PRECONDITION, a larger snapshot INVALID_ARGUMENT"))
    max_task_nodes: int = Field(200_000, ge=1, description=(
        "largest max_nodes of a submitted task (its objective table has max_nodes + 1 "
        "entries); larger is INVALID_ARGUMENT"))
    max_curve_points: int = Field(100_000, ge=2, description=(
        "most points (node_counts) of a task's scalability curve; more is INVALID_ARGUMENT"))
    max_command_args: int = Field(4096, ge=0, description=(
        "most arguments of a task's command (each at most 65,536 characters); more is "
        "INVALID_ARGUMENT"))
    max_command_bytes: int = Field(1_048_576, ge=0, description=(
        "most UTF-8 bytes of all arguments of a task's command together; more is "
        "INVALID_ARGUMENT"))
    max_batch_sizes: int = Field(1024, ge=1, description=(
        "most batch sizes of one Zeus job (RegisterJob); more is INVALID_ARGUMENT"))
    max_power_limits: int = Field(1000, ge=1, description=(
        "most power limits one Zeus power profile walks through ((max_power_limit_w - "
        "min_power_limit_w) / step_w + 1); more is INVALID_ARGUMENT"))
    max_progress_reports: int = Field(10_000, ge=1, description=(
        "most reports in one ReportProgress request; more is INVALID_ARGUMENT"))
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    node_listen: str | None = Field(
        None, examples=["unix:///run/offcut/node.sock"], description=(
            "a second unix socket for Slurm's node events only (NodeEvents: the prolog/epilog "
            "hooks and the watcher), mode 0600 (the daemon's user, SlurmUser, and root), served "
            "on an event loop and MUNGE decoding threads of its own, so that no user's calls on "
            "listen can delay a node event (docs/security.md, \"Round two: junk credentials\"); "
            "unset = node events share listen"))
    metrics_listen: str | None = Field(
        None, examples=["127.0.0.1:9464"],
        description="HOST:PORT of the Prometheus /metrics endpoint (HTTP, no "
                          "authentication; port 0 = any free port); unset = no endpoint")
    tokens_file: str | None = Field(
        None, examples=["/etc/offcut/tokens.toml"],
        description="bearer tokens -> user and role (admin | slurm | user), mode 0600 (offcut token new "
                    "adds one); unset = no authentication: whoever can open the socket is admin")
    munge: bool = Field(False, description=(
        "identify callers by MUNGE credentials, as Slurm does (authorization: MUNGE CRED, one "
        "per call): local users and jobs on any node of the cluster need no token; the unix "
        "socket then has mode 0666 (every call is authenticated); tokens_file may be set "
        "too, for remote clients and service roles (docs/security.md)"))
    munge_socket: str | None = Field(None, examples=["/run/munge/munge.socket.2"], description=(
        "munged's socket on the daemon's host; unset = /run/munge/munge.socket.2"))
    refusal_delay_s: float = Field(1.0, ge=0.0, le=10.0, description=(
        "how long a call that proves nobody (no, an unknown or a refused token or MUNGE "
        "credential) waits for its UNAUTHENTICATED answer, s (0 = at once; as PAM's "
        "pam_faildelay): a sender of junk credentials gets at most its calls in flight "
        "answered per delay; at most 1024 calls are held at once per socket, more are "
        "answered at once (docs/security.md, \"Round two: junk credentials\")"))
    slurm_user: str = Field("slurm", min_length=1, max_length=200, description=(
        "Slurm's SlurmUser (slurm.conf): its MUNGE credentials get the slurm role (the "
        "prolog/epilog hooks, the watcher and the launcher); root's get admin"))
    admin_users: list[str] = Field(default_factory=list, max_length=1000, examples=[["alice"]],
                                   description="users whose MUNGE credentials get the admin role")
    admin_groups: list[str] = Field(default_factory=list, max_length=1000, examples=[["hpcadmin"]],
                                    description="groups whose members' MUNGE credentials get the "
                                                "admin role")
    clock: Literal["live", "replay"] = Field(
        "live", description=(
            "live: every event is applied at the daemon's own receive time, and times in "
            "requests are data (docs/security.md); replay: an admin's event times drive the "
            "clock, for replays of recorded logs (offcut replay starts its daemon so)"))
    insecure_local: bool = Field(
        False, description="accept TCP without tokens_file (loopback only): every local user "
                           "who can reach the port is then admin; refused unless set, and logged "
                           "as a warning at start")
    tls_cert: str | None = Field(None, examples=["/etc/offcut/tls/cert.pem"],
                                 description="PEM certificate (chain) for TCP with TLS; with tls_key")
    tls_key: str | None = Field(None, examples=["/etc/offcut/tls/key.pem"],
                                description="PEM private key of tls_cert (mode 0600)")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig,
                               description="the Slurm launcher's site settings")
    power: PowerConfig = Field(default_factory=PowerConfig,
                               description="power figures of the nodes (energy objectives)")

    @model_validator(mode="after")
    def _check_zeus_rows(self) -> "DaemonConfig":
        if self.zeus_trial_rows_retention < self.zeus_trial_retention:
            raise ValueError(
                f"zeus_trial_rows_retention ({self.zeus_trial_rows_retention}) must be at least "
                f"zeus_trial_retention ({self.zeus_trial_retention}): records held in memory "
                "stay in the state file")
        return self

    @field_validator("listen")
    @classmethod
    def _listen_path(cls, value: str) -> str:
        """A bare socket path means that unix socket (``unix://`` + absolute path)."""
        return normalize_address(value)

    @field_validator("node_listen")
    @classmethod
    def _node_listen_path(cls, value: str | None) -> str | None:
        """A unix socket only (its file mode is what keeps users off it)."""
        if value is None:
            return None
        value = normalize_address(value)
        if not value.startswith("unix:"):
            raise ValueError(f"node_listen {value} must be a unix socket (unix:///path.sock): "
                             "its mode 0600 is what keeps every other user off it")
        return value

    @model_validator(mode="after")
    def _check_transport(self) -> "DaemonConfig":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (give both or neither)")
        if self.node_listen is not None and self.node_listen == self.listen:
            raise ValueError(f"node_listen {self.node_listen} is listen's socket; give it a path "
                             "of its own (or leave it unset)")
        if self.listen.startswith("unix:"):
            if self.tls_cert is not None:
                raise ValueError("tls_cert/tls_key are for TCP; a unix socket is protected by its "
                                 "file mode")
            return self
        try:
            host, _ = split_host_port(self.listen)
        except ValueError as exc:
            raise ValueError(f"listen: {exc}") from None
        if self.tls_cert is None and not is_loopback(host):
            raise ValueError(f"listen {self.listen} is reachable from other hosts: set tls_cert "
                             "and tls_key (TCP needs TLS), or listen on 127.0.0.1 or a unix socket")
        authenticated = self.tokens_file is not None or self.munge
        if not authenticated and not is_loopback(host):
            raise ValueError(f"listen {self.listen} is reachable from other hosts without "
                             "tokens_file or munge: anyone could connect as admin; set "
                             "tokens_file (offcut token new) or munge = true")
        if not authenticated and not self.insecure_local:
            raise ValueError(f"listen {self.listen} is TCP without tokens_file or munge: every "
                             "local user could connect as admin. Set tokens_file (offcut token "
                             "new) or munge = true, listen on a unix socket (mode 0600), or set "
                             "insecure_local = true (--insecure-local) to accept it")
        return self

    def limits(self):
        """The request size limits as the engine and the Zeus registry take them
        (:class:`offcut.taskspec.Limits`)."""
        from offcut.taskspec import Limits

        return Limits(**{name: getattr(self, name) for name in LIMIT_FIELDS})

    def check_policy(self) -> None:
        """Check that ``policy`` names an available allocation policy (a built-in or an
        installed entry point that loads). Raises
        :class:`offcut.daemon.app.policies.PolicyError` (a RuntimeError) whose message lists the
        available names. Done when the daemon starts, not when the file is read (the Slurm
        launcher reads this file too, where the policy's package may be absent)."""
        from offcut.daemon.app.policies import policy_class

        policy_class(self.policy)

    def objective_settings(self):
        """The allocation policy and power figures as the core takes them
        (:class:`offcut.daemon.app.model.ObjectiveSettings`; its ``objective`` is the policy's
        name). Checks the policy first (:meth:`check_policy`)."""
        from offcut.daemon.app.model import ObjectiveSettings

        self.check_policy()
        return ObjectiveSettings(
            objective=self.policy, eta=self.eta, node_power_w=self.power.node_power_w,
            idle_node_power_w=self.power.idle_node_power_w,
            node_max_power_w=self.power.node_max_power_w,
            prior_rate_per_node=self.prior_rate_per_node)

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value


#: file-only sections of offcut.toml -> their models
SECTIONS = {"slurm": SlurmConfig, "power": PowerConfig}


class ConfigError(ValueError):
    """The config file or a flag is invalid; the message names the key."""


def load_config(path: str | Path | None, overrides: dict) -> DaemonConfig:
    """Read ``path`` (TOML; optional) and apply ``overrides`` (flags, None = unset).

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown key or bad value.
    """
    data: dict = {}
    if path is not None:
        try:
            data = read_toml(path, "config")
        except TomlFileError as exc:
            raise ConfigError(str(exc)) from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return DaemonConfig(**data)
    except ValidationError as exc:
        msgs = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"invalid configuration ({path or 'flags'}): " + "; ".join(msgs)) from exc


def default_text(name: str, model: type[BaseModel] | None = None) -> str:
    """The documented default of option ``name`` of ``model`` (default: DaemonConfig):
    computed defaults described, None = ``unset``, otherwise its TOML form."""
    field = (model or DaemonConfig).model_fields[name]
    extra = field.json_schema_extra or {}
    if "default_doc" in extra:
        return str(extra["default_doc"])
    default = field.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    return _toml_value(default)


def _toml_value(value) -> str:
    """``value`` as TOML writes it (tomli-w), e.g. ``"a\\"b"``, ``true``; a list on one line,
    ``[1, 2]`` (a table cell of docs/configuration.md)."""
    import tomli_w

    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def flag_help(name: str) -> str:
    """Help text of the ``offcutd`` flag of option ``name``: ``[key] description (default)``."""
    field = DaemonConfig.model_fields[name]
    return f"[{name}] {field.description} (default: {default_text(name)})"


def _scalar_fields(model: type[BaseModel]):
    return [(n, f) for n, f in model.model_fields.items()
            if not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))]


def _toml_lines(model: type[BaseModel], prefix: str = "") -> list[str]:
    lines = []
    for name, field in _scalar_fields(model):
        lines.append(f"# {field.description}")
        extra = field.json_schema_extra or {}
        if "default_doc" in extra or field.default is None:
            lines.append(f"# default: {default_text(name, model)}")
            example = _toml_value(field.examples[0]) if field.examples else '""'
            lines.append(f"# {name} = {example}")
        else:
            lines.append(f"{name} = {default_text(name, model)}")
        lines.append("")
    return lines


def reference_toml() -> str:
    """A commented ``offcut.toml`` listing every option with its default (options whose
    default is unset or computed are commented out)."""
    lines = ["# offcut.toml: offcutd settings (offcutd --config FILE; flags override the file).",
             "# Generated by `offcutd --print-config`; every key is optional.", ""]
    lines += _toml_lines(DaemonConfig)
    for section, model in SECTIONS.items():
        lines += [f"[{section}]  # " + DaemonConfig.model_fields[section].description, ""]
        lines += _toml_lines(model)
    return "\n".join(lines)


def reference_markdown() -> str:
    """``docs/configuration.md``: every option, its default and meaning, in one table."""
    lines = ["# offcutd configuration", "",
             "One TOML file (`offcutd --config /etc/offcut/offcut.toml`); every key is optional. "
             "The top-level keys are also `offcutd` flags (flags win); the sections are file "
             "only (`[slurm]` is also read by `offcut-slurm launch --config`). Unknown keys and bad "
             "values are refused at start with a message naming the key. This page is "
             "generated: `offcutd --print-config markdown > docs/configuration.md` (a test "
             "checks it is fresh); `offcutd --print-config toml` prints a commented TOML file "
             "to start from.", "",
             "| key | default | meaning |", "|---|---|---|"]
    for model, prefix in ((DaemonConfig, ""), *((m, f"{k}.") for k, m in SECTIONS.items())):
        for name, field in _scalar_fields(model):
            desc = field.description.replace("|", "\\|")
            lines.append(f"| `{prefix}{name}` | `{default_text(name, model)}` | {desc} |")
    return "\n".join(lines) + "\n"

"""``offcut-slurm``: the programs that run beside Slurm.

    offcut-slurm watch          poll Slurm, send idle-set snapshots to the daemon
    offcut-slurm idle           print the idle set the watcher would send (no daemon)
    offcut-slurm install-hooks  write the PrologSlurmctld / EpilogSlurmctld wrappers
    offcut-slurm launch         run the daemon's placements as Slurm jobs
    offcut-slurm power-helper   the node's privileged GPU power-limit helper (zeusd's API)
    offcut-slurm power-restore  node Epilog: restore the ending job's GPU power limits
    offcut-slurm install-power-epilog  write the node Epilog wrapper of power-restore

Run ``offcut-slurm COMMAND --help`` for the options.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(add_completion=False, rich_markup_mode=None, no_args_is_help=True,
                  help="Offcut beside Slurm: the idle-node watcher, the Slurm hooks and the launcher.")

ADDRESS_HELP = "daemon address (unix:///path.sock or HOST:PORT) [default: $OFFCUT_ADDRESS, else the local socket]"
PART_HELP = ("partition(s) of Offcut's own jobs (repeat or comma-separate): their jobs are "
             "Offcut's, their nodes are the ones Offcut may use, hooks skip their jobs")
PREFIX_HELP = "Offcut's jobs also need this job-name prefix (e.g. offcut-) [default: any name]"
COMMENT_HELP = "Offcut's jobs also need this text in their comment [default: any comment]"
PYSLURM_HELP = ("auto: pyslurm when a version matching Slurm is installed and importable, else "
                "sinfo/squeue --json | never | require")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"offcut-slurm: {message}", err=True)
    raise typer.Exit(code)


def _setup_logging(log_file: Optional[Path], level: str) -> None:
    """Log ``offcut.slurm`` to ``log_file`` (rotated: 10 MiB, 3 old files kept) or stderr."""
    from logging.handlers import RotatingFileHandler

    handler: logging.Handler
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(log_file, maxBytes=10 << 20, backupCount=3,
                                      encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("offcut.slurm")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _cli(sinfo: str, squeue: str, slurm_conf: Optional[Path], timeout_s: float):
    from offcut.slurm_plugin.slurm_cli import SlurmCLI

    return SlurmCLI(sinfo=sinfo, squeue=squeue, slurm_conf=str(slurm_conf) if slurm_conf else None,
                    timeout_s=timeout_s)


def _rule(partitions: List[str], prefix: str, comment: str):
    from offcut.slurm_plugin.nodelist import partition_set
    from offcut.slurm_plugin.slurm_json import OwnJobRule

    parts = partition_set(partitions)
    return parts, OwnJobRule(partitions=parts, name_prefix=prefix, comment_marker=comment)


@app.command()
def watch(
    address: Optional[str] = typer.Option(None, "--address", "-a", envvar="OFFCUT_ADDRESS", help=ADDRESS_HELP),
    interval_s: float = typer.Option(30.0, "--interval-s", help="seconds between observations of Slurm"),
    resync_s: float = typer.Option(600.0, "--resync-s", help="an unchanged idle set is sent again only this many seconds after the last one sent (the periodic repair); 0: send every observation"),
    once: bool = typer.Option(False, "--once", help="send one snapshot and exit (status 1 if none was accepted)"),
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="deadline of each daemon call [s]"),
    source: str = typer.Option("slurm-watch", "--source", help="event source name (one per watcher)"),
    scavenger_partition: List[str] = typer.Option(["scavenger"], "--scavenger-partition", help=PART_HELP),
    job_name_prefix: str = typer.Option("", "--job-name-prefix", help=PREFIX_HELP),
    job_comment: str = typer.Option("", "--job-comment", help=COMMENT_HELP),
    sinfo: str = typer.Option("sinfo", "--sinfo", help="the sinfo command (name in PATH or path)"),
    squeue: str = typer.Option("squeue", "--squeue", help="the squeue command (name in PATH or path)"),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf", envvar="SLURM_CONF", help="slurm.conf for the Slurm commands"),
    slurm_timeout_s: float = typer.Option(20.0, "--slurm-timeout-s", help="limit per Slurm query [s]"),
    pyslurm: str = typer.Option("auto", "--pyslurm", help=PYSLURM_HELP),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="file holding a bearer token for the daemon"),
    tls_ca: Optional[Path] = typer.Option(None, "--tls-ca", help="PEM of the CA to trust for a TCP address [default: $OFFCUT_TLS_CA]"),
    munge_socket: Optional[Path] = typer.Option(None, "--munge-socket", envvar="OFFCUT_MUNGE_SOCKET", help="munged's socket: without a token, calls carry a MUNGE credential when munged runs [default: /run/munge/munge.socket.2]"),
    dry_run: bool = typer.Option(False, "--dry-run", help="observe and log, send nothing"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="log here instead of stderr"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Poll Slurm and send the daemon the set of nodes idle for Offcut (SyncNodes) when it
    changed, and every --resync-s seconds when it did not.

    A node is idle when Slurm has it idle, or busy only with Offcut's own jobs (jobs in a
    --scavenger-partition, with --job-name-prefix / --job-comment when given) that Slurm is not
    preempting; down, drained/draining, reserved, maintenance, not-responding, powered-down,
    planned and failing nodes never are, nor nodes outside the scavenger partition(s).

    Example: offcut-slurm watch --address unix:///run/offcut/offcutd.sock --interval-s 30
    """
    from offcut.addresses import default_socket
    from offcut.channel import token_from_file
    from offcut.errors import InvalidArgument
    from offcut.retry import Backoff
    from offcut.slurm_plugin.rpc import NodeEventSender
    from offcut.slurm_plugin.slurm_json import SlurmError
    from offcut.slurm_plugin.sources import choose_source
    from offcut.slurm_plugin.watcher import Watcher

    if interval_s <= 0 or timeout_s <= 0:
        _fail("--interval-s and --timeout-s must be > 0")
    if resync_s < 0:
        _fail("--resync-s must be >= 0")
    _setup_logging(log_file, log_level)
    log = logging.getLogger("offcut.slurm.watch")
    parts, rule = _rule(scavenger_partition, job_name_prefix, job_comment)
    cli = _cli(sinfo, squeue, slurm_conf, slurm_timeout_s)
    try:
        src = choose_source(cli, pyslurm, log)
    except (SlurmError, ValueError) as exc:
        _fail(str(exc))
    sender = None
    if not dry_run:
        try:
            token = token_from_file(str(token_file), "--token-file") if token_file else None
            sender = NodeEventSender(address or default_socket(), timeout_s=timeout_s,
                                     token=token, tls_ca=str(tls_ca) if tls_ca else None,
                                     munge_socket=str(munge_socket) if munge_socket else None,
                                     retry=Backoff(deadline_s=timeout_s))
        except InvalidArgument as exc:
            _fail(str(exc).replace("tls_ca:", "--tls-ca:", 1))
    w = Watcher(src, sender, rule=rule, node_partitions=parts, source_name=source,
                resync_s=resync_s)
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        log.info("watching Slurm every %g s (source %s, daemon %s)", interval_s, source,
                 "dry run" if sender is None else sender.address)
    try:
        ok = w.run(interval_s, once=once, stop=stop)
    finally:
        if sender is not None:
            sender.close()
    if once and not ok:
        raise typer.Exit(1)


@app.command()
def idle(
    scavenger_partition: List[str] = typer.Option(["scavenger"], "--scavenger-partition", help=PART_HELP),
    job_name_prefix: str = typer.Option("", "--job-name-prefix", help=PREFIX_HELP),
    job_comment: str = typer.Option("", "--job-comment", help=COMMENT_HELP),
    sinfo: str = typer.Option("sinfo", "--sinfo"),
    squeue: str = typer.Option("squeue", "--squeue"),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf", envvar="SLURM_CONF"),
    slurm_timeout_s: float = typer.Option(20.0, "--slurm-timeout-s"),
) -> None:
    """Print, as JSON, which nodes are idle for Offcut now and why the others are not."""
    from offcut.slurm_plugin.slurm_json import SlurmError
    from offcut.slurm_plugin.sources import CLISource, observe

    parts, rule = _rule(scavenger_partition, job_name_prefix, job_comment)
    try:
        obs = observe(CLISource(_cli(sinfo, squeue, slurm_conf, slurm_timeout_s)), rule,
                      node_partitions=parts)
    except SlurmError as exc:
        _fail(str(exc), 1)
    typer.echo(json.dumps({"time_ns": obs.time_ns, "idle": obs.view.idle,
                           "not_idle": obs.view.not_idle}, indent=1))


@app.command("install-hooks")
def install_hooks(
    directory: Path = typer.Option(..., "--dir", help="folder for prolog_ctld.sh / epilog_ctld.sh"),
    address: str = typer.Option(..., "--address", "-a", help="daemon address, as reachable by slurmctld's host"),
    timeout_s: float = typer.Option(2.0, "--timeout-s", help="hooks' bound on the daemon calls [s]"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="hooks' log [default: DIR/offcut-hooks.log]; must be writable by SlurmUser"),
    scavenger_partition: List[str] = typer.Option(["scavenger"], "--scavenger-partition", help=PART_HELP),
    job_name_prefix: str = typer.Option("", "--job-name-prefix", help=PREFIX_HELP),
    job_comment: str = typer.Option("", "--job-comment", help=COMMENT_HELP),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf", help="slurm.conf for the epilog's check [default: $SLURM_CONF or /etc/slurm/slurm.conf]"),
    no_check: bool = typer.Option(False, "--no-check", help="epilog reports the job's nodes idle without asking Slurm"),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="file holding a bearer token (readable by SlurmUser, mode 0600)"),
    tls_ca: Optional[Path] = typer.Option(None, "--tls-ca", help="PEM of the CA to trust when --address is TCP (the daemon's TLS)"),
    munge_socket: Optional[Path] = typer.Option(None, "--munge-socket", help="munged's socket, when not /run/munge/munge.socket.2: without --token-file the hooks identify themselves (as SlurmUser) with MUNGE"),
    python: Optional[Path] = typer.Option(None, "--python", help="interpreter with offcut installed [default: this one]"),
) -> None:
    """Write the PrologSlurmctld / EpilogSlurmctld wrappers and print the slurm.conf lines.

    Example: offcut-slurm install-hooks --dir /etc/slurm/offcut --address unix:///run/offcut/offcutd.sock
    """
    from offcut.slurm_plugin.install import HookConfig, slurm_conf_lines, write_hooks
    from offcut.slurm_plugin.nodelist import partition_set

    if timeout_s <= 0:
        _fail("--timeout-s must be > 0")
    kw = {}
    if python:
        kw["python"] = str(python.absolute())
    cfg = HookConfig(address=address, timeout_s=timeout_s,
                     log_file=str(log_file) if log_file else None,
                     scavenger_partitions=sorted(partition_set(scavenger_partition)),
                     slurm_conf=str(slurm_conf) if slurm_conf else None,
                     token_file=str(token_file) if token_file else None,
                     tls_ca=str(tls_ca) if tls_ca else None, check=not no_check,
                     munge_socket=str(munge_socket) if munge_socket else None,
                     job_name_prefix=job_name_prefix, job_comment=job_comment, **kw)
    paths = write_hooks(directory, cfg)
    for p in paths.values():
        typer.echo(f"wrote {p}", err=True)
    typer.echo("# add to slurm.conf, then `scontrol reconfigure`:")
    for line in slurm_conf_lines(paths, timeout_s):
        typer.echo(line)


@app.command()
def launch(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="the daemon's offcut.toml: its [slurm] section gives partition, account, job name prefix, signal and lead time, command template, sbatch args [default: the defaults of docs/configuration.md]"),
    address: Optional[str] = typer.Option(None, "--address", "-a", envvar="OFFCUT_ADDRESS", help=ADDRESS_HELP + "; also given to the jobs as OFFCUT_ADDRESS [default: the config's listen]"),
    poll_s: float = typer.Option(5.0, "--poll-s", help="seconds between passes when no placement changes (jobs ending are seen then)"),
    once: bool = typer.Option(False, "--once", help="one reconciliation pass, print what it did as JSON, exit"),
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="deadline of each daemon call [s]"),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf", envvar="SLURM_CONF", help="slurm.conf for the Slurm commands"),
    slurm_timeout_s: float = typer.Option(20.0, "--slurm-timeout-s", help="limit per Slurm command [s]"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="log here instead of stderr"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Make the daemon's placements real: one Slurm job per (task, node) in the preemptible
    partition; shrinking cancels jobs, growing submits more; ended jobs are reported to the
    daemon (finished completes the task, failed fails it). A restarted launcher adopts the
    running jobs and submits nothing twice. Each task's jobs run as the task's owner (sbatch
    --uid/--gid, so run the launcher as root); a task whose owner has no local account, is
    root or a system account is not launched and fails with the reason (docs/security.md).

    \b
    Examples:
      offcut-slurm launch --config /etc/offcut/offcut.toml
      offcut-slurm launch --once --address unix:///run/offcut/offcutd.sock
    """
    from offcut.client import Client
    from offcut.client.retry import RetryPolicy
    from offcut.daemon.config import ConfigError, load_config
    from offcut.errors import OffcutError
    from offcut.slurm_plugin.launcher import Launcher
    from offcut.slurm_plugin.launcher_key import LauncherKey, LauncherKeyError
    from offcut.slurm_plugin.slurm_cli import SlurmCLI
    from offcut.slurm_plugin.slurm_json import SlurmError

    if poll_s <= 0 or timeout_s <= 0:
        _fail("--poll-s and --timeout-s must be > 0")
    try:
        cfg = load_config(config, {})
    except ConfigError as exc:
        _fail(str(exc))
    _setup_logging(log_file, log_level)
    log = logging.getLogger("offcut.slurm.launcher")
    cli = SlurmCLI(slurm_conf=str(slurm_conf) if slurm_conf else None, timeout_s=slurm_timeout_s)
    try:  # refused at once, with one line, rather than on every pass
        key = LauncherKey.load(cfg.slurm.launcher_key)
        # idempotent calls (reads, node events, run reports with their request ids) ride
        # through a daemon restart, as the researcher's client's do (offcut.client.retry)
        client = Client(address or cfg.listen, timeout_s=timeout_s,
                        retry=RetryPolicy(deadline_s=timeout_s))
    except (LauncherKeyError, OffcutError) as exc:  # an unsafe key; a token without TLS ...
        _fail(str(exc))
    with client:
        launcher = Launcher(client, cfg.slurm, cli, key=key)
        if once:
            try:
                result = launcher.reconcile()
            except (OffcutError, SlurmError) as exc:
                _fail(str(exc), 1)
            typer.echo(json.dumps(result.__dict__, indent=1))
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        log.info("launching placements of %s as jobs in partition %s (poll %g s)",
                 client.address, cfg.slurm.partition, poll_s)
        launcher.run(poll_s, stop)


# ----------------------------------------------------------------------------- GPU power limits
POWER_GPUS_HELP = ("the node's GPUs: nvml (nvidia-ml-py), or fake:FILE, the recording stand-in "
                   "for tests and GPU-less nodes (slurm_plugin/gpu_backends.py)")
POWER_STATE_HELP = "the record of the limits the helper changed, per job (JSON, mode 0600)"



@app.command("power-helper")
def power_helper(
    socket_path: Path = typer.Option(Path("/run/offcut/power.sock"), "--socket", help="unix socket to listen on (its folder must be root's and writable by root only)"),
    socket_mode: str = typer.Option("666", "--socket-mode", help="the socket's mode, octal: 666 lets every job connect; each call is authorised by its caller's credentials (SO_PEERCRED) and Slurm"),
    gpus: str = typer.Option("nvml", "--gpus", help=POWER_GPUS_HELP),
    node: Optional[str] = typer.Option(None, "--node", help="this node's Slurm name [default: the short host name]"),
    state: Path = typer.Option(Path("/run/offcut/power-records.json"), "--state", help=POWER_STATE_HELP),
    job_lookup: str = typer.Option("auto", "--job-lookup", help="how a caller's job is found: auto (stepd, then cgroup) | stepd (its root slurmstepd ancestor) | cgroup (Slurm's cgroup) | scontrol (scontrol pidinfo)"),
    cache_s: float = typer.Option(5.0, "--cache-s", help="seconds a job's description from scontrol is reused"),
    max_connections: int = typer.Option(64, "--max-connections", help="connections of users other than root served at once (one more is answered 503; root's are never refused)"),
    max_per_user: int = typer.Option(16, "--max-connections-per-user", help="connections of one user (not root) served at once"),
    idle_timeout_s: float = typer.Option(10.0, "--idle-timeout-s", help="a connection idle this long is closed [s]"),
    scontrol: str = typer.Option("scontrol", "--scontrol", help="the scontrol command (name in PATH or path)"),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf", envvar="SLURM_CONF", help="slurm.conf for scontrol"),
    slurm_timeout_s: float = typer.Option(5.0, "--slurm-timeout-s", help="limit per scontrol call [s]"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="log here (rotated) instead of stderr"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve zeusd's HTTP API on a unix socket, so that Zeus (ZEUSD_SOCK_PATH) and Offcut's
    training side set GPU power limits without root: root may set any GPU, any other caller
    only the GPUs its own running Slurm job holds on this node (docs/security.md, "GPU power
    limits"). Runs as root on every GPU node; the node Epilog (install-power-epilog)
    restores the defaults when a job ends.

    Example: offcut-slurm power-helper --log-file /var/log/offcut/power-helper.log
    """
    import socket as socket_mod

    from offcut.slurm_plugin.gpu_backends import GpuError, open_backend
    from offcut.slurm_plugin.job_gpus import JobDirectory
    from offcut.slurm_plugin.power_helper import PowerHelper, PowerHelperServer, PowerRecords
    from offcut.slurm_plugin.slurm_cli import SlurmCLI

    try:
        mode = int(socket_mode, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        _fail(f"--socket-mode: {socket_mode!r} is not an octal mode such as 666")
    if (cache_s < 0 or max_connections < 1 or max_per_user < 1 or idle_timeout_s <= 0
            or slurm_timeout_s <= 0):
        _fail("--cache-s must be >= 0, --max-connections(-per-user) >= 1, the timeouts > 0")
    if gpus == "nvml" and os.geteuid() != 0:
        _fail("power-helper --gpus nvml must run as root (setting a power limit needs it)")
    _setup_logging(log_file, log_level)
    log = logging.getLogger("offcut.slurm.power")
    try:
        backend = open_backend(gpus)
        jobs = JobDirectory(SlurmCLI(scontrol=scontrol, timeout_s=slurm_timeout_s,
                                     slurm_conf=str(slurm_conf) if slurm_conf else None),
                            method=job_lookup, ttl_s=cache_s)
    except (ValueError, GpuError) as exc:
        _fail(str(exc))
    name = node or socket_mod.gethostname().split(".")[0]
    helper = PowerHelper(backend, jobs, name, PowerRecords(state))
    try:
        server = PowerHelperServer(helper, str(socket_path), mode=mode,
                                   max_connections=max_connections,
                                   max_per_user=max_per_user, idle_timeout_s=idle_timeout_s)
    except (OSError, ValueError) as exc:
        backend.close()
        _fail(str(exc))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("power helper of node %s on %s (mode %04o, %d GPUs, %s)", name, socket_path, mode,
             backend.count(), gpus)
    try:
        stop.wait()
    finally:
        server.stop()
        backend.close()
        log.info("power helper stopped")


@app.command("power-restore")
def power_restore(
    socket_path: Path = typer.Option(Path("/run/offcut/power.sock"), "--socket", help="the power helper's socket"),
    gpus: str = typer.Option("nvml", "--gpus", help=POWER_GPUS_HELP + "; used only when the helper cannot be reached"),
    state: Path = typer.Option(Path("/run/offcut/power-records.json"), "--state", help=POWER_STATE_HELP),
    job_id: Optional[str] = typer.Option(None, "--job-id", envvar="SLURM_JOB_ID", help="the ending job [default: $SLURM_JOB_ID]"),
    job_gpus: Optional[str] = typer.Option(None, "--job-gpus", envvar="SLURM_JOB_GPUS", help="its GPUs on this node, e.g. 0,1 [default: $SLURM_JOB_GPUS]"),
    node: Optional[str] = typer.Option(None, "--node", help="the helper's node name, only where several slurmd share a host: the epilog of another node ($SLURMD_NODENAME) does nothing"),
    timeout_s: float = typer.Option(5.0, "--timeout-s", help="bound on the call to the helper [s]; the whole run is bounded by 3x this + 5 s"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="log here (rotated) instead of stderr"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Node Epilog (as root, at every job end: finished, cancelled, preempted, killed):
    restore the default power limit of every GPU of the ending job (SLURM_JOB_GPUS and the
    helper's record) through the helper, or directly when the helper is not running. Safe when
    nothing changed. Always exits 0 (errors are logged), so a node is never drained for it."""
    from offcut.slurm_plugin.power_helper import epilog_restore

    try:
        _setup_logging(log_file, log_level)
    except OSError as exc:
        typer.echo(f"offcut-slurm power-restore: log file: {exc}", err=True)
    log = logging.getLogger("offcut.slurm.power-restore")
    limit = max(1, int(3 * max(timeout_s, 0.1) + 5))

    def _watchdog(*_):
        log.error("job %s: no result within %d s; exiting 0", job_id, limit)
        logging.shutdown()
        os._exit(0)

    signal.signal(signal.SIGALRM, _watchdog)
    signal.alarm(limit)
    try:
        line = epilog_restore(job_id, job_gpus, socket_path=str(socket_path), backend_spec=gpus,
                              state=str(state), node=node,
                              this_node=os.environ.get("SLURMD_NODENAME"),
                              timeout_s=max(timeout_s, 0.1))
        (log.error if line.startswith("error:") else log.info)("%s", line)
    except Exception:  # noqa: BLE001 - an epilog must exit 0
        log.exception("job %s: restore failed", job_id)
    finally:
        signal.alarm(0)
    raise typer.Exit(0)


@app.command("install-power-epilog")
def install_power_epilog(
    directory: Path = typer.Option(..., "--dir", help="folder for epilog_power.sh (root's)"),
    socket_path: Path = typer.Option(Path("/run/offcut/power.sock"), "--socket", help="the power helper's socket"),
    gpus: str = typer.Option("nvml", "--gpus", help=POWER_GPUS_HELP),
    state: Path = typer.Option(Path("/run/offcut/power-records.json"), "--state", help=POWER_STATE_HELP),
    node: Optional[str] = typer.Option(None, "--node", help="see power-restore --node (test clusters only)"),
    timeout_s: float = typer.Option(5.0, "--timeout-s", help="bound on the call to the helper [s]"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="the epilog's log [default: DIR/offcut-power-epilog.log]"),
    python: Optional[Path] = typer.Option(None, "--python", help="interpreter with offcut installed [default: this one]"),
) -> None:
    """Write the node Epilog wrapper (epilog_power.sh) that runs power-restore, and print the
    slurm.conf line.

    Example: offcut-slurm install-power-epilog --dir /etc/slurm/offcut
    """
    from offcut.slurm_plugin.install import (PowerEpilogConfig, power_epilog_conf_line,
                                             write_power_epilog)

    if timeout_s <= 0:
        _fail("--timeout-s must be > 0")
    kw = {"python": str(python.absolute())} if python else {}
    path = write_power_epilog(directory, PowerEpilogConfig(
        socket=str(socket_path), gpus=gpus, state=str(state), node=node, timeout_s=timeout_s,
        log_file=str(log_file) if log_file else None, **kw))
    typer.echo(f"wrote {path}", err=True)
    typer.echo("# add to slurm.conf on every GPU node (or call the script from your Epilog), "
               "then `scontrol reconfigure`:")
    typer.echo(power_epilog_conf_line(path))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())

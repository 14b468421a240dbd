"""``offcutd``: the Offcut daemon.

Examples::

    offcutd                                   # unix socket, default state file, solver dp
    offcutd --config /etc/offcut/offcut.toml
    offcutd --listen 127.0.0.1:50051 --state /var/lib/offcut/state.sqlite --solver cbc
    offcutd check --state /var/lib/offcut/state.sqlite     # start-up checks, read-only
    offcutd backup --state /var/lib/offcut/state.sqlite --to /backup/state.sqlite
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import List, Optional

import typer

from offcut.daemon.config import (ConfigError, DaemonConfig, flag_help, load_config,
                                   reference_markdown, reference_toml)

EPILOG = """Examples:

  offcutd                                       (unix socket, default state file, solver dp)

  offcutd --config /etc/offcut/offcut.toml

  offcutd --listen 127.0.0.1:50051 --state /var/lib/offcut/state.sqlite --solver cbc

  offcutd --policy fair_share                   (max-min fair node-hours per task owner)

  offcutd --metrics-listen 127.0.0.1:9464       (Prometheus scrapes http://127.0.0.1:9464/metrics)

  offcutd --print-config toml > /etc/offcut/offcut.toml   (every option with its default)

  offcutd check --state FILE                    (every start-up check of a state file, read-only)

  offcutd backup --state FILE --to COPY         (consistent 0600 copy, also while offcutd runs)

Each flag's config-file key is given in brackets; flags override the file."""

app = typer.Typer(add_completion=False, rich_markup_mode=None)


@app.callback(invoke_without_command=True, epilog=EPILOG)
def serve(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file"),
    listen: Optional[str] = typer.Option(None, help=flag_help("listen")),
    state: Optional[str] = typer.Option(None, help=flag_help("state")),
    solver: Optional[str] = typer.Option(None, help=flag_help("solver")),
    solver_time_limit_s: Optional[float] = typer.Option(None, "--time-limit", help=flag_help("solver_time_limit_s")),
    isolate_solver: Optional[bool] = typer.Option(None, "--isolate-solver/--in-process-solver", help=flag_help("isolate_solver")),
    solver_trip_after: Optional[int] = typer.Option(None, "--solver-trip-after", help=flag_help("solver_trip_after")),
    solver_cooldown_s: Optional[float] = typer.Option(None, "--solver-cooldown", help=flag_help("solver_cooldown_s")),
    tfwd_s: Optional[float] = typer.Option(None, "--tfwd", help=flag_help("tfwd_s")),
    max_running_tasks: Optional[int] = typer.Option(None, "--max-running-tasks", help=flag_help("max_running_tasks")),
    final_grace_s: Optional[float] = typer.Option(None, "--final-grace", help=flag_help("final_grace_s")),
    max_failed_generations: Optional[int] = typer.Option(None, "--max-failed-generations", help=flag_help("max_failed_generations")),
    finished_task_retention_s: Optional[float] = typer.Option(None, "--finished-task-retention-s", help=flag_help("finished_task_retention_s")),
    task_archive_retention_s: Optional[float] = typer.Option(None, "--task-archive-retention-s", help=flag_help("task_archive_retention_s")),
    journal_retention_s: Optional[float] = typer.Option(None, "--journal-retention-s", help=flag_help("journal_retention_s")),
    policy: Optional[str] = typer.Option(None, help=flag_help("policy")),
    eta: Optional[float] = typer.Option(None, help=flag_help("eta")),
    prior_rate_per_node: Optional[float] = typer.Option(None, help=flag_help("prior_rate_per_node")),
    snapshot_every: Optional[int] = typer.Option(None, help=flag_help("snapshot_every")),
    durability: Optional[str] = typer.Option(None, help=flag_help("durability")),
    zeus_trial_retention: Optional[int] = typer.Option(None, "--zeus-trial-retention", help=flag_help("zeus_trial_retention")),
    zeus_trial_rows_retention: Optional[int] = typer.Option(None, "--zeus-trial-rows-retention", help=flag_help("zeus_trial_rows_retention")),
    zeus_observation_retention: Optional[int] = typer.Option(None, "--zeus-observation-retention", help=flag_help("zeus_observation_retention")),
    max_zeus_jobs_per_owner: Optional[int] = typer.Option(None, "--max-zeus-jobs-per-owner", help=flag_help("max_zeus_jobs_per_owner")),
    max_active_tasks_per_owner: Optional[int] = typer.Option(None, "--max-active-tasks-per-owner", help=flag_help("max_active_tasks_per_owner")),
    max_retained_tasks_per_owner: Optional[int] = typer.Option(None, "--max-retained-tasks-per-owner", help=flag_help("max_retained_tasks_per_owner")),
    max_retained_task_bytes_per_owner: Optional[int] = typer.Option(None, "--max-retained-task-bytes-per-owner", help=flag_help("max_retained_task_bytes_per_owner")),
    zeus_request_retention_s: Optional[float] = typer.Option(None, "--zeus-request-retention-s", help=flag_help("zeus_request_retention_s")),
    record_instances: Optional[str] = typer.Option(None, "--record-instances", help=flag_help("record_instances")),
    max_streams: Optional[int] = typer.Option(None, "--max-streams", help=flag_help("max_streams")),
    max_streams_per_caller: Optional[int] = typer.Option(None, "--max-streams-per-caller", help=flag_help("max_streams_per_caller")),
    max_message_mb: Optional[int] = typer.Option(None, "--max-message-mb", help=flag_help("max_message_mb")),
    max_event_nodes: Optional[int] = typer.Option(None, help=flag_help("max_event_nodes")),
    max_idle_nodes: Optional[int] = typer.Option(None, help=flag_help("max_idle_nodes")),
    max_task_nodes: Optional[int] = typer.Option(None, help=flag_help("max_task_nodes")),
    max_curve_points: Optional[int] = typer.Option(None, help=flag_help("max_curve_points")),
    max_command_args: Optional[int] = typer.Option(None, help=flag_help("max_command_args")),
    max_command_bytes: Optional[int] = typer.Option(None, help=flag_help("max_command_bytes")),
    max_batch_sizes: Optional[int] = typer.Option(None, help=flag_help("max_batch_sizes")),
    max_power_limits: Optional[int] = typer.Option(None, help=flag_help("max_power_limits")),
    max_progress_reports: Optional[int] = typer.Option(None, help=flag_help("max_progress_reports")),
    log_level: Optional[str] = typer.Option(None, help=flag_help("log_level")),
    node_listen: Optional[str] = typer.Option(None, "--node-listen", help=flag_help("node_listen")),
    metrics_listen: Optional[str] = typer.Option(None, "--metrics-listen", help=flag_help("metrics_listen")),
    refusal_delay_s: Optional[float] = typer.Option(None, "--refusal-delay", help=flag_help("refusal_delay_s")),
    tokens_file: Optional[str] = typer.Option(None, "--tokens-file", help=flag_help("tokens_file")),
    insecure_local: Optional[bool] = typer.Option(None, "--insecure-local", help=flag_help("insecure_local")),
    munge: Optional[bool] = typer.Option(None, "--munge", help=flag_help("munge")),
    munge_socket: Optional[str] = typer.Option(None, "--munge-socket", help=flag_help("munge_socket")),
    slurm_user: Optional[str] = typer.Option(None, "--slurm-user", help=flag_help("slurm_user")),
    admin_users: Optional[List[str]] = typer.Option(None, "--admin-user", help=flag_help("admin_users") + " (repeat the flag for several)"),
    admin_groups: Optional[List[str]] = typer.Option(None, "--admin-group", help=flag_help("admin_groups") + " (repeat the flag for several)"),
    clock: Optional[str] = typer.Option(None, help=flag_help("clock")),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help=flag_help("tls_cert")),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help=flag_help("tls_key")),
    print_config: Optional[str] = typer.Option(None, "--print-config", help="print every option with its default and exit: toml (a commented offcut.toml to start from) | markdown (docs/configuration.md)"),
    init: bool = typer.Option(False, "--init", help="take an existing empty state file (0 bytes, or SQLite without tables) for a new state; without it such a file is refused (a missing file is always created)"),
) -> None:
    """Run the Offcut daemon until SIGTERM/SIGINT (without a command), or run one of the
    operator commands below on a state file."""
    if ctx.invoked_subcommand is not None:
        return
    if print_config is not None:
        _print_reference(print_config)
    # every parameter named like a DaemonConfig option is that option's flag
    flags = {k: v for k, v in locals().items() if k in DaemonConfig.model_fields
             and v != []}  # (a list flag not given is [], not None: the file's stays)
    _run(_settings(config, flags), init)


def _print_reference(fmt: str) -> None:
    """``--print-config``: print every option with its default as ``fmt`` (``toml`` or
    ``markdown``) and exit 0; exit 2 naming the flag for another format."""
    if fmt not in ("toml", "markdown"):
        typer.echo(f"offcutd: --print-config: {fmt!r} is not toml or markdown", err=True)
        raise typer.Exit(2)
    typer.echo(reference_toml() if fmt == "toml" else reference_markdown(), nl=False)
    raise typer.Exit(0)


def _settings(config: Optional[Path], flags: dict) -> DaemonConfig:
    """The daemon's settings: the file ``config`` (None: none) with ``flags`` over it, the
    allocation policy loaded; a bad setting or policy exits 2 with one line naming it."""
    try:
        cfg = load_config(config, flags)
    except ConfigError as exc:
        typer.echo(f"offcutd: {exc}", err=True)
        raise typer.Exit(2)
    from offcut.daemon.app.policies import PolicyError

    try:
        cfg.check_policy()  # an unknown or broken policy refuses the start, naming the others
    except PolicyError as exc:
        typer.echo(f"offcutd: policy: {exc}", err=True)
        raise typer.Exit(2)
    return cfg


def _run(cfg: DaemonConfig, init: bool) -> None:
    """Serve with ``cfg`` until SIGTERM/SIGINT, then stop; a start that fails (the state
    file, a socket, the solver) exits 1 with one line, no traceback. ``init``: ``--init``."""
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from offcut.daemon.edge.server import OffcutServer
    from offcut.daemon.app.state_file import StoreError
    from offcut.errors import OffcutError

    from offcut.daemon.edge.memory import fix_mmap_threshold

    fix_mmap_threshold()  # large requests' buffers go back to the system (daemon/edge/memory.py)
    try:
        server = OffcutServer(cfg, init=init)
    except (StoreError, RuntimeError, OSError, OffcutError) as exc:  # one line, no traceback
        typer.echo(f"offcutd: {exc}", err=True)
        raise typer.Exit(1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except (RuntimeError, OffcutError) as exc:  # e.g. metrics_listen cannot be bound
        typer.echo(f"offcutd: {exc}", err=True)
        raise typer.Exit(1)
    stop.wait()
    logging.getLogger("offcut.daemon").info("shutting down")
    server.stop()


@app.command()
def check(state: Path = typer.Option(..., "--state", help="the state file to check")) -> None:
    """Run every start-up check on a state file without changing it (works while offcutd
    runs); print the findings; exit 0 when offcutd would start on it, 1 otherwise."""
    from offcut.daemon.app.state_admin import check_state

    findings, ok = check_state(state)
    for line in findings:
        typer.echo(line)
    raise typer.Exit(0 if ok else 1)


@app.command()
def backup(state: Path = typer.Option(..., "--state", help="the state file to copy"),
           to: Path = typer.Option(..., "--to", help="the copy to write (mode 0600; must not exist)")) -> None:
    """Copy a state file consistently with SQLite's online backup (works while offcutd runs;
    restore by stopping offcutd and putting the copy in the state file's place)."""
    from offcut.daemon.app.state_admin import BackupError, backup_state

    try:
        pages = backup_state(state, to)
    except BackupError as exc:
        typer.echo(f"offcutd backup: {exc}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{state} -> {to} ({pages} pages)")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())

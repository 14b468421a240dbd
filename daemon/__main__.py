"""``offcutd``: the Offcut daemon.

Examples::

    offcutd                                   # unix socket, default state file, solver auto
    offcutd --config /etc/offcut/offcut.toml
    offcutd --listen 127.0.0.1:50051 --state /var/lib/offcut/state.sqlite --solver cbc
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

from offcut.daemon.config import ConfigError, load_config

EPILOG = """Examples:

  offcutd                                       (unix socket, default state file, solver auto)

  offcutd --config /etc/offcut/offcut.toml

  offcutd --listen 127.0.0.1:50051 --state /var/lib/offcut/state.sqlite --solver cbc

  offcutd --metrics-listen 127.0.0.1:9464       (Prometheus scrapes http://127.0.0.1:9464/metrics)

Each flag's config-file key is given in brackets; flags override the file."""

app = typer.Typer(add_completion=False, rich_markup_mode=None)


@app.command(epilog=EPILOG)
def serve(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file"),
    listen: Optional[str] = typer.Option(None, help="[listen] unix:///path.sock or HOST:PORT (default: unix://$XDG_RUNTIME_DIR/offcut/offcutd.sock)"),
    state: Optional[str] = typer.Option(None, help="[state] SQLite state file (default: $XDG_STATE_HOME/offcut/state.sqlite)"),
    solver: Optional[str] = typer.Option(None, help="[solver] auto | gurobi | cbc | dp | greedy (default: auto = gurobi when installed and the model fits its licence, else cbc)"),
    solver_time_limit_s: Optional[float] = typer.Option(None, "--time-limit", help="[solver_time_limit_s] limit per MILP solve, s; the incumbent is used when it is hit (default: 10)"),
    isolate_solver: Optional[bool] = typer.Option(None, "--isolate-solver/--in-process-solver", help="[isolate_solver] run MILP solves in a guarded child process (default: isolate)"),
    tfwd_s: Optional[float] = typer.Option(None, "--tfwd", help="[tfwd_s] BFTrainer look-ahead Tfwd, s (default: 10)"),
    max_running_tasks: Optional[int] = typer.Option(None, "--max-running-tasks", help="[max_running_tasks] maxJ: tasks admitted at once (default: 10)"),
    snapshot_every: Optional[int] = typer.Option(None, help="[snapshot_every] journal rows between state snapshots (default: 1000)"),
    durability: Optional[str] = typer.Option(None, help="[durability] full: fsync every commit (survives power loss) | normal: survives kill -9, ~1 ms/event faster (default: full)"),
    record_instances: Optional[str] = typer.Option(None, "--record-instances", help="[record_instances] append every allocation problem to this JSONL file (offcut solve re-solves it)"),
    max_message_mb: Optional[int] = typer.Option(None, "--max-message-mb", help="[max_message_mb] largest gRPC message accepted, MiB (default: 64)"),
    log_level: Optional[str] = typer.Option(None, help="[log_level] debug | info | warning | error (default: info)"),
    metrics_listen: Optional[str] = typer.Option(None, "--metrics-listen", help="[metrics_listen] HOST:PORT of the Prometheus /metrics endpoint (HTTP, no authentication; port 0 = any free port) (default: unset = no endpoint)"),
) -> None:
    """Run the Offcut daemon until SIGTERM/SIGINT."""
    try:
        cfg = load_config(config, dict(
            listen=listen, state=state, solver=solver, solver_time_limit_s=solver_time_limit_s,
            isolate_solver=isolate_solver, tfwd_s=tfwd_s, max_running_tasks=max_running_tasks,
            snapshot_every=snapshot_every, durability=durability, record_instances=record_instances,
            max_message_mb=max_message_mb, log_level=log_level, metrics_listen=metrics_listen))
    except ConfigError as exc:
        typer.echo(f"offcutd: {exc}", err=True)
        raise typer.Exit(2)
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from offcut.daemon.server import OffcutServer
    from offcut.daemon.store import StoreError

    try:
        server = OffcutServer(cfg)
    except (StoreError, RuntimeError, OSError) as exc:
        typer.echo(f"offcutd: {exc}", err=True)
        raise typer.Exit(1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except RuntimeError as exc:  # e.g. metrics_listen cannot be bound (state already closed)
        typer.echo(f"offcutd: {exc}", err=True)
        raise typer.Exit(1)
    stop.wait()
    logging.getLogger("offcut.daemon").info("shutting down")
    server.stop()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())

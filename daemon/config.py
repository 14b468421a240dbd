"""Daemon settings: one TOML file, every key also a ``offcutd`` flag (flags win).

Example ``offcut.toml``::

    listen = "unix:///run/offcut/offcutd.sock"   # or "127.0.0.1:50051" (TCP)
    state = "/var/lib/offcut/state.sqlite"
    solver = "auto"            # auto | gurobi | cbc | dp | greedy
    solver_time_limit_s = 10.0
    tfwd_s = 10.0              # BFTrainer's look-ahead Tfwd
    max_running_tasks = 10     # maxJ
    metrics_listen = "127.0.0.1:9464"   # Prometheus /metrics (unset: no endpoint)
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from offcut.addresses import default_socket
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


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


class DaemonConfig(BaseModel):
    """Validated daemon settings. Units: seconds."""

    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default_factory=default_socket,
                        description="unix:///path.sock (default) or HOST:PORT for TCP")
    state: str = Field(default_factory=default_state, description="SQLite state file")
    solver: Literal["auto", "gurobi", "cbc", "dp", "greedy"] = "auto"
    solver_time_limit_s: float = Field(10.0, gt=0, le=3600)
    isolate_solver: bool = Field(True, description="run MILP backends in a guarded child process")
    tfwd_s: float = Field(10.0, gt=0, le=86400, description="BFTrainer look-ahead Tfwd")
    max_running_tasks: int = Field(10, ge=1, le=100000, description="maxJ: tasks admitted at once")
    snapshot_every: int = Field(1000, ge=1, description="journal rows between snapshots")
    durability: Literal["full", "normal"] = Field(
        "full", description="full: fsync each commit (survives power loss); normal: survives kill -9")
    record_instances: str | None = Field(None, description="append every allocation problem (JSONL)")
    max_message_mb: int = Field(64, ge=1, le=1024, description="largest gRPC message accepted")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    metrics_listen: str | None = Field(
        None, description="HOST:PORT for the Prometheus /metrics endpoint; unset = no endpoint "
                          "(port 0 = any free port)")

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value


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
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return DaemonConfig(**data)
    except ValidationError as exc:
        msgs = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"invalid configuration ({path or 'flags'}): " + "; ".join(msgs)) from exc

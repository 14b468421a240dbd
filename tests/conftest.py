"""Shared fixtures: real daemons (``OffcutServer``) on unix sockets in a temporary folder."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from offcut.client import Client
from offcut.daemon.edge.auth import add_token
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from slurm_cluster import (cluster_daemon, slurm, slurm_site,  # noqa: F401 - fixtures
                           slurm_cluster)  # (real Slurm)


@pytest.fixture(autouse=True)
def _no_user_client_config(tmp_path_factory, monkeypatch):
    """The ``offcut`` commands read ``$XDG_CONFIG_HOME/offcut/client.toml``
    (offcut.client.settings): point it at an empty folder, so a developer's own file never
    changes a test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    # the Slurm launcher's key (offcut.slurm_plugin.launcher_key) goes to $XDG_STATE_HOME
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))


def _offcut_loggers() -> dict[str, logging.Logger]:
    return {name: lg for name, lg in logging.root.manager.loggerDict.items()
            if isinstance(lg, logging.Logger) and (name == "offcut" or name.startswith("offcut."))}


@pytest.fixture(autouse=True)
def _offcut_loggers_restored():
    """The ``offcut-slurm`` commands and the Slurm hooks configure their loggers as a process
    of their own does (a handler on stderr or a file, no propagation); a test that runs one
    in-process (typer's CliRunner) must not keep the log records of later tests from pytest's
    capture, nor leave a handler on a stream that runner has closed."""
    saved = {name: (lg.handlers[:], lg.propagate, lg.level)
             for name, lg in _offcut_loggers().items()}
    yield
    for name, lg in _offcut_loggers().items():
        handlers, propagate, level = saved.get(name, ([], True, logging.NOTSET))
        lg.handlers[:] = handlers
        lg.propagate = propagate
        lg.setLevel(level)


class Daemons:
    """Daemons of one test; ``clock``: their clock mode (``replay`` in tests marked
    ``replay_clock``, which drive the event clock with explicit times; else ``live``)."""

    def __init__(self, root: Path, clock: str = "live"):
        self.root = root
        self.clock = clock
        self.servers: list[OffcutServer] = []
        self.clients: list[Client] = []

    def config(self, name: str = "a", **kw) -> DaemonConfig:
        d = self.root / name
        d.mkdir(exist_ok=True)
        kw.setdefault("clock", self.clock)
        return DaemonConfig(listen=f"unix://{d}/s.sock", state=str(d / "state.sqlite"),
                            solver="dp", **kw)

    def start(self, name: str = "a", **kw) -> tuple[OffcutServer, Client]:
        cfg = self.config(name, **kw)
        srv = OffcutServer(cfg)
        srv.start()
        self.servers.append(srv)
        client = Client(cfg.listen, timeout_s=10)
        self.clients.append(client)
        client.wait_ready(10)
        return srv, client

    def stop(self, srv: OffcutServer) -> None:
        srv.stop(0.5)
        self.servers.remove(srv)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.stop(0.2)


@pytest.fixture
def daemons(tmp_path, request):
    d = Daemons(tmp_path, "replay" if request.node.get_closest_marker("replay_clock") else "live")
    yield d
    d.close()


@pytest.fixture
def daemon(daemons):
    return daemons.start()


@pytest.fixture
def user_tokens(tmp_path):
    """A private tokens file with an admin (``root-ops``) and the users alice and mallory;
    ``(path, {"admin" | "alice" | "mallory": token})`` (daemon_helpers.start_secured)."""
    path = tmp_path / "tokens.toml"
    made = {"admin": add_token(path, "root-ops", "admin"), "alice": add_token(path, "alice", "user"),
            "mallory": add_token(path, "mallory", "user")}
    return path, made




#: why the training tests skip without torch (an optional extra)
TORCH_REASON = ("torch is an optional extra of offcut.client.elastic (pip install '.[torch]', "
                "'.[examples]' for the example); not installed here")


@pytest.fixture
def torch():
    """The torch module; SKIPS the test without it."""
    return pytest.importorskip("torch", reason=TORCH_REASON)


@pytest.fixture
def example(torch):
    """The example's dependencies (torch, scikit-learn); SKIPS the test without them."""
    pytest.importorskip("sklearn", reason="the example trains on scikit-learn's digits "
                                          "(pip install '.[examples]')")

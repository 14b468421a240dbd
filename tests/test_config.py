"""The daemon's configuration: one documented place (the model), a fresh generated page,
a reference TOML that loads, one flag per option, clear errors."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offcut.daemon.__main__ import app as offcutd
from offcut.daemon.config import (ConfigError, DaemonConfig, PowerConfig, SlurmConfig, load_config,
                                  reference_markdown, reference_toml)

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_configuration_page_is_fresh():
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == reference_markdown(), (
        "docs/configuration.md is stale: run `offcutd --print-config markdown > docs/configuration.md`")


def test_every_option_is_described_and_has_a_flag():
    help_text = runner.invoke(offcutd, ["--help"], terminal_width=200).stdout
    for name, field in DaemonConfig.model_fields.items():
        assert field.description, f"{name} has no description"
        if name in ("slurm", "power"):  # file-only sections
            continue
        assert f"[{name}]" in help_text, f"offcutd has no flag for {name}"
        assert f"`{name}`" in reference_markdown()
    for name, field in SlurmConfig.model_fields.items():
        assert field.description and f"`slurm.{name}`" in reference_markdown()
    for name, field in PowerConfig.model_fields.items():
        assert field.description and f"`power.{name}`" in reference_markdown()


def test_reference_toml_loads_to_the_defaults(tmp_path):
    text = reference_toml()
    path = tmp_path / "offcut.toml"
    path.write_text(text)
    cfg = load_config(path, {})
    assert cfg == DaemonConfig()
    # uncommenting the examples gives a valid file too
    # (but tls_cert/tls_key: they are for TCP, the example listen is a unix socket)
    uncommented = "\n".join(line[2:] if re.match(r"# (?!tls_)[a-z_]+ = ", line) else line
                            for line in text.splitlines())
    data = tomllib.loads(uncommented)
    assert set(data) == set(DaemonConfig.model_fields) - {"tls_cert", "tls_key"}
    path.write_text(uncommented)
    cfg = load_config(path, {})
    assert cfg.metrics_listen == "127.0.0.1:9464" and cfg.slurm.account == "offcut"


def test_print_config_command():
    res = runner.invoke(offcutd, ["--print-config", "markdown"])
    assert res.exit_code == 0 and res.stdout == reference_markdown()
    res = runner.invoke(offcutd, ["--print-config", "yaml"])
    assert res.exit_code == 2 and "toml or markdown" in res.stderr


# (unknown keys and bad values of the other options: tests/test_daemon.py, in a subprocess)
@pytest.mark.parametrize("body,needle", [
    ("metrics_listen = \"nohost\"\n", "metrics_listen"),
    ("[slurm]\ncommand_template = \"{command} {gpu}\"\n", "slurm.command_template"),
    ("[slurm]\nqueue = \"x\"\n", "slurm.queue"),
    ("solver = \n", "offcut.toml"),
])
def test_bad_config_names_the_key(tmp_path, body, needle):
    path = tmp_path / "offcut.toml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=needle):
        load_config(path, {})
    res = runner.invoke(offcutd, ["--config", str(path)])
    assert res.exit_code == 2 and needle in res.stderr and "Traceback" not in res.output


def test_the_default_solver_is_dp_and_gurobi_without_gurobipy_is_refused(tmp_path, monkeypatch):
    """dp is the default (exact, the same on every install); asking for gurobi where gurobipy
    is missing stops offcutd with the reason, instead of answering with another backend, and
    leaves nothing held (the same state then starts with dp)."""
    from offcut.daemon.edge.server import OffcutServer
    from offcut.daemon.app.solvers import gurobi

    assert DaemonConfig().solver == "dp"
    monkeypatch.setattr(gurobi, "gurobi_importable", lambda: False)
    kw = dict(listen=f"unix://{tmp_path}/s.sock", state=str(tmp_path / "st" / "s.sqlite"))
    with pytest.raises(RuntimeError, match="solver = gurobi, but gurobipy is not installed"):
        OffcutServer(DaemonConfig(solver="gurobi", **kw)).start()
    srv = OffcutServer(DaemonConfig(**kw))
    srv.start()
    srv.stop(0.2)

"""The ``offcut`` CLI composed of the parts' commands (entry points of ``offcut.commands``,
offcut.client.cli): the installed parts' commands are all there in their order, a missing or
broken part says how to fix it instead of a traceback, and a third-party set adds commands
but takes over none."""

from __future__ import annotations

import re
import sys
from importlib.metadata import EntryPoint

import pytest
from typer.testing import CliRunner

from offcut.client import cli
from offcut.client.cli import app

GROUP = cli.ENTRY_POINT_GROUP


@pytest.fixture
def installed(monkeypatch):
    """Replace the installed entry points of ``offcut.commands`` by a given list."""
    def use(*eps: EntryPoint) -> None:
        monkeypatch.setattr(cli, "entry_points",
                            lambda group: [ep for ep in eps if ep.group == group])
        cli.command_sets.cache_clear()

    yield use
    monkeypatch.undo()
    cli.command_sets.cache_clear()


def _listed(help_text: str) -> list[str]:
    """The command names of ``offcut --help``, in their order."""
    section = help_text.split("Commands:", 1)[1]
    return re.findall(r"^  (\S+)", section, flags=re.MULTILINE)


def test_installed_parts_give_every_command_in_order():
    cli.command_sets.cache_clear()
    sets = {cs.name: cs for cs in cli.command_sets()}
    # the editable install registers both parts (pip install -e . after a change of pyproject.toml)
    assert sets["replay"].error is None and sets["daemon"].error is None, sets
    assert set(sets["replay"].commands) == {"demo", "solve", "report", "history", "sweep", "replay"}
    assert set(sets["daemon"].commands) == {"token"}
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0, res.output
    assert _listed(res.output) == list(cli.HELP_ORDER)
    res = CliRunner().invoke(app, ["replay", "--help"])
    assert res.exit_code == 0, res.output
    assert _listed(res.output) == ["bftrainer", "slurm-convert", "slurm", "zeus", "convert"]


@pytest.mark.parametrize("argv, what", [
    (["replay", "bftrainer", "--help"], "the replay"),
    (["replay"], "the replay"),
    (["demo", "--out", "x"], "the replay"),
    (["report", "folder"], "the replay"),
    (["solve", "--help"], "the replay"),
    (["token", "new", "--user", "alice", "--tokens-file", "t.toml"], "the daemon's admin"),
])
def test_a_missing_part_says_how_to_install_it(installed, argv, what):
    installed()
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 1, res.output
    assert res.output == (f"offcut: {what} commands are not installed: reinstall offcut "
                          "(in a source checkout: pip install -e .)\n")
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_without_the_parts_the_clients_own_commands_work(installed):
    installed()
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0, res.output
    assert _listed(res.output) == ["submit", "queue", "show", "cancel", "watch", "recur", "status"]
    res = CliRunner().invoke(app, ["queue", "--help"])
    assert res.exit_code == 0 and "squeue" in res.output, res.output
    res = CliRunner().invoke(app, ["no-such-command"])
    assert res.exit_code == 2 and "No such command" in res.output, res.output


def test_a_broken_part_names_its_error(installed):
    installed(EntryPoint("replay", "offcut_no_such_module:app", GROUP),
              EntryPoint("daemon", "offcut.errors:OffcutError", GROUP))
    res = CliRunner().invoke(app, ["replay", "zeus", "--help"])
    assert res.exit_code == 1, res.output
    assert res.output == ("offcut: the replay commands failed to load (entry point replay = "
                          "offcut_no_such_module:app (unknown package)): ModuleNotFoundError: "
                          "No module named 'offcut_no_such_module'\n")
    res = CliRunner().invoke(app, ["token", "new"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("offcut: the daemon's admin commands failed to load (entry "
                                 "point daemon = offcut.errors:OffcutError (unknown package)): "
                                 "TypeError: <class 'offcut.errors.OffcutError'> is not a "
                                 "typer.Typer"), res.output


def test_a_third_party_set_adds_commands_and_takes_over_none(installed, tmp_path, monkeypatch):
    (tmp_path / "offcut_test_extra_commands.py").write_text(
        "import typer\n"
        "app = typer.Typer()\n"
        "@app.command()\n"
        "def hello() -> None:\n"
        "    '''Say hello.'''\n"
        "    typer.echo('hello from a plug-in')\n"
        "@app.command()\n"
        "def submit() -> None:\n"
        "    '''Not the real submit.'''\n"
        "    typer.echo('taken over')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "offcut_test_extra_commands", raising=False)
    installed(EntryPoint("replay", "offcut.replay.cli:app", GROUP),
              EntryPoint("daemon", "offcut.daemon.edge.token_cli:app", GROUP),
              EntryPoint("extra", "offcut_test_extra_commands:app", GROUP),
              EntryPoint("broken", "offcut_no_such_module:app", GROUP))
    res = CliRunner().invoke(app, ["hello"])
    assert res.exit_code == 0, res.output
    assert "hello from a plug-in" in res.stdout
    warnings = res.stderr.splitlines()
    assert ("offcut: warning: entry point extra = offcut_test_extra_commands:app (unknown "
            "package) registers the command 'submit', which is taken: ignored") in warnings
    assert ("offcut: warning: the commands of entry point broken = offcut_no_such_module:app "
            "(unknown package) failed to load: ModuleNotFoundError: No module named "
            "'offcut_no_such_module'") in warnings
    res = CliRunner().invoke(app, ["submit", "--help"])
    assert res.exit_code == 0 and "Submit an elastic training task" in res.stdout, res.output
    assert "taken over" not in res.output
    res = CliRunner().invoke(app, ["--help"])
    assert _listed(res.stdout) == [*cli.HELP_ORDER, "hello"]


def test_another_package_cannot_pass_for_one_of_offcuts_parts(installed, tmp_path, monkeypatch):
    """An entry point named like offcut's own part (``replay``) but registered by another
    distribution is a third party's: it comes after offcut's parts and takes over none of
    their commands."""
    from types import SimpleNamespace

    (tmp_path / "offcut_test_fake_replay.py").write_text(
        "import typer\n"
        "app = typer.Typer()\n"
        "@app.command()\n"
        "def demo() -> None:\n"
        "    '''Not the real demo.'''\n"
        "    typer.echo('fake demo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "offcut_test_fake_replay", raising=False)
    fake = SimpleNamespace(metadata={"Name": "evil-tools"}, version="6.6.6")
    installed(EntryPoint("replay", "offcut_test_fake_replay:app", GROUP)._for(fake),
              EntryPoint("replay", "offcut.replay.cli:app", GROUP),
              EntryPoint("daemon", "offcut.daemon.edge.token_cli:app", GROUP))
    assert [cs.own for cs in cli.command_sets()] == [True, True, False]
    res = CliRunner().invoke(app, ["demo", "--help"])
    assert res.exit_code == 0 and "fake demo" not in res.output, res.output
    assert ("offcut: warning: entry point replay = offcut_test_fake_replay:app (evil-tools "
            "6.6.6) registers the command 'demo', which is taken: ignored") in res.stderr

"""The daemon's admin commands of the ``offcut`` CLI: ``offcut token new`` (a bearer token
for the tokens file, :mod:`offcut.daemon.edge.auth`).

The daemon registers them as the entry point ``daemon`` of the group ``offcut.commands``
(``pyproject.toml``), and the ``offcut`` CLI (:mod:`offcut.client.cli`) composes them; the
client imports nothing of the daemon, and the daemon nothing of the client
(docs/architecture.md, "Layers"). :data:`app` holds the ``token`` group.
"""

from __future__ import annotations

from pathlib import Path

import typer

from offcut.text_safety import terminal_safe

#: the daemon's admin commands (entry point ``daemon`` of ``offcut.commands``)
app = typer.Typer(rich_markup_mode=None)
#: ``offcut token``
token_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Manage the daemon's bearer tokens (tokens_file in offcut.toml).")
app.add_typer(token_app, name="token")


@token_app.command("new")
def token_new(
    user: str = typer.Option(..., "--user", help="user name the token stands for (task owner)"),
    role: str = typer.Option("user", "--role", help="admin (everything) | slurm (the Slurm hooks, watcher and launcher: node events, run reports, reading all tasks) | user (own tasks, Zeus)"),
    tokens_file: Path = typer.Option(..., "--tokens-file", help="the daemon's tokens file (created with mode 0600)"),
) -> None:
    """Create a token for USER with ROLE, store its SHA-256 in the tokens file and print the
    token once (give it to the user: `export OFFCUT_TOKEN=...` or a 0600 token file). The
    daemon reads the file at start: restart it to apply. The Slurm hooks, the watcher and the
    launcher get a `slurm` token, never an admin one.

    Examples:
      offcut token new --user alice --role user --tokens-file /etc/offcut/tokens.toml
      offcut token new --user slurm --role slurm --tokens-file /etc/offcut/tokens.toml
    """
    from offcut.daemon.edge.auth import TokensFileError, add_token

    try:
        token = add_token(tokens_file, user, role)
    except TokensFileError as exc:  # as every offcut command fails (offcut.client.cli_common)
        typer.echo(f"offcut: {terminal_safe(str(exc))}", err=True)
        raise typer.Exit(2) from None
    typer.echo(token)


"""What every part's ``offcut`` commands share, below the CLI that composes them
(:mod:`offcut.client.cli`): the one form of a failed command. The task commands
(:mod:`offcut.client.task_cli`) and the replay's (:mod:`offcut.replay.cli`) import it; it
imports no part (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import NoReturn

import typer

from offcut.text_safety import terminal_safe


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``offcut: MESSAGE`` on stderr and leave the command with exit status ``code``
    (1: the daemon or the run failed; 2: bad input, as a usage error).

    The message may quote user text (file contents, task names, a daemon's reply): control
    characters are escaped (:func:`offcut.text_safety.terminal_safe`). Raises
    :class:`typer.Exit`, always."""
    typer.echo(f"offcut: {terminal_safe(message)}", err=True)
    raise typer.Exit(code)


def one_line(exc: BaseException) -> str:
    """``str(exc)`` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(exc).split())

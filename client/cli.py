"""The ``offcut`` command line, composed of every part's commands: the client's own (the task
commands of :mod:`offcut.client.task_cli`, ``recur`` and ``status``) and those the other parts
register as entry points of the group ``offcut.commands`` (``pyproject.toml``): the replay's
(``demo``, ``replay ...``, ``solve``, ``report``, ``history``: :mod:`offcut.replay.cli`) and
the daemon's admin commands (``token``: :mod:`offcut.daemon.edge.token_cli`). The client imports
neither part (docs/architecture.md, "Layers"): it finds their commands as the daemon finds
third-party policies, through entry points.

Run ``offcut COMMAND --help`` for each command's options and examples.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
import typer.main

from offcut.client import task_cli
from offcut.client.cli_common import fail
from offcut.client.settings import ClientSettings, connection_options
from offcut.errors import OffcutError
from offcut.text_safety import terminal_safe

#: the entry-point group of command sets: ``NAME = "module:attribute"``, the attribute a
#: :class:`typer.Typer` whose commands and groups join ``offcut``'s
#: (``[project.entry-points."offcut.commands"]`` in the part's ``pyproject.toml``)
ENTRY_POINT_GROUP = "offcut.commands"

#: offcut's own parts by entry-point name: how a message names them, and the commands each
#: registers (invoked while the part is missing, they say how to install it)
PART_COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "replay": ("the replay", ("demo", "solve", "report", "history", "replay", "sweep")),
    "daemon": ("the daemon's admin", ("token",)),
}

#: the order of ``offcut --help``; other commands (third-party entry points) follow
HELP_ORDER = ("submit", "queue", "show", "cancel", "watch", "demo", "solve", "recur", "status",
              "report", "history", "replay", "sweep", "token")
_HELP_RANK = {name: rank for rank, name in enumerate(HELP_ORDER)}
_PART_RANK = {name: rank for rank, name in enumerate(PART_COMMANDS)}

#: how to put the parts' commands back (the entry points are written at install time)
REINSTALL_HINT = "reinstall offcut (in a source checkout: pip install -e .)"


@dataclass(frozen=True)
class CommandSet:
    """One entry point of :data:`ENTRY_POINT_GROUP`, loaded: ``name``, ``origin`` (the entry
    point and its distribution, for messages), its click commands and groups by name, and
    ``error`` (one line) when it could not be loaded (then ``commands`` is empty)."""

    name: str
    origin: str
    commands: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    #: one of offcut's own parts: a name of :data:`PART_COMMANDS` registered by the ``offcut``
    #: distribution itself (another package's entry point of that name is a third party's)
    own: bool = False


def _own_part(ep: EntryPoint) -> bool:
    """Whether ``ep`` is one of offcut's own parts: a name of :data:`PART_COMMANDS` from the
    ``offcut`` distribution (an entry point made by hand, without one, counts as offcut's)."""
    dist = getattr(ep, "dist", None)
    return ep.name in PART_COMMANDS and (dist is None
                                         or dist.metadata["Name"].lower() == "offcut")


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "unknown package"
    return f"entry point {ep.name} = {ep.value} ({where})"


def _load(ep: EntryPoint) -> CommandSet:
    """The commands of ``ep``; any failure (an import error, an attribute that is not a
    :class:`typer.Typer`, commands typer cannot build) is recorded in the set, not raised."""
    try:
        part = ep.load()
        if not isinstance(part, typer.Typer):
            raise TypeError(f"{part!r} is not a typer.Typer")
        commands = dict(typer.main.get_group(part).commands)
    except Exception as exc:  # noqa: BLE001 - any failure of an installed part is reported
        return CommandSet(ep.name, _origin(ep), error=" ".join(f"{type(exc).__name__}: {exc}".split()),
                          own=_own_part(ep))
    return CommandSet(ep.name, _origin(ep), commands, own=_own_part(ep))


@functools.cache
def command_sets() -> tuple[CommandSet, ...]:
    """Every installed entry point of :data:`ENTRY_POINT_GROUP`, loaded (once per process):
    offcut's own parts first (in :data:`PART_COMMANDS` order), then the others by name."""
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP),
                 key=lambda ep: (_PART_RANK[ep.name] if _own_part(ep) else len(_PART_RANK),
                                 ep.name, ep.value))
    return tuple(_load(ep) for ep in eps)


def _missing_part(part: str, sets: tuple[CommandSet, ...]) -> str:
    """Why the commands of ``part`` (a key of :data:`PART_COMMANDS`) are not there."""
    what = PART_COMMANDS[part][0]
    for cs in sets:
        if cs.own and cs.name == part and cs.error is not None:
            return f"{what} commands failed to load ({cs.origin}): {cs.error}"
    return f"{what} commands are not installed: {REINSTALL_HINT}"


def _missing_command(name: str, message: str) -> Any:
    """A hidden command ``name`` that takes any arguments (``--help`` included) and fails
    with ``message``: a missing part's command says why instead of "No such command"."""
    stub = typer.Typer()

    @stub.command(name, hidden=True, add_help_option=False,
                  context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def missing() -> None:
        fail(message)

    return typer.main.get_command(stub)


class OffcutGroup(typer.core.TyperGroup):
    """The ``offcut`` group: its own commands, then those of every :func:`command_sets` set
    (a name already taken is not taken over: a warning on stderr), then a stand-in for each
    missing command of offcut's own parts (:func:`_missing_command`); ``--help`` lists them
    in :data:`HELP_ORDER`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: what is wrong with the installed command sets, said when the group parses its
        #: arguments (a third party's set that failed to load, a name it may not take over)
        self.warnings: list[str] = []
        sets = command_sets()
        for cs in sets:
            if cs.error is not None and not cs.own:
                self.warnings.append(f"the commands of {cs.origin} failed to load: {cs.error}")
            for name, command in cs.commands.items():
                if name in self.commands:
                    self.warnings.append(f"{cs.origin} registers the command {name!r}, which "
                                         "is taken: ignored")
                else:
                    self.add_command(command, name)
        for part, (_, names) in PART_COMMANDS.items():
            for name in names:
                if name not in self.commands:
                    self.add_command(_missing_command(name, _missing_part(part, sets)), name)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Say :attr:`warnings` on stderr, then parse as every group does."""
        for warning in self.warnings:
            typer.echo(terminal_safe(f"offcut: warning: {warning}"), err=True)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        """The command names in :data:`HELP_ORDER`, other names after them as added."""
        return sorted(super().list_commands(ctx), key=lambda n: _HELP_RANK.get(n, len(_HELP_RANK)))


app = typer.Typer(cls=OffcutGroup, add_completion=False, rich_markup_mode=None,
                  no_args_is_help=True,
                  help="Offcut: elastic DL training on the idle nodes of a supercomputer.")
task_cli.register(app)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"offcut {version('offcut')}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", "-V", callback=_version,
                                          is_eager=True, help="print the version and exit "
                                                               "(as sbatch --version)")) -> None:
    """Offcut: elastic DL training on the idle nodes of a supercomputer."""


@app.command()
def recur(
    command: str = typer.Option(..., "--command", help="training command template; placeholders {batch_size} {learning_rate} {trial} {recurrence} {seed}; run without a shell (shlex.split)"),
    batch_sizes: str = typer.Option(..., "--batch-sizes", help="comma-separated batch sizes, e.g. 32,64,128"),
    default: int = typer.Option(..., "--default", help="the default batch size (one of --batch-sizes)"),
    target_metric: float = typer.Option(..., "--target-metric", help="validation metric that counts as converged"),
    recurrences: int = typer.Option(1, "--recurrences", help="how many times the job recurs"),
    job_id: Optional[str] = typer.Option(None, "--job-id", help="job id [default: derived from --command]"),
    target: Optional[str] = typer.Option(None, "--target", help="daemon address [default: the local socket]"),
    eta: float = typer.Option(0.5, "--eta", help="eta_knob of zeus_cost: 0 = time only, 1 = energy only"),
    beta: float = typer.Option(2.0, "--beta", help="stop a run whose cost exceeds beta x min_cost; 0 = no early stopping"),
    max_epochs: int = typer.Option(100, "--max-epochs", help="epochs before a run is given up"),
    lower_is_better: bool = typer.Option(False, "--lower-is-better", help="the metric is reached from above (e.g. WER)"),
    max_power_w: Optional[float] = typer.Option(None, "--max-power-w", help="zeus_cost's MaxPower, W: the GPU's maximum power limit x GPUs per run [default: read via pynvml, else required]"),
    num_gpus: Optional[int] = typer.Option(None, "--num-gpus", help="GPUs per run, for MaxPower read via pynvml [default: all visible]"),
    power_limits: Optional[str] = typer.Option(None, "--power-limits", help="MIN-MAX power limits to profile, W (e.g. 100-250), or auto (the GPU's range via pynvml); enables the power-limit optimizer (with --observer-mode: only MAX is used) [default with --observer-mode: auto]"),
    observer_mode: bool = typer.Option(False, "--observer-mode", help="every run at the maximum power limit: the optimizers measure, they do not choose the limit (Zeus's observer mode, ZEUS_USE_OPTIMAL_PL=False); the batch size still follows the optimizer"),
    power_step: float = typer.Option(25.0, "--power-step", help="stride between profiled power limits, W"),
    warmup_steps: int = typer.Option(10, "--warmup-steps", help="steps run at a power limit before its window"),
    profile_steps: int = typer.Option(40, "--profile-steps", help="steps measured per power limit"),
    selector: str = typer.Option("zeus_cost", "--power-selector", help="zeus_cost | energy | time | max_slowdown"),
    base_lr: Optional[float] = typer.Option(None, "--base-lr", help="learning rate at the default batch size (for {learning_rate})"),
    lr_scaling: str = typer.Option("linear", "--lr-scaling", help="linear: base_lr*b/default | sqrt: base_lr*sqrt(b/default) | none: base_lr"),
    max_tries: int = typer.Option(20, "--max-tries", help="runs per recurrence before giving up"),
    seed: Optional[int] = typer.Option(None, "--seed", help="seed of the batch-size optimizer [default: drawn by the daemon]"),
    run_seed: Optional[int] = typer.Option(None, "--run-seed", help="{seed} of the job's trial 1; trial n gets RUN_SEED+n-1 (mod 2^32), as Zeus's ZeusMaster adds one per run [default: --seed, else 123456]"),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="working directory of each run, may use the --command placeholders (e.g. runs/r{recurrence}-t{trial}); created with mode 0700; refused if writable by every user or another user's [default: this one]"),
    out: Path = typer.Option(Path("recur-out"), "--out", help="output folder (history.csv, logs/)"),
    timeout_s: Optional[float] = typer.Option(None, "--timeout-s", help="wall-clock limit per run, s"),
    poll_s: float = typer.Option(1.0, "--poll-s", help="how often a running trial is checked, s"),
    grace_s: float = typer.Option(10.0, "--grace-s", help="time a stopped run gets to exit, and again between SIGTERM and SIGKILL, s"),
    run_logs: bool = typer.Option(True, "--run-logs/--no-run-logs", help="write each run's output to OUT/logs (else it goes to this terminal)"),
) -> None:
    """Run a recurring training job with Zeus's batch-size (and power-limit) optimizers
    hosted by offcutd (Zeus's ZeusMaster): each run gets the predicted batch size; a
    recurrence is retried until a run reaches the target metric.

    The command reads its trial from OFFCUT_ADDRESS, OFFCUT_ZEUS_JOB_ID, OFFCUT_ZEUS_TRIAL and
    OFFCUT_BATCH_SIZE (see offcut.client.training.ZeusTraining.from_env); it runs in --workdir
    with {seed} = RUN_SEED + trial - 1. With --observer-mode every run keeps the maximum power
    limit and the history shows what each run measured there. Writes OUT/history.csv, one row
    per run (with its seed, power limit, energy, time and zeus_cost).

    \b
    Example:
      offcut recur --command "python train.py --batch-size {batch_size} --lr {learning_rate}" \\
        --batch-sizes 32,64,128 --default 64 --base-lr 0.1 --lr-scaling linear \\
        --target-metric 0.9 --max-epochs 30 --recurrences 10 --max-power-w 300 \\
        --power-limits 100-300 --out out/recur
      offcut recur --command "python train.py --batch-size {batch_size} --seed {seed}" \\
        --workdir ~/jobs/cifar --batch-sizes 32,64,128 --default 64 --target-metric 0.9 \\
        --max-epochs 30 --recurrences 10 --max-power-w 300 --observer-mode --out out/observe
    """
    from offcut.client.recur import RecurError, RecurOptions, parse_batch_sizes, parse_power_limits, run_recur

    try:
        limits = parse_power_limits(power_limits) if power_limits is not None else None
        options = RecurOptions(
            command=command, batch_sizes=parse_batch_sizes(batch_sizes), default_batch_size=default,
            target_metric=target_metric, recurrences=recurrences, job_id=job_id, target=target,
            eta=eta, beta=beta or None, max_epochs=max_epochs, higher_is_better=not lower_is_better,
            max_power_w=max_power_w, num_gpus=num_gpus, power_limits=limits,
            power_limits_auto=power_limits is not None and limits is None, power_step_w=power_step,
            warmup_steps=warmup_steps, profile_steps=profile_steps, selector=selector,
            base_lr=base_lr, lr_scaling=lr_scaling, max_tries=max_tries, seed=seed, out=out,
            timeout_s=timeout_s, poll_s=poll_s, grace_s=grace_s, run_logs=run_logs,
            run_seed=run_seed, workdir=workdir, observer_mode=observer_mode)
        run_recur(options, echo=typer.echo)
    except RecurError as exc:
        fail(str(exc), exc.exit_code)
    except OffcutError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted", 130)


@app.command()
@connection_options
def status(
    idle_nodes: bool = typer.Option(False, "--idle-nodes", help="also list the idle pool (hostlist)"),
    as_json: bool = typer.Option(False, "--json", help="print the StatusResponse as JSON plus event_lag_s (docs/user-guide.md, \"JSON output\")"),
    *, settings: ClientSettings,
) -> None:
    """For admins: the idle pool, nodes in use, tasks by state, the solver and its decision
    times, and the event lag (wall clock minus the time of the last applied event).

    \b
    Examples:
      offcut status
      offcut status --idle-nodes --json
    """
    import time

    import hostlist

    from offcut.client.json_out import json_text, to_json

    try:
        with settings.client() as c:
            st = c.status(include_idle_nodes=idle_nodes)
    except OffcutError as exc:
        fail(str(exc))
    from offcut.views import SolverStatistics
    from offcut.client.json_out import time_text
    from offcut.wire.tasks import status_to_pb

    has_clock = st.clock is not None
    lag_s = time.time() - st.clock if has_clock else None
    if as_json:
        doc = to_json(status_to_pb(st))
        doc["event_lag_s"] = lag_s
        typer.echo(json_text(doc, indent=2))
        return
    # (a user's status has no last decision; the figures read 0 where the daemon sent none)
    s = st.solver or SolverStatistics("", 0, 0.0, 0.0, 0.0, 0.0, 0, {}, "")
    last = st.last_decision
    typer.echo(f"clock        {time_text(st.clock) or '-'} (revision {st.revision}; "
               f"event lag {task_cli.format_duration(lag_s)}; "
               f"{terminal_safe(st.clock_mode or 'live')})")
    typer.echo(f"nodes        {st.idle_nodes} in the idle pool, {st.nodes_in_use} of them in use by tasks")
    if st.clock_mode != "replay" and st.nodes_awaiting_launch:
        typer.echo(f"             {st.nodes_awaiting_launch} of those held for generations the "
                   "launcher has not started yet (offcut show TASK says why)")
    typer.echo(f"tasks        {st.queued_tasks} queued, {st.admitted_tasks} admitted, "
               f"{st.running_tasks} running, {st.completed_tasks} completed, {st.cancelled_tasks} cancelled, "
               f"{st.failed_tasks} failed "
               f"(at most {st.max_running_tasks} admitted)")
    typer.echo(f"solver       {terminal_safe(s.configured_solver)}: {s.decisions} decisions, p50 {s.decision_ms_p50:.2f} ms, "
               f"p99 {s.decision_ms_p99:.2f} ms, max {s.decision_ms_max:.2f} ms, {s.fallbacks} fallbacks")
    snaps = st.snapshots
    if snaps is not None and snaps.count:
        typer.echo(f"snapshots    {snaps.count} since start, each holding events back p50 "
                   f"{snaps.ms_p50:.2f} ms, p99 {snaps.ms_p99:.2f} ms, max {snaps.ms_max:.2f} ms "
                   f"(the last at revision {snaps.last_revision}: {snaps.last_ms:.2f} ms)")
    if last is not None and last.revision:  # the event's source and the solver's words: escaped
        typer.echo(terminal_safe(f"last         {last.source or 'task request'} at {time_text(last.time)}: {last.solve.status} by "
                   f"{last.solve.solver or '-'} in {last.solve.solve_ms:.2f} ms, "
                   f"{len(last.placements)} placement change(s)"))
    if s.last_fallback_reason:
        typer.echo(f"fallback     {terminal_safe(s.last_fallback_reason)}")
    typer.echo(f"node-hours   {st.idle_node_seconds / 3600:.1f} idle, {st.used_node_seconds / 3600:.1f} used; "
               f"{st.total_samples:.6g} samples trained")
    eta = f" (eta {st.eta:g})" if st.objective == "zeus_cost" else ""
    spj = f", {st.total_samples / st.energy_j:.4g} samples/J" if st.energy_j > 0 else ""
    typer.echo(f"objective    {terminal_safe(st.objective or 'throughput')}{eta}; energy {st.energy_j:.4g} J "
               f"({st.task_energy_j:.4g} J by tasks){spj}")
    if idle_nodes:
        typer.echo(f"idle pool    "
                   f"{terminal_safe(hostlist.collect_hostlist(list(st.idle_node_names)) or '-')}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())

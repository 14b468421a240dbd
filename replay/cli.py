"""The replay's ``offcut`` commands: ``offcut demo``, ``offcut replay ...`` (BFTrainer's log,
a window of your own Slurm site, Zeus's GPU traces, the safe CSV form), ``offcut solve``
(recorded allocation problems re-solved), ``offcut report`` and ``offcut history`` (a live
daemon's journal as a replay's files).

The replay registers them as the entry point ``replay`` of the group ``offcut.commands``
(``pyproject.toml``), and the ``offcut`` CLI (:mod:`offcut.client.cli`) composes them; the
client imports nothing of the replay (docs/architecture.md, "Layers"). :data:`app` holds the
commands; the ``replay`` group is :data:`replay_app`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from offcut.client import task_cli
from offcut.client.cli_common import fail, one_line
from offcut.client.settings import ClientSettings, connection_options
from offcut.errors import OffcutError
from offcut.text_safety import terminal_safe

#: the replay's top-level commands and its ``replay`` group (entry point ``replay`` of
#: ``offcut.commands``)
app = typer.Typer(rich_markup_mode=None)
replay_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Replay recorded scheduler logs through the daemon.")
app.add_typer(replay_app, name="replay")

#: the --solver help of every command that solves (demo, replay bftrainer|slurm, solve)
SOLVER_HELP = "dp | gurobi | cbc | auto | greedy (dp: exact, fast, the same on every install; gurobi needs the gurobi extra; auto: gurobi if installed and the model fits its licence, else cbc)"


def _print_summary(summary: dict, out: Path) -> None:
    keys = ("events", "stop_reason", "tasks_submitted", "tasks_completed", "all_done_at", "total_samples",
            "oracle_total_samples", "samples_vs_oracle", "energy_j", "samples_per_joule",
            "idle_node_hours", "used_node_hours", "utilisation", "dedicated_efficiency", "solver",
            "objective", "curves")
    for k in keys:
        v = summary.get(k)
        if v is None and k in ("oracle_total_samples", "samples_vs_oracle"):
            continue
        if k == "dedicated_efficiency":  # (offcut.replay.efficiency: E = same counts x scaling)
            if v is not None:
                typer.echo(f"  {'efficiency':18s} {v:.4g} of the same node-hours on dedicated "
                           "nodes (each task at its best count, no rescale; baselines from the "
                           "tasks' curves)")
            kept, scaling = summary.get("same_counts_efficiency"), summary.get("scaling_factor")
            if v is not None and kept is not None and scaling is not None:
                typer.echo(f"  {'  = overhead':18s} {kept:.4g} of what the held node counts give "
                           "on dedicated nodes (after rescale and preemption costs)")
                typer.echo(f"  {'  x scaling':18s} {scaling:.4g}: the held counts' rate over the "
                           "best count's, per node")
            continue
        typer.echo(f"  {k:18s} {v:.4g}" if isinstance(v, float)
                   else f"  {k:18s} {terminal_safe(v)}")
    owners = summary.get("owners") or {}
    if len(owners) > 1:
        for name, o in owners.items():
            typer.echo(f"  {'owner ' + terminal_safe(name):18s} {o['node_hours']:.4g} node-hours, {o['samples']:.4g} "
                       f"samples, {o['task_energy_j']:.4g} J, {o['tasks_completed']}/{o['tasks']} "
                       "tasks done")
        fair = summary["fairness"]
        if fair["jain"] is not None:
            typer.echo(f"  {'fairness':18s} node-hours per owner: Jain's index {fair['jain']:.3f}, "
                       f"min/max {fair['min_max']:.3f}")
    dm = summary["decision_ms"]
    if dm["p50"] is not None:
        typer.echo(f"  {'decision_ms':18s} p50 {dm['p50']:.2f}  p99 {dm['p99']:.2f}  max {dm['max']:.2f}")
    typer.echo(f"report: {out / 'report.png'}   steps: {out / 'steps.csv'}   summary: {out / 'summary.json'}, "
               f"{out / 'summary.txt'}")


def _replay(node_log, tasks, out: Path, oracle: bool = False, **opts) -> None:
    """Replay, print the summary (``opts``: options under the CLI's names,
    :func:`offcut.replay.driver.replay_options`); exit 2 on a bad option or input."""
    from offcut.replay.driver import replay_options, run_replay, run_with_oracle

    try:
        if oracle:
            summary = run_with_oracle(node_log, tasks, out, replay_options(**opts))
        else:
            summary = run_replay(node_log, tasks, out, replay_options(**opts))
    except ValueError as exc:
        fail(str(exc), 2)
    except OffcutError as exc:
        fail(str(exc))
    typer.echo(f"replay finished in {summary['wall_s']:.1f} s ({summary['events']} events)")
    _print_summary(summary, out)


@app.command()
def demo(
    out: Path = typer.Option(Path("offcut-demo"), help="output folder"),
    solver: str = typer.Option("dp", help=SOLVER_HELP),
    progress: bool = typer.Option(True, help="show a progress bar"),
) -> None:
    """Replay the bundled demo log (synthetic, with the real log's statistics) and print the summary.

    Example: offcut demo --out /tmp/demo
    """
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.synth import demo_data_dir

    data = demo_data_dir()
    node_log = load_node_log(data, skip_rows=0)
    tasks = load_task_set(data)
    typer.echo(f"demo: {len(node_log.node_names)} nodes, {len(tasks)} tasks, bundled log {data}")
    _replay(node_log, tasks, out, solver=solver, progress=progress)


@replay_app.command("bftrainer")
def replay_bftrainer(
    node_log: Path = typer.Option(..., "--node-log", help="node-state log: safe-format folder, or ndstat-*.tar.gz / .pkl (needs --allow-pickle)"),
    tasks: Path = typer.Option(..., "--tasks", help="task set: tasks.csv (or its folder), or a *-Jbnd-*.pkl (JNPs found beside it; needs --allow-pickle)"),
    jnps: Optional[Path] = typer.Option(None, "--jnps", help="the *-JNPs-*.pkl when not beside the Jbnd file"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="allow loading pickles (runs code from the file: only for trusted data)"),
    first_node: int = typer.Option(0, "--first-node", min=0, help="first node (log column index)"),
    num_nodes: Optional[int] = typer.Option(None, "--num-nodes", min=1, help="number of nodes [default: all]"),
    skip_rows: int = typer.Option(1000, "--skip-rows", min=0, help="log rows skipped at the start (as the original)"),
    max_tasks: int = typer.Option(10, "--max-tasks", min=1, help="maxJ: tasks admitted at once"),
    tfwd: float = typer.Option(10.0, "--tfwd", min=0.001, help="look-ahead Tfwd, s"),
    solver: str = typer.Option("dp", "--solver", help=SOLVER_HELP),
    time_limit: float = typer.Option(10.0, "--time-limit", min=0.01, help="hard limit per MILP solve, s"),
    max_events: Optional[int] = typer.Option(None, "--max-events", min=1, help="stop after this many events"),
    seed: int = typer.Option(0, "--seed", help="recorded in summary.json (no current solver is randomised)"),
    target: Optional[str] = typer.Option(None, "--target", help="drive this running daemon instead of a private one"),
    record_instances: Optional[Path] = typer.Option(None, "--record-instances", help="record every allocation problem to this JSONL file"),
    until_log_end: bool = typer.Option(False, "--until-log-end", help="keep replaying after every task is done (node-hour accounting over the whole log)"),
    curves: str = typer.Option("model", "--curves", help="model: the daemon computes progress from the true curves; known | linear | hidden: the replay plays the tasks (true curves + --noise) and reports their progress, and the daemon gets the true curves, a naive linear guess from the throughput at Jmin, or none (it learns them online)"),
    noise: float = typer.Option(0.05, "--noise", min=0.0, help="relative throughput noise per event interval of the played tasks (seeded by --seed)"),
    report_every: float = typer.Option(60.0, "--report-every", min=1.0, help="the played tasks (--curves known|linear|hidden) report every this many seconds, and at every node event"),
    oracle: bool = typer.Option(False, "--oracle", help="with --curves linear|hidden: also run with the true curves (into OUT/oracle) and add oracle_total_samples to summary.json"),
    policy: str = typer.Option("throughput", "--policy", help="allocation policy of the private daemon: throughput | energy (samples per joule) | zeus_cost | fair_share (max-min fair node-hours per owner, see --owners) | an installed third-party policy's name"),
    eta: float = typer.Option(0.5, "--eta", min=0.0, max=1.0, help="eta_knob of --policy zeus_cost"),
    owners: int = typer.Option(0, "--owners", min=0, help="submit the tasks as N owners user1..userN (user k has weight 1/k: a skewed split dealt in submit order by weighted round-robin) to compare per-user policies; the summary gives node-hours per owner [default: 0, every task by 'replay']"),
    out: Path = typer.Option(Path("replay-out"), "--out", help="output folder"),
    progress: bool = typer.Option(True, help="show a progress bar"),
) -> None:
    """Replay a BFTrainer node-state log and task set (arXiv 2106.12091) through offcutd.

    Writes steps.csv, placements.csv, summary.json and report.png to --out.

    \b
    Example (the real public log, 128 nodes, the 10-task hps-shufflenet set):
      offcut replay bftrainer --allow-pickle \\
        --node-log ../shared/data/bftrainer/ndstat-10sdn6-evt.tar.gz \\
        --tasks ../shared/data/bftrainer/hps-shufflenet-Jbnd-10J.pkl \\
        --num-nodes 128 --solver cbc --out out/128
    \b
    The same with three task owners and the fair-share policy:
      ... --num-nodes 128 --solver dp --owners 3 --policy fair_share --out out/fair
    """
    from offcut.replay.bftrainer_data import ReplayInputError, load_node_log, load_task_set

    try:
        log = load_node_log(node_log, first_node=first_node, num_nodes=num_nodes,
                            skip_rows=skip_rows, allow_pickle=allow_pickle)
        task_set = load_task_set(tasks, jnps, allow_pickle=allow_pickle)
    except ReplayInputError as exc:
        fail(str(exc), 2)
    typer.echo(f"replay: {len(log.node_names)} nodes from {log.initial_time}, {len(task_set)} tasks")
    _replay(log, task_set, out, solver=solver, tfwd=tfwd, max_tasks=max_tasks,
            max_events=max_events, seed=seed, target=target, time_limit=time_limit,
            record_instances=str(record_instances) if record_instances else None,
            until_log_end=until_log_end, progress=progress, curves=curves, noise=noise,
            report_every=report_every, policy=policy, eta=eta, owners=owners, oracle=oracle)


def _site_log(sacct: Path, nodes: str, start: str, end: str, scavenger_partition: List[str],
              events: Optional[Path] = None):
    """The node log of ``offcut replay slurm`` / ``slurm-convert`` (exit 2 on bad input)."""
    import pandas as pd

    from offcut.replay.bftrainer_data import ReplayInputError
    from offcut.replay.slurm_log import read_node_log_from_sacct
    from offcut.slurm_values import NodeListError, expand_nodelist

    try:
        t0, t1 = pd.Timestamp(start), pd.Timestamp(end)
    except ValueError as exc:
        fail(f"--start/--end: {exc}", 2)
    t0, t1 = (t.tz_convert(None) if t.tzinfo else t for t in (t0, t1))
    try:
        names = expand_nodelist(nodes)
    except NodeListError as exc:
        fail(f"--nodes: {nodes!r} is not a hostlist ({exc})", 2)
    try:
        return read_node_log_from_sacct(sacct, names, t0, t1, events_path=events,
                                        own_partitions=scavenger_partition)
    except ReplayInputError as exc:
        fail(str(exc), 2)


_SACCT_HELP = ("Slurm's accounting of the window, text or JSON (told apart by content): the "
               "output of `SLURM_TIME_FORMAT=%s sacct -X -a --parsable2 --noheader "
               "--format=JobID,JobName,Partition,State,NodeList,Start,End --starttime=START "
               "--endtime=END`, or of `sacct -a --json --starttime=START --endtime=END` "
               "(Slurm 22.05 to 24.05; run it without SLURM_TIME_FORMAT)")
_EVENTS_HELP = ("optional: the node events of the window, whose nodes are down or drained and "
                "so not idle: the output of `SLURM_TIME_FORMAT=%s sacctmgr --parsable2 "
                "--noheader show event Event=Node Start=START End=END "
                "Format=NodeName,TimeStart,TimeEnd,State`")
# the accounting window's options, the same in offcut replay slurm and slurm-convert
SacctOption = Annotated[Path, typer.Option("--sacct", help=_SACCT_HELP)]
EventsOption = Annotated[Optional[Path], typer.Option("--events", help=_EVENTS_HELP)]
NodesOption = Annotated[str, typer.Option(
    "--nodes", help="the nodes to replay, a Slurm hostlist (e.g. n[1-4] or the partition's "
    "nodes from sinfo)")]
StartOption = Annotated[str, typer.Option(
    "--start", help="window start, ISO time in UTC (e.g. 2026-11-27T04:00:00)")]
EndOption = Annotated[str, typer.Option("--end", help="window end, ISO time in UTC")]
ScavengerOption = Annotated[List[str], typer.Option(
    "--scavenger-partition", help="jobs of these partitions (Offcut's own and other "
    "preemptable work) leave a node idle; repeat for several")]


@replay_app.command("slurm-convert")
def replay_slurm_convert(
    sacct: SacctOption,
    nodes: NodesOption,
    start: StartOption,
    end: EndOption,
    out: Path = typer.Option(..., "--out", help="output folder: nodes.csv and events.csv.gz, the safe form offcut replay convert writes"),
    events: EventsOption = None,
    scavenger_partition: ScavengerOption = ["scavenger"],
) -> None:
    """Write the node log of a window of Slurm's accounting (as offcut replay slurm builds it)
    in the documented CSV form of offcut replay convert; replay it later with offcut replay
    bftrainer --node-log OUT --skip-rows 0.

    \b
    Example:
      offcut replay slurm-convert --sacct week.sacct --nodes n[1-64] \\
        --start 2026-11-20T00:00:00 --end 2026-11-27T00:00:00 --out data/week
    """
    from offcut.replay.bftrainer_data import write_node_log

    log = _site_log(sacct, nodes, start, end, scavenger_partition, events)
    write_node_log(out, log.node_names, log.initial_time, log.initial_idle, log.events())
    typer.echo(f"wrote {out}: {len(log.node_names)} nodes, {log.num_events} changes")


@replay_app.command("slurm")
def replay_slurm(
    sacct: SacctOption,
    nodes: NodesOption,
    start: StartOption,
    end: EndOption,
    tasks: Path = typer.Option(..., "--tasks", help="task set: tasks.csv (or its folder), or a *-Jbnd-*.pkl (needs --allow-pickle)"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="allow loading a pickled task set (runs code from the file: only for trusted data)"),
    shift_tasks: bool = typer.Option(True, "--shift-tasks/--keep-task-times", help="move the task set's submissions so that the first is at --start (gaps kept), or keep their recorded times"),
    max_tasks: int = typer.Option(10, "--max-tasks", min=1, help="maxJ: tasks admitted at once"),
    tfwd: float = typer.Option(10.0, "--tfwd", min=0.001, help="look-ahead Tfwd, s"),
    solver: str = typer.Option("dp", "--solver", help=SOLVER_HELP),
    out: Path = typer.Option(Path("replay-out"), "--out", help="output folder"),
    progress: bool = typer.Option(True, help="show a progress bar"),
    events: EventsOption = None,
    scavenger_partition: ScavengerOption = ["scavenger"],
) -> None:
    """Replay your own site: the node log built from Slurm's accounting of a window (a node
    is idle unless a job outside the scavenger partitions ran on it, or, with --events, it was
    down or drained), with a task set, through offcutd, as offcut replay bftrainer does with
    BFTrainer's log.

    \b
    Example:
      sacct -a --json --starttime=2026-11-20T00:00:00 --endtime=2026-11-27T00:00:00 > week.json
      SLURM_TIME_FORMAT=%s sacctmgr --parsable2 --noheader show event Event=Node \\
        Start=2026-11-20T00:00:00 End=2026-11-27T00:00:00 \\
        Format=NodeName,TimeStart,TimeEnd,State > week.events
      offcut replay slurm --sacct week.json --events week.events \\
        --nodes "$(sinfo -h -o %N -p batch)" \\
        --start 2026-11-20T00:00:00 --end 2026-11-27T00:00:00 --tasks tasks.csv --out week
    """
    from offcut.replay.bftrainer_data import ReplayInputError, load_task_set

    log = _site_log(sacct, nodes, start, end, scavenger_partition, events)
    try:
        task_set = load_task_set(tasks, allow_pickle=allow_pickle)
    except ReplayInputError as exc:
        fail(str(exc), 2)
    if shift_tasks and task_set:
        offset = log.initial_time - min(t.submit_time for t in task_set)
        for t in task_set:
            t.submit_time = t.submit_time + offset
    typer.echo(f"replay: {len(log.node_names)} nodes from {log.initial_time} ({log.num_events} "
               f"changes in the accounting), {len(task_set)} tasks")
    _replay(log, task_set, out, solver=solver, tfwd=tfwd, max_tasks=max_tasks,
            progress=progress)


@replay_app.command("zeus")
def replay_zeus(
    train: Path = typer.Option(..., "--train", help="Zeus's summary_train.csv (epochs to reach each target per run)"),
    power: Path = typer.Option(..., "--power", help="Zeus's summary_power_<gpu>.csv (time per epoch and average power per power limit)"),
    workload: str = typer.Option(..., "--workload", help="cifar100 | imagenet | librispeech | movielens-1m | sentiment140 | squad"),
    recurrences: int = typer.Option(50, "--recurrences", min=1, help="recurrences of the job"),
    eta: float = typer.Option(0.5, "--eta", min=0.0, max=1.0, help="eta_knob of zeus_cost: 0 = time only, 1 = energy only"),
    beta: Optional[float] = typer.Option(2.0, "--beta", help="beta_knob: stop a run whose cost exceeds beta x min_cost; 0 disables early stopping"),
    seed: int = typer.Option(1, "--seed", help="seed of the optimizer and of the sampled training runs"),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", min=1, help="epochs before a run is given up [default: the workload's]"),
    target: Optional[str] = typer.Option(None, "--target", help="drive this running daemon instead of a private one"),
    out: Path = typer.Option(Path("zeus-out"), "--out", help="output folder"),
) -> None:
    """Simulate a recurring job on Zeus's GPU traces through the daemon's batch-size and
    power-limit optimizers (Zeus, NSDI '23), against the default batch size at max power.

    Writes history.csv, summary.json and history.png to --out.

    \b
    Example (the recorded V100 traces):
      offcut replay zeus --train ../shared/data/zeus-nsdi23/summary_train.csv \\
        --power ../shared/data/zeus-nsdi23/summary_power_v100.csv \\
        --workload librispeech --recurrences 50 --eta 0.5 --beta 2 --seed 1 --out out/zeus
    """
    from offcut.replay.zeus_sim import ZeusReplayError, ZeusReplayOptions, run_zeus_replay

    opts = ZeusReplayOptions(recurrences=recurrences, eta_knob=eta,
                             beta_knob=beta if beta else None, seed=seed, max_epochs=max_epochs)
    try:
        summary = run_zeus_replay(train, power, workload, opts, out, target=target)
    except ZeusReplayError as exc:
        fail(str(exc), 2)
    except OffcutError as exc:
        fail(str(exc))
    typer.echo(f"{workload}: {summary['runs']} runs in {summary['wall_s']:.1f} s")
    for key in ("energy_j", "baseline_energy_j", "energy_saving", "time_s", "baseline_time_s",
                "time_change", "final_batch_size", "final_power_limit_w"):
        value = summary[key]
        typer.echo(f"  {key:20s} {value:.4g}" if isinstance(value, float) else f"  {key:20s} {value}")
    typer.echo(f"history: {out / 'history.csv'}   summary: {out / 'summary.json'}   plot: {out / 'history.png'}")


@replay_app.command("convert")
def replay_convert(
    out: Path = typer.Option(..., "--out", help="output folder (safe format: nodes.csv, events.csv.gz, tasks.csv)"),
    node_log: Optional[Path] = typer.Option(None, "--node-log", help="ndstat-*.tar.gz or .pkl"),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="*-Jbnd-*.pkl (JNPs found beside it)"),
    jnps: Optional[Path] = typer.Option(None, "--jnps", help="*-JNPs-*.pkl when not beside the Jbnd file"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="required: the inputs are pickles"),
) -> None:
    """Convert the BFTrainer pickles to the safe CSV format (no code runs when it is read).

    \b
    Example:
      offcut replay convert --allow-pickle --node-log ndstat-10sdn6-evt.tar.gz \\
        --tasks hps-shufflenet-Jbnd-10J.pkl --out data/bftrainer-safe
    """
    from offcut.replay.bftrainer_data import ReplayInputError, convert

    if node_log is None and tasks is None:
        fail("nothing to convert: give --node-log and/or --tasks", 2)
    if tasks is not None and jnps is None and "-Jbnd-" in tasks.name:
        jnps = tasks.with_name(tasks.name.replace("-Jbnd-", "-JNPs-"))
    try:
        convert(node_log, tasks, jnps, out, allow_pickle=allow_pickle)
    except ReplayInputError as exc:
        fail(str(exc), 2)
    typer.echo(f"wrote {out}")


@app.command()
def solve(
    records: Path = typer.Argument(..., help="JSONL file of allocation problems (offcutd --record-instances)"),
    solver: str = typer.Option("dp", "--solver", help=SOLVER_HELP),
    time_limit: float = typer.Option(10.0, "--time-limit", min=0.01, help="limit per solve, s"),
) -> None:
    """Re-solve recorded allocation problems; one JSON line per instance
    (objective, bound, counts, solve_ms).

    Example: offcut solve instances.jsonl --solver dp
    """
    from offcut.daemon.app.solvers.records import solve_records

    if not records.is_file():
        fail(f"{records}: no such file", 2)
    try:
        for result in solve_records(records, solver, time_limit):
            typer.echo(json.dumps(result))
    except OffcutError as exc:
        fail(str(exc), 2)


def _render_report(folder: Path, use_summary_json: bool = True) -> None:
    """Render the report of ``folder``, print its summary and files (exit 2 on bad input)."""
    from offcut.replay.bftrainer_data import ReplayInputError
    from offcut.replay.report import build_report

    try:
        rep = build_report(folder, use_summary_json=use_summary_json)
    except ReplayInputError as exc:
        fail(one_line(exc), 2)
    except OSError as exc:
        fail(f"{folder}: cannot write the report: {one_line(exc)}")
    typer.echo(terminal_safe(rep.text, keep_newlines=True), nl=False)
    typer.echo(terminal_safe("files: " + "  ".join(str(f) for f in rep.files)))


@app.command()
def report(
    folder: Path = typer.Argument(..., help="folder with steps.csv and placements.csv (a replay's --out, or offcut history's)"),
) -> None:
    """Render steps.csv + placements.csv of a replay or of an exported live history into
    report.png (idle vs used nodes, task progress), throughput.png (aggregate rate, rescale
    and preemption cost), decisions.png (decision time) and summary.txt (period, events,
    node-hours, utilisation, samples, tasks, rescales, decision ms), and print the summary.
    Replays and offcut history write these files themselves; a summary.json in the folder
    adds the replay's stop reason and solver.

    \b
    Examples:
      offcut report out/128
      offcut report offcut-demo
    """
    _render_report(folder)


@app.command()
@connection_options
def history(
    out: Path = typer.Option(..., "--out", help="output folder: steps.csv, placements.csv, tasks.csv, warnings.csv and the report files are replaced"),
    after_revision: int = typer.Option(0, "--after-revision", min=0, help="export only events after this revision (0 = all; offcut status shows the current one)"),
    *, settings: ClientSettings,
) -> None:
    """Export a live daemon's history (its journal of applied events, oldest first, up to
    now) into steps.csv and placements.csv with the replay's columns, then render the
    report as offcut report does. steps.csv has one row per node event (evt counts from 0
    in the export); submissions and cancellations add placements.csv rows only. tasks.csv
    has one row per task, as last answered in the export, with its energy [J] and samples
    per joule labelled measured (its processes' GPUs) or modelled (an estimate).
    warnings.csv has one row per warning the daemon noted about a task (no checkpoint
    after a restart, a crash loop, a stop signal ignored, the final grace outrun).

    \b
    Examples:
      offcut history --out hist
      offcut history --out hist-late --after-revision 5000 --address unix:///run/offcut/offcutd.sock
    """
    import os
    import tempfile

    from offcut.replay.history import HistoryWriter

    try:
        out.mkdir(parents=True, exist_ok=True)
        # written beside the target and moved in only when the export is complete, so a
        # failed export never clobbers an earlier one
        with tempfile.TemporaryDirectory(prefix=".history-", dir=out) as tmp:
            first = last = None
            tasks = task_cli.TaskEnergyRows()
            with settings.client() as c, HistoryWriter(tmp) as writer, \
                    task_cli.TaskWarningRows(Path(tmp) / "warnings.csv") as warnings:
                for entry in c.export_history(after_revision=after_revision):
                    writer.entry(entry)
                    tasks.entry(entry)
                    warnings.entry(entry)
                    first = entry.revision if first is None else first
                    last = entry.revision
            tasks.write(Path(tmp) / "tasks.csv")
            for name in ("steps.csv", "placements.csv", "tasks.csv", "warnings.csv"):
                os.replace(Path(tmp) / name, out / name)
    except OffcutError as exc:
        fail(one_line(exc))
    except OSError as exc:
        fail(f"{out}: {one_line(exc)}", 2)
    if first is None:
        fail(f"the daemon has no events after revision {after_revision}: empty steps.csv and "
              f"placements.csv written to {out}, no report")
    typer.echo(f"exported revisions {first}..{last}: {writer.node_events} node events -> "
               f"{out / 'steps.csv'}, {out / 'placements.csv'}; {len(tasks.tasks)} tasks "
               f"({tasks.measured} with measured energy) -> {out / 'tasks.csv'}; "
               f"{warnings.count} warnings -> {out / 'warnings.csv'}")
    if writer.node_events == 0:
        fail(f"no node events after revision {after_revision}: nothing to plot, no report")
    _render_report(out, use_summary_json=False)




@app.command()
def sweep(
    spec_file: Path = typer.Argument(..., metavar="SPEC.toml", help="the sweep spec (docs/replay-and-policies.md, \"Sweeps\")"),
    executor: Optional[str] = typer.Option(None, "--executor", help="local (processes on this machine) | slurm (Slurm array jobs, [slurm]'s options) [default: the spec's [sweep] executor, else local]"),
    out: Optional[Path] = typer.Option(None, "--out", help="the sweep's folder [default: the spec's [sweep] out, else SPEC-out beside the spec]"),
    max_parallel: Optional[int] = typer.Option(None, "--max-parallel", min=1, max=10_000, help="cells running at once [default: the spec's [sweep] max_parallel, else 2]"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="let cells with allow_pickle = true load pickles (runs code from the files: only for trusted data)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the cells, which are finished and which would run; run nothing"),
    progress: bool = typer.Option(True, help="show a progress bar"),
) -> None:
    """Run a sweep: every cell of SPEC.toml's grid (and list) is one replay, run through
    submitit's local or Slurm executor; finished cells (OUT/cells/ID/row.json) are not run
    again, a failed cell is reported with its log and the others go on. Writes OUT/table.csv
    (a row per finished cell: the swept settings, the efficiency and its parts, the idle
    node-hours used, the all-done time), OUT/sweep.png and OUT/failed.csv. Exit status 1 when
    a cell failed (run the same command again to retry the failed ones); Ctrl-C, SIGTERM and
    SIGHUP cancel the cells running.

    \b
    A spec (paths relative to its folder):
      [sweep]
      executor = "slurm"
      max_parallel = 8
      [slurm]
      partition = "debug"
      [fixed]
      node_log = "ndstat-10sdn6-evt.tar.gz"
      allow_pickle = true
      [grid]
      tasks = ["hps-shufflenet-Jbnd-10J.pkl", "ImageNet-imgps-Jbnd-1001J.pkl"]
      num_nodes = [64, 128]
      policy = ["throughput", "energy", "zeus_cost"]
      tfwd = [10, 60]
    \b
    Examples:
      offcut sweep study.toml --dry-run
      offcut sweep study.toml --executor slurm --allow-pickle
    """
    import signal

    from offcut.replay.sweep import SweepSubmitError, run_sweep
    from offcut.replay.sweep_results import finished, table_text
    from offcut.replay.sweep_spec import SweepSpecError, load_spec

    if executor is not None and executor not in ("local", "slurm"):
        fail(f"--executor: local or slurm, got {executor!r}", 2)
    try:
        spec = load_spec(spec_file)
    except SweepSpecError as exc:
        fail(str(exc), 2)
    folder = (out or spec.out_dir()).resolve()
    if dry_run:
        for cell in spec.cells:
            state = "finished" if finished(folder, cell) is not None else "to run"
            typer.echo(terminal_safe(f"{cell.id}  {state:8s}  {spec.describe(cell)}"))
        typer.echo(terminal_safe(f"{len(spec.cells)} cells; folder {folder}"))
        return

    def interrupted(signum, frame):  # SIGTERM, SIGHUP: as Ctrl-C, the running cells cancelled
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    try:
        result = run_sweep(spec, out=folder, executor=executor, max_parallel=max_parallel,
                           allow_pickle=allow_pickle, progress=progress,
                           echo=lambda s: typer.echo(terminal_safe(s)))
    except SweepSpecError as exc:
        fail(str(exc), 2)
    except SweepSubmitError as exc:
        fail(str(exc))
    if len(result.table) and spec.axes:
        typer.echo(terminal_safe(table_text(result.table, spec.axes), keep_newlines=True))
    typer.echo(terminal_safe(
        f"sweep: {result.ran} cells run"
        + (f" and {result.adopted} of an earlier run waited for" if result.adopted else "")
        + f" in {result.wall_s:.1f} s, {result.finished_before} finished before, "
        f"{len(result.failed)} failed; table: {result.table_csv}"
        + (f"   plots: {result.plots}" if result.plots else "")))
    if result.failed:
        fail(f"{len(result.failed)} of {result.ran} cells failed (listed in "
             f"{folder / 'failed.csv'}, with their logs); run the same command again to retry "
             "them")

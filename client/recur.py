"""The recurring-job driver (Zeus's ``ZeusMaster``, ``zeus/run/master.py`` of Zeus's earlier
releases, not in zeus 0.16; docs/zeus.md, "A recurring job: offcut recur"): runs a training command once per
recurrence with the batch size the daemon's batch-size optimizer predicts, retrying a
recurrence until a run reaches the target metric.

Per try: Predict (with an idempotency key, so a retried call gets the same trial), format the
command template with ``{batch_size}``, ``{learning_rate}``, ``{trial}``, ``{recurrence}`` and
``{seed}`` (the seed's ``Job.gen_command(batch_size, learning_rate, seed, rec_i)``), run it
without a shell (``shlex.split``) in the run's working directory (``workdir``, the seed's
``job.workdir``) with the ``OFFCUT_*`` variables of :mod:`offcut.client.training`, and watch
the trial while it runs (GetJob every ``poll_s``): a run the daemon stopped without
convergence (cost bound, max_epochs) that keeps running gets ``grace_s`` to exit, then
SIGTERM, then SIGKILL (to its whole process group). After the run, a trial still open is
ended (EndTrial). A command that exits non-zero is a failed run, not an error of the driver.
Stops when the daemon answers FAILED_PRECONDITION (every batch size failed) or a recurrence
does not converge in ``max_tries`` tries.

``{seed}``: the run with trial number ``n`` gets ``(run_seed + n - 1) mod 2^32`` (a valid
``numpy.random.seed``). The seed's ZeusMaster starts at its ``seed`` (default 123456) and adds
one per run; with a fresh job, whose trials are numbered 1, 2, ... in the order of the runs,
this is the same sequence, and a driver started again on the same job goes on with new seeds
instead of repeating them. ``run_seed`` defaults to ``seed`` (the batch-size optimizer's, as
the seed's ``run_zeus.py`` passes one seed to both), else 123456.

``workdir``: a template with the same placeholders (e.g. ``runs/r{recurrence}-t{trial}``);
relative to the driver's working directory; missing folders are created with mode 0700. It is
refused (exit 2, before the run) when it exists and is not a directory, is writable by every
user, belongs to another user than this one or root (either could put files there that the
command runs or imports), or cannot be entered.

Observer mode (``observer_mode``; the seed's ``observer_mode``, ``ZEUS_USE_OPTIMAL_PL=False``,
Zeus, NSDI '23, Section 5): every run trains at the maximum power limit, the MAX of ``power_limits``
(read via pynvml when not given). The job's power spec is registered with that single limit
(min = max), so the training side sets the maximum, the power-limit optimizer measures each
batch size's window at it and chooses nothing else; the batch-size optimizer still picks each
run's batch size from the measured cost (zeus_cost, Zeus, Section 3.1, Eq. 2, with ``eta``), as the
seed's does. Unlike the seed, whose profiling windows still sweep the lower limits, no run
leaves the maximum. The job is not the optimizing job of the same command: its default id
differs, and a switch of mode under one ``--job-id`` is refused as a different spec.

Writes ``history.csv`` (one row per run, flushed as it goes): recurrence, try, trial,
batch_size, seed, power_limit_w (the profile's chosen limit when it is done, else empty; in
observer mode that is the maximum), energy_j, time_s, reached, cost (the trial's zeus_cost of its
measured energy and time [J]), exit_code (negative: killed by that signal), epochs, status;
and, with ``run_logs``, each run's output to ``logs/r<recurrence>-t<try>-trial<trial>.log``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import signal
import stat
import string
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from offcut.client.api import Client
from offcut.client.training import (ENV_ADDRESS, ENV_BATCH_SIZE, ENV_JOB_ID, ENV_TRIAL,
                                    BackendUnavailable, nvml_power_limit_range)
from offcut.errors import AlreadyExists, FailedPrecondition, Unavailable
from offcut.text_safety import csv_writer
from offcut.v1 import zeus_pb2
from offcut.zeus_views import Prediction, ZeusTrial

PLACEHOLDERS = ("batch_size", "learning_rate", "trial", "recurrence", "seed")
LR_SCALINGS = ("linear", "sqrt", "none")
HISTORY_COLUMNS = ("recurrence", "try", "trial", "batch_size", "seed", "power_limit_w",
                   "energy_j", "time_s", "reached", "cost", "exit_code", "epochs", "status")
ZEUS_MASTER_SEED = 123456
"""The seed's ``ZeusMaster(seed=123456)`` default: the first run's ``{seed}`` when neither
``run_seed`` nor ``seed`` is given."""
SEED_MODULUS = 2**32
"""Run seeds wrap at 2^32, so that each is a valid ``numpy.random.seed``."""


class RecurError(Exception):
    """The driver cannot go on; ``exit_code`` 2 for bad input, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def _bad(message: str) -> RecurError:
    return RecurError(message, 2)


# ----------------------------------------------------------------------------- parsing
def parse_batch_sizes(text: str) -> list[int]:
    """``"32,64,128"`` -> [32, 64, 128] (sorted). Raises RecurError (exit 2) unless they are
    distinct positive integers."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise _bad(f"--batch-sizes: expected comma-separated positive integers like "
                   f"32,64,128, got {text!r}") from None
    if not sizes or min(sizes) <= 0 or len(set(sizes)) != len(sizes):
        raise _bad(f"--batch-sizes: expected distinct positive integers, got {text!r}")
    return sorted(sizes)


def parse_power_limits(text: str) -> tuple[float, float] | None:
    """``"100-250"`` -> (100.0, 250.0) [W]; ``"auto"`` -> None (read the GPUs' range).
    Raises RecurError (exit 2) for anything else or min > max."""
    if text.strip().lower() == "auto":
        return None
    match = re.fullmatch(r"\s*([0-9.]+)\s*-\s*([0-9.]+)\s*", text)
    try:
        lo, hi = float(match.group(1)), float(match.group(2))
    except (AttributeError, ValueError):
        raise _bad(f"--power-limits: expected MIN-MAX in watts like 100-250 (or auto), "
                   f"got {text!r}") from None
    if not 0 < lo <= hi:
        raise _bad(f"--power-limits: need 0 < MIN <= MAX, got {text!r}")
    return lo, hi


def scaled_learning_rate(base_lr: float, batch_size: int, default_batch_size: int,
                         scaling: str) -> float:
    """The learning rate for ``batch_size``: ``base_lr * b / b0`` (linear),
    ``base_lr * sqrt(b / b0)`` (sqrt) or ``base_lr`` (none), where ``b0`` is the default
    batch size. Raises RecurError (exit 2) for an unknown scaling."""
    ratio = batch_size / default_batch_size
    if scaling == "linear":
        return base_lr * ratio
    if scaling == "sqrt":
        return base_lr * math.sqrt(ratio)
    if scaling == "none":
        return base_lr
    raise _bad(f"--lr-scaling: {scaling!r} is not one of {', '.join(LR_SCALINGS)}")


def default_job_id(command: str, observer_mode: bool = False) -> str:
    """A job id derived from the command template: the script's name and a hash of the
    whole template and the mode (e.g. ``train-1a2b3c4d5e``), so that an observer-mode job and
    the optimizing job of the same command get different ids."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    script = next((t for t in tokens if t.endswith(".py")), tokens[0] if tokens else "job")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(script).removesuffix(".py"))
    key = command + ("\0observer" if observer_mode else "")
    return f"{stem[:40] or 'job'}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def template_fields(template: str, option: str) -> set[str]:
    """The placeholders ``template`` uses (``{name}``).

    Raises:
        RecurError: (exit 2, naming ``option``) malformed braces, or a placeholder that is not
            one of :data:`PLACEHOLDERS` (no attribute or index access: ``{seed.x}`` too).
    """
    fields = set()
    try:
        for _, name, _, _ in string.Formatter().parse(template):
            if name is not None:
                fields.add(name)
    except ValueError as exc:
        raise _bad(f"{option}: {exc} (write {{{{ }}}} for literal braces)") from None
    unknown = sorted(f for f in fields if f not in PLACEHOLDERS)
    if unknown:
        raise _bad(f"{option}: unknown placeholder {{{unknown[0]}}}; use "
                   f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} (write {{{{ }}}} for "
                   "literal braces)")
    return fields


def format_command(template: str, **values) -> list[str]:
    """The argv of one run: ``template`` formatted with ``values`` (every name of
    :data:`PLACEHOLDERS`), then ``shlex.split``.
    Raises RecurError (exit 2) for an unknown placeholder or unbalanced quotes."""
    template_fields(template, "--command")
    try:
        argv = shlex.split(template.format(**values))
    except (ValueError, IndexError, KeyError) as exc:
        raise _bad(f"--command: {exc}") from None
    if not argv:
        raise _bad("--command is empty")
    return argv


def run_seed(base: int, trial_number: int) -> int:
    """The ``{seed}`` of the run with ``trial_number`` (>= 1): ``(base + trial_number - 1)
    mod 2^32`` (see the module docstring)."""
    return (base + trial_number - 1) % SEED_MODULUS


def prepare_workdir(template: str, **values) -> Path:
    """The absolute working directory of a run: ``template`` formatted with ``values`` (as
    :func:`format_command`), ``~`` expanded, relative to this process's working directory;
    created where missing, each new folder with mode 0700 (less by the umask).

    Raises:
        RecurError: (exit 2, naming ``--workdir``) an unknown placeholder, an empty path or
            one with a NUL byte, a path that exists and is not a directory (or a dangling
            link), a folder that cannot be created, a directory writable by every user or
            owned by a user other than this one and root, or one this user cannot enter.
    """
    template_fields(template, "--workdir")
    try:
        text = template.format(**values)
    except (ValueError, IndexError, KeyError) as exc:
        raise _bad(f"--workdir: {exc}") from None
    if not text.strip():
        raise _bad("--workdir is empty")
    if "\0" in text:
        raise _bad("--workdir contains a NUL byte")
    path = Path(os.path.expanduser(text)).absolute()
    missing: list[Path] = []
    probe = path
    while not probe.is_dir():
        if os.path.lexists(probe):
            raise _bad(f"--workdir: {probe} exists and is not a directory")
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            if not folder.is_dir():
                raise _bad(f"--workdir: {folder} exists and is not a directory") from None
        except OSError as exc:
            raise _bad(f"--workdir: cannot create {folder}: {exc.strerror or exc}") from None
    try:
        st = path.stat()
    except OSError as exc:
        raise _bad(f"--workdir: cannot read {path}: {exc.strerror or exc}") from None
    if st.st_mode & stat.S_IWOTH:
        raise _bad(f"--workdir: {path} is writable by every user (mode "
                   f"{stat.S_IMODE(st.st_mode):04o}): another user could put files there that "
                   "the command runs or imports; use a folder of your own")
    if st.st_uid not in (os.geteuid(), 0):
        raise _bad(f"--workdir: {path} is owned by uid {st.st_uid}, not by this user (uid "
                   f"{os.geteuid()}) or root; use a folder of your own")
    if not os.access(path, os.X_OK):
        raise _bad(f"--workdir: cannot enter {path}: permission denied")
    return path


# ----------------------------------------------------------------------------- options
@dataclass
class RecurOptions:
    """Settings of one driver run (see ``offcut recur --help``). Units: ``*_w`` W, ``*_s`` s."""

    command: str
    batch_sizes: list[int]
    default_batch_size: int
    target_metric: float
    recurrences: int = 1
    job_id: str | None = None
    target: str | None = None
    eta: float = 0.5
    beta: float | None = 2.0             # None (or 0) = no early stopping
    max_epochs: int = 100
    higher_is_better: bool = True
    max_power_w: float | None = None     # None: read via pynvml (max limit x num_gpus)
    num_gpus: int | None = None          # for max_power_w from pynvml; None = all visible
    power_limits: tuple[float, float] | None = None
    power_limits_auto: bool = False      # read the range via pynvml
    power_step_w: float = 25.0
    warmup_steps: int = 10
    profile_steps: int = 40
    selector: str = "zeus_cost"
    base_lr: float | None = None
    lr_scaling: str = "linear"
    max_tries: int = 20
    seed: int | None = None
    run_seed: int | None = None          # {seed} of trial 1; None: seed, else 123456
    workdir: str | None = None           # the runs' working directory (template); None: ours
    observer_mode: bool = False          # every run at the maximum power limit
    out: Path = Path("recur-out")
    timeout_s: float | None = None
    poll_s: float = 1.0
    grace_s: float = 10.0
    run_logs: bool = True

    def validate(self) -> None:
        """Check everything that can be checked without the daemon.

        Raises:
            RecurError: (exit 2) naming the option.
        """
        if not self.command.strip():
            raise _bad("--command is empty")
        fields = template_fields(self.command, "--command")
        if "learning_rate" in fields and self.base_lr is None:
            raise _bad("--command uses {learning_rate}: give --base-lr")
        if self.workdir is not None:
            if not self.workdir.strip():
                raise _bad("--workdir is empty")
            if ("learning_rate" in template_fields(self.workdir, "--workdir")
                    and self.base_lr is None):
                raise _bad("--workdir uses {learning_rate}: give --base-lr")
        if self.default_batch_size not in self.batch_sizes:
            raise _bad(f"--default {self.default_batch_size} is not one of --batch-sizes "
                       f"{','.join(map(str, self.batch_sizes))}")
        if self.lr_scaling not in LR_SCALINGS:
            raise _bad(f"--lr-scaling: {self.lr_scaling!r} is not one of {', '.join(LR_SCALINGS)}")
        checks = [
            (self.recurrences >= 1, f"--recurrences must be >= 1, got {self.recurrences}"),
            (self.max_tries >= 1, f"--max-tries must be >= 1, got {self.max_tries}"),
            (self.max_epochs >= 1, f"--max-epochs must be >= 1, got {self.max_epochs}"),
            (0.0 <= self.eta <= 1.0, f"--eta must be in [0, 1], got {self.eta}"),
            (self.beta is None or self.beta >= 0, f"--beta must be >= 0, got {self.beta}"),
            (math.isfinite(self.target_metric), "--target-metric must be a finite number"),
            (self.max_power_w is None or self.max_power_w > 0,
             f"--max-power-w must be > 0, got {self.max_power_w}"),
            (self.num_gpus is None or self.num_gpus >= 1,
             f"--num-gpus must be >= 1, got {self.num_gpus}"),
            (self.power_step_w > 0, f"--power-step must be > 0, got {self.power_step_w}"),
            (self.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {self.warmup_steps}"),
            (self.profile_steps >= 1, f"--profile-steps must be >= 1, got {self.profile_steps}"),
            (self.base_lr is None or self.base_lr > 0,
             f"--base-lr must be > 0, got {self.base_lr}"),
            (self.timeout_s is None or self.timeout_s > 0,
             f"--timeout-s must be > 0, got {self.timeout_s}"),
            (self.poll_s > 0, f"--poll-s must be > 0, got {self.poll_s}"),
            (self.grace_s >= 0, f"--grace-s must be >= 0, got {self.grace_s}"),
            (self.seed is None or 0 <= self.seed < 2**63,
             f"--seed must be in [0, 2^63), got {self.seed}"),
            (self.run_seed is None or 0 <= self.run_seed < SEED_MODULUS,
             f"--run-seed must be in [0, 2^32), got {self.run_seed}"),
        ]
        for ok, message in checks:
            if not ok:
                raise _bad(message)
        format_command(self.command, batch_size=self.default_batch_size, learning_rate="0.1",
                       trial=1, recurrence=1, seed=0)  # unbalanced quotes

    @property
    def seed_base(self) -> int:
        """The ``{seed}`` of trial 1: ``run_seed``, else ``seed`` mod 2^32, else 123456 (the
        seed's ``ZeusMaster`` default)."""
        if self.run_seed is not None:
            return self.run_seed
        return ZEUS_MASTER_SEED if self.seed is None else self.seed % SEED_MODULUS

    @property
    def fixed_workdir(self) -> bool:
        """Whether ``workdir`` is set and has no placeholders (one folder for every run)."""
        return (self.workdir is not None
                and not template_fields(self.workdir, "--workdir"))

    @property
    def observer_limit_w(self) -> float | None:
        """In observer mode, the power limit [W] every run keeps (the MAX of
        ``power_limits``, after :meth:`resolve_gpu_figures`); else None."""
        if not self.observer_mode or self.power_limits is None:
            return None
        return self.power_limits[1]

    def resolve_gpu_figures(self) -> None:
        """Fill ``max_power_w`` (and the power range for ``power_limits_auto``, or in observer
        mode without ``power_limits``) from pynvml.

        Raises:
            RecurError: (exit 2) pynvml cannot read them; says which option to give.
        """
        if self.observer_mode and self.power_limits is None:
            self.power_limits_auto = True
        if self.max_power_w is not None and not self.power_limits_auto:
            return
        try:
            lo, hi, visible = nvml_power_limit_range()
        except (BackendUnavailable, ValueError) as exc:
            need = ("--max-power-w (zeus_cost's MaxPower: the GPU's maximum power limit x GPUs "
                    "per run, e.g. 300 for one V100)" if self.max_power_w is None
                    else "--power-limits MIN-MAX" + (" (observer mode keeps every run at MAX)"
                                                     if self.observer_mode else ""))
            raise _bad(f"give {need}: it could not be read via pynvml ({exc})") from None
        if self.power_limits_auto:
            self.power_limits = (lo, hi)
        if self.max_power_w is None:
            self.max_power_w = hi * (self.num_gpus or visible)

    def job_spec(self, job_id: str) -> zeus_pb2.BatchSizeJobSpec:
        """The BatchSizeJobSpec to register (after :meth:`resolve_gpu_figures`); in observer
        mode its power range is the single limit MAX (min = max)."""
        spec = zeus_pb2.BatchSizeJobSpec(
            job_id=job_id, batch_sizes=self.batch_sizes,
            default_batch_size=self.default_batch_size, eta_knob=self.eta,
            max_epochs=self.max_epochs, target_metric=self.target_metric,
            higher_is_better=self.higher_is_better, max_power_w=self.max_power_w)
        if self.beta:
            spec.beta_knob = self.beta
        if self.seed is not None:
            spec.seed = self.seed
        if self.power_limits is not None:
            # observer mode: the maximum is the only limit to profile (and so the choice)
            lo = self.power_limits[1] if self.observer_mode else self.power_limits[0]
            spec.power.CopyFrom(zeus_pb2.PowerLimitSpec(
                min_power_limit_w=lo, max_power_limit_w=self.power_limits[1],
                step_w=self.power_step_w, warmup_steps=self.warmup_steps,
                profile_steps=self.profile_steps, selector=self.selector))
        return spec


@dataclass
class RunRecord:
    """One run: where it sits (recurrence, try), the daemon's trial, its ``{seed}``, what it
    measured (energy [J], time [s], zeus_cost [J]), the power limit it ended at [W] (None if
    unknown), whether it reached the target, the command's exit code (negative: killed by that
    signal)."""

    recurrence: int
    try_: int
    trial: int
    batch_size: int
    seed: int
    power_limit_w: float | None
    energy_j: float
    time_s: float
    reached: bool
    cost: float
    exit_code: int | None
    epochs: int
    status: str

    def row(self) -> list:
        """The history.csv row."""
        return [self.recurrence, self.try_, self.trial, self.batch_size, self.seed,
                "" if self.power_limit_w is None else f"{self.power_limit_w:g}",
                f"{self.energy_j:.6g}", f"{self.time_s:.6g}", self.reached, f"{self.cost:.6g}",
                "" if self.exit_code is None else self.exit_code, self.epochs, self.status]


# ----------------------------------------------------------------------------- driver
class RecurDriver:
    """Runs the recurrences of one job against a daemon (see the module docstring).

    Args:
        options: validated settings.
        client: a connected :class:`Client`.
        echo: where progress lines go.
    """

    def __init__(self, options: RecurOptions, client: Client,
                 echo: Callable[[str], None] = print):
        self.opts = options
        self.client = client
        self.echo = echo
        self.job_id = options.job_id or default_job_id(options.command, options.observer_mode)
        self.session = uuid.uuid4().hex[:12]  # idempotency keys of this driver's predictions
        self.records: list[RunRecord] = []

    def register(self) -> None:
        """Register the job (the same spec again is accepted).

        Raises:
            RecurError: the id is taken by a different spec.
        """
        try:
            job = self.client.register_zeus_job(self.opts.job_spec(self.job_id))
        except AlreadyExists as exc:
            raise RecurError(f"{exc}; pass another --job-id to start a new job") from None
        power = (f", power limits {job.power.min_power_limit_w:g}-"
                 f"{job.power.max_power_limit_w:g} W step {job.power.step_w:g}"
                 if job.power is not None else "")
        self.echo(f"job {self.job_id}: batch sizes {list(job.spec.batch_sizes)}, default "
                  f"{job.spec.default_batch_size}, phase {job.phase}, {job.trial_count} earlier "
                  f"trials{power}")
        if self.opts.observer_mode:
            self.echo(f"observer mode: every run at the maximum power limit "
                      f"{self.opts.observer_limit_w:g} W; the optimizers measure, the batch "
                      "size still follows the batch-size optimizer")

    def _predict(self, recurrence: int, attempt: int) -> Prediction:
        request_id = f"recur-{self.session}-r{recurrence}-t{attempt}"
        for delay in (0.5, 1.0, 2.0, None):
            try:
                return self.client.predict_batch_size(self.job_id, request_id=request_id)
            except Unavailable:
                if delay is None:
                    raise
                time.sleep(delay)  # the same request_id: a retry cannot open a second trial
        raise AssertionError("unreachable")

    def _trial(self, trial_number: int) -> ZeusTrial:
        job = self.client.get_zeus_job(self.job_id, page_size=1,
                                       before_trial_number=trial_number + 1)
        for trial in job.trials:
            if trial.trial_number == trial_number:
                return trial
        raise RecurError(f"the daemon has no trial {trial_number} of job {self.job_id!r} "
                         "(was the job deleted?)")

    def _terminate(self, proc: subprocess.Popen, why: str) -> None:
        self.echo(f"  {why}: sending SIGTERM to the run (pid {proc.pid})")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=max(self.opts.grace_s, 0.1))
                return
            except subprocess.TimeoutExpired:
                if sig == signal.SIGTERM:
                    self.echo(f"  the run ignored SIGTERM for {self.opts.grace_s:g} s: SIGKILL")
        proc.wait()

    def _watch(self, proc: subprocess.Popen, trial_number: int) -> None:
        """Wait for the run; stop it when the daemon stopped it without convergence or the
        timeout passed."""
        start = time.monotonic()
        stopped_at: float | None = None
        while True:
            try:
                proc.wait(timeout=self.opts.poll_s)
                return
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.opts.timeout_s is not None and now - start > self.opts.timeout_s:
                self._terminate(proc, f"the run exceeded --timeout-s {self.opts.timeout_s:g}")
                return
            try:
                status = self._trial(trial_number).status
            except Unavailable:
                continue  # the daemon is away for a moment; the run goes on
            if status == "failed":
                stopped_at = now if stopped_at is None else stopped_at
                if now - stopped_at >= self.opts.grace_s:
                    self._terminate(proc, "the daemon stopped this trial (not converged) but the "
                                          f"run kept going for {self.opts.grace_s:g} s")
                    return

    def _power_limit(self, batch_size: int) -> float | None:
        if self.opts.power_limits is None:
            return None
        profile = self.client.power_profile(self.job_id, batch_size)
        return profile.chosen_power_limit_w if profile.done else None

    def run_once(self, recurrence: int, attempt: int) -> RunRecord:
        """One try: predict, run, watch, close the trial, record.

        Raises:
            FailedPrecondition: every batch size failed (from Predict).
            RecurError: the command cannot be started, or (exit 2) its working directory is
                refused (:func:`prepare_workdir`); the trial is ended first.
        """
        opts = self.opts
        pred = self._predict(recurrence, attempt)
        b, n = pred.batch_size, pred.trial_number
        lr = (scaled_learning_rate(opts.base_lr, b, opts.default_batch_size, opts.lr_scaling)
              if opts.base_lr is not None else None)
        lr_text = "" if lr is None else f"{lr:.6g}"
        seed = run_seed(opts.seed_base, n)
        values = dict(batch_size=b, learning_rate=lr_text, trial=n, recurrence=recurrence,
                      seed=seed)
        try:
            argv = format_command(opts.command, **values)
            cwd = prepare_workdir(opts.workdir, **values) if opts.workdir is not None else None
        except RecurError:
            self.client.end_trial(self.job_id, n)
            raise
        env = {**os.environ, ENV_ADDRESS: self.client.address,
               ENV_JOB_ID: self.job_id, ENV_TRIAL: str(n), ENV_BATCH_SIZE: str(b)}
        if cwd is not None:
            env["PWD"] = str(cwd)  # what a shell would set; some scripts read it
        bound = "" if math.isinf(pred.cost_bound_j) else f", cost bound {pred.cost_bound_j:.4g} J"
        self.echo(f"recurrence {recurrence}/{opts.recurrences} try {attempt}: trial {n}, batch "
                  f"size {b}{', lr ' + lr_text if lr_text else ''}, seed {seed}{bound}"
                  + (f", in {cwd}" if cwd is not None else ""))
        log_path = None
        if opts.run_logs:
            log_path = opts.out / "logs" / f"r{recurrence}-t{attempt}-trial{n}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "wb") if log_path else None
        try:
            try:
                proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                                        stdout=log, stderr=subprocess.STDOUT if log else None)
            except OSError as exc:
                self.client.end_trial(self.job_id, n)
                raise RecurError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
            try:
                self._watch(proc, n)
            except BaseException:  # Ctrl-C, or the daemon failing: do not leave the run behind
                if proc.poll() is None:
                    self._terminate(proc, "the driver is stopping")
                try:
                    self.client.end_trial(self.job_id, n)
                except Exception:  # noqa: BLE001 - the original error matters more
                    pass
                raise
        finally:
            if log:
                log.close()
        trial = self._trial(n)
        # exited without a final verdict; a run that suspended its trial (exit 75, meant for a
        # new generation of a placed task) is not restarted here, so it ends as a failure too
        if trial.status in ("running", "suspended"):
            self.client.end_trial(self.job_id, n)
            trial = self._trial(n)
        record = RunRecord(recurrence, attempt, n, b, seed, self._power_limit(b), trial.energy_j,
                           trial.time_s, trial.status == "converged", trial.cost_j,
                           proc.returncode, trial.epochs, trial.status)
        hint = ("; the command reported no epoch (does it use offcut.client.training?)"
                if trial.epochs == 0 else "")
        limit = "" if record.power_limit_w is None else f", {record.power_limit_w:g} W"
        self.echo(f"  -> {trial.status} after {trial.epochs} epochs: {trial.time_s:.4g} s, "
                  f"{trial.energy_j:.4g} J, cost {trial.cost_j:.4g} J{limit}, exit code "
                  f"{proc.returncode}{hint}" + (f" (log {log_path})" if log_path else ""))
        return record

    def run(self) -> list[RunRecord]:
        """Register, then run every recurrence, appending to ``out/history.csv``.

        Raises:
            RecurError: every batch size failed, a recurrence did not converge in
                ``max_tries`` tries, or a command cannot be started.
            OffcutError: the daemon refused or is unreachable.
        """
        opts = self.opts
        self.register()
        opts.out.mkdir(parents=True, exist_ok=True)
        history = opts.out / "history.csv"
        with history.open("w", newline="") as fh:
            writer = csv_writer(fh)  # text cells a spreadsheet would run: quoted
            writer.writerow(HISTORY_COLUMNS)
            fh.flush()
            for recurrence in range(1, opts.recurrences + 1):
                for attempt in range(1, opts.max_tries + 1):
                    try:
                        record = self.run_once(recurrence, attempt)
                    except FailedPrecondition as exc:
                        raise RecurError(f"stopping: {exc}") from None
                    self.records.append(record)
                    writer.writerow(record.row())
                    fh.flush()
                    if record.reached:
                        break
                else:
                    raise RecurError(f"recurrence {recurrence} did not reach the target metric "
                                     f"in {opts.max_tries} tries (--max-tries); history in "
                                     f"{history}")
        reached = [r for r in self.records if r.reached]
        self.echo(f"done: {opts.recurrences} recurrences, {len(self.records)} runs, "
                  f"{sum(r.energy_j for r in self.records):.4g} J, "
                  f"{sum(r.time_s for r in self.records):.4g} s; last batch size "
                  f"{reached[-1].batch_size}; history {history}")
        return self.records


def run_recur(options: RecurOptions, echo: Callable[[str], None] = print) -> list[RunRecord]:
    """Validate ``options``, connect to the daemon (``options.target``; None = default socket)
    and run the driver.

    Raises:
        RecurError: bad input (exit code 2) or a driver stop (1).
        OffcutError: the daemon refused or is unreachable (``Unavailable``).
    """
    options.validate()
    options.resolve_gpu_figures()
    if options.fixed_workdir:  # refused before any trial is opened
        prepare_workdir(options.workdir)
    with Client(options.target) as client:
        return RecurDriver(options, client, echo).run()

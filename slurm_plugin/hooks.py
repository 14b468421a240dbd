"""Slurm's ``PrologSlurmctld`` / ``EpilogSlurmctld`` programs (DESIGN §7):
``python -I -m offcut.slurm_plugin.hooks prolog|epilog --address ADDR ...``, run through the
shell wrappers that ``offcut-slurm install-hooks`` writes.

* **prolog** (a job is about to start): for a job outside the scavenger partition(s), expand
  ``SLURM_JOB_NODELIST`` and report those nodes as preempted, so Offcut's tasks leave them.
* **epilog** (a job ended): for a job outside the scavenger partition(s), report its nodes idle
  -- after checking with ``sinfo``/``squeue`` that each one really is idle for Offcut now (a
  node shared with another job, drained while the job ran, or already given to the next job is
  left out; ``--no-check`` skips this).

A job whose environment names no partition is treated as a regular job (preempting is the
safe direction: Offcut loses nodes, the job is unaffected).

Both always exit 0, whatever happens (bad input, daemon down, Slurm commands failing): a
non-zero exit would requeue or hold the user's job, and Offcut must never block regular work.
Every failure is logged (``--log-file``). The total run time is bounded by ``--timeout-s`` (the
daemon calls) plus, in the epilog, ``--slurm-timeout-s`` per Slurm query; a watchdog thread ends
the process with status 0 one second after that budget, as SIGTERM is blocked in the prolog and
nothing else would stop a stuck hook before ``PrologEpilogTimeout``. A missing unix socket fails
in microseconds, without importing grpc.

Sources and sequence numbers (DESIGN §2). Each hook kind is one source (``slurm-prolog``,
``slurm-epilog``), so the daemon's per-source ``last_seq`` map does not grow with the number of
jobs (one source per job id would add an entry per job, forever). The event time is the wall
clock in whole microseconds and ``seq = time_us * 1000 + job_id % 1000``: monotone with time, and
two jobs' hooks never share a seq (a shared seq would be answered as a duplicate, silently
dropping the second job's nodes). Concurrent hooks can still reach the daemon out of order; the
later-stamped one wins and the other gets FAILED_PRECONDITION (seq or time). The prolog then
retries with a fresh time (up to 10 sends, all within its time budget; each refusal means
another event was applied in between, so this converges): "these nodes are taken" stays true
until the job's epilog, which cannot run before the prolog exits. The epilog re-checks Slurm
and sends the nodes still idle with that new observation's time (never re-stamps old
knowledge: the newer event may have been the next job's prolog on the same nodes).
"""

from __future__ import annotations

import os
import sys
import time

_T0 = time.monotonic()

SOURCES = {"prolog": "slurm-prolog", "epilog": "slurm-epilog"}
MAX_SENDS = 10


def event_time_and_seq(time_ns: int, job_id: str) -> tuple[int, int]:
    """``(time_ns rounded down to the microsecond, seq)`` for a hook event (module docstring)."""
    us = time_ns // 1000
    try:
        tag = int(job_id) % 1000
    except (TypeError, ValueError):
        tag = os.getpid() % 1000
    return us * 1000, us * 1000 + tag


def _parse_args(argv):
    import argparse

    p = argparse.ArgumentParser(prog="python -m offcut.slurm_plugin.hooks",
                                description="Offcut's PrologSlurmctld / EpilogSlurmctld program.")
    p.add_argument("kind", choices=sorted(SOURCES))
    p.add_argument("--address", required=True, help="daemon address (unix:///path.sock or HOST:PORT)")
    p.add_argument("--timeout-s", type=float, default=2.0,
                   help="total time for the daemon calls [s] (default 2)")
    p.add_argument("--scavenger-partition", action="append", default=None,
                   help="partition(s) of Offcut's own jobs, skipped (repeat or comma-separate; "
                        "default scavenger)")
    p.add_argument("--log-file", default=None, help="append log lines here (default stderr)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--source", default=None, help="event source (default slurm-prolog / slurm-epilog)")
    p.add_argument("--token-file", default=None, help="file holding a bearer token for the daemon")
    p.add_argument("--no-check", action="store_true",
                   help="epilog: report the job's nodes idle without asking Slurm first")
    p.add_argument("--sinfo", default="sinfo")
    p.add_argument("--squeue", default="squeue")
    p.add_argument("--slurm-conf", default=None)
    p.add_argument("--slurm-timeout-s", type=float, default=5.0,
                   help="epilog: limit per Slurm query [s] (default 5)")
    p.add_argument("--job-name-prefix", default="", help="Offcut's jobs: name prefix (see watch --help)")
    p.add_argument("--job-comment", default="", help="Offcut's jobs: comment marker")
    return p.parse_args(argv)


def _logger(args, kind: str, job_id: str):
    import logging

    log = logging.getLogger(f"offcut.slurm.{kind}")
    log.propagate = False
    log.setLevel(getattr(logging, str(args.log_level).upper(), logging.INFO))
    handler = None
    if args.log_file:
        try:
            handler = logging.FileHandler(args.log_file, encoding="utf-8")
        except OSError as exc:
            print(f"offcut {kind}: cannot open log file {args.log_file}: {exc}", file=sys.stderr)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s %(levelname)s offcut-{kind} job={job_id} pid={os.getpid()}: %(message)s"))
    for old in log.handlers:
        old.close()
    log.handlers[:] = [handler]
    return log


def _start_watchdog(budget_s: float, log):
    import threading

    def bail():
        try:
            log.error("gave up after %.1f s (watchdog); exiting 0 so the job is not held", budget_s)
            for h in log.handlers:
                h.flush()
        finally:
            os._exit(0)

    t = threading.Timer(budget_s, bail)
    t.daemon = True
    t.start()
    return t


def _partitions(args) -> set[str]:
    out: set[str] = set()
    for item in args.scavenger_partition or ["scavenger"]:
        out |= {p.strip() for p in item.split(",") if p.strip()}
    return out


def _job_nodes(log, env) -> list[str]:
    """The job's valid node names, or [] (logged) for an empty/garbage list."""
    from offcut.slurm_plugin.nodelist import NodeListError, expand_nodelist, split_valid

    raw = env.get("SLURM_JOB_NODELIST")
    try:
        names = expand_nodelist(raw)
    except NodeListError as exc:
        log.warning("SLURM_JOB_NODELIST unusable (%s); nothing sent", exc)
        return []
    good, bad = split_valid(names)
    if bad:
        log.warning("dropping %d node names the daemon would refuse: %s", len(bad),
                    ", ".join(repr(b)[:40] for b in bad[:5]))
    if not good:
        log.warning("no valid node name in SLURM_JOB_NODELIST=%r; nothing sent", str(raw)[:80])
    return good


def _sender(args, log, budget_s: float):
    """A NodeEventSender, or None when the daemon cannot be reached (logged)."""
    from offcut.slurm_plugin.rpc import NodeEventSender, read_token, unreachable_reason

    why = unreachable_reason(args.address)
    if why:
        log.error("daemon unreachable: %s; nothing sent", why)
        return None
    token = None
    if args.token_file:
        try:
            token = read_token(args.token_file)
        except (OSError, ValueError) as exc:
            log.error("token file unusable (%s); sending without a token",
                      exc.strerror if isinstance(exc, OSError) else exc)
    return NodeEventSender(args.address, timeout_s=budget_s, token=token)


def run_prolog(args, log, env, deadline: float) -> str:
    """Report the job's nodes preempted. Returns a one-word outcome (for the final log line)."""
    from offcut.slurm_plugin.nodelist import compress
    from offcut.slurm_plugin.rpc import DaemonError

    job_id = env.get("SLURM_JOB_ID", "?")
    nodes = _job_nodes(log, env)
    if not nodes:
        return "no-nodes"
    sender = _sender(args, log, args.timeout_s)
    if sender is None:
        return "unreachable"
    source = args.source or SOURCES["prolog"]
    try:
        for attempt in range(1, MAX_SENDS + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("no time left to send the preemption of %s", compress(nodes))
                return "timeout"
            t_ns, seq = event_time_and_seq(time.time_ns(), job_id)
            try:
                sent = sender.report(time_ns=t_ns, source=source, seq=seq, preempted=nodes,
                                     timeout_s=left)
            except DaemonError as exc:
                if exc.code == "FAILED_PRECONDITION" and attempt < MAX_SENDS:
                    log.info("send %d refused (%s); a newer event got there first, retrying "
                             "with a fresh time", attempt, exc.details)
                    continue
                log.error("preemption of %s not delivered: %s", compress(nodes), exc)
                return "failed"
            log.info("preempted %s (%s seq %d): %s", compress(nodes), source, seq, sent)
            return "sent"
    finally:
        sender.close()
    return "failed"


def run_epilog(args, log, env, deadline: float) -> str:
    """Report the job's nodes idle (those Slurm confirms idle, unless ``--no-check``)."""
    from offcut.slurm_plugin.nodelist import compress
    from offcut.slurm_plugin.rpc import DaemonError

    job_id = env.get("SLURM_JOB_ID", "?")
    nodes = _job_nodes(log, env)
    if not nodes:
        return "no-nodes"
    parts = _partitions(args)

    def check() -> tuple[int, list[str]] | None:
        if args.no_check:
            return time.time_ns(), nodes
        from offcut.slurm_plugin.slurm_cli import SlurmCLI
        from offcut.slurm_plugin.slurm_json import OwnJobRule, SlurmError
        from offcut.slurm_plugin.sources import CLISource, observe

        cli = SlurmCLI(sinfo=args.sinfo, squeue=args.squeue, slurm_conf=args.slurm_conf,
                       timeout_s=max(min(args.slurm_timeout_s, deadline - time.monotonic()), 0.1))
        rule = OwnJobRule(partitions=frozenset(parts), name_prefix=args.job_name_prefix,
                          comment_marker=args.job_comment)
        try:
            obs = observe(CLISource(cli), rule, node_partitions=parts, ignore_job_ids=[job_id])
        except SlurmError as exc:
            log.error("cannot check the nodes with Slurm (%s); nothing sent, the watcher "
                      "will report them", exc)
            return None
        idle = set(obs.view.idle)
        keep = [n for n in nodes if n in idle]
        for n in nodes:
            if n not in idle:
                log.info("not reporting %s: %s", n, obs.view.not_idle.get(n, "unknown to Slurm"))
        return (obs.time_ns, keep)

    sender = None
    source = args.source or SOURCES["epilog"]
    try:
        for attempt in (1, 2):
            checked = check()
            if checked is None:
                return "check-failed"
            t_ns, idle = checked
            if not idle:
                log.info("none of %s is idle for Offcut now; nothing sent", compress(nodes))
                return "none-idle"
            if sender is None:
                sender = _sender(args, log, args.timeout_s)
                if sender is None:
                    return "unreachable"
                # the daemon calls share --timeout-s; the Slurm checks have their own budget
                deadline = min(deadline, time.monotonic() + args.timeout_s)
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("no time left to report %s idle", compress(idle))
                return "timeout"
            t_ns, seq = event_time_and_seq(t_ns, job_id)
            try:
                sent = sender.report(time_ns=t_ns, source=source, seq=seq, idle=idle, timeout_s=left)
            except DaemonError as exc:
                if exc.code == "FAILED_PRECONDITION" and attempt == 1 and not args.no_check:
                    log.info("refused (%s); a newer event got there first, checking Slurm again",
                             exc.details)
                    continue
                log.error("idle report of %s not delivered: %s", compress(idle), exc)
                return "failed"
            log.info("reported idle %s (%s seq %d): %s", compress(idle), source, seq, sent)
            return "sent"
    finally:
        if sender is not None:
            sender.close()
    return "failed"


def main(argv=None, env=None, started: float | None = None) -> int:
    """Run one hook; returns 0 always (errors are logged). ``started``: the process's start
    (``time.monotonic()``), from which the time budget counts; default now."""
    env = os.environ if env is None else env
    started = time.monotonic() if started is None else started
    try:
        args = _parse_args(argv)
    except SystemExit:  # argparse already printed the problem on stderr
        return 0
    kind = args.kind
    job_id = str(env.get("SLURM_JOB_ID", "?"))[:40]
    log = _logger(args, kind, job_id)
    outcome = "error"
    watchdog = None
    try:
        parts = _partitions(args)
        budget = max(args.timeout_s, 0.05)
        if kind == "epilog" and not args.no_check:
            budget += 2 * max(args.slurm_timeout_s, 0.1)
        deadline = started + budget
        watchdog = _start_watchdog(max(deadline - time.monotonic(), 0) + 1.0, log)
        job_parts = {p for p in str(env.get("SLURM_JOB_PARTITION", "")).split(",") if p}
        if job_parts and job_parts <= parts:
            outcome = "skipped"
            log.debug("partition %s is Offcut's: nothing to do", ",".join(sorted(job_parts)))
        elif kind == "prolog":
            outcome = run_prolog(args, log, env, deadline)
        else:
            outcome = run_epilog(args, log, env, deadline)
    except BaseException as exc:  # noqa: BLE001 - a hook must never fail the job
        log.exception("unexpected error: %s", exc.__class__.__name__)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        (log.debug if outcome == "skipped" else log.info)(
            "done (%s) in %.0f ms", outcome, (time.monotonic() - started) * 1000)
        for h in log.handlers:
            h.flush()
    return 0


if __name__ == "__main__":
    main(started=_T0)
    # os._exit: no interpreter teardown (grpc's threads, atexit); faster, and always status 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

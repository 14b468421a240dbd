"""Slurm's ``PrologSlurmctld`` / ``EpilogSlurmctld`` programs (docs/architecture.md,
"Slurm integration"): ``python -I -m offcut.slurm_plugin.hooks prolog|epilog --address ADDR ...``,
run through the shell wrappers that ``offcut-slurm install-hooks`` writes.

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
in microseconds, without importing grpc. A daemon that refuses the connection (restarting) is
tried again with the backoff every client uses (:class:`offcut.retry.Backoff`) until the time
budget is spent: the event carries the same ``(source, seq)`` each time, so one applied twice is
answered from the daemon's journal.

Sources and sequence numbers (docs/architecture.md, "Time and events"). Each hook kind is one source
(``slurm-prolog``, ``slurm-epilog``), so the daemon's per-source ``last_seq`` map does not grow
with the number of jobs (one source per job id would add an entry per job, forever). The event
time is the wall clock in whole microseconds and ``seq = time_us * 1000 + job_id % 1000``:
monotone with time, and two jobs' hooks never share a seq (a shared seq would be answered as a
duplicate, silently dropping the second job's nodes). Concurrent hooks can still reach the
daemon out of order; the later-stamped one wins and the other gets FAILED_PRECONDITION (seq or
time). The prolog then retries with a fresh time (up to 10 sends, all within its time budget;
each refusal means another event was applied in between, so this converges): "these nodes are
taken" stays true until the job's epilog, which cannot run before the prolog exits. The epilog
re-checks Slurm and sends the nodes still idle with that new observation's time (never re-stamps
old knowledge: the newer event may have been the next job's prolog on the same nodes).
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
    p.add_argument("--token-file", default=None,
                   help="file holding a bearer token for the daemon (without one, the hook "
                        "identifies itself with a MUNGE credential when munged runs)")
    p.add_argument("--munge-socket", default=None,
                   help="munged's socket (default $OFFCUT_MUNGE_SOCKET, else "
                        "/run/munge/munge.socket.2)")
    p.add_argument("--tls-ca", default=None,
                   help="PEM of the CA to trust for a TCP address (the daemon's TLS)")
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


def _job_nodes(log, env) -> list[str]:
    """The job's valid node names, or [] (logged) for an empty/garbage list."""
    from offcut.slurm_plugin.nodelist import NodeListError, drop_invalid, expand_nodelist

    raw = env.get("SLURM_JOB_NODELIST")
    try:
        names = expand_nodelist(raw)
    except NodeListError as exc:
        log.warning("SLURM_JOB_NODELIST unusable (%s); nothing sent", exc)
        return []
    good = drop_invalid(names, log)
    if not good:
        log.warning("no valid node name in SLURM_JOB_NODELIST=%r; nothing sent", str(raw)[:80])
    return good


def _sender(args, log):
    """A NodeEventSender (default deadline ``--timeout-s``), or None when the daemon certainly
    cannot be reached (logged)."""
    from offcut.addresses import unreachable_reason

    why = unreachable_reason(args.address)
    if why:
        log.error("daemon unreachable: %s; nothing sent", why)
        return None
    from offcut.channel import token_from_file
    from offcut.errors import InvalidArgument
    from offcut.retry import Backoff
    from offcut.slurm_plugin.rpc import NodeEventSender

    token = None
    if args.token_file:
        try:
            token = token_from_file(args.token_file)
        except InvalidArgument as exc:
            log.error("token file unusable (%s); sending without a token", exc)
    try:
        return NodeEventSender(args.address, timeout_s=args.timeout_s, token=token,
                               tls_ca=args.tls_ca, munge_socket=args.munge_socket,
                               retry=Backoff(deadline_s=args.timeout_s, max_backoff_s=0.5),
                               log=log)
    except InvalidArgument as exc:
        log.error("cannot reach the daemon (%s); nothing sent", exc)
        return None


#: per NodeEvent field: what a send is called in log lines, and its success line's verb
_WHAT = {"preempted": ("preemption of", "preempted"), "idle": ("idle report of", "reported idle")}


def _send(sender, log, *, field: str, source: str, job_id: str, deadline: float, tries: int,
          observe, again: str) -> str:
    """Send the hook's ``ReportNodes``, repeating it after a refusal (module docstring).

    Args:
        sender: a :class:`~offcut.slurm_plugin.rpc.NodeEventSender`.
        field: the event's node field, ``"preempted"`` or ``"idle"``.
        source: the event source.
        job_id: ``SLURM_JOB_ID`` (the seq's tag, :func:`event_time_and_seq`).
        deadline: ``time.monotonic()`` value [s] by which the last send must have started;
            each send's gRPC deadline is the time left.
        tries: the most sends.
        observe: ``observe(attempt) -> (time_ns, nodes)`` for send ``attempt`` (1-based): the
            event time [ns since the epoch] and the nodes; or an outcome word, returned as is
            (e.g. the epilog's re-check found nothing to send).
        again: how the log line of a refusal ends (what is done before the next send).

    Returns:
        ``"sent"``; ``"timeout"`` (no time left before a send); ``"failed"`` (a
        :class:`~offcut.slurm_plugin.rpc.DaemonError` other than FAILED_PRECONDITION, or
        FAILED_PRECONDITION on the last try); or an outcome word of ``observe``. Every
        outcome but ``"sent"`` is logged here or by ``observe``.
    """
    from offcut.slurm_plugin.nodelist import compress
    from offcut.slurm_plugin.rpc import DaemonError

    what, done = _WHAT[field]
    for attempt in range(1, tries + 1):
        got = observe(attempt)
        if isinstance(got, str):
            return got
        t_ns, nodes = got
        left = deadline - time.monotonic()
        if left <= 0:
            log.error("no time left to send the %s %s", what, compress(nodes))
            return "timeout"
        t_ns, seq = event_time_and_seq(t_ns, job_id)
        try:
            sent = sender.report(time_ns=t_ns, source=source, seq=seq, timeout_s=left,
                                 **{field: nodes})
        except DaemonError as exc:
            if exc.code == "FAILED_PRECONDITION" and attempt < tries:
                log.info("send %d refused (%s); a newer event got there first, %s", attempt,
                         exc.details, again)
                continue
            log.error("%s %s not delivered: %s", what, compress(nodes), exc)
            return "failed"
        log.info("%s %s (%s seq %d): %s", done, compress(nodes), source, seq, sent)
        return "sent"
    return "failed"  # (unreachable for tries >= 1: the last try returns above)


def run_prolog(args, log, env, deadline: float) -> str:
    """Report the job's nodes preempted, retrying a refusal with a fresh time (up to
    :data:`MAX_SENDS` sends). ``deadline``: ``time.monotonic()`` value [s] of the time budget.
    Returns a one-word outcome (for the final log line): ``no-nodes``, ``unreachable``,
    ``sent``, ``timeout`` or ``failed``; never raises for bad input or a failing daemon."""
    job_id = env.get("SLURM_JOB_ID", "?")
    nodes = _job_nodes(log, env)
    if not nodes:
        return "no-nodes"
    sender = _sender(args, log)
    if sender is None:
        return "unreachable"
    try:
        return _send(sender, log, field="preempted", source=args.source or SOURCES["prolog"],
                     job_id=job_id, deadline=deadline, tries=MAX_SENDS,
                     observe=lambda attempt: (time.time_ns(), nodes),
                     again="retrying with a fresh time")
    finally:
        sender.close()


def run_epilog(args, log, env, deadline: float) -> str:
    """Report the job's nodes idle: those Slurm confirms idle for Offcut now (``sinfo`` /
    ``squeue``, the job itself disregarded), or all of them with ``--no-check``. A refusal is
    answered by checking Slurm again and sending that new observation (once; never with
    ``--no-check``). ``deadline``: ``time.monotonic()`` value [s] of the time budget; the
    daemon calls get at most ``--timeout-s`` of it. Returns a one-word outcome: ``no-nodes``,
    ``check-failed``, ``none-idle``, ``unreachable``, ``sent``, ``timeout`` or ``failed``."""
    from offcut.slurm_plugin.nodelist import compress

    job_id = env.get("SLURM_JOB_ID", "?")
    nodes = _job_nodes(log, env)
    if not nodes:
        return "no-nodes"

    def check() -> tuple[int, list[str]] | str:
        """``(observation time [ns], the job's nodes idle now)``, or an outcome word."""
        if args.no_check:
            return time.time_ns(), nodes
        from offcut.slurm_plugin.slurm_cli import SlurmCLI
        from offcut.slurm_plugin.slurm_json import OwnJobRule, SlurmError
        from offcut.slurm_plugin.sources import CLISource, observe

        cli = SlurmCLI(sinfo=args.sinfo, squeue=args.squeue, slurm_conf=args.slurm_conf,
                       timeout_s=max(min(args.slurm_timeout_s, deadline - time.monotonic()), 0.1))
        rule = OwnJobRule(partitions=args.partitions, name_prefix=args.job_name_prefix,
                          comment_marker=args.job_comment)
        try:
            obs = observe(CLISource(cli), rule, node_partitions=args.partitions,
                          ignore_job_ids=[job_id])
        except SlurmError as exc:
            log.error("cannot check the nodes with Slurm (%s); nothing sent, the watcher "
                      "will report them", exc)
            return "check-failed"
        idle = set(obs.view.idle)
        for n in nodes:
            if n not in idle:
                log.info("not reporting %s: %s", n, obs.view.not_idle.get(n, "unknown to Slurm"))
        keep = [n for n in nodes if n in idle]
        if not keep:
            log.info("none of %s is idle for Offcut now; nothing sent", compress(nodes))
            return "none-idle"
        return obs.time_ns, keep

    first = check()  # before the sender: a hook with nothing to send never imports grpc
    if isinstance(first, str):
        return first
    sender = _sender(args, log)
    if sender is None:
        return "unreachable"
    # the daemon calls share --timeout-s; the Slurm checks have their own budget (check()
    # reads the shortened deadline too)
    deadline = min(deadline, time.monotonic() + args.timeout_s)
    try:
        return _send(sender, log, field="idle", source=args.source or SOURCES["epilog"],
                     job_id=job_id, deadline=deadline, tries=1 if args.no_check else 2,
                     observe=lambda attempt: first if attempt == 1 else check(),
                     again="checking Slurm again")
    finally:
        sender.close()


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
        from offcut.slurm_plugin.nodelist import partition_set

        args.partitions = partition_set(args.scavenger_partition or ["scavenger"])
        budget = max(args.timeout_s, 0.05)
        if kind == "epilog" and not args.no_check:
            # the first Slurm check: sinfo then squeue, each bounded by --slurm-timeout-s (a
            # re-check after a refusal gets only what is left of the daemon's --timeout-s)
            budget += 2 * max(args.slurm_timeout_s, 0.1)
        deadline = started + budget
        watchdog = _start_watchdog(max(deadline - time.monotonic(), 0) + 1.0, log)
        job_parts = {p for p in str(env.get("SLURM_JOB_PARTITION", "")).split(",") if p}
        if job_parts and job_parts <= args.partitions:
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

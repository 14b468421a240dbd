"""The prolog / epilog hooks (offcut.slurm_plugin.hooks) run as Slurm runs them -- a separate
process, Slurm's bare environment (no PATH, no SLURM_CONF), optionally SIGTERM blocked -- against
real daemons (conftest's ``daemons``), with crafted job environments: bad node lists, an
unreachable or hanging daemon, concurrent hooks, the epilog's Slurm check fed by fake
sinfo/squeue commands that print recorded answers. The real-cluster runs are in
test_slurm_integration.py. No Slurm needed here."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from offcut.slurm_plugin import hooks
from offcut.slurm_plugin.install import HookConfig, hook_command, write_hooks
from offcut.addresses import unreachable_reason
from daemon_helpers import make_spec
from slurm_cluster import fake_command, idle_set

DATA = Path(__file__).resolve().parent / "data" / "slurm"
NODES = ["n1", "n2", "n3", "n4"]


def job_env(nodelist="n[1-2]", partition="batch", job_id="101", **extra) -> dict:
    """What PrologSlurmctld / EpilogSlurmctld get from slurmctld (measured on 22.05): SLURM_*
    variables, no PATH, no SLURM_CONF."""
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_PARTITION": partition, "SLURM_JOB_USER": "root",
           "SLURM_JOB_NAME": "wrap", "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"}
    if nodelist is not None:
        env["SLURM_JOB_NODELIST"] = nodelist
    env.update(extra)
    return env


#: exec the rest of argv with SIGTERM blocked (inherited across exec), as slurmctld starts
#: PrologSlurmctld. Not a preexec_fn: Python code between fork and exec in this process,
#: whose gRPC threads hold locks, can abort the child (seen once under load: SIGABRT)
_BLOCK_SIGTERM = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, "
                  "{signal.SIGTERM}); os.execv(sys.argv[1], sys.argv[1:])")


def run_hook(kind: str, address: str, env: dict, log: Path, *args: str, timeout_s: float = 15.0,
             block_sigterm: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-I", "-m", "offcut.slurm_plugin.hooks", kind, "--address", address,
           "--timeout-s", str(timeout_s), "--log-file", str(log), "--log-level", "debug", *args]
    if block_sigterm:
        cmd = [sys.executable, "-I", "-c", _BLOCK_SIGTERM, *cmd]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - t0


@pytest.fixture
def pool(daemon):
    """A daemon whose idle pool is n1..n4."""
    srv, client = daemon
    client.report_nodes(time.time(), "test-setup", 1, idle=NODES)
    assert idle_set(client) == set(NODES)
    return srv, client


# ----------------------------------------------------------------------------- prolog
def test_prolog_preempts_the_jobs_nodes(pool, tmp_path):
    srv, client = pool
    log = tmp_path / "hooks.log"
    proc, took = run_hook("prolog", client.address, job_env("n[1-2]"), log, block_sigterm=True)
    assert proc.returncode == 0 and proc.stdout == ""
    assert idle_set(client) == {"n3", "n4"}
    text = log.read_text()
    assert "preempted n[1-2] (slurm-prolog seq" in text and "done (sent)" in text
    assert client.status().last_seq["slurm-prolog"] > 0
    assert took < 5


def test_prolog_skips_scavenger_jobs(pool, tmp_path):
    srv, client = pool
    rev = client.status().revision
    for part in ("scavenger", "scav2,scavenger"):
        proc, _ = run_hook("prolog", client.address, job_env("n[1-2]", partition=part),
                           tmp_path / "hooks.log", "--scavenger-partition", "scavenger,scav2")
        assert proc.returncode == 0
    assert client.status().revision == rev and idle_set(client) == set(NODES)
    assert tmp_path.joinpath("hooks.log").read_text().count("done (skipped)") == 2


@pytest.mark.parametrize("nodelist,message", [
    (None, "empty node list"),
    ("", "empty node list"),
    ("   ", "empty node list"),
    ("n[1-", "malformed"),
    ("n[4-1]", "malformed"),
    ("n[1-99999999]", "limit"),
    ("bad name!,-x", "no valid node name"),
])
def test_prolog_garbage_nodelist_sends_nothing(pool, tmp_path, nodelist, message):
    srv, client = pool
    rev = client.status().revision
    log = tmp_path / "hooks.log"
    proc, took = run_hook("prolog", client.address, job_env(nodelist), log)
    assert proc.returncode == 0
    text = log.read_text()
    assert "WARNING" in text and message in text and "done (no-nodes)" in text
    assert client.status().revision == rev
    assert took < 5


def test_prolog_drops_invalid_names_and_daemon_ignores_unknown_ones(pool, tmp_path):
    srv, client = pool
    log = tmp_path / "hooks.log"
    proc, _ = run_hook("prolog", client.address, job_env("n1,zz[1-2],bad name"), log)
    assert proc.returncode == 0
    assert idle_set(client) == {"n2", "n3", "n4"}
    text = log.read_text()
    assert "dropping 1 node names" in text
    assert "ignored (not idle in the daemon): zz1,zz2" in text


def test_prolog_daemon_socket_missing_exits_fast(tmp_path):
    log = tmp_path / "hooks.log"
    address = f"unix://{tmp_path}/nothing-here.sock"
    proc, took = run_hook("prolog", address, job_env(), log, block_sigterm=True)
    assert proc.returncode == 0
    assert took < 3.0, took  # no grpc import, no connection attempt (about 0.03 s unloaded)
    text = log.read_text()
    assert "daemon unreachable" in text and "does not exist" in text and "done (unreachable)" in text


def test_prolog_tcp_refused_exits_fast(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    log = tmp_path / "hooks.log"
    proc, took = run_hook("prolog", f"127.0.0.1:{port}", job_env(), log, timeout_s=2)
    assert proc.returncode == 0 and took < 3.0
    assert "UNAVAILABLE" in log.read_text()


def test_prolog_hanging_daemon_is_cut_at_the_timeout(tmp_path):
    """A peer that accepts TCP connections but never speaks gRPC: the deadline ends the call,
    SIGTERM is blocked (as in slurmctld's prolog) and the hook still exits 0 in time."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)  # never accept()ed: the handshake completes, nothing ever answers
    try:
        log = tmp_path / "hooks.log"
        proc, took = run_hook("prolog", f"127.0.0.1:{srv.getsockname()[1]}", job_env(), log,
                              timeout_s=1.0, block_sigterm=True)
    finally:
        srv.close()
    assert proc.returncode == 0
    assert took < 5.0, took  # (the attempts, retries of UNAVAILABLE included, end by 1 s)
    text = log.read_text()
    assert "not delivered" in text and ("DEADLINE_EXCEEDED" in text or "UNAVAILABLE" in text)


def prolog_with_clock(client, tmp_path, monkeypatch, time_ns) -> str:
    """Run the prolog hook for a job on n3 with ``time_ns`` as the Slurm host's clock;
    returns its log."""
    monkeypatch.setattr(hooks.time, "time_ns", time_ns)
    log = tmp_path / "hooks.log"
    try:
        assert hooks.main(["prolog", "--address", client.address, "--log-file", str(log)],
                          env=job_env("n3")) == 0
    finally:
        monkeypatch.undo()
    return log.read_text()


def test_prolog_stamped_behind_the_daemons_clock_is_applied_at_once(daemon, tmp_path,
                                                                     monkeypatch):
    """Was: a node event stamped before the daemon's event clock (moved on by a submission the
    daemon stamped itself) was refused as older (FAILED_PRECONDITION). A live daemon applies
    node events at its own receive time: hooks on a host whose clock is a minute behind the
    daemon's are applied on their first send."""
    srv, client = daemon
    real = time.time_ns
    behind = lambda: real() - 60_000_000_000  # noqa: E731 - the Slurm host's clock
    client.report_nodes(behind() / 1e9, "test-setup", 1, idle=NODES)
    client.submit(make_spec("moves-the-clock"), owner="alice")  # the clock: the daemon's now
    text = prolog_with_clock(client, tmp_path, monkeypatch, behind)
    assert "preempted n3" in text and "refused" not in text
    assert "n3" not in idle_set(client)


def test_prolog_observed_before_a_newer_node_event_observes_again(pool, tmp_path, monkeypatch):
    """Node events are ordered among themselves by when Slurm's side observed them: a hook
    event observed before one another source got in first is refused (FAILED_PRECONDITION)
    and the hook observes again with a fresh time."""
    srv, client = pool
    real = time.time_ns
    first = real()
    client.report_nodes((first + 50_000_000) / 1e9, "other", 1, idle=["n9"])
    calls = []

    def fake_time_ns():
        calls.append(1)
        return first if len(calls) == 1 else real() + 100_000_000
    text = prolog_with_clock(client, tmp_path, monkeypatch, fake_time_ns)
    assert "send 1 refused" in text and "preempted n3" in text
    assert "n3" not in idle_set(client)


def test_send_retries_refusals_with_fresh_observations():
    """The send loop shared by prolog and epilog: a FAILED_PRECONDITION is answered with a new
    observation while tries remain; an observation may end it with its own outcome."""
    import logging

    from offcut.slurm_plugin.rpc import DaemonError

    class Refusing:
        def __init__(self, refusals):
            self.refusals, self.sent = refusals, []

        def report(self, **kw):
            self.sent.append(kw)
            if len(self.sent) <= self.refusals:
                raise DaemonError("FAILED_PRECONDITION", "older than the last event")
            return "ok"

    log = logging.getLogger("offcut.slurm.test")
    far = time.monotonic() + 60
    observed = []

    def observe(attempt):
        observed.append(attempt)
        return 1_700_000_000_000_000_000 + attempt * 1000, ["n1"]

    sender = Refusing(refusals=2)
    assert hooks._send(sender, log, field="preempted", source="s", job_id="7", deadline=far,
                       tries=3, observe=observe, again="again") == "sent"
    assert observed == [1, 2, 3] and [kw["preempted"] for kw in sender.sent] == [["n1"]] * 3
    assert len({kw["seq"] for kw in sender.sent}) == 3
    assert hooks._send(Refusing(refusals=5), log, field="idle", source="s", job_id="7",
                       deadline=far, tries=2, observe=observe, again="again") == "failed"
    assert hooks._send(Refusing(refusals=1), log, field="idle", source="s", job_id="7",
                       deadline=far, tries=2, again="again",
                       observe=lambda a: observe(a) if a == 1 else "none-idle") == "none-idle"
    assert hooks._send(Refusing(refusals=0), log, field="idle", source="s", job_id="7",
                       deadline=time.monotonic() - 1, tries=2, observe=observe,
                       again="again") == "timeout"


def test_concurrent_prologs_all_arrive(pool, tmp_path):
    """Eight prologs of different jobs at once: none may reject another's preemption."""
    srv, client = pool
    client.report_nodes(time.time(), "test-setup", 2, idle=[f"m{i}" for i in range(8)])
    log = tmp_path / "hooks.log"

    def one(i):
        return run_hook("prolog", client.address, job_env(f"m{i}", job_id=str(200 + i)), log)[0]
    with ThreadPoolExecutor(8) as ex:
        procs = list(ex.map(one, range(8)))
    assert all(p.returncode == 0 for p in procs)
    assert idle_set(client) == set(NODES)
    text = log.read_text()
    assert text.count("done (sent)") == 8, text


def test_seq_scheme():
    t = 1_700_000_000_123_456_789
    t_us, seq = hooks.event_time_and_seq(t, "12345")
    assert t_us == 1_700_000_000_123_456_000 and seq == t_us + 345
    # two jobs in the same microsecond never share a seq; later microseconds always win
    assert hooks.event_time_and_seq(t, "12346")[1] != seq
    assert hooks.event_time_and_seq(t + 1000, "0")[1] > hooks.event_time_and_seq(t, "999")[1]
    assert hooks.event_time_and_seq(t, "garbage")[1] // 1000 == t // 1000


def test_token_is_sent_but_never_logged(pool, tmp_path):
    srv, client = pool
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t-t0ken\n")
    log = tmp_path / "hooks.log"
    proc, _ = run_hook("prolog", client.address, job_env("n4"), log, "--token-file", str(token_file))
    assert proc.returncode == 0 and "n4" not in idle_set(client)
    text = log.read_text()
    assert "s3cr3t" not in text and "s3cr3t" not in proc.stderr
    # an unreadable token file is logged by path only
    proc, _ = run_hook("prolog", client.address, job_env("n3"), log, "--token-file",
                       str(tmp_path / "missing"))
    assert proc.returncode == 0 and "token file unusable" in log.read_text()


def test_bad_arguments_and_crashes_still_exit_zero(tmp_path):
    cmd = [sys.executable, "-I", "-m", "offcut.slurm_plugin.hooks", "prolog"]  # no --address
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--address" in proc.stderr
    proc = subprocess.run(cmd + ["--address", "unix:///x", "--timeout-s", "oops"], env=job_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0


def test_unreachable_reason():
    assert unreachable_reason("unix:///definitely/not/here.sock").endswith("(is offcutd running?)")
    assert "is not a socket" in unreachable_reason(f"unix://{__file__}")
    assert unreachable_reason("127.0.0.1:1") is None


# ----------------------------------------------------------------------------- epilog
def test_epilog_reports_only_nodes_slurm_confirms_idle(pool, tmp_path):
    srv, client = pool
    client.report_nodes(time.time(), "test-setup", 2, preempted=NODES)
    assert idle_set(client) == set()
    sinfo = fake_command(tmp_path / "sinfo", f"cat {DATA / 'sinfo-22.05-drain-resv-maint.json'}")
    squeue = fake_command(tmp_path / "squeue", f"cat {DATA / 'squeue-22.05-completing.json'}")
    log = tmp_path / "hooks.log"
    proc, _ = run_hook("epilog", client.address, job_env("n[1-4]", job_id="1"), log,
                       "--sinfo", sinfo, "--squeue", squeue)
    assert proc.returncode == 0
    assert idle_set(client) == {"n2"}  # n1 maintenance, n3 reserved, n4 drained
    text = log.read_text()
    assert "not reporting n4: drain" in text and "reported idle n2" in text


def test_epilog_no_check_reports_all(pool, tmp_path):
    srv, client = pool
    client.report_nodes(time.time(), "test-setup", 2, preempted=["n1", "n2"])
    log = tmp_path / "hooks.log"
    proc, _ = run_hook("epilog", client.address, job_env("n[1-2]"), log, "--no-check")
    assert proc.returncode == 0 and idle_set(client) == set(NODES)


@pytest.mark.parametrize("body,message", [
    ("echo 'slurm_load_node: Unable to contact slurm controller' >&2; exit 1",
     "sinfo exited with status 1: slurm_load_node: Unable to contact slurm controller"),
    ("echo '<html>not json'", "not JSON"),
    ("echo '{\"meta\": {}}'", "neither a 'nodes' nor a 'sinfo' list"),
])
def test_epilog_sends_nothing_when_slurm_cannot_confirm(pool, tmp_path, body, message):
    srv, client = pool
    client.report_nodes(time.time(), "test-setup", 2, preempted=["n1"])
    rev = client.status().revision
    log = tmp_path / "hooks.log"
    sinfo = fake_command(tmp_path / "sinfo", body)
    squeue = fake_command(tmp_path / "squeue", f"cat {DATA / 'squeue-22.05-completing.json'}")
    proc, _ = run_hook("epilog", client.address, job_env("n1"), log, "--sinfo", sinfo, "--squeue", squeue)
    assert proc.returncode == 0
    assert client.status().revision == rev
    text = log.read_text()
    assert "cannot check the nodes with Slurm" in text and message in text


def test_epilog_slurm_check_hang_is_bounded(pool, tmp_path):
    srv, client = pool
    sinfo = fake_command(tmp_path / "sinfo", "exec sleep 30")
    log = tmp_path / "hooks.log"
    proc, took = run_hook("epilog", client.address, job_env("n1"), log, "--sinfo", sinfo,
                          "--slurm-timeout-s", "0.5")
    assert proc.returncode == 0 and took < 3
    assert "did not answer within 0.5 s" in log.read_text()


# ----------------------------------------------------------------------------- wrappers
def test_install_hooks_writes_absolute_wrappers(tmp_path):
    paths = write_hooks(tmp_path / "h", HookConfig(address="unix:///run/o.sock", timeout_s=1.5,
                                                   slurm_conf="/etc/slurm/slurm.conf"))
    for kind, path in paths.items():
        text = path.read_text()
        assert path.stat().st_mode & stat.S_IXUSR
        assert text.startswith("#!/bin/sh\n") and text.rstrip().endswith("exit 0")
        assert f"{os.path.abspath(sys.executable)} -I -m offcut.slurm_plugin.hooks {kind}" in text
        assert subprocess.run(["sh", "-n", str(path)]).returncode == 0
    epilog = hook_command("epilog", HookConfig(address="a:1"), "/l")
    assert os.path.isabs(epilog[epilog.index("--sinfo") + 1]) or epilog[epilog.index("--sinfo") + 1] == "sinfo"


def test_wrapper_exits_zero_even_without_a_python(tmp_path):
    cfg = HookConfig(address="unix:///nowhere.sock", python=str(tmp_path / "gone" / "python"))
    paths = write_hooks(tmp_path / "h", cfg)
    proc = subprocess.run([paths["prolog"]], env=job_env(), capture_output=True, timeout=30)
    assert proc.returncode == 0
    assert "gone/python" in (tmp_path / "h" / "offcut-hooks.log").read_text()


def test_wrapper_runs_in_a_bare_environment(pool, tmp_path):
    srv, client = pool
    paths = write_hooks(tmp_path / "h", HookConfig(address=client.address))
    proc = subprocess.run([sys.executable, "-I", "-c", _BLOCK_SIGTERM, paths["prolog"]],
                          env=job_env("n2"), capture_output=True, timeout=30)
    assert proc.returncode == 0
    assert "n2" not in idle_set(client)
    assert "done (sent)" in (tmp_path / "h" / "offcut-hooks.log").read_text()


def test_install_hooks_command(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    proc = subprocess.run([sys.executable, "-m", "offcut.slurm_plugin.cli", "install-hooks",
                           "--dir", str(tmp_path / "hooks"), "--address", "unix:///run/o.sock",
                           "--timeout-s", "3", "--slurm-conf", str(conf),
                           "--scavenger-partition", "scav,lowprio", "--job-name-prefix", "offcut-"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"PrologSlurmctld={tmp_path}/hooks/prolog_ctld.sh" in lines
    assert f"EpilogSlurmctld={tmp_path}/hooks/epilog_ctld.sh" in lines
    assert "PrologEpilogTimeout=30" in lines
    epilog = (tmp_path / "hooks" / "epilog_ctld.sh").read_text()
    assert f"--slurm-conf {conf}" in epilog and "--job-name-prefix offcut-" in epilog
    assert "--scavenger-partition lowprio --scavenger-partition scav" in epilog


def test_node_events_ride_through_a_daemon_restart(daemons):
    """The hooks' and the watcher's sender repeats a node event while the daemon restarts
    (UNAVAILABLE), with the backoff every client shares; without a policy it fails at once.
    The daemon comes back during the first wait (the policy's injected sleep starts it)."""
    from offcut.retry import Backoff
    from offcut.slurm_plugin.rpc import DaemonError, NodeEventSender

    srv, client = daemons.start()
    address = client.address
    daemons.stop(srv)
    with NodeEventSender(address, timeout_s=5) as plain:
        with pytest.raises(DaemonError) as err:
            plain.report(time_ns=time.time_ns(), source="slurm-epilog", seq=1, idle=["n1"])
    assert err.value.code == "UNAVAILABLE"
    restarted = []

    def wait(seconds: float) -> None:
        if not restarted:
            restarted.append(daemons.start())

    policy = Backoff(deadline_s=30, sleep=wait)
    with NodeEventSender(address, timeout_s=30, retry=policy) as sender:
        sent = sender.report(time_ns=time.time_ns(), source="slurm-epilog", seq=1,
                             idle=["n1", "n2"])
    assert restarted and policy.retries >= 1
    assert sent.idle_nodes == 2 and not sent.duplicate
    assert idle_set(restarted[0][1]) == {"n1", "n2"}


def test_a_retry_policy_gives_up_at_its_deadline(daemons):
    from offcut.retry import Backoff
    from offcut.slurm_plugin.rpc import DaemonError, NodeEventSender

    srv, client = daemons.start()
    address = client.address
    daemons.stop(srv)
    now = [0.0]

    def wait(seconds: float) -> None:
        now[0] += seconds

    policy = Backoff(deadline_s=2.0, sleep=wait, clock=lambda: now[0])
    with NodeEventSender(address, timeout_s=2.0, retry=policy) as sender:
        with pytest.raises(DaemonError) as err:
            sender.sync(time_ns=time.time_ns(), source="slurm-watch", seq=1, idle=["n1"])
    assert err.value.code == "UNAVAILABLE"
    assert policy.retries >= 3 and now[0] <= 2.0  # waited only within the deadline

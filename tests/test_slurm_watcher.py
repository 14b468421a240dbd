"""The watcher (``offcut-slurm watch``) against real daemons, fed by fake ``sinfo`` /
``squeue`` commands that print recorded answers, fail, hang, or print garbage; its loop's
error handling and recovery; the pyslurm selection. The real-cluster runs are in
test_slurm_integration.py. No Slurm needed here."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offcut.slurm_plugin.rpc import NodeEventSender
from offcut.slurm_plugin.slurm_cli import SlurmCLI
from offcut.slurm_plugin.slurm_json import OwnJobRule, SlurmCommandError, SlurmError
from offcut.slurm_plugin.sources import CLISource, choose_source, pyslurm_unusable_reason
from offcut.slurm_plugin.watcher import Watcher
from slurm_cluster import fake_command as fake
from slurm_cluster import idle_set

DATA = Path(__file__).resolve().parent / "data" / "slurm"


def cat(name: str) -> str:
    return f"cat {DATA / name}"


def watch_once(address: str, sinfo: str, squeue: str, log: Path, *args: str):
    cmd = [sys.executable, "-m", "offcut.slurm_plugin.cli", "watch", "--once", "--address", address,
           "--sinfo", sinfo, "--squeue", squeue, "--pyslurm", "never", "--log-file", str(log), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - t0


def test_watch_once_sends_the_idle_set(daemon, tmp_path):
    srv, client = daemon
    log = tmp_path / "watch.log"
    proc, _ = watch_once(client.address, fake(tmp_path / "sinfo", cat("sinfo-22.05-down-draining.json")),
                         fake(tmp_path / "squeue", cat("squeue-22.05-down-draining.json")), log)
    assert proc.returncode == 0, log.read_text()
    assert idle_set(client) == {"n1"}
    st = client.status()
    assert st.last_seq["slurm-watch"] > 1_600_000_000 * 10**9  # time-based seq
    # a second snapshot from other data: the daemon diffs it
    proc, _ = watch_once(client.address, fake(tmp_path / "sinfo", cat("sinfo-22.05-offcut-jobs.json")),
                         fake(tmp_path / "squeue", cat("squeue-22.05-offcut-jobs.json")), log,
                         "--job-comment", "offcut")
    assert proc.returncode == 0
    assert idle_set(client) == {"n1", "n2", "n3"}  # n4's job has no "offcut" comment
    assert client.status().last_seq["slurm-watch"] > st.last_seq["slurm-watch"]


@pytest.mark.parametrize("sinfo_body,squeue_body,message", [
    ("echo 'sinfo: error: Unable to contact slurm controller' >&2; exit 1", None,
     "sinfo exited with status 1: sinfo: error: Unable to contact slurm controller"),
    ("echo 'Segmentation fault'", None, "sinfo printed something that is not JSON"),
    ("true", None, "sinfo printed nothing"),
    ("echo '[1, 2]'", None, "a JSON list, not an object"),
    ("echo '{\"nodes\": []}'", None, "lists no node"),
    ("echo '{\"nodes\": [{\"name\": \"n1\"}]}'", None, "has no state"),
    ("echo '{\"errors\": [{\"error\": \"Invalid user\"}], \"nodes\": []}'", None, "Invalid user"),
    (cat("sinfo-22.05-idle.json"), "exit 3", "squeue exited with status 3"),
    (cat("sinfo-22.05-idle.json"), "echo '{\"jobs\": 5}'", "no 'jobs' list"),
    (cat("sinfo-22.05-idle.json"), "echo '{\"jobs\": [{\"job_id\": 1, \"job_state\": \"RUNNING\", \"nodes\": \"n[1-\"}]}'",
     "malformed node list"),
])
def test_watch_once_bad_slurm_output_sends_nothing(daemon, tmp_path, sinfo_body, squeue_body, message):
    srv, client = daemon
    rev = client.status().revision
    log = tmp_path / "watch.log"
    proc, _ = watch_once(client.address, fake(tmp_path / "sinfo", sinfo_body),
                         fake(tmp_path / "squeue", squeue_body or cat("squeue-22.05-completing.json")), log)
    assert proc.returncode == 1
    text = log.read_text()
    assert text.count("ERROR") == 1 and message in text and "nothing sent" in text, text
    assert client.status().revision == rev


def test_watch_once_slurm_hang_and_missing_commands(daemon, tmp_path):
    srv, client = daemon
    log = tmp_path / "watch.log"
    proc, took = watch_once(client.address, fake(tmp_path / "sinfo", "exec sleep 60"),
                            fake(tmp_path / "squeue", "true"), log, "--slurm-timeout-s", "1")
    assert proc.returncode == 1 and took < 10
    assert "sinfo did not answer within 1 s" in log.read_text()
    proc, _ = watch_once(client.address, str(tmp_path / "no-such-sinfo"), "squeue", log)
    assert proc.returncode == 1 and "no-such-sinfo: not an executable file" in log.read_text()
    proc = subprocess.run([sys.executable, "-m", "offcut.slurm_plugin.cli", "watch", "--once",
                           "--address", client.address, "--sinfo", "offcut-no-such-sinfo",
                           "--pyslurm", "never"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not found in PATH" in proc.stderr
    assert client.status().revision == 0


def test_watch_once_daemon_unreachable(tmp_path):
    log = tmp_path / "watch.log"
    proc, took = watch_once(f"unix://{tmp_path}/none.sock", fake(tmp_path / "sinfo", cat("sinfo-22.05-idle.json")),
                            fake(tmp_path / "squeue", cat("squeue-22.05-completing.json")), log,
                            "--timeout-s", "2")
    assert proc.returncode == 1 and took < 10
    assert "snapshot not delivered: UNAVAILABLE" in log.read_text()


def test_idle_command_prints_the_view(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "offcut.slurm_plugin.cli", "idle",
                           "--sinfo", fake(tmp_path / "sinfo", cat("sinfo-22.05-preempting.json")),
                           "--squeue", fake(tmp_path / "squeue", cat("squeue-22.05-preempting.json"))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["idle"] == ["n1", "n2"]
    assert out["not_idle"]["n3"] == "Offcut job 3 is being preempted"


# ----------------------------------------------------------------------------- the loop
class ScriptedSource:
    """Answers from a list: a (sinfo, squeue) pair of recorded files, or an exception."""

    name = "scripted"

    def __init__(self, script, before_fetch=None):
        self.script = list(script)
        self.before_fetch = before_fetch
        self.calls = 0

    def fetch(self):
        self.calls += 1
        if self.before_fetch:
            self.before_fetch(self.calls)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return tuple(json.loads((DATA / f).read_text()) for f in item)


IDLE = ("sinfo-22.05-idle.json", "squeue-22.05-completing.json")
DRAIN = ("sinfo-22.05-drain-resv-maint.json", "squeue-22.05-completing.json")


def test_loop_logs_one_error_keeps_going_and_recovers(daemon, caplog):
    srv, client = daemon
    boom = SlurmCommandError("sinfo exited with status 1: controller down")
    src = ScriptedSource([IDLE, boom, boom, boom, DRAIN, IDLE])
    with NodeEventSender(client.address, timeout_s=5) as sender:
        w = Watcher(src, sender)
        caplog.set_level(logging.DEBUG, logger="offcut.slurm")
        results = [w.step() for _ in range(6)]
    assert results == [True, False, False, False, True, True]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "controller down" in errors[0].getMessage()
    assert any("recovered after" in r.getMessage() for r in caplog.records)
    assert idle_set(client) == {"n1", "n2", "n3", "n4"}
    assert client.status().revision == 3  # three snapshots applied, none from the failures


def test_loop_run_stops_on_event(daemon):
    import threading

    srv, client = daemon
    stop = threading.Event()
    src = ScriptedSource([IDLE] * 100, before_fetch=lambda n: n >= 3 and stop.set())
    with NodeEventSender(client.address, timeout_s=5) as sender:
        t0 = time.monotonic()
        assert Watcher(src, sender).run(0.05, stop=stop) is True
    assert src.calls == 3 and time.monotonic() - t0 < 5


def test_stale_snapshot_is_refused_and_reobserved(daemon):
    """A hook event applied while Slurm was being asked makes the snapshot older than the
    daemon's clock: the watcher asks Slurm again rather than re-stamping old data."""
    srv, client = daemon

    def hook_runs_meanwhile(n):
        if n == 1:
            client.report_nodes(time.time(), "slurm-prolog", 1, preempted=["n1"])
    src = ScriptedSource([IDLE, DRAIN], before_fetch=hook_runs_meanwhile)
    with NodeEventSender(client.address, timeout_s=5) as sender:
        assert Watcher(src, sender).step() is True
    assert src.calls == 2
    assert idle_set(client) == {"n2"}  # from the second observation


def test_watcher_seq_is_monotone_even_if_the_clock_is_not():
    w = Watcher(ScriptedSource([]), None)
    assert w._seq(100) == 100 and w._seq(50) == 101 and w._seq(500) == 500


def test_dry_run_sends_nothing(daemon):
    srv, client = daemon
    w = Watcher(ScriptedSource([DRAIN]), None, rule=OwnJobRule())
    assert w.step() is True and w.last_idle == ["n2"]
    assert client.status().revision == 0


# ----------------------------------------------------------------------------- pyslurm choice
def test_pyslurm_not_installed_falls_back_to_the_cli(caplog, tmp_path):
    cli = SlurmCLI(sinfo=fake(tmp_path / "sinfo", "echo 'slurm-wlm 22.05.8'"))
    caplog.set_level(logging.INFO, logger="offcut.slurm")
    src = choose_source(cli, "auto", logging.getLogger("offcut.slurm.watch"))
    assert isinstance(src, CLISource)
    assert "pyslurm not used (pyslurm is not installed)" in caplog.text
    with pytest.raises(SlurmError, match="required but unusable"):
        choose_source(cli, "require", logging.getLogger("offcut.slurm.watch"))
    assert isinstance(choose_source(cli, "never", logging.getLogger("x")), CLISource)


def test_pyslurm_version_and_config_guards(monkeypatch, tmp_path):
    from importlib import metadata

    installed = {"v": "25.11.0"}

    def version(name):
        if name == "pyslurm":
            return installed["v"]
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    cli = SlurmCLI(sinfo=fake(tmp_path / "sinfo", "echo 'slurm-wlm 22.05.8'"))
    assert "does not match Slurm 22.05.8" in pyslurm_unusable_reason(cli)
    installed["v"] = "22.5.1"
    cli.slurm_conf = str(tmp_path / "missing.conf")
    assert "no slurm.conf is reachable" in pyslurm_unusable_reason(cli)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    cli.slurm_conf = str(conf)
    # the version matches and a conf exists: the import is tried in a probe process first
    # (no pyslurm here, so the probe fails and this process lives on)
    assert "kills a probe process" in pyslurm_unusable_reason(cli)
    broken = SlurmCLI(sinfo=fake(tmp_path / "sinfo2", "exit 1"))
    assert "Slurm version is unknown" in pyslurm_unusable_reason(broken)


def test_only_changes_are_sent_until_the_resync_interval(daemon):
    """An unchanged idle set is not sent (the daemon would journal it) until ``resync_s``
    after the last accepted snapshot; a change is sent at once."""
    srv, client = daemon
    now = [1000.0]
    src = ScriptedSource([IDLE, IDLE, IDLE, DRAIN, DRAIN, DRAIN])
    with NodeEventSender(client.address, timeout_s=5) as sender:
        w = Watcher(src, sender, resync_s=600.0, monotonic=lambda: now[0])
        revisions = []
        for dt in (0, 30, 30, 30, 30, 600):
            now[0] += dt
            assert w.step() is True
            revisions.append(client.status().revision)
    # IDLE sent; two unchanged IDLE not; DRAIN sent; DRAIN 30 s later not; 630 s later resent
    assert revisions == [1, 1, 1, 2, 2, 3] and src.calls == 6
    assert idle_set(client) == {"n2"}
    # a snapshot that could not be delivered (a change while the daemon was down): the next
    # observation is sent even when it equals the last accepted one
    with NodeEventSender("unix:///nonexistent/offcut.sock", timeout_s=1) as down:
        w.sender = down
        w.source = ScriptedSource([IDLE])
        assert w.step() is False
    with NodeEventSender(client.address, timeout_s=5) as sender:
        w.sender = sender
        w.source = ScriptedSource([DRAIN])
        now[0] += 1
        assert w.step() is True and client.status().revision == 4


def test_what_nodes_have_is_sent_and_a_change_of_it_alone_is_sent_again(daemon):
    """The snapshot carries each node's GPUs and features (from sinfo's gres and
    active_features); a change of those alone, the idle set unchanged, is sent at once."""
    srv, client = daemon
    sinfo = json.loads((DATA / "sinfo-22.05-gres.json").read_text())
    squeue = {"jobs": [], "errors": []}

    class Docs:
        name = "docs"

        def fetch(self):
            return json.loads(json.dumps(sinfo)), squeue

    with NodeEventSender(client.address, timeout_s=5) as sender:
        w = Watcher(Docs(), sender, resync_s=600.0)
        assert w.step() is True
        assert w.last_kinds == {"n1": (0, ()), "n2": (1, ("a100", "ib"))}
        revision = client.status().revision
        assert w.step() is True and client.status().revision == revision  # nothing new
        for node in sinfo["nodes"]:
            if node["name"] == "n2":
                node["gres"] = "gpu:2"
        assert w.step() is True and client.status().revision == revision + 1
        assert w.last_kinds["n2"] == (2, ("a100", "ib"))

"""The researcher-facing CLI (``offcut submit/queue/show/cancel/watch/status``) against a real
daemon on a unix socket, run through typer's CliRunner; and its input parsing."""

from __future__ import annotations

import getpass
import json
import threading
import time
import urllib.request

import hostlist
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from daemon_helpers import make_spec, wait_until

from offcut.client.cli import app
from offcut.client.taskspec import make_task_spec, parse_node_range, read_scalability_csv
from offcut.errors import InvalidArgument
from offcut.views import TaskState
from offcut.wire.tasks import time_to_pb

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def one_line_error(result, code: int, *needles: str) -> str:
    """A failed command: the exit code, exactly one line on stderr, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in result.output, err
    assert err.startswith("offcut: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.fixture
def curve(tmp_path):
    path = tmp_path / "curve.csv"
    path.write_text("nodes,throughput\n1,100\n2,190\n4,360\n")
    return path


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize("text,expected", [("4", (4, 4)), ("2-8", (2, 8)), (" 1 - 3 ", (1, 3))])
def test_node_range_accepts_sbatch_syntax(text, expected):
    assert parse_node_range(text) == expected


@pytest.mark.parametrize("text,needle", [("4-2", "exceeds"), ("0", ">= 1"), ("abc", "not a node"),
                                         ("", "not a node"), ("1-", "not a node"), ("-3", "not a node")])
def test_node_range_rejects_bad_ranges(text, needle):
    with pytest.raises(InvalidArgument, match=needle) as info:
        parse_node_range(text)
    assert info.value.field == "nodes"


@pytest.mark.parametrize("body,needle", [
    ("", "empty file"),
    ("count,rate\n1,2\n", "missing column(s) nodes, throughput"),
    ("nodes,throughput\n1,abc\n", "line 2: column 'throughput'"),
    ("nodes,throughput\n1,10\nx,20\n", "line 3: column 'nodes'"),
    ("nodes,throughput\n2,10\n1,20\n", "increase strictly"),
    ("nodes,throughput\n1,-5\n", ">= 0"),
    ("nodes,throughput\n1,nan\n", "finite"),
    ("nodes,throughput\n", "no data rows"),
    ("nodes,throughput\n1\n", "expected 2 fields"),
])
def test_scalability_csv_errors_name_file_and_line(tmp_path, body, needle):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InvalidArgument) as info:
        read_scalability_csv(path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_scalability_csv_and_spec(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("nodes,throughput,note\n0,0,\n1,10,a\n2,18,b\n4,30,c\n")
    curve = read_scalability_csv(path)
    assert curve == ([1, 2, 4], [10.0, 18.0, 30.0])
    spec = make_task_spec("t", nodes="1-4", work_samples=1e6, scalability=curve, objective="speedup")
    assert list(spec.node_counts) == [0, 1, 2, 4]
    assert list(spec.throughputs) == [0.0, 10.0, 18.0, 30.0]
    assert list(spec.objective_values) == pytest.approx([0.0, 1.0, 1.8, 3.0])
    with pytest.raises(InvalidArgument, match="curve ends at 4 nodes"):
        make_task_spec("t", nodes="1-8", work_samples=1e6, scalability=curve)
    with pytest.raises(InvalidArgument, match="work"):
        make_task_spec("t", nodes="1-4", work_samples=0, scalability=curve)
    # the daemon's own rules, checked before anything is sent (offcut.taskspec)
    with pytest.raises(InvalidArgument) as info:
        make_task_spec("x" * 201, nodes="1-4", work_samples=1e6, scalability=curve)
    assert str(info.value).startswith("spec.name:")
    with pytest.raises(InvalidArgument) as info:
        make_task_spec("t", nodes="1-4", work_samples=1e6, scalability=([1, 2, 4], [1.0, -2.0, 3.0]))
    assert str(info.value).startswith("spec.throughputs:")


# ------------------------------------------------------------------ CLI, bad input
def test_submit_bad_input_is_one_line(curve, tmp_path, daemon):
    srv, _ = daemon
    addr = srv.address
    base = ["submit", "--name", "x", "--work", "1e6", "--address", addr]
    one_line_error(run(*base, "--nodes", "4-2", "--scalability", str(curve)), 2, "--nodes", "exceeds")
    one_line_error(run(*base, "--nodes", "abc", "--scalability", str(curve)), 2, "--nodes")
    one_line_error(run(*base, "--nodes", "0", "--scalability", str(curve)), 2, "--nodes")
    one_line_error(run(*base, "--nodes", "1-2", "--scalability", str(tmp_path / "none.csv")), 2,
                   "--scalability", "no such file")
    bad = tmp_path / "bad.csv"
    bad.write_text("nodes;throughput\n1;2\n")
    one_line_error(run(*base, "--nodes", "1-2", "--scalability", str(bad)), 2, "missing column")
    one_line_error(run(*base, "--nodes", "1-2", "--scalability", str(curve), "--objective", "fun"), 2,
                   "--objective")
    one_line_error(run(*base, "--nodes", "1-2", "--constraint", "a100|v100"), 2, "--constraint",
                   "only features joined with '&'")
    one_line_error(run(*base, "--nodes", "1-2", "--gpus-per-node", "65"), 2, "--gpus-per-node",
                   "0 to 64")
    one_line_error(run(*base, "--nodes", "1-2", "--gpus-per-node", "-1"), 2, "--gpus-per-node")
    one_line_error(run(*base, "--nodes", "1-2", "--procs-per-node", "65"), 2, "--procs-per-node",
                   "0 to 64")
    one_line_error(run(*base, "--nodes", "1-2", "--gpus-per-node", "4", "--procs-per-node", "3"),
                   2, "--procs-per-node", "multiple")
    # nothing of it reached the daemon
    assert json.loads(run("queue", "--all", "--json", "--address", addr).stdout) == []


@pytest.mark.parametrize("args,needle", [
    (["-o", "%i %q"], "%q is not a field"),
    (["-o", "%"], "a field is %[.][size]LETTER"),
    (["-t", "XX"], "'xx' is not a state"),
])
def test_queue_bad_format_and_state_are_one_line(daemon, args, needle):
    srv, _ = daemon
    one_line_error(run("queue", *args, "--address", srv.address), 2, needle)


def test_version_is_the_installed_one():
    from importlib.metadata import version

    res = run("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"offcut {version('offcut')}"


def test_submit_without_a_curve_is_learned(daemon):
    srv, c = daemon
    r = run("submit", "-J", "new", "-N", "1-2", "--work", "1e6", "--parsable",
            "--address", srv.address)
    assert r.exit_code == 0, r.output
    task = c.get_task(r.stdout.strip())
    assert not task.spec.node_counts and task.spec.total_work_samples == 1e6
    assert task.model.rescale_up_s == 30.0  # the prior until a rescale is measured


def test_submit_with_node_needs_shows_them(daemon):
    srv, c = daemon
    r = run("submit", "-J", "gpu", "-N", "1-2", "--work", "1e6", "--parsable", "--gpus-per-node",
            "2", "-C", "ib&a100", "--address", srv.address)
    assert r.exit_code == 0, r.output
    tid = r.stdout.strip()
    spec = c.get_task(tid).spec
    assert spec.gpus_per_node == 2 and list(spec.constraint) == ["a100", "ib"]
    shown = run("show", tid, "--address", srv.address).stdout
    assert "TresPerNode  gres:gpu:2" in shown and "Features     a100&ib" in shown
    assert "NtasksPerNode  2" in shown or "NtasksPerNode 2" in " ".join(shown.split())


def test_unreachable_daemon_says_where_and_how(tmp_path, curve):
    addr = f"unix://{tmp_path}/nobody.sock"
    for args in (["queue"], ["status"], ["show", "t-1"], ["cancel", "t-1"],
                 ["submit", "-J", "x", "-N", "1-2", "--work", "10", "--scalability", str(curve)]):
        one_line_error(run(*args, "--address", addr), 1, addr, "offcutd --listen")


def test_address_from_environment(tmp_path, monkeypatch):
    addr = f"unix://{tmp_path}/env.sock"
    monkeypatch.setenv("OFFCUT_ADDRESS", addr)
    one_line_error(run("queue"), 1, addr)


# ------------------------------------------------------------------ CLI, end to end
def test_researcher_session(daemons, curve):
    """Submit two tasks, list, watch a placement change caused by a node event, show,
    cancel one, read the metrics endpoint; every step checked against the daemon's own view."""
    srv, client = daemons.start(metrics_listen="127.0.0.1:0")
    addr = srv.address
    me = getpass.getuser()
    t0 = time.time()
    client.report_nodes(t0, "test", 1, idle=["n1", "n2"])

    ids = []
    for name in ("alpha", "beta"):
        res = run("submit", "--name", name, "--nodes", "1-4", "--work", "1e9", "--scalability",
                  str(curve), "--rescale-up", "0", "--rescale-down", "0", "--parsable",
                  "--address", addr, "--", "python", "train.py")
        assert res.exit_code == 0, res.output
        ids.append(res.stdout.strip())
    assert len(set(ids)) == 2
    tasks = {t.task_id: t for t in client.list_tasks()}
    assert set(tasks) == set(ids)
    assert all(t.owner == me for t in tasks.values())
    assert list(tasks[ids[0]].spec.command) == ["python", "train.py"]
    # concave curve, free rescales: one node each beats both nodes on one task
    assert [len(tasks[i].nodes) for i in ids] == [1, 1]

    rows = json.loads(run("queue", "--json", "--address", addr).stdout)
    assert [r["task_id"] for r in rows] == ids
    for r in rows:
        t = tasks[r["task_id"]]
        assert r["nodes"] == list(t.nodes) and r["owner"] == me and r["state"] == "running"
        assert r["eta_s"] == pytest.approx((1e9 - t.work_done_samples) / t.rate_samples_per_s)
    text = run("queue", "--address", addr).stdout.splitlines()
    assert text[0].split() == ["TASK_ID", "NAME", "USER", "STATE", "NODES", "NODELIST(REASON)",
                               "PROGRESS", "ETA"]
    assert len(text) == 3 and text[1].split()[:4] == [ids[0], "alpha", me, "RUNNING"]
    # as squeue: state codes, a format, no header
    rows = run("queue", "-t", "R,PD", "-o", "%i %u %t %D %N %R", "-h", "--address", addr).stdout
    tasks = {t.task_id: t for t in client.list_tasks()}
    expected = []
    for tid in ids:
        t = tasks[tid]
        nodelist = hostlist.collect_hostlist(list(t.nodes)) if t.nodes else ""
        reason = nodelist or "(Resources)"
        expected.append(" ".join(filter(None, [tid, me, "R" if t.nodes else "PD",
                                               str(len(t.nodes)), nodelist, reason])))
    assert [" ".join(ln.split()) for ln in rows.splitlines()] == expected
    assert run("queue", "-t", "CD", "-h", "--address", addr).stdout == ""  # none completed
    right = run("queue", "-o", "%.12i|%3j|", "--address", addr).stdout.splitlines()
    assert right[0] == "     TASK_ID|NAM|" and right[1] == f"{ids[0]:>12}|alp|"

    # watch: a node event sent while the CLI waits shows up as placement changes
    revision = client.status().revision

    def later():  # once the CLI's stream is open
        wait_until(lambda: srv.streams.open_streams() == 1, "the CLI's watch stream", 20)
        client.report_nodes(time.time(), "test", 2, idle=["n3", "n4"])

    threading.Thread(target=later, daemon=True).start()
    res = run("watch", "--count", "1", "--timeout", "20", "--json", "--address", addr)
    assert res.exit_code == 0, res.output
    update = json.loads(res.stdout.strip().splitlines()[0])
    assert update["cause"] == "nodes" and int(update["revision"]) == revision + 1
    grown = {p["task_id"]: p for p in update["placements"]}
    assert set(grown) <= set(ids) and grown
    assert all(p["change"] == "grow" for p in grown.values())
    held = {t.task_id: len(t.nodes) for t in client.list_tasks()}
    assert sum(held.values()) == 4
    for tid, p in grown.items():
        assert len(p["nodes"]) == held[tid]

    # the plain form of watch replays the same retained update
    res = run("watch", "--after-revision", str(revision), "--count", "1", "--timeout", "5",
              "--address", addr)
    assert res.exit_code == 0 and "grow" in res.stdout and f"rev {revision + 1}" in res.stdout

    shown = run("show", ids[0], "--address", addr).stdout
    assert f"TaskId       {ids[0]}" in shown and "Command      python train.py" in shown
    assert f"Nodes        {held[ids[0]]} of 1-4" in shown
    one_line_error(run("show", "t-nope", "--address", addr), 1, "t-nope")

    ran_on = len(client.get_task(ids[1]).nodes)
    res = run("cancel", ids[1], "--address", addr)
    assert res.exit_code == 0 and f"Cancelled task {ids[1]}" in res.stdout
    # (issue 38) a task that held nodes is said to be ending, not gone
    assert ran_on > 0 and f"its jobs on {ran_on} node(s) are ending" in res.stdout
    assert client.get_task(ids[1]).state == TaskState.CANCELLED  # TASK_STATE_CANCELLED (5)
    assert len(client.get_task(ids[0]).nodes) == 4  # its nodes went to the other task
    res = run("cancel", ids[1], "t-nope", "--address", addr)
    assert res.exit_code == 1 and res.stderr.count("offcut: ") == 2

    active = json.loads(run("queue", "--json", "--address", addr).stdout)
    assert [r["task_id"] for r in active] == [ids[0]]
    everything = json.loads(run("queue", "--all", "--json", "--address", addr).stdout)
    assert {r["task_id"]: r["state"] for r in everything} == {ids[0]: "running", ids[1]: "cancelled"}
    assert json.loads(run("queue", "--user", "someone-else", "--json", "--address", addr).stdout) == []
    one_line_error(run("queue", "--state", "sleeping", "--address", addr), 2, "--state")

    st = json.loads(run("status", "--json", "--idle-nodes", "--address", addr).stdout)
    assert st["nodes_in_use"] == 4 and st["idle_nodes"] == 4 and st["running_tasks"] == 1
    assert st["event_lag_s"] >= 0
    plain = run("status", "--idle-nodes", "--address", addr).stdout
    assert "4 in the idle pool, 4 of them in use" in plain and "n[1-4]" in plain

    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5) as resp:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(resp.read().decode())
                   for s in family.samples}
    assert samples[("offcut_nodes_in_use", ())] == 4
    assert samples[("offcut_tasks", (("state", "running"),))] == 1
    assert samples[("offcut_tasks", (("state", "cancelled"),))] == 1
    submits = ("offcut_rpc_requests_total", (("code", "OK"), ("method", "/offcut.v1.Tasks/SubmitTask")))
    assert samples[submits] == 2
    not_found = ("offcut_rpc_requests_total", (("code", "NOT_FOUND"), ("method", "/offcut.v1.Tasks/CancelTask")))
    assert samples[not_found] == 1


def test_watch_timeout_without_updates(daemon):
    srv, client = daemon
    client.report_nodes(time.time(), "test", 1, idle=["n1"])
    client.submit(make_task_spec("t", nodes="1", work_samples=1e9, scalability=([1], [1.0])))
    res = run("watch", "--timeout", "0.5", "--address", srv.address)
    assert res.exit_code == 0 and res.stdout == ""  # only new changes by default
    res = run("watch", "--after-revision", "0", "--timeout", "0.5", "--address", srv.address)
    assert res.exit_code == 0 and "start 0->1  n1" in res.stdout  # the retained one
    one_line_error(run("watch", "--timeout", "0.5", "--count", "2", "--address", srv.address), 1,
                   "only 0 of 2")
    one_line_error(run("watch", "t-none", "--timeout", "2", "--address", srv.address), 1, "t-none")


def test_a_bare_socket_path_is_a_unix_socket(daemon, tmp_path, monkeypatch):
    """gRPC would take ``/path/s.sock`` for a host name (a DNS error); every client and
    offcutd's listen take a path for the unix socket it names."""
    from offcut.addresses import normalize_address
    from offcut.daemon.config import DaemonConfig

    srv, _ = daemon
    path = srv.address.removeprefix("unix://")
    res = run("queue", "--address", path)
    assert res.exit_code == 0 and res.stdout.startswith("TASK_ID"), res.output
    monkeypatch.chdir(tmp_path)
    assert normalize_address("./s.sock") == f"unix://{tmp_path}/s.sock"
    assert normalize_address("127.0.0.1:50051") == "127.0.0.1:50051"
    assert normalize_address("unix:///a/b.sock") == "unix:///a/b.sock"
    assert DaemonConfig(listen="/run/x.sock").listen == "unix:///run/x.sock"


def test_every_json_output_has_one_form(daemon):
    """queue, show, watch and status --json: proto field names, every field present, null
    for an unset time, lower-case enum names, 64-bit integers as numbers; a task is the same
    object in queue and show."""
    srv, c = daemon
    addr = srv.address
    c.report_nodes(time.time(), "test", 1, idle=["n1", "n2"])
    tid = c.submit(make_spec("j")).task.task_id
    listed = json.loads(run("queue", "--json", "--address", addr).stdout)
    shown = json.loads(run("show", tid, "--json", "--address", addr).stdout)
    assert listed == [shown]
    assert shown["state"] == "running" and shown["finish_time"] is None
    assert shown["submit_time"].endswith("Z") and shown["generation"] == 1
    assert shown["spec"]["gpus_per_node"] == 0 and shown["spec"]["constraint"] == []
    assert shown["model"] is None  # a task with a curve has no learned model
    assert 0 <= shown["progress_pct"] <= 100 and shown["eta_s"] > 0
    update = json.loads(run("watch", "--after-revision", "0", "--count", "1", "--timeout", "5",
                            "--json", "--address", addr).stdout.splitlines()[0])
    assert isinstance(update["revision"], int) and update["cause"] == "submit"
    status = json.loads(run("status", "--json", "--address", addr).stdout)
    assert status["revision"] == c.status().revision and isinstance(status["last_seq"]["test"], int)
    assert status["last_decision"]["placements"][0]["change"] == "start"


# ------------------------------------------------------------------ progress as shown
def _progress_line(shown: str) -> str:
    return next(ln for ln in shown.splitlines() if ln.startswith("Progress "))


def test_progress_shown_is_the_last_report_and_its_age(daemon):
    """``offcut show``/``queue`` (issue 38, "measured, not modelled"): a reporting task that
    never reported shows no percentage, whatever the daemon models for it; after a report,
    the reported figure and when it was reported (not the model's extrapolation); a task that
    does not report shows the model's figure marked as an estimate. ``--json`` says which."""
    import re

    srv, c = daemon
    addr = srv.address
    c.report_nodes(time.time(), "test", 1, idle=["n1", "n2", "n3"])
    res = run("submit", "-J", "learn", "-N", "1-2", "--work", "1e6", "--parsable",
              "--address", addr)
    assert res.exit_code == 0, res.output
    tid = res.stdout.strip()
    est = c.submit(make_spec("curve", max_nodes=1, work=100.0)).task.task_id
    # the daemon models progress for the learned task from its prior rate meanwhile
    wait_until(lambda: c.get_task(tid).work_done_samples > 0, "the model to move", 30)

    line = _progress_line(run("show", tid, "--address", addr).stdout)
    assert "%" not in line and "no report yet" in line, line
    row = next(r for r in run("queue", "--address", addr).stdout.splitlines()
               if r.startswith(tid))
    assert "%" not in row and "- (no report)" in row, row
    doc = json.loads(run("show", tid, "--json", "--address", addr).stdout)
    assert doc["progress_pct"] is None and doc["progress_source"] == "none"
    assert doc["progress_report_time"] is None and doc["eta_s"] is None

    # a report: 36,000 of 1e6 samples = 3.6 %, stamped 0.5 s ago
    at = time.time() - 0.5
    nodes = len(c.get_task(tid).nodes)
    c.report_progress([{"task_id": tid, "time": at, "samples_done": 36_000, "nodes": nodes}])
    before = time.time()
    shown = run("show", tid, "--address", addr).stdout
    after = time.time()
    line = _progress_line(shown)
    m = re.fullmatch(r"Progress +3\.60% \(36000 of 1e\+06 samples, reported (\d+) s ago at "
                     r"(\S+Z)\)", line)
    assert m, line
    assert int(before - at) - 1 <= int(m[1]) <= after - at + 1
    task = c.get_task(tid)
    assert m[2] == time_to_pb(task.model.last_report_time).ToJsonString()
    assert task.model.last_samples_done == 36_000
    row = next(r for r in run("queue", "--address", addr).stdout.splitlines()
               if r.startswith(tid))
    assert re.search(r" 3\.6% \(\d+ s ago\) ", row), row
    doc = json.loads(run("show", tid, "--json", "--address", addr).stdout)
    assert doc["progress_pct"] == 3.6 and doc["progress_source"] == "measured"
    assert doc["progress_report_time"] == doc["model"]["last_report_time"]
    # the age in words, from the same task at later clocks
    from offcut.client.task_cli import progress_cell, progress_text

    t = task.model.last_report_time
    assert "reported 2 min ago" in progress_text(task, now=t + 150)
    assert progress_cell(task, now=t + 3 * 3600 + 5) == "3.6% (3 h ago)"
    assert progress_cell(task, now=t - 10) == "3.6% (0 s ago)"  # a clock behind the report

    # a task with a curve does not report: its modelled figure, marked as an estimate
    shown_est = c.get_task(est)
    line = _progress_line(run("show", est, "--address", addr).stdout)
    assert re.fullmatch(r"Progress +~\d+\.\d\d% \(estimate: .* of 100 samples modelled; the "
                        r"task does not report its progress\)", line), line
    row = next(r for r in run("queue", "--address", addr).stdout.splitlines()
               if r.startswith(est))
    assert re.search(r" ~\d+\.\d% \(est\.\) ", row), row
    doc = json.loads(run("show", est, "--json", "--address", addr).stdout)
    assert doc["progress_source"] == "estimate" and doc["progress_report_time"] is None
    assert doc["progress_pct"] >= round(100 * shown_est.work_done_samples / 100.0, 2)


def test_queue_cuts_a_long_reason_at_a_word(daemon):
    """``offcut queue``'s ``%R`` of a failed task: a long failure reason is cut at a word
    boundary and ends in ``...`` (not mid-word); ``offcut show`` prints it whole."""
    import re

    width = 60  # offcut.client.task_cli.REASON_WIDTH
    srv, c = daemon
    c.report_nodes(time.time(), "test", 1, idle=["n1"])
    tid = c.submit(make_spec("long", max_nodes=1)).task.task_id
    words = ("Traceback: RuntimeError: CUDA out of memory while allocating the optimizer "
             "state of the transformer blocks on rank three")
    c.report_task_run(tid, "failed", node="n1", job_id="7", exit_code=1, message=words)
    reason = c.get_task(tid).failure_reason
    assert len(reason) > width and words in reason
    row = run("queue", "--all", "-o", "%i|%R", "-h", "--address", srv.address).stdout.strip()
    shown_reason = row.split("|", 1)[1]
    assert shown_reason.startswith("(") and shown_reason.endswith("...)"), row
    kept = shown_reason[1:-4]
    assert len(kept) + 3 <= width
    # cut at a word boundary (punctuation before it dropped), never inside a word
    assert reason.startswith(kept) and re.match(r"[,;:.\-]* ", reason[len(kept):]), (kept, reason)
    assert f"Reason       {reason}" in run("show", tid, "--address", srv.address).stdout
    # the rule itself: short text whole, whitespace folded, a single long word cut inside
    from offcut.client.task_cli import REASON_WIDTH, clip_words

    assert REASON_WIDTH == width
    assert clip_words("exit code 1", 60) == "exit code 1"
    assert clip_words("a  b\n c", 60) == "a b c"
    assert clip_words("alpha beta gamma", 12) == "alpha..."
    assert clip_words("alpha: beta gamma", 13) == "alpha..."
    assert clip_words("x" * 20, 10) == "x" * 7 + "..."

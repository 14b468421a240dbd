"""A state file of format 4, the first released format (0.1.0; CHANGELOG.md), written by the
main branch's daemon when it declared that format released (commit 515596a), loaded by the
daemon of this tree.

``fixtures/state_format4/state.sqlite`` was written by that daemon and left by SIGKILL, so its
journal has rows after the last snapshot that a load must re-apply;
``fixtures/state_format4/expected.json`` holds what that daemon answered about it (status,
tasks, history, Zeus jobs), the requests whose replies are stored (repeated here with their
request ids and ``(source, seq)``), and its answers to a few new requests on the loaded state.
``fixtures/make_released_state.py`` made both (its docstring says how to make them again).

Each test starts a real daemon (``conftest.Daemons``) on a copy of the file with the settings
that daemon ran with. Answers are compared field by field: every field the first release
answered must be answered alike (floats to 1e-9); a field a later release adds to a reply may
be there too.
"""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import grpc
import pytest
from google.protobuf.json_format import MessageToDict, ParseDict

from offcut.daemon.app.state_file import APPLICATION_ID, FIRST_RELEASED_FORMAT
from offcut.daemon.app.journal import journal_checksum
from offcut.v1 import nodes_pb2, status_pb2, tasks_pb2, zeus_pb2

#: the fixture's daemon ran on the replay clock (senders' times are the event clock)
pytestmark = pytest.mark.replay_clock

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "state_format4"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
WRITTEN_BY = EXPECTED["made_by"]["commit"]  # 515596a

#: request messages of the recorded calls, by full name
REQUEST_TYPES = {t.DESCRIPTOR.full_name: t for t in (
    nodes_pb2.NodeEvent, nodes_pb2.NodeSnapshot, tasks_pb2.SubmitTaskRequest,
    tasks_pb2.TaskRunReport, tasks_pb2.ReportProgressRequest, zeus_pb2.PredictRequest,
    zeus_pb2.ResumeTrialRequest, zeus_pb2.ReportEpochRequest)}
#: the client's stub of each service
STUBS = {"NodeEvents": "nodes", "Tasks": "tasks", "BatchSizeOptimizer": "bso",
         "PowerLimitOptimizer": "plo"}


# ----------------------------------------------------------------------------- helpers
def to_dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True)


def start_on_fixture(daemons, name: str = "a"):
    """A daemon of this tree on a copy of the fixture (that daemon's settings); returns
    ``(server, client)``. ``Daemons.start`` waits until it answers SERVING (10 s deadline)."""
    folder = daemons.root / name
    folder.mkdir(exist_ok=True)
    shutil.copyfile(FIXTURE / "state.sqlite", folder / "state.sqlite")
    settings = dict(EXPECTED["daemon_config"])
    assert settings.pop("solver") == "dp"  # Daemons.config's solver
    return daemons.start(name, **settings)


def restart(daemons, server, name: str = "a"):
    """Stop ``server`` gracefully and start a daemon of this tree on the same state file."""
    daemons.stop(server)
    settings = {k: v for k, v in EXPECTED["daemon_config"].items() if k != "solver"}
    return daemons.start(name, **settings)


def call(client, recorded: dict):
    """Send a recorded request (``service``, ``method``, ``request_type``, ``request``)."""
    request = ParseDict(recorded["request"], REQUEST_TYPES[recorded["request_type"]]())
    return getattr(getattr(client, STUBS[recorded["service"]]), recorded["method"])(
        request, timeout=10)


def assert_answers(actual, expected, path: str = "$") -> None:
    """``actual`` answers everything ``expected`` (JSON-like data) holds: every key of a dict
    with an equal value (``actual`` may hold keys a later release added), lists item by item
    and of the same length, floats to 1e-9 (relative or absolute): figures computed again by
    this tree's code, not only read back from stored replies."""
    if isinstance(expected, float) or isinstance(actual, float):
        assert isinstance(actual, (int, float)) and isinstance(expected, (int, float)), \
            f"{path}: {actual!r} != {expected!r}"
        assert math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9), \
            f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, dict) and isinstance(actual, dict):
        missing = sorted(set(expected) - set(actual))
        assert not missing, f"{path}: no {missing} (has {sorted(actual)})"
        for key in expected:
            assert_answers(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list):
        assert len(actual) == len(expected), f"{path}: {len(actual)} items != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_answers(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def status_state(client) -> dict:
    """GetStatus's fields that are state (no solver timings, no last decision)."""
    status = to_dict(client.status_stub.GetStatus(
        status_pb2.GetStatusRequest(include_idle_nodes=True), timeout=10))
    return {k: status.get(k) for k in EXPECTED["status_fields"]}


def expected_status(recorded: dict) -> dict:
    return {k: recorded.get(k) for k in EXPECTED["status_fields"]}


def all_tasks(client) -> list[dict]:
    """ListTasks, every page."""
    request, tasks = tasks_pb2.ListTasksRequest(), []
    while True:
        page = client.tasks.ListTasks(request, timeout=10)
        tasks.extend(to_dict(t) for t in page.tasks)
        if not page.next_page_token:
            return tasks
        request.page_token = page.next_page_token


def zeus_state(client) -> dict:
    """The Zeus jobs (``state_json`` parsed: its keys' order is not state) and the profile."""
    jobs = {}
    for job_id in EXPECTED["zeus"]["jobs"]:
        job = to_dict(client.bso.GetJob(zeus_pb2.GetJobRequest(job_id=job_id), timeout=10))
        job["state_json"] = json.loads(job["state_json"])
        jobs[job_id] = job
    profile = EXPECTED["zeus"]["power_profile"]
    return {"jobs": jobs, "power_profile": to_dict(client.plo.GetProfile(
        zeus_pb2.GetProfileRequest(job_id=profile["job_id"],
                                   batch_size=int(profile["batch_size"])), timeout=10))}


def assert_recorded_state(client, recorded: dict) -> None:
    """Status, tasks and Zeus optimizers answer ``recorded`` (``EXPECTED`` or its
    ``after_continuation``)."""
    assert_answers(status_state(client), expected_status(recorded["status"]))
    assert_answers(all_tasks(client), recorded["tasks"])
    assert_answers(zeus_state(client), recorded["zeus"])


def history(client, after_revision: int = 0, limit: int = 0) -> list[dict]:
    """ExportHistory after ``after_revision`` (at most ``limit`` entries; 0: all)."""
    return [to_dict(e) for e in client.status_stub.ExportHistory(
        status_pb2.ExportHistoryRequest(after_revision=after_revision, limit=limit),
        timeout=10)]


def without_solve_ms(decision: dict) -> dict:
    """A decision dict without its wall time (``solve.solve_ms``)."""
    decision = json.loads(json.dumps(decision))
    decision.get("solve", {}).pop("solve_ms", None)
    return decision


def with_duplicate(reply: dict, field: str | None) -> dict:
    """``reply`` flagged as the answer to a repeated request at ``field`` (a dotted path;
    None: the reply has no such flag)."""
    reply = json.loads(json.dumps(reply))
    if field:
        *parents, leaf = field.split(".")
        node = reply
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = True
    return reply


REVISION = int(EXPECTED["status"]["revision"])
HISTORY = EXPECTED["history"]


# ----------------------------------------------------------------------------- the fixture
def test_fixture_is_format_4_as_main_wrote_it_with_rows_after_the_last_snapshot(tmp_path):
    """The file is what this suite relies on: format 4 (``meta`` and ``user_version``),
    Offcut's application id, every journal kind, every journal row with its sha256, journal
    rows after the last snapshot (it was left by SIGKILL), rows in the Zeus tables, a single
    file (WAL folded in), every revision exported by the daemon that wrote it."""
    assert WRITTEN_BY == "515596a" and EXPECTED["made_by"]["format"] == FIRST_RELEASED_FORMAT
    assert not list(FIXTURE.glob("state.sqlite-*")), "a -wal/-shm beside the fixture"
    copy = tmp_path / "state.sqlite"
    shutil.copyfile(FIXTURE / "state.sqlite", copy)
    assert copy.stat().st_size < 300_000
    db = sqlite3.connect(copy)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
        assert db.execute("PRAGMA user_version").fetchone() == (4,)
        assert db.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        last = db.execute("SELECT MAX(journal_id) FROM snapshots").fetchone()[0]
        after = db.execute("SELECT COUNT(*) FROM journal WHERE id > ?", (last,)).fetchone()[0]
        kinds = dict(db.execute("SELECT kind, COUNT(*) FROM journal GROUP BY kind"))
        rows = db.execute("SELECT id, kind, source, seq, request_id, event, solves, response, "
                          "sha256 FROM journal").fetchall()
        zeus = db.execute("SELECT COUNT(*) FROM zeus_state").fetchone()[0]
        trials = db.execute("SELECT COUNT(*) FROM zeus_trials").fetchone()[0]
        requests = db.execute("SELECT COUNT(*) FROM zeus_requests").fetchone()[0]
    finally:
        db.close()
    figures = EXPECTED["state_file"]
    assert last == figures["snapshot_journal_ids"][-1]
    assert after == figures["rows_after_last_snapshot"] >= 5
    assert kinds == figures["kinds"]
    assert set(kinds) >= {"nodes", "snapshot", "submit", "cancel", "run", "progress"}
    assert rows and all(r[-1] == journal_checksum(*r[:-1]) for r in rows)
    assert zeus == figures["zeus_state_rows"] > 0 and trials > 0
    assert requests == len(figures["zeus_request_ids"]) > 0
    assert [h["revision"] for h in HISTORY] == list(range(1, REVISION + 1))
    assert all("entry" in h for h in HISTORY)
    assert EXPECTED["whole_history_export"] == {"revisions": list(range(1, REVISION + 1)),
                                                "error": None}


# ----------------------------------------------------------------------------- loading
def test_loads_to_the_state_its_daemon_answered(daemons):
    """Loaded (snapshot + the journal rows after it re-applied), the state is the one its
    daemon answered before it was killed: the status figures, every task, the Zeus jobs and
    the power profile."""
    _, client = start_on_fixture(daemons)
    assert_recorded_state(client, EXPECTED)


def test_the_file_is_taken_as_it_is(daemons):
    """Format 4 is this tree's format: opening the file upgrades nothing (no copy beside it,
    the format stays 4) and the journal rows keep their sums."""
    server, _ = start_on_fixture(daemons)
    state = Path(server.config.state)
    daemons.stop(server)
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
        assert db.execute("SELECT COUNT(*) FROM journal WHERE sha256 IS NULL").fetchone() == (0,)
    db.close()
    assert not list(state.parent.glob("*.bak"))


def test_history_equals_its_daemons_export(daemons):
    """ExportHistory of the loaded file gives, revision by revision, the entries its daemon
    exported (decisions are the stored replies), the whole journal at once alike, and
    nothing after its last revision."""
    _, client = start_on_fixture(daemons)
    for h in HISTORY:
        assert_answers(history(client, h["revision"] - 1, 1), [h["entry"]])
    assert_answers(history(client), [h["entry"] for h in HISTORY])
    assert history(client, REVISION) == []


def test_repeated_requests_get_the_stored_replies(daemons):
    """Requests its daemon answered, repeated with their request ids (node events: their
    ``(source, seq)``), get the replies stored in its journal and Zeus tables, flagged
    duplicate where the protocol flags them (node events, submissions, run and progress
    reports), rows before and after the last snapshot alike; nothing changes (revision,
    status, tasks). A cancellation of the cancelled task is FAILED_PRECONDITION."""
    _, client = start_on_fixture(daemons)
    repeats = EXPECTED["repeats"]
    assert {r["method"] for r in repeats} >= {"ReportNodes", "SyncNodes", "SubmitTask",
                                              "ReportTaskRun", "ReportProgress", "Predict",
                                              "ResumeTrial"}
    for r in repeats:
        reply = to_dict(call(client, r))
        assert_answers(reply, r["repeat_reply"], r["name"])  # what its daemon answered
        assert_answers(reply, with_duplicate(r["reply"], r["duplicate_field"]), r["name"])
    again = EXPECTED["cancel_again"]
    assert again["code"] == "FAILED_PRECONDITION"
    with pytest.raises(grpc.RpcError) as err:
        client.tasks.CancelTask(tasks_pb2.CancelTaskRequest(task_id=again["task_id"]),
                                timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already cancelled" in err.value.details()
    assert_recorded_state(client, EXPECTED)  # revision included


# ----------------------------------------------------------------------------- continuing
def test_state_continues_and_survives_a_restart(daemons):
    """The state goes on: a new node event and a new submission are applied with revision
    + 1 each, answered as its daemon answered them on the same file (but for solver wall
    times), and a Zeus trial of the file goes on; after a restart the whole state, the new
    journal rows and the stored replies (old and new) are still there."""
    server, client = start_on_fixture(daemons)
    nodes, submit, epoch = EXPECTED["continuation"]
    assert (nodes["method"], submit["method"], epoch["method"]) == (
        "ReportNodes", "SubmitTask", "ReportEpoch")

    decision = to_dict(call(client, nodes))
    assert int(decision["revision"]) == REVISION + 1
    assert_answers(without_solve_ms(decision), without_solve_ms(nodes["reply"]))
    reply = to_dict(call(client, submit))
    assert int(reply["decision"]["revision"]) == REVISION + 2
    assert_answers(reply["task"], submit["reply"]["task"])
    assert_answers(without_solve_ms(reply["decision"]),
                   without_solve_ms(submit["reply"]["decision"]))
    assert_answers(to_dict(call(client, epoch)), epoch["reply"])
    after = EXPECTED["after_continuation"]
    assert_recorded_state(client, after)
    assert int(status_state(client)["revision"]) == REVISION + 2

    server, client = restart(daemons, server)
    assert_recorded_state(client, after)
    # the new rows are in the journal, as answered
    assert history(client, REVISION, 1) == [
        {"revision": str(REVISION + 1), "kind": "nodes", "decision": decision}]
    assert history(client, REVISION + 1, 1) == [
        {"revision": str(REVISION + 2), "kind": "submit", "decision": reply["decision"],
         "task": reply["task"]}]
    for h in HISTORY:  # the old ones too
        assert_answers(history(client, h["revision"] - 1, 1), [h["entry"]])
    # stored replies: the new submission's and those of the fixture's daemon
    assert to_dict(call(client, submit)) == with_duplicate(reply, "decision.duplicate")
    assert to_dict(call(client, nodes)) == with_duplicate(decision, "duplicate")
    for r in EXPECTED["repeats"]:
        assert_answers(to_dict(call(client, r)), r["repeat_reply"], r["name"])
    assert_recorded_state(client, after)

"""A state file of format 1, written by release 3593fb3, loaded by the daemon of this tree.

``fixtures/state_v1/state.sqlite`` was written by the daemon of release 3593fb3 (schema
version 1: the journal's replies are serialized ``offcut.v1`` messages) and left by SIGKILL,
so its journal has rows after the last snapshot that a load must re-apply;
``fixtures/state_v1/expected.json`` holds what that release answered about it (status, tasks,
history, Zeus jobs), the requests whose replies are stored (repeated here with their request
ids and ``(source, seq)``), and the release's answers to a few new requests on the loaded
state. ``fixtures/make_state_v1.py`` made both (its docstring says how to make them again).

Each test starts a real daemon (``conftest.Daemons``) on a copy of the file with the settings
the release ran with.
"""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict, ParseDict

from offcut.daemon.store import SCHEMA_VERSION
from offcut.errors import FailedPrecondition
from offcut.v1 import nodes_pb2, status_pb2, tasks_pb2, zeus_pb2

#: the release took senders' times as the clock, as a replay daemon does (docs/security.md):
#: its answers to the recorded requests are comparable on a replay daemon only
pytestmark = pytest.mark.replay_clock

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "state_v1"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
RELEASE = EXPECTED["made_by"]["release"]  # 3593fb3

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
    """A daemon of this tree on a copy of the fixture (the release's settings); returns
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


def assert_close(actual, expected, path: str = "$") -> None:
    """``actual == expected`` for JSON-like data, floats to 1e-9 (relative or absolute):
    figures computed again by this tree's code, not read back from stored replies."""
    if isinstance(expected, float) or isinstance(actual, float):
        assert isinstance(actual, (int, float)) and isinstance(expected, (int, float)), \
            f"{path}: {actual!r} != {expected!r}"
        assert math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9), \
            f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, dict) and isinstance(actual, dict):
        assert sorted(actual) == sorted(expected), f"{path}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_close(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list):
        assert len(actual) == len(expected), f"{path}: {len(actual)} items != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def without_energy(task: dict) -> dict:
    """A task (``to_dict``) without ``energy``, which came after release 3593fb3, checked to
    be the modelled figure it answered (``energy_j``)."""
    task = dict(task)
    energy = task.pop("energy")
    assert energy["source"] == "modelled"
    assert math.isclose(energy.get("joules", 0.0), task.get("energy_j", 0.0))
    return task


def status_state(client) -> dict:
    """GetStatus's fields that are state (no solver timings, no last decision)."""
    status = to_dict(client.status(include_idle_nodes=True))
    return {k: status.get(k) for k in EXPECTED["status_fields"]}


def expected_status(recorded: dict) -> dict:
    return {k: recorded.get(k) for k in EXPECTED["status_fields"]}


def zeus_state(client) -> dict:
    """The Zeus jobs (``state_json`` parsed: its keys' order is not state) and the profile."""
    jobs = {}
    for job_id in EXPECTED["zeus"]["jobs"]:
        job = to_dict(client.get_zeus_job(job_id))
        job["state_json"] = json.loads(job["state_json"])
        # (GetJob's paging fields came after release 3593fb3: the count is checked here)
        assert job.pop("trial_count", 0) == len(job.get("trials", []))
        job.pop("next_before_trial_number", None)
        jobs[job_id] = job
    profile = EXPECTED["zeus"]["power_profile"]
    return {"jobs": jobs, "power_profile": to_dict(client.power_profile(
        profile["job_id"], profile["batch_size"]))}


def assert_recorded_state(client, recorded: dict) -> None:
    """Status, tasks and Zeus optimizers equal ``recorded`` (``EXPECTED`` or its
    ``after_continuation``)."""
    assert_close(status_state(client), expected_status(recorded["status"]))
    assert_close([without_energy(to_dict(t)) for t in client.list_tasks()], recorded["tasks"])
    assert_close(zeus_state(client), recorded["zeus"])


def history_page(client, revision: int) -> list[dict]:
    """ExportHistory of one revision."""
    return [to_dict(e) for e in client.status_stub.ExportHistory(
        status_pb2.ExportHistoryRequest(after_revision=revision - 1, limit=1), timeout=10)]


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
EXPORTED = [h for h in HISTORY if "entry" in h]
NOT_EXPORTED = [h for h in HISTORY if "release_error" in h]


# ----------------------------------------------------------------------------- the fixture
def test_fixture_is_format_1_with_rows_after_the_last_snapshot(tmp_path):
    """The file written by release 3593fb3 is what this suite relies on: schema version 1,
    every journal kind, journal rows after the last snapshot (it was left by SIGKILL), rows in
    the Zeus tables, a single file (WAL folded in)."""
    assert RELEASE == "3593fb3"
    assert not list(FIXTURE.glob("state.sqlite-*")), "a -wal/-shm beside the fixture"
    copy = tmp_path / "state.sqlite"
    shutil.copyfile(FIXTURE / "state.sqlite", copy)
    assert copy.stat().st_size < 200_000
    db = sqlite3.connect(copy)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
        last = db.execute("SELECT MAX(journal_id) FROM snapshots").fetchone()[0]
        after = db.execute("SELECT COUNT(*) FROM journal WHERE id > ?", (last,)).fetchone()[0]
        kinds = dict(db.execute("SELECT kind, COUNT(*) FROM journal GROUP BY kind"))
        zeus = db.execute("SELECT COUNT(*) FROM zeus_state").fetchone()[0]
        requests = db.execute("SELECT COUNT(*) FROM zeus_requests").fetchone()[0]
    finally:
        db.close()
    figures = EXPECTED["state_file"]
    assert last == figures["snapshot_journal_ids"][-1]
    assert after == figures["rows_after_last_snapshot"] >= 5
    assert kinds == figures["kinds"]
    assert set(kinds) == {"nodes", "snapshot", "submit", "cancel", "run", "progress"}
    assert zeus == figures["zeus_state_rows"] > 0
    assert requests == len(figures["zeus_request_ids"]) > 0


# ----------------------------------------------------------------------------- loading
def test_loads_to_the_state_release_3593fb3_answered(daemons):
    """Loaded (snapshot + the journal rows after it re-applied), the state written by release
    3593fb3 is the one it answered before it was killed: the status figures, every task, the
    Zeus jobs and the power profile."""
    _, client = start_on_fixture(daemons)
    assert_recorded_state(client, EXPECTED)


def test_history_equals_release_3593fb3s_export(daemons):
    """ExportHistory of the loaded file gives, revision by revision, the entries release
    3593fb3 exported (decisions are the stored replies, so they are equal exactly), and
    nothing after its last revision."""
    _, client = start_on_fixture(daemons)
    assert EXPORTED, "the fixture has exported entries"
    for h in EXPORTED:
        assert history_page(client, h["revision"]) == [h["entry"]], h["revision"]
    tail = list(client.export_history(after_revision=REVISION, timeout_s=10))
    assert tail == []


def test_history_progress_rows(daemons):
    """The progress rows of the file written by release 3593fb3 export as their stored
    reply's decision (that release answered INTERNAL for them: its ``history_entry`` read a
    ``task`` field that ``ReportProgressResponse`` does not have)."""
    _, client = start_on_fixture(daemons)
    assert NOT_EXPORTED, "the fixture has progress rows"
    for h in NOT_EXPORTED:
        assert history_page(client, h["revision"]) == [h["expected_entry"]], h["revision"]


def test_repeated_requests_get_the_stored_replies(daemons):
    """Requests answered by release 3593fb3, repeated with their request ids (node events: their
    ``(source, seq)``), get the replies stored in its journal and Zeus tables, flagged duplicate
    where the protocol flags them (node events, submissions, run and progress reports), rows
    before and after the last snapshot alike; nothing changes (revision, status, tasks). A
    cancellation (no request id) of the cancelled task is FAILED_PRECONDITION."""
    _, client = start_on_fixture(daemons)
    repeats = EXPECTED["repeats"]
    assert {r["method"] for r in repeats} >= {"ReportNodes", "SyncNodes", "SubmitTask",
                                              "ReportTaskRun", "ReportProgress", "Predict",
                                              "ResumeTrial"}
    for r in repeats:
        reply = to_dict(call(client, r))
        assert reply == r["repeat_reply"], r["name"]  # what release 3593fb3 answered to it
        assert reply == with_duplicate(r["reply"], r["duplicate_field"]), r["name"]
    again = EXPECTED["cancel_again"]
    with pytest.raises(FailedPrecondition, match="already cancelled"):
        client.cancel(again["task_id"], EXPECTED["made_by"]["t0"] + 1040)
    assert_recorded_state(client, EXPECTED)  # revision included


# ----------------------------------------------------------------------------- continuing
def test_state_continues_and_survives_a_restart(daemons):
    """The state written by release 3593fb3 goes on: a new node event and a new submission are
    applied with revision + 1 each, answered as release 3593fb3 answered them on the same file
    (but for solver wall times), and a Zeus trial of the file goes on; after a restart the
    whole state, the new journal rows and the stored replies (old and new) are still there."""
    server, client = start_on_fixture(daemons)
    nodes, submit, epoch = EXPECTED["continuation"]
    assert (nodes["method"], submit["method"], epoch["method"]) == (
        "ReportNodes", "SubmitTask", "ReportEpoch")

    decision = to_dict(call(client, nodes))
    assert int(decision["revision"]) == REVISION + 1
    assert_close(without_solve_ms(decision), without_solve_ms(nodes["reply"]))
    reply = to_dict(call(client, submit))
    assert int(reply["decision"]["revision"]) == REVISION + 2
    assert_close(without_energy(reply["task"]), submit["reply"]["task"])
    assert_close(without_solve_ms(reply["decision"]), without_solve_ms(submit["reply"]["decision"]))
    verdict = to_dict(call(client, epoch))
    assert_close(verdict, epoch["reply"])
    after = EXPECTED["after_continuation"]
    assert_recorded_state(client, after)
    assert int(status_state(client)["revision"]) == REVISION + 2

    server, client = restart(daemons, server)
    assert_recorded_state(client, after)
    # the new rows are in the journal, as answered
    assert history_page(client, REVISION + 1) == [
        {"revision": str(REVISION + 1), "kind": "nodes", "decision": decision}]
    assert history_page(client, REVISION + 2) == [
        {"revision": str(REVISION + 2), "kind": "submit", "decision": reply["decision"],
         "task": reply["task"]}]
    for h in EXPORTED:  # the old ones too
        assert history_page(client, h["revision"]) == [h["entry"]], h["revision"]
    # stored replies: the new submission's and the release's
    assert to_dict(call(client, submit)) == with_duplicate(reply, "decision.duplicate")
    assert to_dict(call(client, nodes)) == with_duplicate(decision, "duplicate")
    for r in EXPECTED["repeats"]:
        assert to_dict(call(client, r)) == r["repeat_reply"], r["name"]
    assert_recorded_state(client, after)


def test_the_file_is_upgraded_in_place_after_a_copy(daemons):
    """Opening the format-1 file rewrites its stored replies as format 2 (the application's
    JSON, no wire message), then splits each Zeus job's document into its summary and rows
    (format 3), and leaves the file as it was next to it, as ``state.sqlite.format1.bak``."""
    server, _ = start_on_fixture(daemons)
    state = Path(server.config.state)
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),) == ("4",)
        replies = [json.loads(r) for (r,) in db.execute("SELECT response FROM journal")]
        answers = [json.loads(r) for (r,) in db.execute("SELECT response FROM zeus_requests")]
        jobs = [json.loads(r) for (r,) in db.execute(
            "SELECT state FROM zeus_state WHERE kind = 'bso'")]
        trial_rows = db.execute("SELECT COUNT(*) FROM zeus_trials").fetchone()[0]
        stamped = db.execute("SELECT MIN(created_at) FROM zeus_requests").fetchone()[0]
    assert jobs and all("trials" not in j["job"] and "observations" not in j["job"]
                        for j in jobs)
    assert trial_rows == sum(j["job"]["trial_count"] for j in jobs) > 0
    assert stamped > 0
    assert replies and {r["format"] for r in replies} == {2}
    assert answers and {a["format"] for a in answers} == {2}
    backup = state.with_name("state.sqlite.format1.bak")
    with sqlite3.connect(backup) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)

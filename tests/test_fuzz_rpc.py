"""Property-based fuzzing of every RPC with malformed and adversarial requests (issue 5):
wrong types (bytes that are no valid message, wrong wire types), NaN/inf/-0/huge floats,
negative and extreme integers, empty/unicode/control-character/very long strings, duplicate
and malformed node names, long lists, out-of-order sequence numbers and times, unknown ids,
mixed with valid requests so that the state really changes.

For every call: the status is OK or a clean one (INVALID_ARGUMENT, NOT_FOUND,
FAILED_PRECONDITION, ALREADY_EXISTS; RESOURCE_EXHAUSTED only for a message over its
method's size limit), never INTERNAL or UNKNOWN; a refusal's message starts with the request field it is
about (``spec.max_nodes: ...``, ``request: ...`` for bytes that do not parse); a refused call
leaves the persisted state unchanged (``status_key``, the journal, the Zeus tables of the
state file); and the daemon still answers a health check after each example.

Hypothesis profiles (``OFFCUT_FUZZ_PROFILE``): ``fuzz-ci`` (default: derandomized, a few dozen
examples per RPC, bounded CI time) and ``fuzz-long`` (random, 1,000 examples per RPC, for a
search before a release: ``OFFCUT_FUZZ_PROFILE=fuzz-long python -m pytest
tests/test_fuzz_rpc.py``). The huge inputs (10^6 node names, 100,000-name snapshots, a message
over the size limit) are explicit tests, not generated. Each bug the fuzzer found has a
regression test at the end of this file.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument

from offcut.client import Client
from offcut.daemon.config import DaemonConfig
from offcut.daemon.edge.server import OffcutServer
from offcut.v1 import nodes_pb2, status_pb2, tasks_pb2, zeus_pb2
from offcut.views import TaskState

from daemon_helpers import T0, make_spec, status_key

#: these tests drive the event clock with explicit times (a replay daemon: docs/security.md)
pytestmark = pytest.mark.replay_clock

# ----------------------------------------------------------------------------- settings
_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                      HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("fuzz-ci", max_examples=30, derandomize=True, database=None, **_COMMON)
settings.register_profile("fuzz-long", max_examples=1000, **_COMMON)
PROFILE = os.environ.get("OFFCUT_FUZZ_PROFILE", "fuzz-ci")
FUZZ = settings(settings.get_profile(PROFILE))

CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS,
         grpc.StatusCode.OUT_OF_RANGE}
MIB = 1024 * 1024

# every RPC of offcut.v1: name -> (full method, request class, server streaming?)
METHODS: dict[str, tuple[str, type, bool]] = {}
#: the RPCs whose requests are a stream (sent here as a stream of one message)
REQUEST_STREAMS: set[str] = set()
for _module in (nodes_pb2, tasks_pb2, status_pb2, zeus_pb2):
    for _service in _module.DESCRIPTOR.services_by_name.values():
        for _m in _service.methods:
            METHODS[_m.name] = (f"/{_service.full_name}/{_m.name}",
                                message_factory.GetMessageClass(_m.input_type),
                                _m.server_streaming)
            if _m.client_streaming:
                REQUEST_STREAMS.add(_m.name)
ZEUS_RPCS = {m.name for s in zeus_pb2.DESCRIPTOR.services_by_name.values() for m in s.methods}


# ----------------------------------------------------------------------------- the target
@dataclass
class Context:
    """What the strategies need to know to make valid requests (read before each call)."""

    clock: float
    last_seq: dict[str, int]
    idle: list[str]
    task_ids: list[str]
    active_task_ids: list[str]
    revision: int
    jobs: dict[str, dict] = field(default_factory=dict)       # Zeus job id -> stored state
    profiles: dict[tuple[str, int], dict] = field(default_factory=dict)


class Target:
    """A real daemon (in this process) plus raw access to it: method calls with bytes in and
    out, the persisted state's fingerprint, a health check."""

    def __init__(self, root: Path, **config):
        root.mkdir(parents=True, exist_ok=True)
        config.setdefault("clock", "replay")  # the fuzz drives the clock with explicit times
        self.config = DaemonConfig(listen=f"unix://{root}/s.sock", state=str(root / "state.sqlite"),
                                   solver="dp", **config)
        self.server = OffcutServer(self.config)
        self.server.start()
        self.client = Client(self.config.listen, timeout_s=60)
        self.client.wait_ready(10)
        self.channel = grpc.insecure_channel(self.config.listen, options=[
            ("grpc.max_send_message_length", 256 * MIB),
            ("grpc.max_receive_message_length", 256 * MIB)])
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.db = sqlite3.connect(Path(self.config.state).resolve().as_uri() + "?mode=ro", uri=True)
        self.calls = 0

    def close(self) -> None:
        self.db.close()
        self.channel.close()
        self.client.close()
        self.server.stop(0.2)

    # -------------------------------------------------------------- calls
    def call(self, rpc: str, payload: bytes, timeout_s: float = 60.0):
        """Send ``payload`` (serialized request or arbitrary bytes) to ``rpc``; returns
        ``(code, details, responses)``."""
        method, _, streaming = METHODS[rpc]
        self.calls += 1
        ident = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            if not streaming:
                return grpc.StatusCode.OK, "", [self.channel.unary_unary(method, **ident)(
                    payload, timeout=timeout_s)]
            if rpc in REQUEST_STREAMS:
                call = self.channel.stream_stream(method, **ident)(iter([payload]),
                                                                   timeout=timeout_s)
            else:
                call = self.channel.unary_stream(method, **ident)(payload, timeout=timeout_s)
            out = []
            if rpc == "WatchPlacements":  # never ends by itself: the first update is enough
                for item in call:
                    out.append(item)
                    break
                call.cancel()
                return grpc.StatusCode.OK, "", out
            out = list(call)
            return grpc.StatusCode.OK, "", out
        except grpc.RpcError as err:
            return err.code(), err.details() or "", []

    def healthy(self) -> bool:
        resp = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    # -------------------------------------------------------------- state
    def zeus_rows(self):
        return (self.db.execute("SELECT kind, job_id, batch_size, state FROM zeus_state "
                                "ORDER BY kind, job_id, batch_size").fetchall(),
                self.db.execute("SELECT request_id, job_id, response FROM zeus_requests "
                                "ORDER BY request_id").fetchall())

    def key(self):
        """The persisted state: what the daemon reports of it (``status_key``), the journal's
        last row and the Zeus tables of the state file."""
        journal = self.db.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM journal").fetchone()
        return status_key(self.client), journal, self.zeus_rows()

    def context(self) -> Context:
        st_ = self.client.status(include_idle_nodes=True)
        tasks = self.client.list_tasks()
        active = [t.task_id for t in tasks if t.state in (
            TaskState.QUEUED, TaskState.ADMITTED, TaskState.RUNNING)]
        ctx = Context(clock=st_.clock or T0,
                      last_seq=dict(st_.last_seq), idle=list(st_.idle_node_names),
                      task_ids=[t.task_id for t in tasks], active_task_ids=active,
                      revision=st_.revision)
        for kind, job_id, batch_size, state in self.zeus_rows()[0]:
            if kind == "bso":
                ctx.jobs[job_id] = json.loads(state)
            else:
                ctx.profiles[(job_id, batch_size)] = json.loads(state)
        return ctx


class _Targets:
    """One fuzzed daemon shared by the tests of this module (its state grows richer from
    test to test), replaced by a fresh one when a failed test left it unusable."""

    def __init__(self, factory):
        self.factory = factory
        self.current: Target | None = None

    def get(self) -> Target:
        if self.current is not None:
            try:
                self.current.key()
                if self.current.healthy():
                    return self.current
            except Exception:
                pass
            self.current.close()
        self.current = Target(self.factory.mktemp("fuzz"))
        return self.current


@pytest.fixture(scope="module")
def _targets(tmp_path_factory):
    targets = _Targets(tmp_path_factory)
    yield targets
    if targets.current is not None:
        targets.current.close()


@pytest.fixture
def target(_targets):
    return _targets.get()


# ----------------------------------------------------------------------------- checks
FIELD_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*): \S")


def named_field(details: str, request_cls) -> str | None:
    """The request field a refusal names (``None`` if it names none of the request's)."""
    m = FIELD_RE.match(details)
    if not m:
        return None
    path = m.group(1)
    if path == "request":  # the bytes do not parse as the request type
        return path
    desc = request_cls.DESCRIPTOR
    for part in path.split("."):
        part = re.sub(r"\[\d+\]$", "", part)  # reports[3] -> the repeated field reports
        if desc is None or part not in desc.fields_by_name:
            return None
        desc = desc.fields_by_name[part].message_type
    return path


def checked_call(target: Target, rpc: str, request, *, watch_timeout_s: float = 0.3):
    """Call ``rpc`` with ``request`` (a message or raw bytes) and check the contract; returns
    ``(code, details, responses)``."""
    method, request_cls, _ = METHODS[rpc]
    payload = request if isinstance(request, bytes) else request.SerializeToString()
    before = target.key()
    timeout = watch_timeout_s if rpc == "WatchPlacements" else 60.0
    code, details, out = target.call(rpc, payload, timeout)
    _note(f"{rpc} -> {code.name}")
    shown = f"{rpc}({_describe(request)}) -> {code.name}: {details[:300]!r}"
    oversize = len(payload) > target.server.request_limit(method)
    if code == grpc.StatusCode.OK:
        assert not oversize, shown
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert oversize, f"RESOURCE_EXHAUSTED for a message within the size limit: {shown}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and rpc == "WatchPlacements":
        pass  # nothing to watch yet: the stream stays open until the deadline
    else:
        assert code in CLEAN, f"unclean status: {shown}"
        assert named_field(details, request_cls), f"the message names no request field: {shown}"
        assert len(details) <= 1000, shown
    if code != grpc.StatusCode.OK:
        assert target.key() == before, f"a refused call changed the state: {shown}"
    return code, details, out


def _note(text: str) -> None:
    """Count an outcome in Hypothesis's statistics (``pytest --hypothesis-show-statistics``
    shows what the fuzzer covered); a no-op outside a Hypothesis test."""
    try:
        event(text)
    except HypothesisInvalidArgument:
        pass


def _describe(request) -> str:
    if isinstance(request, bytes):
        return f"{len(request)} raw bytes {request[:40]!r}"
    text = str(request).replace("\n", " ")
    return text if len(text) < 400 else text[:400] + f"... ({len(text)} characters)"


# ----------------------------------------------------------------------------- primitives
NAN, INF = float("nan"), float("inf")
EDGE_FLOATS = [NAN, INF, -INF, -0.0, 0.0, 5e-324, -5e-324, 1e-300, 1e300, 1.7976931348623157e308,
               -1.7976931348623157e308, -1.0, 1.0, 0.5, 2.0**53 + 1, 1e15, 1e154, 1e200]
adv_floats = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True))
INT32_EDGES = [0, 1, -1, 2, 3, 2**31 - 1, -2**31, 2**31 - 2, 4734, 100_000, 200_001, 10**6, 10**9]
adv_int32 = st.one_of(st.sampled_from(INT32_EDGES), st.integers(-2**31, 2**31 - 1))
UINT64_EDGES = [0, 1, 2, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
adv_uint64 = st.one_of(st.sampled_from(UINT64_EDGES), st.integers(0, 2**64 - 1))
adv_int64 = st.one_of(st.sampled_from([0, 1, -1, 2**63 - 1, -2**63, 2**62]),
                      st.integers(-2**63, 2**63 - 1))
LONG = "x" * 100_000
EDGE_STRINGS = ["", " ", "\x00", "\n", "a\x00b", "tab\there", "\x7f", "é", "名前", "💥", "\u202e",
                "\ufeff", "n1", "c1n1", "-n1", ".n1", "n1 ", "N" * 128, "n" * 129, "a" * 200,
                "a" * 201, "a" * 2001, "t000001", "t1", "../../etc/passwd",
                "'; DROP TABLE journal;--", "%s%n%x", "{0}{command}", "\\", '"', LONG]
utf8 = st.characters(codec="utf-8")
adv_strings = st.one_of(st.sampled_from(EDGE_STRINGS), st.text(utf8, max_size=30),
                        st.text(utf8, min_size=200, max_size=3000))

NODES = [f"fz{i}" for i in range(1, 25)]
SOURCES = ["fz-a", "fz-b", "fz-c"]
OWNERS = ["alice", "bob"]
JOB_IDS = ["zj-a", "zj-b", "zj-c"]
BATCH_SIZES = [8, 16, 32, 64, 128]


# Draws never depend on the daemon's state (Hypothesis needs the same choices to mean the same
# draws in every example): a state-dependent value is picked after drawing, see ``pick``.
def pick(data, items: list, fallback):
    """One of ``items`` (``fallback`` when empty), chosen by a state-independent draw."""
    i = data.draw(st.integers(0, 2**16), label="pick")
    return items[i % len(items)] if items else fallback


def some_of(data, items: list, max_size: int) -> list:
    """A few distinct ``items`` chosen by a state-independent draw."""
    idx = data.draw(st.lists(st.integers(0, 2**16), max_size=max_size), label="some of")
    return list(dict.fromkeys(items[i % len(items)] for i in idx)) if items else []


def bad_name_lists(valid: list[str]):
    """Node-name lists that are wrong: malformed names, repeats, long lists of new names."""
    return st.one_of(
        st.lists(st.one_of(st.sampled_from(NODES), adv_strings), min_size=1, max_size=8),
        st.sampled_from(NODES).map(lambda n: [n, n]),
        st.just(valid + valid[:1] if valid else ["fz1", "fz1"]),
        st.integers(1, 3000).map(lambda k: [f"g{i}" for i in range(k)] + ["g0"]),
        st.integers(1, 3000).map(lambda k: [f"g{i}" for i in range(k)] + ["bad name"]),
        st.lists(st.sampled_from(EDGE_STRINGS), min_size=1, max_size=4))


def timestamps(ctx: Context, adversarial: bool):
    if not adversarial:
        return st.floats(0, 60).map(lambda dt: _ts(ctx.clock + dt))
    base = int(ctx.clock)
    return st.one_of(
        st.just(Timestamp()),
        st.builds(lambda s, n: Timestamp(seconds=s, nanos=n),
                  st.sampled_from([0, -1, -2**63, 2**63 - 1, 253402300799, 253402300800,
                                   base - 1000, base, base + 1, 1]),
                  st.sampled_from([0, -1, 10**9, 999_999_999, -2**31, 2**31 - 1])),
        st.builds(lambda s, n: Timestamp(seconds=s, nanos=n), adv_int64,
                  st.integers(-2**31, 2**31 - 1)))


def _ts(t: float) -> Timestamp:
    ts = Timestamp()
    ts.seconds, ts.nanos = int(t), int((t - int(t)) * 1e9)
    return ts


def _bad_fields(data, names: list[str], adversarial: bool) -> set[str]:
    """Which fields get an adversarial value (none for a valid request, else 1-2)."""
    if not adversarial:
        return set()
    return data.draw(st.sets(st.sampled_from(names), min_size=1, max_size=2), label="bad fields")


# ----------------------------------------------------------------------------- requests
def req_report_nodes(data, ctx: Context, adv: bool):
    bad = _bad_fields(data, ["time", "source", "seq", "idle", "preempted"], adv)
    source = data.draw(adv_strings if "source" in bad else st.sampled_from(SOURCES))
    last = ctx.last_seq.get(source, 0)
    seq = data.draw(st.one_of(adv_uint64, st.sampled_from([last, max(last - 1, 0)]))
                    if "seq" in bad else st.just(last + 1))
    free = [n for n in NODES if n not in ctx.idle]
    idle = data.draw(bad_name_lists(free)) if "idle" in bad else some_of(data, free, 4)
    rest = [n for n in ctx.idle if n not in idle] + ["ghost1"]
    preempted = data.draw(bad_name_lists(rest)) if "preempted" in bad else some_of(data, rest, 3)
    if not idle and not preempted and not bad:
        preempted = ["ghost1"]
    return nodes_pb2.NodeEvent(time=data.draw(timestamps(ctx, "time" in bad)), source=source,
                               seq=seq, idle=idle, preempted=preempted)


def req_sync_nodes(data, ctx: Context, adv: bool):
    bad = _bad_fields(data, ["time", "source", "seq", "idle"], adv)
    source = data.draw(adv_strings if "source" in bad else st.sampled_from(SOURCES))
    last = ctx.last_seq.get(source, 0)
    seq = data.draw(st.one_of(adv_uint64, st.just(last)) if "seq" in bad else st.just(last + 1))
    idle = data.draw(bad_name_lists(ctx.idle) if "idle" in bad
                     else st.lists(st.sampled_from(NODES), unique=True, max_size=10))
    return nodes_pb2.NodeSnapshot(time=data.draw(timestamps(ctx, "time" in bad)), source=source,
                                  seq=seq, idle=idle)


@st.composite
def valid_specs(draw):
    jmin = draw(st.integers(1, 3))
    jmax = jmin + draw(st.integers(0, 3))
    inner = draw(st.lists(st.integers(1, jmax + 2), unique=True, min_size=1, max_size=4))
    ns = [0] + sorted(set(inner) | {jmax})
    ps = [0.0] + sorted(draw(st.lists(st.floats(0, 1000), min_size=len(ns) - 1,
                                      max_size=len(ns) - 1)))
    spec = make_spec(name=draw(st.sampled_from(["fa", "fb", "fc"])), min_nodes=jmin,
                     max_nodes=jmax, ns=ns, ps=ps, up=draw(st.floats(0, 5)),
                     down=draw(st.floats(0, 5)), work=draw(st.floats(10, 5000)),
                     command=draw(st.lists(st.sampled_from(["python", "train.py", "--lr=0.1"]),
                                           max_size=3)))
    kind = draw(st.sampled_from(["modelled", "modelled", "reports", "learned"]))
    if kind == "learned":  # no curve: the daemon learns it from progress reports
        spec.ClearField("node_counts")
        spec.ClearField("throughputs")
    elif kind == "reports":
        spec.reports_progress = True
    return spec


SPEC_FIELDS = ["name", "min_nodes", "max_nodes", "node_counts", "throughputs", "objective_values",
               "rescale_up_s", "rescale_down_s", "total_work_samples", "command", "power_w"]


def bad_spec_value(data, name: str, spec: tasks_pb2.TaskSpec):
    if name == "name":
        return data.draw(adv_strings)
    if name in ("min_nodes", "max_nodes"):
        return data.draw(adv_int32)
    if name == "node_counts":
        return data.draw(st.one_of(
            st.lists(adv_int32, max_size=8),
            st.just([0, 2**31 - 1]), st.just([0, 1, 1, 2]), st.just([1, 2, 3]),
            st.integers(2, 3000).map(lambda k: list(range(k))[::-1]),
            st.just(list(range(100_001)))))
    if name in ("throughputs", "objective_values", "power_w"):
        n = len(spec.node_counts)
        return data.draw(st.one_of(st.lists(adv_floats, min_size=n, max_size=n),
                                   st.lists(adv_floats, max_size=6),
                                   st.sampled_from(EDGE_FLOATS).map(lambda x: [0.0] + [x] * (n - 1))))
    if name == "command":
        return data.draw(st.one_of(st.lists(adv_strings, max_size=5), st.just([""] * 5000),
                                   st.just(["x" * 70_000]), st.just(["y" * 60_000] * 20)))
    return data.draw(adv_floats)


def req_submit(data, ctx: Context, adv: bool):
    bad = _bad_fields(data, SPEC_FIELDS + ["spec", "owner", "request_id", "submit_time"], adv)
    spec = data.draw(valid_specs())
    for name in bad & set(SPEC_FIELDS):
        value = bad_spec_value(data, name, spec)
        if isinstance(value, list):
            spec.ClearField(name)
            getattr(spec, name).extend(value)
        else:
            setattr(spec, name, value)
    req = tasks_pb2.SubmitTaskRequest(
        owner=data.draw(adv_strings if "owner" in bad else st.sampled_from(OWNERS)),
        request_id=data.draw(adv_strings if "request_id" in bad
                             else st.sampled_from(["", "", f"fz-r{ctx.revision}", "fz-r1"])))
    if "spec" not in bad:
        req.spec.CopyFrom(spec)
    if "submit_time" in bad:
        req.submit_time.CopyFrom(data.draw(timestamps(ctx, True)))
    elif data.draw(st.booleans()):
        req.submit_time.CopyFrom(data.draw(timestamps(ctx, False)))
    return req


def task_id(data, ctx: Context, adv: bool, active: bool = False) -> str:
    if adv:
        return data.draw(st.one_of(adv_strings,
                                   st.sampled_from(["t999999", "t000000", "t0", "T000001"])))
    return pick(data, ctx.active_task_ids if active else ctx.task_ids, "t999999")


def req_get_task(data, ctx, adv):
    return tasks_pb2.GetTaskRequest(task_id=task_id(data, ctx, adv))


def req_list_tasks(data, ctx, adv):
    bad = _bad_fields(data, ["states", "owner", "page_size", "page_token"], adv)
    states = data.draw(st.one_of(st.lists(adv_int32, max_size=5),
                                 st.just(list(range(-5, 10_000)))) if "states" in bad
                       else st.lists(st.integers(1, 6), max_size=3))
    owner = data.draw(adv_strings if "owner" in bad else st.sampled_from(["", *OWNERS]))
    page_size = data.draw(st.integers(0, 2**32 - 1) if "page_size" in bad else st.integers(0, 3))
    page_token = data.draw(adv_strings if "page_token" in bad
                           else st.sampled_from(["", "t000001", "t000003"]))
    return tasks_pb2.ListTasksRequest(states=states, owner=owner, page_size=page_size,
                                      page_token=page_token)


def req_cancel(data, ctx, adv):
    bad = _bad_fields(data, ["task_id", "time"], adv)
    req = tasks_pb2.CancelTaskRequest(task_id=task_id(data, ctx, "task_id" in bad, True))
    if "time" in bad or data.draw(st.booleans()):
        req.time.CopyFrom(data.draw(timestamps(ctx, "time" in bad)))
    return req


def req_watch(data, ctx, adv):
    bad = _bad_fields(data, ["task_id", "after_revision"], adv)
    all_tasks = data.draw(st.booleans())
    return tasks_pb2.WatchPlacementsRequest(
        task_id="" if all_tasks and "task_id" not in bad else task_id(data, ctx, "task_id" in bad),
        after_revision=data.draw(adv_uint64) if "after_revision" in bad
        else data.draw(st.integers(0, 2**16)) % (ctx.revision + 1))


def req_task_run(data, ctx, adv):
    names = ["task_id", "state", "time", "node", "job_id", "exit_code", "message", "request_id",
             "generation"]
    bad = _bad_fields(data, names, adv)
    req = tasks_pb2.TaskRunReport(
        task_id=task_id(data, ctx, "task_id" in bad, True),
        state=data.draw(adv_int32 if "state" in bad else st.sampled_from([1, 2, 1, 2, 3, 4, 5])),
        node=data.draw(adv_strings if "node" in bad else st.sampled_from(["", *NODES[:3]])),
        job_id=data.draw(adv_strings if "job_id" in bad else st.sampled_from(["", "1234"])),
        exit_code=data.draw(adv_int32 if "exit_code" in bad else st.sampled_from([0, 1])),
        message=data.draw(adv_strings if "message" in bad else st.sampled_from(["", "ok"])),
        request_id=data.draw(adv_strings if "request_id" in bad
                             else st.sampled_from(["", f"fz-run{ctx.revision}"])))
    if "generation" in bad:
        req.generation = data.draw(adv_uint64)
    elif data.draw(st.booleans()):
        req.generation = data.draw(st.integers(1, 4))
    if "time" in bad or data.draw(st.booleans()):
        req.time.CopyFrom(data.draw(timestamps(ctx, "time" in bad)))
    return req


def req_energy(data, ctx, adv):
    """An energy report: plausible figures for a task's early generations and ranks (which
    the daemon may still refuse: a generation it has not reached, a rank beyond the world
    size), or adversarial ones."""
    bad = _bad_fields(data, ["task_id", "generation", "rank", "joules", "request_id"], adv)
    return tasks_pb2.EnergyReport(
        task_id=task_id(data, ctx, "task_id" in bad, False),
        generation=data.draw(adv_uint64 if "generation" in bad else st.integers(1, 4)),
        rank=data.draw(st.integers(0, 2**32 - 1) if "rank" in bad else st.integers(0, 5)),
        joules=data.draw(adv_floats if "joules" in bad else st.floats(0, 1e7)),
        request_id=data.draw(adv_strings if "request_id" in bad
                             else st.sampled_from(["", f"fz-e{ctx.revision}"])))


def req_progress(data, ctx, adv):
    """Progress reports: mostly plausible figures for active tasks (which the learners may
    still refuse: figures going backwards, counts never held), or adversarial ones."""
    req = tasks_pb2.ReportProgressRequest()
    bad = _bad_fields(data, ["reports", "request_id", "task_id", "time", "samples_done",
                             "nodes", "energy_j"], adv)
    req.request_id = data.draw(adv_strings if "request_id" in bad
                               else st.sampled_from(["", f"fz-p{ctx.revision}"]))
    if "reports" in bad and data.draw(st.booleans()):
        return req  # no report at all
    for _ in range(data.draw(st.integers(1, 3))):
        r = req.reports.add(
            task_id=task_id(data, ctx, "task_id" in bad, True),
            samples_done=data.draw(adv_floats if "samples_done" in bad
                                   else st.floats(0, 6000)),
            nodes=data.draw(adv_int32 if "nodes" in bad else st.integers(0, 6)))
        r.time.CopyFrom(data.draw(timestamps(ctx, "time" in bad)))
        if "energy_j" in bad:
            r.energy_j = data.draw(adv_floats)
        elif data.draw(st.booleans()):
            r.energy_j = data.draw(st.floats(0, 1e7))
    return req


def req_get_status(data, ctx, adv):
    return status_pb2.GetStatusRequest(include_idle_nodes=data.draw(st.booleans()))


def req_export(data, ctx, adv):
    bad = _bad_fields(data, ["after_revision", "limit"], adv)
    return status_pb2.ExportHistoryRequest(
        after_revision=data.draw(adv_uint64) if "after_revision" in bad
        else data.draw(st.integers(0, 2**16)) % (ctx.revision + 1),
        limit=data.draw(adv_uint64 if "limit" in bad else st.integers(0, 5)))


# ------------------------------------------------------------------ Zeus
JOB_FIELDS = ["job_id", "batch_sizes", "default_batch_size", "eta_knob", "beta_knob", "max_epochs",
              "target_metric", "max_power_w", "num_pruning_rounds", "window_size",
              "mab_prior_mean", "mab_prior_precision", "mab_num_explorations", "seed", "power",
              "suspended_trial_timeout_s"]
POWER_FIELDS = ["min_power_limit_w", "max_power_limit_w", "step_w", "warmup_steps",
                "profile_steps", "selector", "eta_knob", "max_slowdown_factor"]


def req_register(data, ctx, adv):
    bad = _bad_fields(data, JOB_FIELDS, adv)
    sizes = data.draw(st.lists(st.sampled_from(BATCH_SIZES), unique=True, min_size=1, max_size=4))
    spec = zeus_pb2.BatchSizeJobSpec(
        job_id=data.draw(st.sampled_from(JOB_IDS)), batch_sizes=sizes,
        default_batch_size=data.draw(st.sampled_from(sizes)), eta_knob=0.5, max_epochs=5,
        target_metric=0.7, higher_is_better=True, max_power_w=250.0, seed=7)
    if data.draw(st.booleans()):
        spec.beta_knob = 2.0
    timeout = data.draw(st.sampled_from([None, 0.0, 3600.0]))  # 0: stale at the next Predict
    if timeout is not None:
        spec.suspended_trial_timeout_s = timeout
    if "power" in bad or data.draw(st.booleans()):
        spec.power.CopyFrom(zeus_pb2.PowerLimitSpec(min_power_limit_w=100.0,
                                                    max_power_limit_w=250.0, step_w=50.0))
    for name in bad:
        if name == "job_id":
            spec.job_id = data.draw(adv_strings)
        elif name == "batch_sizes":
            spec.ClearField("batch_sizes")
            spec.batch_sizes.extend(data.draw(st.one_of(
                st.lists(adv_int32, max_size=6), st.just([32, 32]),
                st.just(list(range(1, 100_001))))))
        elif name in ("default_batch_size", "max_epochs", "num_pruning_rounds", "window_size",
                      "mab_num_explorations"):
            setattr(spec, name, data.draw(adv_int32))
        elif name == "seed":
            spec.seed = data.draw(adv_int64)
        elif name == "power":
            for pname in data.draw(st.sets(st.sampled_from(POWER_FIELDS), min_size=1, max_size=2)):
                if pname == "selector":
                    spec.power.selector = data.draw(adv_strings)
                elif pname in ("warmup_steps", "profile_steps"):
                    setattr(spec.power, pname, data.draw(adv_int32))
                else:
                    setattr(spec.power, pname, data.draw(adv_floats))
        else:
            setattr(spec, name, data.draw(adv_floats))
    return zeus_pb2.RegisterJobRequest(spec=spec)


def job_id(data, ctx: Context, adv: bool) -> str:
    if adv:
        return data.draw(st.one_of(adv_strings, st.just("zj-unknown")))
    return pick(data, sorted(ctx.jobs), JOB_IDS[0])


def _trials(ctx: Context, job_id: str) -> list[dict]:
    return ctx.jobs.get(job_id, {}).get("job", {}).get("trials", [])


GENERATIONS = st.sampled_from([0, 0, 1, 2])


def req_predict(data, ctx, adv):
    bad = _bad_fields(data, ["job_id", "request_id", "generation"], adv)
    return zeus_pb2.PredictRequest(
        job_id=job_id(data, ctx, "job_id" in bad),
        request_id=data.draw(adv_strings if "request_id" in bad
                             else st.sampled_from(["", "", "fz-p1", f"fz-p{len(ctx.jobs)}"])),
        generation=data.draw(adv_uint64 if "generation" in bad else GENERATIONS))


def req_report_epoch(data, ctx, adv):
    bad = _bad_fields(data, ["job_id", "trial_number", "epoch", "time_s", "energy_j", "metric",
                             "batch_size", "generation"], adv)
    job = job_id(data, ctx, "job_id" in bad)
    trials = _trials(ctx, job)
    running = [t for t in trials if t["status"] == "running"] or trials
    trial = pick(data, running, {"trial_number": 1, "batch_size": 0, "epochs": 0, "time_s": 0.0,
                                 "energy_j": 0.0})
    epoch = trial["epochs"] + 1
    return zeus_pb2.ReportEpochRequest(
        job_id=job,
        trial_number=data.draw(adv_int32 if "trial_number" in bad else st.just(trial["trial_number"])),
        epoch=data.draw(adv_int32 if "epoch" in bad else st.just(epoch)),
        time_s=data.draw(adv_floats if "time_s" in bad else st.just(trial["time_s"] + 10.0)),
        energy_j=data.draw(adv_floats if "energy_j" in bad else st.just(trial["energy_j"] + 2000.0)),
        metric=data.draw(adv_floats if "metric" in bad else st.sampled_from([0.1, 0.8])),
        batch_size=data.draw(adv_int32 if "batch_size" in bad
                             else st.sampled_from([0, trial["batch_size"]])),
        generation=data.draw(adv_uint64 if "generation" in bad
                             else st.just(trial.get("generation", 0))))


def req_end_trial(data, ctx, adv):
    bad = _bad_fields(data, ["job_id", "trial_number", "interrupted", "time_s", "energy_j",
                             "generation"], adv)
    job = job_id(data, ctx, "job_id" in bad)
    trials = _trials(ctx, job)
    trial = pick(data, trials, {"trial_number": 1, "time_s": 0.0, "energy_j": 0.0})
    interrupted = data.draw(st.booleans())
    request = zeus_pb2.EndTrialRequest(
        job_id=job, trial_number=data.draw(adv_int32) if "trial_number" in bad
        else trial["trial_number"], interrupted=interrupted,
        generation=data.draw(adv_uint64 if "generation" in bad
                             else st.just(trial.get("generation", 0))))
    for name in ("time_s", "energy_j"):  # the trial's totals plus the epoch cut short
        if name in bad:
            setattr(request, name, data.draw(adv_floats))
        elif interrupted and data.draw(st.booleans()):
            setattr(request, name, trial[name] + data.draw(st.sampled_from([0.0, 5.0])))
    if "interrupted" in bad:  # figures without interrupted
        request.interrupted = False
        request.time_s = data.draw(st.floats(0, 100))
    return request


def req_resume_trial(data, ctx, adv):
    bad = _bad_fields(data, ["job_id", "trial_number", "request_id", "generation"], adv)
    job = job_id(data, ctx, "job_id" in bad)
    trials = _trials(ctx, job)
    suspended = [t for t in trials if t["status"] == "suspended"] or trials
    trial = pick(data, suspended, {"trial_number": 1})
    return zeus_pb2.ResumeTrialRequest(
        job_id=job, trial_number=data.draw(adv_int32) if "trial_number" in bad
        else trial["trial_number"],
        request_id=data.draw(adv_strings if "request_id" in bad
                             else st.sampled_from(["", "fz-r1", f"fz-r{len(trials)}"])),
        generation=data.draw(adv_uint64) if "generation" in bad
        else trial.get("generation", 0) + data.draw(st.sampled_from([0, 1])))


def req_delete_job(data, ctx, adv):
    # valid deletes only now and then: they forget whatever the other calls built
    return zeus_pb2.DeleteJobRequest(job_id=job_id(data, ctx, adv or data.draw(st.integers(0, 4)) > 0))


def req_get_job(data, ctx, adv):
    return zeus_pb2.GetJobRequest(job_id=job_id(data, ctx, adv))


def _power_request(data, ctx, adv, cls, extra=()):
    bad = _bad_fields(data, ["job_id", "batch_size", *extra], adv)
    job = job_id(data, ctx, "job_id" in bad)
    predicted = sorted({t["batch_size"] for t in _trials(ctx, job)})
    batch_size = (data.draw(adv_int32) if "batch_size" in bad
                  else pick(data, predicted, BATCH_SIZES[0]))
    fields = {"job_id": job, "batch_size": batch_size}
    profile = ctx.profiles.get((job, batch_size))
    power = ctx.jobs.get(job, {}).get("power")
    if "power_limit_w" in extra:
        expected = power["max_power_limit_w"] if power else 250.0
        if profile and power:
            expected = power["max_power_limit_w"] - len(profile["windows"]) * power["step_w"]
        fields["power_limit_w"] = data.draw(adv_floats if "power_limit_w" in bad
                                            else st.just(expected))
    for name in ("time_s", "energy_j"):
        if name in extra:
            fields[name] = data.draw(adv_floats if name in bad else st.floats(1.0, 100.0))
    return cls(**fields)


def req_power_plan(data, ctx, adv):
    return _power_request(data, ctx, adv, zeus_pb2.PowerPlanRequest)


def req_report_window(data, ctx, adv):
    return _power_request(data, ctx, adv, zeus_pb2.ReportWindowRequest,
                          ("power_limit_w", "time_s", "energy_j"))


def req_interrupt_window(data, ctx, adv):
    return _power_request(data, ctx, adv, zeus_pb2.InterruptWindowRequest, ("power_limit_w",))


def req_get_profile(data, ctx, adv):
    return _power_request(data, ctx, adv, zeus_pb2.GetProfileRequest)


REQUESTS = {
    "ReportNodes": req_report_nodes, "SyncNodes": req_sync_nodes,
    "StreamNodes": req_report_nodes,  # one node event on the stream
    "SubmitTask": req_submit, "GetTask": req_get_task, "ListTasks": req_list_tasks,
    "CancelTask": req_cancel, "WatchPlacements": req_watch, "ReportTaskRun": req_task_run,
    "ReportProgress": req_progress, "ReportEnergy": req_energy,
    "GetStatus": req_get_status, "ExportHistory": req_export,
    "RegisterJob": req_register, "Predict": req_predict, "ReportEpoch": req_report_epoch,
    "EndTrial": req_end_trial, "ResumeTrial": req_resume_trial, "DeleteJob": req_delete_job,
    "GetJob": req_get_job,
    "GetPowerPlan": req_power_plan, "ReportWindow": req_report_window,
    "InterruptWindow": req_interrupt_window, "GetProfile": req_get_profile,
}
# valid calls mixed in so that state changes (weights by repetition)
DRIVERS = ["ReportNodes", "ReportNodes", "SyncNodes", "SubmitTask", "SubmitTask", "CancelTask",
           "ReportTaskRun", "ReportProgress", "ReportProgress", "RegisterJob", "Predict", "Predict", "ReportEpoch", "ReportEpoch",
           "EndTrial", "EndTrial", "ResumeTrial", "GetPowerPlan", "ReportWindow"]


# ----------------------------------------------------------------------------- raw bytes
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def raw_requests(request_cls):
    """Bytes that are not (or only barely) a valid message of ``request_cls``: random
    bytes, wrong wire types for its fields, invalid UTF-8, truncations, bad lengths, field
    number 0, unterminated groups, deep nesting, another message type's bytes."""
    numbers = [f.number for f in request_cls.DESCRIPTOR.fields] or [1]
    number = st.one_of(st.sampled_from(numbers), st.integers(1, 2**29 - 1))
    payload = st.binary(max_size=40)
    wrong = st.one_of(
        st.builds(lambda n, v: _tag(n, 0) + _varint(v), number, adv_uint64),
        st.builds(lambda n, b: _tag(n, 2) + _varint(len(b)) + b, number, payload),
        st.builds(lambda n: _tag(n, 2) + _varint(2) + b"\xff\xfe", number),   # invalid UTF-8
        st.builds(lambda n: _tag(n, 2) + _varint(2) + b"\xed\xa0", number),   # a surrogate
        st.builds(lambda n, b: _tag(n, 1) + b[:8].ljust(8, b"\0"), number, payload),
        st.builds(lambda n, b: _tag(n, 5) + b[:4].ljust(4, b"\0"), number, payload),
        st.builds(lambda n: _tag(n, 2) + _varint(1000), number),              # length past end
        st.builds(lambda n: _tag(n, 0) + b"\xff" * 11, number),              # overlong varint
        st.builds(lambda n: _tag(n, 3) + b"\x08\x01", number),               # group, no end
        st.builds(lambda n: _tag(n, 4), number),                             # end of no group
        st.builds(lambda n, w: _tag(n, w), number, st.sampled_from([6, 7])),  # no such wire type
        st.just(b"\x00\x01"),                                                # field number 0
        st.just(_nested(200)))
    other = st.sampled_from([nodes_pb2.NodeEvent(source="x", seq=1, idle=["n1"]),
                             make_spec(), zeus_pb2.ReportEpochRequest(job_id="j", epoch=1),
                             tasks_pb2.TaskRunReport(task_id="t000001", state=3)]).map(
        lambda m: m.SerializeToString())
    return st.one_of(st.binary(max_size=200), st.lists(wrong, min_size=1, max_size=3).map(b"".join),
                     other, other.map(lambda b: b[:-1]))


def _nested(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = _tag(1, 2) + _varint(len(inner)) + inner
    return inner


# ----------------------------------------------------------------------------- the fuzz test
def run_example(target: Target, rpc: str, data) -> None:
    """One example: the RPC under test (valid, perturbed or raw bytes), possibly after a few
    valid calls of any kind; every call checked; the daemon healthy at the end."""
    drivers = data.draw(st.lists(st.sampled_from(DRIVERS), max_size=2), label="valid calls first")
    for name in drivers:
        checked_call(target, name, REQUESTS[name](data, target.context(), False))
    mode = data.draw(st.sampled_from(["valid", "adversarial", "adversarial", "adversarial", "raw"]),
                     label="mode")
    if mode == "raw":
        request = data.draw(raw_requests(METHODS[rpc][1]), label="raw request")
    else:
        request = REQUESTS[rpc](data, target.context(), mode == "adversarial")
    code, _, _ = checked_call(target, rpc, request)
    _note(f"{mode} {rpc} -> {code.name}")
    assert target.healthy(), f"the daemon stopped serving after {rpc}"


def test_every_rpc_has_a_strategy():
    """New RPCs must be fuzzed too."""
    assert set(REQUESTS) == set(METHODS)


@pytest.mark.parametrize("rpc", sorted(METHODS))
@FUZZ
@given(data=st.data())
def test_fuzz_rpc(target, rpc, data):
    run_example(target, rpc, data)


# ----------------------------------------------------------------------------- huge inputs
@pytest.fixture
def fresh(tmp_path):
    """A factory of fresh daemons (``fresh(**config)``), closed after the test."""
    made: list[Target] = []

    def make(**config) -> Target:
        made.append(Target(tmp_path / f"d{len(made)}", **config))
        return made[-1]

    yield make
    for t in made:
        t.close()


def _refused(target: Target, rpc: str, request, code: grpc.StatusCode, field_: str,
             *needles: str) -> str:
    """Call, check the contract (``checked_call``), and that the refusal is ``code`` naming
    ``field_`` and containing ``needles``; returns the message."""
    got, details, _ = checked_call(target, rpc, request)
    assert got == code, (got, details)
    assert details.startswith(f"{field_}: "), details
    for needle in needles:
        assert needle in details, details
    return details


def test_a_million_node_names_in_one_request_are_refused_cleanly(fresh):
    t = fresh()
    checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0), source="w", seq=1,
                                                       idle=["keep1"]))
    million = [f"m{i}" for i in range(1_000_000)]
    _refused(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0 + 1), source="w", seq=2,
                                                   idle=million),
             grpc.StatusCode.INVALID_ARGUMENT, "idle", "1000000", "max_event_nodes (200000)")
    _refused(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0 + 1), source="w", seq=2,
                                                   preempted=million),
             grpc.StatusCode.INVALID_ARGUMENT, "preempted", "max_event_nodes (200000)")
    _refused(t, "SyncNodes", nodes_pb2.NodeSnapshot(time=_ts(T0 + 1), source="w", seq=2,
                                                    idle=million),
             grpc.StatusCode.INVALID_ARGUMENT, "idle", "max_event_nodes (200000)")
    assert t.healthy()
    assert t.client.status().idle_nodes == 1


def test_a_snapshot_of_100000_nodes_is_accepted_and_taken_back(fresh):
    t = fresh()
    names = [f"big{i}" for i in range(100_000)]
    checked_call(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(
        spec=make_spec(max_nodes=50_000, ns=(0, 1, 50_000), ps=(0.0, 1.0, 40_000.0)),
        submit_time=_ts(T0)))
    code, _, out = checked_call(t, "SyncNodes", nodes_pb2.NodeSnapshot(
        time=_ts(T0 + 1), source="watcher", seq=1, idle=names))
    assert code == grpc.StatusCode.OK
    st_ = t.client.status()
    assert st_.idle_nodes == 100_000 and st_.nodes_in_use == 50_000
    code, _, _ = checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(
        time=_ts(T0 + 2), source="prolog", seq=1, preempted=names))
    assert code == grpc.StatusCode.OK
    assert t.client.status().idle_nodes == 0


def test_a_message_over_the_size_limit_is_resource_exhausted(fresh):
    t = fresh(max_message_mb=1)
    checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0), source="w", seq=1,
                                                       idle=["keep1"]))
    big = nodes_pb2.NodeEvent(time=_ts(T0 + 1), source="w", seq=2,
                              idle=[f"n{i:09d}" for i in range(200_000)])
    assert len(big.SerializeToString()) > 2 * MIB
    code, details, _ = checked_call(t, "ReportNodes", big)  # checks: state unchanged
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    code, _, _ = checked_call(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(
        spec=make_spec(command=["x" * 60_000] * 20), submit_time=_ts(T0)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert t.healthy()
    assert checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(
        time=_ts(T0 + 2), source="w", seq=2, idle=["n1"]))[0] == grpc.StatusCode.OK


# ----------------------------------------------------------------------------- limits
def test_limit_defaults_match_the_engine_defaults():
    from offcut.taskspec import Limits

    assert DaemonConfig().limits() == Limits()
    assert DaemonConfig(max_event_nodes=5, max_power_limits=7).limits() == Limits(
        max_event_nodes=5, max_power_limits=7)


SMALL_LIMITS = dict(max_event_nodes=10, max_idle_nodes=12, max_task_nodes=8, max_curve_points=5,
                    max_command_args=3, max_command_bytes=20, max_batch_sizes=4,
                    max_power_limits=5)


def _job(**kw) -> zeus_pb2.RegisterJobRequest:
    fields = dict(job_id="lim", batch_sizes=[32, 64], default_batch_size=32, eta_knob=0.5,
                  max_epochs=3, target_metric=0.5, higher_is_better=True, max_power_w=250.0,
                  seed=1)
    fields.update(kw)
    return zeus_pb2.RegisterJobRequest(spec=zeus_pb2.BatchSizeJobSpec(**fields))


def test_configured_limits_refuse_larger_requests_naming_field_and_limit(fresh):
    t = fresh(**SMALL_LIMITS)
    ten = [f"l{i}" for i in range(10)]
    E = grpc.StatusCode.INVALID_ARGUMENT
    _refused(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0), source="w", seq=1,
                                                   idle=ten + ["l10"]),
             E, "idle", "max_event_nodes (10)")
    _refused(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0), source="w", seq=1, idle=ten[:6],
                                                   preempted=[f"p{i}" for i in range(5)]),
             E, "preempted", "max_event_nodes (10)")
    assert checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(
        time=_ts(T0), source="w", seq=1, idle=ten))[0] == grpc.StatusCode.OK
    _refused(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0 + 1), source="w", seq=2,
                                                   idle=["x1", "x2", "x3"]),
             grpc.StatusCode.FAILED_PRECONDITION, "idle", "13 nodes", "max_idle_nodes (12)")
    # taking one back while adding three stays within the pool limit
    assert checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(
        time=_ts(T0 + 1), source="w", seq=2, idle=["x1", "x2", "x3"],
        preempted=["l0"]))[0] == grpc.StatusCode.OK
    spec = make_spec
    _refused(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(spec=spec(max_nodes=9, ns=(0, 9),
                                                                    ps=(0, 1))),
             E, "spec.max_nodes", "max_task_nodes (8)")
    _refused(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(spec=spec(ns=range(6), ps=[0.0] * 6)),
             E, "spec.node_counts", "max_curve_points (5)")
    _refused(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(spec=spec(command=["a"] * 4)),
             E, "spec.command", "max_command_args (3)")
    _refused(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(spec=spec(command=["é" * 11])),
             E, "spec.command", "max_command_bytes (20)")
    assert checked_call(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(
        spec=spec(max_nodes=8, ns=(0, 4, 8), ps=(0, 1, 2), command=["a", "b", "c" * 18]),
        submit_time=_ts(T0 + 2)))[0] == grpc.StatusCode.OK
    _refused(t, "RegisterJob", _job(batch_sizes=[1, 2, 3, 4, 5], default_batch_size=1),
             E, "spec.batch_sizes", "max_batch_sizes (4)")
    _refused(t, "RegisterJob", _job(power=zeus_pb2.PowerLimitSpec(
        min_power_limit_w=100, max_power_limit_w=250, step_w=25)),
             E, "spec.power.step_w", "7 power limits", "max_power_limits (5)")
    assert checked_call(t, "RegisterJob", _job(power=zeus_pb2.PowerLimitSpec(
        min_power_limit_w=150, max_power_limit_w=250, step_w=25)))[0] == grpc.StatusCode.OK


def test_limits_apply_to_new_requests_not_to_the_journal(tmp_path):
    """A restart with lower limits re-applies the journal written under the higher ones."""
    root = tmp_path / "d"
    t = Target(root)
    checked_call(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(
        spec=make_spec(command=["a"] * 10), submit_time=_ts(T0)))
    checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0 + 1), source="w", seq=1,
                                                       idle=[f"n{i}" for i in range(20)]))
    before = t.key()
    t.close()
    t = Target(root, max_command_args=2, max_event_nodes=5, max_idle_nodes=5)
    try:
        assert t.key() == before
        _refused(t, "ReportNodes", nodes_pb2.NodeEvent(time=_ts(T0 + 2), source="w", seq=2,
                                                       idle=["m1"]),
                 grpc.StatusCode.FAILED_PRECONDITION, "idle", "max_idle_nodes (5)")
    finally:
        t.close()


# ----------------------------------------------------------------------------- regressions
# Bugs the fuzzer (or reading the code it pointed at) found; each was INTERNAL, a wrong code,
# or worse before its fix.

@pytest.mark.parametrize("rpc,payload", [
    ("GetTask", b"\x0a\x02\xff\xfe"),            # invalid UTF-8 in task_id
    ("ReportNodes", b"\x22\x05fz"),              # length beyond the end
    ("SubmitTask", b"\x00\x01"),                 # field number 0
    ("ExportHistory", b"\x0b"),                  # a group that never ends (streaming method)
    ("RegisterJob", _nested(200)),               # nesting deeper than the parser allows
])
def test_bytes_that_do_not_parse_are_invalid_argument(target, rpc, payload):
    """Was INTERNAL "Exception deserializing request!" (gRPC Python's own answer)."""
    details = _refused(target, rpc, payload, grpc.StatusCode.INVALID_ARGUMENT, "request",
                       "not a valid offcut.v1.")
    assert METHODS[rpc][1].DESCRIPTOR.full_name in details


@pytest.mark.parametrize("rpc", ["ReportNodes", "SyncNodes"])
def test_a_seq_beyond_signed_64_bits_is_invalid_argument(fresh, rpc):
    """Was INTERNAL: the duplicate lookup handed 2^63 to SQLite (OverflowError)."""
    t = fresh()
    cls = METHODS[rpc][1]
    _refused(t, rpc, cls(time=_ts(T0), source="w", seq=2**63, idle=["n1"]),
             grpc.StatusCode.INVALID_ARGUMENT, "seq", "2^63")
    assert checked_call(t, rpc, cls(time=_ts(T0), source="w", seq=2**63 - 1,
                                    idle=["n1"]))[0] == grpc.StatusCode.OK


def test_a_time_beyond_year_9999_is_invalid_argument_and_the_daemon_keeps_answering(fresh):
    """Was accepted: the core's clock became 2^62 s, every later reply (the decision itself,
    GetStatus, ...) failed INTERNAL converting it to a Timestamp, until a restart."""
    t = fresh()
    for rpc, request in [
            ("ReportNodes", nodes_pb2.NodeEvent(time=Timestamp(seconds=2**62), source="w", seq=1,
                                                idle=["n1"])),
            ("SubmitTask", tasks_pb2.SubmitTaskRequest(
                spec=make_spec(), submit_time=Timestamp(seconds=253402300800)))]:
        field_ = "time" if rpc == "ReportNodes" else "submit_time"
        _refused(t, rpc, request, grpc.StatusCode.INVALID_ARGUMENT, field_, "9999")
    assert checked_call(t, "ReportNodes", nodes_pb2.NodeEvent(
        time=Timestamp(seconds=253402300799), source="w", seq=1, idle=["n1"]))[0] == grpc.StatusCode.OK
    assert int(t.client.status().clock) == 253402300799


def test_a_failure_after_the_core_changed_reloads_the_state(tmp_path, monkeypatch):
    """Was: a failure while building the reply (after the core applied the event) left the
    half-applied change in memory, unjournaled."""
    from offcut.daemon.app.engine import Engine
    from offcut.daemon.app.model import NodeEvent
    from offcut.daemon.app.solvers.allocator import Allocator
    from offcut.daemon.app.store import Store

    engine = Engine(Store(tmp_path / "s.sqlite"), Allocator("dp"))
    try:
        before = engine.scheduler.fingerprint()

        def broken(out, requested_solver, sent_time=None):
            raise RuntimeError("reply cannot be built")

        monkeypatch.setattr("offcut.daemon.app.engine.decision_of", broken)
        with pytest.raises(RuntimeError):
            engine.apply(NodeEvent(T0, "w", 1, idle=("n1",)))
        assert engine.scheduler.fingerprint() == before
        assert engine.scheduler.limits == engine.limits  # the reloaded core keeps the limits
    finally:
        engine.close()


def test_long_ids_are_refused_or_quoted_within_the_status_size(target):
    """Was RESOURCE_EXHAUSTED at the client: the NOT_FOUND message quoted the whole 100,000
    character id, past gRPC's 8 KiB limit on trailing metadata. Ids that are keys of the state
    file (Zeus job and request ids) are now limited to 200 characters."""
    details = _refused(target, "GetTask", tasks_pb2.GetTaskRequest(task_id=LONG),
                       grpc.StatusCode.NOT_FOUND, "task_id", "characters)")
    assert len(details) <= 1000
    _refused(target, "GetJob", zeus_pb2.GetJobRequest(job_id=LONG),
             grpc.StatusCode.INVALID_ARGUMENT, "job_id", "200 characters")
    _refused(target, "RegisterJob", _job(job_id="j" * 201),
             grpc.StatusCode.INVALID_ARGUMENT, "spec.job_id", "200 characters")
    _refused(target, "Predict", zeus_pb2.PredictRequest(job_id="zj-a", request_id=LONG),
             grpc.StatusCode.INVALID_ARGUMENT, "request_id", "200 characters")
    _refused(target, "RegisterJob", _job(batch_sizes=[7] * 1000, default_batch_size=7),
             grpc.StatusCode.INVALID_ARGUMENT, "spec.batch_sizes", "...")


def test_a_task_wanting_two_billion_nodes_is_refused(fresh):
    """Was accepted; the allocation then built a 2^31-entry objective table: MemoryError
    (INTERNAL) on every later event, or the daemon killed for memory."""
    t = fresh()
    _refused(t, "SubmitTask", tasks_pb2.SubmitTaskRequest(spec=make_spec(
        max_nodes=2**31 - 1, ns=(0, 2**31 - 1), ps=(0.0, 1.0))),
             grpc.StatusCode.INVALID_ARGUMENT, "spec.max_nodes", "max_task_nodes (200000)")


def test_a_power_spec_with_a_tiny_step_is_refused(fresh):
    """Was accepted; GetPowerPlan then built the list of (max - min) / step limits:
    MemoryError (1e-6 W: 1.5e8 limits) or OverflowError (1e-300 W: inf)."""
    t = fresh()
    for step in (1e-6, 1e-300, 5e-324):
        _refused(t, "RegisterJob", _job(power=zeus_pb2.PowerLimitSpec(
            min_power_limit_w=100, max_power_limit_w=250, step_w=step)),
                 grpc.StatusCode.INVALID_ARGUMENT, "spec.power.step_w", "max_power_limits (1000)")


def test_a_report_whose_cost_overflows_is_refused_and_predict_keeps_working(fresh):
    """Was accepted: costs of 1e200 J and more made the bandit's variance inf, its precision
    0, and every later Predict of the job failed INTERNAL (ZeroDivisionError)."""
    t = fresh()
    checked_call(t, "RegisterJob", _job(batch_sizes=[32], num_pruning_rounds=1,
                                        mab_num_explorations=1))
    for time_s in (1.0, 1e200):
        code, _, out = checked_call(t, "Predict", zeus_pb2.PredictRequest(job_id="lim"))
        trial = zeus_pb2.Prediction.FromString(out[0]).trial_number
        report = zeus_pb2.ReportEpochRequest(job_id="lim", trial_number=trial, epoch=1,
                                             time_s=time_s, energy_j=1.0, metric=0.9)
        if time_s == 1.0:
            assert checked_call(t, "ReportEpoch", report)[0] == grpc.StatusCode.OK
        else:
            _refused(t, "ReportEpoch", report, grpc.StatusCode.INVALID_ARGUMENT, "time_s",
                     "above 1e+100 J")
            checked_call(t, "EndTrial", zeus_pb2.EndTrialRequest(job_id="lim",
                                                                 trial_number=trial))
    assert checked_call(t, "Predict", zeus_pb2.PredictRequest(job_id="lim"))[0] == grpc.StatusCode.OK

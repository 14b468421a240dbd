import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from offcut.v1 import decision_pb2 as _decision_pb2
from offcut.v1 import tasks_pb2 as _tasks_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ("include_idle_nodes",)
    INCLUDE_IDLE_NODES_FIELD_NUMBER: _ClassVar[int]
    include_idle_nodes: bool
    def __init__(self, include_idle_nodes: _Optional[bool] = ...) -> None: ...

class SolverStatistics(_message.Message):
    __slots__ = ("configured_solver", "decisions", "decision_ms_p50", "decision_ms_p95", "decision_ms_p99", "decision_ms_max", "fallbacks", "solves_by_backend", "last_fallback_reason")
    class SolvesByBackendEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CONFIGURED_SOLVER_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_P50_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_P95_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_P99_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    SOLVES_BY_BACKEND_FIELD_NUMBER: _ClassVar[int]
    LAST_FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    configured_solver: str
    decisions: int
    decision_ms_p50: float
    decision_ms_p95: float
    decision_ms_p99: float
    decision_ms_max: float
    fallbacks: int
    solves_by_backend: _containers.ScalarMap[str, int]
    last_fallback_reason: str
    def __init__(self, configured_solver: _Optional[str] = ..., decisions: _Optional[int] = ..., decision_ms_p50: _Optional[float] = ..., decision_ms_p95: _Optional[float] = ..., decision_ms_p99: _Optional[float] = ..., decision_ms_max: _Optional[float] = ..., fallbacks: _Optional[int] = ..., solves_by_backend: _Optional[_Mapping[str, int]] = ..., last_fallback_reason: _Optional[str] = ...) -> None: ...

class SnapshotStatistics(_message.Message):
    __slots__ = ("count", "ms_p50", "ms_p99", "ms_max", "last_ms", "last_revision")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MS_P50_FIELD_NUMBER: _ClassVar[int]
    MS_P99_FIELD_NUMBER: _ClassVar[int]
    MS_MAX_FIELD_NUMBER: _ClassVar[int]
    LAST_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_REVISION_FIELD_NUMBER: _ClassVar[int]
    count: int
    ms_p50: float
    ms_p99: float
    ms_max: float
    last_ms: float
    last_revision: int
    def __init__(self, count: _Optional[int] = ..., ms_p50: _Optional[float] = ..., ms_p99: _Optional[float] = ..., ms_max: _Optional[float] = ..., last_ms: _Optional[float] = ..., last_revision: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("clock", "revision", "idle_nodes", "nodes_in_use", "idle_node_names", "queued_tasks", "admitted_tasks", "running_tasks", "completed_tasks", "cancelled_tasks", "last_decision", "solver", "last_seq", "total_samples", "idle_node_seconds", "used_node_seconds", "tfwd_s", "max_running_tasks", "failed_tasks", "objective", "eta", "task_energy_j", "energy_j", "clock_mode", "snapshots", "nodes_awaiting_launch")
    class LastSeqEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    IDLE_NODES_FIELD_NUMBER: _ClassVar[int]
    NODES_IN_USE_FIELD_NUMBER: _ClassVar[int]
    IDLE_NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TASKS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TASKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TASKS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_TASKS_FIELD_NUMBER: _ClassVar[int]
    LAST_DECISION_FIELD_NUMBER: _ClassVar[int]
    SOLVER_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    IDLE_NODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    USED_NODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TFWD_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    FAILED_TASKS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    TASK_ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    CLOCK_MODE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    NODES_AWAITING_LAUNCH_FIELD_NUMBER: _ClassVar[int]
    clock: _timestamp_pb2.Timestamp
    revision: int
    idle_nodes: int
    nodes_in_use: int
    idle_node_names: _containers.RepeatedScalarFieldContainer[str]
    queued_tasks: int
    admitted_tasks: int
    running_tasks: int
    completed_tasks: int
    cancelled_tasks: int
    last_decision: _decision_pb2.Decision
    solver: SolverStatistics
    last_seq: _containers.ScalarMap[str, int]
    total_samples: float
    idle_node_seconds: float
    used_node_seconds: float
    tfwd_s: float
    max_running_tasks: int
    failed_tasks: int
    objective: str
    eta: float
    task_energy_j: float
    energy_j: float
    clock_mode: str
    snapshots: SnapshotStatistics
    nodes_awaiting_launch: int
    def __init__(self, clock: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., idle_nodes: _Optional[int] = ..., nodes_in_use: _Optional[int] = ..., idle_node_names: _Optional[_Iterable[str]] = ..., queued_tasks: _Optional[int] = ..., admitted_tasks: _Optional[int] = ..., running_tasks: _Optional[int] = ..., completed_tasks: _Optional[int] = ..., cancelled_tasks: _Optional[int] = ..., last_decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ..., solver: _Optional[_Union[SolverStatistics, _Mapping]] = ..., last_seq: _Optional[_Mapping[str, int]] = ..., total_samples: _Optional[float] = ..., idle_node_seconds: _Optional[float] = ..., used_node_seconds: _Optional[float] = ..., tfwd_s: _Optional[float] = ..., max_running_tasks: _Optional[int] = ..., failed_tasks: _Optional[int] = ..., objective: _Optional[str] = ..., eta: _Optional[float] = ..., task_energy_j: _Optional[float] = ..., energy_j: _Optional[float] = ..., clock_mode: _Optional[str] = ..., snapshots: _Optional[_Union[SnapshotStatistics, _Mapping]] = ..., nodes_awaiting_launch: _Optional[int] = ...) -> None: ...

class ExportHistoryRequest(_message.Message):
    __slots__ = ("after_revision", "limit")
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_revision: int
    limit: int
    def __init__(self, after_revision: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("revision", "kind", "decision", "task")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    revision: int
    kind: str
    decision: _decision_pb2.Decision
    task: _tasks_pb2.Task
    def __init__(self, revision: _Optional[int] = ..., kind: _Optional[str] = ..., decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ..., task: _Optional[_Union[_tasks_pb2.Task, _Mapping]] = ...) -> None: ...

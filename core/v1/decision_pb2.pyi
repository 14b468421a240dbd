import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlacementChange(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_CHANGE_UNSPECIFIED: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_START: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_GROW: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_SHRINK: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_STOP: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_PREEMPTED: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_COMPLETED: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_CANCELLED: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_FAILED: _ClassVar[PlacementChange]
    PLACEMENT_CHANGE_RESTART: _ClassVar[PlacementChange]
PLACEMENT_CHANGE_UNSPECIFIED: PlacementChange
PLACEMENT_CHANGE_START: PlacementChange
PLACEMENT_CHANGE_GROW: PlacementChange
PLACEMENT_CHANGE_SHRINK: PlacementChange
PLACEMENT_CHANGE_STOP: PlacementChange
PLACEMENT_CHANGE_PREEMPTED: PlacementChange
PLACEMENT_CHANGE_COMPLETED: PlacementChange
PLACEMENT_CHANGE_CANCELLED: PlacementChange
PLACEMENT_CHANGE_FAILED: PlacementChange
PLACEMENT_CHANGE_RESTART: PlacementChange

class Placement(_message.Message):
    __slots__ = ("task_id", "task_name", "change", "nodes", "previous_node_count", "rate_samples_per_s", "work_done_samples", "total_work_samples", "time", "generation")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_NAME_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_NODE_COUNT_FIELD_NUMBER: _ClassVar[int]
    RATE_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    WORK_DONE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_WORK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    task_name: str
    change: PlacementChange
    nodes: _containers.RepeatedScalarFieldContainer[str]
    previous_node_count: int
    rate_samples_per_s: float
    work_done_samples: float
    total_work_samples: float
    time: _timestamp_pb2.Timestamp
    generation: int
    def __init__(self, task_id: _Optional[str] = ..., task_name: _Optional[str] = ..., change: _Optional[_Union[PlacementChange, str]] = ..., nodes: _Optional[_Iterable[str]] = ..., previous_node_count: _Optional[int] = ..., rate_samples_per_s: _Optional[float] = ..., work_done_samples: _Optional[float] = ..., total_work_samples: _Optional[float] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., generation: _Optional[int] = ...) -> None: ...

class EventStats(_message.Message):
    __slots__ = ("interval_s", "progress_samples", "rate_samples_per_s", "rescale_cost_samples", "nodes_left", "tasks_preempted", "nodes_joined", "admitted_tasks", "idle_nodes", "running_tasks", "nodes_in_use", "preemption_cost_samples", "tasks_completed")
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    RATE_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    RESCALE_COST_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NODES_LEFT_FIELD_NUMBER: _ClassVar[int]
    TASKS_PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    NODES_JOINED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TASKS_FIELD_NUMBER: _ClassVar[int]
    IDLE_NODES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    NODES_IN_USE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_COST_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TASKS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    progress_samples: float
    rate_samples_per_s: float
    rescale_cost_samples: float
    nodes_left: int
    tasks_preempted: int
    nodes_joined: int
    admitted_tasks: int
    idle_nodes: int
    running_tasks: int
    nodes_in_use: int
    preemption_cost_samples: float
    tasks_completed: int
    def __init__(self, interval_s: _Optional[float] = ..., progress_samples: _Optional[float] = ..., rate_samples_per_s: _Optional[float] = ..., rescale_cost_samples: _Optional[float] = ..., nodes_left: _Optional[int] = ..., tasks_preempted: _Optional[int] = ..., nodes_joined: _Optional[int] = ..., admitted_tasks: _Optional[int] = ..., idle_nodes: _Optional[int] = ..., running_tasks: _Optional[int] = ..., nodes_in_use: _Optional[int] = ..., preemption_cost_samples: _Optional[float] = ..., tasks_completed: _Optional[int] = ...) -> None: ...

class SolveStats(_message.Message):
    __slots__ = ("requested_solver", "solver", "status", "objective", "bound", "solve_ms", "fallback_reason", "solves")
    REQUESTED_SOLVER_FIELD_NUMBER: _ClassVar[int]
    SOLVER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    SOLVE_MS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    SOLVES_FIELD_NUMBER: _ClassVar[int]
    requested_solver: str
    solver: str
    status: str
    objective: float
    bound: float
    solve_ms: float
    fallback_reason: str
    solves: int
    def __init__(self, requested_solver: _Optional[str] = ..., solver: _Optional[str] = ..., status: _Optional[str] = ..., objective: _Optional[float] = ..., bound: _Optional[float] = ..., solve_ms: _Optional[float] = ..., fallback_reason: _Optional[str] = ..., solves: _Optional[int] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("time", "source", "seq", "revision", "duplicate", "placements", "stats", "solve", "ignored_nodes", "completed_task_ids", "sent_time", "warnings")
    TIME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SOLVE_FIELD_NUMBER: _ClassVar[int]
    IGNORED_NODES_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    SENT_TIME_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    source: str
    seq: int
    revision: int
    duplicate: bool
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    stats: EventStats
    solve: SolveStats
    ignored_nodes: _containers.RepeatedScalarFieldContainer[str]
    completed_task_ids: _containers.RepeatedScalarFieldContainer[str]
    sent_time: _timestamp_pb2.Timestamp
    warnings: _containers.RepeatedCompositeFieldContainer[TaskWarning]
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., seq: _Optional[int] = ..., revision: _Optional[int] = ..., duplicate: _Optional[bool] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., stats: _Optional[_Union[EventStats, _Mapping]] = ..., solve: _Optional[_Union[SolveStats, _Mapping]] = ..., ignored_nodes: _Optional[_Iterable[str]] = ..., completed_task_ids: _Optional[_Iterable[str]] = ..., sent_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., warnings: _Optional[_Iterable[_Union[TaskWarning, _Mapping]]] = ...) -> None: ...

class TaskWarning(_message.Message):
    __slots__ = ("kind", "message", "time", "generation", "task_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    time: _timestamp_pb2.Timestamp
    generation: int
    task_id: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., generation: _Optional[int] = ..., task_id: _Optional[str] = ...) -> None: ...

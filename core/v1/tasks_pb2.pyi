import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from offcut.v1 import decision_pb2 as _decision_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_QUEUED: _ClassVar[TaskState]
    TASK_STATE_ADMITTED: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_STARTED: _ClassVar[RunState]
    RUN_STATE_PREEMPTED: _ClassVar[RunState]
    RUN_STATE_FINISHED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_INTERRUPTED: _ClassVar[RunState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_QUEUED: TaskState
TASK_STATE_ADMITTED: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_CANCELLED: TaskState
TASK_STATE_FAILED: TaskState
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_STARTED: RunState
RUN_STATE_PREEMPTED: RunState
RUN_STATE_FINISHED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_INTERRUPTED: RunState

class TaskSpec(_message.Message):
    __slots__ = ("name", "min_nodes", "max_nodes", "node_counts", "throughputs", "objective_values", "rescale_up_s", "rescale_down_s", "total_work_samples", "command", "reports_progress", "power_w", "zeus_job_id", "gpus_per_node", "constraint", "procs_per_node")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUTS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_VALUES_FIELD_NUMBER: _ClassVar[int]
    RESCALE_UP_S_FIELD_NUMBER: _ClassVar[int]
    RESCALE_DOWN_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_WORK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ZEUS_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PROCS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    min_nodes: int
    max_nodes: int
    node_counts: _containers.RepeatedScalarFieldContainer[int]
    throughputs: _containers.RepeatedScalarFieldContainer[float]
    objective_values: _containers.RepeatedScalarFieldContainer[float]
    rescale_up_s: float
    rescale_down_s: float
    total_work_samples: float
    command: _containers.RepeatedScalarFieldContainer[str]
    reports_progress: bool
    power_w: _containers.RepeatedScalarFieldContainer[float]
    zeus_job_id: str
    gpus_per_node: int
    constraint: _containers.RepeatedScalarFieldContainer[str]
    procs_per_node: int
    def __init__(self, name: _Optional[str] = ..., min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., node_counts: _Optional[_Iterable[int]] = ..., throughputs: _Optional[_Iterable[float]] = ..., objective_values: _Optional[_Iterable[float]] = ..., rescale_up_s: _Optional[float] = ..., rescale_down_s: _Optional[float] = ..., total_work_samples: _Optional[float] = ..., command: _Optional[_Iterable[str]] = ..., reports_progress: _Optional[bool] = ..., power_w: _Optional[_Iterable[float]] = ..., zeus_job_id: _Optional[str] = ..., gpus_per_node: _Optional[int] = ..., constraint: _Optional[_Iterable[str]] = ..., procs_per_node: _Optional[int] = ...) -> None: ...

class SubmitTaskRequest(_message.Message):
    __slots__ = ("spec", "submit_time", "request_id", "owner")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    submit_time: _timestamp_pb2.Timestamp
    request_id: str
    owner: str
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class SubmitTaskResponse(_message.Message):
    __slots__ = ("task", "decision")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    task: Task
    decision: _decision_pb2.Decision
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "spec", "owner", "state", "submit_time", "admit_time", "finish_time", "nodes", "work_done_samples", "rate_samples_per_s", "rescales", "preemptions", "launches", "last_run", "energy_j", "power_w", "model", "generation", "failed_runs", "failure_reason", "energy", "samples_redone", "failures_without_progress", "warnings", "work_reached_time", "started_generation", "generation_time")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    ADMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORK_DONE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    RATE_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    RESCALES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    LAST_RUN_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FAILED_RUNS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_REDONE_FIELD_NUMBER: _ClassVar[int]
    FAILURES_WITHOUT_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    WORK_REACHED_TIME_FIELD_NUMBER: _ClassVar[int]
    STARTED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TIME_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    spec: TaskSpec
    owner: str
    state: TaskState
    submit_time: _timestamp_pb2.Timestamp
    admit_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    nodes: _containers.RepeatedScalarFieldContainer[str]
    work_done_samples: float
    rate_samples_per_s: float
    rescales: int
    preemptions: int
    launches: int
    last_run: str
    energy_j: float
    power_w: float
    model: LearnedModel
    generation: int
    failed_runs: int
    failure_reason: str
    energy: TaskEnergy
    samples_redone: float
    failures_without_progress: int
    warnings: _containers.RepeatedCompositeFieldContainer[_decision_pb2.TaskWarning]
    work_reached_time: _timestamp_pb2.Timestamp
    started_generation: int
    generation_time: _timestamp_pb2.Timestamp
    def __init__(self, task_id: _Optional[str] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., owner: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., admit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nodes: _Optional[_Iterable[str]] = ..., work_done_samples: _Optional[float] = ..., rate_samples_per_s: _Optional[float] = ..., rescales: _Optional[int] = ..., preemptions: _Optional[int] = ..., launches: _Optional[int] = ..., last_run: _Optional[str] = ..., energy_j: _Optional[float] = ..., power_w: _Optional[float] = ..., model: _Optional[_Union[LearnedModel, _Mapping]] = ..., generation: _Optional[int] = ..., failed_runs: _Optional[int] = ..., failure_reason: _Optional[str] = ..., energy: _Optional[_Union[TaskEnergy, _Mapping]] = ..., samples_redone: _Optional[float] = ..., failures_without_progress: _Optional[int] = ..., warnings: _Optional[_Iterable[_Union[_decision_pb2.TaskWarning, _Mapping]]] = ..., work_reached_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_generation: _Optional[int] = ..., generation_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TaskEnergy(_message.Message):
    __slots__ = ("source", "joules", "samples_per_joule", "generations_reported", "last_generation", "last_generation_joules", "last_generation_ranks", "last_generation_world_size")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    JOULES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_JOULE_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_REPORTED_FIELD_NUMBER: _ClassVar[int]
    LAST_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LAST_GENERATION_JOULES_FIELD_NUMBER: _ClassVar[int]
    LAST_GENERATION_RANKS_FIELD_NUMBER: _ClassVar[int]
    LAST_GENERATION_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    source: str
    joules: float
    samples_per_joule: float
    generations_reported: int
    last_generation: int
    last_generation_joules: float
    last_generation_ranks: int
    last_generation_world_size: int
    def __init__(self, source: _Optional[str] = ..., joules: _Optional[float] = ..., samples_per_joule: _Optional[float] = ..., generations_reported: _Optional[int] = ..., last_generation: _Optional[int] = ..., last_generation_joules: _Optional[float] = ..., last_generation_ranks: _Optional[int] = ..., last_generation_world_size: _Optional[int] = ...) -> None: ...

class LearnedModel(_message.Message):
    __slots__ = ("measured", "rescale_up_s", "rescale_down_s", "curve_node_counts", "curve_throughputs", "has_report", "last_report_time", "last_samples_done", "last_energy_j", "curve_low", "curve_high", "measured_rescale_up_s", "measured_rescale_down_s", "measured_rescale_lost_s", "measured_rescales")
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    RESCALE_UP_S_FIELD_NUMBER: _ClassVar[int]
    RESCALE_DOWN_S_FIELD_NUMBER: _ClassVar[int]
    CURVE_NODE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    CURVE_THROUGHPUTS_FIELD_NUMBER: _ClassVar[int]
    HAS_REPORT_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLES_DONE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    CURVE_LOW_FIELD_NUMBER: _ClassVar[int]
    CURVE_HIGH_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RESCALE_UP_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RESCALE_DOWN_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RESCALE_LOST_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RESCALES_FIELD_NUMBER: _ClassVar[int]
    measured: _containers.RepeatedCompositeFieldContainer[MeasuredCount]
    rescale_up_s: float
    rescale_down_s: float
    curve_node_counts: _containers.RepeatedScalarFieldContainer[int]
    curve_throughputs: _containers.RepeatedScalarFieldContainer[float]
    has_report: bool
    last_report_time: _timestamp_pb2.Timestamp
    last_samples_done: float
    last_energy_j: float
    curve_low: _containers.RepeatedScalarFieldContainer[float]
    curve_high: _containers.RepeatedScalarFieldContainer[float]
    measured_rescale_up_s: float
    measured_rescale_down_s: float
    measured_rescale_lost_s: float
    measured_rescales: int
    def __init__(self, measured: _Optional[_Iterable[_Union[MeasuredCount, _Mapping]]] = ..., rescale_up_s: _Optional[float] = ..., rescale_down_s: _Optional[float] = ..., curve_node_counts: _Optional[_Iterable[int]] = ..., curve_throughputs: _Optional[_Iterable[float]] = ..., has_report: _Optional[bool] = ..., last_report_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_samples_done: _Optional[float] = ..., last_energy_j: _Optional[float] = ..., curve_low: _Optional[_Iterable[float]] = ..., curve_high: _Optional[_Iterable[float]] = ..., measured_rescale_up_s: _Optional[float] = ..., measured_rescale_down_s: _Optional[float] = ..., measured_rescale_lost_s: _Optional[float] = ..., measured_rescales: _Optional[int] = ...) -> None: ...

class MeasuredCount(_message.Message):
    __slots__ = ("nodes", "samples_per_s", "seconds", "power_w")
    NODES_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    samples_per_s: float
    seconds: float
    power_w: float
    def __init__(self, nodes: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., seconds: _Optional[float] = ..., power_w: _Optional[float] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("states", "owner", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[TaskState]
    owner: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[TaskState, str]]] = ..., owner: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "time", "request_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    time: _timestamp_pb2.Timestamp
    request_id: str
    def __init__(self, task_id: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task", "decision")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    task: Task
    decision: _decision_pb2.Decision
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ...) -> None: ...

class WatchPlacementsRequest(_message.Message):
    __slots__ = ("task_id", "after_revision")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    after_revision: int
    def __init__(self, task_id: _Optional[str] = ..., after_revision: _Optional[int] = ...) -> None: ...

class PlacementUpdate(_message.Message):
    __slots__ = ("revision", "time", "cause", "placements", "warnings")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    time: _timestamp_pb2.Timestamp
    cause: str
    placements: _containers.RepeatedCompositeFieldContainer[_decision_pb2.Placement]
    warnings: _containers.RepeatedCompositeFieldContainer[_decision_pb2.TaskWarning]
    def __init__(self, revision: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[str] = ..., placements: _Optional[_Iterable[_Union[_decision_pb2.Placement, _Mapping]]] = ..., warnings: _Optional[_Iterable[_Union[_decision_pb2.TaskWarning, _Mapping]]] = ...) -> None: ...

class TaskRunReport(_message.Message):
    __slots__ = ("task_id", "state", "time", "node", "job_id", "exit_code", "message", "request_id", "generation", "stop_ignored")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STOP_IGNORED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: RunState
    time: _timestamp_pb2.Timestamp
    node: str
    job_id: str
    exit_code: int
    message: str
    request_id: str
    generation: int
    stop_ignored: bool
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., node: _Optional[str] = ..., job_id: _Optional[str] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., request_id: _Optional[str] = ..., generation: _Optional[int] = ..., stop_ignored: _Optional[bool] = ...) -> None: ...

class ProgressReport(_message.Message):
    __slots__ = ("task_id", "time", "samples_done", "nodes", "energy_j")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DONE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    time: _timestamp_pb2.Timestamp
    samples_done: float
    nodes: int
    energy_j: float
    def __init__(self, task_id: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., samples_done: _Optional[float] = ..., nodes: _Optional[int] = ..., energy_j: _Optional[float] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("reports", "request_id")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[ProgressReport]
    request_id: str
    def __init__(self, reports: _Optional[_Iterable[_Union[ProgressReport, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("decision", "tasks")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    decision: _decision_pb2.Decision
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class ReportTaskRunResponse(_message.Message):
    __slots__ = ("task", "decision")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    task: Task
    decision: _decision_pb2.Decision
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ...) -> None: ...

class EnergyReport(_message.Message):
    __slots__ = ("task_id", "generation", "rank", "joules", "request_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    JOULES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    generation: int
    rank: int
    joules: float
    request_id: str
    def __init__(self, task_id: _Optional[str] = ..., generation: _Optional[int] = ..., rank: _Optional[int] = ..., joules: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportEnergyResponse(_message.Message):
    __slots__ = ("task", "decision")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    task: Task
    decision: _decision_pb2.Decision
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., decision: _Optional[_Union[_decision_pb2.Decision, _Mapping]] = ...) -> None: ...

from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PowerLimitSpec(_message.Message):
    __slots__ = ("min_power_limit_w", "max_power_limit_w", "step_w", "warmup_steps", "profile_steps", "selector", "eta_knob", "max_slowdown_factor")
    MIN_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    MAX_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    STEP_W_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_STEPS_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    ETA_KNOB_FIELD_NUMBER: _ClassVar[int]
    MAX_SLOWDOWN_FACTOR_FIELD_NUMBER: _ClassVar[int]
    min_power_limit_w: float
    max_power_limit_w: float
    step_w: float
    warmup_steps: int
    profile_steps: int
    selector: str
    eta_knob: float
    max_slowdown_factor: float
    def __init__(self, min_power_limit_w: _Optional[float] = ..., max_power_limit_w: _Optional[float] = ..., step_w: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., profile_steps: _Optional[int] = ..., selector: _Optional[str] = ..., eta_knob: _Optional[float] = ..., max_slowdown_factor: _Optional[float] = ...) -> None: ...

class BatchSizeJobSpec(_message.Message):
    __slots__ = ("job_id", "batch_sizes", "default_batch_size", "eta_knob", "beta_knob", "max_epochs", "target_metric", "higher_is_better", "max_power_w", "num_pruning_rounds", "window_size", "mab_prior_mean", "mab_prior_precision", "mab_num_explorations", "seed", "power", "suspended_trial_timeout_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ETA_KNOB_FIELD_NUMBER: _ClassVar[int]
    BETA_KNOB_FIELD_NUMBER: _ClassVar[int]
    MAX_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    TARGET_METRIC_FIELD_NUMBER: _ClassVar[int]
    HIGHER_IS_BETTER_FIELD_NUMBER: _ClassVar[int]
    MAX_POWER_W_FIELD_NUMBER: _ClassVar[int]
    NUM_PRUNING_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAB_PRIOR_MEAN_FIELD_NUMBER: _ClassVar[int]
    MAB_PRIOR_PRECISION_FIELD_NUMBER: _ClassVar[int]
    MAB_NUM_EXPLORATIONS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_TRIAL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    default_batch_size: int
    eta_knob: float
    beta_knob: float
    max_epochs: int
    target_metric: float
    higher_is_better: bool
    max_power_w: float
    num_pruning_rounds: int
    window_size: int
    mab_prior_mean: float
    mab_prior_precision: float
    mab_num_explorations: int
    seed: int
    power: PowerLimitSpec
    suspended_trial_timeout_s: float
    def __init__(self, job_id: _Optional[str] = ..., batch_sizes: _Optional[_Iterable[int]] = ..., default_batch_size: _Optional[int] = ..., eta_knob: _Optional[float] = ..., beta_knob: _Optional[float] = ..., max_epochs: _Optional[int] = ..., target_metric: _Optional[float] = ..., higher_is_better: _Optional[bool] = ..., max_power_w: _Optional[float] = ..., num_pruning_rounds: _Optional[int] = ..., window_size: _Optional[int] = ..., mab_prior_mean: _Optional[float] = ..., mab_prior_precision: _Optional[float] = ..., mab_num_explorations: _Optional[int] = ..., seed: _Optional[int] = ..., power: _Optional[_Union[PowerLimitSpec, _Mapping]] = ..., suspended_trial_timeout_s: _Optional[float] = ...) -> None: ...

class RegisterJobRequest(_message.Message):
    __slots__ = ("spec", "owner")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    spec: BatchSizeJobSpec
    owner: str
    def __init__(self, spec: _Optional[_Union[BatchSizeJobSpec, _Mapping]] = ..., owner: _Optional[str] = ...) -> None: ...

class ZeusTrial(_message.Message):
    __slots__ = ("trial_number", "batch_size", "status", "epochs", "time_s", "energy_j", "cost_j", "generation", "interruptions")
    TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    COST_J_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIONS_FIELD_NUMBER: _ClassVar[int]
    trial_number: int
    batch_size: int
    status: str
    epochs: int
    time_s: float
    energy_j: float
    cost_j: float
    generation: int
    interruptions: int
    def __init__(self, trial_number: _Optional[int] = ..., batch_size: _Optional[int] = ..., status: _Optional[str] = ..., epochs: _Optional[int] = ..., time_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., cost_j: _Optional[float] = ..., generation: _Optional[int] = ..., interruptions: _Optional[int] = ...) -> None: ...

class ZeusJob(_message.Message):
    __slots__ = ("spec", "phase", "best_batch_size", "min_cost_j", "trials", "state_json", "owner", "next_before_trial_number", "trial_count")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BEST_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_COST_J_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEFORE_TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    TRIAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    spec: BatchSizeJobSpec
    phase: str
    best_batch_size: int
    min_cost_j: float
    trials: _containers.RepeatedCompositeFieldContainer[ZeusTrial]
    state_json: str
    owner: str
    next_before_trial_number: int
    trial_count: int
    def __init__(self, spec: _Optional[_Union[BatchSizeJobSpec, _Mapping]] = ..., phase: _Optional[str] = ..., best_batch_size: _Optional[int] = ..., min_cost_j: _Optional[float] = ..., trials: _Optional[_Iterable[_Union[ZeusTrial, _Mapping]]] = ..., state_json: _Optional[str] = ..., owner: _Optional[str] = ..., next_before_trial_number: _Optional[int] = ..., trial_count: _Optional[int] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("job_id", "request_id", "generation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    generation: int
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("batch_size", "trial_number", "cost_bound_j", "exploration")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    COST_BOUND_J_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    trial_number: int
    cost_bound_j: float
    exploration: bool
    def __init__(self, batch_size: _Optional[int] = ..., trial_number: _Optional[int] = ..., cost_bound_j: _Optional[float] = ..., exploration: _Optional[bool] = ...) -> None: ...

class ReportEpochRequest(_message.Message):
    __slots__ = ("job_id", "trial_number", "epoch", "time_s", "energy_j", "metric", "batch_size", "generation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    trial_number: int
    epoch: int
    time_s: float
    energy_j: float
    metric: float
    batch_size: int
    generation: int
    def __init__(self, job_id: _Optional[str] = ..., trial_number: _Optional[int] = ..., epoch: _Optional[int] = ..., time_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., metric: _Optional[float] = ..., batch_size: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class TrialVerdict(_message.Message):
    __slots__ = ("stop", "converged", "cost_j", "message", "finished", "suspended")
    STOP_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    COST_J_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    stop: bool
    converged: bool
    cost_j: float
    message: str
    finished: bool
    suspended: bool
    def __init__(self, stop: _Optional[bool] = ..., converged: _Optional[bool] = ..., cost_j: _Optional[float] = ..., message: _Optional[str] = ..., finished: _Optional[bool] = ..., suspended: _Optional[bool] = ...) -> None: ...

class EndTrialRequest(_message.Message):
    __slots__ = ("job_id", "trial_number", "interrupted", "time_s", "energy_j", "generation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    trial_number: int
    interrupted: bool
    time_s: float
    energy_j: float
    generation: int
    def __init__(self, job_id: _Optional[str] = ..., trial_number: _Optional[int] = ..., interrupted: _Optional[bool] = ..., time_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., generation: _Optional[int] = ...) -> None: ...

class ResumeTrialRequest(_message.Message):
    __slots__ = ("job_id", "trial_number", "request_id", "generation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    trial_number: int
    request_id: str
    generation: int
    def __init__(self, job_id: _Optional[str] = ..., trial_number: _Optional[int] = ..., request_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class ResumedTrial(_message.Message):
    __slots__ = ("trial_number", "batch_size", "epochs", "time_s", "energy_j", "cost_j", "cost_bound_j", "exploration", "generation", "taken_over")
    TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    COST_J_FIELD_NUMBER: _ClassVar[int]
    COST_BOUND_J_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TAKEN_OVER_FIELD_NUMBER: _ClassVar[int]
    trial_number: int
    batch_size: int
    epochs: int
    time_s: float
    energy_j: float
    cost_j: float
    cost_bound_j: float
    exploration: bool
    generation: int
    taken_over: bool
    def __init__(self, trial_number: _Optional[int] = ..., batch_size: _Optional[int] = ..., epochs: _Optional[int] = ..., time_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., cost_j: _Optional[float] = ..., cost_bound_j: _Optional[float] = ..., exploration: _Optional[bool] = ..., generation: _Optional[int] = ..., taken_over: _Optional[bool] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "page_size", "before_trial_number")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_TRIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    page_size: int
    before_trial_number: int
    def __init__(self, job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., before_trial_number: _Optional[int] = ...) -> None: ...

class PowerPlanRequest(_message.Message):
    __slots__ = ("job_id", "batch_size")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    batch_size: int
    def __init__(self, job_id: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class PowerPlan(_message.Message):
    __slots__ = ("action", "power_limit_w", "warmup_steps", "profile_steps")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_STEPS_FIELD_NUMBER: _ClassVar[int]
    action: str
    power_limit_w: float
    warmup_steps: int
    profile_steps: int
    def __init__(self, action: _Optional[str] = ..., power_limit_w: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., profile_steps: _Optional[int] = ...) -> None: ...

class ReportWindowRequest(_message.Message):
    __slots__ = ("job_id", "batch_size", "power_limit_w", "time_s", "energy_j", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    batch_size: int
    power_limit_w: float
    time_s: float
    energy_j: float
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., batch_size: _Optional[int] = ..., power_limit_w: _Optional[float] = ..., time_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class InterruptWindowRequest(_message.Message):
    __slots__ = ("job_id", "batch_size", "power_limit_w", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    batch_size: int
    power_limit_w: float
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., batch_size: _Optional[int] = ..., power_limit_w: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ("job_id", "batch_size")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    batch_size: int
    def __init__(self, job_id: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class PowerMeasurement(_message.Message):
    __slots__ = ("power_limit_w", "time_s", "energy_j", "cost")
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    power_limit_w: float
    time_s: float
    energy_j: float
    cost: float
    def __init__(self, power_limit_w: _Optional[float] = ..., time_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., cost: _Optional[float] = ...) -> None: ...

class PowerProfile(_message.Message):
    __slots__ = ("job_id", "batch_size", "done", "chosen_power_limit_w", "measurements")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    batch_size: int
    done: bool
    chosen_power_limit_w: float
    measurements: _containers.RepeatedCompositeFieldContainer[PowerMeasurement]
    def __init__(self, job_id: _Optional[str] = ..., batch_size: _Optional[int] = ..., done: _Optional[bool] = ..., chosen_power_limit_w: _Optional[float] = ..., measurements: _Optional[_Iterable[_Union[PowerMeasurement, _Mapping]]] = ...) -> None: ...

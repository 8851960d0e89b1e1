from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_WAITING_FOR_FLEET: _ClassVar[Phase]
    PHASE_TRAINING: _ClassVar[Phase]
    PHASE_FINISHED: _ClassVar[Phase]

class PlanAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_ACTION_UNSPECIFIED: _ClassVar[PlanAction]
    PLAN_ACTION_WAIT: _ClassVar[PlanAction]
    PLAN_ACTION_TRAIN: _ClassVar[PlanAction]
    PLAN_ACTION_FINISHED: _ClassVar[PlanAction]
PHASE_UNSPECIFIED: Phase
PHASE_WAITING_FOR_FLEET: Phase
PHASE_TRAINING: Phase
PHASE_FINISHED: Phase
PLAN_ACTION_UNSPECIFIED: PlanAction
PLAN_ACTION_WAIT: PlanAction
PLAN_ACTION_TRAIN: PlanAction
PLAN_ACTION_FINISHED: PlanAction

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorGroup(_message.Message):
    __slots__ = ("name", "tensors")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    def __init__(self, name: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ...) -> None: ...

class InlineTensor(_message.Message):
    __slots__ = ("spec", "data")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    spec: TensorSpec
    data: bytes
    def __init__(self, spec: _Optional[_Union[TensorSpec, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Descriptor(_message.Message):
    __slots__ = ("mean", "var", "num_frames")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    VAR_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    mean: _containers.RepeatedScalarFieldContainer[float]
    var: _containers.RepeatedScalarFieldContainer[float]
    num_frames: int
    def __init__(self, mean: _Optional[_Iterable[float]] = ..., var: _Optional[_Iterable[float]] = ..., num_frames: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("robot_id", "num_samples", "labels", "model_card")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CARD_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    num_samples: int
    labels: _containers.ScalarMap[str, str]
    model_card: str
    def __init__(self, robot_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., model_card: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("phase", "member", "model_card", "summaries")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    MODEL_CARD_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    member: bool
    model_card: str
    summaries: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., member: _Optional[bool] = ..., model_card: _Optional[str] = ..., summaries: _Optional[_Iterable[str]] = ...) -> None: ...

class UploadDescriptorRequest(_message.Message):
    __slots__ = ("robot_id", "descriptor", "summaries")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    descriptor: Descriptor
    summaries: _containers.RepeatedCompositeFieldContainer[InlineTensor]
    def __init__(self, robot_id: _Optional[str] = ..., descriptor: _Optional[_Union[Descriptor, _Mapping]] = ..., summaries: _Optional[_Iterable[_Union[InlineTensor, _Mapping]]] = ...) -> None: ...

class UploadDescriptorReply(_message.Message):
    __slots__ = ("phase", "member", "clusters")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    member: bool
    clusters: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., member: _Optional[bool] = ..., clusters: _Optional[_Iterable[int]] = ...) -> None: ...

class GetRoundPlanRequest(_message.Message):
    __slots__ = ("robot_id", "after_round", "wait_s")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    after_round: int
    wait_s: float
    def __init__(self, robot_id: _Optional[str] = ..., after_round: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class RoundPlan(_message.Message):
    __slots__ = ("action", "phase", "round", "num_rounds", "deadline_unix", "model_bytes", "reason")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    action: PlanAction
    phase: Phase
    round: int
    num_rounds: int
    deadline_unix: float
    model_bytes: int
    reason: str
    def __init__(self, action: _Optional[_Union[PlanAction, str]] = ..., phase: _Optional[_Union[Phase, str]] = ..., round: _Optional[int] = ..., num_rounds: _Optional[int] = ..., deadline_unix: _Optional[float] = ..., model_bytes: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DownloadModelRequest(_message.Message):
    __slots__ = ("robot_id", "round", "latest", "initial")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    round: int
    latest: bool
    initial: bool
    def __init__(self, robot_id: _Optional[str] = ..., round: _Optional[int] = ..., latest: _Optional[bool] = ..., initial: _Optional[bool] = ...) -> None: ...

class TrainRecipe(_message.Message):
    __slots__ = ("local_steps", "batch_size", "optimizer", "lr", "weight_decay", "momentum", "grad_clip", "schedule", "warmup_steps", "final_lr_fraction", "image_height", "image_width", "flip", "seed", "variance_focus")
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    FINAL_LR_FRACTION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    FLIP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_FOCUS_FIELD_NUMBER: _ClassVar[int]
    local_steps: int
    batch_size: int
    optimizer: str
    lr: float
    weight_decay: float
    momentum: float
    grad_clip: float
    schedule: str
    warmup_steps: int
    final_lr_fraction: float
    image_height: int
    image_width: int
    flip: bool
    seed: int
    variance_focus: float
    def __init__(self, local_steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., optimizer: _Optional[str] = ..., lr: _Optional[float] = ..., weight_decay: _Optional[float] = ..., momentum: _Optional[float] = ..., grad_clip: _Optional[float] = ..., schedule: _Optional[str] = ..., warmup_steps: _Optional[int] = ..., final_lr_fraction: _Optional[float] = ..., image_height: _Optional[int] = ..., image_width: _Optional[int] = ..., flip: _Optional[bool] = ..., seed: _Optional[int] = ..., variance_focus: _Optional[float] = ...) -> None: ...

class DownloadHeader(_message.Message):
    __slots__ = ("round", "hook", "hook_params", "state", "hook_state", "total_bytes", "recipe", "model_card")
    class HookParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    HOOK_FIELD_NUMBER: _ClassVar[int]
    HOOK_PARAMS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOOK_STATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_CARD_FIELD_NUMBER: _ClassVar[int]
    round: int
    hook: str
    hook_params: _containers.ScalarMap[str, float]
    state: TensorGroup
    hook_state: _containers.RepeatedCompositeFieldContainer[TensorGroup]
    total_bytes: int
    recipe: TrainRecipe
    model_card: str
    def __init__(self, round: _Optional[int] = ..., hook: _Optional[str] = ..., hook_params: _Optional[_Mapping[str, float]] = ..., state: _Optional[_Union[TensorGroup, _Mapping]] = ..., hook_state: _Optional[_Iterable[_Union[TensorGroup, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., recipe: _Optional[_Union[TrainRecipe, _Mapping]] = ..., model_card: _Optional[str] = ...) -> None: ...

class DownloadMessage(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: DownloadHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[DownloadHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("robot_id", "round", "num_samples", "num_steps", "metrics", "state", "extra", "total_bytes")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    round: int
    num_samples: int
    num_steps: int
    metrics: _containers.ScalarMap[str, float]
    state: TensorGroup
    extra: _containers.RepeatedCompositeFieldContainer[TensorGroup]
    total_bytes: int
    def __init__(self, robot_id: _Optional[str] = ..., round: _Optional[int] = ..., num_samples: _Optional[int] = ..., num_steps: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., state: _Optional[_Union[TensorGroup, _Mapping]] = ..., extra: _Optional[_Iterable[_Union[TensorGroup, _Mapping]]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class UploadMessage(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadUpdateReply(_message.Message):
    __slots__ = ("round", "accepted", "selected")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    round: int
    accepted: int
    selected: int
    def __init__(self, round: _Optional[int] = ..., accepted: _Optional[int] = ..., selected: _Optional[int] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("descriptor", "include_model", "labels", "summaries")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MODEL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    descriptor: Descriptor
    include_model: bool
    labels: _containers.ScalarMap[str, str]
    summaries: _containers.RepeatedCompositeFieldContainer[InlineTensor]
    def __init__(self, descriptor: _Optional[_Union[Descriptor, _Mapping]] = ..., include_model: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., summaries: _Optional[_Iterable[_Union[InlineTensor, _Mapping]]] = ...) -> None: ...

class RouteHeader(_message.Message):
    __slots__ = ("clusters", "weights", "state", "total_bytes")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedScalarFieldContainer[int]
    weights: _containers.RepeatedScalarFieldContainer[float]
    state: TensorGroup
    total_bytes: int
    def __init__(self, clusters: _Optional[_Iterable[int]] = ..., weights: _Optional[_Iterable[float]] = ..., state: _Optional[_Union[TensorGroup, _Mapping]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class RouteMessage(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: RouteHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[RouteHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class GetClusterMapRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("index", "members")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterMap(_message.Message):
    __slots__ = ("clustered", "strategy", "tau", "clusters")
    CLUSTERED_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clustered: bool
    strategy: str
    tau: float
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clustered: _Optional[bool] = ..., strategy: _Optional[str] = ..., tau: _Optional[float] = ..., clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class GetFleetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RobotStatus(_message.Message):
    __slots__ = ("robot_id", "labels", "num_samples", "has_descriptor", "member", "clusters", "selected", "reported", "updates_accepted", "last_seen_s")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HAS_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    labels: _containers.ScalarMap[str, str]
    num_samples: int
    has_descriptor: bool
    member: bool
    clusters: _containers.RepeatedScalarFieldContainer[int]
    selected: bool
    reported: bool
    updates_accepted: int
    last_seen_s: float
    def __init__(self, robot_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., num_samples: _Optional[int] = ..., has_descriptor: _Optional[bool] = ..., member: _Optional[bool] = ..., clusters: _Optional[_Iterable[int]] = ..., selected: _Optional[bool] = ..., reported: _Optional[bool] = ..., updates_accepted: _Optional[int] = ..., last_seen_s: _Optional[float] = ...) -> None: ...

class ClusterComposition(_message.Message):
    __slots__ = ("index", "members", "counts", "label")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    index: int
    members: _containers.RepeatedScalarFieldContainer[str]
    counts: _containers.ScalarMap[str, int]
    label: str
    def __init__(self, index: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., counts: _Optional[_Mapping[str, int]] = ..., label: _Optional[str] = ...) -> None: ...

class CoMemberShares(_message.Message):
    __slots__ = ("platform", "environment", "both", "alone")
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    BOTH_FIELD_NUMBER: _ClassVar[int]
    ALONE_FIELD_NUMBER: _ClassVar[int]
    platform: float
    environment: float
    both: float
    alone: int
    def __init__(self, platform: _Optional[float] = ..., environment: _Optional[float] = ..., both: _Optional[float] = ..., alone: _Optional[int] = ...) -> None: ...

class RoundSummary(_message.Message):
    __slots__ = ("round", "selected", "accepted", "duration_s", "closed_by")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    CLOSED_BY_FIELD_NUMBER: _ClassVar[int]
    round: int
    selected: int
    accepted: int
    duration_s: float
    closed_by: str
    def __init__(self, round: _Optional[int] = ..., selected: _Optional[int] = ..., accepted: _Optional[int] = ..., duration_s: _Optional[float] = ..., closed_by: _Optional[str] = ...) -> None: ...

class FleetStatus(_message.Message):
    __slots__ = ("phase", "strategy", "round", "num_rounds", "min_robots", "deadline_unix", "quorum", "robots", "history", "model_card", "clusters", "co_members")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    MIN_ROBOTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    ROBOTS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MODEL_CARD_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    CO_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    strategy: str
    round: int
    num_rounds: int
    min_robots: int
    deadline_unix: float
    quorum: int
    robots: _containers.RepeatedCompositeFieldContainer[RobotStatus]
    history: _containers.RepeatedCompositeFieldContainer[RoundSummary]
    model_card: str
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterComposition]
    co_members: CoMemberShares
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., strategy: _Optional[str] = ..., round: _Optional[int] = ..., num_rounds: _Optional[int] = ..., min_robots: _Optional[int] = ..., deadline_unix: _Optional[float] = ..., quorum: _Optional[int] = ..., robots: _Optional[_Iterable[_Union[RobotStatus, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[RoundSummary, _Mapping]]] = ..., model_card: _Optional[str] = ..., clusters: _Optional[_Iterable[_Union[ClusterComposition, _Mapping]]] = ..., co_members: _Optional[_Union[CoMemberShares, _Mapping]] = ...) -> None: ...

class ReleaseRoundRequest(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class ReleaseRoundReply(_message.Message):
    __slots__ = ("round", "released")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    round: int
    released: bool
    def __init__(self, round: _Optional[int] = ..., released: _Optional[bool] = ...) -> None: ...

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QuorumMember(_message.Message):
    __slots__ = ("replica_id", "address", "store_address", "step", "world_size", "shrink_only", "data", "commit_failures", "step_time_ms", "checkpoint_metadata", "unreachable", "heal", "integrity", "busy_ms")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHRINK_ONLY_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_METADATA_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    HEAL_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    BUSY_MS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    store_address: str
    step: int
    world_size: int
    shrink_only: bool
    data: str
    commit_failures: int
    step_time_ms: float
    checkpoint_metadata: _containers.RepeatedScalarFieldContainer[str]
    unreachable: _containers.RepeatedScalarFieldContainer[str]
    heal: HealReport
    integrity: IntegrityReport
    busy_ms: float
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., store_address: _Optional[str] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., shrink_only: _Optional[bool] = ..., data: _Optional[str] = ..., commit_failures: _Optional[int] = ..., step_time_ms: _Optional[float] = ..., checkpoint_metadata: _Optional[_Iterable[str]] = ..., unreachable: _Optional[_Iterable[str]] = ..., heal: _Optional[_Union[HealReport, _Mapping]] = ..., integrity: _Optional[_Union[IntegrityReport, _Mapping]] = ..., busy_ms: _Optional[float] = ...) -> None: ...

class HealReport(_message.Message):
    __slots__ = ("step", "bytes_received", "transfer_s")
    STEP_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    bytes_received: int
    transfer_s: float
    def __init__(self, step: _Optional[int] = ..., bytes_received: _Optional[int] = ..., transfer_s: _Optional[float] = ...) -> None: ...

class IntegrityReport(_message.Message):
    __slots__ = ("step", "kind", "tensors")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[IntegrityReport.Kind]
        DIVERGED: _ClassVar[IntegrityReport.Kind]
        HEAL_SOURCE_DIVERGED: _ClassVar[IntegrityReport.Kind]
        NO_MAJORITY: _ClassVar[IntegrityReport.Kind]
        GRADIENT_DIVERGED: _ClassVar[IntegrityReport.Kind]
    KIND_UNSPECIFIED: IntegrityReport.Kind
    DIVERGED: IntegrityReport.Kind
    HEAL_SOURCE_DIVERGED: IntegrityReport.Kind
    NO_MAJORITY: IntegrityReport.Kind
    GRADIENT_DIVERGED: IntegrityReport.Kind
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    step: int
    kind: IntegrityReport.Kind
    tensors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step: _Optional[int] = ..., kind: _Optional[_Union[IntegrityReport.Kind, str]] = ..., tensors: _Optional[_Iterable[str]] = ...) -> None: ...

class Quorum(_message.Message):
    __slots__ = ("quorum_id", "epoch", "participants", "created_unix_ms")
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    quorum_id: int
    epoch: str
    participants: _containers.RepeatedCompositeFieldContainer[QuorumMember]
    created_unix_ms: int
    def __init__(self, quorum_id: _Optional[int] = ..., epoch: _Optional[str] = ..., participants: _Optional[_Iterable[_Union[QuorumMember, _Mapping]]] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...

class LighthouseQuorumRequest(_message.Message):
    __slots__ = ("requester", "timeout_ms")
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    requester: QuorumMember
    timeout_ms: int
    def __init__(self, requester: _Optional[_Union[QuorumMember, _Mapping]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class LighthouseQuorumResponse(_message.Message):
    __slots__ = ("quorum", "lease_id")
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    quorum: Quorum
    lease_id: int
    def __init__(self, quorum: _Optional[_Union[Quorum, _Mapping]] = ..., lease_id: _Optional[int] = ...) -> None: ...

class LighthouseHeartbeatRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class LighthouseHeartbeatResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    def __init__(self, epoch: _Optional[str] = ...) -> None: ...

class LivenessPing(_message.Message):
    __slots__ = ("replica_id", "leaving", "step", "step_time_ms", "heal", "busy_ms", "floor_wanted")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    HEAL_FIELD_NUMBER: _ClassVar[int]
    BUSY_MS_FIELD_NUMBER: _ClassVar[int]
    FLOOR_WANTED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    leaving: bool
    step: int
    step_time_ms: float
    heal: HealReport
    busy_ms: float
    floor_wanted: int
    def __init__(self, replica_id: _Optional[str] = ..., leaving: _Optional[bool] = ..., step: _Optional[int] = ..., step_time_ms: _Optional[float] = ..., heal: _Optional[_Union[HealReport, _Mapping]] = ..., busy_ms: _Optional[float] = ..., floor_wanted: _Optional[int] = ...) -> None: ...

class FailureNotice(_message.Message):
    __slots__ = ("epoch", "quorum_id", "dead_replica_ids", "reason", "detected_unix_ms", "step")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    DEAD_REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETECTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    quorum_id: int
    dead_replica_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    detected_unix_ms: int
    step: int
    def __init__(self, epoch: _Optional[str] = ..., quorum_id: _Optional[int] = ..., dead_replica_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., detected_unix_ms: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class LeaseRecall(_message.Message):
    __slots__ = ("lease_id", "quorum_id", "absent_replica_ids", "abort_from_step", "valid_below_step")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    ABSENT_REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    VALID_BELOW_STEP_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    quorum_id: int
    absent_replica_ids: _containers.RepeatedScalarFieldContainer[str]
    abort_from_step: int
    valid_below_step: int
    def __init__(self, lease_id: _Optional[int] = ..., quorum_id: _Optional[int] = ..., absent_replica_ids: _Optional[_Iterable[str]] = ..., abort_from_step: _Optional[int] = ..., valid_below_step: _Optional[int] = ...) -> None: ...

class LeaseFloor(_message.Message):
    __slots__ = ("lease_id", "step")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    step: int
    def __init__(self, lease_id: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class QuorumWait(_message.Message):
    __slots__ = ("kind", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    reason: str
    def __init__(self, kind: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LivenessEvent(_message.Message):
    __slots__ = ("epoch", "failure", "recall", "floor", "heartbeat_timeout_ms", "waiting")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    failure: FailureNotice
    recall: LeaseRecall
    floor: LeaseFloor
    heartbeat_timeout_ms: int
    waiting: QuorumWait
    def __init__(self, epoch: _Optional[str] = ..., failure: _Optional[_Union[FailureNotice, _Mapping]] = ..., recall: _Optional[_Union[LeaseRecall, _Mapping]] = ..., floor: _Optional[_Union[LeaseFloor, _Mapping]] = ..., heartbeat_timeout_ms: _Optional[int] = ..., waiting: _Optional[_Union[QuorumWait, _Mapping]] = ...) -> None: ...

class ManagerQuorumRequest(_message.Message):
    __slots__ = ("group_rank", "step", "checkpoint_metadata", "shrink_only", "init_sync", "commit_failures", "step_time_ms", "heal", "integrity", "busy_ms", "collectives_done")
    GROUP_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_METADATA_FIELD_NUMBER: _ClassVar[int]
    SHRINK_ONLY_FIELD_NUMBER: _ClassVar[int]
    INIT_SYNC_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    HEAL_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    BUSY_MS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_DONE_FIELD_NUMBER: _ClassVar[int]
    group_rank: int
    step: int
    checkpoint_metadata: str
    shrink_only: bool
    init_sync: bool
    commit_failures: int
    step_time_ms: float
    heal: HealReport
    integrity: IntegrityReport
    busy_ms: float
    collectives_done: CollectivesDone
    def __init__(self, group_rank: _Optional[int] = ..., step: _Optional[int] = ..., checkpoint_metadata: _Optional[str] = ..., shrink_only: _Optional[bool] = ..., init_sync: _Optional[bool] = ..., commit_failures: _Optional[int] = ..., step_time_ms: _Optional[float] = ..., heal: _Optional[_Union[HealReport, _Mapping]] = ..., integrity: _Optional[_Union[IntegrityReport, _Mapping]] = ..., busy_ms: _Optional[float] = ..., collectives_done: _Optional[_Union[CollectivesDone, _Mapping]] = ...) -> None: ...

class CollectivesDone(_message.Message):
    __slots__ = ("epoch", "quorum_id", "step")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    quorum_id: int
    step: int
    def __init__(self, epoch: _Optional[str] = ..., quorum_id: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class ManagerQuorumResponse(_message.Message):
    __slots__ = ("quorum_id", "epoch", "recover_src_manager_address", "recover_src_replica_rank", "recover_dst_replica_ranks", "store_address", "max_step", "max_replica_rank", "max_world_size", "replica_rank", "replica_world_size", "heal", "commit_failures", "replica_ids", "recover_src_checkpoint_metadata")
    QUORUM_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECOVER_SRC_MANAGER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RECOVER_SRC_REPLICA_RANK_FIELD_NUMBER: _ClassVar[int]
    RECOVER_DST_REPLICA_RANKS_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_RANK_FIELD_NUMBER: _ClassVar[int]
    REPLICA_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    HEAL_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    RECOVER_SRC_CHECKPOINT_METADATA_FIELD_NUMBER: _ClassVar[int]
    quorum_id: int
    epoch: str
    recover_src_manager_address: str
    recover_src_replica_rank: int
    recover_dst_replica_ranks: _containers.RepeatedScalarFieldContainer[int]
    store_address: str
    max_step: int
    max_replica_rank: int
    max_world_size: int
    replica_rank: int
    replica_world_size: int
    heal: bool
    commit_failures: int
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    recover_src_checkpoint_metadata: str
    def __init__(self, quorum_id: _Optional[int] = ..., epoch: _Optional[str] = ..., recover_src_manager_address: _Optional[str] = ..., recover_src_replica_rank: _Optional[int] = ..., recover_dst_replica_ranks: _Optional[_Iterable[int]] = ..., store_address: _Optional[str] = ..., max_step: _Optional[int] = ..., max_replica_rank: _Optional[int] = ..., max_world_size: _Optional[int] = ..., replica_rank: _Optional[int] = ..., replica_world_size: _Optional[int] = ..., heal: _Optional[bool] = ..., commit_failures: _Optional[int] = ..., replica_ids: _Optional[_Iterable[str]] = ..., recover_src_checkpoint_metadata: _Optional[str] = ...) -> None: ...

class CheckpointMetadataRequest(_message.Message):
    __slots__ = ("rank",)
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    def __init__(self, rank: _Optional[int] = ...) -> None: ...

class CheckpointMetadataResponse(_message.Message):
    __slots__ = ("checkpoint_metadata",)
    CHECKPOINT_METADATA_FIELD_NUMBER: _ClassVar[int]
    checkpoint_metadata: str
    def __init__(self, checkpoint_metadata: _Optional[str] = ...) -> None: ...

class ShouldCommitRequest(_message.Message):
    __slots__ = ("should_commit", "group_rank", "step")
    SHOULD_COMMIT_FIELD_NUMBER: _ClassVar[int]
    GROUP_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    should_commit: bool
    group_rank: int
    step: int
    def __init__(self, should_commit: _Optional[bool] = ..., group_rank: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class ShouldCommitResponse(_message.Message):
    __slots__ = ("should_commit",)
    SHOULD_COMMIT_FIELD_NUMBER: _ClassVar[int]
    should_commit: bool
    def __init__(self, should_commit: _Optional[bool] = ...) -> None: ...

class KillRequest(_message.Message):
    __slots__ = ("msg",)
    MSG_FIELD_NUMBER: _ClassVar[int]
    msg: str
    def __init__(self, msg: _Optional[str] = ...) -> None: ...

class KillResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchFailuresRequest(_message.Message):
    __slots__ = ("group_rank",)
    GROUP_RANK_FIELD_NUMBER: _ClassVar[int]
    group_rank: int
    def __init__(self, group_rank: _Optional[int] = ...) -> None: ...

"""The lighthouse: torch-free quorum coordination for torchft_pg (see lighthouse/README.md).

Public API::

    LighthouseServer   one per job: decides quorums, detects dead replicas, serves /status
    LighthouseClient   quorum(...) and heartbeat(...) against a lighthouse
    ManagerServer      one per replica group (group rank 0): gathers local ranks, commit vote
    ManagerClient      every rank: quorum(...), should_commit(...), subscribe_failures(...)
    Quorum, QuorumMember, QuorumResult, FailureNotice, LeaseRecall   frozen value types
    Timestamp          Quorum.created: a UTC datetime with torchft's seconds/nanos
"""

from lighthouse.client import FailureSubscription, LighthouseClient, ManagerClient
from lighthouse.clock import Clock, FakeClock, MonotonicClock
from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    ManagerUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from lighthouse.manager_server import ManagerServer
from lighthouse.quorum import Decision, QuorumConfig, QuorumState, decide_quorum
from lighthouse.ranks import compute_quorum_result
from lighthouse.server import LighthouseServer
from lighthouse.types import (
    FailureNotice,
    LeaseRecall,
    Quorum,
    QuorumMember,
    QuorumResult,
    Timestamp,
)

__all__ = [
    "Clock",
    "Decision",
    "FailureNotice",
    "FailureSubscription",
    "FakeClock",
    "FaultToleranceError",
    "LeaseRecall",
    "LighthouseClient",
    "LighthouseServer",
    "LighthouseUnavailableError",
    "ManagerClient",
    "ManagerServer",
    "ManagerUnavailableError",
    "MonotonicClock",
    "Quorum",
    "QuorumConfig",
    "QuorumMember",
    "QuorumRejectedError",
    "QuorumResult",
    "QuorumState",
    "QuorumTimeoutError",
    "Timestamp",
    "compute_quorum_result",
    "decide_quorum",
]

"""The lighthouse: torch-free quorum coordination for torchft_pg (see lighthouse/README.md).

Public API::

    LighthouseServer   one per job: decides quorums, detects dead replicas, serves /status
    LighthouseClient   quorum(...) and heartbeat(...) against a lighthouse
    ManagerServer      one per replica group (group rank 0): gathers local ranks, commit vote
    ManagerClient      every rank: quorum(request), should_commit(...), subscribe_failures(...)
    LocalManagerClient group rank 0: the same methods, served in-process by its ManagerServer
    ManagerClientProtocol   what both manager clients implement (and the Manager needs)
    ManagerQuorumRequest    one rank's quorum request (frozen, keyword-only)
    Quorum, QuorumMember, QuorumResult, FailureNotice, LeaseRecall   frozen value types
    Timestamp          Quorum.created: a UTC datetime with torchft's seconds/nanos

Layout: ``lighthouse.coordinator`` is the job's lighthouse, ``lighthouse.replica``
the per-replica-group side; the modules at the top (types, wire, validate,
errors, clock, services, ...) are shared by both.
"""

# First: gRPC reads its engine settings once, when first imported (see _grpc_env).
from lighthouse import _grpc_env  # noqa: F401  (isort: skip)
from lighthouse.clock import Clock, FakeClock, MonotonicClock
from lighthouse.coordinator.client import LighthouseClient
from lighthouse.coordinator.quorum import Decision, QuorumConfig, QuorumState, decide_quorum
from lighthouse.coordinator.server import LighthouseServer
from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    ManagerUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from lighthouse.replica.client import FailureSubscription, ManagerClient
from lighthouse.replica.interface import FailureSubscriptionProtocol, ManagerClientProtocol
from lighthouse.replica.local import LocalFailureSubscription, LocalManagerClient
from lighthouse.replica.ranks import compute_quorum_result
from lighthouse.replica.server import ManagerServer
from lighthouse.types import (
    FailureNotice,
    LeaseRecall,
    ManagerQuorumRequest,
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
    "FailureSubscriptionProtocol",
    "FakeClock",
    "FaultToleranceError",
    "LeaseRecall",
    "LighthouseClient",
    "LighthouseServer",
    "LighthouseUnavailableError",
    "LocalFailureSubscription",
    "LocalManagerClient",
    "ManagerClient",
    "ManagerClientProtocol",
    "ManagerQuorumRequest",
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

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

Importing this package has no side effects (no environment set, no threads)
and imports nothing else: each public name is imported on first use (PEP 562
``__getattr__``), so ``import lighthouse.errors`` (what torchft_pg's process
groups import) never loads gRPC; ``from lighthouse import LighthouseServer``
still works. gRPC's engine settings are applied by the modules that use gRPC,
before they import it (see ``lighthouse/_grpc_env.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports these
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

# Public name -> the module that defines it. Every name of `__all__` is here.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("Clock", "FakeClock", "MonotonicClock"), "lighthouse.clock"),
    "LighthouseClient": "lighthouse.coordinator.client",
    **dict.fromkeys(
        ("Decision", "QuorumConfig", "QuorumState", "decide_quorum"),
        "lighthouse.coordinator.quorum",
    ),
    "LighthouseServer": "lighthouse.coordinator.server",
    **dict.fromkeys(
        (
            "FaultToleranceError",
            "LighthouseUnavailableError",
            "ManagerUnavailableError",
            "QuorumRejectedError",
            "QuorumTimeoutError",
        ),
        "lighthouse.errors",
    ),
    **dict.fromkeys(("FailureSubscription", "ManagerClient"), "lighthouse.replica.client"),
    **dict.fromkeys(
        ("FailureSubscriptionProtocol", "ManagerClientProtocol"), "lighthouse.replica.interface"
    ),
    **dict.fromkeys(("LocalFailureSubscription", "LocalManagerClient"), "lighthouse.replica.local"),
    "compute_quorum_result": "lighthouse.replica.ranks",
    "ManagerServer": "lighthouse.replica.server",
    **dict.fromkeys(
        (
            "FailureNotice",
            "LeaseRecall",
            "ManagerQuorumRequest",
            "Quorum",
            "QuorumMember",
            "QuorumResult",
            "Timestamp",
        ),
        "lighthouse.types",
    ),
}


def __getattr__(name: str) -> Any:
    """Import public name `name` on first use and cache it in this module's namespace."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

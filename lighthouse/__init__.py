"""The lighthouse: torch-free quorum coordination for torchft_pg (see README)."""

from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    ManagerUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)

__all__ = [
    "FaultToleranceError",
    "LighthouseUnavailableError",
    "ManagerUnavailableError",
    "QuorumRejectedError",
    "QuorumTimeoutError",
]

"""torchft_pg's exception tree (extends `lighthouse.errors`).

    FaultToleranceError (RuntimeError)                   lighthouse.errors
    ├── LighthouseUnavailableError, ManagerUnavailableError,
    │   QuorumTimeoutError (+TimeoutError), QuorumRejectedError
    ├── NotConfiguredError                               collective before configure()
    ├── ProcessGroupError                                a collective or configure failed
    │   ├── ProcessGroupAbortedError                     the PG was aborted / shut down / its child died
    │   └── ProcessGroupTimeoutError (+TimeoutError)     an operation outlived the PG timeout
    ├── RecoveryError                                    healing from a peer failed
    └── CommitFailedError                                too many consecutive failed commits

Bad arguments are ValueError/TypeError and name the value and what was expected.
"""

from __future__ import annotations

from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    ManagerUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)

__all__ = [
    "CommitFailedError",
    "FaultToleranceError",
    "LighthouseUnavailableError",
    "ManagerUnavailableError",
    "NotConfiguredError",
    "ProcessGroupAbortedError",
    "ProcessGroupError",
    "ProcessGroupTimeoutError",
    "QuorumRejectedError",
    "QuorumTimeoutError",
    "RecoveryError",
]


class NotConfiguredError(FaultToleranceError):
    """A collective was called before `configure(store_addr, rank, world_size)`."""


class ProcessGroupError(FaultToleranceError):
    """A collective or a configure failed (peer gone, connection reset, …)."""


class ProcessGroupAbortedError(ProcessGroupError):
    """The process group was aborted or shut down, or its backend child died."""


class ProcessGroupTimeoutError(ProcessGroupError, TimeoutError):
    """An operation did not finish within the process group's timeout."""


class RecoveryError(FaultToleranceError):
    """Receiving or applying a peer's state dict failed."""


class CommitFailedError(FaultToleranceError):
    """More consecutive commits failed than `max_retries` allows."""

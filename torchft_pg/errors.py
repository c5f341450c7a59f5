"""torchft_pg's exception tree (extends the control plane's root in `lighthouse.errors`).

    FaultToleranceError (RuntimeError)                   lighthouse.errors (the same classes)
    ├── LighthouseUnavailableError, ManagerUnavailableError,
    │   QuorumTimeoutError (+TimeoutError), QuorumRejectedError
    ├── NotConfiguredError                               collective before configure()
    ├── ProcessGroupError                                a collective or configure failed
    │   ├── ProcessGroupAbortedError                     the PG was aborted / shut down / its child died
    │   └── ProcessGroupTimeoutError (+TimeoutError)     an operation outlived the PG timeout
    ├── RecoveryError                                    healing from a peer failed
    ├── CommitFailedError                                too many consecutive failed commits
    └── ExceptionWithTraceback                           what Manager.errored() returns

Process groups (a Baby child process included) import this module, so the
root comes from `lighthouse.errors`, the one lighthouse module a process group
may load: it imports only the standard library, and the package's `__init__`
imports nothing until a public name is used, so gRPC stays unloaded.

Bad arguments are ValueError/TypeError and name the value and what was expected.
"""

from __future__ import annotations

import traceback

from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    ManagerUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)

__all__ = [
    "CommitFailedError",
    "ExceptionWithTraceback",
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
    "StateDivergedError",
    "is_timeout",
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


class StateDivergedError(FaultToleranceError):
    """This rank's state (or the state it healed from, or with
    `integrity_check_gradients` the averaged gradient it received) differs from
    the majority of the replica groups', or the groups differ with no majority:
    silent data corruption caught by the Manager's integrity check."""


class CommitFailedError(FaultToleranceError):
    """More consecutive commits failed than `max_retries` allows."""


class ExceptionWithTraceback(FaultToleranceError):
    """A step's failure as `Manager.errored()` reports it (torchft's shape).

    `original_exception` is the error itself (test its type there);
    `stack_trace` is where it was reported from, or raised if it carries a
    traceback.
    """

    def __init__(self, e: Exception) -> None:
        self.original_exception = e
        if e.__traceback__ is not None:
            self.stack_trace = "".join(traceback.format_exception(e))
        else:
            self.stack_trace = "".join(traceback.format_stack(limit=16)[:-1])
        super().__init__(f"{type(e).__name__}: {e}")


def is_timeout(e: BaseException) -> bool:
    """Whether `e` reports a timeout: a `TimeoutError`, or a backend error
    (c10d's DistStoreError, Gloo's) whose message says it timed out."""
    text = str(e).lower()
    return isinstance(e, TimeoutError) or "timeout" in text or "timed out" in text

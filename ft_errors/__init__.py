"""The root of the exception tree shared by `lighthouse` and `torchft_pg`.

    FaultToleranceError (RuntimeError)         any operational failure
    ├── LighthouseUnavailableError             lighthouse not reachable after bounded retries
    ├── ManagerUnavailableError                a replica group's manager server not reachable
    ├── QuorumTimeoutError (+TimeoutError)     no quorum containing us formed before the deadline
    └── QuorumRejectedError                    the server refused the request (bad step, stale vote…)

This package imports nothing (no torch, no grpc, no lighthouse, no torchft_pg),
so both sides can root their errors here without loading the other:
`lighthouse.errors` re-exports these classes for the control plane, and
`torchft_pg.errors` extends the tree with process-group and recovery errors
without importing the lighthouse package (a process group, e.g. a Baby child
process, never loads gRPC). Import these names from `lighthouse.errors` or
`torchft_pg.errors`; they are the same class objects.

Bad arguments are plain ValueError/TypeError, never part of this tree.
"""

from __future__ import annotations

__all__ = [
    "FaultToleranceError",
    "LighthouseUnavailableError",
    "ManagerUnavailableError",
    "QuorumRejectedError",
    "QuorumTimeoutError",
]


class FaultToleranceError(RuntimeError):
    """Base of every operational failure raised by torchft_pg and the lighthouse."""


class LighthouseUnavailableError(FaultToleranceError):
    """The lighthouse at the named address did not answer within the connect timeout."""


class ManagerUnavailableError(FaultToleranceError):
    """A replica group's manager server did not answer within the connect timeout."""


class QuorumTimeoutError(FaultToleranceError, TimeoutError):
    """No quorum containing this replica formed before the caller's deadline."""


class QuorumRejectedError(FaultToleranceError):
    """The lighthouse or manager server refused a request and said why."""

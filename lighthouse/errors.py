"""The root of torchft_pg's exception tree (torch-free, so the lighthouse can use it).

    FaultToleranceError (RuntimeError)         any operational failure
    ├── LighthouseUnavailableError             lighthouse not reachable after bounded retries
    ├── ManagerUnavailableError                a replica group's manager server not reachable
    ├── QuorumTimeoutError (+TimeoutError)     no quorum containing us formed before the deadline
    └── QuorumRejectedError                    the server refused the request (bad step, stale vote…)

`torchft_pg.errors` extends this tree with process-group and recovery errors.
Bad arguments are plain ValueError/TypeError, never part of this tree.
"""

from __future__ import annotations


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

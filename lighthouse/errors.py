"""The control plane's errors: the root of torchft_pg's exception tree.

    FaultToleranceError (RuntimeError)         any operational failure
    ├── LighthouseUnavailableError             lighthouse not reachable after bounded retries
    ├── ManagerUnavailableError                a replica group's manager server not reachable
    ├── QuorumTimeoutError (+TimeoutError)     no quorum containing us formed before the deadline
    └── QuorumRejectedError                    the server refused the request (bad step, stale vote…)

This module imports nothing but the standard library (no torch, no grpc, no
other lighthouse module), and ``lighthouse/__init__`` imports its public names
only on first use, so ``import lighthouse.errors`` loads that lazy ``__init__``
and this file, nothing else.
`torchft_pg.errors` roots its tree here: a process group (a Baby child process
included) imports it and never loads gRPC (tests/unit/test_import_directions.py).
Import these names from `lighthouse.errors` or `torchft_pg.errors`; they are
the same class objects.

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

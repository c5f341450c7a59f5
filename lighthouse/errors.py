"""The control plane's errors (torch-free): the root of torchft_pg's exception tree.

    FaultToleranceError (RuntimeError)         any operational failure
    ├── LighthouseUnavailableError             lighthouse not reachable after bounded retries
    ├── ManagerUnavailableError                a replica group's manager server not reachable
    ├── QuorumTimeoutError (+TimeoutError)     no quorum containing us formed before the deadline
    └── QuorumRejectedError                    the server refused the request (bad step, stale vote…)

The classes are defined in the dependency-free `ft_errors` package and
re-exported here (the same class objects), so `torchft_pg.errors` can extend
the tree without importing this package, whose `__init__` loads gRPC.
Bad arguments are plain ValueError/TypeError, never part of this tree.
"""

from __future__ import annotations

from ft_errors import (
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

"""The control plane's servers and clients under torchft's module path (``torchft.coordination``).

For building fault-tolerance schemes of one's own on the lighthouse: the
lighthouse and manager servers, their clients and the quorum types. They live
in the torch-free `lighthouse` package; this module only names them where
torchft users look.
"""

from __future__ import annotations

from lighthouse import (
    LighthouseClient,
    LighthouseServer,
    ManagerClient,
    ManagerServer,
    Quorum,
    QuorumMember,
)

__all__ = [
    "LighthouseClient",
    "LighthouseServer",
    "ManagerClient",
    "ManagerServer",
    "Quorum",
    "QuorumMember",
]

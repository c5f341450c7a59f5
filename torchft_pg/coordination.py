"""The control plane's servers and clients under torchft's module path (``torchft.coordination``).

For building fault-tolerance schemes of one's own on the lighthouse: the
lighthouse and manager servers, their clients and the quorum types. They live
in the torch-free `lighthouse` package; this module only names them where
torchft users look. torchft's compiled module (``torchft._torchft``, in 0.1
``torchft.torchft``) resolves to this one through the compat distribution.
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

# torchft 0.1's name for the lighthouse server (its ``torchft.torchft.Lighthouse``).
Lighthouse = LighthouseServer

__all__ = [
    "Lighthouse",
    "LighthouseClient",
    "LighthouseServer",
    "ManagerClient",
    "ManagerServer",
    "Quorum",
    "QuorumMember",
]

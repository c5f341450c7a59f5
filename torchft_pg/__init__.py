"""torchft_pg: fault-tolerant, reconfigurable process groups for PyTorch.

Importing this package has no side effects (no threads, sockets or env reads).
"""

from torchft_pg.errors import (
    FaultToleranceError,
    NotConfiguredError,
    ProcessGroupAbortedError,
    ProcessGroupError,
    ProcessGroupTimeoutError,
)
from torchft_pg.process_group import (
    ErrorSwallowingProcessGroupWrapper,
    ManagedProcessGroup,
    ProcessGroup,
    ProcessGroupBaby,
    ProcessGroupBabyGloo,
    ProcessGroupBabyNCCL,
    ProcessGroupDummy,
    ProcessGroupGloo,
    ProcessGroupNCCL,
    ProcessGroupWrapper,
    create_store_client,
)

__all__ = [
    "ErrorSwallowingProcessGroupWrapper",
    "FaultToleranceError",
    "ManagedProcessGroup",
    "NotConfiguredError",
    "ProcessGroup",
    "ProcessGroupAbortedError",
    "ProcessGroupBaby",
    "ProcessGroupBabyGloo",
    "ProcessGroupBabyNCCL",
    "ProcessGroupDummy",
    "ProcessGroupError",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupTimeoutError",
    "ProcessGroupWrapper",
    "create_store_client",
]

"""torchft_pg: fault-tolerant, reconfigurable process groups for PyTorch.

Importing this package has no side effects (no threads, sockets or env reads).
"""

from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.errors import (
    FaultToleranceError,
    NotConfiguredError,
    ProcessGroupAbortedError,
    ProcessGroupError,
    ProcessGroupTimeoutError,
)
from torchft_pg.manager import Manager, WorldSizeMode
from torchft_pg.optim import OptimizerWrapper
from torchft_pg.optim import OptimizerWrapper as Optimizer  # torchft's name
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
    extend_device_mesh,
    ft_init_device_mesh,
)

__all__ = [
    "DistributedDataParallel",
    "ErrorSwallowingProcessGroupWrapper",
    "FaultToleranceError",
    "ManagedProcessGroup",
    "Manager",
    "NotConfiguredError",
    "Optimizer",
    "OptimizerWrapper",
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
    "WorldSizeMode",
    "create_store_client",
    "extend_device_mesh",
    "ft_init_device_mesh",
]

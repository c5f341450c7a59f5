"""torchft_pg: fault-tolerant, reconfigurable process groups for PyTorch.

Importing this package has no side effects (no threads, sockets or env reads)
and imports nothing else: each public name is imported on first use (PEP 562
``__getattr__``). A Baby process group's child process imports
``torchft_pg.process_group`` and must not pay for the Manager, grpc and the
lighthouse servers at start-up; ``from torchft_pg import Manager`` still works.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports these
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

    # Importable from the root, as from torchft's, but not in `__all__` (see _LAZY).
    from torchft_pg.process_group import ProcessGroupBabyXCCL as ProcessGroupBabyXCCL
    from torchft_pg.process_group import ProcessGroupXCCL as ProcessGroupXCCL

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
    "ProcessGroupBabyXCCL",
    "ProcessGroupDummy",
    "ProcessGroupError",
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupTimeoutError",
    "ProcessGroupWrapper",
    "ProcessGroupXCCL",
    "WorldSizeMode",
    "create_store_client",
    "extend_device_mesh",
    "ft_init_device_mesh",
]

# Public name -> (module, attribute in it). Every name of `__all__` is here.
_LAZY: dict[str, tuple[str, str]] = {
    "DistributedDataParallel": ("torchft_pg.ddp", "DistributedDataParallel"),
    "FaultToleranceError": ("torchft_pg.errors", "FaultToleranceError"),
    "NotConfiguredError": ("torchft_pg.errors", "NotConfiguredError"),
    "ProcessGroupAbortedError": ("torchft_pg.errors", "ProcessGroupAbortedError"),
    "ProcessGroupError": ("torchft_pg.errors", "ProcessGroupError"),
    "ProcessGroupTimeoutError": ("torchft_pg.errors", "ProcessGroupTimeoutError"),
    "Manager": ("torchft_pg.manager", "Manager"),
    "WorldSizeMode": ("torchft_pg.manager", "WorldSizeMode"),
    "Optimizer": ("torchft_pg.optim", "OptimizerWrapper"),
    "OptimizerWrapper": ("torchft_pg.optim", "OptimizerWrapper"),
    **{
        name: ("torchft_pg.process_group", name)
        for name in (
            "ErrorSwallowingProcessGroupWrapper",
            "ManagedProcessGroup",
            "ProcessGroup",
            "ProcessGroupBaby",
            "ProcessGroupBabyGloo",
            "ProcessGroupBabyNCCL",
            "ProcessGroupBabyXCCL",
            "ProcessGroupDummy",
            "ProcessGroupGloo",
            "ProcessGroupNCCL",
            "ProcessGroupWrapper",
            "ProcessGroupXCCL",
            "create_store_client",
            "extend_device_mesh",
            "ft_init_device_mesh",
        )
    },
}


def __getattr__(name: str) -> Any:
    """Import public name `name` on first use and cache it in this module's namespace."""
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = target
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

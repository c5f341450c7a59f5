"""Reconfigurable c10d process groups (torchft's process-group API).

Every class is a `torch.distributed.ProcessGroup` you can hand to DDP/FSDP or
to `torch.distributed` calls, and re-form at run time with
``configure(store_addr, rank, world_size)``.
"""

from typing import Any

from torchft_pg.process_group.baby import (
    ProcessGroupBaby,
    ProcessGroupBabyGloo,
    ProcessGroupBabyNCCL,
    ProcessGroupBabyXCCL,
)
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.process_group.dummy import ProcessGroupDummy
from torchft_pg.process_group.failure_wrappers import (
    ErrorSwallowingProcessGroupWrapper,
    FakeProcessGroupWrapper,
    ManagedProcessGroup,
)
from torchft_pg.process_group.gloo import ProcessGroupGloo
from torchft_pg.process_group.nccl import ProcessGroupNCCL
from torchft_pg.process_group.reconfigurable import ProcessGroupWrapper
from torchft_pg.process_group.xccl import ProcessGroupXCCL
from torchft_pg.store import create_store_client

# torchft's private names for our Works, which its tests import from here.
from torchft_pg.work import CompletedWork as _DummyWork  # noqa: F401
from torchft_pg.work import ErrorSwallowingWork as _ErrorSwallowingWork  # noqa: F401
from torchft_pg.work import ManagedWork as _ManagedWork  # noqa: F401

__all__ = [
    "ErrorSwallowingProcessGroupWrapper",
    "FakeProcessGroupWrapper",
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
]


def __getattr__(name: str) -> Any:
    # torchft exports its device-mesh helpers from here too. They build on this
    # package (`torchft_pg.device_mesh` imports it), so they are imported on first
    # use: an eager import made `import torchft_pg.device_mesh`, run first in a
    # process, fail on the cycle.
    if name in ("extend_device_mesh", "ft_init_device_mesh"):
        from torchft_pg import device_mesh

        return getattr(device_mesh, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

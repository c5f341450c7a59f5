"""`DistributedDataParallel(manager, module)`: torch DDP whose gradients go through the Manager.

Torch DDP gets a `ProcessGroupDummy` (its start-up broadcast costs nothing: the
Manager syncs weights by healing) and a comm hook that averages each bucket
over the live participants with `manager.allreduce`. A failed reduction leaves
the bucket as it is; the step is then rejected by the commit vote, never
raised into backward().
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations
# against the real GradBucket and Future classes.

from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future
from torch.nn import parallel

from torchft_pg.manager import Manager
from torchft_pg.process_group.dummy import ProcessGroupDummy

__all__ = ["DistributedDataParallel", "PureDistributedDataParallel"]


class DistributedDataParallel(parallel.DistributedDataParallel):
    """Torch DDP across replica groups, fault tolerant through `manager`.

    `find_unused_parameters=True` by default: it keeps the reducer from
    re-ordering its buckets after the first step, which would make a freshly
    healed replica's buckets differ from its peers'.
    """

    def __init__(self, manager: Manager, module: torch.nn.Module, **kwargs: Any) -> None:
        kwargs.setdefault("find_unused_parameters", True)
        super().__init__(module, process_group=ProcessGroupDummy(0, 1), **kwargs)
        self._manager = manager
        self.register_comm_hook(manager, _manager_comm_hook)


def _manager_comm_hook(manager: Manager, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    return manager.allreduce(bucket.buffer()).get_future()


class PureDistributedDataParallel(torch.nn.Module):
    """Data parallel without torch's reducer: one `manager.allreduce` per gradient,
    issued as each parameter's gradient is accumulated (torchft's class of the
    same name).

    Simple and slow (one collective per parameter, no bucketing); prefer
    `DistributedDataParallel`. Nothing waits on the reductions during backward:
    `manager.should_commit()` waits for every one of them before it votes, so
    the optimizer step (through `OptimizerWrapper`) sees averaged gradients.
    """

    def __init__(self, manager: Manager, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

        def reduce_grad(param: torch.Tensor) -> None:
            if param.grad is not None:
                manager.allreduce(param.grad)

        for param in module.parameters():
            param.register_post_accumulate_grad_hook(reduce_grad)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

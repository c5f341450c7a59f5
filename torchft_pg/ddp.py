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

    `reduce_dtype` (e.g. ``torch.float64`` for float32 gradients): each bucket
    is reduced in that dtype and cast back. A float32 sum depends on the order
    the backend adds in, and that order changes with every new quorum; the sum
    of a few float32 values in float64 is exact in any order (short of values
    2**29 apart), so every replica, and a replay of the committed history,
    gets the bit-identical average. It costs twice the bytes on the wire.
    """

    def __init__(
        self,
        manager: Manager,
        module: torch.nn.Module,
        *,
        reduce_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        if reduce_dtype is not None and not reduce_dtype.is_floating_point:
            raise ValueError(f"reduce_dtype must be a floating dtype, got {reduce_dtype}")
        kwargs.setdefault("find_unused_parameters", True)
        super().__init__(module, process_group=ProcessGroupDummy(0, 1), **kwargs)
        self._manager = manager
        self.register_comm_hook(_HookState(manager, reduce_dtype), _manager_comm_hook)


class _HookState:
    def __init__(self, manager: Manager, reduce_dtype: torch.dtype | None) -> None:
        self.manager = manager
        self.reduce_dtype = reduce_dtype


def _manager_comm_hook(state: _HookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    buffer = bucket.buffer()
    if state.reduce_dtype is None or state.reduce_dtype == buffer.dtype:
        return state.manager.allreduce(buffer).get_future()
    wide = buffer.to(state.reduce_dtype)
    # A failed reduction hands back `wide` untouched: casting it back is lossless.
    return state.manager.allreduce(wide).get_future().then(lambda fut: buffer.copy_(fut.value()))


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
            param.register_post_accumulate_grad_hook(reduce_grad)  # type: ignore[no-untyped-call]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

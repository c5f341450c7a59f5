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
from torch.distributed import Work
from torch.futures import Future
from torch.nn import parallel

from torchft_pg import _torch_internals
from torchft_pg.manager import Manager
from torchft_pg.process_group.dummy import ProcessGroupDummy
from torchft_pg.work import CompletedWork, ManagedWork

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

    Each bucket is reduced in place (no private copy, one pass over the
    gradients fewer per step). An op that did not succeed (a failure notice
    or its deadline abandoned it) may still write into its bucket later, from
    the retired backend: before the next forward, such a step's buckets are
    retired with their reducer and a new reducer (new buckets, same layout
    for the same parameters) takes over, so a late write lands in memory no
    later step uses. With ``gradient_as_bucket_view=True`` the buckets are
    the gradients themselves, which outlive the reducer: those are reduced
    through a private copy instead.
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
        # a bucket of the gradients themselves outlives the reducer: it needs the copy
        self._hook_state = _HookState(
            manager, reduce_dtype, in_place=not self.gradient_as_bucket_view
        )
        self.register_comm_hook(self._hook_state, _manager_comm_hook)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Torch DDP's forward, on new buckets if an op of the last step did not succeed."""
        if self._hook_state.reducing_in_place_failed():
            self._replace_reducer()
        return super().forward(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _replace_reducer(self) -> None:
        """A new reducer (and buckets) built as torch DDP built the first; the old
        buckets are left to the ops that may still write into them."""
        _torch_internals.rebuild_reducer(self, self._hook_state, _manager_comm_hook)


class _HookState:
    """What the comm hook needs: the manager, the reduce dtype, and the works of
    buckets reduced in place since the last forward."""

    def __init__(self, manager: Manager, reduce_dtype: torch.dtype | None, in_place: bool) -> None:
        self.manager = manager
        self.reduce_dtype = reduce_dtype
        self.in_place = in_place
        self.in_place_works: list[Work] = []

    def reducing_in_place_failed(self) -> bool:
        """Whether an op that reduced a bucket in place since the last call did not
        succeed (and so may still write into its bucket); forgets them."""
        works, self.in_place_works = self.in_place_works, []
        return any(
            not (isinstance(work, ManagedWork) and work.succeeded)
            for work in works
            if not isinstance(work, CompletedWork)  # skipped: no op ran
        )


def _manager_comm_hook(state: _HookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    buffer = bucket.buffer()
    manager = state.manager
    if state.reduce_dtype is None or state.reduce_dtype == buffer.dtype:
        if not state.in_place:
            return manager.allreduce(buffer).get_future()
        work = manager.allreduce(buffer, private_copy=False)
        state.in_place_works.append(work)
        return work.get_future()
    # `wide` is new every step and nobody else holds it: an abandoned op may write
    # into it at will, so the backend may reduce it in place
    wide = buffer.to(state.reduce_dtype)
    # A failed reduction hands back `wide`: casting it back is lossless (and a
    # failed step's gradients are never applied: its vote is no).
    future = manager.allreduce(wide, private_copy=False).get_future()
    return future.then(lambda fut: buffer.copy_(fut.value()))


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

"""`ProcessGroupDummy`: a real, do-nothing group for tests and for DDP's start-up sync.

Collectives complete at once: reductions and broadcasts leave tensors as they
are, gathers and scatters copy the input into every output slot. `configure`
only counts its calls. torchft_pg's DDP wrapper hands this to torch DDP so the
reducer's initial broadcast costs nothing; the Manager syncs weights instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C._distributed_c10d import Work

from torchft_pg.process_group.base import ProcessGroup, validate_configure_args
from torchft_pg.work import completed_work

__all__ = ["ProcessGroupDummy"]


class ProcessGroupDummy(ProcessGroup):
    """A group of `world` members that does nothing; this member is `rank`."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        super().__init__()
        validate_configure_args("localhost:1/dummy", rank, world)
        self._rank = rank
        self._world = world
        self.configure_count = 0

    def configure(
        self, store_addr: str, rank: int, world_size: int, replica_id: str | None = None
    ) -> None:
        validate_configure_args(store_addr, rank, world_size)
        self.configure_count += 1

    def size(self) -> int:
        return self._world

    def rank(self) -> int:
        return self._rank

    def getBackendName(self) -> str:
        return "torchft-dummy"

    def set_timeout(self, timeout: Any) -> None:
        pass

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensors)

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensor: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for outs, inp in zip(output_tensors, input_tensor, strict=True):
            for o in outs:
                o.copy_(inp)
        return completed_work(output_tensors)

    def allgather_into_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for o, i in zip(output_tensors, input_tensors, strict=True):
            o.copy_(i.reshape(1, -1).expand(o.numel() // max(i.numel(), 1), -1).reshape(o.shape))
        return completed_work(output_tensors)

    def alltoall_base(
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        output_buffer.copy_(input_buffer)
        return completed_work(output_buffer)

    def barrier(self, opts: Any = None) -> Work:
        return completed_work(None)

    def broadcast(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensor_list)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> Work:
        return completed_work(tensors)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> Work:
        return completed_work(tensors)

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> Work:
        for o, ins in zip(output_tensors, input_tensors, strict=True):
            o.copy_(ins[self._rank])
        return completed_work(output_tensors)

    def reduce_scatter_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for o, i in zip(output_tensors, input_tensors, strict=True):
            o.copy_(
                i.reshape(-1)[self._rank * o.numel() : (self._rank + 1) * o.numel()].reshape(
                    o.shape
                )
            )
        return completed_work(output_tensors)

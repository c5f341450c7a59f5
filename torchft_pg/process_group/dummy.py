"""`ProcessGroupDummy`: a fake group of any rank and size, for tests and single-process runs.

Every collective completes at once, as if every member held what this member
holds (torchft's semantics): reductions and broadcasts leave tensors as they
are, gathers put this member's input in every slot, scatters and
reduce-scatters hand this member its own chunk, all-to-alls copy input to
output. `configure` only counts its calls. torchft_pg's DDP wrapper hands this
to torch DDP so the reducer's initial broadcast costs nothing.

It also works as the default group (register a backend whose factory returns
``ProcessGroupDummy(rank, world_size)`` and pass it to ``init_process_group``),
and c10d's ``new_group`` sub-groups of it are Dummy groups too: the role a
"fake gang" plays in single-process tests of distributed code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import Work

from torchft_pg.process_group.base import (
    ProcessGroup,
    own_global_rank,
    parse_configure_args,
    validate_rank_and_size,
)
from torchft_pg.work import completed_work

__all__ = ["ProcessGroupDummy"]


class ProcessGroupDummy(ProcessGroup):
    """A group of `world` members that does nothing; this member is `rank`."""

    C10D_BACKEND = "torchft-dummy"

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        super().__init__()
        validate_rank_and_size(rank, world)
        self._rank = rank
        self._world = world
        self.configure_count = 0

    def configure(self, *args: Any, **kwargs: Any) -> None:
        """Count the call. The arguments are checked but the address is never used.

        Accepts both ``configure(store_addr, rank, world_size)`` and torchft's
        ``configure(store_addr, replica_id, rank, world_size, ...)``.
        """
        parse_configure_args(args, kwargs, check_address=False)
        self.configure_count += 1

    def size(self) -> int:
        return self._world

    def rank(self) -> int:
        return self._rank

    def global_ranks(self) -> tuple[int, ...]:
        """Group ranks, except that this member is this process's default-group rank.

        A fake group has no other processes to agree with, so ``dist.get_rank(group=pg)``
        answers this member's rank whatever the default group numbers it.
        """
        ranks = list(range(self._world))
        mine = own_global_rank()
        if mine >= 0 and mine != self._rank:
            if mine in ranks:
                ranks[mine] = self._rank
            ranks[self._rank] = mine
        return tuple(ranks)

    def getBackendName(self) -> str:
        return "torchft-dummy"

    def set_timeout(self, timeout: Any) -> None:
        pass

    # -- reductions and broadcasts: unchanged ----------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensors)

    def broadcast(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:
        return completed_work(tensor_list)

    # -- gathers: this member's input in every slot ------------------------------------
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

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        input_list: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for outs in output_lists:
            for o, inp in zip(outs, input_list, strict=True):
                o.copy_(inp)
        return completed_work(output_lists)

    def gather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        return self.allgather(output_tensors, input_tensors * len(output_tensors))

    def all_gather_single(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, opts: Any = None
    ) -> Work:
        _fill_repeated(output_tensor, input_tensor)
        return completed_work(output_tensor)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for o, i in zip(output_tensors, input_tensors, strict=True):
            _fill_repeated(o, i)
        return completed_work(output_tensors)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # -- scatters: this member's own chunk ---------------------------------------------
    def scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> Work:
        if input_tensors:  # only the root passes inputs
            for o, ins in zip(output_tensors, input_tensors, strict=True):
                o.copy_(ins[self._rank])
        return completed_work(output_tensors)

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> Work:
        for o, ins in zip(output_tensors, input_tensors, strict=True):
            o.copy_(ins[self._rank])
        return completed_work(output_tensors)

    def reduce_scatter_single(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, opts: Any = None
    ) -> Work:
        n = output_tensor.numel()
        chunk = input_tensor.reshape(-1)[self._rank * n : (self._rank + 1) * n]
        output_tensor.copy_(chunk.reshape(output_tensor.shape))
        return completed_work(output_tensor)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for o, i in zip(output_tensors, input_tensors, strict=True):
            self.reduce_scatter_single(o, i)
        return completed_work(output_tensors)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- all-to-all: input copied to output ------------------------------------------
    def alltoall_base(
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        if output_buffer.shape == input_buffer.shape:
            output_buffer.copy_(input_buffer)
        else:  # uneven splits: every member sends what this member sends to itself
            start = sum(input_split_sizes[: self._rank])
            mine = input_buffer[start : start + input_split_sizes[self._rank]]
            offset = 0
            for size in output_split_sizes:
                output_buffer[offset : offset + size].copy_(mine[:size])
                offset += size
        return completed_work(output_buffer)

    all_to_all_single = alltoall_base

    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Work:
        for o, i in zip(output_tensors, input_tensors, strict=True):
            o.copy_(i)
        return completed_work(output_tensors)

    # -- point to point and barriers -------------------------------------------------
    def barrier(self, opts: Any = None) -> Work:
        return completed_work(None)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        pass

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> Work:
        return completed_work(tensors)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> Work:
        return completed_work(tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        raise NotImplementedError(
            "recv_anysource on ProcessGroupDummy: a fake group has no sender to name; "
            "pass src= (or group_src=) to recv"
        )


def _fill_repeated(output: torch.Tensor, inp: torch.Tensor) -> None:
    """Fill `output` with copies of `inp` (an all-gather where every member is this one)."""
    flat = inp.reshape(1, -1)
    copies = output.numel() // max(inp.numel(), 1)
    output.copy_(flat.expand(copies, -1).reshape(output.shape))

"""`ForwardingProcessGroup`: every c10d collective, checked, then handed to one hook.

Each collective method validates its arguments (`_checks`: list lengths,
ranks, split sizes, so a mistake fails here with a message naming the
argument rather than deep in a backend), fills in default c10d options, and
calls ``_run(op, outputs, *args)``, the single path by which a collective
reaches a backend. Subclasses decide what running means (`ProcessGroupWrapper`:
the inner backend `configure` built; a Baby group: a message to its child), and
wrappers that change behaviour override `_run` alone.

Two c10d quirks are handled here once, for every subclass: DDP's allgather
sized by c10d's construction-time world size of 1 (`_allgather_c10d_sized`),
and the list form of alltoall run as one ``alltoall_base`` for backends that
lack it (`_ALLTOALL_THROUGH_ONE_BUFFER`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Work,
)

from torchft_pg._torch_internals import AllgatherOptions
from torchft_pg.process_group import _checks
from torchft_pg.process_group._staging import alltoall_through_one_buffer, staged_work
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.work import completed_work

__all__ = ["ForwardingProcessGroup"]


class ForwardingProcessGroup(ProcessGroup):
    """A ProcessGroup whose collectives validate their arguments and call `_run`.

    Subclasses implement `_run` (and `size`/`rank`, which the checks use).
    """

    # Run the list form of alltoall as one alltoall_base (Gloo lacks it on some builds).
    _ALLTOALL_THROUGH_ONE_BUFFER = False

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        """Run collective `op` (its c10d method name) on `args`; `outputs` is what
        the returned work's future yields."""
        raise NotImplementedError(f"{type(self).__name__} must implement _run")

    def allreduce(
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | ReduceOp | None = None
    ) -> Work:
        _checks.tensor_list("allreduce", "tensors", tensors)
        options = AllreduceOptions() if opts is None else _checks.allreduce_options(opts)
        return self._run("allreduce", tensors, tensors, options)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> Work:
        _checks.tensor_list("allreduce_coalesced", "tensors", tensors)
        return self._run(
            "allreduce_coalesced", tensors, tensors, opts or AllreduceCoalescedOptions()
        )

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensor: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        world = self.size()
        _checks.tensor_list("allgather", "input_tensor", input_tensor)
        options = opts or AllgatherOptions()
        if (
            world > 1
            and len(output_tensors) == len(input_tensor)
            and all(isinstance(o, list) and len(o) == 1 for o in output_tensors)
        ):
            return self._allgather_c10d_sized(output_tensors, input_tensor, options)
        _checks.nested_lists(
            "allgather", "output_tensors", output_tensors, len(input_tensor), world
        )
        return self._run("allgather", output_tensors, output_tensors, input_tensor, options)

    def _allgather_c10d_sized(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensor: list[torch.Tensor],
        opts: AllgatherOptions,
    ) -> Work:
        """An allgather sized by c10d's fixed size of 1 (DDP's parameter check).

        C++ callers size the output by this object's construction-time size (1).
        Gather from every member, then put the first entry that differs from
        ours (else ours) in the single slot, so the caller's consistency check
        still sees a mismatch with any peer.
        """
        world = self.size()
        full = [[torch.empty_like(t) for _ in range(world)] for t in input_tensor]
        self._run("allgather", full, full, input_tensor, opts).wait()
        for out, gathered, mine in zip(output_tensors, full, input_tensor, strict=True):
            differing = [g for g in gathered if g.shape != mine.shape or not torch.equal(g, mine)]
            out[0].copy_(differing[0] if differing else mine)
        return completed_work(output_tensors)

    def allgather_into_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        _checks.tensor_list("allgather_into_tensor_coalesced", "input_tensors", input_tensors)
        _checks.tensor_list(
            "allgather_into_tensor_coalesced", "output_tensors", output_tensors, len(input_tensors)
        )
        return self._run(
            "allgather_into_tensor_coalesced",
            output_tensors,
            output_tensors,
            input_tensors,
            opts or AllgatherOptions(),
        )

    def alltoall_base(
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        world = self.size()
        _checks.split_sizes(
            "alltoall_base", "output_split_sizes", output_split_sizes, output_buffer, world
        )
        _checks.split_sizes(
            "alltoall_base", "input_split_sizes", input_split_sizes, input_buffer, world
        )
        return self._run(
            "alltoall_base",
            output_buffer,
            output_buffer,
            input_buffer,
            output_split_sizes,
            input_split_sizes,
            opts or AllToAllOptions(),
        )

    def barrier(self, opts: BarrierOptions | None = None) -> Work:
        return self._run("barrier", None, opts or BarrierOptions())

    def broadcast(
        self, tensor_list: list[torch.Tensor], opts: BroadcastOptions | None = None
    ) -> Work:
        _checks.tensor_list("broadcast", "tensor_list", tensor_list)
        options = opts or BroadcastOptions()
        _checks.root_rank("broadcast", options.rootRank, self.size())
        return self._run("broadcast", tensor_list, tensor_list, options)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> Work:
        _checks.tensor_list("send", "tensors", tensors)
        _checks.peer_rank("send", "dst_rank", dst_rank, self.rank(), self.size())
        return self._run("send", tensors, tensors, dst_rank, tag)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> Work:
        _checks.tensor_list("recv", "tensors", tensors)
        _checks.peer_rank("recv", "src_rank", src_rank, self.rank(), self.size())
        return self._run("recv", tensors, tensors, src_rank, tag)

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> Work:
        _checks.tensor_list("reduce_scatter", "output_tensors", output_tensors)
        _checks.nested_lists(
            "reduce_scatter", "input_tensors", input_tensors, len(output_tensors), self.size()
        )
        return self._run(
            "reduce_scatter",
            output_tensors,
            output_tensors,
            input_tensors,
            opts or ReduceScatterOptions(),
        )

    def reduce_scatter_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> Work:
        _checks.tensor_list("reduce_scatter_tensor_coalesced", "input_tensors", input_tensors)
        _checks.tensor_list(
            "reduce_scatter_tensor_coalesced", "output_tensors", output_tensors, len(input_tensors)
        )
        return self._run(
            "reduce_scatter_tensor_coalesced",
            output_tensors,
            output_tensors,
            input_tensors,
            opts or ReduceScatterOptions(),
        )

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions | None = None) -> Work:
        _checks.tensor_list("reduce", "tensors", tensors)
        options = opts or ReduceOptions()
        _checks.root_rank("reduce", options.rootRank, self.size())
        return self._run("reduce", tensors, tensors, options)

    def gather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: GatherOptions | None = None,
    ) -> Work:
        options = opts or GatherOptions()
        _checks.root_rank("gather", options.rootRank, self.size())
        _checks.tensor_list("gather", "input_tensors", input_tensors, 1)
        if self.rank() == options.rootRank:
            _checks.nested_lists("gather", "output_tensors", output_tensors, 1, self.size())
        return self._run("gather", output_tensors, output_tensors, input_tensors, options)

    def scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: ScatterOptions | None = None,
    ) -> Work:
        options = opts or ScatterOptions()
        _checks.root_rank("scatter", options.rootRank, self.size())
        _checks.tensor_list("scatter", "output_tensors", output_tensors, 1)
        if self.rank() == options.rootRank:
            _checks.nested_lists("scatter", "input_tensors", input_tensors, 1, self.size())
        return self._run("scatter", output_tensors, output_tensors, input_tensors, options)

    def all_gather_single(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        opts: AllgatherOptions | None = None,
    ) -> Work:
        _checks.gathered_tensor("all_gather_single", output_tensor, input_tensor, self.size())
        return self._run(
            "all_gather_single",
            output_tensor,
            output_tensor,
            input_tensor,
            opts or AllgatherOptions(),
        )

    _allgather_base = all_gather_single  # the name before torch 2.7, still called by libraries

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        input_list: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        _checks.tensor_list("allgather_coalesced", "input_list", input_list)
        _checks.nested_lists(
            "allgather_coalesced", "output_lists", output_lists, self.size(), len(input_list)
        )
        return self._run(
            "allgather_coalesced",
            output_lists,
            output_lists,
            input_list,
            opts or AllgatherOptions(),
        )

    def all_gather_single_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        return self.allgather_into_tensor_coalesced(output_tensors, input_tensors, opts)

    def reduce_scatter_single(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        opts: ReduceScatterOptions | None = None,
    ) -> Work:
        _checks.gathered_tensor("reduce_scatter_single", input_tensor, output_tensor, self.size())
        return self._run(
            "reduce_scatter_single",
            output_tensor,
            output_tensor,
            input_tensor,
            opts or ReduceScatterOptions(),
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> Work:
        return self.reduce_scatter_tensor_coalesced(output_tensors, input_tensors, opts)

    def all_to_all_single(
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        return self.alltoall_base(
            output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts
        )

    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        world = self.size()
        _checks.tensor_list("alltoall", "output_tensors", output_tensors, world)
        _checks.tensor_list("alltoall", "input_tensors", input_tensors, world)
        if self._ALLTOALL_THROUGH_ONE_BUFFER:
            staging = alltoall_through_one_buffer(output_tensors, input_tensors)
            options = opts or AllToAllOptions()
            return staged_work(
                self._run("alltoall_base", staging.outputs, *staging.args, options), staging
            )
        return self._run(
            "alltoall", output_tensors, output_tensors, input_tensors, opts or AllToAllOptions()
        )

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        """Receive from whichever member sends first; ``work._source_rank()`` says who."""
        _checks.tensor_list("recv_anysource", "tensors", tensors)
        if self.size() < 2:
            raise ValueError("recv_anysource: a group of one member has no one to receive from")
        return self._run("recv_anysource", tensors, tensors, tag)

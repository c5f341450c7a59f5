"""Bad input to process groups fails fast with errors naming the value."""

from __future__ import annotations

import pytest
import torch
from torch._C._distributed_c10d import AllgatherOptions, BroadcastOptions, ReduceScatterOptions

from torchft_pg import (
    ErrorSwallowingProcessGroupWrapper,
    NotConfiguredError,
    ProcessGroupDummy,
    ProcessGroupGloo,
)
from torchft_pg.process_group.base import validate_configure_args


@pytest.mark.parametrize(
    ("rank", "world", "match"),
    [
        (2, 2, r"rank must be in \[0, 2\), got 2"),
        (-1, 3, r"rank must be in \[0, 3\), got -1"),
        (0, 0, "world_size must be >= 1, got 0"),
    ],
)
def test_configure_rejects_rank_and_world_size(rank: int, world: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ProcessGroupGloo().configure("127.0.0.1:1/p", rank, world)


def test_configure_rejects_malformed_address_before_connecting() -> None:
    with pytest.raises(ValueError, match="'localhost/p'"):
        ProcessGroupGloo().configure("localhost/p", 0, 1)


def test_torchft_four_argument_form_gets_a_hint() -> None:
    with pytest.raises(TypeError, match="replica_id"):
        validate_configure_args("h:1/p", "replica-0", 2)


def test_collective_before_configure_says_to_configure() -> None:
    pg = ProcessGroupGloo()
    with pytest.raises(NotConfiguredError, match=r"call configure\(store_addr, rank, world_size\)"):
        pg.allreduce([torch.ones(1)])
    swallowing = ErrorSwallowingProcessGroupWrapper(ProcessGroupGloo())
    with pytest.raises(NotConfiguredError):  # a programming error is not swallowed
        swallowing.barrier()


def test_tensor_lists_of_the_wrong_length() -> None:
    pg = ErrorSwallowingProcessGroupWrapper(ProcessGroupDummy(rank=0, world=3))
    one = torch.ones(2)
    with pytest.raises(ValueError, match=r"output_tensors\[0\] must hold 3 tensors, got 2"):
        pg.allgather([[one, one]], [one], AllgatherOptions())
    with pytest.raises(ValueError, match="tensors must not be empty"):
        pg.allreduce([])
    with pytest.raises(ValueError, match=r"input_tensors\[0\] must hold 3 tensors, got 1"):
        pg.reduce_scatter([one], [[one]], ReduceScatterOptions())
    with pytest.raises(ValueError, match=r"must hold 1 tensors, got 2"):
        pg.allgather_into_tensor_coalesced([one, one], [one])
    with pytest.raises(TypeError, match=r"tensors\[0\] must be a tensor"):
        pg.allreduce([1.0])  # type: ignore[list-item]


def test_peer_and_root_ranks_out_of_range() -> None:
    pg = ErrorSwallowingProcessGroupWrapper(ProcessGroupDummy(rank=1, world=3))
    with pytest.raises(ValueError, match=r"dst_rank must be in \[0, 3\), got 3"):
        pg.send([torch.ones(1)], 3, 0)
    with pytest.raises(ValueError, match=r"src_rank must differ from this rank \(1\), got 1"):
        pg.recv([torch.ones(1)], 1, 0)
    opts = BroadcastOptions()
    opts.rootRank = 5
    with pytest.raises(ValueError, match=r"root rank must be in \[0, 3\), got 5"):
        pg.broadcast([torch.ones(1)], opts)
    with pytest.raises(ValueError, match="split_sizes must have 3 entries"):
        pg.alltoall_base(torch.zeros(3), torch.zeros(3), [1, 2], [1, 1, 1])


def test_wrapper_timeout_must_be_positive() -> None:
    from datetime import timedelta

    with pytest.raises(ValueError, match="timeout must be positive"):
        ProcessGroupGloo(timeout=timedelta(seconds=-1))

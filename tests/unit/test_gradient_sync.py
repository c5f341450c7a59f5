"""The allreduce's argument checks (pure) and its quantized sum over a fake group."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import ReduceOp

from torchft_pg.manager.gradient_sync import SpareBuffers, check_allreduce, quantized_sum
from torchft_pg.process_group.dummy import ProcessGroupDummy
from torchft_pg.quantization import Exchange, Quantization


def test_unquantized_ops_need_no_scheme() -> None:
    assert check_allreduce(torch.ones(2), ReduceOp.AVG, False, "int8") is None
    assert check_allreduce(torch.ones(2, dtype=torch.int64), ReduceOp.SUM, False, "int8") is None


def test_a_quantized_op_parses_its_scheme() -> None:
    assert check_allreduce(torch.ones(2), ReduceOp.SUM, True, "bf16") == Quantization.BF16
    assert check_allreduce(torch.ones(2), ReduceOp.AVG, True, Quantization.INT8) == (
        Quantization.INT8
    )


@pytest.mark.parametrize(
    ("tensor", "op", "quantize", "message"),
    [
        (torch.ones(2, dtype=torch.int64), ReduceOp.AVG, False, "AVG allreduce needs a floating"),
        (torch.ones(2), ReduceOp.MAX, True, "a quantized allreduce sums or averages"),
        (torch.ones(2, dtype=torch.int32), ReduceOp.SUM, True, "needs a floating tensor"),
    ],
)
def test_bad_arguments_are_refused(
    tensor: torch.Tensor, op: Any, quantize: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_allreduce(tensor, op, quantize, "int8")


def test_quantized_sum_adds_every_members_contribution_in_float32() -> None:
    # A dummy group of two "gathers" this rank's encoding twice: the sum is 2x.
    pg = ProcessGroupDummy(0, 2)
    contribution = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    summing = quantized_sum(pg, contribution, Quantization.BF16)
    assert summing.exchange is Exchange.ALLGATHER  # two members: never the reduce-scatter
    summing.future.wait()
    summed = summing.total()
    assert summed.shape == contribution.shape and summed.dtype == torch.float32
    assert torch.equal(summed, 2 * contribution)  # bf16 holds these values exactly


def test_a_given_back_buffer_serves_the_next_copy_of_the_same_size() -> None:
    spare = SpareBuffers()
    first = spare.copy_of(torch.arange(6.0).view(2, 3), zero=False)
    spare.give_back(first)
    again = spare.copy_of(torch.ones(3, 2), zero=False)
    assert again.data_ptr() == first.data_ptr() and again.shape == (3, 2)
    assert again.tolist() == [[1.0, 1.0]] * 3
    spare.give_back(again)
    assert spare.copy_of(torch.ones(6), zero=True).tolist() == [0.0] * 6


def test_a_buffer_never_given_back_is_never_handed_out_again() -> None:
    spare = SpareBuffers()
    held = spare.copy_of(torch.ones(4), zero=False)  # an abandoned op keeps it
    assert spare.copy_of(torch.ones(4), zero=False).data_ptr() != held.data_ptr()


def test_other_dtypes_sizes_and_layouts_get_their_own_memory() -> None:
    spare = SpareBuffers()
    kept = spare.copy_of(torch.ones(4), zero=False)
    spare.give_back(kept)
    assert spare.copy_of(torch.ones(4, dtype=torch.float64), zero=False).data_ptr() != (
        kept.data_ptr()
    )
    assert spare.copy_of(torch.ones(5), zero=False).data_ptr() != kept.data_ptr()
    strided = torch.ones(4, 2).t()  # not contiguous: copied as it is, never kept
    copy = spare.copy_of(strided, zero=False)
    assert copy.stride() == strided.stride() and copy.data_ptr() != kept.data_ptr()


def test_spares_are_bounded_per_size_and_in_sizes() -> None:
    spare = SpareBuffers(per_shape=1, shapes=2)
    a, b = torch.ones(1), torch.ones(1)
    spare.give_back(a)
    spare.give_back(b)  # over the one per size: dropped
    assert spare.copy_of(torch.ones(1), zero=False).data_ptr() == a.data_ptr()
    assert spare.copy_of(torch.ones(1), zero=False).data_ptr() != b.data_ptr()
    two, three, four = torch.ones(2), torch.ones(3), torch.ones(4)
    for t in (two, three, four):  # a third size drops the least recently used
        spare.give_back(t)
    assert spare.copy_of(torch.ones(2), zero=False).data_ptr() != two.data_ptr()
    assert spare.copy_of(torch.ones(4), zero=False).data_ptr() == four.data_ptr()

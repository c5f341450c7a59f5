"""The allreduce's argument checks (pure) and its quantized sum over a fake group."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import ReduceOp

from torchft_pg.gradient_sync import check_allreduce, quantized_sum
from torchft_pg.process_group.dummy import ProcessGroupDummy
from torchft_pg.quantization import Quantization


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
    work, total = quantized_sum(pg, contribution, Quantization.BF16)
    work.wait()
    summed = total()
    assert summed.shape == contribution.shape and summed.dtype == torch.float32
    assert torch.equal(summed, 2 * contribution)  # bf16 holds these values exactly

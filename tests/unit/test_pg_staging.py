"""Stand-in copies for ops a backend cannot run on the caller's tensors (no sockets).

The CUDA paths run in tests/interop/test_cuda.py where a GPU is present; here,
what holds on any machine: host tensors are never staged for Gloo, the list
form of alltoall maps onto one flat buffer and back, and op names resolve
across torch versions.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchft_pg.process_group._staging import (
    alltoall_through_one_buffer,
    backend_op,
    stage_on_host,
    staged_work,
)


def test_host_tensors_are_not_staged_for_gloo() -> None:
    t = torch.ones(3)
    assert stage_on_host("send", [t], ([t], 1, 0)) is None
    assert stage_on_host("allreduce_coalesced", [t], ([t],), native=frozenset()) is None


def test_alltoall_runs_on_one_buffer_and_splits_back() -> None:
    outs = [torch.full((2,), -1.0), torch.full((1, 3), -1.0)]
    ins = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])]
    staging = alltoall_through_one_buffer(outs, ins)
    flat_out, flat_in, out_splits, in_splits = staging.args
    assert flat_in.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert (out_splits, in_splits) == ([2, 3], [3, 2])
    flat_out.copy_(torch.arange(5, dtype=torch.float32))  # what the backend would write
    work = staged_work(None, staging)  # a backend that finished synchronously
    assert work.get_future().value() is outs
    assert outs[0].tolist() == [0.0, 1.0]
    assert outs[1].tolist() == [[2.0, 3.0, 4.0]]


def test_alltoall_with_mixed_dtypes_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"one dtype and device.*torch.float32.*torch.int64"):
        alltoall_through_one_buffer([torch.zeros(1)], [torch.zeros(1, dtype=torch.int64)])


class _OldNames:
    def _allgather_base(self, *args: Any) -> str:
        return "old"


def test_op_names_fall_back_to_their_names_before_torch_2_7() -> None:
    assert backend_op(_OldNames(), "all_gather_single")() == "old"
    with pytest.raises(NotImplementedError, match="_OldNames has no reduce_scatter_single"):
        backend_op(_OldNames(), "reduce_scatter_single")

"""The Baby PG's argument encoding, encoded and decoded in one process."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceOp

from torchft_pg.process_group.baby import protocol as proto


def _payload(buffers: list[Any]) -> memoryview:
    """The raw bytes after a message header, as the receiver sees them."""
    return memoryview(b"".join(memoryview(b).cast("B").tobytes() for b in buffers))


def _round_trip(args: tuple[object, ...]) -> tuple[Any, proto.EncodedArgs, list[Any]]:
    registry = proto.SharedStorageRegistry()
    spec, encoded = proto.encode_args(args, registry, proto.INLINE_MAX_BYTES)
    decoded, arrays, cuda = proto.ChildTensors().decode(
        spec, _payload(encoded.buffers), [os.dup(fd) for fd in encoded.fds]
    )  # SCM_RIGHTS duplicates fds
    assert not cuda
    return decoded, encoded, arrays


def _child_computes(decoded: list[torch.Tensor], arrays: list[Any], encoded: Any) -> None:
    """Stand in for the child's op: fill each tensor in place, send the results back."""
    for t in decoded:
        t.copy_(torch.ones_like(t))
    proto.copy_results(encoded, _payload(proto.result_buffers(arrays)))


def test_options_survive_the_trip() -> None:
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp(ReduceOp.MAX)  # the attribute is a ReduceOp, not its enum
    opts.timeout = timedelta(seconds=7)
    b = BroadcastOptions()
    b.rootRank = 2
    (decoded_opts, decoded_b), _, _ = _round_trip((opts, b))
    assert decoded_opts.reduceOp == ReduceOp.MAX
    assert decoded_opts.timeout == timedelta(seconds=7)
    assert decoded_b.rootRank == 2


def test_equal_options_encode_once_and_differing_ones_do_not_collide() -> None:
    a, b = AllreduceOptions(), AllreduceOptions()
    assert proto.encode_options(a) is proto.encode_options(b)
    b.reduceOp = ReduceOp(ReduceOp.MIN)
    assert proto.encode_options(a) != proto.encode_options(b)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.float16, torch.uint8]
)
def test_small_tensors_travel_inline_and_results_come_back(dtype: torch.dtype) -> None:
    caller = [torch.zeros(4, dtype=dtype), torch.zeros((2, 3), dtype=dtype)]
    (decoded,), encoded, arrays = _round_trip((caller,))
    assert not encoded.fds
    assert [t.dtype for t in decoded] == [dtype, dtype]
    assert [tuple(t.shape) for t in decoded] == [(4,), (2, 3)]
    _child_computes(decoded, arrays, encoded)
    assert all(bool(torch.all(t == torch.ones_like(t))) for t in caller)


def test_values_survive_the_trip() -> None:
    caller = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([True, False])]
    (decoded,), _, _ = _round_trip((caller,))
    assert [t.tolist() for t in decoded] == [t.tolist() for t in caller]


def test_strided_and_grad_requiring_tensors_get_their_results_in_place() -> None:
    base = torch.zeros(4, 6)
    strided = base.t()[:, ::2]  # not contiguous: sent as a C-order copy, written back strided
    leaf = torch.zeros(3, requires_grad=True)
    empty = torch.zeros(0)
    (decoded,), encoded, arrays = _round_trip(([strided, leaf, empty],))
    _child_computes(decoded, arrays, encoded)
    assert bool(torch.all(strided == 1.0))
    assert float(base.sum()) == strided.numel()  # nothing outside the view was touched
    assert leaf.detach().tolist() == [1.0, 1.0, 1.0]
    assert empty.numel() == 0


def test_a_result_of_the_wrong_size_is_refused() -> None:
    _, encoded, _ = _round_trip(([torch.zeros(4)],))
    with pytest.raises(ValueError, match="result holds 8 bytes, expected 16"):
        proto.copy_results(encoded, memoryview(bytes(8)))


def test_inline_budget_is_per_op_and_larger_tensors_go_through_shared_memory() -> None:
    small, big = torch.zeros(10), torch.zeros(proto.INLINE_MAX_BYTES // 4 + 1)
    registry = proto.SharedStorageRegistry()
    spec, encoded = proto.encode_args(([small, big],), registry)
    assert [s[0] for s in spec[0]] == ["i", "s"]
    assert len(encoded.fds) == 1 and big.is_shared()


def test_large_tensor_is_shared_once_and_mapped_by_identity() -> None:
    big = torch.zeros(100_000)
    registry = proto.SharedStorageRegistry()
    spec1, enc1 = proto.encode_args(([big],), registry, proto.INLINE_MAX_BYTES)
    spec2, enc2 = proto.encode_args(([big],), registry, proto.INLINE_MAX_BYTES)
    assert big.is_shared()
    assert len(enc1.fds) == 1 and enc2.fds == []  # the fd is sent the first time only
    child = proto.ChildTensors()
    ([view1],) = child.decode(spec1, memoryview(b""), [os.dup(fd) for fd in enc1.fds])[0]
    view1.fill_(3.0)  # the child writes into the caller's memory
    assert big[0].item() == 3.0
    ([view2],) = child.decode(spec2, memoryview(b""), [])[0]
    assert view2.data_ptr() == view1.data_ptr()


def test_registry_is_bounded_and_tells_the_child_what_to_forget() -> None:
    registry = proto.SharedStorageRegistry(capacity=2)
    tensors = [torch.zeros(40_000).share_memory_() for _ in range(3)]
    for t in tensors:
        proto.encode_args(([t],), registry, proto.INLINE_MAX_BYTES)
    forget = registry.take_forget()
    assert len(forget) == 1 and registry.take_forget() == ()

"""The Baby PG wire format, encoded and decoded in one process."""

from __future__ import annotations

import os

import torch
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceOp

from torchft_pg.process_group import _baby_protocol as proto


def _round_trip(args: tuple[object, ...]) -> tuple[object, proto.EncodedArgs, list[torch.Tensor]]:
    registry = proto.SharedStorageRegistry()
    spec, encoded = proto.encode_args(args, registry, proto.INLINE_MAX_BYTES)
    decoded, inline = proto.ChildTensors().decode(
        spec, encoded.inline_bytes, [os.dup(fd) for fd in encoded.fds]
    )  # SCM_RIGHTS duplicates fds
    return decoded, encoded, inline


def test_options_survive_the_trip() -> None:
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.MAX
    b = BroadcastOptions()
    b.rootRank = 2
    (decoded_opts, decoded_b), _, _ = _round_trip((opts, b))  # type: ignore[misc]
    assert decoded_opts.reduceOp == ReduceOp.MAX
    assert decoded_b.rootRank == 2


def test_small_tensors_travel_inline_and_results_come_back() -> None:
    caller = [
        torch.arange(4, dtype=torch.float32),
        torch.tensor([True, False]),
        torch.ones(2, dtype=torch.bfloat16),
    ]
    (decoded,), encoded, inline = _round_trip((caller,))  # type: ignore[misc]
    assert [t.tolist() for t in decoded] == [t.tolist() for t in caller]
    assert not encoded.fds
    for t in inline:  # the child computes in place...
        t.copy_(t * 0 + 1 if t.dtype != torch.bool else torch.ones_like(t))
    proto.copy_results(encoded, proto.inline_results(inline))  # ...and the caller sees it
    assert caller[0].tolist() == [1.0, 1.0, 1.0, 1.0] and caller[1].tolist() == [True, True]


def test_large_tensor_is_shared_once_and_mapped_by_identity() -> None:
    big = torch.zeros(100_000)
    registry = proto.SharedStorageRegistry()
    spec1, enc1 = proto.encode_args(([big],), registry, proto.INLINE_MAX_BYTES)
    spec2, enc2 = proto.encode_args(([big],), registry, proto.INLINE_MAX_BYTES)
    assert big.is_shared()
    assert len(enc1.fds) == 1 and enc2.fds == []  # the fd is sent the first time only
    child = proto.ChildTensors()
    ([view1],) = child.decode(spec1, [], [os.dup(fd) for fd in enc1.fds])[0]
    view1.fill_(3.0)  # the child writes into the caller's memory
    assert big[0].item() == 3.0
    ([view2],) = child.decode(spec2, [], [])[0]
    assert view2.data_ptr() == view1.data_ptr()


def test_registry_is_bounded_and_tells_the_child_what_to_forget() -> None:
    registry = proto.SharedStorageRegistry(capacity=2)
    tensors = [torch.zeros(40_000).share_memory_() for _ in range(3)]
    for t in tensors:
        proto.encode_args(([t],), registry, proto.INLINE_MAX_BYTES)
    assert len(registry.forget) == 1

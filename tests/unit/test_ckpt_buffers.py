"""Receive buffers: mapped for large sizes, prefaulted on a helper thread."""

from __future__ import annotations

import pytest
import torch

from torchft_pg.checkpointing.buffers import MAPPED_THRESHOLD_BYTES, Prefaulter, alloc_bytes


def test_small_and_large_buffers_are_writable_uint8() -> None:
    for n in (0, 5, MAPPED_THRESHOLD_BYTES, 3 * MAPPED_THRESHOLD_BYTES + 7):
        b = alloc_bytes(n)
        assert b.dtype == torch.uint8 and b.shape == (n,)
        b.fill_(7)
        assert n == 0 or int(b[-1]) == 7


def test_prefaulter_never_changes_contents_and_stops() -> None:
    bufs = [alloc_bytes(20 << 20), alloc_bytes(3 << 20)]
    bufs[0][:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)  # written before it runs
    p = Prefaulter(bufs)
    bufs[1].fill_(9)  # concurrent writes are fine: populate never changes data
    p.stop()
    assert bufs[0][:4].tolist() == [1, 2, 3, 4] and int(bufs[0][-1]) == 0
    assert int(bufs[1].min()) == 9


def test_negative_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="nbytes must be >= 0, got -1"):
        alloc_bytes(-1)

"""Chunk planning and the piece checksum shared by both checkpoint transports."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from torchft_pg.checkpointing.layout import (
    ALIGN_BYTES,
    PIECE_BYTES,
    Digest,
    PieceDigests,
    Segment,
    byte_view,
    iter_pieces,
    piece_digest,
    plan_chunks,
)


@pytest.mark.parametrize("seed", range(20))
def test_plan_covers_every_byte_once_with_aligned_cuts(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [
        rng.choice([0, 1, 7, 4096, 10_000, 3 << 20, 9 << 20]) for _ in range(rng.randint(1, 8))
    ]
    n = rng.randint(1, 6)
    plan = plan_chunks(sizes, n)
    assert len(plan) == n
    covered: dict[int, list[tuple[int, int]]] = {}
    for chunk in plan:
        for seg in chunk:
            assert seg.length > 0
            assert seg.offset % ALIGN_BYTES == 0, "cuts inside a blob fall on aligned offsets"
            covered.setdefault(seg.blob, []).append((seg.offset, seg.offset + seg.length))
    for b, size in enumerate(sizes):
        runs = sorted(covered.get(b, []))
        pos = 0
        for lo, hi in runs:
            assert lo == pos
            pos = hi
        assert pos == size


def test_plan_balances_one_big_blob() -> None:
    plan = plan_chunks([40 << 20], 4)
    assert [sum(s.length for s in c) for c in plan] == [10 << 20] * 4


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_chunks must be >= 1, got 0"):
        plan_chunks([1], 0)
    with pytest.raises(ValueError, match=r"blob sizes must be >= 0, got \[-1\]"):
        plan_chunks([-1], 1)


def test_pieces_tile_a_segment_on_the_blob_grid() -> None:
    seg = Segment(2, 4096, 2 * PIECE_BYTES + 5)
    pieces = list(iter_pieces(seg))
    assert [p.length for p in pieces] == [PIECE_BYTES - 4096, PIECE_BYTES, 4096 + 5]
    assert [p.offset for p in pieces] == [4096, PIECE_BYTES, 2 * PIECE_BYTES]
    assert all(p.blob == 2 for p in pieces)
    on_grid = list(iter_pieces(Segment(0, PIECE_BYTES, PIECE_BYTES + 1)))
    assert [(p.offset, p.length) for p in on_grid] == [
        (PIECE_BYTES, PIECE_BYTES),
        (2 * PIECE_BYTES, 1),
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_kept_piece_digests_match_the_fresh_ones_for_any_chunking(n: int) -> None:
    """The sender's kept digests fold to the value the receiver computes from the
    bytes, whatever the chunk cuts, before and after `fill`."""
    blobs = [
        torch.randint(0, 256, (size,), dtype=torch.uint8)
        for size in (2 * PIECE_BYTES + 12_345, 100, PIECE_BYTES)
    ]
    kept = PieceDigests(blobs)
    plan = plan_chunks([b.numel() for b in blobs], n)

    def fold(of: Callable[[Segment], int]) -> list[int]:
        out = []
        for chunk in plan:
            d = Digest()
            for seg in chunk:
                for p in iter_pieces(seg):
                    d.update(of(p))
            out.append(d.value)
        return out

    fresh = fold(lambda p: piece_digest(blobs[p.blob][p.offset : p.offset + p.length]))
    assert fold(kept.of) == fresh
    kept.fill(lambda: False)
    assert fold(kept.of) == fresh


def test_fill_stops_when_asked() -> None:
    blobs = [torch.zeros(3 * PIECE_BYTES, dtype=torch.uint8)]
    kept = PieceDigests(blobs)
    calls = iter([False, True])
    kept.fill(lambda: next(calls))
    assert kept._known == [[piece_digest(blobs[0][:PIECE_BYTES]), None, None]]


def test_digest_detects_flips_swaps_and_truncation() -> None:
    data = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    ref = piece_digest(data)
    assert piece_digest(data.clone()) == ref, "deterministic"
    flipped = data.clone()
    flipped[12345] ^= 0x80
    assert piece_digest(flipped) != ref
    top = data.clone()
    top[4096 * 3 + 7] ^= 0x80  # top bit of a word in an even-weighted block
    assert piece_digest(top) != ref
    swapped = data.clone()
    swapped[:4096], swapped[4096:8192] = data[4096:8192].clone(), data[:4096].clone()
    assert piece_digest(swapped) != ref
    assert piece_digest(data[:-1]) != ref
    odd = data[:13]
    assert piece_digest(odd) != piece_digest(odd[:12])


def test_digest_detects_every_single_flipped_bit() -> None:
    """Every bit of a piece with two 4 KiB blocks, three more words and a 5-byte
    tail: flipping any one of them changes the digest (the top bit of a word in
    block 0, weight 1, went unseen while both fold constants were odd)."""
    data = torch.randint(0, 256, (2 * 4096 + 3 * 8 + 5,), dtype=torch.uint8)
    ref = piece_digest(data)
    missed = []
    for i in range(data.numel()):
        for bit in range(8):
            data[i] ^= 1 << bit
            if piece_digest(data) == ref:
                missed.append((i, bit))
            data[i] ^= 1 << bit
    assert not missed, f"flips not detected (byte, bit): {missed[:10]}"


def test_digest_detects_top_bit_flips_in_a_full_piece() -> None:
    data = torch.randint(0, 256, (PIECE_BYTES,), dtype=torch.uint8)
    ref = piece_digest(data)
    for block in (0, 1, 2, 3, 511, 1023):
        for byte in (7, 4095):  # the sign bit of the block's first and last word
            data[block * 4096 + byte] ^= 0x80
            assert piece_digest(data) != ref, (block, byte)
            data[block * 4096 + byte] ^= 0x80


def test_digest_of_unaligned_view_matches_aligned_copy() -> None:
    data = torch.randint(0, 256, (10_000,), dtype=torch.uint8)
    assert piece_digest(data[3:9003]) == piece_digest(data[3:9003].clone())


def test_fold_is_order_sensitive() -> None:
    a, b = Digest(), Digest()
    a.update(1)
    a.update(2)
    b.update(2)
    b.update(1)
    assert a.value != b.value


def test_byte_view_aliases_tensor_memory() -> None:
    t = torch.zeros(4, dtype=torch.int32)
    mv = byte_view(t)
    assert len(mv) == 16
    mv[0] = 7
    assert t[0].item() == 7
    with pytest.raises(ValueError, match="contiguous CPU"):
        byte_view(torch.zeros(4, 4).t())

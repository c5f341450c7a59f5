"""Quantized allreduce payloads: the error each encoding introduces, bounded and
measured, and the bytes it saves."""

from __future__ import annotations

import pytest
import torch

from torchft_pg.quantization import (
    CHUNK,
    MIN_SAVING,
    Exchange,
    Quantization,
    choose_exchange,
    decode,
    decode_shards,
    encode,
    encode_shards,
    encoded_numel,
    reduce_shards,
    ring_traffic,
    shard_layout,
    simulated_sum,
    sum_encoded,
    traffic,
)


def _values(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # pseudo-gradient-like: mostly small, a few outliers, some exact zeros
    x = torch.randn(n, generator=gen) * 1e-3
    x[::97] *= 50.0
    x[5:40] = 0.0
    return x


@pytest.mark.parametrize("n", [1, CHUNK - 1, CHUNK, 3 * CHUNK + 7])
def test_int8_error_is_at_most_half_a_chunk_scale(n: int) -> None:
    x = _values(n)
    buf = encode(x, Quantization.INT8)
    assert buf.dtype == torch.int8 and buf.numel() == encoded_numel(n, Quantization.INT8)
    y = decode(buf, n, Quantization.INT8)
    chunks = -(-n // CHUNK)
    padded = torch.zeros(chunks * CHUNK)
    padded[:n] = x
    half_scale = (padded.view(chunks, CHUNK).abs().amax(1) / 127 / 2).repeat_interleave(CHUNK)[:n]
    err = (y - x).abs()
    assert bool((err <= half_scale * (1 + 1e-6) + 1e-12).all())
    assert bool((y[5:40] == 0).all()) if n > 40 else True  # zeros stay exact


def test_bf16_error_is_relative_two_to_the_minus_nine() -> None:
    x = _values(4096)
    y = decode(encode(x, Quantization.BF16), 4096, Quantization.BF16)
    assert bool(((y - x).abs() <= x.abs() * 2**-8).all())
    assert encoded_numel(4096, Quantization.BF16) == 2 * 4096


def test_the_measured_error_and_size_of_an_average_of_three() -> None:
    """What a user trades: relative L2 error of the average of 3 contributions,
    and bytes per value against float32's 4."""
    n = 64 * CHUNK
    parts = [_values(n, seed) for seed in range(3)]
    exact = torch.stack(parts).sum(0) / 3
    measured = {}
    for scheme in Quantization:
        got = sum_encoded([encode(p, scheme) for p in parts], n, scheme) / 3
        measured[scheme] = float((got - exact).norm() / exact.norm())
        assert encoded_numel(n, scheme) / n < 4 / 1.9  # at most about half of float32
    assert measured[Quantization.BF16] < 3e-3
    assert measured[Quantization.INT8] < 6e-2  # outliers 50x the rest widen the chunks
    assert measured[Quantization.INT8] > measured[Quantization.BF16] > 0  # it is lossy


def test_the_sum_is_the_same_bits_whatever_rank_decodes_it() -> None:
    parts = [encode(_values(1000, s), Quantization.INT8) for s in range(4)]
    a = sum_encoded(parts, 1000, Quantization.INT8)
    b = sum_encoded([p.clone() for p in parts], 1000, Quantization.INT8)
    assert torch.equal(a, b)


def test_bad_input_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"quantization must be one of \['int8', 'bf16'\], got 'fp8'"
    ):
        Quantization.parse("fp8")
    with pytest.raises(ValueError, match=r"needs a floating tensor, got torch\.int64"):
        encode(torch.arange(3), Quantization.INT8)
    with pytest.raises(ValueError, match=r"is 8 int8 bytes, got 6 of torch\.int8"):
        decode(torch.zeros(6, dtype=torch.int8), 4, Quantization.BF16)


# -- the reduce-scatter's shards ---------------------------------------------------


def _padded_shard(x: torch.Tensor, world: int, j: int, scheme: Quantization) -> torch.Tensor:
    layout = shard_layout(x.numel(), world, scheme)
    padded = torch.zeros(layout.padded_numel)
    padded[: x.numel()] = x
    return padded[j * layout.shard_numel : (j + 1) * layout.shard_numel]


@pytest.mark.parametrize("scheme", list(Quantization))
@pytest.mark.parametrize(("n", "world"), [(1, 3), (CHUNK, 2), (3 * CHUNK + 7, 3), (10_000, 8)])
def test_each_shard_is_encoded_as_it_would_be_alone(
    scheme: Quantization, n: int, world: int
) -> None:
    x = _values(n)
    layout = shard_layout(n, world, scheme)
    assert layout.padded_numel >= n and layout.padded_numel - n < world * CHUNK
    if scheme is Quantization.INT8:  # a scale never spans two members' shards
        assert layout.shard_numel % CHUNK == 0
    buf = encode_shards(x, layout)
    size = layout.shard_bytes
    assert buf.dtype == torch.int8 and buf.numel() == world * size
    for j in range(world):
        alone = encode(_padded_shard(x, world, j, scheme), scheme)
        assert torch.equal(buf[j * size : (j + 1) * size], alone)
    # decoding every shard gives back what one encoding of the whole would
    assert torch.equal(decode_shards(buf, layout), decode(encode(x, scheme), n, scheme))


def test_a_reduced_shard_is_the_rank_ordered_float32_sum_encoded_again() -> None:
    world, n = 3, 4 * CHUNK
    layout = shard_layout(n, world, Quantization.INT8)
    size = layout.shard_bytes
    sent = [encode_shards(_values(n, seed), layout) for seed in range(world)]
    j = 1  # what member 1 receives: every member's shard 1, in rank order
    received = torch.cat([s[j * size : (j + 1) * size] for s in sent])
    by_hand = torch.zeros(layout.shard_numel)
    for s in sent:
        by_hand += decode(s[j * size : (j + 1) * size], layout.shard_numel, Quantization.INT8)
    assert torch.equal(reduce_shards(received, layout), encode(by_hand, Quantization.INT8))


@pytest.mark.parametrize("world", [2, 3, 5])
def test_every_member_decodes_the_same_bits_and_a_rerun_too(world: int) -> None:
    n = 5 * CHUNK + 3
    parts = [_values(n, seed) for seed in range(world)]
    layout = shard_layout(n, world, Quantization.INT8)
    size = layout.shard_bytes
    sent = [encode_shards(p, layout) for p in parts]
    # each member j reduces its own shard; the allgather hands all of them to all
    summed = [
        reduce_shards(torch.cat([s[j * size : (j + 1) * size] for s in sent]), layout)
        for j in range(world)
    ]
    per_member = [decode_shards(torch.cat([t.clone() for t in summed]), layout) for _ in parts]
    assert all(torch.equal(r, per_member[0]) for r in per_member)
    again = simulated_sum(parts, Quantization.INT8, Exchange.REDUCE_SCATTER)
    assert torch.equal(again, per_member[0])


def test_a_members_zeros_change_nothing_but_the_sum_of_the_others() -> None:
    # A healing or spare member contributes zeros and receives the same result.
    n = 3 * CHUNK
    parts = [_values(n, 1), torch.zeros(n), _values(n, 2)]
    got = simulated_sum(parts, Quantization.INT8, Exchange.REDUCE_SCATTER)
    without = simulated_sum([parts[0], parts[2], torch.zeros(n)], Quantization.INT8)
    assert float((got - without).abs().max()) <= float(got.abs().max()) / 127


def test_the_reduce_scatter_error_is_bounded_by_both_roundings() -> None:
    """Each value's error is at most half of each contribution's chunk scale
    (first rounding) plus half of the summed chunk's scale (second rounding)."""
    world, n = 4, 6 * CHUNK + 100
    parts = [_values(n, seed) for seed in range(world)]
    exact = torch.stack(parts).sum(0)
    got = simulated_sum(parts, Quantization.INT8, Exchange.REDUCE_SCATTER)

    def half_scales(x: torch.Tensor) -> torch.Tensor:
        layout = shard_layout(n, world, Quantization.INT8)
        padded = torch.zeros(layout.padded_numel)
        padded[:n] = x
        scales = padded.view(-1, CHUNK).abs().amax(1) / 127 / 2
        return scales.repeat_interleave(CHUNK)[:n]

    first = sum(half_scales(p) for p in parts)
    second = half_scales(simulated_sum(parts, Quantization.INT8, Exchange.ALLGATHER))
    # the second scale is the decoded sum's, within the first rounding of the exact one
    bound = first + second * (1 + 1e-3) + 1e-9
    assert bool(((got - exact).abs() <= bound).all())


def test_the_measured_error_of_both_exchanges() -> None:
    """Independent contributions: re-encoding the summed shards adds a rounding as
    large as the first ones together (relative error about sqrt(2) times)."""
    world, n = 4, 64 * CHUNK
    parts = [_values(n, seed) for seed in range(world)]
    exact = torch.stack(parts).sum(0)
    for scheme, limit in ((Quantization.INT8, 6e-2), (Quantization.BF16, 3e-3)):
        errors = {
            exchange: float((simulated_sum(parts, scheme, exchange) - exact).norm() / exact.norm())
            for exchange in Exchange
        }
        ratio = errors[Exchange.REDUCE_SCATTER] / errors[Exchange.ALLGATHER]
        assert 1.2 < ratio < 1.6, errors
        assert errors[Exchange.REDUCE_SCATTER] < limit


# -- bytes per rank ------------------------------------------------------------------


@pytest.mark.parametrize("scheme", list(Quantization))
def test_the_reduce_scatter_moves_a_constant_number_of_bytes_per_rank(
    scheme: Quantization,
) -> None:
    n = 1 << 20
    encoded = encoded_numel(n, scheme)
    for world in (2, 3, 4, 8, 16, 64):
        shards = traffic(n, world, scheme, Exchange.REDUCE_SCATTER)
        whole = traffic(n, world, scheme, Exchange.ALLGATHER)
        ring = ring_traffic(n, world)
        assert shards.sent == shards.received and whole.sent == (world - 1) * encoded
        # 2 (n - 1) / n encoded sizes, plus at most one chunk of padding per shard
        ideal = 2 * (world - 1) / world * encoded
        assert ideal <= shards.sent <= ideal + 2 * (world - 1) * (CHUNK + 4)
        assert shards.sent < 2 * encoded  # O(1) in the number of members
        assert shards.sent / ring.sent < (0.27 if scheme is Quantization.INT8 else 0.51)


def test_the_exchange_is_chosen_by_the_bytes_it_saves() -> None:
    big = 1 << 20
    assert choose_exchange(big, 1, Quantization.INT8) is Exchange.ALLGATHER
    assert choose_exchange(big, 2, Quantization.INT8) is Exchange.ALLGATHER  # equal bytes
    assert choose_exchange(big, 2, Quantization.BF16) is Exchange.ALLGATHER
    assert choose_exchange(big, 3, Quantization.INT8) is Exchange.REDUCE_SCATTER
    assert choose_exchange(big, 8, Quantization.BF16) is Exchange.REDUCE_SCATTER
    assert choose_exchange(1000, 8, Quantization.INT8) is Exchange.ALLGATHER  # small
    # just above and below the saving that pays for a second collective's latency
    for world in (3, 4, 8):
        saving = [
            traffic(n, world, Quantization.INT8, Exchange.ALLGATHER).sent
            - traffic(n, world, Quantization.INT8, Exchange.REDUCE_SCATTER).sent
            for n in range(0, 1 << 18, CHUNK)
        ]
        chosen = [choose_exchange(n, world, Quantization.INT8) for n in range(0, 1 << 18, CHUNK)]
        for s, c in zip(saving, chosen, strict=True):
            assert (c is Exchange.REDUCE_SCATTER) == (s >= MIN_SAVING)


def test_bad_shards_are_named() -> None:
    layout = shard_layout(10, 2, Quantization.INT8)
    with pytest.raises(ValueError, match="a layout of 10 values, got a tensor of 11"):
        encode_shards(torch.ones(11), layout)
    with pytest.raises(ValueError, match=r"2 encoded shards are 1032 int8 bytes, got 4"):
        decode_shards(torch.zeros(4, dtype=torch.int8), layout)
    with pytest.raises(ValueError, match="world >= 1"):
        shard_layout(10, 0, Quantization.INT8)

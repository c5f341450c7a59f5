"""Quantized allreduce payloads: the error each encoding introduces, bounded and
measured, and the bytes it saves."""

from __future__ import annotations

import pytest
import torch

from torchft_pg.quantization import (
    CHUNK,
    Quantization,
    decode,
    encode,
    encoded_numel,
    sum_encoded,
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

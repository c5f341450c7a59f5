"""Silent data corruption on purpose: one flipped bit in one tensor of a replica's state.

A CORRUPT_STATE fault (`plan.Fault`) stands in for the faults that stop
nothing: a bad memory cell or a miscomputing core that changes a value and
lets the replica go on voting yes. `choose_bit_flip` picks, from a seed key,
the tensor, the element and the bit; `apply_bit_flip` flips it in place.

Only low mantissa bits are flipped (`LOW_MANTISSA_BITS`): the value changes
by a tiny relative amount (at most 2**-7 of it for float32), so training
goes on normally and only a bit-exact comparison of the replicas' states can
tell. A high bit would turn the value into a huge number or a NaN, which
the averaged gradient would spread to every replica before any check runs.
Both functions are pure apart from the flip itself, so a checker can replay
the same corruption on its own copy of the state.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

import torch

__all__ = ["LOW_MANTISSA_BITS", "BitFlip", "apply_bit_flip", "choose_bit_flip"]

# Per floating dtype: the integer dtype of the same width, and how many of its
# lowest bits may be flipped (the low half of the mantissa, or so).
LOW_MANTISSA_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 26),
    torch.float32: (torch.int32, 16),
    torch.float16: (torch.int16, 5),
    torch.bfloat16: (torch.int16, 3),
}


@dataclass(frozen=True, kw_only=True)
class BitFlip:
    """Bit `bit` (0: the lowest) of element `index` of the flattened tensor `tensor`."""

    tensor: str
    index: int
    bit: int


def choose_bit_flip(key: str, tensors: Iterable[tuple[str, torch.Tensor]]) -> BitFlip:
    """The flip a fault keyed `key` makes among the named `tensors`: the same for
    the same key and the same names and shapes, on every process.

    Only tensors of a dtype in `LOW_MANTISSA_BITS` with at least one element
    are candidates. Raises ValueError when there is none.
    """
    candidates = sorted(
        (name, t.numel(), t.dtype)
        for name, t in tensors
        if t.dtype in LOW_MANTISSA_BITS and t.numel() > 0
    )
    if not candidates:
        raise ValueError(
            "no tensor to corrupt: a CORRUPT_STATE fault needs at least one non-empty "
            f"tensor of dtype {', '.join(str(d) for d in LOW_MANTISSA_BITS)}"
        )
    rng = random.Random(key)
    name, numel, dtype = candidates[rng.randrange(len(candidates))]
    return BitFlip(
        tensor=name, index=rng.randrange(numel), bit=rng.randrange(LOW_MANTISSA_BITS[dtype][1])
    )


def apply_bit_flip(flip: BitFlip, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Flip `flip`'s bit in place in the tensor of that name among `tensors`.

    The tensor must be contiguous (parameters and optimizer state are). Raises
    KeyError naming the tensor when it is not among `tensors`.
    """
    named = dict(tensors)
    if flip.tensor not in named:
        raise KeyError(f"no tensor named {flip.tensor!r} to corrupt (have {sorted(named)})")
    target = named[flip.tensor]
    int_dtype, _ = LOW_MANTISSA_BITS[target.dtype]
    with torch.no_grad():
        flat = target.detach().view(-1).view(int_dtype)
        flat[flip.index] = torch.bitwise_xor(flat[flip.index], 1 << flip.bit)

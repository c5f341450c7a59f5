"""Fingerprints of a rank's registered state: bit-exact digests, one per tensor.

Replica groups that committed the same steps hold bit-identical state (each
rank the same shard as the same rank of the other groups), so a digest of the
state's raw bytes is the same on every up-to-date replica; a digest that
differs is silent data corruption (a flipped bit in memory, a faulty device).
`fingerprint_state` digests every tensor the registered state_dict functions
return (a DTensor by its local shard) with torch ops on the tensor's own
device, so nothing is copied to the host but one int64 per tensor.

A tensor's digest views its raw bytes as 64-bit integers ``x[r, c]`` (rows of
`COLUMNS`; narrower words when its byte count is not a multiple of 8) and sums
``x[r, c] * w[c] * (2r + 1)`` in wrapping int64 arithmetic, with `w` fixed odd
constants. Every weight is odd, so flipping any one bit (``x`` moves by
``±2**k``) always changes the digest; the weights differ by position, so
swapped elements change it too. It is a checksum against random faults, not a
cryptographic hash against an adversary.

The digests travel in a vector of fixed length (`vector_length`), so that
groups whose state differs in shape still meet in the same collective:
tensor ``i`` goes to slot ``i % SLOTS`` (with more tensors than slots, several
share one, and a differing slot names all of them). `fingerprint_of` builds a
fingerprint from digests already taken: `gradient_digests` digests each
averaged gradient as its allreduce completes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchft_pg.checkpointing.serialization import local_shard

__all__ = [
    "COLUMNS",
    "SLOTS",
    "Fingerprint",
    "absent_vector",
    "fingerprint_of",
    "fingerprint_state",
    "named_tensors",
    "names_in_slots",
    "tensor_digest",
    "vector_length",
]

COLUMNS = 1024  # 64-bit words per row of a tensor's digest
SLOTS = 512  # per-tensor digest slots in an exchanged vector
_HEADER = 3  # taking part (0/1), tensor count, combined digest
_ODD_MIX = 0x5851F42D4C957F2D  # an odd 64-bit constant (a PCG multiplier) as a Python int
_weights: dict[torch.device, torch.Tensor] = {}


def vector_length() -> int:
    """Length of the int64 vector `Fingerprint.vector` returns."""
    return _HEADER + SLOTS


def _column_weights(device: torch.device) -> torch.Tensor:
    """`COLUMNS` fixed odd int64 constants on `device` (the same on every replica)."""
    w = _weights.get(device)
    if w is None:
        g = torch.Generator().manual_seed(0x7F4A7C15)
        w = torch.randint(-(2**62), 2**62, (COLUMNS,), generator=g, dtype=torch.int64) | 1
        w = _weights.setdefault(device, w.to(device))
    return w


def _as_int64_words(t: torch.Tensor) -> torch.Tensor:
    """`t`'s raw bytes as a 1-D int64 tensor: viewed without a copy when they are a
    whole number of 8-byte words, else as narrower words widened to int64."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    n = raw.numel()
    if n % 8 == 0:
        return raw.view(torch.int64)
    for width, dtype in ((4, torch.int32), (2, torch.int16)):
        if n % width == 0:
            return raw.view(dtype).to(torch.int64)
    return raw.to(torch.int64)


def tensor_digest(t: torch.Tensor) -> torch.Tensor:
    """A 0-dim int64 digest of `t`'s bytes (a DTensor's local shard), on its device.

    Raises TypeError for a tensor whose bytes cannot be read (sparse, meta)."""
    shard = local_shard(t)
    if shard.layout != torch.strided or shard.device.type == "meta":
        raise TypeError(
            f"cannot fingerprint a {shard.layout} tensor on {shard.device} "
            "(only dense tensors with data)"
        )
    x = _as_int64_words(shard)
    w = _column_weights(x.device)
    rows = x.numel() // COLUMNS
    tail = x.numel() - rows * COLUMNS
    body = x[: rows * COLUMNS].view(rows, COLUMNS)
    # on the host, mv makes no n-sized temporary (and its integer sums wrap like `sum`)
    per_row = torch.mv(body, w) if x.device.type == "cpu" else (body * w).sum(1)
    row_weights = torch.arange(rows, dtype=torch.int64, device=x.device) * 2 + 1
    digest = (per_row * row_weights).sum()
    if tail:
        digest = digest + (x[rows * COLUMNS :] * w[:tail]).sum() * (2 * rows + 1)
    return digest + _wrap(x.numel() * _ODD_MIX)  # the word count counts too


def named_tensors(state: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in nested dicts, lists and tuples, with its path ("a/b/0"),
    in the structure's own order (the same on replicas running the same code)."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from named_tensors(value, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from named_tensors(value, f"{prefix}/{i}" if prefix else str(i))


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """The digests of one rank's state: `names[i]`'s digest is `digests[i]`
    (int64, on the host)."""

    names: tuple[str, ...]
    digests: tuple[int, ...]

    def vector(self) -> torch.Tensor:
        """The fixed-length int64 vector a rank taking part exchanges:
        [1, tensor count, combined digest, slot digests...]."""
        slots = [0] * SLOTS
        combined = 0
        for i, d in enumerate(self.digests):
            fold = i // SLOTS  # 0 for the first SLOTS tensors: slot i holds tensor i's digest
            slots[i % SLOTS] = _wrap(slots[i % SLOTS] + d * (2 * fold + 1))
            combined = _wrap(combined * _ODD_MIX + d)
        return torch.tensor([1, len(self.digests), combined, *slots], dtype=torch.int64)


def absent_vector() -> torch.Tensor:
    """The vector of a rank that does not take part in a check (it heals)."""
    return torch.zeros(vector_length(), dtype=torch.int64)


def _wrap(value: int) -> int:
    """`value` as a signed 64-bit integer (two's complement wrap-around)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def fingerprint_state(state: Any) -> Fingerprint:
    """The `Fingerprint` of every tensor in `state` (see `named_tensors`)."""
    pairs = list(named_tensors(state))
    return fingerprint_of([name for name, _ in pairs], [tensor_digest(t) for _, t in pairs])


def fingerprint_of(names: Sequence[str], digests: Sequence[torch.Tensor]) -> Fingerprint:
    """The `Fingerprint` of tensors already digested (`tensor_digest`): `names[i]`'s
    0-dim digest is `digests[i]`, on any device; one device-to-host copy per device."""
    if len(names) != len(digests):
        raise ValueError(f"{len(names)} names for {len(digests)} digests")
    if not digests:
        return Fingerprint(names=(), digests=())
    by_device: dict[torch.device, list[int]] = {}
    for i, d in enumerate(digests):
        by_device.setdefault(d.device, []).append(i)
    values = [0] * len(digests)
    for indices in by_device.values():  # one device-to-host copy per device
        host = torch.stack([digests[i] for i in indices]).cpu().tolist()
        for i, v in zip(indices, host, strict=True):
            values[i] = int(v)
    return Fingerprint(names=tuple(names), digests=tuple(values))


def names_in_slots(names: Sequence[str], slots: Sequence[int]) -> list[str]:
    """The names of the tensors whose digests fill `slots`, in tensor order."""
    wanted = set(slots)
    return [name for i, name in enumerate(names) if i % SLOTS in wanted]

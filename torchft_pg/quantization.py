"""Lower-precision allreduce payloads: int8 with per-chunk scales, or bfloat16.

`Manager.allreduce(..., should_quantize=True)` (and `DiLoCo(should_quantize=True)`)
sends each replica's contribution in a compact encoding instead of float32:

* ``int8``: the flattened tensor in chunks of `CHUNK` elements; each chunk is
  stored as int8 values ``round(x / scale)`` with ``scale = max|x| / 127`` kept
  in float32. One byte per value plus 4 per chunk: about a quarter of float32.
  The error of one value is at most half its chunk's scale.
* ``bf16``: the values rounded to bfloat16 (relative error at most 2**-9), half
  of float32.

Two exchanges carry the encoded contributions (`Exchange`); `choose_exchange`
picks one from the tensor's size and the group's alone, so every member
picks the same:

* ``reduce_scatter`` (reduce-scatter, then allgather, as a ring allreduce
  does): the flattened contribution is cut into one shard per member
  (`ShardLayout`; int8 shards are whole CHUNKs, so every scale still covers
  one chunk of one shard; the last shards are padded with zeros). Each
  member encodes its shards (`encode_shards`) and sends shard ``j`` to
  member ``j`` in one alltoall; member ``j`` decodes the shards it received and adds them in
  float32 in rank order, then encodes that sum once more (`reduce_shards`);
  an allgather of the encoded sums gives every member the whole result
  (`decode_shards`). Each rank sends and receives ``2 (n - 1)`` shards of
  ``1/n`` of the encoding: about ``2 (n - 1) / n`` encoded sizes, whatever
  the number of members ``n``, like a float32 ring's ``2 (n - 1) / n * 4``
  bytes per value (int8: a quarter of it; bf16: half).
* ``allgather``: every member's whole encoding goes to every other one, and
  each member decodes and adds all of them in rank order (`sum_encoded`):
  ``n - 1`` encoded sizes per rank, growing with ``n``. It is chosen unless
  the reduce-scatter saves at least `MIN_SAVING` bytes per rank: always at
  two members (one encoded size per rank either way; one collective's
  latency instead of two, one rounding instead of two), and for small
  tensors, where the second collective's latency costs more than the bytes
  it saves (and int8 shards would be mostly padding).

Every member ends with the same bits, a healing or spare member (which
contributes zeros) too: the allgather hands everyone the same encoded bytes
(the sums encoded by their owners, or every contribution), and decoding is
elementwise. The sum is also reproducible: a fixed order of
float32 additions, from zero, on the same inputs.

The error. Each contribution is rounded once when encoded (int8: at most
half its chunk's scale per value; bf16: 2**-9 relative). The reduce-scatter
rounds each summed shard once more when it re-encodes it, at the scale of
the sum: a value's error is at most half of each contribution's chunk scale
plus half of the summed chunk's. In relative L2 terms the result's error is
about ``sqrt(e_first**2 + e_one**2)``, where ``e_first`` is the allgather's
(the first roundings alone) and ``e_one`` that of encoding one tensor
(int8 about 0.75% on Gaussian data, bf16 0.17%). For independent
contributions the two are equal: sqrt(2) times the allgather's error
(measured 1.41x at 2, 4 and 8 groups: int8 0.74% -> 1.05%, 3.7% -> 5.2%
with 50x outliers; bf16 0.17% -> 0.24%). Where the groups mostly agree,
the allgather's error shrinks with the number of groups and the
reduce-scatter's stays about ``e_one`` (measured at 8 groups: int8 0.27%
-> 0.79%, bf16 0.06% -> 0.18%). `bench/quantize.py` measures both
(docs/benchmarks.md has the figures).

Pure functions of tensors; the collectives themselves live in the Manager
(`torchft_pg.manager.quantized_sum`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "CHUNK",
    "MIN_SAVING",
    "Exchange",
    "Quantization",
    "ShardLayout",
    "Traffic",
    "choose_exchange",
    "decode",
    "decode_shards",
    "encode",
    "encode_shards",
    "encoded_numel",
    "reduce_shards",
    "ring_traffic",
    "shard_layout",
    "simulated_sum",
    "sum_encoded",
    "traffic",
]

#: Values per int8 scale. Smaller chunks track the local magnitude better (less
#: error next to an outlier) and cost 4 bytes of scale each.
CHUNK = 512


class Quantization(enum.Enum):
    """How a quantized allreduce encodes each contribution."""

    INT8 = "int8"
    BF16 = "bf16"

    @classmethod
    def parse(cls, value: Quantization | str) -> Quantization:
        if isinstance(value, Quantization):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"quantization must be one of {[q.value for q in cls]}, got {value!r}"
            ) from None


class Exchange(enum.Enum):
    """How the members' encoded contributions reach each other (module docstring)."""

    ALLGATHER = "allgather"
    REDUCE_SCATTER = "reduce_scatter"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _chunks(numel: int) -> int:
    return _ceil_div(numel, CHUNK)


def encoded_numel(numel: int, scheme: Quantization) -> int:
    """The int8 buffer length `encode` produces for a tensor of `numel` values."""
    if scheme is Quantization.BF16:
        return 2 * numel
    chunks = _chunks(numel)
    return chunks * CHUNK + 4 * chunks


def _check_floating(tensor: torch.Tensor) -> None:
    if not tensor.is_floating_point():
        raise ValueError(f"a quantized allreduce needs a floating tensor, got {tensor.dtype}")


def _int8_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 values and float32 scales of float32 `blocks` (one chunk a row)."""
    scales = blocks.abs().amax(dim=1) / 127.0
    # An all-zero chunk keeps scale 0 and values 0 (decoded exactly).
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = (blocks / safe.unsqueeze(1)).round_().clamp_(-127, 127).to(torch.int8)
    return values, scales


def _padded(tensor: torch.Tensor, numel: int) -> torch.Tensor:
    """`tensor` flattened as float32, with zeros after its values up to `numel`."""
    flat = tensor.detach().reshape(-1).float()
    if flat.numel() == numel:
        return flat
    padded = torch.zeros(numel, dtype=torch.float32, device=flat.device)
    padded[: flat.numel()] = flat
    return padded


def encode(tensor: torch.Tensor, scheme: Quantization) -> torch.Tensor:
    """`tensor` (floating, any shape) as a flat int8 buffer of `encoded_numel` bytes."""
    _check_floating(tensor)
    if scheme is Quantization.BF16:
        return tensor.detach().reshape(-1).float().to(torch.bfloat16).view(torch.int8)
    chunks = _chunks(tensor.numel())
    values, scales = _int8_blocks(_padded(tensor, chunks * CHUNK).view(chunks, CHUNK))
    return torch.cat([values.reshape(-1), scales.view(torch.int8)])


def decode(buffer: torch.Tensor, numel: int, scheme: Quantization) -> torch.Tensor:
    """The float32 values (flat, `numel` of them) an `encode` buffer holds."""
    expected = encoded_numel(numel, scheme)
    if buffer.dtype != torch.int8 or buffer.numel() != expected:
        raise ValueError(
            f"an encoded {scheme.value} buffer of {numel} values is {expected} int8 bytes, "
            f"got {buffer.numel()} of {buffer.dtype}"
        )
    if scheme is Quantization.BF16:
        return buffer.view(torch.bfloat16).float()
    chunks = _chunks(numel)
    values = buffer[: chunks * CHUNK].view(chunks, CHUNK).float()
    scales = buffer[chunks * CHUNK :].view(torch.float32)
    return (values * scales.unsqueeze(1)).reshape(-1)[:numel]


def sum_encoded(buffers: list[torch.Tensor], numel: int, scheme: Quantization) -> torch.Tensor:
    """The float32 sum of every buffer's values, added in list (rank) order."""
    total = torch.zeros(numel, dtype=torch.float32, device=buffers[0].device)
    for b in buffers:
        total.add_(decode(b, numel, scheme))
    return total


# -- the reduce-scatter's shards -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ShardLayout:
    """How a contribution of `numel` values is cut into `world` shards of
    `shard_numel` values each (int8: whole CHUNKs), zeros after the last value."""

    numel: int
    world: int
    scheme: Quantization
    shard_numel: int

    @property
    def shard_bytes(self) -> int:
        """The encoded size of one shard (the int8 bytes each member sends each member)."""
        return encoded_numel(self.shard_numel, self.scheme)

    @property
    def padded_numel(self) -> int:
        return self.world * self.shard_numel


def shard_layout(numel: int, world: int, scheme: Quantization) -> ShardLayout:
    """The layout every member of a group of `world` uses for `numel` values."""
    if world < 1 or numel < 0:
        raise ValueError(f"shard_layout needs world >= 1 and numel >= 0, got {world}, {numel}")
    # int8 shards are whole chunks, so that a scale never spans two members' shards;
    # bf16 has no scales and cuts anywhere.
    unit = CHUNK if scheme is Quantization.INT8 else 1
    units_per_shard = max(_ceil_div(_ceil_div(numel, unit), world), 1)
    return ShardLayout(numel=numel, world=world, scheme=scheme, shard_numel=units_per_shard * unit)


def encode_shards(tensor: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
    """`tensor`'s shards, each encoded as `encode` would encode it alone, one after
    another: a flat int8 buffer of ``world * shard_bytes``, shard ``j`` (for
    member ``j``) at ``j * shard_bytes``."""
    _check_floating(tensor)
    if tensor.numel() != layout.numel:
        raise ValueError(f"a layout of {layout.numel} values, got a tensor of {tensor.numel()}")
    padded = _padded(tensor, layout.padded_numel)
    if layout.scheme is Quantization.BF16:  # no scales: the shards simply follow each other
        return padded.to(torch.bfloat16).view(torch.int8)
    world, per_shard = layout.world, layout.shard_numel
    values, scales = _int8_blocks(padded.view(-1, CHUNK))
    out = torch.empty(world, layout.shard_bytes, dtype=torch.int8, device=padded.device)
    out[:, :per_shard] = values.view(world, per_shard)
    out[:, per_shard:] = scales.view(torch.int8).view(world, -1)
    return out.view(-1)


def reduce_shards(received: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
    """The encoded sum of the shards in `received` (one from each member, in rank
    order, as the alltoall lays them out): decoded and added in float32 in that
    order, then encoded again (``shard_bytes`` int8 bytes)."""
    rows = received.view(layout.world, layout.shard_bytes).unbind(0)
    total = sum_encoded(list(rows), layout.shard_numel, layout.scheme)
    return encode(total, layout.scheme)


def decode_shards(gathered: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
    """The float32 values (flat, ``layout.numel``) that the encoded shards in
    `gathered` (member ``j``'s at ``j * shard_bytes``) hold together."""
    expected = layout.world * layout.shard_bytes
    if gathered.dtype != torch.int8 or gathered.numel() != expected:
        raise ValueError(
            f"{layout.world} encoded shards are {expected} int8 bytes, "
            f"got {gathered.numel()} of {gathered.dtype}"
        )
    if layout.scheme is Quantization.BF16:
        return gathered.view(torch.bfloat16).float()[: layout.numel]
    rows = gathered.view(layout.world, layout.shard_bytes)
    per_shard = layout.shard_numel
    values = rows[:, :per_shard].float().view(-1, CHUNK)
    # each row's scales start at a multiple of 4 bytes (shard_numel is whole chunks)
    scales = rows[:, per_shard:].contiguous().view(torch.float32).reshape(-1, 1)
    return (values * scales).view(-1)[: layout.numel]


# -- which exchange, and what it costs --------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """Bytes one member sends and receives in one sum (payload only)."""

    sent: int
    received: int


def traffic(numel: int, world: int, scheme: Quantization, exchange: Exchange) -> Traffic:
    """What one member of `world` moves to sum `numel` values with `exchange`.

    An allgather or alltoall over `world` members sends each of the other
    ``world - 1`` members (directly or by forwarding along a ring) one block
    and receives one from each.
    """
    if exchange is Exchange.ALLGATHER:
        each = (world - 1) * encoded_numel(numel, scheme)
    else:
        # the alltoall of contributions' shards, then the allgather of summed ones
        each = 2 * (world - 1) * shard_layout(numel, world, scheme).shard_bytes
    return Traffic(sent=each, received=each)


def ring_traffic(numel: int, world: int) -> Traffic:
    """What one member moves in a float32 ring allreduce of `numel` values: a
    reduce-scatter and an allgather of ``1/world`` of them each, ``world - 1`` steps."""
    each = 2 * (world - 1) * _ceil_div(numel, world) * 4
    return Traffic(sent=each, received=each)


#: Bytes per member the reduce-scatter must save over the allgather to be chosen.
#: Its second collective costs about one more latency (100-300 us in our Gloo
#: groups), which 64 KiB take at a few Gb/s; below that one collective is faster.
MIN_SAVING = 64 << 10


def choose_exchange(numel: int, world: int, scheme: Quantization) -> Exchange:
    """The reduce-scatter where it moves at least `MIN_SAVING` bytes fewer per
    member than the allgather, else the allgather (one collective, one rounding).
    At two members the two move the same bytes: always the allgather."""
    shards = traffic(numel, world, scheme, Exchange.REDUCE_SCATTER)
    whole = traffic(numel, world, scheme, Exchange.ALLGATHER)
    if whole.sent - shards.sent >= MIN_SAVING:
        return Exchange.REDUCE_SCATTER
    return Exchange.ALLGATHER


def simulated_sum(
    parts: list[torch.Tensor], scheme: Quantization, exchange: Exchange | None = None
) -> torch.Tensor:
    """The float32 sum (flat) that every member of a group whose members
    contribute `parts` (in rank order) obtains: the same arithmetic, with the
    collectives replaced by slicing. `exchange` None: `choose_exchange`'s."""
    numel, world = parts[0].numel(), len(parts)
    if exchange is None:
        exchange = choose_exchange(numel, world, scheme)
    if exchange is Exchange.ALLGATHER:
        return sum_encoded([encode(p, scheme) for p in parts], numel, scheme)
    layout = shard_layout(numel, world, scheme)
    size = layout.shard_bytes
    sent = [encode_shards(p, layout) for p in parts]
    summed = [
        reduce_shards(torch.cat([s[j * size : (j + 1) * size] for s in sent]), layout)
        for j in range(world)
    ]
    return decode_shards(torch.cat(summed), layout)

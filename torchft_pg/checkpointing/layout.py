"""Byte layout of a checkpoint on the wire: segments, pieces and the checksum.

A packed checkpoint is a list of *blobs* (1-D uint8 tensors, see
`serialization.pack`). Both transports move blob bytes in *pieces* of at most
`PIECE_BYTES`, and both ends cut the same pieces with the same pure functions
here, so each end can checksum what it sent or received piece by piece, while
the data streams, without a second pass over the state dict. Pieces are cut
on a grid fixed per blob (multiples of `PIECE_BYTES` from the blob's start),
whatever the chunking, so a sender serving an immutable snapshot checksums each
grid piece once per snapshot (`PieceDigests`), not once per transfer.

The checksum (`piece_digest`) is a position-weighted 64-bit sum, Fletcher-like:
``s1 = Σ w_i`` and ``s2 = Σ_b (b + 1) · Σ_{i in block b} w_i`` over the piece's
little-endian int64 words (blocks of 4 KiB), folded with the length as
``s1 · K1 + s2 · K2 + length`` (mod 2**64) with `K1` odd and `K2` even. A
flipped bit k changes s1 by ±2**k and s2 by a multiple ``m · 2**k``, so the
digest by ±2**k · (K1 ± m · K2), an odd multiple of 2**k: never 0 mod 2**64,
so every single flipped bit is detected, the top bit of a word included (with
both constants odd, a flipped top bit in an odd-weighted block cancelled out).
It is
computed in one pass of torch int64 block sums on the calling thread, which run
at ~11-18 GB/s on the 2-core dev VM and release the GIL. We measured
`zlib.crc32` at ~3.7 GB/s there: on a 400 MB heal it would cost ~0.11 s on each
side, more than half of the 0.2 s budget for the 2 GB/s target. The weighted
sum detects truncation, any single corrupted word, and swapped or misplaced
blocks/pieces/chunks (the failure modes of a chunked transfer); it is not a
cryptographic hash and does not defend against a malicious peer (the metadata
is validated separately for that).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = [
    "ALIGN_BYTES",
    "PIECE_BYTES",
    "Digest",
    "PieceDigests",
    "Segment",
    "byte_view",
    "iter_pieces",
    "piece_digest",
    "plan_chunks",
    "storage_bytes",
]

#: Largest piece sent or received in one call, in bytes (a multiple of 4 KiB).
PIECE_BYTES = 4 << 20
#: Chunk cut points inside a blob fall on multiples of this many bytes.
ALIGN_BYTES = 4096
_BLOCK_WORDS = 512  # 4 KiB blocks for the position weights
# Blocks summed per torch call on CPU: 63 * 512 words stay under torch's 32768-element
# grain, so each call runs on the calling thread. Transfers already keep every core
# busy; intra-op threads only oversubscribe them, and with other load on the dev VM
# the parallel reduction fell from ~20 to 1.3-3.6 GB/s while this stays ~11-18 GB/s.
_SERIAL_BLOCKS = 63
_MASK = (1 << 64) - 1
# K1 odd, K2 even: see the module docstring (why every single flipped bit shows).
_K1 = 0x9E3779B97F4A7C15
_K2 = 0xC2B2AE3D27D4EB4E


@dataclass(frozen=True)
class Segment:
    """Bytes ``[offset, offset + length)`` of blob number `blob`."""

    blob: int
    offset: int
    length: int


def plan_chunks(blob_sizes: Sequence[int], num_chunks: int) -> list[list[Segment]]:
    """Split the blobs into `num_chunks` runs of segments of about equal bytes.

    A large blob is cut at `ALIGN_BYTES` boundaries, so one big tensor is still
    fetched in parallel. Pure and deterministic: sender and receiver call it with
    the same arguments and get the same plan. Some chunks may be empty.
    """
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
    if any(s < 0 for s in blob_sizes):
        raise ValueError(f"blob sizes must be >= 0, got {list(blob_sizes)}")
    total = sum(blob_sizes)
    target = -(-total // num_chunks)
    target = max(ALIGN_BYTES, -(-target // ALIGN_BYTES) * ALIGN_BYTES)
    chunks: list[list[Segment]] = [[] for _ in range(num_chunks)]
    ci, room = 0, target
    for b, size in enumerate(blob_sizes):
        off = 0
        while off < size:
            last = ci == num_chunks - 1
            take = size - off if last else min(size - off, room)
            if take < size - off:
                take = take // ALIGN_BYTES * ALIGN_BYTES
            if take > 0:
                chunks[ci].append(Segment(b, off, take))
                off += take
                room -= take
            if not last and (room < ALIGN_BYTES or take == 0):
                ci, room = ci + 1, target
    return chunks


def iter_pieces(segment: Segment) -> Iterator[Segment]:
    """The pieces of a segment: consecutive runs of at most `PIECE_BYTES`, cut at
    the blob's multiples of `PIECE_BYTES` (so a segment that starts off that grid
    has a shorter first piece, and every other piece is a whole grid piece or the
    segment's end)."""
    end = segment.offset + segment.length
    off = segment.offset
    while off < end:
        cut = min(end, (off // PIECE_BYTES + 1) * PIECE_BYTES)
        yield Segment(segment.blob, off, cut - off)
        off = cut


@lru_cache(maxsize=8)
def _weights(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.int64, device=device)


def piece_digest(piece: torch.Tensor) -> int:
    """The 64-bit checksum of a 1-D uint8 tensor (CPU or accelerator).

    Unsigned, in ``[0, 2**64)``. See the module docstring for the definition.
    """
    if piece.dtype != torch.uint8 or piece.dim() != 1:
        raise ValueError(
            f"piece must be a 1-D uint8 tensor, got {piece.dtype} {tuple(piece.shape)}"
        )
    n = piece.numel()
    nw = n // 8
    if nw and piece.storage_offset() % 8:
        piece = piece.clone()  # int64 view needs an 8-byte aligned offset
    s1 = s2 = 0
    nb = nw // _BLOCK_WORDS
    if nw:
        words = piece[: nw * 8].view(torch.int64)
        if nb:  # one pass over the data: per-block sums, then tiny reductions
            grid = words[: nb * _BLOCK_WORDS].view(nb, _BLOCK_WORDS)
            if piece.device.type == "cpu":
                blocks = torch.empty(nb, dtype=torch.int64, device="cpu")
                for j in range(0, nb, _SERIAL_BLOCKS):  # each call below torch's parallel grain
                    torch.sum(grid[j : j + _SERIAL_BLOCKS], 1, out=blocks[j : j + _SERIAL_BLOCKS])
            else:
                blocks = grid.sum(1)
            s1 = int(blocks.sum())
            s2 = int((blocks * _weights(nb, piece.device)).sum())
        if nw > nb * _BLOCK_WORDS:
            rest = int(words[nb * _BLOCK_WORDS :].sum())
            s1 += rest
            s2 += (nb + 1) * rest
    if n > nw * 8:
        tail = int.from_bytes(bytes(piece[nw * 8 :].tolist()), "little")
        s1 += tail
        s2 += (nb + 2) * tail
    return ((s1 & _MASK) * _K1 + (s2 & _MASK) * _K2 + n) & _MASK


class Digest:
    """Order-sensitive fold of piece digests into one 64-bit value."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, piece_value: int) -> None:
        self.value = ((self.value ^ piece_value) * 0x100000001B3 + 1) & _MASK


class PieceDigests:
    """`piece_digest` of the pieces of blobs that no one writes to any more (a
    served snapshot), each grid piece computed at most once and kept.

    A sender that serves one snapshot to several chunks or receivers then reads
    each byte for its checksum once, and `fill` computes them all ahead, on a
    thread of its own, off the streaming path. The values also cover the
    snapshot between its copy and its send. Thread-safe without a lock: a
    piece's digest is a pure function of bytes that do not change, so two
    threads that race on one piece store the same value.
    """

    def __init__(self, blobs: Sequence[torch.Tensor]) -> None:
        self._blobs = list(blobs)
        # Per blob, per grid piece (PIECE_BYTES from the blob's start): its digest once known.
        self._known: list[list[int | None]] = [
            [None] * -(-b.numel() // PIECE_BYTES) for b in self._blobs
        ]

    def of(self, piece: Segment) -> int:
        """The digest of `piece` (from `iter_pieces`); kept if it is a whole grid piece."""
        blob = self._blobs[piece.blob]
        view = blob[piece.offset : piece.offset + piece.length]
        k, rest = divmod(piece.offset, PIECE_BYTES)
        if rest or piece.length != min(PIECE_BYTES, blob.numel() - piece.offset):
            return piece_digest(view)  # a piece cut by a chunk boundary: not kept
        value = self._known[piece.blob][k]
        if value is None:
            value = self._known[piece.blob][k] = piece_digest(view)
        return value

    def fill(self, stop: Callable[[], bool]) -> None:
        """Compute every grid piece's digest not known yet; return early once `stop()`."""
        for b, blob in enumerate(self._blobs):
            for p in iter_pieces(Segment(b, 0, blob.numel())):
                if stop():
                    return
                self.of(p)


def storage_bytes(t: torch.Tensor, offset: int, length: int) -> torch.Tensor:
    """A 1-D uint8 view of bytes ``[offset, offset + length)`` of `t`'s storage.

    Shares memory with `t` (no copy); works on any device.
    """
    out = torch.empty(0, dtype=torch.uint8, device=t.device)
    return out.set_(t.untyped_storage(), offset, (length,), (1,))


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes, without numpy.

    The caller keeps `t` alive while the view is used.
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(
            f"byte_view needs a contiguous CPU tensor, got {t.device} stride {t.stride()}"
        )
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")

"""Pack a state dict into a safe metadata skeleton plus raw tensor bytes, and back.

The wire format shared by both transports:

* **skeleton** — the pytree structure (dict, OrderedDict, list, tuple) with every
  non-tensor leaf (None, bool, int, float, complex, str, bytes, torch.dtype,
  torch.device, torch.Size) and, for each tensor, its blob number, byte offset,
  dtype, shape and stride. It is written with `torch.save` and read back with
  ``torch.load(weights_only=True)``, then validated field by field: a peer's
  bytes are never unpickled with arbitrary globals.
* **blobs** — raw bytes, one blob per distinct storage span. Tensors that share a
  storage (tied weights, views, transposes, expands) share one blob when that
  wastes nothing, so views and sharing survive the trip; a small strided view
  of a big storage is copied to a compact blob instead of sending the storage.

No tensor data is pickled: the receiver preallocates each blob (or reuses the
destination tensor's own memory for an in-place receive) and the transport
writes the bytes straight into it.
"""

from __future__ import annotations

import io
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from torchft_pg.checkpointing.layout import storage_bytes
from torchft_pg.errors import RecoveryError

__all__ = [
    "FORMAT",
    "Packed",
    "Skeleton",
    "TensorMeta",
    "decode_skeleton",
    "destinations",
    "direct_targets",
    "pack",
    "prepare_receive",
    "unpack",
]

FORMAT = "torchft_pg.checkpoint/1"
#: Refuse skeletons larger than this many bytes (a corrupt or hostile header).
MAX_SKELETON_BYTES = 256 << 20

_LEAF_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
_Path = tuple[Any, ...]


@dataclass(frozen=True)
class TensorMeta:
    """Where a tensor's bytes are: `blob` (-1 for an empty tensor), byte `offset`."""

    blob: int
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    path: _Path


@dataclass(frozen=True)
class Skeleton:
    """The decoded, validated metadata of one checkpoint."""

    step: int
    serial: str
    tree: Any
    tensors: list[TensorMeta]
    blob_sizes: list[int]


@dataclass
class Packed:
    """A state dict ready to send: encoded skeleton + blobs (uint8, 1-D)."""

    step: int
    skeleton_bytes: bytes
    skeleton: Skeleton
    blobs: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.blobs)


def _encode(obj: Any, path: _Path, tensors: list[torch.Tensor], paths: list[_Path]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        paths.append(path)
        return ("T", len(tensors) - 1)
    if type(obj) is dict or type(obj) is OrderedDict:
        items = []
        for k, v in obj.items():
            if not isinstance(k, _LEAF_TYPES):
                raise TypeError(
                    f"state dict key at {path!r} must be a plain scalar, got {type(k).__name__}"
                )
            items.append((k, _encode(v, (*path, k), tensors, paths)))
        return ("D" if type(obj) is dict else "O", items)
    if type(obj) is list or type(obj) is tuple:
        enc = [_encode(v, (*path, i), tensors, paths) for i, v in enumerate(obj)]
        return ("L" if type(obj) is list else "U", enc)
    if type(obj) is torch.Size:
        return ("S", [int(x) for x in obj])
    if type(obj) in _LEAF_TYPES:
        return ("V", obj)
    raise TypeError(
        f"state dict value at {path!r} must be a tensor, dict, list, tuple or plain scalar, "
        f"got {type(obj).__name__}"
    )


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """Byte range ``[start, end)`` of `t` inside its storage (numel > 0)."""
    size = t.element_size()
    last = sum((int(n) - 1) * int(s) for n, s in zip(t.shape, t.stride(), strict=True))
    start = int(t.storage_offset()) * size
    return start, start + (last + 1) * size


def _check_plain(t: torch.Tensor, path: _Path) -> torch.Tensor:
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        raise TypeError(
            f"tensor at {path!r} is a {type(t).__name__}; send its local tensor instead"
        )
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise TypeError(
            f"tensor at {path!r} must be a dense strided tensor with data, got {t.layout} on {t.device}"
        )
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def pack(state_dict: Any, step: int) -> Packed:
    """Flatten `state_dict` into a skeleton and blobs that alias its storages.

    No copy is made except for compacting strided views of larger storages; the
    caller must not mutate the tensors until the blobs have been sent.
    """
    raw: list[torch.Tensor] = []
    paths: list[_Path] = []
    tree = _encode(state_dict, (), raw, paths)
    tensors = [_check_plain(t, p) for t, p in zip(raw, paths, strict=True)]
    metas: list[TensorMeta | None] = [None] * len(tensors)
    blobs: list[torch.Tensor] = []
    groups: dict[tuple[str, int], list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            metas[i] = TensorMeta(-1, 0, t.dtype, tuple(t.shape), tuple(t.stride()), paths[i])
        else:
            key = (str(t.device), t.untyped_storage().data_ptr())
            groups.setdefault(key, []).append(i)
    for idxs in groups.values():
        extents = [_extent(tensors[i]) for i in idxs]
        lo = min(s for s, _ in extents) // 16 * 16
        hi = max(e for _, e in extents)
        useful = sum(tensors[i].numel() * tensors[i].element_size() for i in idxs)
        if hi - lo <= useful + 16:  # one span, shared by all: keeps views and ties
            blobs.append(storage_bytes(tensors[idxs[0]], lo, hi - lo))
            for i, (s, _) in zip(idxs, extents, strict=True):
                t = tensors[i]
                metas[i] = TensorMeta(
                    len(blobs) - 1, s - lo, t.dtype, tuple(t.shape), tuple(t.stride()), paths[i]
                )
            continue
        for i, (s, e) in zip(idxs, extents, strict=True):  # sparse views: compact each
            t = tensors[i]
            if t.is_contiguous():
                start = s // 16 * 16
                blobs.append(storage_bytes(t, start, e - start))
                off = s - start
            else:
                t = t.contiguous()
                blobs.append(
                    storage_bytes(
                        t, int(t.storage_offset()) * t.element_size(), t.numel() * t.element_size()
                    )
                )
                off = 0
            metas[i] = TensorMeta(
                len(blobs) - 1, off, t.dtype, tuple(t.shape), tuple(t.stride()), paths[i]
            )
    final = [m for m in metas if m is not None]
    assert len(final) == len(tensors)
    skeleton = Skeleton(step, uuid.uuid4().hex, tree, final, [b.numel() for b in blobs])
    buf = io.BytesIO()
    torch.save(
        {
            "format": FORMAT,
            "step": step,
            "serial": skeleton.serial,
            "tree": tree,
            "tensors": [
                (m.blob, m.offset, m.dtype, list(m.shape), list(m.stride), m.path) for m in final
            ],
            "blobs": skeleton.blob_sizes,
        },
        buf,
    )
    return Packed(step, buf.getvalue(), skeleton, blobs)


def _bad(msg: str) -> RecoveryError:
    return RecoveryError(f"refused checkpoint metadata from peer: {msg}")


def _is_int(x: Any) -> bool:
    return type(x) is int


def decode_skeleton(data: bytes) -> Skeleton:
    """Load and validate a peer's skeleton; raise `RecoveryError` if unsafe or malformed.

    Uses ``torch.load(weights_only=True)``: pickles that name arbitrary globals
    (``__reduce__`` tricks) are refused before anything runs.
    """
    if len(data) > MAX_SKELETON_BYTES:
        raise _bad(f"{len(data)} bytes exceeds the {MAX_SKELETON_BYTES} byte limit")
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        raise _bad(
            f"not a weights-only torch payload ({type(exc).__name__}: {str(exc)[:300]})"
        ) from exc
    if type(obj) is not dict or obj.get("format") != FORMAT:
        raise _bad(f"expected a dict with format {FORMAT!r}, got {type(obj).__name__}")
    step, serial, sizes, raw = (
        obj.get("step"),
        obj.get("serial"),
        obj.get("blobs"),
        obj.get("tensors"),
    )
    if not _is_int(step) or type(serial) is not str:
        raise _bad(f"step must be int and serial str, got {step!r}, {serial!r}")
    if type(sizes) is not list or not all(_is_int(s) and s >= 0 for s in sizes):
        raise _bad("blob sizes must be a list of non-negative ints")
    if type(raw) is not list:
        raise _bad("tensors must be a list")
    metas = [_decode_meta(i, r, sizes) for i, r in enumerate(raw)]
    seen: list[bool] = [False] * len(metas)
    _check_tree(obj.get("tree"), len(metas), seen, 0)
    if not all(seen):
        raise _bad("some tensors are not referenced by the tree")
    assert isinstance(step, int)
    return Skeleton(step, serial, obj["tree"], metas, sizes)


def _decode_meta(i: int, r: Any, sizes: list[int]) -> TensorMeta:
    if type(r) is not tuple or len(r) != 6:
        raise _bad(f"tensor {i}: expected a 6-tuple, got {type(r).__name__}")
    blob, offset, dtype, shape, stride, path = r
    if not (
        _is_int(blob) and _is_int(offset) and isinstance(dtype, torch.dtype) and type(path) is tuple
    ):
        raise _bad(f"tensor {i}: malformed entry {r!r:.200}")
    if type(shape) is not list or type(stride) is not list or len(shape) != len(stride):
        raise _bad(f"tensor {i}: shape and stride must be lists of equal length")
    if not all(_is_int(x) and x >= 0 for x in shape + stride):
        raise _bad(f"tensor {i}: shape {shape} / stride {stride} must be non-negative ints")
    numel = 1
    for n in shape:
        numel *= n
    itemsize = dtype.itemsize
    if numel == 0:
        if blob != -1:
            raise _bad(f"tensor {i}: empty tensor must have blob -1, got {blob}")
    else:
        if not 0 <= blob < len(sizes) or offset < 0 or offset % itemsize:
            raise _bad(f"tensor {i}: blob {blob} / offset {offset} out of range or misaligned")
        end = offset + (sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1) * itemsize
        if end > sizes[blob]:
            raise _bad(
                f"tensor {i} at {path!r}: needs bytes up to {end} of blob {blob}, which has {sizes[blob]}"
            )
    return TensorMeta(blob, offset, dtype, tuple(shape), tuple(stride), path)


def _check_tree(node: Any, ntensors: int, seen: list[bool], depth: int) -> None:
    if depth > 200:
        raise _bad("tree nested deeper than 200 levels")
    if type(node) is not tuple or len(node) != 2 or type(node[0]) is not str:
        raise _bad(f"malformed tree node {node!r:.200}")
    tag, val = node
    if tag == "T":
        if not _is_int(val) or not 0 <= val < ntensors:
            raise _bad(f"tensor reference {val!r} out of range [0, {ntensors})")
        seen[val] = True
    elif tag in ("D", "O"):
        if type(val) is not list:
            raise _bad(f"dict node must hold a list, got {type(val).__name__}")
        for item in val:
            if type(item) is not tuple or len(item) != 2 or type(item[0]) not in _LEAF_TYPES:
                raise _bad(f"malformed dict item {item!r:.200}")
            _check_tree(item[1], ntensors, seen, depth + 1)
    elif tag in ("L", "U"):
        if type(val) is not list:
            raise _bad(f"sequence node must hold a list, got {type(val).__name__}")
        for item in val:
            _check_tree(item, ntensors, seen, depth + 1)
    elif tag == "S":
        if type(val) is not list or not all(_is_int(x) for x in val):
            raise _bad("torch.Size node must hold ints")
    elif tag != "V" or type(val) not in _LEAF_TYPES:
        raise _bad(f"unknown tree node tag {tag!r} or leaf type {type(val).__name__}")


def _decode_tree(node: Any, tensors: list[torch.Tensor]) -> Any:
    tag, val = node
    if tag == "T":
        return tensors[val]
    if tag == "D":
        return {k: _decode_tree(v, tensors) for k, v in val}
    if tag == "O":
        return OrderedDict((k, _decode_tree(v, tensors)) for k, v in val)
    if tag == "L":
        return [_decode_tree(v, tensors) for v in val]
    if tag == "U":
        return tuple(_decode_tree(v, tensors) for v in val)
    if tag == "S":
        return torch.Size(val)
    return val


def destinations(skeleton: Skeleton, template: Any) -> dict[int, torch.Tensor]:
    """Map tensor index → existing destination tensor with the same path, dtype and shape.

    `template` is the receiver's current state dict; tensors that do not match
    are simply received into fresh memory.
    """
    raw: list[torch.Tensor] = []
    paths: list[_Path] = []
    _encode(template, (), raw, paths)
    by_path = dict(zip(paths, raw, strict=True))
    out: dict[int, torch.Tensor] = {}
    for i, m in enumerate(skeleton.tensors):
        d = by_path.get(m.path)
        if (
            d is not None
            and d.dtype == m.dtype
            and tuple(d.shape) == m.shape
            and type(d) is torch.Tensor
        ):
            out[i] = d
    return out


def direct_targets(skeleton: Skeleton, dests: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Blobs that can be received straight into a destination tensor's memory.

    That is a blob holding exactly one contiguous tensor whose destination is
    contiguous too; returns blob index → uint8 view of the destination's bytes.
    """
    users: dict[int, list[int]] = {}
    for i, m in enumerate(skeleton.tensors):
        if m.blob >= 0:
            users.setdefault(m.blob, []).append(i)
    out: dict[int, torch.Tensor] = {}
    for b, idxs in users.items():
        if len(idxs) != 1 or idxs[0] not in dests:
            continue
        m, d = skeleton.tensors[idxs[0]], dests[idxs[0]]
        nbytes = d.numel() * d.element_size()
        contiguous_meta = torch.empty_strided(m.shape, m.stride, device="meta").is_contiguous()
        if (
            m.offset == 0
            and nbytes == skeleton.blob_sizes[b]
            and contiguous_meta
            and d.is_contiguous()
        ):
            out[b] = storage_bytes(d, int(d.storage_offset()) * d.element_size(), nbytes)
    return out


def prepare_receive(
    skeleton: Skeleton, template: Any, device: torch.device
) -> tuple[dict[int, torch.Tensor], set[int], list[torch.Tensor]]:
    """Destinations, the blobs received in place, and every blob's receive buffer.

    `template` is the receiver's current state dict (or None). A blob goes
    straight into a destination tensor on `device` when `direct_targets` allows;
    the others get a fresh uint8 buffer on `device`.
    """
    dests = destinations(skeleton, template) if template is not None else {}
    direct = direct_targets(skeleton, {i: d for i, d in dests.items() if d.device == device})
    blobs = [
        direct[b] if b in direct else torch.empty(size, dtype=torch.uint8, device=device)
        for b, size in enumerate(skeleton.blob_sizes)
    ]
    return dests, set(direct), blobs


def unpack(
    skeleton: Skeleton, blobs: list[torch.Tensor], dests: dict[int, torch.Tensor] | None = None
) -> Any:
    """Rebuild the state dict from received blobs (tensors alias the blobs).

    Tensors with a destination in `dests` are copied into it (or were received
    into it directly) and the destination tensor is returned in their place.
    """
    dests = dests or {}
    if len(blobs) != len(skeleton.blob_sizes):
        raise RecoveryError(f"expected {len(skeleton.blob_sizes)} blobs, got {len(blobs)}")
    out: list[torch.Tensor] = []
    for i, m in enumerate(skeleton.tensors):
        t = torch.empty(0, dtype=m.dtype, device=blobs[m.blob].device if m.blob >= 0 else "cpu")
        if m.blob >= 0:
            b = blobs[m.blob]
            base = b.storage_offset()
            t.set_(b.untyped_storage(), (base + m.offset) // m.dtype.itemsize, m.shape, m.stride)
        else:
            t = torch.empty_strided(m.shape, m.stride, dtype=m.dtype)
        d = dests.get(i)
        if d is not None:
            if d.data_ptr() != t.data_ptr():
                d.copy_(t)
            t = d
        out.append(t)
    return _decode_tree(skeleton.tree, out)

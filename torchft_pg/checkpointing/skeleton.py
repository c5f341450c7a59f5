"""The checkpoint skeleton: a state dict's structure and non-tensor leaves, as JSON.

The skeleton holds the pytree (dict, OrderedDict, list, tuple, torch.Size), every
non-tensor leaf (None, bool, int, float incl. nan/inf, str, bytes, complex,
torch.dtype, torch.device) and, per tensor, its blob number, byte offset, dtype,
shape and stride. Tensor data never goes in here (see `serialization`).

It is JSON, parsed by the C `json` module and then validated field by field, so
a peer's bytes can never run code: there is no unpickling at all. (We first used
``torch.load(weights_only=True)``; its pure-Python unpickler took 0.11 s for a
3000-tensor skeleton, against a few ms for JSON.) Every node is a tagged JSON
array, which keeps tuples, int keys, bytes and dtypes exact:

    ["T", i] tensor i     ["D", [[k, v], ...]] dict     ["O", ...] OrderedDict
    ["L", [...]] list     ["U", [...]] tuple            ["S", [ints]] torch.Size
    ["V", x] None/bool/int/float/str   ["B", hex] bytes  ["C", [re, im]] complex
    ["Y", name] torch.dtype            ["E", str] torch.device
    ["X", [i, [n, ...]]] a DTensor whose local shard is tensor i; [n, ...] is
                         its global shape (same number of dims as the shard)

A DTensor's layout (mesh by ranks, dimension names and process group names;
placements; global stride) goes in the optional top-level ``meshes`` and
``layouts`` tables (`dtensor_layout`), so a receiver without a DTensor of its
own at that path can rebuild one. DTensors are recognised without importing
``torch.distributed.tensor`` (which takes seconds): if that module was never
imported, no object can be a DTensor.
"""

from __future__ import annotations

import json
import math
import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from torchft_pg.checkpointing.dtensor_layout import DTensorLayout, decode_layouts, encode_layouts
from torchft_pg.errors import RecoveryError

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "FORMAT",
    "MAX_SKELETON_BYTES",
    "Path",
    "Skeleton",
    "TensorMeta",
    "as_dtensor",
    "build_tree",
    "decode_skeleton",
    "encode_skeleton",
    "flatten",
]

# /3: the piece checksum and chunk cuts changed (`layout`); an older peer is refused
# by name instead of failing every heal on a checksum mismatch.
FORMAT = "torchft_pg.checkpoint/3"
#: Refuse skeletons larger than this many bytes (a corrupt or hostile header).
MAX_SKELETON_BYTES = 256 << 20
_MAX_DEPTH = 100
_MAX_DIMS = 64  # most dimensions a DTensor's global shape may have
_DTYPES: dict[str, torch.dtype] = {
    str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)
}
_SCALARS = (type(None), bool, int, float, str)
_KEY_TYPES = (*_SCALARS, bytes, complex, torch.dtype, torch.device)
Path = tuple[Any, ...]


@dataclass(frozen=True)
class TensorMeta:
    """Where a tensor's bytes are: `blob` (-1 for an empty tensor) and byte `offset`."""

    blob: int
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class Skeleton:
    """A decoded, validated skeleton; `paths[i]` is tensor i's key path in the tree.

    `dtensors` maps the index of each tensor that was a DTensor's local shard
    on the sender to that DTensor's global shape; `layouts` those of them whose
    layout the sender described to that layout.
    """

    step: int
    serial: str
    tree: Any
    tensors: list[TensorMeta]
    paths: list[Path]
    blob_sizes: list[int]
    dtensors: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    layouts: Mapping[int, DTensorLayout] = field(default_factory=dict)


def as_dtensor(x: Any) -> DTensor | None:
    """`x` if it is a `torch.distributed.tensor.DTensor`, else None (see module docstring)."""
    module = sys.modules.get("torch.distributed.tensor")
    cls = getattr(module, "DTensor", None)
    return cast("DTensor", x) if isinstance(cls, type) and isinstance(x, cls) else None


def _leaf(x: Any, path: Path) -> list[Any]:
    t = type(x)
    if t in _SCALARS:
        return ["V", x]
    if t is bytes:
        return ["B", x.hex()]
    if t is complex:
        return ["C", [x.real, x.imag]]
    if t is torch.dtype:
        return ["Y", str(x).removeprefix("torch.")]
    if t is torch.device:
        return ["E", str(x)]
    raise TypeError(
        f"state dict value at {path!r} must be a tensor, dict, list, tuple or plain scalar, "
        f"got {t.__name__}"
    )


def flatten(obj: Any, path: Path, tensors: list[torch.Tensor], paths: list[Path]) -> list[Any]:
    """Encode `obj` as a tree node, appending its tensors and their paths in order.

    A DTensor is appended as it is (the caller takes its local shard) and
    encoded as an ``X`` node carrying its global shape.
    """
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        paths.append(path)
        if as_dtensor(obj) is not None:
            return ["X", [len(tensors) - 1, [int(n) for n in obj.shape]]]
        return ["T", len(tensors) - 1]
    t = type(obj)
    if t is dict or t is OrderedDict:
        items = []
        for k, v in obj.items():
            if type(k) not in _KEY_TYPES:
                raise TypeError(
                    f"state dict key at {path!r} must be a plain scalar, got {type(k).__name__}"
                )
            items.append([_leaf(k, path), flatten(v, (*path, k), tensors, paths)])
        return ["D" if t is dict else "O", items]
    if t is list or t is tuple:
        return [
            "L" if t is list else "U",
            [flatten(v, (*path, i), tensors, paths) for i, v in enumerate(obj)],
        ]
    if t is torch.Size:
        return ["S", [int(x) for x in obj]]
    return _leaf(obj, path)


def encode_skeleton(
    step: int,
    serial: str,
    tree: Any,
    metas: list[TensorMeta],
    blob_sizes: list[int],
    layouts: Mapping[int, DTensorLayout] | None = None,
) -> bytes:
    """The JSON bytes of a skeleton (`tree` from `flatten`; `layouts` of its DTensors)."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "serial": serial,
        "tree": tree,
        "tensors": [
            [m.blob, m.offset, str(m.dtype).removeprefix("torch."), list(m.shape), list(m.stride)]
            for m in metas
        ],
        "blobs": blob_sizes,
    }
    if layouts:
        doc["meshes"], doc["layouts"] = encode_layouts(layouts)
    return json.dumps(doc, separators=(",", ":")).encode()


def _bad(msg: str) -> RecoveryError:
    return RecoveryError(f"refused checkpoint metadata from peer: {msg}")


def _is_int(x: Any) -> bool:
    return type(x) is int


def decode_skeleton(data: bytes) -> Skeleton:
    """Parse and validate a peer's skeleton; `RecoveryError` if malformed or unsafe."""
    if len(data) > MAX_SKELETON_BYTES:
        raise _bad(f"{len(data)} bytes exceeds the {MAX_SKELETON_BYTES} byte limit")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _bad(f"not JSON ({type(exc).__name__}: {str(exc)[:200]})") from exc
    if type(doc) is not dict or doc.get("format") != FORMAT:
        fmt = doc.get("format") if type(doc) is dict else type(doc).__name__
        raise _bad(f"expected format {FORMAT!r}, got {fmt!r}")
    step, serial, sizes, raw = (
        doc.get("step"),
        doc.get("serial"),
        doc.get("blobs"),
        doc.get("tensors"),
    )
    if not _is_int(step) or type(serial) is not str:
        raise _bad(f"step must be int and serial str, got {step!r}, {serial!r}")
    if type(sizes) is not list or not all(_is_int(s) and s >= 0 for s in sizes):
        raise _bad("blob sizes must be a list of non-negative ints")
    if type(raw) is not list:
        raise _bad("tensors must be a list")
    metas = [_decode_meta(i, r, sizes) for i, r in enumerate(raw)]
    paths: list[Path | None] = [None] * len(metas)
    dtensors: dict[int, tuple[int, ...]] = {}
    tree = _decode_node(doc.get("tree"), (), paths, dtensors, 0)
    if any(p is None for p in paths):
        raise _bad("some tensors are not referenced by the tree")
    for i, global_shape in dtensors.items():
        if len(global_shape) != len(metas[i].shape):
            raise _bad(
                f"tensor {i}: DTensor global shape {list(global_shape)} and local shard shape "
                f"{list(metas[i].shape)} differ in dimensions"
            )
    try:
        layouts = decode_layouts(doc.get("meshes"), doc.get("layouts"), dtensors)
    except ValueError as exc:
        raise _bad(str(exc)) from exc
    used = [0] * len(sizes)
    for m in metas:
        if m.blob >= 0:
            used[m.blob] = max(used[m.blob], _end(m))
    for b, (size, end) in enumerate(zip(sizes, used, strict=True)):
        if not 0 < size <= end + 64:  # 64: alignment padding at most
            raise _bad(f"blob {b} has {size} bytes but its tensors use {end}")
    assert isinstance(step, int)
    return Skeleton(
        step, serial, tree, metas, [p for p in paths if p is not None], sizes, dtensors, layouts
    )


def _decode_meta(i: int, r: Any, sizes: list[int]) -> TensorMeta:
    if type(r) is not list or len(r) != 5:
        raise _bad(f"tensor {i}: expected [blob, offset, dtype, shape, stride], got {r!r:.200}")
    blob, offset, dtype_name, shape, stride = r
    dtype = _DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if not (_is_int(blob) and _is_int(offset) and dtype is not None):
        raise _bad(f"tensor {i}: malformed entry {r!r:.200}")
    if type(shape) is not list or type(stride) is not list or len(shape) != len(stride):
        raise _bad(f"tensor {i}: shape and stride must be lists of equal length")
    if not all(_is_int(x) and x >= 0 for x in shape + stride):
        raise _bad(f"tensor {i}: shape {shape} / stride {stride} must be non-negative ints")
    itemsize = dtype.itemsize
    if math.prod(shape) == 0:
        if blob != -1:
            raise _bad(f"tensor {i}: an empty tensor must have blob -1, got {blob}")
    else:
        if not 0 <= blob < len(sizes) or offset < 0 or offset % itemsize:
            raise _bad(f"tensor {i}: blob {blob} / offset {offset} out of range or misaligned")
        end = _end(TensorMeta(blob, offset, dtype, tuple(shape), tuple(stride)))
        if end > sizes[blob]:
            raise _bad(
                f"tensor {i}: needs bytes up to {end} of blob {blob}, which has {sizes[blob]}"
            )
    return TensorMeta(blob, offset, dtype, tuple(shape), tuple(stride))


def _end(m: TensorMeta) -> int:
    """One past the last byte of blob `m.blob` that tensor `m` uses (numel > 0)."""
    last = sum((n - 1) * s for n, s in zip(m.shape, m.stride, strict=True))
    return m.offset + (last + 1) * m.dtype.itemsize


def _decode_leaf(tag: str, val: Any) -> Any:
    if tag == "V" and type(val) in _SCALARS:
        return val
    if tag == "B" and type(val) is str:
        try:
            return bytes.fromhex(val)
        except ValueError as exc:
            raise _bad("bytes leaf is not hex") from exc
    if (
        tag == "C"
        and type(val) is list
        and len(val) == 2
        and all(type(x) in (int, float) for x in val)
    ):
        return complex(val[0], val[1])
    if tag == "Y" and type(val) is str and val in _DTYPES:
        return _DTYPES[val]
    if tag == "E" and type(val) is str and len(val) < 64:
        try:
            return torch.device(val)
        except RuntimeError as exc:
            raise _bad(f"bad device {val!r}") from exc
    raise _bad(f"unknown or malformed leaf [{tag!r}, {val!r:.100}]")


def _tensor_ref(val: Any, path: Path, paths: list[Path | None]) -> _TensorRef:
    if not _is_int(val) or not 0 <= val < len(paths) or paths[val] is not None:
        raise _bad(f"tensor reference {val!r} out of range [0, {len(paths)}) or repeated")
    paths[val] = path
    return _TensorRef(val)


def _decode_node(
    node: Any,
    path: Path,
    paths: list[Path | None],
    dtensors: dict[int, tuple[int, ...]],
    depth: int,
) -> Any:
    """Validate one node and return its decoded value; tensors stay as `_TensorRef` markers.

    Fills `paths` (tensor index → key path) and `dtensors` (index → global shape).
    """
    if depth > _MAX_DEPTH:
        raise _bad(f"tree nested deeper than {_MAX_DEPTH} levels")
    if type(node) is not list or len(node) != 2 or type(node[0]) is not str:
        raise _bad(f"malformed tree node {node!r:.200}")
    tag, val = node
    if tag == "T":
        return _tensor_ref(val, path, paths)
    if tag == "X":
        if type(val) is not list or len(val) != 2 or type(val[1]) is not list:
            raise _bad(f"DTensor node must hold [index, [global shape]], got {val!r:.200}")
        index, shape = val
        if len(shape) > _MAX_DIMS or not all(_is_int(x) and x >= 0 for x in shape):
            raise _bad(
                f"DTensor global shape must be at most {_MAX_DIMS} non-negative ints, "
                f"got {shape!r:.200}"
            )
        ref = _tensor_ref(index, path, paths)
        dtensors[ref.index] = tuple(shape)
        return ref
    if tag in ("D", "O"):
        if type(val) is not list:
            raise _bad(f"dict node must hold a list, got {type(val).__name__}")
        items = []
        for item in val:
            if (
                type(item) is not list
                or len(item) != 2
                or type(item[0]) is not list
                or len(item[0]) != 2
            ):
                raise _bad(f"malformed dict item {item!r:.200}")
            k = _decode_leaf(*item[0])
            items.append((k, _decode_node(item[1], (*path, k), paths, dtensors, depth + 1)))
        return dict(items) if tag == "D" else OrderedDict(items)
    if tag in ("L", "U"):
        if type(val) is not list:
            raise _bad(f"sequence node must hold a list, got {type(val).__name__}")
        seq = [_decode_node(v, (*path, i), paths, dtensors, depth + 1) for i, v in enumerate(val)]
        return seq if tag == "L" else tuple(seq)
    if tag == "S":
        if type(val) is not list or not all(_is_int(x) and x >= 0 for x in val):
            raise _bad("torch.Size node must hold non-negative ints")
        return torch.Size(val)
    return _decode_leaf(tag, val)


class _TensorRef:
    """Placeholder for tensor `index` in a decoded tree, replaced by `build_tree`."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def build_tree(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace the tensor placeholders of a decoded `tree` with `tensors`."""
    if type(tree) is _TensorRef:
        return tensors[tree.index]
    if type(tree) is dict:
        return {k: build_tree(v, tensors) for k, v in tree.items()}
    if type(tree) is OrderedDict:
        return OrderedDict((k, build_tree(v, tensors)) for k, v in tree.items())
    if type(tree) is list:
        return [build_tree(v, tensors) for v in tree]
    if type(tree) is tuple:
        return tuple(build_tree(v, tensors) for v in tree)
    return tree

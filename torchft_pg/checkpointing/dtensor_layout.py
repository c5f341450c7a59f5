"""A DTensor's layout on the wire (mesh, placements, global stride) and its rebuild.

The sender describes each DTensor's layout in plain JSON next to its local
shard; a receiver with no DTensor of its own at that path rebuilds one from
the description: the same device type, mesh ranks and dimension names, the
same placements, global shape and stride, on the receiver's own equivalent
process groups: the group of the sender's name (c10d's ``group_name``: ``"0"``
for the default group, a counter or a registered name) when the receiver has
it with the members the mesh needs there, else the receiver's group of exactly
those members (replica groups whose default group was made with ``_ranks``
name every group by a hash of global ranks, so no name matches across
groups). Nothing is unpickled and nothing of the sender's process is assumed
beyond the mesh's shape, ranks and dimension names: a mesh this process has no
groups for is a `RecoveryError` naming it.

A mesh sliced out of a bigger one by dimension names (``mesh["shard"]``) is
sent as that bigger mesh plus the names to slice, so the rebuilt mesh is the
same slice and compares equal to the receiver's own (``DeviceMesh.__eq__``
looks at the whole mesh a slice comes from); any other mesh (a flattened one
included) is sent as a whole. A layout that cannot be described (a mesh of
several dimensions without names, which ``DeviceMesh.from_group`` cannot
rebuild; a mesh without process groups; a placement other than Shard,
_StridedShard, Replicate or Partial with a c10d reduce op) is not sent: the
receiver then gets the plain local shard, as before layouts were sent.

A rank outside the mesh keeps the shard it was sent (``from_local`` would
leave such a rank an empty one), as a DTensor the sender held.

Wire form (validated by `decode_layouts`, which raises ValueError):

    meshes:  [[device_type, shape, ranks (row-major), dim_names | null,
               group names (one per dimension), slice dim_names | null], ...]
    layouts: [[tensor index, mesh index, placements, global stride], ...]
    placement: ["R"] | ["S", dim] | ["SS", dim, split_factor] | ["P", reduce_op]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchft_pg.errors import RecoveryError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

__all__ = [
    "DTensorLayout",
    "MeshSpec",
    "decode_layouts",
    "describe_layouts",
    "encode_layouts",
    "rebuild",
]

Placement = tuple[Any, ...]  # ("R",) | ("S", dim) | ("SS", dim, split_factor) | ("P", op)

_MAX_MESH_DIMS = 16
_MAX_MESH_RANKS = 1 << 20
_MAX_NAME = 256
_REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor"})


@dataclass(frozen=True)
class MeshSpec:
    """A DeviceMesh by value: `ranks` row-major in `shape`, one c10d group name
    per dimension; `slice_names` names the dimensions to slice out of it (None:
    the whole mesh)."""

    device_type: str
    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    dim_names: tuple[str, ...] | None
    groups: tuple[str, ...]
    slice_names: tuple[str, ...] | None = None

    def __str__(self) -> str:
        names = f" {list(self.dim_names)}" if self.dim_names else ""
        cut = f"[{', '.join(self.slice_names)}]" if self.slice_names else ""
        return (
            f"{self.device_type} mesh {list(self.shape)}{names} on groups {list(self.groups)}{cut}"
        )


@dataclass(frozen=True)
class DTensorLayout:
    """How one DTensor is laid out: its mesh, placements and global stride
    (its global shape travels in the skeleton's DTensor node)."""

    mesh: MeshSpec
    placements: tuple[Placement, ...]
    stride: tuple[int, ...]


# ---------------------------------------------------------------- sender side


def describe_layouts(
    tensors: list[torch.Tensor], dtensors: Mapping[int, Any]
) -> dict[int, DTensorLayout]:
    """The layout of each DTensor ``tensors[i]`` (`i` in `dtensors`) that can be described."""
    out: dict[int, DTensorLayout] = {}
    meshes: dict[int, MeshSpec | None] = {}  # id(mesh) → spec, once per mesh
    for i in dtensors:
        dt: DTensor = tensors[i]  # type: ignore[assignment]
        mesh = dt.device_mesh
        if id(mesh) not in meshes:
            meshes[id(mesh)] = _mesh_spec(mesh)
        spec = meshes[id(mesh)]
        placements = [_placement(p) for p in dt.placements]
        if spec is None or any(p is None for p in placements):
            continue
        stride = tuple(int(s) for s in dt.stride())
        out[i] = DTensorLayout(spec, tuple(p for p in placements if p is not None), stride)
    return out


def _mesh_spec(mesh: DeviceMesh) -> MeshSpec | None:
    """`mesh` as its root mesh plus the names to slice, if slicing them gives
    `mesh` back; else `mesh` as a whole; None if it has no process groups."""
    from torchft_pg._torch_internals import root_mesh

    try:
        root = root_mesh(mesh)
        names, root_names = mesh.mesh_dim_names, root.mesh_dim_names
        if (
            root is not mesh
            and names is not None
            and root_names is not None
            and set(names) <= set(root_names)  # not a flattened dimension: the receiver's
            and root[names] == mesh  # rebuilt root knows only the root's own names
        ):
            spec = _whole_mesh_spec(root)
            if spec is not None:
                return dataclasses.replace(spec, slice_names=tuple(names))
    except Exception:  # an unnamed or flattened slice: sent whole below
        pass
    return _whole_mesh_spec(mesh)


def _whole_mesh_spec(mesh: DeviceMesh) -> MeshSpec | None:
    if mesh.ndim > 1 and mesh.mesh_dim_names is None:
        return None  # DeviceMesh.from_group cannot rebuild it without names
    try:
        groups = tuple(mesh.get_group(d).group_name for d in range(mesh.ndim))
    except Exception:  # a mesh built without process groups
        return None
    ranks = mesh.mesh
    names = mesh.mesh_dim_names
    return MeshSpec(
        device_type=mesh.device_type,
        shape=tuple(int(n) for n in ranks.shape),
        ranks=tuple(int(r) for r in ranks.flatten().tolist()),
        dim_names=tuple(names) if names is not None else None,
        groups=groups,
    )


def _placement(p: Any) -> Placement | None:
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    from torchft_pg._torch_internals import strided_shard_type

    kind = type(p)
    if kind is Replicate:
        return ("R",)
    if kind is Shard:
        return ("S", int(p.dim))
    if kind is strided_shard_type():
        return ("SS", int(p.dim), int(p.split_factor))
    if kind is Partial and p.reduce_op in _REDUCE_OPS:
        return ("P", str(p.reduce_op))
    return None


def encode_layouts(layouts: Mapping[int, DTensorLayout]) -> tuple[list[Any], list[Any]]:
    """The JSON-ready ``meshes`` and ``layouts`` tables (see the module docstring)."""
    index: dict[MeshSpec, int] = {}
    meshes: list[Any] = []
    rows: list[Any] = []
    for i, lay in layouts.items():
        m = lay.mesh
        if m not in index:
            index[m] = len(meshes)
            meshes.append(
                [
                    m.device_type,
                    list(m.shape),
                    list(m.ranks),
                    list(m.dim_names) if m.dim_names is not None else None,
                    list(m.groups),
                    list(m.slice_names) if m.slice_names is not None else None,
                ]
            )
        rows.append([i, index[m], [list(p) for p in lay.placements], list(lay.stride)])
    return meshes, rows


# ---------------------------------------------------------------- validation


def _ints(x: Any, low: int = 0) -> bool:
    return type(x) is list and all(type(v) is int and v >= low for v in x)


def _names(x: Any) -> bool:
    return (
        type(x) is list
        and all(type(v) is str and 0 < len(v) <= _MAX_NAME for v in x)
        and len(set(x)) == len(x)
    )


def _decode_mesh(k: int, raw: Any) -> MeshSpec:
    if type(raw) is not list or len(raw) != 6:
        raise ValueError(f"mesh {k}: expected 6 fields, got {raw!r:.200}")
    device_type, shape, ranks, dim_names, groups, slice_names = raw
    if type(device_type) is not str or not _is_device_type(device_type):
        raise ValueError(f"mesh {k}: unknown device type {device_type!r:.50}")
    if not _ints(shape, 1) or len(shape) > _MAX_MESH_DIMS:
        raise ValueError(f"mesh {k}: shape must be at most {_MAX_MESH_DIMS} positive ints")
    if (
        not _ints(ranks)
        or len(ranks) > _MAX_MESH_RANKS
        or len(ranks) != math.prod(shape)
        or len(set(ranks)) != len(ranks)
    ):
        raise ValueError(
            f"mesh {k}: ranks must be {math.prod(shape)} distinct non-negative ints for shape "
            f"{shape}, got {ranks!r:.200}"
        )
    if dim_names is not None and (not _names(dim_names) or len(dim_names) != len(shape)):
        raise ValueError(f"mesh {k}: dim names must be {len(shape)} distinct names or null")
    if dim_names is None and len(shape) > 1:
        raise ValueError(f"mesh {k}: a mesh of {len(shape)} dimensions needs dim names")
    if type(groups) is not list or not all(
        type(g) is str and 0 < len(g) <= _MAX_NAME for g in groups
    ):
        raise ValueError(f"mesh {k}: process group names must be non-empty strings")
    if len(groups) != len(shape):
        raise ValueError(f"mesh {k}: expected {len(shape)} process group names, got {len(groups)}")
    if slice_names is not None and (
        dim_names is None or not _names(slice_names) or not set(slice_names) <= set(dim_names)
    ):
        raise ValueError(f"mesh {k}: slice names must name dimensions of the mesh")
    return MeshSpec(
        device_type,
        tuple(shape),
        tuple(ranks),
        tuple(dim_names) if dim_names is not None else None,
        tuple(groups),
        tuple(slice_names) if slice_names is not None else None,
    )


def _is_device_type(name: str) -> bool:
    if not 0 < len(name) <= 32:
        return False
    try:
        device = torch.device(name)
    except RuntimeError:
        return False
    return device.type == name and device.index is None


def _decode_placement(where: str, raw: Any, ndim: int) -> Placement:
    if type(raw) is not list or not raw:
        raise ValueError(f"{where}: unknown placement {raw!r:.100}")
    tag, args = raw[0], raw[1:]
    if tag == "R" and not args:
        return ("R",)
    if tag in ("S", "SS") and len(args) == (1 if tag == "S" else 2) and _ints(args):
        if args[0] >= ndim:
            raise ValueError(f"{where}: Shard({args[0]}) of a {ndim}-dimensional tensor")
        if tag == "SS" and args[1] < 1:
            raise ValueError(f"{where}: split factor must be positive, got {args[1]}")
        return (tag, *args)
    if tag == "P" and len(args) == 1 and args[0] in _REDUCE_OPS:
        return ("P", args[0])
    raise ValueError(f"{where}: unknown placement {raw!r:.100}")


def decode_layouts(
    meshes_doc: Any, layouts_doc: Any, dtensors: Mapping[int, tuple[int, ...]]
) -> dict[int, DTensorLayout]:
    """Validate a peer's ``meshes`` and ``layouts`` tables (None: absent).

    `dtensors` maps each DTensor's tensor index to its global shape. Raises
    ValueError naming the bad entry.
    """
    if meshes_doc is None and layouts_doc is None:
        return {}
    if type(meshes_doc) is not list or type(layouts_doc) is not list:
        raise ValueError("meshes and layouts must be lists")
    meshes = [_decode_mesh(k, m) for k, m in enumerate(meshes_doc)]
    out: dict[int, DTensorLayout] = {}
    for raw in layouts_doc:
        if type(raw) is not list or len(raw) != 4:
            raise ValueError(
                f"layout entry must be [index, mesh, placements, stride], got {raw!r:.200}"
            )
        i, k, placements, stride = raw
        if type(i) is not int or i not in dtensors or i in out:
            raise ValueError(f"layout for tensor {i!r:.20}, which is not a DTensor or is repeated")
        if type(k) is not int or not 0 <= k < len(meshes):
            raise ValueError(
                f"layout of tensor {i}: mesh {k!r:.20} out of range [0, {len(meshes)})"
            )
        shape = dtensors[i]
        mesh = meshes[k]
        ndim = len(mesh.slice_names) if mesh.slice_names is not None else len(mesh.shape)
        if type(placements) is not list or len(placements) != ndim:
            got = len(placements) if type(placements) is list else placements
            raise ValueError(
                f"layout of tensor {i}: expected {ndim} placements for a {ndim}-dimensional "
                f"mesh, got {got!r:.50}"
            )
        where = f"layout of tensor {i}"
        decoded = tuple(_decode_placement(where, p, len(shape)) for p in placements)
        if not _ints(stride) or len(stride) != len(shape):
            raise ValueError(
                f"{where}: global stride {stride!r:.100} must be {len(shape)} non-negative ints"
            )
        out[i] = DTensorLayout(mesh, decoded, tuple(stride))
    return out


# ---------------------------------------------------------------- receiver side


def rebuild(
    local: torch.Tensor,
    global_shape: tuple[int, ...],
    layout: DTensorLayout,
    path: Any,
    meshes: dict[MeshSpec, DeviceMesh],
) -> torch.Tensor:
    """`local` as a DTensor laid out as `layout` (no copy on the mesh's device type).

    `meshes` caches the meshes built so far, so DTensors of one sender mesh
    share one receiver mesh. `RecoveryError` naming `path` if the mesh cannot
    be built here.
    """
    from torch.distributed.tensor import DTensor

    from torchft_pg._torch_internals import dtensor_like

    try:
        mesh = meshes.get(layout.mesh)
        if mesh is None:
            mesh = meshes[layout.mesh] = _build_mesh(layout.mesh)
        dt = DTensor.from_local(
            local,
            mesh,
            [_to_placement(p) for p in layout.placements],
            run_check=False,
            shape=torch.Size(global_shape),
            stride=layout.stride,
        )
        if mesh.get_coordinate() is None:
            # This rank is not in the mesh: from_local left an empty shard, but the
            # sender's DTensor held one (as torch leaves a non-member's): keep it.
            dt = dtensor_like(local, dt)
        return dt
    except RecoveryError as exc:
        raise RecoveryError(f"DTensor at {path!r}: {exc}") from exc
    except (RuntimeError, ValueError, TypeError, AssertionError, KeyError) as exc:
        raise RecoveryError(
            f"DTensor at {path!r}: cannot rebuild it on the sender's {layout.mesh}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _build_mesh(spec: MeshSpec) -> DeviceMesh:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if not dist.is_initialized():
        raise RecoveryError(
            f"its {spec} needs torch.distributed initialized in this process; "
            "pass a state_dict template holding a DTensor there to receive into it"
        )
    ranks = torch.tensor(spec.ranks, dtype=torch.int, device="cpu").reshape(spec.shape)
    if not spec.groups:  # no dimensions: no process group to find
        return DeviceMesh(spec.device_type, ranks)
    groups = [_group(name, d, spec) for d, name in enumerate(spec.groups)]
    mesh = DeviceMesh.from_group(
        groups[0] if len(groups) == 1 else groups,  # one group: its ranks are checked
        spec.device_type,
        mesh=ranks,
        mesh_dim_names=spec.dim_names,  # decode_layouts: never None for several groups
    )
    return mesh[spec.slice_names] if spec.slice_names is not None else mesh


def _group(name: str, dim: int, spec: MeshSpec) -> Any:
    """This process's group for dimension `dim` of `spec`: the group of the
    sender's name if it has the members this rank's coordinate needs along
    `dim`, else the group of this process that has exactly those members.

    Replica groups whose default group was created with ``_ranks`` (as
    torchtitan's trainer does) name their groups by a hash of their global
    ranks, so the sender's names never exist in the receiver; the receiver's
    own mesh over the same (group-local) ranks is the equivalent one.
    """
    from torchft_pg._torch_internals import resolve_group

    members = _members_along(spec, dim)
    group = resolve_group(name)
    if group is not None and (members is None or _ranks_of(group) == members):
        return group
    equivalent = _group_with_members(members, spec, dim) if members is not None else None
    if equivalent is not None:
        return equivalent
    raise RecoveryError(
        f"its {spec} uses process group {name!r} for dimension {dim}, which this process "
        f"does not have, nor another group of the ranks {members} it needs there; build the "
        "same mesh before receiving, or pass a state_dict template holding a DTensor there "
        "to receive into it"
    )


def _members_along(spec: MeshSpec, dim: int) -> list[int] | None:
    """The ranks of `spec`'s dimension `dim` through this rank's coordinate (None
    if this rank is not in the mesh)."""
    import torch.distributed as dist

    ranks = torch.tensor(spec.ranks).reshape(spec.shape)
    where = (ranks == dist.get_rank()).nonzero()
    if where.numel() == 0:
        return None
    index: list[Any] = [int(i) for i in where[0]]
    index[dim] = slice(None)
    return [int(r) for r in ranks[tuple(index)].tolist()]


def _ranks_of(group: Any) -> list[int] | None:
    import torch.distributed as dist

    try:
        return [int(r) for r in dist.get_process_group_ranks(group)]
    except (RuntimeError, ValueError):
        return None


def _group_with_members(members: list[int], spec: MeshSpec, dim: int) -> Any:
    """A group of this process created by c10d (never a fault-tolerant one, which
    spans replica groups) whose ranks, in group-rank order, are `members`;
    preferring the one DeviceMesh made for this dimension's name."""
    from torchft_pg._torch_internals import c10d_groups, is_ours

    candidates = [g for g in c10d_groups() if not is_ours(g) and _ranks_of(g) == members]
    if not candidates:
        return None
    if spec.dim_names is not None:
        desc = f"mesh_{spec.dim_names[dim]}"
        for g in candidates:
            if getattr(g, "group_desc", None) == desc:
                return g
    return candidates[0]


def _to_placement(p: Placement) -> Any:
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    from torchft_pg._torch_internals import strided_shard_type

    if p[0] == "R":
        return Replicate()
    if p[0] == "S":
        return Shard(p[1])
    if p[0] == "SS":
        return strided_shard_type()(p[1], split_factor=p[2])
    return Partial(p[1])

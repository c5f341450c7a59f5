"""DeviceMesh helpers: put a reconfigurable process group in a mesh dimension.

c10d sees our group as size 1 (its membership changes at run time), so the
new dimension has size 1 in the mesh; collectives over it run on our group
across however many replicas are live. This is how hybrid sharding (HSDP)
gets a fault-tolerant replicate dimension.

HSDP design (`ft_init_device_mesh`): the mesh is a plain torch ``DeviceMesh``
whose replicate dimension is a `ManagedProcessGroup` over the Manager's
cross-replica group (inserted by `extend_device_mesh`), and whose other
dimensions are ordinary c10d groups inside the replica group. FSDP2 is used
unchanged: ``fully_shard(module, mesh=mesh)`` reduce-scatters gradients over
the shard dimension and then all-reduces them over the replicate dimension,
which lands in ``manager.allreduce``: averaged over the live participants,
zeros from a healing replica, never raising (a failure turns the step's commit
vote into no). We chose this over torchft's present way (FSDP over the shard
mesh plus ``FSDPModule.set_all_reduce_hook``) after measuring both with torch
2.13 on Gloo, 2 replica groups x 2 ranks: both gave bit-identical losses and
parameters to each other in every case we ran (one module, nested modules,
gradient accumulation, bf16 parameters, a replica group dying mid-run), and
tests/integration/test_hsdp.py checks this path against a single-process
reference. But the hook must be installed on every ``FSDPModule`` (forget one
and that module's replicas silently drift apart), is refused with
per-parameter meshes, and runs even under ``set_requires_all_reduce(False)``. Unlike torchft's old
``ManagedDeviceMesh`` nothing here subclasses or patches DeviceMesh: the mesh
comes from the public ``DeviceMesh.from_group``.

What the size-1 replicate dimension means for callers:
- ``mesh.size(replicate_name)`` and ``mesh.shape`` report 1 for it; the live
  number of replica groups is ``manager.num_participants()`` (FSDP itself asks
  the group, whose ``size()`` is live, so its gradient scaling is right).
- Flattening the replicate dimension together with others (``_flatten``,
  torchtitan's "dp") is not supported: c10d knows only this replica group's
  ranks for that dimension.
- Sharded state dicts hold DTensors; heal them with
  `torchft_pg.sharded_state.sharded_state_dict_fns` (received into the
  model's own shards). All replica groups must use the same mesh shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.process_group.failure_wrappers import ManagedProcessGroup, ManagerLike

__all__ = ["extend_device_mesh", "ft_init_device_mesh"]


def extend_device_mesh(
    mesh: DeviceMesh, pg: ProcessGroup, name: str = "dp", dim: int = 0
) -> DeviceMesh:
    """Return a mesh like `mesh` with `pg` inserted as dimension `dim`, named `name`.

    `pg` is registered with c10d under `name` if it is not yet (see
    `ProcessGroup.register`); `mesh` must have named dimensions.
    """
    if not isinstance(pg, ProcessGroup):
        raise TypeError(f"pg must be a torchft_pg ProcessGroup, got {type(pg).__name__}")
    names = mesh.mesh_dim_names
    if names is None:
        raise ValueError("extend_device_mesh needs a mesh with mesh_dim_names")
    if name in names:
        raise ValueError(f"mesh already has a dimension named {name!r}: {names}")
    if not 0 <= dim <= mesh.ndim:
        raise ValueError(f"dim must be in [0, {mesh.ndim}], got {dim}")
    if pg._registered is None:
        pg.register(name)
    groups = [mesh.get_group(i) for i in range(mesh.ndim)]
    groups.insert(dim, pg)
    new_names = list(names)
    new_names.insert(dim, name)
    return DeviceMesh.from_group(
        groups,
        device_type=mesh.device_type,
        mesh=mesh.mesh.unsqueeze(dim),
        mesh_dim_names=tuple(new_names),
    )


def ft_init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int],
    mesh_dim_names: Sequence[str],
    replicate_dim: int,
    manager: ManagerLike,
) -> DeviceMesh:
    """A DeviceMesh for HSDP whose dimension `replicate_dim` spans the live replica groups.

    The other dimensions are built with ``init_device_mesh`` over this replica
    group (their sizes must multiply to its world size; the default process
    group is initialized from the environment if it is not yet). The
    replicate dimension is ``ManagedProcessGroup(manager)``, registered with
    c10d under ``mesh_dim_names[replicate_dim]``; its entry in `mesh_shape`
    is not used (membership changes at run time) and it has size 1 in the
    returned mesh. FSDP2 needs the replicate dimension first:
    ``fully_shard(model, mesh=mesh)`` for a 2-D mesh, or the
    ``mesh["dp_replicate", "dp_shard"]`` slice when there are more dimensions.
    See the module docstring for the design and its consequences.
    """
    shape, names = tuple(mesh_shape), tuple(mesh_dim_names)
    if len(shape) != len(names):
        raise ValueError(
            f"mesh_shape and mesh_dim_names must have the same length, got {shape} and {names}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"mesh_dim_names must be unique, got {names}")
    if isinstance(replicate_dim, bool) or not isinstance(replicate_dim, int):
        raise TypeError(f"replicate_dim must be an int, got {replicate_dim!r}")
    if not 0 <= replicate_dim < len(shape):
        raise ValueError(f"replicate_dim must be in [0, {len(shape)}), got {replicate_dim}")
    if len(shape) == 1:
        raise ValueError(
            f"mesh_shape {shape} has only the replicate dimension; for pure data "
            "parallelism across replica groups use torchft_pg.ddp.DistributedDataParallel"
        )
    inner_shape = shape[:replicate_dim] + shape[replicate_dim + 1 :]
    inner_names = names[:replicate_dim] + names[replicate_dim + 1 :]
    for n, size in zip(inner_names, inner_shape, strict=True):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh dimension {n!r} must have a positive int size, got {size!r}")
    inner = init_device_mesh(device_type, inner_shape, mesh_dim_names=inner_names)
    return extend_device_mesh(
        inner, ManagedProcessGroup(manager), name=names[replicate_dim], dim=replicate_dim
    )

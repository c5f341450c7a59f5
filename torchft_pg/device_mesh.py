"""DeviceMesh helpers: put a reconfigurable process group in a mesh dimension.

c10d sees our group as size 1 (its membership changes at run time), so the
new dimension has size 1 in the mesh; collectives over it run on our group
across however many replicas are live. This is how hybrid sharding (HSDP)
gets a fault-tolerant replicate dimension.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from torchft_pg.process_group.base import ProcessGroup

__all__ = ["extend_device_mesh"]


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

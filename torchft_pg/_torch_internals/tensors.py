"""Private torch names read about tensors: shared-memory storages, DTensors, meshes.

The DTensor modules are imported by the functions that need them, not here:
a process group (a Baby group's child included) must not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchft_pg._torch_internals.names import PrivateName

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

__all__ = [
    "RELIED_ON",
    "dtensor_like",
    "root_mesh",
    "share_storage_fd",
    "storage_from_fd",
    "strided_shard_type",
]

RELIED_ON: tuple[PrivateName, ...] = (
    PrivateName(
        owner="torch.UntypedStorage",
        name="_share_fd_cpu_",
        use="the file descriptor of a shared CPU storage, sent to a Baby child (share_storage_fd)",
    ),
    PrivateName(
        owner="torch.UntypedStorage",
        name="_new_shared_fd_cpu",
        use="a storage over a file descriptor received from the parent (storage_from_fd)",
    ),
    PrivateName(
        owner="torch.distributed.device_mesh.DeviceMesh",
        name="_get_root_mesh",
        use="the mesh a slice was cut from, sent with a DTensor's layout (root_mesh)",
    ),
    PrivateName(
        owner="torch.distributed.tensor.DTensor",
        name="_spec",
        use="a DTensor's layout, to wrap another local shard in it (dtensor_like)",
    ),
    PrivateName(
        owner="torch.distributed.tensor.placement_types",
        name="_StridedShard",
        use="the placement FSDP2 gives a parameter sharded twice (strided_shard_type)",
    ),
)


def share_storage_fd(storage: torch.UntypedStorage) -> tuple[int, int]:
    """The file descriptor and byte size of a CPU `storage` in shared memory
    (``UntypedStorage._share_fd_cpu_``): what another process maps to see it."""
    fd, size = storage._share_fd_cpu_()  # type: ignore[attr-defined, unused-ignore]
    return int(fd), int(size)


def storage_from_fd(fd: int, size: int) -> torch.UntypedStorage:
    """A CPU storage of `size` bytes over the shared memory of `fd`
    (``UntypedStorage._new_shared_fd_cpu``); it takes ownership of `fd`."""
    storage: torch.UntypedStorage = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
    return storage


def root_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh `mesh` was sliced from, or `mesh` itself (``DeviceMesh._get_root_mesh``)."""
    root: DeviceMesh = mesh._get_root_mesh()
    return root


def dtensor_like(local: torch.Tensor, template: DTensor) -> DTensor:
    """`local` as a DTensor with `template`'s mesh, placements and global shape
    (``DTensor._spec``), without a gradient and without any check or copy.

    Unlike ``DTensor.from_local`` it keeps `local` on a rank outside the mesh,
    where ``from_local`` would leave an empty shard.
    """
    from torch.distributed.tensor import DTensor

    return DTensor(local, template._spec, requires_grad=False)  # type: ignore[call-arg, no-untyped-call, unused-ignore]


def strided_shard_type() -> type[Any]:
    """The placement class ``_StridedShard``: a dimension sharded in strides (FSDP2
    over a dimension another parallelism already shards)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard

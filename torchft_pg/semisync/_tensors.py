"""Tensor helpers shared by LocalSGD and DiLoCo: local shards and flat buckets.

A parameter may be a DTensor (FSDP2 inside a replica group): the replica
groups then exchange only the local shard, which is the same shard on the
same group rank of every replica group. DTensors are recognised without
importing ``torch.distributed.tensor`` (which takes seconds): if that module
was never imported, no tensor can be a DTensor.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["Bucket", "as_dtensor", "extract_local_tensor", "like_param", "local_view", "pack"]


def as_dtensor(t: Any) -> DTensor | None:
    """`t` if it is a DTensor, else None."""
    module = sys.modules.get("torch.distributed.tensor")
    cls = getattr(module, "DTensor", None)
    return cast("DTensor", t) if isinstance(cls, type) and isinstance(t, cls) else None


def local_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds this rank's values of `t` (no copy):
    its local shard for a DTensor, `t` itself otherwise. Writing into it
    under ``torch.no_grad()`` writes into `t`."""
    dt = as_dtensor(t)
    return dt.to_local() if dt is not None else t


def extract_local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of this rank's values of `t` (the local shard of a
    DTensor), with no gradient."""
    with torch.no_grad():
        copy = local_view(t).detach().clone()
    copy.grad = None
    return copy


def like_param(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (this rank's values) shaped as `param`: a DTensor with the same
    mesh, placements, shape and stride when `param` is one, else `local`."""
    dt = as_dtensor(param)
    if dt is None:
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local, dt.device_mesh, dt.placements, shape=dt.shape, stride=dt.stride()
    )


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """One flat buffer holding several tensors end to end, in order."""

    buffer: torch.Tensor
    tensors: tuple[torch.Tensor, ...]

    def unpack(self) -> None:
        """Copy the buffer's (reduced) values back into the tensors."""
        offset = 0
        for t in self.tensors:
            n = t.numel()
            t.copy_(self.buffer[offset : offset + n].view_as(t))
            offset += n


def pack(tensors: Sequence[torch.Tensor], cap_bytes: int) -> list[Bucket]:
    """Pack `tensors` into flat buckets of at most `cap_bytes` bytes each.

    Tensors keep their order; a bucket holds one dtype on one device, and a
    tensor larger than `cap_bytes` gets a bucket of its own.
    """
    if cap_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {cap_bytes}")
    buckets: list[Bucket] = []
    current: list[torch.Tensor] = []
    size = 0

    def close() -> None:
        if current:
            flat = torch.cat([t.reshape(-1) for t in current])
            buckets.append(Bucket(buffer=flat, tensors=tuple(current)))
            current.clear()

    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if current and (
            size + nbytes > cap_bytes
            or t.dtype != current[0].dtype
            or t.device != current[0].device
        ):
            close()
            size = 0
        current.append(t)
        size += nbytes
    close()
    return buckets

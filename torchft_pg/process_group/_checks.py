"""Argument checks shared by the collectives: clear errors naming the bad value.

Each check is a few length comparisons, cheap enough for every call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed import AllreduceOptions, ReduceOp


def allreduce_options(opts: AllreduceOptions | ReduceOp | ReduceOp.RedOpType) -> AllreduceOptions:
    """Accept c10d options or a bare ReduceOp, as torch's own PGs do."""
    if isinstance(opts, AllreduceOptions):
        return opts
    if isinstance(opts, (ReduceOp, ReduceOp.RedOpType)):
        out = AllreduceOptions()
        out.reduceOp = opts if isinstance(opts, ReduceOp) else ReduceOp(opts)
        return out
    raise TypeError(f"allreduce opts must be AllreduceOptions or ReduceOp, got {opts!r}")


def tensor_list(op: str, name: str, tensors: object, length: int | None = None) -> None:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: {name} must be a list of tensors, got {type(tensors).__name__}")
    if length is None and len(tensors) == 0:
        raise ValueError(f"{op}: {name} must not be empty")
    if length is not None and len(tensors) != length:
        raise ValueError(f"{op}: {name} must hold {length} tensors, got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name}[{i}] must be a tensor, got {type(t).__name__}")


def nested_lists(op: str, name: str, lists: object, outer: int, inner: int) -> None:
    """`lists` is `outer` lists of `inner` tensors each (allgather / reduce_scatter)."""
    if not isinstance(lists, (list, tuple)) or len(lists) != outer:
        got = len(lists) if isinstance(lists, (list, tuple)) else type(lists).__name__
        raise ValueError(f"{op}: {name} must hold {outer} list(s), got {got}")
    for i, inner_list in enumerate(lists):
        tensor_list(op, f"{name}[{i}]", inner_list, inner)


def peer_rank(op: str, name: str, peer: int, rank: int, world_size: int) -> None:
    if not 0 <= peer < world_size:
        raise ValueError(f"{op}: {name} must be in [0, {world_size}), got {peer}")
    if peer == rank:
        raise ValueError(f"{op}: {name} must differ from this rank ({rank}), got {peer}")


def root_rank(op: str, root: int, world_size: int) -> None:
    if not 0 <= root < world_size:
        raise ValueError(f"{op}: root rank must be in [0, {world_size}), got {root}")


def split_sizes(
    op: str, name: str, sizes: Sequence[int], tensor: torch.Tensor, world_size: int
) -> None:
    if len(sizes) == 0:
        if tensor.dim() == 0 or tensor.size(0) % world_size != 0:
            raise ValueError(
                f"{op}: {name} dim 0 ({tensor.shape}) must divide evenly by world size {world_size}"
            )
        return
    if len(sizes) != world_size:
        raise ValueError(f"{op}: {name} must have {world_size} entries, got {len(sizes)}")
    if sum(sizes) != tensor.size(0):
        raise ValueError(
            f"{op}: {name} sum to {sum(sizes)} but the tensor has {tensor.size(0)} rows"
        )


def gathered_tensor(op: str, whole: torch.Tensor, part: torch.Tensor, world_size: int) -> None:
    """`whole` holds `world_size` copies of `part`'s shape (all_gather/reduce_scatter single)."""
    for name, t in (("whole", whole), ("part", part)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: the {name} tensor must be a tensor, got {type(t).__name__}")
    if whole.numel() != part.numel() * world_size:
        raise ValueError(
            f"{op}: the gathered tensor must have world size ({world_size}) x "
            f"{part.numel()} = {part.numel() * world_size} elements, got {whole.numel()} "
            f"(shape {tuple(whole.shape)})"
        )

"""Heal sharded (DTensor) state: local shards travel as plain tensors.

An FSDP2 module's parameters and its optimizer's state are DTensors. The heal
transports could carry them as DTensors (each rebuilt on the receiver from
its described layout, see `torchft_pg.checkpointing`); these functions send
plain local shards instead and copy them into the receiver's own shards, so
the load never depends on the sender's process group names. Replica groups
shard identically (same mesh, same module), and group rank r of a healing
replica receives from group rank r of its source, so each rank sends its
local shards; the receiver copies them into its own shards and rebuilds the
optimizer's DTensors with its own mesh and placements. No collective runs:
save and load are local to the rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import DTensor

__all__ = ["ShardedStateFns", "sharded_state_dict_fns", "to_local_tree"]


def to_local_tree(tree: Any) -> Any:
    """`tree` with every DTensor replaced by its local tensor (a view, no copy)."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return type(tree)((k, to_local_tree(v)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_local_tree(v) for v in tree)
    return tree


def _like(template: DTensor, local: Any, where: str) -> DTensor:
    """`local` as a DTensor with `template`'s mesh, placements and global shape."""
    if not isinstance(local, torch.Tensor):
        raise TypeError(f"{where}: expected a tensor (a local shard), got {type(local).__name__}")
    expected = tuple(template.to_local().shape)
    if tuple(local.shape) != expected:
        raise ValueError(
            f"{where}: local shard shape {expected} expected, got {tuple(local.shape)}; "
            "do all replica groups use the same mesh and module?"
        )
    return DTensor.from_local(
        local,
        template.device_mesh,
        template.placements,
        run_check=False,
        shape=template.shape,
        stride=template.stride(),
    )


def _optimizer_state(optimizer: torch.optim.Optimizer, received: dict[str, Any]) -> dict[str, Any]:
    """Rebuild DTensors in a received optimizer state dict from the parameters.

    A state tensor shaped like its parameter's local shard (momentum, Adam's
    moments) becomes a DTensor like the parameter; others (Adam's 0-d
    ``step``) stay plain, as torch's optimizers keep them.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[Any, Any] = {}
    for index, entry in received.get("state", {}).items():
        if not 0 <= int(index) < len(params):
            raise KeyError(f"optimizer state for parameter {index}, but it has {len(params)}")
        param = params[int(index)]
        rebuilt = dict(entry)
        if isinstance(param, DTensor):
            local_shape = tuple(param.to_local().shape)
            for name, value in entry.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and tuple(value.shape) == local_shape
                ):
                    rebuilt[name] = _like(param, value, f"optimizer state {index}/{name!r}")
        state[index] = rebuilt
    return {**received, "state": state}


class ShardedStateFns(NamedTuple):
    """(load, save) in `Manager.register_state_dict_fn`'s argument order."""

    load: Callable[[Any], None]
    save: Callable[[], Any]


def sharded_state_dict_fns(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> ShardedStateFns:
    """Load/save functions that heal an FSDP2 `model` (and `optimizer`) shard by shard.

    Call it after ``fully_shard``, then
    ``manager.register_state_dict_fn("train", *sharded_state_dict_fns(model, opt))``.
    Save returns ``{"model": {name: local shard}, "optimizer": ...}``; load
    copies the model's shards in place and rebuilds the optimizer's DTensors
    from this rank's own parameters. Plain (unsharded) tensors pass through.

    The parameters and buffers are captured here, as the optimizer captures
    its parameters: the Manager calls save on its quorum thread while forward
    and backward run, when ``model.state_dict()`` or ``named_parameters()``
    would race with FSDP2 swapping in (and freeing) unsharded parameters.
    """
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def save() -> dict[str, Any]:
        out: dict[str, Any] = {"model": {k: _local(t) for k, t in tensors.items()}}
        if optimizer is not None:
            out["optimizer"] = to_local_tree(optimizer.state_dict())
        return out

    def load(state: dict[str, Any]) -> None:
        _copy_model_state(tensors, state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(_optimizer_state(optimizer, state["optimizer"]))

    return ShardedStateFns(load, save)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def _copy_model_state(tensors: dict[str, torch.Tensor], received: dict[str, Any]) -> None:
    """Copy received local shards into the model's own, after checking every shape."""
    missing, unexpected = set(tensors) - set(received), set(received) - set(tensors)
    if missing or unexpected:
        raise KeyError(
            f"received model state does not match the module: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    pairs = []
    for name, t in tensors.items():
        dst, src = _local(t), received[name]
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"model state {name!r}: expected a tensor, got {type(src).__name__}")
        if src.shape != dst.shape:
            raise ValueError(
                f"model state {name!r}: local shard shape {tuple(dst.shape)} expected, got "
                f"{tuple(src.shape)}; do all replica groups use the same mesh and module?"
            )
        pairs.append((dst, src))
    for dst, src in pairs:
        dst.copy_(src)

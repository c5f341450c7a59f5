"""The DiLoCo side of the reference workload: settings, fragments, outer optimizers, digests.

Shared by the DiLoCo trainer (`diloco_trainer.py`) and its replay
(`diloco_oracle.py`), as `workload.py` is by the DDP ones, so both build the
same fragments and outer optimizers and digest the same state.

The replicated state of a DiLoCo job is its *global* state: each fragment's
global parameters (the backup DiLoCo keeps, the last synced values) and its
outer optimizer, SGD with Nesterov momentum as torchft's users run it. SGD
keeps no step count, so each outer optimizer's parameter group carries one
(`OUTER_STEPS_KEY`, raised by a step hook): it travels in the optimizer's
state dict, so heals carry it, and a lost or doubled outer step shows in the
count and in the digest. The model's parameters and the inner optimizer's
state are each replica's own between syncs (every replica trains on its own
data), so they are not compared across replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from tests.chaos_support.workload import FlatState, flat_state, state_checksum

__all__ = [
    "OUTER_STEPS_KEY",
    "Algorithm",
    "DiLoCoSettings",
    "diloco_flat_state",
    "fragment_modules",
    "global_digest",
    "global_flat_state",
    "outer_optimizers",
    "outer_steps",
]

#: The outer optimizer's parameter-group entry counting the outer steps it took.
OUTER_STEPS_KEY = "chaos_outer_steps"


class Algorithm(str, Enum):
    """How each replica group trains: gradients averaged every step, or DiLoCo."""

    DDP = "ddp"
    DILOCO = "diloco"


@dataclass(frozen=True, kw_only=True)
class DiLoCoSettings:
    """DiLoCo's schedule for the reference workload (a two-layer MLP).

    `sync_every`: inner steps between two syncs of one fragment; `fragments`:
    1 (the whole model) or 2 (one per linear layer), syncing in turn, one
    every ``sync_every / fragments`` inner steps; `fragment_sync_delay`: inner
    steps a sync's allreduce starts before its sync point. The outer optimizer
    is SGD with `outer_lr` and Nesterov momentum `outer_momentum`.
    """

    sync_every: int = 4
    fragments: int = 1
    fragment_sync_delay: int = 0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.fragments not in (1, 2):
            raise ValueError(
                f"fragments must be 1 or 2 (the workload has two linear layers), got {self.fragments!r}"
            )
        if (
            isinstance(self.sync_every, bool)
            or not isinstance(self.sync_every, int)
            or self.sync_every < self.fragments
            or self.sync_every % self.fragments
        ):
            raise ValueError(
                f"sync_every must be a positive multiple of fragments ({self.fragments}), "
                f"got {self.sync_every!r}"
            )
        if not 0 <= self.fragment_sync_delay < self.interval:
            raise ValueError(
                f"fragment_sync_delay must be in [0, sync_every / fragments = {self.interval}), "
                f"got {self.fragment_sync_delay!r}"
            )

    @property
    def interval(self) -> int:
        """Inner steps between two fragment syncs (any fragment)."""
        return self.sync_every // self.fragments


def fragment_modules(model: torch.nn.Module, fragments: int) -> list[torch.nn.Module]:
    """The workload model's fragments: the whole model, or its two linear layers."""
    if fragments == 1:
        return [model]
    if not isinstance(model, torch.nn.Sequential) or len(model) != 3:
        raise ValueError(f"expected the workload's Linear-ReLU-Linear model, got {model}")
    return [model[0], model[2]]


def _count_outer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    optimizer.param_groups[0][OUTER_STEPS_KEY] += 1


def outer_optimizers(
    fragments: Sequence[torch.nn.Module], settings: DiLoCoSettings
) -> list[torch.optim.Optimizer]:
    """One outer optimizer per fragment, each counting its steps (`OUTER_STEPS_KEY`)."""
    outers: list[torch.optim.Optimizer] = []
    for fragment in fragments:
        outer = torch.optim.SGD(
            fragment.parameters(),
            lr=settings.outer_lr,
            momentum=settings.outer_momentum,
            nesterov=True,
        )
        outer.param_groups[0][OUTER_STEPS_KEY] = 0
        outer.register_step_post_hook(_count_outer_step)
        outers.append(outer)
    return outers


def outer_steps(outers: Sequence[torch.optim.Optimizer]) -> int:
    """Outer steps taken, over every fragment's outer optimizer."""
    return sum(int(o.param_groups[0][OUTER_STEPS_KEY]) for o in outers)


def global_digest(
    backups: Sequence[Mapping[str, torch.Tensor]], outers: Sequence[torch.optim.Optimizer]
) -> str:
    """The digest of the global state: every fragment's backup and outer optimizer state.

    Hyper-parameters are left out (a heal's JSON skeleton may hand back
    ``0`` as ``0.0``); the outer step count is in.
    """
    return state_checksum(
        [dict(b) for b in backups],
        [o.state_dict()["state"] for o in outers],
        [int(o.param_groups[0][OUTER_STEPS_KEY]) for o in outers],
    )


def global_flat_state(
    backups: Sequence[Mapping[str, torch.Tensor]], outers: Sequence[torch.optim.Optimizer]
) -> FlatState:
    """The global state as flat floats: ``global.<fragment>.<parameter>``,
    ``outer.<fragment>.<index>.<key>`` and ``outer.<fragment>.steps``."""
    out: FlatState = {}
    for f, backup in enumerate(backups):
        for name, t in backup.items():
            out[f"global.{f}.{name}"] = t.detach().reshape(-1).tolist()
    for f, outer in enumerate(outers):
        for index, state in outer.state_dict()["state"].items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    out[f"outer.{f}.{index}.{key}"] = value.detach().reshape(-1).tolist()
        out[f"outer.{f}.steps"] = [float(outer.param_groups[0][OUTER_STEPS_KEY])]
    return out


def diloco_flat_state(
    model: torch.nn.Module,
    inner: torch.optim.Optimizer,
    backups: Sequence[Mapping[str, torch.Tensor]],
    outers: Sequence[torch.optim.Optimizer],
) -> FlatState:
    """A replica's whole state: its own (model, inner optimizer) and the global one."""
    return {**flat_state(model, inner), **global_flat_state(backups, outers)}

"""The reference workload: model, optimizer, data and state digests, shared by trainer and oracle.

Everything here is a function of a `Workload` (and, for data, of the replica
and the step the batch is drawn for), so the oracle rebuilds in one process
exactly what every replica computed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "REDUCE_DTYPE",
    "FlatState",
    "Workload",
    "flat_state",
    "state_checksum",
    "state_tensors",
]

#: The dtype the replicas' DDP reduces gradients in. The sum of a few float32
#: gradients in float64 is exact in any order, so the average is bit-identical
#: whatever order a quorum's ring adds in, and the oracle's replay can follow
#: the replicas bit for bit. With float32 sums the replay would drift: this
#: workload (Adam near a zero-loss minimum) amplifies a last-bit difference to
#: a visibly different state within a few hundred steps.
REDUCE_DTYPE = torch.float64

#: A model's and optimizer's state as flat lists of floats, keyed
#: ``model.<parameter>`` and ``optim.<parameter index>.<key>`` (plain data: it
#: crosses the chaos event pipe).
FlatState = dict[str, list[float]]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A small MLP regressing the sum of its inputs, trained with Adam."""

    seed: int = 0
    hidden: int = 64
    lr: float = 1e-2
    features: int = 16
    batch_size: int = 8

    def build(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The initial model and optimizer: the same on every replica (seeded)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = torch.nn.Sequential(
                torch.nn.Linear(self.features, self.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, 1),
            )
        return model, torch.optim.Adam(model.parameters(), lr=self.lr)

    def batch_seed(self, replica: int, data_step: int) -> int:
        """The generator seed of `replica`'s batch at `data_step` (its step when it drew it)."""
        return self.seed * 1_000_003 + replica * 10_007 + data_step

    def batch(self, replica: int, data_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.batch_seed(replica, data_step))
        x = torch.randn(self.batch_size, self.features, generator=gen)
        return x, x.sum(dim=1, keepdim=True)

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output, target)


def state_tensors(
    model: torch.nn.Module, optim: torch.optim.Optimizer
) -> list[tuple[str, torch.Tensor]]:
    """The tensors a CORRUPT_STATE fault may flip a bit of, named as in `flat_state`:
    the parameters, and the optimizer's per-parameter state but its step counts."""
    out = [(f"model.{name}", p.data) for name, p in model.named_parameters()]
    for index, p in enumerate(model.parameters()):
        for key, value in optim.state.get(p, {}).items():
            if isinstance(value, torch.Tensor) and key != "step":
                out.append((f"optim.{index}.{key}", value))
    return out


def flat_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> FlatState:
    """Every tensor of the model's and the optimizer's state, flattened to floats."""
    out: FlatState = {}
    for name, value in model.state_dict().items():
        out[f"model.{name}"] = value.detach().reshape(-1).tolist()
    for index, state in optim.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"optim.{index}.{key}"] = value.detach().reshape(-1).float().tolist()
    return out


def state_checksum(*modules: Any) -> str:
    """sha256 over every tensor of the given state dicts, in key order (16 hex digits)."""
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            h.update(
                value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            )
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                h.update(str(k).encode())
                feed(value[k])
        elif isinstance(value, (list, tuple)):
            for v in value:
                feed(v)
        else:
            h.update(repr(value).encode())

    for m in modules:
        feed(m)
    return h.hexdigest()[:16]

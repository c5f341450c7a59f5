"""One DiLoCo fragment: its global (last synced) parameters and one outer step.

A fragment is a set of the model's parameters that syncs as a unit. It keeps
a backup of the global parameters (those every replica group agreed on at
the fragment's last sync) on `backup_device`. A sync has two halves, which
DiLoCo may run a few inner steps apart so the allreduce overlaps training:

``start_sync``: pseudo-gradients ``backup - current`` and their allreduce
    (averaged over the participating replica groups), not waited for;
``finish_sync``: wait; put the backup back into the parameters; vote. On a
    commit the outer optimizer steps from the backup with the averaged
    pseudo-gradients as gradients, the result becomes the new backup, and the
    parameters are mixed with the local ones: ``(1 - alpha) * global + alpha *
    local``. On a failed commit the parameters stay at the backup: the
    fragment's local progress since its last sync is discarded, so no group
    trains on past the agreed state.

Heals carry the backup and the outer optimizer's state under
``StreamingDiLoCoFragment_<i>`` (torchft's key), so a healed group resumes
from the same global parameters and outer momentum as its peers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.distributed import Work

from torchft_pg.quantization import Quantization
from torchft_pg.semisync._tensors import Bucket, like_param, local_view, pack

if TYPE_CHECKING:
    from torchft_pg.manager import Manager

__all__ = ["Fragment"]


class Fragment:
    """The backup, pending allreduce and outer step of one model fragment."""

    def __init__(
        self,
        *,
        manager: Manager,
        module: torch.nn.Module,
        index: int,
        outer_optimizer: torch.optim.Optimizer,
        backup_device: torch.device | None,
        pin_memory: bool,
        bucket_bytes: int | None,
        fragment_update_alpha: float,
        quantization: Quantization | None = None,
    ) -> None:
        self._manager = manager
        self._index = index
        self._outer_optimizer = outer_optimizer
        self._alpha = fragment_update_alpha
        self._bucket_bytes = bucket_bytes  # None: one allreduce per parameter
        self._quantization = quantization  # None: full precision
        self.named_params: list[tuple[str, torch.nn.Parameter]] = list(module.named_parameters())
        device = backup_device if backup_device is not None else torch.device("cpu")
        pin = pin_memory and device.type == "cpu" and torch.cuda.is_available()
        # The global parameters as of this fragment's last sync (local shards).
        self.original_parameters: dict[str, torch.Tensor] = {}
        for name, p in self.named_params:
            local = local_view(p)
            t = torch.empty(local.shape, dtype=local.dtype, device=device)
            self.original_parameters[name] = t.pin_memory() if pin else t
        self._pseudo_grads: list[torch.Tensor] = []
        self._buckets: list[Bucket] = []
        self._works: list[Work] = []

    @property
    def key(self) -> str:
        """Where heals carry this fragment's state."""
        return f"StreamingDiLoCoFragment_{self._index}"

    @property
    def syncing(self) -> bool:
        """True between `start_sync` and `finish_sync`."""
        return bool(self._pseudo_grads)

    # -- backup ------------------------------------------------------------------
    def save_parameters(self) -> None:
        """Backup := the parameters."""
        with torch.no_grad():
            for name, p in self.named_params:
                self.original_parameters[name].copy_(local_view(p))

    def restore_parameters(self) -> None:
        """Parameters := the backup."""
        with torch.no_grad():
            for name, p in self.named_params:
                local_view(p).copy_(self.original_parameters[name])

    def state_dict(self) -> dict[str, Any]:
        """What a heal sends: the backup and the outer optimizer's state."""
        return {
            "original_parameters": {
                name: t.detach().clone() for name, t in self.original_parameters.items()
            },
            "outer_optimizer": self._outer_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a peer's backup and outer optimizer state (a heal)."""
        received = state["original_parameters"]
        missing = set(self.original_parameters) - set(received)
        if missing:
            raise KeyError(f"{self.key}: healed state lacks parameters {sorted(missing)}")
        with torch.no_grad():
            for name, t in self.original_parameters.items():
                t.copy_(received[name])
        self._outer_optimizer.load_state_dict(state["outer_optimizer"])

    # -- one sync ----------------------------------------------------------------
    def start_sync(self) -> None:
        """Compute the pseudo-gradients and start averaging them (not waited for)."""
        if self.syncing:
            raise RuntimeError(f"{self.key}: a sync is already in flight")
        with torch.no_grad():
            self._pseudo_grads = [
                self.original_parameters[name].to(local_view(p).device) - local_view(p)
                for name, p in self.named_params
            ]
        if self._bucket_bytes is None:
            self._works = [self._allreduce(g) for g in self._pseudo_grads]
        else:
            self._buckets = pack(self._pseudo_grads, self._bucket_bytes)
            self._works = [self._allreduce(b.buffer) for b in self._buckets]

    def _allreduce(self, tensor: torch.Tensor) -> Work:
        if self._quantization is None:
            return self._manager.allreduce(tensor)
        return self._manager.allreduce(
            tensor, should_quantize=True, quantization=self._quantization
        )

    def finish_sync(self) -> bool:
        """Wait for the allreduce, vote, and on a commit step the outer optimizer.
        Returns whether the sync committed."""
        if not self.syncing:
            raise RuntimeError(f"{self.key}: finish_sync without start_sync")
        for work in self._works:
            work.wait()
        with torch.no_grad():
            for bucket in self._buckets:
                bucket.unpack()
        grads, self._pseudo_grads, self._buckets, self._works = self._pseudo_grads, [], [], []
        local = (
            [local_view(p).detach().clone() for _, p in self.named_params]
            if self._alpha > 0
            else []
        )
        self.restore_parameters()
        committed = self._manager.should_commit()
        if committed:
            self._outer_step(grads)
            self.save_parameters()
            if local:
                with torch.no_grad():
                    for (_, p), mine in zip(self.named_params, local, strict=True):
                        local_view(p).lerp_(mine, self._alpha)
        else:
            for _, p in self.named_params:
                p.grad = None  # as after a committed sync
        return committed

    def _outer_step(self, grads: list[torch.Tensor]) -> None:
        """Step the outer optimizer on this fragment only, with `grads` as gradients.

        An outer optimizer shared by several fragments also holds parameters of
        the others; their gradients (left over from the inner step) are set
        aside for this step, so it moves nothing outside the fragment.
        """
        mine = {id(p) for _, p in self.named_params}
        stashed = []
        for group in self._outer_optimizer.param_groups:
            for q in group["params"]:
                if id(q) not in mine and q.grad is not None:
                    stashed.append((q, q.grad))
                    q.grad = None
        for (_, p), g in zip(self.named_params, grads, strict=True):
            p.grad = like_param(p, g)
        try:
            self._outer_optimizer.step()
        finally:
            for _, p in self.named_params:
                p.grad = None
            for q, g in stashed:
                q.grad = g

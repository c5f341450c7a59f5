"""`LocalSGD`: replica groups train alone and average their parameters every `sync_every` steps.

Each replica group steps its own optimizer on its own data; after every
`sync_every`-th optimizer step the groups agree on a quorum, average every
parameter over the participating groups through the Manager and, if the
step commits, take the average. The optimizer's state stays local to each
group. On a failed commit nothing is taken: each group keeps its own
parameters, and the next window syncs again with a fresh quorum.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from torchft_pg.semisync._tensors import extract_local_tensor, local_view

if TYPE_CHECKING:
    from torchft_pg.manager import Manager

__all__ = ["LocalSGD"]


def check_sync_every(sync_every: object) -> int:
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be an int >= 1, got {sync_every!r}")
    return sync_every


class StepHooks:
    """Registers `pre`/`post` as step hooks of `optimizer` while entered (context manager)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._hooked_optimizer = optimizer
        self._hooks: list[RemovableHandle] = []

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        raise NotImplementedError

    def _post_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        raise NotImplementedError

    def _enter(self) -> None:
        if self._hooks:
            raise RuntimeError(f"{type(self).__name__} is already entered")
        self._hooks = [
            self._hooked_optimizer.register_step_pre_hook(self._pre_step),
            self._hooked_optimizer.register_step_post_hook(self._post_step),
        ]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class LocalSGD(StepHooks):
    """Average `model`'s parameters over the replica groups every `sync_every` steps of `optimizer`.

    Use as a context manager around the training loop: while entered, a step
    post-hook on `optimizer` counts its steps and, on every `sync_every`-th,
    runs `sync()`: `manager.start_quorum()`, one `manager.allreduce` per
    parameter (on a copy: the average over the participants), then
    `manager.should_commit()`; only a committed sync writes the averages into
    the parameters. Every sync that commits is one Manager step.

    While the optimizer steps, heal sends may not read the state (a step
    pre-hook calls `manager.disallow_state_dict_read()`, the post-hook allows
    it again), so a healing replica never receives half-updated parameters.
    The quorum may be asynchronous: a replica that heals contributes zeros and
    takes the average once healed.
    """

    def __init__(
        self,
        manager: Manager,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sync_every: int,
    ) -> None:
        super().__init__(optimizer)
        self._manager = manager
        # between syncs the groups' states differ by design: nothing to compare
        set_check = getattr(manager, "set_integrity_check_every", None)
        if set_check is not None:
            set_check(None)
        self._model = model
        self._local_optimizer = optimizer
        self._sync_every = check_sync_every(sync_every)
        self._local_step = 0  # optimizer steps since the last sync

    def __enter__(self) -> LocalSGD:
        self._enter()
        return self

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._manager.disallow_state_dict_read()

    def _post_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._manager.allow_state_dict_read()
        self._local_step += 1
        if self._local_step >= self._sync_every:
            self.sync()

    def sync(self) -> None:
        """Average the parameters now (every replica group must call it at the same point)."""
        self._manager.start_quorum()
        params = list(self._model.parameters())
        averages = [extract_local_tensor(p) for p in params]
        works = [self._manager.allreduce(avg) for avg in averages]
        for work in works:
            work.wait()
        if self._manager.should_commit():
            with torch.no_grad():
                for p, avg in zip(params, averages, strict=True):
                    local_view(p).copy_(avg)
        self._local_step = 0

"""`OptimizerWrapper(manager, optim)`: an optimizer that steps only on commit.

`zero_grad()` starts the step's quorum (overlapping it with forward), and
`step()` applies the update only if `manager.should_commit()` says every
participating rank succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchft_pg.manager import Manager

__all__ = ["OptimizerWrapper"]


class OptimizerWrapper(torch.optim.Optimizer):
    """Wraps `optim`; use it exactly like the optimizer it wraps."""

    def __init__(self, manager: Manager, optim: torch.optim.Optimizer) -> None:
        if not callable(getattr(optim, "step", None)) or not callable(
            getattr(optim, "zero_grad", None)
        ):
            raise TypeError(
                f"optim must be an optimizer (with step() and zero_grad()), got {type(optim).__name__}"
            )
        # Deliberately no super().__init__: every Optimizer attribute is the inner one's.
        self.manager = manager
        self.optim = optim

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.manager.start_quorum()
        self.optim.zero_grad(set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("OptimizerWrapper.step does not support closures")
        if self.manager.should_commit():
            self.optim.step()

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optim.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optim.state

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

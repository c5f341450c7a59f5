"""Fakes for the data tests: a Manager's committed counters, stepped by hand.

No sockets, no processes: the counters are what the test put there.
"""

from __future__ import annotations

import io
from typing import Any

import torch


class FakeJob:
    """The counters a Manager agrees on and restores from a checkpoint, stepped by
    hand: `participants` groups take part, this group is `rank` among them."""

    def __init__(self, step: int = 0, batches: int = 0) -> None:
        self.step, self.batches = step, batches
        self.participants = 1
        self.rank: int | None = 0
        self.rank_queries = 0

    def current_step(self) -> int:
        return self.step

    def batches_committed(self) -> int:
        return self.batches

    def num_participants(self) -> int:
        return self.participants

    def participating_rank(self) -> int | None:
        self.rank_queries += 1  # a real Manager waits for the step's quorum here
        return self.rank

    def commit(self) -> None:
        self.step += 1
        self.batches += self.participants

    def manager_state(self) -> dict[str, int]:
        return {"step": self.step, "batches_committed": self.batches}


def through_torch_save(state: Any) -> Any:
    """`state` after ``torch.save`` and ``torch.load(weights_only=True)``, as a
    checkpoint written by one job and read by the next."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)

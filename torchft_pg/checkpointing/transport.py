"""The checkpoint transport interface used for live healing (torchft-compatible names).

A healthy replica calls `send_checkpoint` with its state dict; a replica that is
behind calls `recv_checkpoint` with the sender's `metadata()` string (exchanged
through the manager) and gets the state dict back. `disallow_checkpoint` marks
the point after which the sender may mutate its state dict again (the optimizer
step), so no transfer may still be reading it.

Timeouts are `datetime.timedelta`. The `timeout` passed to `send_checkpoint` /
`recv_checkpoint` bounds the whole call (a deadline, not a per-operation limit).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from typing import Generic, TypeVar

from torchft_pg.errors import RecoveryError

__all__ = ["CheckpointTransport", "Deadline", "log_transfer", "logger"]

T = TypeVar("T")

#: Each heal logs bytes, seconds and GB/s here at INFO.
logger = logging.getLogger("torchft_pg.checkpointing")


class CheckpointTransport(ABC, Generic[T]):
    """Moves a state dict of type `T` from an up-to-date replica to healing ones."""

    @abstractmethod
    def metadata(self) -> str:
        """What a receiver needs to find this sender (e.g. an URL prefix)."""

    @abstractmethod
    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        """Make `state_dict` (the state at `step`) available to / send it to `dst_ranks`.

        Tensors are not copied where the transport can avoid it: the caller must
        not mutate them until `disallow_checkpoint` returns. `timeout` bounds the
        call.
        """

    @abstractmethod
    def disallow_checkpoint(self) -> None:
        """Stop serving; when this returns no transfer reads the state dict any more."""

    @abstractmethod
    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        """Receive the state dict of `step` from `src_rank` (found via its `metadata`).

        Raises `RecoveryError` naming the peer, the step and what went wrong
        (wrong step, checksum mismatch, unsafe metadata, timeout after `timeout`).
        """

    def shutdown(self, wait: bool = True) -> None:
        """Release sockets and threads; `wait` joins them. Idempotent."""
        del wait


class Deadline:
    """A budget of `timeout` from now: `remaining()` seconds left.

    `clock` returns seconds (default `time.monotonic`); tests pass a fake.
    """

    def __init__(self, timeout: timedelta, clock: Callable[[], float] = time.monotonic) -> None:
        if timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._clock = clock
        self.timeout_s = timeout.total_seconds()
        self.start = clock()
        self._end = self.start + self.timeout_s

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self._end - self._clock())

    def elapsed(self) -> float:
        """Seconds since the budget started."""
        return self._clock() - self.start

    def check(self, what: str) -> float:
        """Seconds left, or `RecoveryError` naming `what` if the budget is spent."""
        left = self.remaining()
        if left <= 0:
            raise RecoveryError(
                f"{what}: timed out after {self.elapsed():.3f} s (timeout {self.timeout_s:.3f} s)"
            )
        return left


def log_transfer(
    direction: str, peer: str, step: int, nbytes: int, seconds: float, extra: str = ""
) -> None:
    """Log one transfer's bytes, seconds and GB/s (10**9 bytes per second) at INFO."""
    rate = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    logger.info(
        "checkpoint %s %s step=%d bytes=%d seconds=%.4f GB/s=%.3f%s",
        direction,
        peer,
        step,
        nbytes,
        seconds,
        rate,
        f" {extra}" if extra else "",
    )

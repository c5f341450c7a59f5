"""The checkpoint transport interface used for live healing (torchft-compatible names).

A healthy replica calls `send_checkpoint` with its state dict; a replica that is
behind calls `recv_checkpoint` with the sender's `metadata()` string (exchanged
through the manager) and gets the state dict back. `disallow_checkpoint` marks
the point after which the sender may mutate its state dict again (the optimizer
step), so no transfer may still be reading it; `allow_checkpoint(step)` opens
serving of the last sent state dict again, for the same step. A transport that
serves a snapshot (`HTTPTransport`) is done with the state dict when
`send_checkpoint` returns: its `disallow_checkpoint` only stops new transfers
and never waits for a receiver, so a slow healer cannot hold up the sender's
commit.

`address()` is where receivers reach this transport; by default it is the same
string as `metadata()` (as in torchft, whose HTTP transport advertises its
address as its metadata).

Timeouts are `datetime.timedelta`; float or int seconds are accepted too
(`to_timedelta`). The `timeout` passed to `send_checkpoint` /
`recv_checkpoint` bounds the whole call (a deadline, not a per-operation limit).

State dicts may hold `torch.distributed.tensor.DTensor` leaves: every transport
sends a DTensor's local shard and its layout, and the receiver gets a DTensor
back: its own one when its state dict has a DTensor at that path, else one
rebuilt with the sender's layout (see `serialization`).
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from torchft_pg.errors import RecoveryError

__all__ = [
    "CheckpointTransport",
    "Deadline",
    "SentCheckpoint",
    "check_step",
    "last_sent",
    "log_transfer",
    "logger",
    "to_timedelta",
]

T = TypeVar("T")

#: Each heal logs bytes, seconds and GB/s here at INFO.
logger = logging.getLogger("torchft_pg.checkpointing")
#: Longest timeout accepted, in seconds (~31 years): beyond it timedelta and
#: threading waits overflow, so such a value can only be a mistake.
_MAX_SECONDS = 1e9


def to_timedelta(
    value: timedelta | float, name: str = "timeout", *, allow_zero: bool = False
) -> timedelta:
    """`value` as a positive `timedelta`; a float or int is a number of seconds.

    `TypeError` for any other type (bool included), `ValueError` if it is not
    positive (zero is let through with `allow_zero`), not finite or over 1e9
    seconds; both name `name` and the value.
    """
    if isinstance(value, timedelta):
        out = value
    elif type(value) in (int, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        if abs(value) > _MAX_SECONDS:
            raise ValueError(f"{name} must be at most {_MAX_SECONDS:.0e} seconds, got {value!r}")
        out = timedelta(seconds=value)
    else:
        raise TypeError(
            f"{name} must be a datetime.timedelta or a number of seconds (int or float), "
            f"got {type(value).__name__} {value!r:.100}"
        )
    if out < timedelta(0) or (out == timedelta(0) and not allow_zero):
        what = "positive or zero" if allow_zero else "positive"
        raise ValueError(f"{name} must be {what}, got {value}")
    if out.total_seconds() > _MAX_SECONDS:
        raise ValueError(f"{name} must be at most {_MAX_SECONDS:.0e} seconds, got {value}")
    return out


def check_step(step: int, name: str = "step") -> int:
    """`step` if it is an int (not a bool), else `TypeError` naming it."""
    if type(step) is not int:
        raise TypeError(f"{name} must be an int, got {type(step).__name__} {step!r:.100}")
    return step


@dataclass(frozen=True, kw_only=True)
class SentCheckpoint(Generic[T]):
    """The state dict last given to `send_checkpoint`, and its step."""

    step: int
    state_dict: T


def last_sent(sent: SentCheckpoint[T] | None, step: int) -> SentCheckpoint[T]:
    """`sent` if it is for `step`; else `ValueError` naming `step` (for `allow_checkpoint`)."""
    check_step(step)
    if sent is None:
        raise ValueError(
            f"allow_checkpoint(step={step}): nothing was sent for step {step} "
            "(send_checkpoint was never called)"
        )
    if sent.step != step:
        raise ValueError(
            f"allow_checkpoint(step={step}): nothing was sent for step {step} "
            f"(the last send_checkpoint was for step {sent.step})"
        )
    return sent


class CheckpointTransport(ABC, Generic[T]):
    """Moves a state dict of type `T` from an up-to-date replica to healing ones."""

    @abstractmethod
    def metadata(self) -> str:
        """What a receiver needs to find this sender (e.g. an URL prefix)."""

    def address(self) -> str:
        """Where receivers reach this transport; by default the same as `metadata()`."""
        return self.metadata()

    def set_quorum(self, quorum: str, replica_rank: int) -> None:
        """The quorum (``"{epoch}/{quorum_id}"``) this replica is in and its replica
        rank there; the Manager calls it before each send or receive of a heal.

        A transport may use it to serve only the healers the quorum named
        (`HTTPTransport` does, see `named_healers`) and to say who asks. The
        default ignores it, so transports written for torchft work unchanged.
        """
        del quorum, replica_rank

    @abstractmethod
    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        """Make `state_dict` (the state at `step`) available to / send it to `dst_ranks`.

        Tensors are not copied where the transport can avoid it: the caller must
        not mutate them until `disallow_checkpoint` returns. `timeout` bounds the
        call.
        """

    def disallow_checkpoint(self) -> None:
        """Stop serving; when this returns no transfer reads the state dict any more.

        Called on the sender's commit path: it should not wait for a receiver
        (serve a snapshot instead, as `HTTPTransport` does). The default does
        nothing, which is right for a transport whose `send_checkpoint` returns
        only after every byte was sent.
        """

    def allow_checkpoint(self, step: int) -> None:
        """Serve the state dict last given to `send_checkpoint` for `step` again.

        Raises `ValueError` naming `step` when nothing was sent for it. The
        default raises `NotImplementedError`: a transport has to say what
        re-allowing means for it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement allow_checkpoint(step={step!r}); "
            "call send_checkpoint to serve a state dict"
        )

    @abstractmethod
    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        """Receive the state dict of `step` from `src_rank` (found via its `metadata`).

        Raises `RecoveryError` naming the peer, the step and what went wrong
        (wrong step, checksum mismatch, unsafe metadata, timeout after `timeout`).
        """

    def received_bytes(self) -> int | None:
        """Bytes the last successful `recv_checkpoint` received, counted by the
        transport (our transports: tensor data plus the encoded skeleton, as sent;
        framing such as HTTP headers and checksums not included). None when the
        transport does not count them (the default, for transports written for
        torchft); the heal then counts the received state's tensor bytes."""
        return None

    def shutdown(self, wait: bool = True) -> None:
        """Release sockets and threads; `wait` joins them. Idempotent."""
        del wait


class Deadline:
    """A budget of `timeout` from now: `remaining()` seconds left.

    `timeout` is a `timedelta` or seconds (`to_timedelta`). `clock` returns
    seconds (default `time.monotonic`); tests pass a fake.
    """

    def __init__(
        self, timeout: timedelta | float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        timeout = to_timedelta(timeout)
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

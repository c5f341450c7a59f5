"""InProcessTransport: a real, socket-free checkpoint transport for unit tests.

Senders and receivers in one process meet through a shared `InProcessHub`
(`metadata()` and `address()` are the sender's name in it). The state dict
still goes through the wire format (`serialization.pack`, the JSON skeleton,
byte copies and `unpack`), so a test of the Manager's healing sees what a real
transport gives back: fresh tensors, same values, no aliasing with the sender.
Serving follows the same rules as `HTTPTransport`: only after
`send_checkpoint` (or `allow_checkpoint` for the step last sent), only for that
step, not after `disallow_checkpoint`, and from a snapshot taken by the send,
so the sender may mutate its state dict once the send returns. DTensors behave
as described in `serialization`: given a `state_dict` callable whose state dict
has a DTensor at the same path, the receiver fills that DTensor's local shard
in place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, TypeVar

import torch

from torchft_pg.checkpointing.serialization import (
    Packed,
    decode_skeleton,
    pack,
    prepare_receive,
    unpack,
)
from torchft_pg.checkpointing.transport import (
    CheckpointTransport,
    Deadline,
    SentCheckpoint,
    check_step,
    last_sent,
    log_transfer,
)
from torchft_pg.errors import RecoveryError

__all__ = ["InProcessHub", "InProcessTransport"]

T = TypeVar("T")


class InProcessHub:
    """Where `InProcessTransport`s of one test find each other (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._served: dict[str, Packed] = {}

    def publish(self, name: str, packed: Packed | None) -> None:
        with self._cond:
            if packed is None:
                self._served.pop(name, None)
            else:
                self._served[name] = packed
            self._cond.notify_all()

    def wait(self, name: str, timeout_s: float) -> Packed | None:
        """The packed checkpoint `name` serves, waiting up to `timeout_s` seconds for one."""
        with self._cond:
            self._cond.wait_for(lambda: name in self._served, timeout=timeout_s)
            return self._served.get(name)


class InProcessTransport(CheckpointTransport[T], Generic[T]):
    """A transport named `name` on `hub`; see the module docstring.

    Args:
        hub: where senders and receivers of one test meet.
        name: this transport's name in `hub` (its `metadata()`).
        state_dict: optional callable returning the receiver's current state
            dict; matching tensors (and DTensors) are received in place.
    """

    def __init__(
        self, hub: InProcessHub, name: str, state_dict: Callable[[], T] | None = None
    ) -> None:
        if not isinstance(hub, InProcessHub):
            raise TypeError(f"hub must be an InProcessHub, got {type(hub).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        self._hub, self._name = hub, name
        self._state_dict = state_dict
        self._lock = threading.Lock()
        self._sent: SentCheckpoint[T] | None = None
        self._received_bytes: int | None = None  # of the last successful receive

    def metadata(self) -> str:
        return self._name

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        """Serve `state_dict` as `step` until `disallow_checkpoint`; returns at once."""
        del dst_ranks, timeout
        check_step(step)
        packed = pack(state_dict, step, snapshot=True)
        with self._lock:
            self._sent = SentCheckpoint(step=step, state_dict=state_dict)
            self._hub.publish(self._name, packed)

    def allow_checkpoint(self, step: int) -> None:
        """Serve the state dict last sent for `step` again, as its values are now.

        `ValueError` naming `step` if the last `send_checkpoint` was for
        another step or there was none.
        """
        with self._lock:
            sent = last_sent(self._sent, step)
            self._hub.publish(self._name, pack(sent.state_dict, step, snapshot=True))

    def disallow_checkpoint(self) -> None:
        self._hub.publish(self._name, None)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        """Copy out the checkpoint served under `metadata`, waiting up to `timeout`."""
        deadline = Deadline(timeout)
        packed = self._hub.wait(metadata, deadline.timeout_s)
        if packed is None:
            raise RecoveryError(
                f"rank {src_rank} ({metadata!r}) served no checkpoint within {deadline.timeout_s:.3f} s"
            )
        if packed.step != step:
            raise RecoveryError(
                f"rank {src_rank} ({metadata!r}) serves step {packed.step}, expected step {step}"
            )
        skeleton = decode_skeleton(packed.skeleton_bytes)
        template: Any = self._state_dict() if self._state_dict is not None else None
        dests, direct, blobs = prepare_receive(skeleton, template, torch.device("cpu"))
        for mine, theirs in zip(blobs, packed.blobs, strict=True):
            mine.copy_(theirs)
        out = unpack(skeleton, blobs, dests)
        self._received_bytes = packed.nbytes + len(packed.skeleton_bytes)
        log_transfer(
            "received",
            f"rank {src_rank} ({metadata})",
            step,
            packed.nbytes,
            deadline.elapsed(),
            f"in_place_blobs={len(direct)}",
        )
        return out  # type: ignore[no-any-return]

    def received_bytes(self) -> int | None:
        """Bytes the last successful `recv_checkpoint` copied: blobs plus skeleton."""
        return self._received_bytes

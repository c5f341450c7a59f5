"""InProcessTransport: a real, socket-free checkpoint transport for unit tests.

Senders and receivers in one process meet through a shared `InProcessHub`
(`metadata()` is the sender's name in it). The state dict still goes through
the wire format (`serialization.pack`, the JSON skeleton, byte copies and
`unpack`), so a test of the Manager's healing sees what a real transport gives
back: fresh tensors, same values, no aliasing with the sender. Serving follows
the same rules as `HTTPTransport`: only after `send_checkpoint`, only for that
step, and not after `disallow_checkpoint`.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Generic, TypeVar

from torchft_pg.checkpointing.serialization import Packed, decode_skeleton, pack, unpack
from torchft_pg.checkpointing.transport import CheckpointTransport, Deadline, log_transfer
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
    """A transport named `name` on `hub`; see the module docstring."""

    def __init__(self, hub: InProcessHub, name: str) -> None:
        self._hub, self._name = hub, name

    def metadata(self) -> str:
        return self._name

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        """Serve `state_dict` as `step` until `disallow_checkpoint`; returns at once."""
        del dst_ranks, timeout
        self._hub.publish(self._name, pack(state_dict, step))

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
        out = unpack(skeleton, [b.to("cpu", copy=True) for b in packed.blobs])
        log_transfer(
            "received", f"rank {src_rank} ({metadata})", step, packed.nbytes, deadline.elapsed()
        )
        return out  # type: ignore[no-any-return]

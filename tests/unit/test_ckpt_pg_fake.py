"""PGTransport over an in-memory send/recv group: checksum, step and in-place logic, no sockets."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import torch

from torchft_pg.checkpointing import PGTransport
from torchft_pg.errors import RecoveryError

T = timedelta(seconds=10)


class _Done:
    def wait(self, timeout: timedelta = T) -> bool:
        return True


class _Recv:
    def __init__(self, box: queue.Queue[torch.Tensor], out: torch.Tensor) -> None:
        self._box, self._out = box, out

    def wait(self, timeout: timedelta = T) -> bool:
        try:
            data = self._box.get(timeout=timeout.total_seconds())
        except queue.Empty:
            raise RuntimeError(f"recv timed out after {timeout}") from None
        self._out.copy_(data)
        return True


class MemoryGroup:
    """Rank `rank` of an in-memory group: messages are tensor copies in per-(src, dst, tag) queues."""

    def __init__(
        self,
        rank: int,
        boxes: dict[tuple[int, int, int], queue.Queue[torch.Tensor]],
        lock: threading.Lock,
        tamper: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        self.rank, self._boxes, self._lock, self._tamper = rank, boxes, lock, tamper

    def _box(self, src: int, dst: int, tag: int) -> queue.Queue[torch.Tensor]:
        with self._lock:
            return self._boxes.setdefault((src, dst, tag), queue.Queue())

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> Any:
        data = tensors[0].clone()
        if self._tamper is not None:
            self._tamper(tag, data)
        self._box(self.rank, dstRank, tag).put(data)
        return _Done()

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> Any:
        return _Recv(self._box(srcRank, self.rank, tag), tensors[0])


def pair(
    tamper: Callable[[int, torch.Tensor], None] | None = None,
) -> tuple[MemoryGroup, MemoryGroup]:
    boxes: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = {}
    lock = threading.Lock()
    return MemoryGroup(0, boxes, lock, tamper), MemoryGroup(1, boxes, lock)


def state_dict() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"big": torch.randn(1 << 19, generator=g), "small": torch.arange(5), "lr": 0.5}


def heal(
    g0: MemoryGroup, g1: MemoryGroup, send_step: int, recv_step: int, template: Any = None
) -> dict[str, Any]:
    cpu = torch.device("cpu")
    sender = PGTransport[dict[str, Any]](g0, T, cpu)
    receiver = PGTransport[dict[str, Any]](
        g1, T, cpu, state_dict=(lambda: template) if template else None
    )
    sender.send_checkpoint([1], send_step, state_dict(), T)  # the fake's sends never block
    return receiver.recv_checkpoint(0, sender.metadata(), recv_step, T)


def test_roundtrip_and_in_place() -> None:
    out = heal(*pair(), 4, 4)
    assert torch.equal(out["big"], state_dict()["big"]) and out["lr"] == 0.5
    mine: dict[str, Any] = {
        "big": torch.zeros(1 << 19),
        "small": torch.zeros(5, dtype=torch.int64),
        "lr": 0.0,
    }
    ptr = mine["big"].data_ptr()
    out = heal(*pair(), 4, 4, template=mine)
    assert out["big"] is mine["big"] and mine["big"].data_ptr() == ptr
    assert torch.equal(mine["big"], state_dict()["big"]) and torch.equal(
        mine["small"], torch.arange(5)
    )


def test_a_flipped_bit_on_the_wire_is_a_checksum_error() -> None:
    def flip(tag: int, data: torch.Tensor) -> None:
        if tag >= 16 and data.numel() > 1000:  # a blob, not the header or metadata
            data[777] ^= 0x10

    with pytest.raises(RecoveryError, match=r"checksum mismatch in blobs \[0\]"):
        heal(*pair(flip), 4, 4)


def test_wrong_step_names_both_steps() -> None:
    with pytest.raises(RecoveryError, match="rank 0 sent step 4, expected step 5"):
        heal(*pair(), 4, 5)


def test_silent_sender_times_out_within_the_deadline() -> None:
    _, g1 = pair()
    receiver = PGTransport[dict[str, Any]](g1, T, torch.device("cpu"))
    with pytest.raises(RecoveryError, match=r"step 1 from rank 0 \(header\) failed"):
        receiver.recv_checkpoint(0, "<n/a>", 1, timedelta(seconds=0.05))


def test_sends_to_several_ranks() -> None:
    boxes: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = {}
    lock = threading.Lock()
    groups = [MemoryGroup(r, boxes, lock) for r in range(3)]
    cpu = torch.device("cpu")
    PGTransport[dict[str, Any]](groups[0], T, cpu).send_checkpoint([1, 2], 2, state_dict(), T)
    with ThreadPoolExecutor(2) as pool:
        outs = list(
            pool.map(
                lambda g: PGTransport[dict[str, Any]](g, T, cpu).recv_checkpoint(0, "", 2, T),
                groups[1:],
            )
        )
    assert all(torch.equal(o["big"], state_dict()["big"]) for o in outs)


def test_constructor_takes_torchfts_forms() -> None:
    g0, g1 = pair()
    made = [
        PGTransport[dict[str, Any]](g0, T, torch.device("cpu")),
        PGTransport[dict[str, Any]](
            pg=g1, timeout=T, device=torch.device("cpu"), state_dict=lambda: {}
        ),
        PGTransport[dict[str, Any]](g0, 2.5, "cpu"),
        PGTransport[dict[str, Any]](g0, 3, "cpu", None),
    ]
    assert [(t._timeout, t._device) for t in made] == [
        (T, torch.device("cpu")),
        (T, torch.device("cpu")),
        (timedelta(seconds=2.5), torch.device("cpu")),
        (timedelta(seconds=3), torch.device("cpu")),
    ]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((object(), T, "cpu"), TypeError, "pg must be a process group with send and recv"),
        (("pg", "10", "cpu"), TypeError, "timeout must be a datetime.timedelta or a number"),
        (("pg", -1.0, "cpu"), ValueError, "timeout must be positive, got -1.0"),
        (("pg", T, 0), TypeError, "device must be a torch.device or a device name, got int"),
        (("pg", T, "nonsense"), ValueError, "device 'nonsense' is not a valid torch device"),
        (("pg", T, "cpu", {}), TypeError, "state_dict must be a callable"),
    ],
)
def test_constructor_rejects_bad_arguments(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    g0, _ = pair()
    real: list[Any] = [g0 if a == "pg" else a for a in args]
    with pytest.raises(error, match=match):
        PGTransport(*real)


def test_address_and_allow_checkpoint_of_a_push_transport() -> None:
    g0, _ = pair()
    sender = PGTransport[dict[str, Any]](g0, T, torch.device("cpu"))
    assert sender.address() == sender.metadata() == "<n/a>"
    with pytest.raises(
        ValueError, match=r"allow_checkpoint\(step=4\): nothing was sent for step 4"
    ):
        sender.allow_checkpoint(4)
    sender.send_checkpoint([1], 4, state_dict(), T)
    sender.allow_checkpoint(4)  # the push finished: nothing to re-open, and no error
    with pytest.raises(ValueError, match=r"nothing was sent for step 5 \(the last .* step 4\)"):
        sender.allow_checkpoint(5)

"""The transport interface: its defaults, deadlines on a fake clock, timeouts, the heal log line."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from torchft_pg.checkpointing.transport import (
    CheckpointTransport,
    Deadline,
    check_step,
    log_transfer,
    to_timedelta,
)
from torchft_pg.errors import RecoveryError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_counts_down_and_names_what_timed_out() -> None:
    clock = FakeClock()
    d = Deadline(timedelta(seconds=2), clock=clock)
    assert d.remaining() == 2.0
    clock.now += 1.5
    assert d.check("receiving step 3") == pytest.approx(0.5)
    clock.now += 1.0
    assert d.remaining() == 0.0
    with pytest.raises(
        RecoveryError, match=r"receiving step 3: timed out after 2\.500 s \(timeout 2\.000 s\)"
    ):
        d.check("receiving step 3")


def test_deadline_rejects_non_positive_timeouts() -> None:
    with pytest.raises(ValueError, match="timeout must be positive, got 0:00:00"):
        Deadline(timedelta(0))


def test_log_line_has_bytes_seconds_and_rate(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="torchft_pg.checkpointing"):
        log_transfer("received", "rank 0", 7, 2_000_000_000, 0.5, "chunks=4")
    assert caplog.messages == [
        "checkpoint received rank 0 step=7 bytes=2000000000 seconds=0.5000 GB/s=4.000 chunks=4"
    ]


class _Minimal(CheckpointTransport[dict[str, Any]]):
    """Only the abstract methods, as a torchft user's own transport may have."""

    def metadata(self) -> str:
        return "minimal://here"

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: dict[str, Any], timeout: timedelta
    ) -> None:
        pass

    def recv_checkpoint(
        self, src_rank: int, metadata: str, step: int, timeout: timedelta
    ) -> dict[str, Any]:
        return {}


def test_abc_defaults_for_address_disallow_and_allow() -> None:
    t = _Minimal()
    assert t.address() == "minimal://here"
    t.disallow_checkpoint()  # a push transport has nothing to stop
    with pytest.raises(
        NotImplementedError, match=r"_Minimal does not implement allow_checkpoint\(step=3\)"
    ):
        t.allow_checkpoint(3)
    t.shutdown()


def test_timeouts_are_timedeltas_or_seconds() -> None:
    assert to_timedelta(timedelta(seconds=2)) == timedelta(seconds=2)
    assert to_timedelta(1.5) == timedelta(seconds=1.5)
    assert to_timedelta(3) == timedelta(seconds=3)
    assert Deadline(0.25, clock=FakeClock()).timeout_s == 0.25
    with pytest.raises(TypeError, match=r"wait must be a datetime\.timedelta .* got str '1'"):
        to_timedelta("1", "wait")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bool False"):
        to_timedelta(False)
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds, got inf"):
        to_timedelta(float("inf"))
    with pytest.raises(ValueError, match="timeout must be positive, got -2"):
        to_timedelta(-2)
    with pytest.raises(ValueError, match=r"timeout must be at most 1e\+09 seconds, got 1e\+20"):
        to_timedelta(1e20)
    with pytest.raises(ValueError, match=r"at most 1e\+09 seconds, got 99999 days"):
        to_timedelta(timedelta(days=99999))


def test_steps_are_ints() -> None:
    assert check_step(7) == 7
    with pytest.raises(TypeError, match=r"step must be an int, got float 7\.0"):
        check_step(7.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step must be an int, got bool True"):
        check_step(True)

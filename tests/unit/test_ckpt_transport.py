"""The transport interface helpers: deadlines on a fake clock, and the heal log line."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from torchft_pg.checkpointing.transport import Deadline, log_transfer
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

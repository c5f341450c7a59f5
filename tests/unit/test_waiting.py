"""`WaitReport`: what a stalled job says, and when."""

from __future__ import annotations

from lighthouse import FakeClock
from torchft_pg.manager.waiting import WaitReport


def test_a_wait_is_said_at_once_then_every_period_then_once_when_over() -> None:
    clock = FakeClock()
    report = WaitReport(clock.now, period_s=10.0)
    what = "replica groups: 2 in this step, min_replica_size 3"
    assert report.waiting(what) == f"waiting for {what}"
    clock.advance(4.0)
    assert report.waiting(what) is None  # within the period: quiet
    clock.advance(7.0)
    assert report.waiting(what) == f"still waiting for {what} (11 s, 3 tries)"
    clock.advance(1.0)
    assert report.resolved() == f"no longer waiting for {what} (after 12 s, 3 tries)"
    assert report.resolved() is None  # said once


def test_a_new_reason_is_said_at_once() -> None:
    clock = FakeClock()
    report = WaitReport(clock.now)
    assert report.waiting("a") == "waiting for a"
    clock.advance(1.0)
    assert report.waiting("b") == "waiting for b"

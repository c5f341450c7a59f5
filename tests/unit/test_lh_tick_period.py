"""The lighthouse's tick period: the configured tick while anything waits on the
clock, longer while it only watches leased steps (pure, and on a core)."""

from __future__ import annotations

import asyncio

import pytest

from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import IDLE_TICK_S, LighthouseCore, tick_period_s
from lighthouse.coordinator.quorum import QuorumConfig
from lighthouse.types import QuorumMember


def test_idle_ticks_are_longer_but_bounded_by_the_timeouts() -> None:
    # the defaults: 100 ms tick, 5 s heartbeat timeout, 10 s join timeout
    assert tick_period_s(0.1, 5.0, 10.0, busy=False) == IDLE_TICK_S
    # a death is still seen within a tenth of the heartbeat timeout
    assert tick_period_s(0.1, 2.0, 10.0, busy=False) == pytest.approx(0.2)
    # a stalled lease holder (patience >= the join timeout) within a quarter of it
    assert tick_period_s(0.1, 5.0, 1.0, busy=False) == pytest.approx(0.25)
    # torchft's timing: the bound is below the tick, which stays as configured
    assert tick_period_s(0.1, 5.0, 0.1, busy=False) == 0.1
    # never more often than the configured tick
    assert tick_period_s(0.8, 5.0, 10.0, busy=False) == 0.8


def test_a_waiting_ask_gets_the_configured_tick() -> None:
    assert tick_period_s(0.1, 5.0, 10.0, busy=True) == 0.1
    assert tick_period_s(0.02, 60.0, 600.0, busy=True) == 0.02


def test_the_core_ticks_fast_while_a_replica_asks_and_slowly_once_answered() -> None:
    async def body() -> None:
        cfg = QuorumConfig(min_replicas=2, join_timeout_s=10.0, heartbeat_timeout_s=5.0)
        core = LighthouseCore(cfg, FakeClock(), "ep")
        assert core.tick_period(0.1) == IDLE_TICK_S  # nobody known, nobody asking
        first = core.request(QuorumMember("a"))
        assert core.tick_period(0.1) == 0.1  # a waits: its join timeout runs on the tick
        second = core.request(QuorumMember("b"))
        await asyncio.gather(first, second)
        assert core.tick_period(0.1) == IDLE_TICK_S  # both answered (and leased)

    asyncio.run(body())

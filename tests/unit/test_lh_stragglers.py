"""The straggler detector (pure) and its eviction by the lighthouse core (fake
clock, no sockets): noise never evicts, a consistently slow group is
quarantined, never below min_replicas, and is judged again only on a new
window once its backoff ends."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from lighthouse import wire
from lighthouse.clock import FakeClock
from lighthouse.coordinator.admission import step_jump
from lighthouse.coordinator.core import STRAGGLER_CHECK_PERIOD_S, LighthouseCore
from lighthouse.coordinator.quorum import DecisionKind, QuorumConfig
from lighthouse.coordinator.stragglers import (
    DEFAULT_STRAGGLER_SLOWDOWN,
    BusyWindows,
    Straggler,
    find_straggler,
)
from lighthouse.types import LeaseRecall, QuorumMember

WINDOW = 10


def _verdict(medians: dict[str, float], min_replicas: int = 1) -> Straggler | None:
    return find_straggler(
        medians, slowdown=DEFAULT_STRAGGLER_SLOWDOWN, min_replicas=min_replicas, steps=WINDOW
    )


def test_a_consistently_slow_group_is_the_straggler_with_its_numbers_in_the_reason() -> None:
    v = _verdict({"a": 98.0, "b": 100.0, "c": 210.0})
    assert v is not None and v.replica_id == "c"
    assert v.others_ms == 99.0 and v.slowdown == pytest.approx(210 / 99)
    assert v.reason() == (
        "straggler: 210 ms of work per step against the others' 99 ms (2.1x, over 10 steps)"
    )


def test_noise_never_evicts() -> None:
    """Healthy groups whose steps vary by +-30% (and a few 5x outliers: heals,
    checkpoints) have medians far below the threshold, over many windows."""
    rng = random.Random(7)
    windows = BusyWindows(50)
    for step in range(1, 2000):
        for rid in ("a", "b", "c", "d"):
            busy = 100.0 * rng.uniform(0.7, 1.3) * (5.0 if rng.random() < 0.03 else 1.0)
            windows.record(rid, step, busy)
        medians = windows.medians("abcd")
        if medians is not None:
            assert _verdict(medians) is None, (step, medians)


def test_below_the_slowdown_or_the_break_even_nobody_is_evicted() -> None:
    assert _verdict({"a": 100.0, "b": 100.0, "c": 140.0}) is None  # < 1.5x
    # 1.5x among three is the break-even: the two alone do 2/100 samples per ms,
    # the three together 3/150: no better, so it stays
    assert _verdict({"a": 100.0, "b": 100.0, "c": 150.0}) is None
    # two groups: the slower must take more than twice as long to be worth losing
    assert _verdict({"a": 100.0, "b": 190.0}) is None
    assert _verdict({"a": 100.0, "b": 210.0}) is not None


def test_never_below_min_replicas() -> None:
    slow = {"a": 100.0, "b": 100.0, "c": 300.0}
    assert _verdict(slow, min_replicas=2) is not None
    assert _verdict(slow, min_replicas=3) is None
    assert _verdict({"a": 300.0}) is None  # alone: nobody to compare with


def test_windows_keep_one_sample_per_step_and_need_a_full_window() -> None:
    w = BusyWindows(3)
    w.record("a", 1, 10.0)
    w.record("a", 1, 99.0)  # the same step again (a heartbeat ping): ignored
    w.record("a", 2, 0.0)  # unknown: ignored
    w.record("a", 2, 20.0)
    assert w.median("a") is None and w.medians(["a"]) is None
    w.record("a", 3, 30.0)
    assert w.median("a") == 20.0
    w.record("a", 4, 40.0)  # the oldest drops out
    assert w.median("a") == 30.0
    w.reset("a")  # evicted: a whole new window before it is judged again
    w.record("a", 5, 50.0)
    assert w.median("a") is None
    w.record("a", 4, 50.0)  # steps never go back within an incarnation
    assert w.medians(["a"]) is None
    with pytest.raises(ValueError, match="window must be >= 1"):
        BusyWindows(0)


def test_config_refuses_a_slowdown_at_or_below_one() -> None:
    with pytest.raises(ValueError, match="straggler_slowdown must be > 1"):
        QuorumConfig(straggler_slowdown=1.0)
    with pytest.raises(ValueError, match="straggler_window must be >= 0"):
        QuorumConfig(straggler_window=-1)


# -- the core: eviction, the lease, re-admission ------------------------------------------
CFG = QuorumConfig(
    min_replicas=2,
    join_timeout_s=30.0,
    heartbeat_timeout_s=60.0,
    quarantine_base_s=10.0,
    straggler_window=WINDOW,
)
FAST, SLOW = 20.0, 45.0  # ms of work per step


def _member(rid: str, step: int) -> QuorumMember:
    busy = SLOW if rid == "c" else FAST
    return QuorumMember(rid, step=step, step_time_ms=SLOW + 1, busy_ms=busy)


def _recalls(q: asyncio.Queue[bytes]) -> list[LeaseRecall]:
    out = []
    while not q.empty():
        _epoch, event = wire.decode_liveness_event(q.get_nowait())
        if isinstance(event, LeaseRecall):
            out.append(event)
    return out


def _run_until_judged(core: LighthouseCore, clock: FakeClock, first_step: int) -> int:
    """Ping steps from ``first_step`` on, one detector check per step, until "c" is
    quarantined; the step it happened at. Never before c's window is full."""
    assert core.busy is not None
    for step in range(first_step, first_step + 3 * WINDOW):
        for rid in "abc":
            m = _member(rid, step)
            core.progress(rid, step, m.step_time_ms, busy_ms=m.busy_ms)
        full = core.busy.median("c") is not None
        clock.advance(STRAGGLER_CHECK_PERIOD_S)
        core.tick()
        assert core.state.is_quarantined("c", clock.now()) == full, step
        if full:
            return step
    raise AssertionError("never judged")


def test_the_core_quarantines_a_straggler_on_a_lease_and_lets_it_back_after_its_backoff() -> None:
    async def body() -> None:
        clock = FakeClock()
        core = LighthouseCore(CFG, clock, "ep")
        queues = {rid: asyncio.Queue[bytes]() for rid in "abc"}
        for rid, queue in queues.items():
            core.stream_opened(rid, queue)
        futs = [core.request(_member(rid, 1)) for rid in "abc"]
        await asyncio.gather(*futs)
        assert core.lease.holders.keys() == {"a", "b", "c"}
        # the three run on the lease; their pings report each step's work (the
        # request at step 1 was the first sample)
        assert _run_until_judged(core, clock, 2) == WINDOW
        q = core.state.quarantined["c"]
        assert q.strikes == 1 and q.reason.startswith("straggler: 45 ms of work per step")
        assert "(2.2x, over 10 steps)" in q.reason
        # every holder hears the lease recalled, with no leased step failed
        for rid in "abc":
            (recall,) = _recalls(queues[rid])
            assert recall.abort_from_step == -1 and recall.absent_replica_ids == ()
        # the straggler asks first (held); its ask fails leased rounds it will not join
        held = core.request(_member("c", 13))
        assert [r.absent_replica_ids for r in _recalls(queues["a"])] == [("c",)]
        pair = [core.request(_member(rid, 13)) for rid in "ab"]
        quorum = wire.decode_lighthouse_quorum_response(await pair[0])
        assert quorum.replica_ids == ["a", "b"] and not held.done()
        snap = core.snapshot()
        row = {r["replica_id"]: r for r in snap["health"]}["c"]
        assert row["status"] == "quarantined" and row["quarantine_reason"] == q.reason
        assert row["busy_ms"] == SLOW
        assert snap["stragglers"]["last_verdict"]["replica_id"] == "c"
        # the backoff ends: the pair's lease is recalled so they take it back in
        clock.advance(CFG.quarantine_base_s)
        for rid in "ab":
            _recalls(queues[rid])
        core.tick()
        assert [r.abort_from_step for r in _recalls(queues["a"])] == [-1]
        again = [core.request(_member(rid, 20)) for rid in "ab"]
        three = wire.decode_lighthouse_quorum_response(await again[0])
        assert three.replica_ids == ["a", "b", "c"] and held.done()
        # judged again only on a whole new window of its steps (its held ask at
        # step 13 was the first sample of it)
        assert _run_until_judged(core, clock, 21) == 21 + WINDOW - 2
        assert core.state.quarantined["c"].strikes == 2  # still slow: out again, longer

    asyncio.run(body())


def test_a_quarantined_straggler_no_longer_holds_the_job_committed_step_back() -> None:
    """The others go on committing without it: the job's committed step follows
    them, so their next ask is not "far above the job's committed step"."""

    async def body() -> None:
        clock = FakeClock()
        core = LighthouseCore(CFG, clock, "ep")
        for rid in "abc":
            core.stream_opened(rid, asyncio.Queue[bytes]())
        await asyncio.gather(*[core.request(_member(rid, 1)) for rid in "abc"])
        judged = _run_until_judged(core, clock, 2)
        for step in range(judged + 1, judged + 6):  # the pair goes on; c's last step stays
            for rid in "ab":
                core.progress(rid, step, FAST, busy_ms=FAST)
        assert core.state.committed_step == judged + 5
        assert step_jump("a", judged + 6, core.state.committed_step, known=True) is None

    asyncio.run(body())


def test_a_straggler_let_back_in_is_taken_in_with_all_the_others() -> None:
    """Its ask was held for its whole backoff, longer than the join timeout: the join
    timeout counts from the backoff's end, so the first of the others to ask again
    waits for the rest instead of forming a quorum with it alone (leaving a healthy
    member out, to fail its leased step and heal)."""

    async def body() -> None:
        clock = FakeClock()
        cfg = dataclasses.replace(CFG, join_timeout_s=2.0)
        assert cfg.quarantine_base_s > cfg.join_timeout_s
        core = LighthouseCore(cfg, clock, "ep")
        for rid in "abc":
            core.stream_opened(rid, asyncio.Queue[bytes]())
        await asyncio.gather(*[core.request(_member(rid, 1)) for rid in "abc"])
        step = _run_until_judged(core, clock, 2) + 1
        held = core.request(_member("c", step))
        await asyncio.gather(*[core.request(_member(rid, step)) for rid in "ab"])
        clock.advance(cfg.quarantine_base_s)
        core.tick()  # its backoff ended: the pair's lease is recalled
        first = core.request(_member("a", step + 3))
        assert not first.done() and not held.done(), core.decision.reason
        assert core.decision.kind is DecisionKind.JOIN_TIMEOUT, core.decision.reason
        core.request(_member("b", step + 3))
        three = wire.decode_lighthouse_quorum_response(await first)
        assert three.replica_ids == ["a", "b", "c"] and held.done()

    asyncio.run(body())


def test_a_straggler_that_would_leave_fewer_than_min_replicas_stays() -> None:
    async def body() -> None:
        clock = FakeClock()
        core = LighthouseCore(
            QuorumConfig(min_replicas=3, straggler_window=WINDOW, lease=False), clock, "ep"
        )
        for step in range(1, 3 * WINDOW):
            futs = [core.request(_member(rid, step)) for rid in "abc"]
            await asyncio.gather(*futs)
            clock.advance(STRAGGLER_CHECK_PERIOD_S)
            core.tick()
        assert not core.state.quarantined

    asyncio.run(body())


def test_off_when_the_window_is_zero() -> None:
    core = LighthouseCore(QuorumConfig(straggler_window=0), FakeClock(), "ep")
    assert core.busy is None and core.snapshot()["stragglers"]["enabled"] is False

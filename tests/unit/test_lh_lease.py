"""Quorum leases without sockets: the pure ``QuorumLease`` and the core's recalls (fake clock)."""

from __future__ import annotations

import asyncio

import pytest

from lighthouse import wire
from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import LighthouseCore
from lighthouse.coordinator.lease import QuorumLease
from lighthouse.coordinator.quorum import QuorumConfig
from lighthouse.types import LeaseFloor, LeaseRecall, Quorum, QuorumMember


def quorum(steps: dict[str, int], quorum_id: int = 4) -> Quorum:
    return Quorum(quorum_id, "ep", tuple(QuorumMember(r, step=s) for r, s in sorted(steps.items())))


def test_an_ask_recalls_and_fails_leased_steps_from_the_lowest_waiting_member() -> None:
    lease = QuorumLease()
    lease.grant(7, quorum({"a": 10, "b": 10, "c": 10}), now=0.0)
    lease.asked("c")
    waiting = [QuorumMember("c", step=11), QuorumMember("joiner", step=0)]
    assert lease.recall_for_ask("ep", waiting) == LeaseRecall("ep", 7, 4, ("c",), 11)
    assert lease.recall_for_ask("ep", waiting) is None  # the holders were told already
    lease.asked("b")
    waiting.append(QuorumMember("b", step=12))
    assert lease.recall_for_ask("ep", waiting) == LeaseRecall("ep", 7, 4, ("b", "c"), 11)
    lease.asked("a")
    assert lease.recall_for_ask("ep", waiting) is None  # no holder left to tell


def test_a_joiner_alone_recalls_without_failing_any_step() -> None:
    lease = QuorumLease()
    lease.grant(1, quorum({"a": 3, "b": 3}), now=0.0)
    # a may already be in round 4 (its ping in flight): both run it on the lease
    assert lease.recall_for_ask("ep", [QuorumMember("new", step=0)]) == LeaseRecall(
        "ep", 1, 4, (), -1, 5
    )


def test_a_joiner_lets_the_holders_finish_the_round_one_of_them_began_ahead() -> None:
    """The holder behind must not ask at the round the one ahead is running on
    the lease: that one would wait for it in its collectives and fail the round."""
    lease = QuorumLease()
    lease.grant(1, quorum({"a": 3, "b": 3}), now=0.0)
    lease.progress("a", 4, 0.1)  # a began round 4; b is still in round 3
    recall = lease.recall_for_ask("ep", [QuorumMember("new", step=0)])
    assert recall is not None and recall.abort_from_step == -1
    assert recall.valid_below_step == 6  # b runs round 4 (and 5, which a may begin unseen)


def test_a_holder_behind_the_others_for_the_join_timeout_is_a_stall() -> None:
    lease = QuorumLease()
    lease.grant(2, quorum({"a": 5, "b": 5}), now=0.0)
    lease.progress("a", 6, 0.1)  # rounds of 0.1 s: the join timeout is the longer wait
    lease.progress("b", 6, 0.12)
    lease.progress("a", 7, 0.2)
    lease.progress("b", 7, 0.22)
    assert lease.round_s == pytest.approx(0.1)
    lease.progress("a", 8, 0.3)  # b stays at 7: a waits for it in step 8's collectives
    assert lease.recall_for_stall("ep", 0.79, join_timeout_s=0.5) is None
    assert lease.recall_for_stall("ep", 0.8, join_timeout_s=0.5) == LeaseRecall(
        "ep", 2, 4, ("b",), 8
    )
    assert lease.recall_for_stall("ep", 0.9, join_timeout_s=0.5) is None  # once


def test_on_slow_rounds_a_holder_is_a_stall_only_after_three_rounds_length() -> None:
    """Seen over 50 ms links with 1% loss: rounds of ~1 s, and a holder that starts a
    round a few hundred ms after the fastest is normal, not stalled."""
    lease = QuorumLease()
    lease.grant(2, quorum({"a": 5, "b": 5}), now=0.0)
    for t, step in ((1.0, 6), (2.0, 7)):  # both progress together: no stall however long
        lease.progress("a", step, t)
        lease.progress("b", step, t + 0.05)
        assert lease.recall_for_stall("ep", t + 0.9, join_timeout_s=0.3) is None
    assert lease.round_s == pytest.approx(1.0)
    lease.progress("a", 8, 3.0)  # b is late to start step 8
    assert lease.recall_for_stall("ep", 3.6, join_timeout_s=0.3) is None  # was a recall
    assert lease.recall_for_stall("ep", 5.99, join_timeout_s=0.3) is None
    assert lease.recall_for_stall("ep", 6.0, join_timeout_s=0.3) == LeaseRecall(
        "ep", 2, 4, ("b",), 8
    )


def test_a_clean_leave_of_unknown_progress_recalls_from_the_leavers_last_step() -> None:
    lease = QuorumLease()
    lease.grant(3, quorum({"a": 5, "b": 5}), now=0.0)
    lease.progress("b", 9, 1.0)
    assert lease.recall_for_leave("ep", "b", -1) == (LeaseRecall("ep", 3, 4, ("b",), 9), None)
    assert lease.recall_for_leave("ep", "a", -1) == (None, None)  # nobody left to tell


def test_a_leaver_that_committed_first_lets_the_others_finish_below_its_step() -> None:
    """The first replica to reach the end leaves after committing step 9; the others,
    one step behind, still finish rounds below 10 on the lease (nobody is stranded)."""
    lease = QuorumLease()
    lease.grant(3, quorum({"a": 5, "b": 5, "c": 5}), now=0.0)
    for rid, step in (("a", 9), ("b", 8), ("c", 9)):
        lease.progress(rid, step, 1.0)
    recall, floor = lease.recall_for_leave("ep", "a", 10)
    assert recall == LeaseRecall("ep", 3, 4, ("a",), 10, valid_below_step=10)
    assert floor is None  # b (step 8) is still the slowest
    recall, floor = lease.recall_for_leave("ep", "b", 10)
    assert floor == LeaseFloor("", 3, 9)  # b was the slowest: c alone sets the floor


def test_the_floor_rises_only_when_the_slowest_holder_moves() -> None:
    lease = QuorumLease()
    lease.grant(1, quorum({"a": 5, "b": 5, "c": 5}), now=0.0)
    assert lease.floor == 5
    assert lease.progress("a", 6, 0.1) is None
    assert lease.progress("b", 6, 0.1) is None
    assert lease.progress("c", 6, 0.2) == LeaseFloor("", 1, 6)  # the last to start step 6
    assert lease.progress("c", 6, 0.3) is None  # a repeated report changes nothing
    assert lease.progress("a", 7, 0.3) is None


def test_a_holder_that_waits_gets_the_floor_once_it_is_there_and_only_then() -> None:
    lease = QuorumLease()
    lease.grant(1, quorum({"a": 5, "b": 5}), now=0.0)
    assert lease.want("a", 5) == LeaseFloor("", 1, 5)  # already there: at once
    assert lease.want("a", 6) is None  # b has not begun step 6
    assert lease.waiters(5) == []
    assert lease.progress("a", 7, 0.1) is None
    floor = lease.progress("b", 6, 0.2)
    assert floor == LeaseFloor("", 1, 6)
    assert lease.waiters(floor.step) == ["a"] and lease.waiters(floor.step) == []  # told once
    assert lease.want("stranger", 1) is None and lease.waiting == {}  # not a holder


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_core_sends_the_floor_only_to_the_holder_that_waits_for_it() -> None:
    """A holder whose own collectives proved the floor asks for none: in a job whose
    steps run collectives the lighthouse sends no floor at all (one message per
    holder and step, its ping, instead of two)."""

    async def body() -> None:
        core, queues, _, lease_id = await _leased_pair()
        for step in (4, 5, 6):  # proven by their collectives: nobody waits
            core.progress("a", step, 1.0)
            core.progress("b", step, 1.0)
        assert [_events(q) for q in queues.values()] == [[], []]
        core.progress("a", 7, 1.0, floor_wanted=6)  # there already: sent at once
        assert _events(queues["a"]) == [LeaseFloor("ep", lease_id, 6)]
        core.progress("a", 8, 1.0, floor_wanted=7)  # b has not begun step 7
        assert [_events(q) for q in queues.values()] == [[], []]
        core.progress("b", 7, 1.0)
        assert _events(queues["a"]) == [LeaseFloor("ep", lease_id, 7)]
        assert _events(queues["b"]) == []  # b did not wait
        core.progress("b", 8, 1.0)
        assert [_events(q) for q in queues.values()] == [[], []]  # a was told already

    run(body())


async def _leased_pair() -> tuple[LighthouseCore, dict[str, asyncio.Queue[bytes]], Quorum, int]:
    """A core whose quorum of holders ``a`` and ``b``, at step 3, is leased: the core,
    each holder's liveness queue, the quorum and its lease id."""
    cfg = QuorumConfig(min_replicas=2, join_timeout_s=30.0, heartbeat_timeout_s=5.0)
    core = LighthouseCore(cfg, FakeClock(), "ep")
    queues = {rid: asyncio.Queue[bytes]() for rid in "ab"}
    for rid, q in queues.items():
        core.stream_opened(rid, q)
    futs = [core.request(QuorumMember(rid, step=3)) for rid in "ab"]
    (quorum, lease_id), _ = [wire.decode_leased_quorum_response(await f) for f in futs]
    assert lease_id > 0
    return core, queues, quorum, lease_id


def _events(q: asyncio.Queue[bytes]) -> list[object]:
    out: list[object] = []
    while not q.empty():
        out.append(wire.decode_liveness_event(q.get_nowait())[1])
    return out


def test_core_grants_a_lease_only_when_nobody_is_left_waiting_and_recalls_it() -> None:
    async def body() -> None:
        core, queues, q1, lease_id = await _leased_pair()
        assert q1.replica_ids == ["a", "b"]
        joiner = core.request(QuorumMember("c", step=0))
        # each may already run round 4 on the lease: both run it, then ask at 5
        assert [e for q in queues.values() for e in _events(q)] == [
            LeaseRecall("ep", lease_id, q1.quorum_id, (), -1, 5)
        ] * 2
        fa = core.request(QuorumMember("a", step=4))  # (a lost the lease otherwise)
        assert _events(queues["b"]) == [LeaseRecall("ep", lease_id, q1.quorum_id, ("a",), 4)]
        assert _events(queues["a"]) == []  # a asked: it holds nothing any more
        fb = core.request(QuorumMember("b", step=4))
        q2, lease2 = wire.decode_leased_quorum_response(await fb)
        assert q2.replica_ids == ["a", "b", "c"] and lease2 > lease_id
        assert (await fa) == (await joiner)

    run(body())


def test_core_without_leases_grants_none_and_recalls_nothing() -> None:
    async def body() -> None:
        cfg = QuorumConfig(min_replicas=2, join_timeout_s=30.0, lease=False)
        core = LighthouseCore(cfg, FakeClock(), "ep")
        q: asyncio.Queue[bytes] = asyncio.Queue()
        core.stream_opened("a", q)
        futs = [core.request(QuorumMember(rid, step=1)) for rid in "ab"]
        leases = [wire.decode_leased_quorum_response(await f)[1] for f in futs]
        assert leases == [0, 0]
        core.request(QuorumMember("c"))
        assert q.empty()

    run(body())


def test_core_recalls_a_stalled_lease_on_its_tick() -> None:
    async def body() -> None:
        clock = FakeClock()
        cfg = QuorumConfig(min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=60.0)
        core = LighthouseCore(cfg, clock, "ep")
        queues = {rid: asyncio.Queue[bytes]() for rid in "ab"}
        for rid, q in queues.items():
            core.stream_opened(rid, q)
        futs = [core.request(QuorumMember(rid, step=3)) for rid in "ab"]
        lease_id = wire.decode_leased_quorum_response(await futs[0])[1]
        core.progress("a", 4, 20.0)
        clock.advance(0.9)
        core.tick()
        assert queues["a"].empty()
        clock.advance(0.2)
        core.tick()
        recall = LeaseRecall("ep", lease_id, 1, ("b",), 4)
        assert _events(queues["a"]) == [recall] == _events(queues["b"])
        # the ping's step also reaches rule 5 and the step report
        assert core.state.last_member["a"].step == 4

    run(body())


def test_a_lighthouse_that_did_not_run_declares_nobody_dead_for_its_own_pause() -> None:
    """Stopped (SIGSTOP) for 30 s with a 5 s heartbeat timeout: the holders' pings
    wait unread in its sockets. Its first tick after the pause forgives every
    silence (no death, no recall, the lease stands); a silence after it counts."""

    async def body() -> None:
        clock = FakeClock()
        cfg = QuorumConfig(min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=5.0)
        core = LighthouseCore(cfg, clock, "ep")
        queues = {rid: asyncio.Queue[bytes]() for rid in "ab"}
        for rid, q in queues.items():
            core.stream_opened(rid, q)
        futs = [core.request(QuorumMember(rid, step=3)) for rid in "ab"]
        lease_id = wire.decode_leased_quorum_response(await futs[0])[1]
        core.tick()
        clock.advance(30.0)  # the lighthouse is stopped: no tick, no ping read
        core.tick()
        assert sorted(core.state.seen) == ["a", "b"]
        assert core.lease.holders.keys() == {"a", "b"} and core.lease.lease_id == lease_id
        assert _events(queues["a"]) == [] and _events(queues["b"]) == []
        for _ in range(60):  # then silent for 6 s while it runs: that silence is theirs
            clock.advance(0.1)
            core.tick()
        assert core.state.seen == {}

    run(body())

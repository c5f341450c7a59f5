"""A manager server's side of a lighthouse outage, without sockets: what the lease
holder does when the liveness stream breaks and reopens, and the reconnect pace."""

from __future__ import annotations

import asyncio

from lighthouse.replica.lease_holder import LeaseHolder
from lighthouse.replica.link import RETRY_FAST_S, RETRY_MAX_S, retry_delay
from lighthouse.types import CollectivesDone, Quorum, QuorumMember

GENERATION = 1


def _holder(members: tuple[str, ...] = ("a", "b")) -> LeaseHolder:
    """A holder of lease 3 over `members`, all at step 5 (next leased round: 6)."""
    holder = LeaseHolder()
    quorum = Quorum(4, "ep", tuple(QuorumMember(r, step=5) for r in members))
    holder.take(quorum, 3, GENERATION, GENERATION, "ep")
    assert holder.lease_id == 3
    return holder


def test_a_round_waiting_for_the_slowest_holder_wakes_when_the_stream_breaks() -> None:
    holder = _holder()
    assert holder.answer(6, True, GENERATION) is not None  # leased step 6
    assert holder.must_wait(7, True, GENERATION)  # b has not started step 6 yet

    async def scenario() -> bool:
        # Only the lighthouse reports the floor: without a wake-up this waits 60 s.
        waiting = asyncio.ensure_future(holder.wait_floor(7, 60.0))
        await asyncio.sleep(0)  # let it start waiting
        holder.on_stream_broken()
        await asyncio.wait_for(waiting, 10.0)
        return holder.answer(7, True, None) is None  # void: the round asks the lighthouse

    assert asyncio.run(scenario())
    assert holder.lease_id == 0


def test_a_reopened_stream_fails_the_undecided_leased_step_naming_the_peers() -> None:
    holder = _holder(("a", "b", "c"))
    assert holder.answer(6, True, GENERATION) is not None
    notice = holder.on_stream_reopened("b", resolved_step=5)
    assert notice is not None
    assert (notice.epoch, notice.quorum_id, notice.step) == ("ep", 4, 6)
    assert notice.dead_replica_ids == ("a", "c")
    assert holder.lease_id == 0  # and the lease is void
    assert holder.on_stream_reopened("b", resolved_step=5) is None  # told once


def test_a_reopened_stream_leaves_a_decided_step_and_a_lone_member_alone() -> None:
    decided = _holder()
    assert decided.answer(6, True, GENERATION) is not None
    assert decided.on_stream_reopened("a", resolved_step=6) is None
    assert decided.lease_id == 0
    alone = _holder(("a",))
    assert alone.answer(6, True, GENERATION) is not None
    assert alone.on_stream_reopened("a", resolved_step=5) is None
    fresh = _holder()  # no leased round yet: nothing in progress
    assert fresh.on_stream_reopened("a", resolved_step=-1) is None


def test_reconnect_pace_is_fast_for_the_first_second_then_backs_off() -> None:
    assert retry_delay(0.0, 0.0) == RETRY_FAST_S
    assert retry_delay(0.99, RETRY_FAST_S) == RETRY_FAST_S
    delays = []
    delay = RETRY_FAST_S
    for _ in range(20):
        delay = retry_delay(1.5, delay)
        delays.append(delay)
    assert delays == sorted(delays) and delays[0] > RETRY_FAST_S
    assert delays[-1] == RETRY_MAX_S


def test_with_the_stream_broken_rounds_the_groups_collectives_prove_go_on() -> None:
    """The lighthouse is away: no floor comes from it, but a collective of the lease's
    quorum that completed at step s proves every holder began s, so round s + 1 is
    answered from the lease; a proof about another quorum proves nothing."""
    holder = _holder()
    assert holder.answer(6, True, GENERATION) is not None
    assert holder.must_wait(7, True, GENERATION)  # no floor for step 6 yet
    holder.proven(CollectivesDone(epoch="ep", quorum_id=4, step=6))
    assert not holder.must_wait(7, True, GENERATION)
    holder.on_stream_broken()
    assert holder.answer(7, True, None) is not None  # leased, the stream broken
    holder.proven(CollectivesDone(epoch="ep", quorum_id=5, step=7))  # not this lease's
    holder.proven(CollectivesDone(epoch="other", quorum_id=4, step=7))
    assert not holder.must_wait(8, True, None)  # broken: nothing to wait for ...
    assert holder.answer(8, True, None) is None  # ... and nothing proves step 7: void
    assert holder.lease_id == 0


def test_a_reopened_stream_voids_a_lease_that_ran_on_while_it_was_broken() -> None:
    holder = _holder(("a", "b"))
    holder.on_stream_broken()
    holder.proven(CollectivesDone(epoch="ep", quorum_id=4, step=5))
    assert holder.answer(6, True, None) is not None
    notice = holder.on_stream_reopened("a", resolved_step=5)  # step 6 not decided yet
    assert notice is not None and notice.step == 6 and notice.dead_replica_ids == ("b",)
    assert holder.lease_id == 0
    assert holder.answer(7, True, GENERATION + 1) is None

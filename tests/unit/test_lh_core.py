"""LighthouseCore on an event loop with a fake clock: futures, deaths, notices (no sockets)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lighthouse import wire
from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import LighthouseCore, SupersededError
from lighthouse.coordinator.quorum import DecisionKind, QuorumConfig
from lighthouse.types import FailureNotice, QuorumMember, QuorumWait

# without leases: these tests read failure notices off the streams, not recalls
CFG = QuorumConfig(min_replicas=2, join_timeout_s=30.0, heartbeat_timeout_s=5.0, lease=False)


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_members_get_one_shared_payload_and_survivors_hear_of_a_death() -> None:
    async def body() -> None:
        clock = FakeClock()
        core = LighthouseCore(CFG, clock, "ep")
        queues = {rid: asyncio.Queue[bytes]() for rid in "abc"}
        for rid, q in queues.items():
            core.stream_opened(rid, q)
        futs = [core.request(QuorumMember(rid)) for rid in "abc"]
        payloads = [await f for f in futs]
        assert payloads[0] is payloads[1] is payloads[2]  # serialized once
        assert wire.decode_lighthouse_quorum_response(payloads[0]).replica_ids == ["a", "b", "c"]
        fa, fb = core.request(QuorumMember("a")), core.request(QuorumMember("b"))
        assert not fa.done() and core.decision.kind is DecisionKind.JOIN_TIMEOUT
        core.stream_closed("c", queues["c"])  # c's process died: stream broke
        quorum = wire.decode_lighthouse_quorum_response(await fa)
        assert quorum.replica_ids == ["a", "b"] and quorum.quorum_id == 2
        assert (await fb) is not None
        for rid in "ab":
            _epoch, notice = wire.decode_liveness_event(queues[rid].get_nowait())
            assert isinstance(notice, FailureNotice) and notice.dead_replica_ids == ("c",)
            assert (notice.epoch, notice.quorum_id) == ("ep", 1)
        assert queues["c"].empty()
        assert core.recent_deaths[-1]["replica_id"] == "c"

    run(body())


def test_heartbeat_timeout_is_the_fallback_for_a_silent_host() -> None:
    async def body() -> None:
        clock = FakeClock()
        core = LighthouseCore(CFG, clock, "ep")
        qc: asyncio.Queue[bytes] = asyncio.Queue()
        core.stream_opened("c", qc)
        futs = [core.request(QuorumMember(rid)) for rid in "abc"]
        await asyncio.gather(*futs)
        fa, fb = core.request(QuorumMember("a")), core.request(QuorumMember("b"))
        clock.advance(4.9)
        core.tick()
        assert not fa.done()
        clock.advance(0.2)
        core.tick()  # c silent for 5.1 s: declared dead, its stream told to hang up
        assert (await fa) and (await fb)
        assert qc.get_nowait() == b""
        assert "no heartbeat" in core.recent_deaths[-1]["reason"]

    run(body())


def test_a_second_request_from_the_same_replica_supersedes_the_first() -> None:
    async def body() -> None:
        core = LighthouseCore(CFG, FakeClock(), "ep")
        first = core.request(QuorumMember("a"))
        second = core.request(QuorumMember("a"))
        with pytest.raises(SupersededError, match="newer quorum request"):
            await first
        core.withdraw("a", second)
        assert "a" not in core.state.pending
        snap = core.snapshot()
        assert snap["epoch"] == "ep" and snap["next_quorum"]["kind"] == "idle"
        # /status carries the tag as a plain string, byte for byte as before the enum.
        assert type(snap["next_quorum"]["kind"]) is str
        assert '"kind": "idle"' in json.dumps(snap["next_quorum"])

    run(body())


def test_snapshot_reports_step_times_slowest_vs_median() -> None:
    async def body() -> None:
        core = LighthouseCore(QuorumConfig(min_replicas=3), FakeClock(), "ep")
        futs = [
            core.request(QuorumMember(rid, step=4, step_time_ms=t))
            for rid, t in (("a", 100.0), ("b", 110.0), ("c", 300.0))
        ]
        await asyncio.gather(*futs)
        report = core.snapshot()["step_report"]
        assert report["median_step_time_ms"] == 110.0
        assert report["slowest_replica_id"] == "c"
        assert report["slowest_over_median"] == pytest.approx(300 / 110, rel=1e-3)

    run(body())


def test_step_time_report_names_the_slowest_replica_and_the_imbalance() -> None:
    from lighthouse.coordinator.core import step_time_report

    assert step_time_report([]) is None
    report = step_time_report([(100.0, "a"), (110.0, "b"), (300.0, "c")])
    assert report == {
        "median_step_time_ms": 110.0,
        "slowest_replica_id": "c",
        "slowest_step_time_ms": 300.0,
        "slowest_over_median": 2.727,
    }


def test_a_leave_announced_on_another_stream_does_not_hide_the_real_streams_death() -> None:
    async def body() -> None:
        core = LighthouseCore(CFG, FakeClock(), "ep")
        queues = {rid: asyncio.Queue[bytes]() for rid in "abc"}
        for rid, q in queues.items():
            core.stream_opened(rid, q)
        await asyncio.gather(*(core.request(QuorumMember(rid)) for rid in "abc"))
        spoof: asyncio.Queue[bytes] = asyncio.Queue()
        core.stream_opened("c", spoof)  # a second stream under c's id says it leaves
        core.replica_leaving("c", spoof, 10)
        core.stream_closed("c", spoof)
        assert list(core.recent_deaths) == [] and queues["a"].empty()
        core.stream_closed("c", queues["c"])  # then the real c crashes
        assert core.recent_deaths[-1]["replica_id"] == "c"
        for rid in "ab":
            _epoch, notice = wire.decode_liveness_event(queues[rid].get_nowait())
            assert isinstance(notice, FailureNotice) and notice.dead_replica_ids == ("c",)

    run(body())


def test_a_leave_announced_on_the_replicas_own_stream_is_not_a_death() -> None:
    async def body() -> None:
        core = LighthouseCore(CFG, FakeClock(), "ep")
        queues = {rid: asyncio.Queue[bytes]() for rid in "abc"}
        for rid, q in queues.items():
            core.stream_opened(rid, q)
        await asyncio.gather(*(core.request(QuorumMember(rid)) for rid in "abc"))
        core.replica_leaving("c", queues["c"], 10)
        core.stream_closed("c", queues["c"])
        assert list(core.recent_deaths) == [] and queues["a"].empty() and queues["b"].empty()

    run(body())


def _waits(q: asyncio.Queue[bytes]) -> list[QuorumWait]:
    out = []
    while not q.empty():
        event = wire.decode_liveness_event(q.get_nowait())[1]
        assert isinstance(event, QuorumWait), event
        out.append(event)
    return out


def test_a_waiting_asker_hears_why_on_its_stream_once_per_change() -> None:
    """The tick tells each waiting asker the rule that holds its quorum back: once,
    again only when the reason changes, and not once it is in a quorum."""

    async def body() -> None:
        clock = FakeClock()
        core = LighthouseCore(CFG, clock, "ep")
        q: asyncio.Queue[bytes] = asyncio.Queue()
        core.stream_opened("a", q)
        fa = core.request(QuorumMember("a", step=0))
        core.tick()
        (wait,) = _waits(q)
        assert wait.kind == "min_replicas"
        assert "1 replica(s) asked, need min_replicas=2" in wait.reason, wait
        clock.advance(3)
        core.tick()
        assert _waits(q) == []  # nothing new: nothing said
        fb = core.request(QuorumMember("b", step=0))
        assert (await fa) == (await fb)
        core.tick()
        assert _waits(q) == []  # in a quorum: nothing to wait for
        core.request(QuorumMember("a", step=1))  # b has not asked yet: a waits again
        core.tick()
        assert _waits(q) == [QuorumWait(kind=core.decision.kind, reason=core.decision.reason)]

    run(body())

"""The history as the lighthouse core records it: /status fields, health rows, metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lighthouse.clock import FakeClock
from lighthouse.coordinator import dashboard
from lighthouse.coordinator.core import LighthouseCore
from lighthouse.coordinator.health import Health, replica_health
from lighthouse.coordinator.history import EventKind, StepHistory
from lighthouse.coordinator.job_state import JobStateFile
from lighthouse.coordinator.quorum import QuorumConfig, QuorumState
from lighthouse.coordinator.status import LighthouseMetrics
from lighthouse.types import HealReport, QuorumMember

CFG = QuorumConfig(min_replicas=2, join_timeout_s=30.0, heartbeat_timeout_s=5.0, lease=False)

# /status fields that existed before the history; other code and tests read them.
EXISTING_FIELDS = {
    "epoch",
    "quorum_id",
    "quorums_issued",
    "committed_step",
    "job_state_file",
    "quorum",
    "next_quorum",
    "live",
    "live_count",
    "recent_deaths",
    "quarantined",
    "recent_quarantines",
    "step_report",
    "config",
}


def test_a_kill_and_a_rejoin_show_in_status_health_and_metrics() -> None:
    async def body() -> None:
        clock = FakeClock()
        metrics = LighthouseMetrics()
        core = LighthouseCore(CFG, clock, "ep", metrics)
        queues = {rid: asyncio.Queue[bytes]() for rid in ("a", "b", "c")}
        for rid, q in queues.items():
            core.stream_opened(rid, q)
        for rid in queues:
            core.request(QuorumMember(rid, step=0, step_time_ms=10.0))
        for t in range(1, 6):
            clock.advance(2.0)
            for rid in queues:
                core.progress(rid, 10 * t, 20.0)
        core.stream_closed("c", queues["c"])  # c's process died
        core.request(QuorumMember("a", step=50, step_time_ms=20.0))
        core.request(QuorumMember("b", step=50, step_time_ms=20.0))
        clock.advance(1.0)
        core.stream_opened("c2", asyncio.Queue())
        for rid, step in (("c2", 0), ("a", 51), ("b", 51)):
            core.request(QuorumMember(rid, step=step))
        clock.advance(0.5)
        core.progress("c2", 51, 25.0)
        snap = core.snapshot()
        json.dumps(snap)
        assert set(snap) >= EXISTING_FIELDS
        kinds = [
            (e["kind"], tuple(e["replica_ids"] + e["joined"] + e["left"]))
            for e in snap["history"]["timeline"]
        ]
        assert kinds[0][0] == "started"
        assert ("death", ("c",)) in kinds and ("heal", ("c2",)) in kinds
        assert ("caught_up", ("c2",)) in kinds
        caught = [e for e in snap["history"]["timeline"] if e["kind"] == "caught_up"]
        assert caught[0]["seconds"] == 0.5
        series = {s["replica_id"]: s for s in snap["history"]["replicas"]}
        assert series["a"]["steps_per_s"][1:5] == [5.0, 5.0, 5.0, 5.0]
        assert series["a"]["step_time_reported"]
        health = {row["replica_id"]: row for row in snap["health"]}
        assert health["c"]["status"] == "dead" and health["c"]["lag"] is None
        assert health["c2"]["status"] == "ok" and health["c2"]["in_quorum"]
        assert health["a"]["step_time_ms"] == 20.0 and not health["a"]["step_time_derived"]
        members = {m["replica_id"]: m for m in snap["quorum"]["members"]}
        assert members["c2"]["step"] == 0 and members["c2"]["latest_step"] == 51
        text = metrics.render().decode()
        assert 'lighthouse_replica_step{replica_id="c2"} 51.0' in text
        assert 'lighthouse_replica_step_time_seconds{replica_id="a"} 0.02' in text
        assert 'replica_id="c"}' not in text  # the dead one's series are dropped
        assert "lighthouse_heals_total 1.0" in text
        assert "lighthouse_heal_catch_up_seconds_count 1.0" in text
        assert "lighthouse_quarantines_total 0.0" in text

    asyncio.run(body())


def test_a_reported_heal_shows_in_status_and_metrics_once() -> None:
    async def body() -> None:
        clock = FakeClock()
        metrics = LighthouseMetrics()
        core = LighthouseCore(CFG, clock, "ep", metrics)
        for rid in ("a", "b"):
            core.stream_opened(rid, asyncio.Queue())
            core.request(QuorumMember(rid, step=7))
        clock.advance(1.0)
        core.stream_opened("b2", asyncio.Queue())
        for rid, step in (("b2", 0), ("a", 8), ("b", 8)):
            core.request(QuorumMember(rid, step=step))  # b2 heals from a peer
        clock.advance(0.75)
        heal = HealReport(step=8, bytes_received=48_000_000, transfer_s=0.25)
        # b2's next round: its ping and its quorum request both carry the report
        core.progress("b2", 9, 30.0, heal)
        core.request(QuorumMember("b2", step=9, heal=heal))
        snap = core.snapshot()
        json.dumps(snap)
        caught = [e for e in snap["history"]["timeline"] if e["kind"] == "caught_up"]
        assert len(caught) == 1 and caught[0]["replica_ids"] == ["b2"]
        assert caught[0]["seconds"] == 0.75
        assert caught[0]["heal_bytes"] == 48_000_000 and caught[0]["heal_s"] == 0.25
        assert caught[0]["heal_gb_per_s"] == 0.192
        assert "48 MB in 0.25 s (0.192 GB/s)" in caught[0]["text"]
        assert snap["history"]["heals_reported"] == 1
        assert snap["history"]["heal_bytes_total"] == 48_000_000
        assert [h["replica_id"] for h in snap["history"]["heals"]] == ["b2"]
        text = metrics.render().decode()
        assert 'lighthouse_replica_heal_bytes{replica_id="b2"} 4.8e+07' in text
        assert 'lighthouse_replica_heal_seconds{replica_id="b2"} 0.25' in text
        assert "lighthouse_heal_bytes_total 4.8e+07" in text

    asyncio.run(body())


def test_a_restarted_lighthouse_starts_its_timeline_with_the_restored_step(tmp_path: Path) -> None:
    state = JobStateFile(tmp_path / "lh.state.json")
    state.record(77)
    state.flush()
    core = LighthouseCore(CFG, FakeClock(), "ep2", None, JobStateFile(state.path))
    (event,) = core.snapshot()["history"]["timeline"]
    assert event["kind"] == "started" and event["step"] == 77
    assert "restored from the state file" in event["text"]


def test_health_says_behind_failing_silent_waiting_and_quarantined() -> None:
    state = QuorumState("ep")
    for rid in ("ok", "slow", "quiet", "held", "stuck"):
        state.request(QuorumMember(rid, step=10), now=0.0)
    state.issue(tuple(p.member for p in state.pending.values()), now=0.0, created_unix_ms=0)
    for rid in ("ok", "slow", "quiet", "held", "stuck"):  # committed step 10 together: proven
        state.report_progress(rid, 11, 5.0)
    state.request(QuorumMember("new", step=0), now=0.0)
    # its last two steps did not commit (e.g. fewer groups than its min_replica_size)
    state.request(QuorumMember("stuck", step=19, commit_failures=2), now=3.0)
    assert state.committed_step == 11
    state.report_progress("ok", 20, 5.0)
    state.heartbeat("ok", 3.0)
    state.heartbeat("slow", 3.0)
    state.heartbeat("held", 3.0)
    state.heartbeat("new", 3.0)
    state.quarantine(("held",), 3.0, CFG, "never committed")
    rows = replica_health(
        state=state,
        now=3.0,
        heartbeat_timeout_s=5.0,
        streams={"ok": 1},
        steps=StepHistory(),
        gone=lambda rid: EventKind.DEATH if rid == "gone" else None,
    )
    status = {r.replica_id: r.status for r in rows}
    assert status == {
        "ok": Health.OK,
        "slow": Health.BEHIND,  # step 11 while a proven peer is at 20 (a lag of 2 is normal)
        "quiet": Health.SILENT,  # last seen 3 s ago, with a 5 s heartbeat timeout
        "held": Health.QUARANTINED,
        "new": Health.WAITING,
        "stuck": Health.FAILING,
    }
    assert next(r for r in rows if r.replica_id == "stuck").commit_failures == 2
    ok = next(r for r in rows if r.replica_id == "ok")
    assert ok.step == 20 and ok.lag == 0 and ok.liveness_streams == 1


def test_the_served_page_is_one_document_with_its_style_and_script_inlined() -> None:
    page = dashboard.dashboard_page().decode()
    assert "/* dashboard.css */" not in page and "/* dashboard.js */" not in page
    assert "function chart(" in page and ".replica {" in page  # the script and the style
    assert "<script src" not in page and "<link" not in page
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere

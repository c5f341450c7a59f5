"""Silent data corruption as the lighthouse sees it, driven by a fake clock (no sockets).

A replica's integrity report is recorded (timeline, /status, /metrics) and a
replica whose own state diverged `quarantine_after_divergences` times within
the window is quarantined (rule 10), never below `min_replicas`.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import generate_latest

from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import LighthouseCore
from lighthouse.coordinator.integrity import (
    DivergenceLog,
    divergence_reason,
    repeat_offenders,
)
from lighthouse.coordinator.quorum import DecisionKind, QuorumConfig, QuorumState, decide_quorum
from lighthouse.coordinator.status import LighthouseMetrics
from lighthouse.types import IntegrityKind, IntegrityReport, QuorumMember

D, H, N = (
    IntegrityKind.DIVERGED,
    IntegrityKind.HEAL_SOURCE_DIVERGED,
    IntegrityKind.NO_MAJORITY,
)
CFG = QuorumConfig(
    min_replicas=2,
    join_timeout_s=30.0,
    heartbeat_timeout_s=5.0,
    lease=False,
    quarantine_after_divergences=3,
    divergence_window_s=600.0,
)


def report(step: int, kind: IntegrityKind = D, *tensors: str) -> IntegrityReport:
    return IntegrityReport(step=step, kind=kind, tensors=tensors or ("1.weight",))


# -- the pure rule ------------------------------------------------------------------------
def offenders(log: DivergenceLog, now: float, live: int = 5, min_replicas: int = 1) -> tuple:
    return repeat_offenders(
        log,
        now,
        after=3,
        window_s=100.0,
        live=live,
        min_replicas=min_replicas,
        is_quarantined=lambda rid: False,
    )


def test_only_own_divergences_within_the_window_count() -> None:
    log = DivergenceLog()
    for t, kind in ((0, D), (10, H), (20, N), (30, D)):
        assert log.reported("a", report(t, kind), float(t))
    assert log.count("a", 30.0, 100.0) == 2  # the healer's word and no-majority blame nobody
    assert offenders(log, 30.0) == ()
    log.reported("a", report(40), 40.0)
    assert offenders(log, 40.0) == (("a", 3),)
    assert offenders(log, 100.5) == ()  # the first one left the window
    assert log.count("a", 100.5, 100.0) == 2


def test_the_same_report_twice_counts_once() -> None:
    log = DivergenceLog()
    assert log.reported("a", report(6), 0.0)
    assert not log.reported("a", report(6), 1.0)  # a resent request
    assert log.count("a", 1.0, 100.0) == 1


def test_a_quarantine_starts_the_count_afresh_and_forget_drops_all() -> None:
    log = DivergenceLog()
    for step in (3, 6, 9):
        log.reported("a", report(step), float(step))
    log.quarantined("a")
    assert log.count("a", 10.0, 100.0) == 0 and offenders(log, 10.0) == ()
    assert log.last_diverged("a") == report(9)  # still named in the next reason
    log.forget("a")
    assert log.last_diverged("a") is None and log.replica_ids() == []
    assert log.reported("a", report(9), 11.0)  # a forgotten replica's report is new


def test_never_below_min_replicas_and_the_worst_first() -> None:
    log = DivergenceLog()
    for step in range(1, 5):
        log.reported("b", report(step), float(step))
    for step in range(1, 4):
        log.reported("a", report(step), float(step))
        log.reported("c", report(step), float(step))
    assert offenders(log, 5.0, live=5, min_replicas=1) == (("b", 4), ("a", 3), ("c", 3))
    assert offenders(log, 5.0, live=4, min_replicas=2) == (("b", 4), ("a", 3))
    assert offenders(log, 5.0, live=2, min_replicas=2) == ()
    skip_b = repeat_offenders(
        log, 5.0, after=3, window_s=100.0, live=5, min_replicas=1, is_quarantined="b".__eq__
    )
    assert skip_b == (("a", 3), ("c", 3))
    assert (
        repeat_offenders(
            log, 5.0, after=0, window_s=100.0, live=5, min_replicas=1, is_quarantined="".__eq__
        )
        == ()
    )


def test_the_reason_says_how_often_when_and_where() -> None:
    why = divergence_reason(3, report(9, D, "0.weight", "0.bias", "1.weight", "1.bias"), 3600.0)
    assert why == (
        "silent data corruption: state diverged from the majority 3 times (last at step 9: "
        "tensors 0.weight, 0.bias, 1.weight and 1 more) within 3600 s"
    )
    unnamed = IntegrityReport(step=4, kind=D)
    assert "(last at step 4: tensors not named)" in divergence_reason(3, unnamed, 60.0)


@pytest.mark.parametrize(
    ("field", "value"), [("quarantine_after_divergences", -1), ("divergence_window_s", 0.0)]
)
def test_config_refuses_bad_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        QuorumConfig(**{field: value})  # type: ignore[arg-type]


# -- rule 10 in the quorum rules -----------------------------------------------------------
def ask(state: QuorumState, clock: FakeClock, rid: str, integrity: IntegrityReport | None) -> None:
    state.request(QuorumMember(rid, step=9, commit_failures=1), clock.now())
    if integrity is not None:
        state.integrity_reported(rid, integrity, clock.now())


def test_rule_10_quarantines_the_repeat_offender_and_the_others_form_a_quorum() -> None:
    clock, state = FakeClock(), QuorumState("e")
    for step in (3, 6):
        ask(state, clock, "bad", report(step))
    for rid in ("a", "b"):
        ask(state, clock, rid, None)
    assert decide_quorum(clock.now(), state, CFG).kind is DecisionKind.READY  # two: not yet
    ask(state, clock, "bad", report(9, D, "1.weight", "0.bias"))
    d = decide_quorum(clock.now(), state, CFG)
    assert d.kind is DecisionKind.QUARANTINE and d.quarantine == ("bad",)
    assert (
        "silent data corruption: state diverged from the majority 3 times (last at step 9: "
        "tensors 1.weight, 0.bias)" in d.reason
    )
    state.quarantine(d.quarantine, clock.now(), CFG, d.reason)
    d = decide_quorum(clock.now(), state, CFG)
    assert d.members is not None and [m.replica_id for m in d.members] == ["a", "b"]
    # released after the backoff, it is not quarantined again without new findings
    clock.advance(CFG.quarantine_base_s + 1)
    for rid in ("a", "b", "bad"):
        ask(state, clock, rid, None)
    assert decide_quorum(clock.now(), state, CFG).kind is not DecisionKind.QUARANTINE


def test_rule_10_keeps_min_replicas_and_can_be_turned_off() -> None:
    clock, state = FakeClock(), QuorumState("e")
    for step in (3, 6, 9):
        ask(state, clock, "bad", report(step))
    ask(state, clock, "a", None)
    # two live replicas and min_replicas=2: quarantining one would stop the job
    assert decide_quorum(clock.now(), state, CFG).kind is not DecisionKind.QUARANTINE
    off = QuorumConfig(**{**CFG.__dict__, "quarantine_after_divergences": 0})
    ask(state, clock, "b", None)
    assert decide_quorum(clock.now(), state, off).kind is not DecisionKind.QUARANTINE
    assert decide_quorum(clock.now(), state, CFG).quarantine == ("bad",)


# -- the core: timeline, /status, /metrics, quarantine -----------------------------------------
def test_a_report_shows_on_the_timeline_status_and_metrics_and_k_reports_quarantine() -> None:
    async def body() -> None:
        clock = FakeClock()
        metrics = LighthouseMetrics()
        core = LighthouseCore(CFG, clock, "ep", metrics)
        for rid in ("a", "b", "bad"):
            core.stream_opened(rid, asyncio.Queue())
        for rid in ("a", "b", "bad"):
            core.request(QuorumMember(rid, step=0))
        steps = (3, 6, 9)
        for n, step in enumerate(steps, start=1):
            clock.advance(1.0)
            found = report(step, D, "1.weight")
            core.request(QuorumMember("bad", step=step, commit_failures=1, integrity=found))
            core.request(QuorumMember("bad", step=step, commit_failures=1, integrity=found))
            if n == 1:  # a healer's word about its source: recorded, blames nobody
                core.request(
                    QuorumMember("a", step=step, commit_failures=1, integrity=report(step, H))
                )
        snap = core.snapshot()
        json.dumps(snap)
        findings = snap["recent_integrity_findings"]
        assert [(f["replica_id"], f["kind"], f["step"]) for f in findings] == [
            ("bad", "diverged", 3),
            ("a", "heal_source_diverged", 3),
            ("bad", "diverged", 6),
            ("bad", "diverged", 9),
        ]  # a resent request is recorded once
        assert findings[-1]["tensors"] == ["1.weight"]
        assert findings[-1]["divergences_in_window"] == 3
        events = [e for e in snap["history"]["timeline"] if e["kind"] == "integrity"]
        assert [(e["replica_ids"], e["step"], e["integrity_kind"]) for e in events] == [
            (["bad"], 3, "diverged"),
            (["a"], 3, "heal_source_diverged"),
            (["bad"], 6, "diverged"),
            (["bad"], 9, "diverged"),
        ]
        assert "silent data corruption at step 9" in events[-1]["text"]
        assert snap["history"]["integrity_findings"] == 4
        (held,) = snap["quarantined"]
        assert held["replica_id"] == "bad" and held["strikes"] == 1
        assert "state diverged from the majority 3 times (last at step 9" in held["reason"]
        assert snap["recent_quarantines"][-1]["replica_id"] == "bad"
        quarantines = [e for e in snap["history"]["timeline"] if e["kind"] == "quarantine"]
        assert "silent data corruption" in quarantines[-1]["text"]
        assert core.quarantine_reason("bad") is not None
        text = generate_latest(metrics.registry).decode()
        assert 'lighthouse_integrity_divergences_total{kind="diverged"} 3.0' in text
        assert 'lighthouse_integrity_divergences_total{kind="heal_source_diverged"} 1.0' in text
        assert "lighthouse_quarantines_total 1.0" in text
        # forgotten when it dies: a new incarnation starts with a clean record
        core.stream_closed("bad", next(iter(core.streams["bad"])))
        assert core.state.divergences.replica_ids() == []

    asyncio.run(body())


def test_the_command_line_and_the_server_take_the_rule_10_options() -> None:
    from lighthouse.coordinator.cli import build_parser
    from lighthouse.coordinator.server import LighthouseServer

    args = build_parser().parse_args([])
    assert args.quarantine_after_divergences == 3
    assert args.divergence_window_ms == 3_600_000
    args = build_parser().parse_args(
        ["--quarantine-after-divergences", "0", "--divergence-window-ms", "60000"]
    )
    assert args.quarantine_after_divergences == 0 and args.divergence_window_ms == 60_000
    # refused before anything listens
    with pytest.raises(ValueError, match="divergence_window_ms"):
        LighthouseServer(bind="127.0.0.1:0", divergence_window_ms=0)
    with pytest.raises(ValueError, match="quarantine_after_divergences"):
        LighthouseServer(bind="127.0.0.1:0", quarantine_after_divergences=-1)
    with pytest.raises(TypeError, match="quarantine_after_divergences"):
        LighthouseServer(bind="127.0.0.1:0", quarantine_after_divergences=2.5)  # type: ignore[arg-type]

"""The dashboard's history buffers and event recorder, with plain numbers (no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lighthouse.coordinator.history import (
    EventKind,
    JobHistory,
    StepHistory,
    Timeline,
    TimelineEvent,
    format_bytes,
    heal_figures,
)
from lighthouse.types import HealReport, IntegrityKind, IntegrityReport, Quorum, QuorumMember


def quorum(qid: int, steps: dict[str, int]) -> Quorum:
    members = tuple(QuorumMember(rid, step=s) for rid, s in sorted(steps.items()))
    return Quorum(qid, "ep", members, 0)


@dataclass
class RecordedMetrics:
    """A HistoryMetrics sink that keeps what it was told."""

    progress: list[tuple[str, int, float]] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    heal_counts: list[int] = field(default_factory=list)
    catch_ups: list[float] = field(default_factory=list)
    quarantine_counts: list[int] = field(default_factory=list)
    heal_reports: list[tuple[str, int, float]] = field(default_factory=list)
    integrity_kinds: list[str] = field(default_factory=list)

    def replica_progress(self, replica_id: str, step: int, step_time_ms: float) -> None:
        self.progress.append((replica_id, step, step_time_ms))

    def replica_gone(self, replica_id: str) -> None:
        self.gone.append(replica_id)

    def heals(self, count: int) -> None:
        self.heal_counts.append(count)

    def caught_up(self, seconds: float) -> None:
        self.catch_ups.append(seconds)

    def quarantined(self, count: int) -> None:
        self.quarantine_counts.append(count)

    def heal_reported(self, replica_id: str, nbytes: int, seconds: float) -> None:
        self.heal_reports.append((replica_id, nbytes, seconds))

    def integrity_reported(self, kind: str) -> None:
        self.integrity_kinds.append(kind)


# -- StepHistory ----------------------------------------------------------------------
def test_samples_are_kept_at_most_once_per_interval_and_rates_come_from_consecutive_ones() -> None:
    h = StepHistory(window_s=60, sample_interval_s=2)
    kept = [
        h.record("a", step, 0.0, t) for t, step in [(0, 0), (1, 5), (2, 10), (3.9, 19), (4, 20)]
    ]
    assert kept == [True, False, True, False, True]
    (series,) = h.series(now=4)
    assert series.age_s == (4, 2, 0) and series.step == (0, 10, 20)
    assert series.steps_per_s == (None, 5.0, 5.0)
    # nothing reported: step times derived from the interval (2 s per 10 steps)
    assert series.step_time_ms == (None, 200.0, 200.0) and not series.step_time_reported


def test_reported_step_times_win_and_unreported_samples_leave_gaps_not_derived_values() -> None:
    h = StepHistory(window_s=60, sample_interval_s=1)
    h.record("a", 0, 40.0, 0)
    h.record("a", 10, 0.0, 1)  # e.g. a request without telemetry
    h.record("a", 20, 55.5, 2)
    (series,) = h.series(now=2)
    assert series.step_time_reported
    assert series.step_time_ms == (40.0, None, 55.5)


def test_samples_older_than_the_window_are_dropped_and_silent_replicas_forgotten() -> None:
    h = StepHistory(window_s=10, sample_interval_s=1)
    for t in range(0, 6):
        h.record("a", t, 0.0, t)
    h.record("b", 0, 0.0, 12)
    series = {s.replica_id: s for s in h.series(now=14)}
    assert series["a"].step == (4, 5)  # t=0..3 are past the 10 s window
    series = {s.replica_id: s for s in h.series(now=16)}
    assert list(series) == ["b"] and h.replica_ids() == ["b"]


def test_a_step_going_down_starts_a_new_segment_at_once() -> None:
    h = StepHistory(window_s=60, sample_interval_s=5)
    h.record("a", 100, 0.0, 0)
    assert h.record("a", 0, 0.0, 1)  # within the interval, but a reset: kept
    (series,) = h.series(now=1)
    assert series.step == (100, 0) and series.steps_per_s == (None, None)


def test_a_heal_jump_is_kept_at_once_and_no_rate_spans_it() -> None:
    h = StepHistory(window_s=60, sample_interval_s=2)
    h.record("a", 0, 0.0, 0)
    assert h.record("a", 500, 0.0, 0.5, jump=True)
    h.record("a", 510, 0.0, 2.5)
    (series,) = h.series(now=2.5)
    assert series.steps_per_s == (None, None, 5.0)
    assert h.recent_rate("a", now=2.5) == 5.0  # measured from the jump on, not across it


def test_recent_rate_is_zero_for_a_replica_that_stopped_reporting() -> None:
    h = StepHistory(window_s=300, sample_interval_s=1)
    assert h.recent_rate("a", 0) is None
    h.record("a", 0, 0.0, 0)
    assert h.recent_rate("a", 0) is None  # one sample: no rate yet
    for t in range(1, 21):
        h.record("a", 3 * t, 0.0, t)
    assert h.recent_rate("a", now=20) == pytest.approx(3.0)
    assert h.recent_rate("a", now=31) == 0.0


def test_the_longest_silent_replica_makes_room_for_a_new_one() -> None:
    h = StepHistory(window_s=60, sample_interval_s=1, max_replicas=2)
    h.record("old", 0, 0.0, 0)
    h.record("mid", 0, 0.0, 5)
    h.record("new", 0, 0.0, 6)
    assert sorted(h.replica_ids()) == ["mid", "new"]


def test_a_replica_heard_from_recently_stays_even_without_a_new_sample() -> None:
    # "a" reports again within the sample interval (nothing kept), yet it was heard
    # from after "b": the room for "c" is made by dropping "b".
    h = StepHistory(window_s=60, sample_interval_s=10, max_replicas=2)
    h.record("a", 0, 0.0, 0)
    h.record("b", 0, 0.0, 1)
    assert not h.record("a", 1, 0.0, 2)
    h.record("c", 0, 0.0, 3)
    assert sorted(h.replica_ids()) == ["a", "c"]


def test_more_replicas_than_the_cap_rotate_in_arrival_order() -> None:
    # 5 replicas reporting in turn through a cap of 3: each newcomer pushes out the
    # one heard from longest ago, so the 3 most recent are always the ones kept.
    h = StepHistory(window_s=60, sample_interval_s=1, max_replicas=3)
    ids = [f"r{i}" for i in range(5)]
    for t in range(20):
        h.record(ids[t % 5], t, 0.0, float(t))
        recent = {ids[k % 5] for k in range(max(0, t - 2), t + 1)}
        assert set(h.replica_ids()) == recent
    assert len(h) == 3


def test_per_replica_buffers_are_bounded_by_the_window() -> None:
    h = StepHistory(window_s=10, sample_interval_s=1)
    for t in range(1000):
        h.record("a", t, 0.0, t)
    (series,) = h.series(now=999)
    assert len(series.step) <= 11


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window_s": 0}, "window_s must be a finite number > 0, got 0"),
        ({"sample_interval_s": float("nan")}, "sample_interval_s must be a finite number > 0"),
        ({"max_replicas": 0}, "max_replicas must be an int >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StepHistory(**kwargs)  # type: ignore[arg-type]


# -- Timeline --------------------------------------------------------------------------
def test_the_timeline_keeps_the_newest_events_and_counts_all() -> None:
    tl = Timeline(capacity=3)
    for i in range(5):
        tl.add(TimelineEvent(kind=EventKind.LEFT, unix_ms=i, text=str(i)))
    assert [e.unix_ms for e in tl.events()] == [2, 3, 4] and tl.total == 5
    with pytest.raises(ValueError, match="capacity must be an int >= 1, got 0"):
        Timeline(0)


# -- JobHistory ------------------------------------------------------------------------
def test_a_death_then_a_rejoin_behind_records_quorums_a_heal_and_its_catch_up() -> None:
    metrics = RecordedMetrics()
    h = JobHistory(metrics=metrics)
    h.started("ep", 0, unix_ms=1_000)
    q1 = quorum(1, {"a": 10, "b": 10, "c": 10})
    h.quorum_issued(q1, None, "ready", now=0, unix_ms=1_000)
    h.died(["c"], "liveness stream closed", unix_ms=2_000)
    q2 = quorum(2, {"a": 20, "b": 20})
    h.quorum_issued(q2, q1, "ready", now=2, unix_ms=2_100)
    q3 = quorum(3, {"a": 30, "b": 30, "c2": 0})
    h.quorum_issued(q3, q2, "fast", now=5, unix_ms=5_000)
    h.progress("c2", 0, 0.0, now=5.5, unix_ms=5_500)  # still healing
    h.progress("c2", 30, 12.0, now=6.25, unix_ms=6_250)
    events = h.timeline.events()
    assert [e.kind for e in events] == [
        EventKind.STARTED,
        EventKind.QUORUM,
        EventKind.DEATH,
        EventKind.QUORUM,
        EventKind.QUORUM,
        EventKind.HEAL,
        EventKind.CAUGHT_UP,
    ]
    assert events[1].joined == ("a", "b", "c") and events[1].size == 3
    assert events[2].replica_ids == ("c",) and "liveness stream closed" in events[2].text
    assert events[3].left == ("c",) and events[3].joined == () and events[3].step == 20
    assert events[4].joined == ("c2",) and "joined c2" in events[4].text
    assert events[5].replica_ids == ("c2",) and events[5].step == 30
    assert events[6].seconds == 1.25 and "caught up to step 30" in events[6].text
    assert h.gone_reason("c") is EventKind.DEATH and h.gone_reason("a") is None
    assert metrics.gone == ["c"] and metrics.heal_counts == [1] and metrics.catch_ups == [1.25]
    (series,) = h.steps.series(now=6.25)
    assert series.steps_per_s == (None, None)  # the heal's jump is no rate


def test_a_new_id_with_the_same_members_says_why() -> None:
    h = JobHistory()
    q1 = quorum(1, {"a": 1, "b": 1})
    h.quorum_issued(q1, None, "ready", now=0, unix_ms=0)
    h.quorum_issued(quorum(2, {"a": 1, "b": 1}), q1, "fast", now=1, unix_ms=1)
    assert "same members, new id after failed commits" in h.timeline.events()[-1].text


def test_a_started_event_names_a_restored_committed_step() -> None:
    h = JobHistory()
    h.started("ep2", 1234, unix_ms=5)
    (event,) = h.timeline.events()
    assert event.kind is EventKind.STARTED and event.step == 1234
    assert "committed step 1234 restored from the state file" in event.text
    assert h.started_unix_ms == 5


def test_leaves_and_quarantines_are_recorded_and_reported() -> None:
    metrics = RecordedMetrics()
    h = JobHistory(metrics=metrics)
    h.progress("a", 3, 25.0, now=0, unix_ms=0)
    h.left("a", unix_ms=10)
    h.quarantined("b", 30.0, 2, "never committed", unix_ms=20)
    left, quarantine = h.timeline.events()
    assert left.kind is EventKind.LEFT and h.gone_reason("a") is EventKind.LEFT
    assert quarantine.seconds == 30.0 and "strike 2" in quarantine.text
    assert metrics.progress == [("a", 3, 25.0)] and metrics.gone == ["a"]
    assert metrics.quarantine_counts == [1]


def test_to_json_has_every_documented_field() -> None:
    h = JobHistory()
    h.started("ep", 0, unix_ms=0)
    h.progress("a", 1, 10.0, now=0, unix_ms=0)
    out = h.to_json(now=1, now_unix_ms=1_000)
    assert set(out) == {
        "now_unix_ms",
        "window_s",
        "sample_interval_s",
        "replicas",
        "timeline",
        "timeline_capacity",
        "timeline_total",
        "heals_reported",
        "heal_bytes_total",
        "heals",
        "integrity_findings",
    }
    assert set(out["replicas"][0]) == {
        "replica_id",
        "age_s",
        "step",
        "steps_per_s",
        "step_time_ms",
        "step_time_reported",
    }
    assert out["timeline"][0]["kind"] == "started"
    assert set(out["timeline"][0]) == {
        "kind",
        "unix_ms",
        "text",
        "replica_ids",
        "joined",
        "left",
        "quorum_id",
        "size",
        "step",
        "seconds",
        "heal_bytes",
        "heal_s",
        "heal_gb_per_s",
        "integrity_kind",
        "tensors",
    }


# -- heal reports ------------------------------------------------------------------------
def test_a_reported_heal_is_shown_on_the_catch_up_with_bytes_seconds_and_gb_per_s() -> None:
    metrics = RecordedMetrics()
    h = JobHistory(metrics=metrics)
    q1 = quorum(1, {"a": 30})
    h.quorum_issued(q1, None, "ready", now=0, unix_ms=0)
    h.quorum_issued(quorum(2, {"a": 30, "b": 0}), q1, "fast", now=5, unix_ms=5_000)
    report = HealReport(step=30, bytes_received=12_345_678, transfer_s=0.42)
    # its next request (or ping) carries the report and the step that makes it caught up
    h.progress("b", 31, 20.0, now=6.0, unix_ms=6_000, heal=report)
    h.progress("b", 31, 20.0, now=6.1, unix_ms=6_100, heal=report)  # the ping, same report
    heal, caught_up = h.timeline.events()[-2:]
    assert heal.kind is EventKind.HEAL and heal.heal_bytes is None  # issued before the transfer
    assert caught_up.kind is EventKind.CAUGHT_UP and caught_up.seconds == 1.0
    assert caught_up.heal_bytes == 12_345_678 and caught_up.heal_s == 0.42
    assert caught_up.heal_gb_per_s == pytest.approx(12_345_678 / 0.42 / 1e9)
    assert "its heal received 12.3 MB in 0.42 s (0.0294 GB/s)" in caught_up.text
    assert len(h.timeline.events()) == 4  # the repeated report added nothing
    assert metrics.heal_reports == [("b", 12_345_678, 0.42)]
    out = h.to_json(now=7, now_unix_ms=7_000)
    assert out["heals_reported"] == 1 and out["heal_bytes_total"] == 12_345_678
    assert out["heals"] == [
        {
            "replica_id": "b",
            "unix_ms": 6_000,
            "step": 30,
            "heal_bytes": 12_345_678,
            "heal_s": 0.42,
            "heal_gb_per_s": pytest.approx(12_345_678 / 0.42 / 1e9),
        }
    ]
    assert out["timeline"][-1]["heal_bytes"] == 12_345_678


def test_a_heal_the_lighthouse_did_not_see_gets_an_event_of_its_own() -> None:
    # init_sync at step 0: nobody is behind the quorum, yet b fetched a's state
    h = JobHistory()
    h.quorum_issued(quorum(1, {"a": 0, "b": 0}), None, "ready", now=0, unix_ms=0)
    h.progress(
        "b",
        1,
        0.0,
        now=1,
        unix_ms=1_000,
        heal=HealReport(step=0, bytes_received=2_000_000_000, transfer_s=0.5),
    )
    event = h.timeline.events()[-1]
    assert event.kind is EventKind.HEAL and event.replica_ids == ("b",) and event.step == 0
    assert event.heal_bytes == 2_000_000_000 and event.heal_gb_per_s == 4.0
    assert event.text == "b healed to step 0: received 2 GB in 0.5 s (4 GB/s)"
    # a new heal of the same replica is recorded again; a repeat of it is not
    later = HealReport(step=5, bytes_received=1000, transfer_s=0.0)
    h.progress("b", 6, 0.0, now=2, unix_ms=2_000, heal=later)
    h.progress("b", 6, 0.0, now=3, unix_ms=3_000, heal=later)
    assert h.heals_reported == 2 and h.heal_bytes_total == 2_000_001_000
    assert h.timeline.events()[-1].heal_gb_per_s is None  # no rate for zero seconds


def test_a_failed_attempts_report_gives_way_to_the_next_heal() -> None:
    h = JobHistory()
    q1 = quorum(1, {"a": 9})
    h.quorum_issued(q1, None, "ready", now=0, unix_ms=0)
    q2 = quorum(2, {"a": 10, "b": 0})
    h.quorum_issued(q2, q1, "fast", now=1, unix_ms=1_000)
    first = HealReport(step=10, bytes_received=100, transfer_s=0.1)
    h.progress("b", 0, 0.0, now=2, unix_ms=2_000, heal=first)  # its commit failed: still behind
    h.quorum_issued(quorum(3, {"a": 10, "b": 0}), q2, "fast", now=3, unix_ms=3_000)
    h.progress("b", 11, 0.0, now=4, unix_ms=4_000)  # caught up, its second report lost
    caught_up = h.timeline.events()[-1]
    assert caught_up.kind is EventKind.CAUGHT_UP and caught_up.heal_bytes is None


def test_bytes_read_with_decimal_units_and_three_digits() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 12_345_678, 999_999, 2**63 - 1)] == [
        "0 B",
        "999 B",
        "1 kB",
        "12.3 MB",
        "1 MB",
        "9.22 EB",
    ]
    assert heal_figures(HealReport(step=1, bytes_received=5_000, transfer_s=0.0)) == "5 kB in 0 s"


# -- integrity findings ------------------------------------------------------------------
def test_an_integrity_finding_is_a_timeline_event_with_its_kind_and_tensors() -> None:
    metrics = RecordedMetrics()
    h = JobHistory(metrics=metrics)
    names = ("0.weight", "0.bias", "1.weight", "1.bias")
    h.integrity_reported(
        "g1",
        IntegrityReport(step=6, kind=IntegrityKind.DIVERGED, tensors=names),
        2,
        unix_ms=5,
    )
    h.integrity_reported(
        "g0", IntegrityReport(step=9, kind=IntegrityKind.NO_MAJORITY), 0, unix_ms=6
    )
    first, second = h.timeline.events()
    assert first.kind is EventKind.INTEGRITY and first.replica_ids == ("g1",)
    assert first.step == 6 and first.integrity_kind == "diverged" and first.tensors == names
    assert first.text == (
        "g1: silent data corruption at step 6: its state diverged from the majority's, "
        "in 0.weight, 0.bias, 1.weight and 1 more (2 time(s) in the counting window)"
    )
    assert second.to_json()["integrity_kind"] == "no_majority"
    assert second.to_json()["tensors"] == []
    assert "no majority" in second.text
    assert metrics.integrity_kinds == ["diverged", "no_majority"]
    assert h.to_json(now=0, now_unix_ms=7)["integrity_findings"] == 2

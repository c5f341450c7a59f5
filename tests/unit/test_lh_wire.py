"""Wire codec round trips, malformed bytes, and input validation (no sockets)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from lighthouse import validate, wire
from lighthouse._gen import lighthouse_pb2 as pb
from lighthouse.types import (
    CollectivesDone,
    FailureNotice,
    HealReport,
    IntegrityKind,
    IntegrityReport,
    LivenessPing,
    ManagerQuorumRequest,
    Quorum,
    QuorumMember,
    QuorumResult,
    QuorumWait,
)

MEMBER = QuorumMember(
    "r:1", "h:1", "s:2", 4, 2, True, {"k": [1, "x"]}, 3, 12.5, ("u0", "u1"), ("r:2", "r:3")
)


def test_member_and_quorum_round_trip() -> None:
    assert (
        wire.decode_lighthouse_quorum_request(wire.encode_lighthouse_quorum_request(MEMBER))
        == MEMBER
    )
    q = Quorum(9, "abc", (MEMBER, QuorumMember("r:2")), 1234)
    data = wire.encode_lighthouse_quorum_response(q)
    assert wire.decode_lighthouse_quorum_response(data) == q
    assert wire.peek_quorum_id(data) == ("abc", 9, 2)


@pytest.mark.parametrize("optional", [None, 0, 3])
def test_quorum_result_round_trip_keeps_optional_none(optional: int | None) -> None:
    r = QuorumResult(
        quorum_id=2,
        epoch="e",
        replica_rank=1,
        replica_world_size=3,
        recover_src_manager_address="m:1",
        recover_src_replica_rank=optional,
        recover_dst_replica_ranks=[0, 2],
        store_address="s:1",
        max_step=5,
        max_replica_rank=optional,
        max_world_size=2,
        heal=optional is not None,
        commit_failures=1,
        replica_ids=["a", "b", "c"],
        recover_src_checkpoint_metadata="http://m:2/ckpt/" if optional is not None else "",
    )
    assert wire.decode_quorum_result(wire.encode_quorum_result(r)) == r


def test_small_messages_round_trip() -> None:
    n = FailureNotice("e", 3, ("a", "b"), "liveness stream closed", 99)
    assert wire.decode_failure_notice(wire.encode_failure_notice(n)) == n
    assert wire.decode_liveness_event(wire.encode_liveness_event("e", n)) == ("e", n)
    assert wire.decode_liveness_event(wire.encode_liveness_event("e")) == ("e", None)
    w = QuorumWait(kind="min_replicas", reason="not ready: 1 of 2")
    assert wire.decode_liveness_event(wire.encode_liveness_event("e", waiting=w)) == ("e", w)
    assert wire.decode_liveness_ping(wire.encode_liveness_ping("x")) == ("x", False)
    assert wire.decode_liveness_ping(wire.encode_liveness_ping("x", leaving=True)) == ("x", True)
    assert wire.decode_heartbeat_request(wire.encode_heartbeat_request("x")) == "x"
    assert wire.decode_heartbeat_response(wire.encode_heartbeat_response("e")) == "e"
    assert wire.decode_should_commit_request(wire.encode_should_commit_request(1, 5, True)) == (
        1,
        5,
        True,
    )
    assert wire.decode_should_commit_response(wire.encode_should_commit_response(False)) is False
    assert wire.decode_checkpoint_metadata_request(wire.encode_checkpoint_metadata_request(3)) == 3
    assert (
        wire.decode_checkpoint_metadata_response(wire.encode_checkpoint_metadata_response("u"))
        == "u"
    )
    assert wire.decode_kill_request(wire.encode_kill_request("bye")) == "bye"
    assert wire.decode_watch_failures_request(wire.encode_watch_failures_request(2)) == 2
    sent = ManagerQuorumRequest(
        group_rank=1,
        step=5,
        checkpoint_metadata="meta",
        timeout=timedelta(seconds=7),
        shrink_only=True,
        init_sync=False,
        commit_failures=2,
        step_time_ms=3.5,
    )
    # the timeout travels as the call's deadline: the receiver passes in what is left
    got = wire.decode_manager_quorum_request(
        wire.encode_manager_quorum_request(sent), timedelta(seconds=6)
    )
    assert got == replace(sent, timeout=timedelta(seconds=6))


REQUEST = ManagerQuorumRequest(
    group_rank=0, step=3, checkpoint_metadata="m", timeout=timedelta(seconds=5)
)


def test_manager_quorum_request_is_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        REQUEST.step = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        ManagerQuorumRequest(0, 3, "m", timedelta(seconds=5))  # type: ignore[misc]
    assert (REQUEST.shrink_only, REQUEST.init_sync, REQUEST.commit_failures) == (False, True, 0)
    assert REQUEST.step_time_ms == 0.0


@pytest.mark.parametrize(
    ("change", "error", "msg"),
    [
        ({"group_rank": -1}, ValueError, r"group_rank must be >= 0 and fit in an int64, got -1"),
        ({"step": True}, TypeError, r"step must be an int, got True"),
        ({"commit_failures": 1.0}, TypeError, r"commit_failures must be an int, got 1\.0"),
        (
            {"commit_failures": -2},
            ValueError,
            r"commit_failures must be >= 0 and fit in an int64, got -2",
        ),
        ({"checkpoint_metadata": b"x"}, TypeError, r"checkpoint_metadata must be a str, got b'x'"),
        ({"shrink_only": 1}, TypeError, r"shrink_only must be a bool, got 1"),
        ({"init_sync": None}, TypeError, r"init_sync must be a bool, got None"),
        ({"timeout": 5}, TypeError, r"timeout must be a datetime\.timedelta, got int"),
        ({"timeout": timedelta(0)}, ValueError, r"timeout must be positive, got 0:00:00"),
        ({"step_time_ms": "1"}, TypeError, r"step_time_ms must be a float .*, got '1'"),
        ({"step_time_ms": float("nan")}, ValueError, r"step_time_ms must be .*, got nan"),
        ({"step_time_ms": -1.0}, ValueError, r"step_time_ms must be .*>= 0, got -1\.0"),
    ],
)
def test_a_bad_manager_quorum_request_is_refused_before_sending(
    change: dict[str, Any], error: type[Exception], msg: str
) -> None:
    with pytest.raises(error, match=msg):
        wire.encode_manager_quorum_request(replace(REQUEST, **change))


@pytest.mark.parametrize(
    ("fields", "timeout", "msg"),
    [
        ({"step": -3}, timedelta(seconds=1), r"step must be >= 0 and fit in an int64, got -3"),
        (
            {"group_rank": -1},
            timedelta(seconds=1),
            r"group_rank must be >= 0 and fit in an int64, got -1",
        ),
        ({"step_time_ms": float("inf")}, timedelta(seconds=1), r"step_time_ms .*, got inf"),
        ({}, timedelta(0), r"timeout must be positive, got 0:00:00"),
    ],
)
def test_a_decoded_manager_quorum_request_out_of_range_names_the_field(
    fields: dict[str, Any], timeout: timedelta, msg: str
) -> None:
    data = pb.ManagerQuorumRequest(**fields).SerializeToString()
    with pytest.raises(ValueError, match=msg):
        wire.decode_manager_quorum_request(data, timeout)


def test_malformed_bytes_name_the_message() -> None:
    with pytest.raises(ValueError, match="malformed LighthouseQuorumRequest"):
        wire.decode_lighthouse_quorum_request(b"\xff\xff\xff")
    with pytest.raises(ValueError, match="malformed ManagerQuorumResponse"):
        wire.decode_quorum_result(b"\x0a\x05ab")


@pytest.mark.parametrize(
    ("member", "msg"),
    [
        (QuorumMember(""), "replica_id must be a non-empty string, got ''"),
        (QuorumMember("a b"), "replica_id must be printable without whitespace"),
        (QuorumMember("x" * 300), "replica_id must be at most 256 characters, got 300"),
        (QuorumMember("a", step=-1), "step must be >= 0 and fit in an int64, got -1"),
        (
            QuorumMember("a", commit_failures=-2),
            "commit_failures must be >= 0 and fit in an int64, got -2",
        ),
        (
            QuorumMember("a", address="h:1", world_size=0),
            "world_size must be >= 1 for a replica group",
        ),
        (QuorumMember("a", data={"x": float("nan")}), "data must be JSON-serializable"),
        (QuorumMember("a", data="x" * 70000), "data must be at most 65536 bytes"),
        (QuorumMember("a", step_time_ms=float("nan")), "step_time_ms must be a finite number"),
        (QuorumMember("a", address="h" * 600), "address must be at most 512 characters"),
    ],
)
def test_bad_members_are_refused_with_the_field_named(member: QuorumMember, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        validate.check_member(member)


def test_checkpoint_metadata_of_a_member_is_bounded() -> None:
    big = QuorumMember("r", "h:1", world_size=2, checkpoint_metadata=("x" * 40_000, "y" * 40_000))
    with pytest.raises(
        ValueError, match="checkpoint_metadata must total at most 65536 characters, got 80000"
    ):
        validate.check_member(big)


def test_bare_client_may_leave_world_size_zero() -> None:
    assert validate.check_member(QuorumMember("a", data={"x": [1]})).world_size == 0


def test_group_rank_range() -> None:
    with pytest.raises(ValueError, match=r"group_rank must be in \[0, 2\), got 2"):
        validate.check_group_rank(2, 2)


def test_unreachable_reports_are_bounded_and_named() -> None:
    too_many = replace(
        MEMBER, unreachable=tuple(f"r{i}" for i in range(validate.MAX_UNREACHABLE + 1))
    )
    with pytest.raises(
        ValueError, match=f"unreachable must name at most {validate.MAX_UNREACHABLE}"
    ):
        validate.check_member(too_many)
    with pytest.raises(ValueError, match="replica_id"):
        validate.check_member(replace(MEMBER, unreachable=("",)))
    assert validate.check_member(MEMBER) is MEMBER


# -- heal reports ------------------------------------------------------------------------
HEAL = HealReport(step=41, bytes_received=12_345_678, transfer_s=0.42)


def test_heal_reports_travel_on_the_member_the_manager_request_and_the_ping() -> None:
    member = replace(MEMBER, heal=HEAL)
    assert (
        wire.decode_lighthouse_quorum_request(wire.encode_lighthouse_quorum_request(member))
        == member
    )
    req = ManagerQuorumRequest(
        group_rank=0, step=42, checkpoint_metadata="m", timeout=timedelta(seconds=1), heal=HEAL
    )
    got = wire.decode_manager_quorum_request(
        wire.encode_manager_quorum_request(req), timedelta(seconds=1)
    )
    assert got.heal == HEAL
    ping = wire.encode_liveness_ping("x", False, 42, 3.5, HEAL)
    assert wire.decode_liveness_ping_heal(ping) == ("x", False, 42, 3.5, HEAL)
    assert wire.decode_liveness_ping_progress(ping) == ("x", False, 42, 3.5)


def test_messages_without_a_heal_report_decode_to_none() -> None:
    # what old clients send: the field is absent, so there is nothing to report
    assert (
        wire.decode_lighthouse_quorum_request(wire.encode_lighthouse_quorum_request(MEMBER)).heal
        is None
    )
    old_request = pb.ManagerQuorumRequest(group_rank=0, step=3).SerializeToString()
    assert wire.decode_manager_quorum_request(old_request, timedelta(seconds=1)).heal is None
    old_ping = pb.LivenessPing(replica_id="x", step=3).SerializeToString()
    assert wire.decode_liveness_ping_heal(old_ping) == ("x", False, 3, 0.0, None)


def _heal(step: Any, nbytes: Any, seconds: Any) -> HealReport:
    """A heal report with any values, right or wrong (what a buggy caller may build)."""
    return HealReport(step=step, bytes_received=nbytes, transfer_s=seconds)


@pytest.mark.parametrize(
    ("heal", "error", "match"),
    [
        (_heal(-1, 0, 0.0), ValueError, r"heal\.step"),
        (_heal(0, -5, 0.0), ValueError, r"heal\.bytes_received"),
        (_heal(0, 2**63, 0.0), ValueError, r"heal\.bytes_received"),
        (_heal(0, 1, -0.1), ValueError, r"heal\.transfer_s"),
        (_heal(0, 1, float("nan")), ValueError, r"heal\.transfer_s"),
        (_heal(0, 1, float("inf")), ValueError, r"heal\.transfer_s"),
        (_heal(0, 1.5, 0.0), TypeError, r"heal\.bytes_received"),
        (_heal(0, 1, "1"), TypeError, r"heal\.transfer_s"),
    ],
)
def test_heal_reports_out_of_range_are_refused_naming_the_field(
    heal: HealReport, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        validate.check_heal_report(heal)
    with pytest.raises(error, match=match):
        validate.check_member(replace(MEMBER, heal=heal))
    req = ManagerQuorumRequest(
        group_rank=0, step=1, checkpoint_metadata="", timeout=timedelta(seconds=1), heal=heal
    )
    with pytest.raises(error, match=match):
        wire.encode_manager_quorum_request(req)


def test_a_negative_heal_on_the_wire_is_refused_when_decoded() -> None:
    ping = pb.LivenessPing(replica_id="x")
    ping.heal.bytes_received = -1
    with pytest.raises(ValueError, match=r"heal\.bytes_received"):
        wire.decode_liveness_ping_heal(ping.SerializeToString())
    req = pb.LighthouseQuorumRequest()
    req.requester.replica_id = "r"
    req.requester.heal.transfer_s = float("nan")
    with pytest.raises(ValueError, match=r"heal\.transfer_s"):
        wire.decode_lighthouse_quorum_request(req.SerializeToString())


# -- integrity reports -------------------------------------------------------------------
INTEGRITY = IntegrityReport(
    step=300, kind=IntegrityKind.DIVERGED, tensors=("model.layer1.weight", "optim.state.0.exp_avg")
)


@pytest.mark.parametrize("kind", list(IntegrityKind))
def test_integrity_reports_travel_on_the_member_and_the_manager_request(
    kind: IntegrityKind,
) -> None:
    report = replace(INTEGRITY, kind=kind)
    member = replace(MEMBER, heal=HEAL, integrity=report)
    assert (
        wire.decode_lighthouse_quorum_request(wire.encode_lighthouse_quorum_request(member))
        == member
    )
    quorum = Quorum(7, "e", (member,), 1)
    assert wire.decode_lighthouse_quorum_response(
        wire.encode_lighthouse_quorum_response(quorum)
    ).participants == (member,)
    req = ManagerQuorumRequest(
        group_rank=1,
        step=301,
        checkpoint_metadata="m",
        timeout=timedelta(seconds=1),
        commit_failures=1,
        integrity=report,
    )
    got = wire.decode_manager_quorum_request(
        wire.encode_manager_quorum_request(req), timedelta(seconds=1)
    )
    assert got == req


def test_messages_without_an_integrity_report_decode_to_none() -> None:
    # what old clients send: the field is absent, so there is nothing to report
    assert (
        wire.decode_lighthouse_quorum_request(
            wire.encode_lighthouse_quorum_request(MEMBER)
        ).integrity
        is None
    )
    old_request = pb.ManagerQuorumRequest(group_rank=0, step=3).SerializeToString()
    assert wire.decode_manager_quorum_request(old_request, timedelta(seconds=1)).integrity is None


def _integrity(step: Any, kind: Any, tensors: Any) -> IntegrityReport:
    """An integrity report with any values, right or wrong (what a buggy caller may build)."""
    return IntegrityReport(step=step, kind=kind, tensors=tensors)


@pytest.mark.parametrize(
    ("report", "error", "match"),
    [
        (_integrity(-1, IntegrityKind.DIVERGED, ()), ValueError, r"integrity\.step"),
        (_integrity(2**63, IntegrityKind.DIVERGED, ()), ValueError, r"integrity\.step"),
        (_integrity(1.0, IntegrityKind.DIVERGED, ()), TypeError, r"integrity\.step"),
        (_integrity(1, "diverged", ()), TypeError, r"integrity\.kind"),
        (_integrity(1, IntegrityKind.DIVERGED, ["w"]), TypeError, r"integrity\.tensors"),
        (_integrity(1, IntegrityKind.DIVERGED, (b"w",)), TypeError, r"integrity\.tensors"),
        (_integrity(1, IntegrityKind.DIVERGED, ("w",) * 9), ValueError, r"at most 8 tensors"),
        (_integrity(1, IntegrityKind.DIVERGED, ("",)), ValueError, r"integrity\.tensors"),
        (_integrity(1, IntegrityKind.DIVERGED, ("w" * 257,)), ValueError, r"257 characters"),
        (_integrity(1, IntegrityKind.DIVERGED, ("a\nb",)), ValueError, r"printable"),
    ],
)
def test_integrity_reports_out_of_range_are_refused_naming_the_field(
    report: IntegrityReport, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        validate.check_integrity_report(report)
    with pytest.raises(error, match=match):
        validate.check_member(replace(MEMBER, integrity=report))
    req = ManagerQuorumRequest(
        group_rank=0,
        step=1,
        checkpoint_metadata="",
        timeout=timedelta(seconds=1),
        integrity=report,
    )
    with pytest.raises(error, match=match):
        wire.encode_manager_quorum_request(req)


def test_a_bad_integrity_report_on_the_wire_is_refused_when_decoded() -> None:
    unset = pb.ManagerQuorumRequest(group_rank=0, step=3)
    unset.integrity.step = 3  # no kind: an unset enum reads KIND_UNSPECIFIED
    with pytest.raises(ValueError, match=r"integrity\.kind"):
        wire.decode_manager_quorum_request(unset.SerializeToString(), timedelta(seconds=1))
    newer = pb.ManagerQuorumRequest(group_rank=0, step=3)
    # a kind a newer peer added (proto3 enums are open)
    newer.integrity.kind = 99  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"integrity\.kind"):
        wire.decode_manager_quorum_request(newer.SerializeToString(), timedelta(seconds=1))
    flood = pb.LighthouseQuorumRequest()
    flood.requester.replica_id = "r"
    flood.requester.integrity.kind = pb.IntegrityReport.DIVERGED
    flood.requester.integrity.tensors.extend(["w"] * 10_000)
    with pytest.raises(ValueError, match=r"at most 8 tensors"):
        wire.decode_lighthouse_quorum_request(flood.SerializeToString())
    negative = pb.LighthouseQuorumRequest()
    negative.requester.replica_id = "r"
    negative.requester.integrity.kind = pb.IntegrityReport.NO_MAJORITY
    negative.requester.integrity.step = -4
    with pytest.raises(ValueError, match=r"integrity\.step"):
        wire.decode_lighthouse_quorum_request(negative.SerializeToString())


def test_busy_ms_travels_on_the_member_the_manager_request_and_the_ping() -> None:
    member = replace(MEMBER, busy_ms=7.25)
    quorum = Quorum(1, "e", (member,))
    got = wire.decode_lighthouse_quorum_response(wire.encode_lighthouse_quorum_response(quorum))
    assert got.participants[0].busy_ms == 7.25
    req = replace(REQUEST, step_time_ms=30.0, busy_ms=12.5)
    data = wire.encode_manager_quorum_request(req)
    assert wire.decode_manager_quorum_request(data, req.timeout).busy_ms == 12.5
    ping = wire.encode_liveness_ping("x", False, 42, 30.0, HEAL, busy_ms=12.5)
    assert wire.decode_liveness_ping_report(ping) == LivenessPing(
        replica_id="x", step=42, step_time_ms=30.0, busy_ms=12.5, heal=HEAL
    )
    # an old sender's ping and request leave it unset: 0, unknown
    assert wire.decode_liveness_ping_report(wire.encode_liveness_ping("x")).busy_ms == 0.0
    old = pb.ManagerQuorumRequest(step=3, step_time_ms=5.0).SerializeToString()
    assert wire.decode_manager_quorum_request(old, req.timeout).busy_ms == 0.0


@pytest.mark.parametrize(
    ("busy", "step_time", "msg"),
    [
        (float("nan"), 10.0, r"busy_ms must be a finite number >= 0, got nan"),
        (-1.0, 10.0, r"busy_ms must be a finite number >= 0, got -1\.0"),
        (11.0, 10.0, r"busy_ms must be at most the step time .* busy_ms 11\.0 .* 10\.0"),
        (1.0, 0.0, r"busy_ms must be at most the step time"),
    ],
)
def test_busy_ms_out_of_range_is_refused_naming_the_field(
    busy: float, step_time: float, msg: str
) -> None:
    with pytest.raises(ValueError, match=msg):
        validate.check_member(QuorumMember("a", step_time_ms=step_time, busy_ms=busy))
    with pytest.raises(ValueError, match=msg):
        wire.encode_manager_quorum_request(replace(REQUEST, step_time_ms=step_time, busy_ms=busy))
    raw = pb.ManagerQuorumRequest(step_time_ms=step_time, busy_ms=busy).SerializeToString()
    with pytest.raises(ValueError, match=msg):
        wire.decode_manager_quorum_request(raw, timedelta(seconds=1))
    ping = pb.LivenessPing(replica_id="x", step_time_ms=step_time, busy_ms=busy)
    with pytest.raises(ValueError, match=msg):
        wire.decode_liveness_ping_report(ping.SerializeToString())
    with pytest.raises(TypeError, match="busy_ms must be a float"):
        wire.encode_manager_quorum_request(replace(REQUEST, busy_ms="1"))  # type: ignore[arg-type]


def test_the_collectives_done_proof_travels_on_the_manager_request_and_is_checked() -> None:
    done = CollectivesDone(epoch="ep1", quorum_id=4, step=17)
    req = replace(REQUEST, collectives_done=done)
    data = wire.encode_manager_quorum_request(req)
    assert wire.decode_manager_quorum_request(data, req.timeout).collectives_done == done
    plain = wire.encode_manager_quorum_request(REQUEST)  # unset: no proof
    assert wire.decode_manager_quorum_request(plain, req.timeout).collectives_done is None
    raw = pb.ManagerQuorumRequest(step=3)
    raw.collectives_done.step = -1
    with pytest.raises(ValueError, match=r"collectives_done\.step"):
        wire.decode_manager_quorum_request(raw.SerializeToString(), req.timeout)
    with pytest.raises(ValueError, match=r"collectives_done\.epoch"):
        wire.encode_manager_quorum_request(
            replace(REQUEST, collectives_done=replace(done, epoch="e" * 300))
        )

"""The only hand-written module that touches protobuf messages.

Every function turns bytes into ``lighthouse.types`` values or back, so servers
and clients register raw-bytes gRPC handlers and never see a message object.
Parsing raises ``ValueError`` with the message name on malformed bytes.

A member's ``data`` travels as JSON text and is a decoded value everywhere
else (``validate.encode_data`` / ``decode_data``); a decoded member keeps its
text so that the lighthouse relays what it received without re-encoding it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from google.protobuf.message import DecodeError

from lighthouse import validate
from lighthouse._gen import lighthouse_pb2 as pb
from lighthouse.types import (
    CollectivesDone,
    FailureNotice,
    HealReport,
    IntegrityKind,
    IntegrityReport,
    LeaseFloor,
    LeaseRecall,
    LivenessPing,
    ManagerQuorumRequest,
    Quorum,
    QuorumMember,
    QuorumResult,
    QuorumWait,
)


def _serialized(message: Any) -> bytes:
    """`message`'s wire bytes. The generated classes carry no type information,
    so this is where their result is typed."""
    data: bytes = message.SerializeToString()
    return data


def _parse(cls: type, data: bytes) -> object:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"malformed {cls.__name__} ({len(data)} bytes): {exc}") from exc
    return msg


# -- heal reports -------------------------------------------------------------------------
def _heal_to_pb(h: HealReport, out: pb.HealReport) -> None:
    out.step = h.step
    out.bytes_received = h.bytes_received
    out.transfer_s = h.transfer_s


def _heal_from_pb(p: pb.HealReport) -> HealReport:
    """Raises ``ValueError`` naming the field for a value out of range."""
    return validate.check_heal_report(
        HealReport(step=p.step, bytes_received=p.bytes_received, transfer_s=p.transfer_s)
    )


# -- integrity reports ---------------------------------------------------------------
_KIND_TO_PB = {
    IntegrityKind.DIVERGED: pb.IntegrityReport.DIVERGED,
    IntegrityKind.HEAL_SOURCE_DIVERGED: pb.IntegrityReport.HEAL_SOURCE_DIVERGED,
    IntegrityKind.NO_MAJORITY: pb.IntegrityReport.NO_MAJORITY,
    IntegrityKind.GRADIENT_DIVERGED: pb.IntegrityReport.GRADIENT_DIVERGED,
}
_KIND_FROM_PB = {number: kind for kind, number in _KIND_TO_PB.items()}


def _integrity_to_pb(r: IntegrityReport, out: pb.IntegrityReport) -> None:
    out.step = r.step
    out.kind = _KIND_TO_PB[r.kind]
    out.tensors.extend(r.tensors)


def _integrity_from_pb(p: pb.IntegrityReport) -> IntegrityReport:
    """Raises ``ValueError`` naming the field for an unknown kind (unset, or one a
    newer peer added) or a value out of range."""
    kind = _KIND_FROM_PB.get(p.kind)
    if kind is None:
        raise ValueError(
            f"integrity.kind must be one of {sorted(k.value for k in IntegrityKind)}, "
            f"got wire value {p.kind}"
        )
    if len(p.tensors) > validate.MAX_INTEGRITY_TENSORS:  # before copying them
        raise ValueError(
            f"integrity.tensors must name at most {validate.MAX_INTEGRITY_TENSORS} tensors, "
            f"got {len(p.tensors)}"
        )
    return validate.check_integrity_report(
        IntegrityReport(step=p.step, kind=kind, tensors=tuple(p.tensors))
    )


# -- members and quorums ------------------------------------------------------------------
def _member_to_pb(m: QuorumMember, out: pb.QuorumMember) -> None:
    out.replica_id = m.replica_id
    out.address = m.address
    out.store_address = m.store_address
    out.step = m.step
    out.world_size = m.world_size
    out.shrink_only = m.shrink_only
    out.data = validate.member_data_json(m)
    out.commit_failures = m.commit_failures
    out.step_time_ms = m.step_time_ms
    out.busy_ms = m.busy_ms
    if m.checkpoint_metadata:
        out.checkpoint_metadata.extend(m.checkpoint_metadata)
    if m.unreachable:
        out.unreachable.extend(m.unreachable)
    if m.heal is not None:
        _heal_to_pb(m.heal, out.heal)
    if m.integrity is not None:
        _integrity_to_pb(m.integrity, out.integrity)


def _member_from_pb(p: pb.QuorumMember) -> QuorumMember:
    """Raises ``ValueError`` naming the member if its data is not JSON text."""
    text = p.data
    try:
        data = validate.decode_data(text)
    except ValueError as exc:
        raise ValueError(f"QuorumMember {p.replica_id[:64]!r}: {exc}") from None
    # Filled in directly rather than through the frozen dataclass's __init__
    # (3x faster: every rank decodes every member of every quorum, each step).
    m = object.__new__(QuorumMember)
    m.__dict__.update(
        replica_id=p.replica_id,
        address=p.address,
        store_address=p.store_address,
        step=p.step,
        world_size=p.world_size,
        shrink_only=p.shrink_only,
        data=data,
        commit_failures=p.commit_failures,
        step_time_ms=p.step_time_ms,
        checkpoint_metadata=tuple(p.checkpoint_metadata),
        unreachable=tuple(p.unreachable),
        heal=_heal_from_pb(p.heal) if p.HasField("heal") else None,
        integrity=_integrity_from_pb(p.integrity) if p.HasField("integrity") else None,
        busy_ms=p.busy_ms,
    )
    return validate.with_data_json(m, text)  # relayed as received, never re-encoded


def _quorum_from_pb(p: pb.Quorum) -> Quorum:
    return Quorum(
        quorum_id=p.quorum_id,
        epoch=p.epoch,
        participants=tuple(_member_from_pb(m) for m in p.participants),
        created_unix_ms=p.created_unix_ms,
    )


def encode_lighthouse_quorum_request(m: QuorumMember, timeout_ms: int = 0) -> bytes:
    """``timeout_ms``: how long the requester waits (0: the call's deadline only)."""
    req = pb.LighthouseQuorumRequest(timeout_ms=max(0, timeout_ms))
    _member_to_pb(m, req.requester)
    return _serialized(req)


def decode_lighthouse_quorum_request(data: bytes) -> QuorumMember:
    return decode_lighthouse_quorum_request_timeout(data)[0]


def decode_lighthouse_quorum_request_timeout(data: bytes) -> tuple[QuorumMember, int]:
    """(the requester, how long it waits in milliseconds; 0: unknown)."""
    req = _parse(pb.LighthouseQuorumRequest, data)
    assert isinstance(req, pb.LighthouseQuorumRequest)
    return _member_from_pb(req.requester), req.timeout_ms


def encode_lighthouse_quorum_response(q: Quorum, lease_id: int = 0) -> bytes:
    """Serialize once; the server sends the same bytes to every member.
    ``lease_id`` > 0 grants a quorum lease (see the proto)."""
    resp = pb.LighthouseQuorumResponse(lease_id=lease_id)
    resp.quorum.quorum_id = q.quorum_id
    resp.quorum.epoch = q.epoch
    resp.quorum.created_unix_ms = q.created_unix_ms
    for m in q.participants:
        _member_to_pb(m, resp.quorum.participants.add())
    return _serialized(resp)


def decode_lighthouse_quorum_response(data: bytes) -> Quorum:
    return decode_leased_quorum_response(data)[0]


def decode_leased_quorum_response(data: bytes) -> tuple[Quorum, int]:
    """(quorum, lease id); lease id 0 = no lease."""
    resp = _parse(pb.LighthouseQuorumResponse, data)
    assert isinstance(resp, pb.LighthouseQuorumResponse)
    return _quorum_from_pb(resp.quorum), resp.lease_id


def peek_quorum_id(data: bytes) -> tuple[str, int, int]:
    """(epoch, quorum_id, participant count) of a quorum response, for benchmarks."""
    resp = _parse(pb.LighthouseQuorumResponse, data)
    assert isinstance(resp, pb.LighthouseQuorumResponse)
    return resp.quorum.epoch, resp.quorum.quorum_id, len(resp.quorum.participants)


# -- heartbeat and liveness -----------------------------------------------------------------
def encode_heartbeat_request(replica_id: str) -> bytes:
    return _serialized(pb.LighthouseHeartbeatRequest(replica_id=replica_id))


def decode_heartbeat_request(data: bytes) -> str:
    req = _parse(pb.LighthouseHeartbeatRequest, data)
    assert isinstance(req, pb.LighthouseHeartbeatRequest)
    return req.replica_id


def encode_heartbeat_response(epoch: str) -> bytes:
    return _serialized(pb.LighthouseHeartbeatResponse(epoch=epoch))


def decode_heartbeat_response(data: bytes) -> str:
    resp = _parse(pb.LighthouseHeartbeatResponse, data)
    assert isinstance(resp, pb.LighthouseHeartbeatResponse)
    return resp.epoch


def encode_liveness_ping(
    replica_id: str,
    leaving: bool = False,
    step: int = 0,
    step_time_ms: float = 0.0,
    heal: HealReport | None = None,
    busy_ms: float = 0.0,
    floor_wanted: int = 0,
) -> bytes:
    """``heal``: the replica's latest heal, sent once (None: nothing to report);
    ``busy_ms``: its last step's own work (``QuorumMember.busy_ms``);
    ``floor_wanted``: see ``LivenessPing``."""
    ping = pb.LivenessPing(
        replica_id=replica_id,
        leaving=leaving,
        step=step,
        step_time_ms=step_time_ms,
        busy_ms=busy_ms,
        floor_wanted=floor_wanted,
    )
    if heal is not None:
        _heal_to_pb(heal, ping.heal)
    return _serialized(ping)


def decode_liveness_ping(data: bytes) -> tuple[str, bool]:
    """(replica id, leaving): leaving means a clean shutdown, not a death."""
    replica_id, leaving, _, _ = decode_liveness_ping_progress(data)
    return replica_id, leaving


def decode_liveness_ping_progress(data: bytes) -> tuple[str, bool, int, float]:
    """(replica id, leaving, step, step time ms) of a liveness ping."""
    ping = _parse(pb.LivenessPing, data)
    assert isinstance(ping, pb.LivenessPing)
    return ping.replica_id, ping.leaving, ping.step, ping.step_time_ms


def decode_liveness_ping_heal(
    data: bytes,
) -> tuple[str, bool, int, float, HealReport | None]:
    """(replica id, leaving, step, step time ms, heal report or None) of a liveness
    ping; ``ValueError`` for a heal report out of range."""
    ping = _parse(pb.LivenessPing, data)
    assert isinstance(ping, pb.LivenessPing)
    heal = _heal_from_pb(ping.heal) if ping.HasField("heal") else None
    return ping.replica_id, ping.leaving, ping.step, ping.step_time_ms, heal


def decode_liveness_ping_report(data: bytes) -> LivenessPing:
    """The whole ping as a typed value; ``ValueError`` naming the field for a step
    time, busy time or heal report out of range (``validate.check_liveness_ping``)."""
    ping = _parse(pb.LivenessPing, data)
    assert isinstance(ping, pb.LivenessPing)
    return validate.check_liveness_ping(
        LivenessPing(
            replica_id=ping.replica_id,
            leaving=ping.leaving,
            step=ping.step,
            step_time_ms=ping.step_time_ms,
            busy_ms=ping.busy_ms,
            heal=_heal_from_pb(ping.heal) if ping.HasField("heal") else None,
            floor_wanted=ping.floor_wanted,
        )
    )


def _notice_to_pb(n: FailureNotice, out: pb.FailureNotice) -> None:
    out.epoch = n.epoch
    out.quorum_id = n.quorum_id
    out.dead_replica_ids.extend(n.dead_replica_ids)
    out.reason = n.reason
    out.detected_unix_ms = n.detected_unix_ms
    if n.step is not None:
        out.step = n.step


def _notice_from_pb(p: pb.FailureNotice) -> FailureNotice:
    return FailureNotice(
        epoch=p.epoch,
        quorum_id=p.quorum_id,
        dead_replica_ids=tuple(p.dead_replica_ids),
        reason=p.reason,
        detected_unix_ms=p.detected_unix_ms,
        step=p.step if p.HasField("step") else None,
    )


LivenessEventBody = FailureNotice | LeaseRecall | LeaseFloor | QuorumWait


def encode_liveness_event(
    epoch: str,
    notice: FailureNotice | None = None,
    recall: LeaseRecall | None = None,
    floor: LeaseFloor | None = None,
    waiting: QuorumWait | None = None,
) -> bytes:
    """An acknowledgement (none given), a failure notice, a lease recall, a lease
    floor or why a quorum request waits, on the liveness stream."""
    ev = pb.LivenessEvent(epoch=epoch)
    if waiting is not None:
        ev.waiting.kind = waiting.kind
        ev.waiting.reason = waiting.reason
    if notice is not None:
        _notice_to_pb(notice, ev.failure)
    if recall is not None:
        ev.recall.lease_id = recall.lease_id
        ev.recall.quorum_id = recall.quorum_id
        ev.recall.absent_replica_ids.extend(recall.absent_replica_ids)
        ev.recall.abort_from_step = recall.abort_from_step
        ev.recall.valid_below_step = recall.valid_below_step
    if floor is not None:
        ev.floor.lease_id = floor.lease_id
        ev.floor.step = floor.step
    return _serialized(ev)


def encode_liveness_ack(epoch: str, heartbeat_timeout_ms: int) -> bytes:
    """The first event on a liveness stream: the epoch and the heartbeat timeout (ms)."""
    return _serialized(pb.LivenessEvent(epoch=epoch, heartbeat_timeout_ms=heartbeat_timeout_ms))


def decode_liveness_ack(data: bytes) -> tuple[str, int]:
    """(epoch, heartbeat timeout in ms; 0 from a lighthouse that does not send it)."""
    ev = _parse(pb.LivenessEvent, data)
    assert isinstance(ev, pb.LivenessEvent)
    return ev.epoch, int(ev.heartbeat_timeout_ms)


def decode_liveness_event(data: bytes) -> tuple[str, LivenessEventBody | None]:
    """(epoch, the failure notice, lease recall, lease floor or quorum wait it
    carries, or None for an acknowledgement)."""
    ev = _parse(pb.LivenessEvent, data)
    assert isinstance(ev, pb.LivenessEvent)
    if ev.HasField("failure"):
        return ev.epoch, _notice_from_pb(ev.failure)
    if ev.HasField("recall"):
        r = ev.recall
        return ev.epoch, LeaseRecall(
            ev.epoch,
            r.lease_id,
            r.quorum_id,
            tuple(r.absent_replica_ids),
            r.abort_from_step,
            r.valid_below_step,
        )
    if ev.HasField("floor"):
        return ev.epoch, LeaseFloor(ev.epoch, ev.floor.lease_id, ev.floor.step)
    if ev.HasField("waiting"):
        return ev.epoch, QuorumWait(kind=ev.waiting.kind, reason=ev.waiting.reason)
    return ev.epoch, None


def encode_failure_notice(n: FailureNotice) -> bytes:
    out = pb.FailureNotice()
    _notice_to_pb(n, out)
    return _serialized(out)


def decode_failure_notice(data: bytes) -> FailureNotice:
    p = _parse(pb.FailureNotice, data)
    assert isinstance(p, pb.FailureNotice)
    return _notice_from_pb(p)


# -- manager service --------------------------------------------------------------------
def encode_manager_quorum_request(req: ManagerQuorumRequest) -> bytes:
    """The message for ``req`` (its ``timeout`` is the call's deadline, not a field).

    Checks ``req`` first (``validate.check_manager_quorum_request``): ``TypeError``
    or ``ValueError`` naming the field and the value, before anything is sent.
    """
    validate.check_manager_quorum_request(req)
    out = pb.ManagerQuorumRequest(
        group_rank=req.group_rank,
        step=req.step,
        checkpoint_metadata=req.checkpoint_metadata,
        shrink_only=req.shrink_only,
        init_sync=req.init_sync,
        commit_failures=req.commit_failures,
        step_time_ms=req.step_time_ms,
        busy_ms=req.busy_ms,
    )
    if req.heal is not None:
        _heal_to_pb(req.heal, out.heal)
    if req.integrity is not None:
        _integrity_to_pb(req.integrity, out.integrity)
    if req.collectives_done is not None:
        done = req.collectives_done
        out.collectives_done.epoch = done.epoch
        out.collectives_done.quorum_id = done.quorum_id
        out.collectives_done.step = done.step
    return _serialized(out)


def decode_manager_quorum_request(data: bytes, timeout: timedelta) -> ManagerQuorumRequest:
    """The request in ``data``; ``timeout`` is what is left of the call's deadline.

    ``ValueError`` naming the field and the value for malformed bytes or a value
    out of range (a negative step, a non-finite step time, no time left).
    """
    r = _parse(pb.ManagerQuorumRequest, data)
    assert isinstance(r, pb.ManagerQuorumRequest)
    req = ManagerQuorumRequest(
        group_rank=r.group_rank,
        step=r.step,
        checkpoint_metadata=r.checkpoint_metadata,
        timeout=timeout,
        shrink_only=r.shrink_only,
        init_sync=r.init_sync,
        commit_failures=r.commit_failures,
        step_time_ms=r.step_time_ms,
        heal=_heal_from_pb(r.heal) if r.HasField("heal") else None,
        integrity=_integrity_from_pb(r.integrity) if r.HasField("integrity") else None,
        busy_ms=r.busy_ms,
        collectives_done=CollectivesDone(
            epoch=r.collectives_done.epoch,
            quorum_id=r.collectives_done.quorum_id,
            step=r.collectives_done.step,
        )
        if r.HasField("collectives_done")
        else None,
    )
    return validate.check_manager_quorum_request(req)


def encode_quorum_result(r: QuorumResult) -> bytes:
    out = pb.ManagerQuorumResponse(
        quorum_id=r.quorum_id,
        epoch=r.epoch,
        recover_src_manager_address=r.recover_src_manager_address,
        recover_dst_replica_ranks=r.recover_dst_replica_ranks,
        store_address=r.store_address,
        max_step=r.max_step,
        max_world_size=r.max_world_size,
        replica_rank=r.replica_rank,
        replica_world_size=r.replica_world_size,
        heal=r.heal,
        commit_failures=r.commit_failures,
        replica_ids=r.replica_ids,
        recover_src_checkpoint_metadata=r.recover_src_checkpoint_metadata,
    )
    if r.recover_src_replica_rank is not None:
        out.recover_src_replica_rank = r.recover_src_replica_rank
    if r.max_replica_rank is not None:
        out.max_replica_rank = r.max_replica_rank
    return _serialized(out)


def decode_quorum_result(data: bytes) -> QuorumResult:
    p = _parse(pb.ManagerQuorumResponse, data)
    assert isinstance(p, pb.ManagerQuorumResponse)
    return QuorumResult(
        quorum_id=p.quorum_id,
        epoch=p.epoch,
        replica_rank=p.replica_rank,
        replica_world_size=p.replica_world_size,
        recover_src_manager_address=p.recover_src_manager_address,
        recover_src_replica_rank=(
            p.recover_src_replica_rank if p.HasField("recover_src_replica_rank") else None
        ),
        recover_dst_replica_ranks=list(p.recover_dst_replica_ranks),
        store_address=p.store_address,
        max_step=p.max_step,
        max_replica_rank=p.max_replica_rank if p.HasField("max_replica_rank") else None,
        max_world_size=p.max_world_size,
        heal=p.heal,
        commit_failures=p.commit_failures,
        replica_ids=list(p.replica_ids),
        recover_src_checkpoint_metadata=p.recover_src_checkpoint_metadata,
    )


def encode_checkpoint_metadata_request(rank: int) -> bytes:
    return _serialized(pb.CheckpointMetadataRequest(rank=rank))


def decode_checkpoint_metadata_request(data: bytes) -> int:
    r = _parse(pb.CheckpointMetadataRequest, data)
    assert isinstance(r, pb.CheckpointMetadataRequest)
    return r.rank


def encode_checkpoint_metadata_response(metadata: str) -> bytes:
    return _serialized(pb.CheckpointMetadataResponse(checkpoint_metadata=metadata))


def decode_checkpoint_metadata_response(data: bytes) -> str:
    r = _parse(pb.CheckpointMetadataResponse, data)
    assert isinstance(r, pb.CheckpointMetadataResponse)
    return r.checkpoint_metadata


def encode_should_commit_request(group_rank: int, step: int, should_commit: bool) -> bytes:
    return _serialized(
        pb.ShouldCommitRequest(group_rank=group_rank, step=step, should_commit=should_commit)
    )


def decode_should_commit_request(data: bytes) -> tuple[int, int, bool]:
    """(group_rank, step, should_commit)."""
    r = _parse(pb.ShouldCommitRequest, data)
    assert isinstance(r, pb.ShouldCommitRequest)
    return r.group_rank, r.step, r.should_commit


def encode_should_commit_response(decision: bool) -> bytes:
    return _serialized(pb.ShouldCommitResponse(should_commit=decision))


def decode_should_commit_response(data: bytes) -> bool:
    r = _parse(pb.ShouldCommitResponse, data)
    assert isinstance(r, pb.ShouldCommitResponse)
    return r.should_commit


def encode_kill_request(msg: str) -> bytes:
    return _serialized(pb.KillRequest(msg=msg))


def decode_kill_request(data: bytes) -> str:
    r = _parse(pb.KillRequest, data)
    assert isinstance(r, pb.KillRequest)
    return r.msg


def encode_kill_response() -> bytes:
    return _serialized(pb.KillResponse())


def encode_watch_failures_request(group_rank: int) -> bytes:
    return _serialized(pb.WatchFailuresRequest(group_rank=group_rank))


def decode_watch_failures_request(data: bytes) -> int:
    r = _parse(pb.WatchFailuresRequest, data)
    assert isinstance(r, pb.WatchFailuresRequest)
    return r.group_rank

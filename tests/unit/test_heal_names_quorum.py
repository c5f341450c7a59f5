"""The Manager tells its transport the quorum and replica rank of every heal it
sends or receives, so the transport can serve only the healers that quorum named."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.unit.manager_fakes import FakeTransport, make, result


class RecordingTransport(FakeTransport):
    def __init__(self, payload: dict[str, Any] | None = None) -> None:
        super().__init__(payload)
        self.quorums: list[tuple[str, int]] = []
        self.calls: list[str] = []

    def set_quorum(self, quorum: str, replica_rank: int) -> None:
        self.quorums.append((quorum, replica_rank))
        self.calls.append("set_quorum")

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
    ) -> None:
        self.calls.append("send")
        super().send_checkpoint(dst_ranks, step, state_dict, timeout)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        self.calls.append("recv")
        return super().recv_checkpoint(src_rank, metadata, step, timeout)


def test_a_source_names_its_quorum_before_serving() -> None:
    transport = RecordingTransport()
    manager, *_ = make([result(quorum_id=4, replica_rank=0, dst=[1, 2])], transport=transport)
    manager.start_quorum()
    manager.wait_quorum()
    assert transport.calls == []  # an asynchronous quorum heals at the vote
    manager.should_commit()
    assert transport.calls == ["set_quorum", "send"]
    epoch = manager.quorum_id()[0]
    assert transport.quorums == [(f"{epoch}/4", 0)]
    manager.shutdown()


def test_a_healer_names_its_quorum_and_rank_before_receiving() -> None:
    payload = {"user": {}, "torchft": {"step": 20, "batches_committed": 40}}
    transport = RecordingTransport(payload)
    manager, *_ = make(
        [result(quorum_id=9, replica_rank=2, max_step=20, max_rank=None, heal=True, src=1)],
        transport=transport,
    )
    manager.start_quorum()
    manager.should_commit()
    assert transport.calls == ["set_quorum", "recv"]
    epoch = manager.quorum_id()[0]
    assert transport.quorums == [(f"{epoch}/9", 2)]
    manager.shutdown()

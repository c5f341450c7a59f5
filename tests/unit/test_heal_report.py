"""What a heal moved, as the healing replica measures and reports it (no sockets).

The healer counts the bytes it received (as its transport counts them, else the
received state's tensor bytes) and the transfer's seconds, and its next quorum
request, only that one, carries the report; a manager server adds up its ranks'.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from lighthouse import ManagerQuorumRequest
from lighthouse.replica.group_rounds import group_heal
from lighthouse.types import HealReport
from tests.unit.manager_fakes import FakeTransport, make, result
from torchft_pg.checkpointing import InProcessHub, InProcessTransport
from torchft_pg.manager.heal import tensor_bytes

T = timedelta(seconds=5)


def test_the_next_quorum_request_and_only_that_one_reports_the_heal() -> None:
    payload = {
        "user": {"default": {"w": torch.zeros(250), "b": [torch.ones(2, dtype=torch.float64)]}},
        "torchft": {"step": 20, "batches_committed": 40},
    }
    manager, client, _, _ = make(
        [
            result(replica_rank=0, max_step=20, max_rank=None, max_world=1, heal=True, src=1),
            result(replica_rank=0, max_step=21, max_world=1),
            result(replica_rank=0, max_step=22, max_world=1),
        ],
        transport=FakeTransport(payload),  # counts nothing: the tensors are counted
    )
    manager.register_state_dict_fn("default", lambda sd: None, lambda: {})
    for _ in range(3):
        manager.start_quorum()
        manager.wait_quorum()
        assert manager.should_commit()
    first, second, third = client.requests
    assert first.heal is None
    assert second.heal is not None
    assert second.heal.step == 20 and second.heal.bytes_received == 250 * 4 + 2 * 8
    assert 0 < second.heal.transfer_s < 5
    assert third.heal is None  # reported once
    manager.shutdown()


def test_our_transports_count_the_tensor_bytes_and_the_skeleton() -> None:
    hub = InProcessHub()
    a: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "a")
    b: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "b")
    assert b.received_bytes() is None  # nothing received yet
    sd = {"w": torch.randn(1 << 18), "small": torch.ones(3), "step": 4}
    a.send_checkpoint([1], 4, sd, T)
    out = b.recv_checkpoint(0, "a", 4, T)
    counted = b.received_bytes()
    state = tensor_bytes(out)
    assert state == (1 << 18) * 4 + 3 * 4
    # the combined small-tensor blob is padded to 64 bytes, and the skeleton is JSON text
    assert counted is not None and state < counted < state + 64 * 1024


def test_tensor_bytes_walks_nested_containers_and_ignores_other_values() -> None:
    state = {"a": (torch.zeros(3, dtype=torch.int16), [object(), {"b": torch.zeros(0)}]), 5: "x"}
    assert tensor_bytes(state) == 6
    assert tensor_bytes(object()) == 0


def test_a_group_reports_its_ranks_bytes_summed_and_its_slowest_seconds() -> None:
    def req(rank: int, heal: HealReport | None) -> ManagerQuorumRequest:
        return ManagerQuorumRequest(
            group_rank=rank, step=9, checkpoint_metadata="", timeout=T, heal=heal
        )

    assert group_heal([req(0, None), req(1, None)]) is None
    got = group_heal(
        [
            req(0, HealReport(step=8, bytes_received=100, transfer_s=0.5)),
            req(1, HealReport(step=8, bytes_received=300, transfer_s=0.25)),
            req(2, None),  # its heal failed: nothing to add
        ]
    )
    assert got == HealReport(step=8, bytes_received=400, transfer_s=0.5)

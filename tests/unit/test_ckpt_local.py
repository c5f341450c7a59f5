"""InProcessTransport, the socket-free fake the Manager's unit tests can inject."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

from torchft_pg.checkpointing import CheckpointTransport, InProcessHub, InProcessTransport
from torchft_pg.errors import RecoveryError

T = timedelta(seconds=5)


def test_heal_through_the_hub_returns_fresh_equal_tensors() -> None:
    hub = InProcessHub()
    a: CheckpointTransport[dict[str, Any]] = InProcessTransport(hub, "replica-a")
    b: CheckpointTransport[dict[str, Any]] = InProcessTransport(hub, "replica-b")
    sd = {"w": torch.randn(4, 3), "step": 9, "groups": [{"lr": 0.1}]}
    a.send_checkpoint([1], 9, sd, T)
    out = b.recv_checkpoint(0, a.metadata(), 9, T)
    assert torch.equal(out["w"], sd["w"]) and out["w"].data_ptr() != sd["w"].data_ptr()
    assert out["step"] == 9 and out["groups"] == [{"lr": 0.1}]


def test_wrong_step_and_disallowed_are_recovery_errors() -> None:
    hub = InProcessHub()
    a: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "a")
    b: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "b")
    a.send_checkpoint([1], 3, {"x": torch.zeros(1)}, T)
    with pytest.raises(RecoveryError, match="serves step 3, expected step 4"):
        b.recv_checkpoint(0, "a", 4, T)
    a.disallow_checkpoint()
    with pytest.raises(RecoveryError, match=r"served no checkpoint within 0\.010 s"):
        b.recv_checkpoint(0, "a", 3, timedelta(seconds=0.01))

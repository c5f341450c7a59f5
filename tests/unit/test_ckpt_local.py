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
    sd: dict[str, Any] = {"w": torch.randn(4, 3), "step": 9, "groups": [{"lr": 0.1}]}
    a.send_checkpoint([1], 9, sd, T)
    out = b.recv_checkpoint(0, a.metadata(), 9, T)
    w = out["w"]
    assert isinstance(w, torch.Tensor)
    assert torch.equal(w, sd["w"]) and w.data_ptr() != sd["w"].data_ptr()
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


def test_address_is_the_name_in_the_hub() -> None:
    a: InProcessTransport[dict[str, Any]] = InProcessTransport(InProcessHub(), "replica-a")
    assert a.address() == a.metadata() == "replica-a"


def test_in_place_receive_into_the_receivers_state_dict() -> None:
    hub = InProcessHub()
    mine = {"w": torch.zeros(4, 3), "other": torch.zeros(2, dtype=torch.int32)}
    ptr = mine["w"].data_ptr()
    a: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "a")
    b: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "b", state_dict=lambda: mine)
    sd = {"w": torch.randn(4, 3), "other": torch.arange(3)}
    a.send_checkpoint([1], 1, sd, T)
    out = b.recv_checkpoint(0, "a", 1, T)
    assert out["w"] is mine["w"] and mine["w"].data_ptr() == ptr
    assert torch.equal(mine["w"], sd["w"])
    assert out["other"] is not mine["other"], "a shape mismatch is received into fresh memory"
    assert torch.equal(out["other"], torch.arange(3)) and not mine["other"].any()


def test_allow_checkpoint_reopens_the_last_sent_step() -> None:
    hub = InProcessHub()
    a: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "a")
    b: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "b")
    with pytest.raises(
        ValueError, match=r"allow_checkpoint\(step=2\): nothing was sent for step 2"
    ):
        a.allow_checkpoint(2)
    sd = {"x": torch.zeros(3)}
    a.send_checkpoint([1], 2, sd, T)
    a.disallow_checkpoint()
    with pytest.raises(RecoveryError, match="served no checkpoint"):
        b.recv_checkpoint(0, "a", 2, timedelta(seconds=0.01))
    sd["x"].fill_(7)
    a.allow_checkpoint(2)
    assert torch.equal(b.recv_checkpoint(0, "a", 2, T)["x"], torch.full((3,), 7.0))
    with pytest.raises(ValueError, match=r"nothing was sent for step 3 \(the last .* step 2\)"):
        a.allow_checkpoint(3)


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="hub must be an InProcessHub, got str"):
        InProcessTransport("hub", "a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be a non-empty str, got ''"):
        InProcessTransport(InProcessHub(), "")

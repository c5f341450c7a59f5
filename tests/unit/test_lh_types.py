"""``copy_with``: the per-step stand-in for ``dataclasses.replace``."""

from __future__ import annotations

import dataclasses

import pytest

from lighthouse import validate
from lighthouse.types import QuorumMember, QuorumResult, copy_with


def _result() -> QuorumResult:
    return QuorumResult(
        quorum_id=3,
        epoch="ep",
        replica_rank=1,
        replica_world_size=2,
        recover_src_manager_address="",
        recover_src_replica_rank=None,
        replica_ids=["a", "b"],
        max_step=4,
    )


def test_copy_with_equals_replace_and_leaves_the_original() -> None:
    base = _result()
    copy = copy_with(base, max_step=9)
    assert copy == dataclasses.replace(base, max_step=9)
    assert copy is not base and base.max_step == 4
    assert hash(copy_with(QuorumMember("r", step=1), step=2)) == hash(QuorumMember("r", step=2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.max_step = 1  # type: ignore[misc]


def test_copy_with_keeps_what_a_member_carries_beside_its_fields() -> None:
    """A decoded member keeps its data's wire text beside the fields; a copy that
    changes its step must keep it too (``replace`` would drop it)."""
    text = '{"k": [1,  2]}'  # as a peer sent it: relayed as received, never re-encoded
    decoded = validate.with_data_json(QuorumMember("r", step=1, data={"k": [1, 2]}), text)
    copy = copy_with(decoded, step=5, step_time_ms=2.0)
    assert (copy.step, copy.step_time_ms, copy.data) == (5, 2.0, {"k": [1, 2]})
    assert validate.member_data_json(copy) == text


def test_copy_with_refuses_a_name_that_is_not_a_field() -> None:
    with pytest.raises(TypeError, match=r"QuorumResult has no fields \['max_steps'\]"):
        copy_with(_result(), max_steps=1)

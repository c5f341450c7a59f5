"""What a quorum result asks of one rank, as a plain function of the result."""

from __future__ import annotations

from lighthouse import QuorumResult
from torchft_pg.manager.participation import Participation, WorldSizeMode
from torchft_pg.manager.quorum_plan import QuorumPlan, configure_address, plan_quorum


def _result(
    *,
    quorum_id: int = 1,
    heal: bool = False,
    src: int | None = None,
    dst: list[int] | None = None,
    max_rank: int | None = 0,
) -> QuorumResult:
    return QuorumResult(
        quorum_id=quorum_id,
        epoch="ep",
        replica_rank=1,
        replica_world_size=3,
        recover_src_manager_address="",
        recover_src_replica_rank=src,
        recover_dst_replica_ranks=dst or [],
        store_address="10.0.0.1:29500",
        max_step=7,
        max_replica_rank=max_rank,
        max_world_size=2,
        heal=heal,
        replica_ids=["a", "b", "c"],
    )


def _plan(result: QuorumResult, *, configured: tuple[str, int], allow_heal: bool) -> QuorumPlan:
    return plan_quorum(
        result,
        configured=configured,
        group_rank=2,
        allow_heal=allow_heal,
        heals_in_background=True,
        mode=WorldSizeMode.DYNAMIC,
        min_replica_size=1,
    )


def test_configure_address_is_fresh_per_epoch_quorum_and_group_rank() -> None:
    assert configure_address(_result(quorum_id=4), 2) == "10.0.0.1:29500/torchft/ep/4/2"


def test_the_same_quorum_with_nothing_to_heal_is_steady() -> None:
    plan = _plan(_result(), configured=("ep", 1), allow_heal=True)
    assert plan.configure_at is None and not plan.heals and plan.steady
    assert plan.participation == Participation(rank=0, world_size=2, present=3)


def test_a_new_quorum_or_a_new_epoch_reconfigures() -> None:
    for configured in [("ep", 0), ("old-epoch", 1), ("", -1)]:
        plan = _plan(_result(), configured=configured, allow_heal=True)
        assert plan.configure_at == "10.0.0.1:29500/torchft/ep/1/2"
        assert not plan.steady


def test_a_replica_behind_receives_from_the_named_source_at_the_max_step() -> None:
    result = _result(heal=True, src=0, max_rank=None)
    plan = _plan(result, configured=("ep", 1), allow_heal=True)
    assert plan.receive_heal and not plan.send_heal and not plan.steady
    assert (plan.heal_step, plan.heal_source) == (7, 0)
    assert plan.participation == Participation(
        rank=None, world_size=2, present=3
    )  # zeros meanwhile


def test_a_source_sends_to_the_healers() -> None:
    plan = _plan(_result(dst=[2]), configured=("ep", 1), allow_heal=True)
    assert plan.send_heal and not plan.receive_heal and plan.heals


def test_healing_disallowed_neither_sends_nor_receives() -> None:
    plan = _plan(_result(heal=True, src=0, dst=[2]), configured=("ep", 1), allow_heal=False)
    assert not plan.heals and plan.steady


def test_a_heal_without_a_named_source_is_planned_and_fails_where_it_runs() -> None:
    plan = _plan(_result(heal=True, src=None), configured=("ep", 1), allow_heal=True)
    assert plan.receive_heal and plan.heal_source is None

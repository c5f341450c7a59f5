"""Per-rank results: replica ranks, store spreading, who heals from whom."""

from __future__ import annotations

import pytest

from lighthouse.replica.ranks import compute_quorum_result
from lighthouse.types import Quorum, QuorumMember


def quorum(steps: list[int], commit_failures: list[int] | None = None) -> Quorum:
    cf = commit_failures or [0] * len(steps)
    return Quorum(
        7,
        "ep",
        tuple(
            QuorumMember(
                f"r{i}",
                address=f"mgr{i}:1",
                store_address=f"store{i}:2",
                step=s,
                world_size=2,
                commit_failures=cf[i],
            )
            for i, s in enumerate(steps)
        ),
    )


def test_healers_round_robin_over_up_to_date_rotated_by_group_rank() -> None:
    q = quorum([0, 1, 0, 1, 0])
    g0 = {i: compute_quorum_result(q, f"r{i}", 0) for i in range(5)}
    assert [g0[i].recover_src_replica_rank for i in range(5)] == [1, None, 3, None, 1]
    assert g0[1].recover_dst_replica_ranks == [0, 4]
    assert g0[3].recover_dst_replica_ranks == [2]
    assert g0[0].heal and not g0[1].heal
    assert g0[0].recover_src_manager_address == "mgr1:1"
    assert g0[0].store_address == "store1:2"  # primary for group rank 0
    g1 = {i: compute_quorum_result(q, f"r{i}", 1) for i in range(5)}
    assert [g1[i].recover_src_replica_rank for i in range(5)] == [3, None, 1, None, 3]
    assert g1[0].store_address == "store3:2"  # group rank 1 rendezvouses elsewhere


def test_a_healer_gets_its_sources_metadata_for_its_own_group_rank() -> None:
    members = tuple(
        QuorumMember(
            f"r{i}",
            address=f"mgr{i}:1",
            step=s,
            world_size=2,
            checkpoint_metadata=(f"http://r{i}g0/", f"http://r{i}g1/"),
        )
        for i, s in enumerate([3, 5])
    )
    q = Quorum(1, "ep", members)
    assert compute_quorum_result(q, "r0", 0).recover_src_checkpoint_metadata == "http://r1g0/"
    assert compute_quorum_result(q, "r0", 1).recover_src_checkpoint_metadata == "http://r1g1/"
    assert compute_quorum_result(q, "r1", 0).recover_src_checkpoint_metadata == ""  # no heal
    bare = Quorum(1, "ep", (QuorumMember("r0", step=3), QuorumMember("r1", address="m:1", step=5)))
    assert compute_quorum_result(bare, "r0", 0).recover_src_checkpoint_metadata == ""  # ask


def test_max_step_fields() -> None:
    q = quorum([3, 5, 5])
    r0, r1, r2 = (compute_quorum_result(q, f"r{i}", 0) for i in range(3))
    assert (r0.max_step, r0.max_world_size, r0.max_replica_rank) == (5, 2, None)
    assert (r1.max_replica_rank, r2.max_replica_rank) == (0, 1)
    assert (r2.replica_rank, r2.replica_world_size) == (2, 3)
    assert r0.replica_ids == ["r0", "r1", "r2"]
    assert (r0.quorum_id, r0.epoch) == (7, "ep")


def test_init_sync_forces_recovery_from_the_primary_on_a_fresh_job() -> None:
    q = quorum([0, 0, 0])
    res = [compute_quorum_result(q, f"r{i}", 0, init_sync=True) for i in range(3)]
    assert [r.heal for r in res] == [False, True, True]
    assert res[0].recover_dst_replica_ranks == [1, 2]
    res = [compute_quorum_result(q, f"r{i}", 0, init_sync=False) for i in range(3)]
    assert not any(r.heal for r in res)


@pytest.mark.parametrize("group_rank", [0, 1, 2])
def test_init_sync_heals_every_group_rank_from_the_same_replica(group_rank: int) -> None:
    # Fresh replicas hold different initial states: a group must not take its
    # shards from two of them.
    q = quorum([0, 0, 0])
    res = [compute_quorum_result(q, f"r{i}", group_rank, init_sync=True) for i in range(3)]
    assert [r.recover_src_replica_rank for r in res] == [None, 0, 0]
    assert res[0].recover_dst_replica_ranks == [1, 2]
    assert res[group_rank].store_address == f"store{group_rank}:2"  # store load still spread


def test_replicas_healing_at_step_0_are_not_counted_among_the_participants() -> None:
    # They contribute zeros to the step: counting them would shrink its average.
    q = quorum([0, 0, 0])
    res = [compute_quorum_result(q, f"r{i}", 0, init_sync=True) for i in range(3)]
    assert [(r.max_replica_rank, r.max_world_size) for r in res] == [(0, 1), (None, 1), (None, 1)]
    res = [compute_quorum_result(q, f"r{i}", 0, init_sync=False) for i in range(3)]
    assert [(r.max_replica_rank, r.max_world_size) for r in res] == [(0, 3), (1, 3), (2, 3)]


def test_commit_failures_is_the_max_over_participants() -> None:
    assert compute_quorum_result(quorum([1, 1], [0, 3]), "r0", 0).commit_failures == 3


def test_not_in_quorum_and_bad_group_rank_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="replica_id 'zz' is not in quorum ep/7"):
        compute_quorum_result(quorum([1]), "zz", 0)
    with pytest.raises(ValueError, match="group_rank must be >= 0, got -1"):
        compute_quorum_result(quorum([1]), "r0", -1)

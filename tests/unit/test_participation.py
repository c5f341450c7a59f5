"""Participation arithmetic, as a plain function of a quorum result."""

from __future__ import annotations

import pytest

from lighthouse import QuorumResult
from torchft_pg.manager.participation import Participation, WorldSizeMode, local_vote, participation


def _result(*, replica_rank: int, world: int, max_rank: int | None, max_world: int) -> QuorumResult:
    return QuorumResult(
        quorum_id=1,
        epoch="ep",
        replica_rank=replica_rank,
        replica_world_size=world,
        recover_src_manager_address="",
        recover_src_replica_rank=None,
        recover_dst_replica_ranks=[],
        store_address="127.0.0.1:1",
        max_step=3,
        max_replica_rank=max_rank,
        max_world_size=max_world,
        heal=max_rank is None,
        replica_ids=[f"r{i}" for i in range(world)],
    )


@pytest.mark.parametrize(
    ("background", "mode", "minimum", "want"),
    [
        # a healer in the background contributes zeros; the up-to-date two divide
        # (all three are present in the step)
        (True, WorldSizeMode.DYNAMIC, 1, Participation(rank=None, world_size=2, present=3)),
        # healing first (synchronous quorum): it takes full part
        (False, WorldSizeMode.DYNAMIC, 1, Participation(rank=2, world_size=3, present=3)),
        # spares: only min_replica_size take part, by rank
        (
            False,
            WorldSizeMode.FIXED_WITH_SPARES,
            2,
            Participation(rank=None, world_size=2, present=3),
        ),
        (False, WorldSizeMode.FIXED_WITH_SPARES, 3, Participation(rank=2, world_size=3, present=3)),
    ],
)
def test_participation(
    background: bool, mode: WorldSizeMode, minimum: int, want: Participation
) -> None:
    healer = _result(replica_rank=2, world=3, max_rank=None, max_world=2)
    got = participation(healer, heals_in_background=background, mode=mode, min_replica_size=minimum)
    assert got == want


def test_local_vote() -> None:
    assert local_vote(failed=False, present=2, min_replica_size=2)
    assert not local_vote(failed=False, present=1, min_replica_size=2)
    assert not local_vote(failed=True, present=3, min_replica_size=1)


def test_a_healer_counts_toward_min_replica_size_but_not_the_average() -> None:
    # Two groups, min_replica_size 2, one of them healing into the step: the step
    # averages over the one that contributes, and may still commit.
    source = _result(replica_rank=0, world=2, max_rank=0, max_world=1)
    got = participation(
        source, heals_in_background=True, mode=WorldSizeMode.DYNAMIC, min_replica_size=2
    )
    assert got == Participation(rank=0, world_size=1, present=2)
    assert local_vote(failed=False, present=got.present, min_replica_size=2)

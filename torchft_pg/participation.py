"""Who takes part in a step, and whether a rank votes to commit it: pure arithmetic.

A quorum result says which replicas are up to date (`max_replica_rank`,
`max_world_size`) and which are in the group at all (`replica_rank`,
`replica_world_size`). Which pair a step uses depends on when healing
happens: with an asynchronous quorum (or no healing) a healer heals in the
background and contributes zeros, so only the up-to-date replicas count; with
a synchronous quorum it heals first and takes full part. `FIXED_WITH_SPARES`
caps the participants at `min_replica_size`; the rest are spares.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from lighthouse import QuorumResult

__all__ = ["Participation", "WorldSizeMode", "local_vote", "participation"]


class WorldSizeMode(Enum):
    """DYNAMIC: every up-to-date replica takes part. FIXED_WITH_SPARES: exactly
    `min_replica_size` take part; the others are spares contributing zeros."""

    DYNAMIC = 0
    FIXED_WITH_SPARES = 1


@dataclass(frozen=True, kw_only=True)
class Participation:
    """This replica's part in a step: its rank among the participants (None:
    it contributes zeros) and how many participants the average divides by."""

    rank: int | None
    world_size: int


NOT_STARTED = Participation(rank=None, world_size=0)


def participation(
    result: QuorumResult,
    *,
    heals_in_background: bool,
    mode: WorldSizeMode,
    min_replica_size: int,
) -> Participation:
    """This replica's participation in the step `result` answers.

    `heals_in_background`: the quorum is asynchronous or healing is off, so a
    replica that is behind does not take part this step.
    """
    if heals_in_background:
        rank, size = result.max_replica_rank, result.max_world_size
    else:
        rank, size = result.replica_rank, result.replica_world_size
    if mode == WorldSizeMode.FIXED_WITH_SPARES:
        size = min(size, min_replica_size)
        rank = rank if rank is not None and rank < min_replica_size else None
    return Participation(rank=rank, world_size=size)


def local_vote(*, failed: bool, participants: int, min_replica_size: int) -> bool:
    """This rank's commit vote: nothing failed and enough replicas took part."""
    return not failed and participants >= min_replica_size

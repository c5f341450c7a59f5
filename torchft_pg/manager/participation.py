"""Who takes part in a step, and whether a rank votes to commit it: pure arithmetic.

A quorum result says which replicas are up to date (`max_replica_rank`,
`max_world_size`) and which are in the group at all (`replica_rank`,
`replica_world_size`). Which pair a step uses depends on when healing
happens: with an asynchronous quorum (or no healing) a healer heals in the
background and contributes zeros, so only the up-to-date replicas count; with
a synchronous quorum it heals first and takes full part. `FIXED_WITH_SPARES`
caps the participants at `min_replica_size`; the rest are spares.

The commit vote asks whether enough replicas are *present* in the step:
every replica group of its quorum, whether it contributes, is a spare, or
heals into the step (a healer votes yes only once its heal is complete on
every one of its ranks, and loads it only if its group commits). Counting
contributors instead made a job that requires every group
(`min_replica_size` equal to the number of groups) livelock when a group
restarted: each step it healed had one contributor too few, every group
voted no, the healed state was dropped, and the next step healed again.
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
    it contributes zeros), how many participants the average divides by, and
    how many replica groups are present in the step (participants, spares and
    healers: what the vote counts against `min_replica_size`)."""

    rank: int | None
    world_size: int
    present: int = 0


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
    return Participation(rank=rank, world_size=size, present=result.replica_world_size)


def local_vote(*, failed: bool, present: int, min_replica_size: int) -> bool:
    """This rank's commit vote: nothing failed and enough replica groups are
    present in the step (see the module docstring)."""
    return not failed and present >= min_replica_size

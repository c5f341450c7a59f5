"""What a quorum result asks of one rank: pure functions of the result.

A `QuorumResult` answers a rank's quorum request. From it and what the rank
already has (the quorum its process group is configured for) follow: who
takes part in the step (`participation`), whether the group must be rebuilt
and at which store address, and whether this rank heals (receives the state
at `heal_step` from `heal_source`) or serves its state to healers. A plan with
neither a new quorum nor a heal is *steady*: the step can go on where the
result arrived, without a thread hop.
"""

from __future__ import annotations

from dataclasses import dataclass

from lighthouse import QuorumResult
from torchft_pg.manager.participation import Participation, WorldSizeMode, participation

__all__ = ["QuorumPlan", "configure_address", "plan_quorum"]


def configure_address(result: QuorumResult, group_rank: int) -> str:
    """The ``host:port/prefix`` group rank `group_rank` configures its process group
    at for `result`'s quorum: one prefix per (epoch, quorum id, group rank), so
    every configuration meets its peers on fresh keys."""
    return f"{result.store_address}/torchft/{result.epoch}/{result.quorum_id}/{group_rank}"


@dataclass(frozen=True, kw_only=True)
class QuorumPlan:
    """What one rank does with a quorum result.

    `configure_at`: the store address to rebuild the process group at (None:
    the quorum is the one the group is configured for, keep it).
    `send_heal`: serve this rank's state to the replicas healing from it.
    `receive_heal`: fetch the state at `heal_step` from replica rank
    `heal_source` (None when the result names none: the heal then fails).
    """

    participation: Participation
    configure_at: str | None
    send_heal: bool
    receive_heal: bool
    heal_step: int
    heal_source: int | None

    @property
    def heals(self) -> bool:
        """This rank sends or receives a heal this step."""
        return self.send_heal or self.receive_heal

    @property
    def steady(self) -> bool:
        """Same quorum and nothing to heal: nothing in the plan blocks."""
        return self.configure_at is None and not self.heals


def plan_quorum(
    result: QuorumResult,
    *,
    configured: tuple[str, int],
    group_rank: int,
    allow_heal: bool,
    heals_in_background: bool,
    mode: WorldSizeMode,
    min_replica_size: int,
) -> QuorumPlan:
    """The plan for `result`, for a rank whose group is configured for the
    (epoch, quorum id) `configured`.

    `allow_heal` False (the caller's `start_quorum(allow_heal=False)`) means
    neither sending nor receiving. `heals_in_background`, `mode` and
    `min_replica_size` decide participation (see `participation.participation`).
    """
    new_quorum = (result.epoch, result.quorum_id) != configured
    return QuorumPlan(
        participation=participation(
            result,
            heals_in_background=heals_in_background,
            mode=mode,
            min_replica_size=min_replica_size,
        ),
        configure_at=configure_address(result, group_rank) if new_quorum else None,
        send_heal=allow_heal and bool(result.recover_dst_replica_ranks),
        receive_heal=allow_heal and result.heal,
        heal_step=result.max_step,
        heal_source=result.recover_src_replica_rank,
    )

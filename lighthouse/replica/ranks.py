"""Pure: from a quorum to one group rank's ``QuorumResult`` (ranks, store, who heals).

Rules:

- replica rank / world size: index among participants sorted by replica id;
- max step; the store group rank ``g`` rendezvouses on: participant
  ``g mod n`` of the ``n`` at max step (the *primary* for ``g``), spreading load;
- who heals: everyone behind max step, and with ``init_sync`` on a fresh job
  (max step 0) everyone but the first participant (in replica-id order);
- the up-to-date participants (everyone who does not heal) give
  ``max_replica_rank`` and ``max_world_size``: a replica that heals this step
  contributes nothing to it, so it is not counted;
- healer ``i`` (in replica-rank order) is served by up-to-date participant
  ``(i + g) mod len(up_to_date)``: round robin, rotated by group rank.

Two rules differ from torchft's manager server on a fresh job with
``init_sync``: torchft lets every group rank sync from its own primary (so a
sharded replica group may take its shards from different replicas' initial
states) and counts the replicas it heals at step 0 among ``max_world_size``
(so the first step's average is divided by replicas that contributed zeros).
Here every group rank syncs from the same replica, and healers are not counted.
"""

from __future__ import annotations

from lighthouse.types import Quorum, QuorumResult


def compute_quorum_result(
    quorum: Quorum, replica_id: str, group_rank: int, init_sync: bool = True
) -> QuorumResult:
    """The result for ``group_rank`` of replica ``replica_id`` in ``quorum``."""
    if group_rank < 0:
        raise ValueError(f"group_rank must be >= 0, got {group_rank}")
    parts = quorum.participants
    ids = [p.replica_id for p in parts]
    try:
        me = ids.index(replica_id)
    except ValueError:
        raise ValueError(
            f"replica_id {replica_id!r} is not in quorum {quorum.epoch}/{quorum.quorum_id} "
            f"(participants: {ids})"
        ) from None
    max_step = max(p.step for p in parts)
    at_max = [i for i, p in enumerate(parts) if p.step == max_step]
    primary = at_max[group_rank % len(at_max)]
    # A fresh job's replicas hold different initial states: every group rank syncs
    # from the same one, so a replica group never mixes two replicas' shards.
    force = init_sync and max_step == 0
    healers = [i for i, p in enumerate(parts) if p.step != max_step or (force and i != at_max[0])]
    healer_set = set(healers)
    up_to_date = [i for i in range(len(parts)) if i not in healer_set]
    src_of = {h: up_to_date[(j + group_rank) % len(up_to_date)] for j, h in enumerate(healers)}
    src = src_of.get(me)
    src_metadata = parts[src].checkpoint_metadata if src is not None else ()
    return QuorumResult(
        quorum_id=quorum.quorum_id,
        epoch=quorum.epoch,
        replica_rank=me,
        replica_world_size=len(parts),
        recover_src_manager_address=parts[src].address if src is not None else "",
        recover_src_replica_rank=src,
        recover_dst_replica_ranks=[h for h in healers if src_of[h] == me],
        store_address=parts[primary].store_address,
        max_step=max_step,
        max_replica_rank=up_to_date.index(me) if me in up_to_date else None,
        max_world_size=len(up_to_date),
        heal=src is not None,
        commit_failures=max(p.commit_failures for p in parts),
        replica_ids=ids,
        recover_src_checkpoint_metadata=(
            src_metadata[group_rank] if group_rank < len(src_metadata) else ""
        ),
    )

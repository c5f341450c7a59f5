"""Which receivers a served checkpoint is for: the healers its quorum named.

A quorum names, for each replica that must heal, the replica it heals from;
the source then serves its state for that step. When the Manager tells the
transport the quorum it is in (`CheckpointTransport.set_quorum`), the HTTP
server serves only requests that say they come from a replica rank the quorum
named as a healer of this source, in that same quorum; every receive of ours
says so (two request headers). Anything else gets 403 and the reason.

This keeps a job member that is not healing (a confused or stale replica, or
a process from an old quorum) from reading a state it was not given, and ties
every transfer to one quorum in the logs. It is not authentication: a stranger
is kept out by the job secret (``lighthouse.auth``), which every request must
carry first; without a secret the rank a request claims is taken on its word.

Plain logic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QUORUM_HEADER", "REPLICA_RANK_HEADER", "NamedHealers", "healer_headers"]

QUORUM_HEADER = "X-Torchft-Quorum"  # "{epoch}/{quorum_id}" of the receiver's quorum
REPLICA_RANK_HEADER = "X-Torchft-Replica-Rank"  # the receiver's replica rank in it


def healer_headers(quorum: str, replica_rank: int) -> dict[str, str]:
    """The headers a healer of `quorum`, at `replica_rank`, sends with every request."""
    return {QUORUM_HEADER: quorum, REPLICA_RANK_HEADER: str(replica_rank)}


@dataclass(frozen=True, kw_only=True)
class NamedHealers:
    """The quorum (``"{epoch}/{quorum_id}"``) a checkpoint is served in, and the
    replica ranks it named to heal from this source."""

    quorum: str
    replica_ranks: frozenset[int]

    def may_come(self, quorum: str) -> bool:
        """Whether this source may still serve in `quorum`: not one of the same
        epoch that is older than the served one (a stale healer). A later one,
        or one of another epoch (the lighthouse restarted), may be the quorum
        the source has not entered yet."""
        epoch, _, quorum_id = quorum.rpartition("/")
        served_epoch, _, served_id = self.quorum.rpartition("/")
        if epoch != served_epoch or not (quorum_id.isdecimal() and served_id.isdecimal()):
            return epoch != served_epoch
        return int(quorum_id[:18]) > int(served_id[:18])

    def refusal(self, quorum: str | None, replica_rank: str | None) -> str | None:
        """Why a request with these header values may not read the checkpoint, or None."""
        if quorum is None or replica_rank is None:
            return (
                f"this checkpoint is served to the healers quorum {self.quorum} named; the "
                f"request did not say which quorum and replica rank it comes from "
                f"({QUORUM_HEADER}, {REPLICA_RANK_HEADER})"
            )
        if quorum != self.quorum:
            return (
                f"this checkpoint is served in quorum {self.quorum}, not in quorum "
                f"{quorum[:64]!r} the request names"
            )
        rank_ok = replica_rank.isascii() and replica_rank.isdecimal() and len(replica_rank) <= 9
        if not rank_ok or int(replica_rank) not in self.replica_ranks:
            return (
                f"quorum {self.quorum} named replica ranks {sorted(self.replica_ranks)} to heal "
                f"from this replica, not {replica_rank[:16]!r}"
            )
        return None

"""Pure: do the replica groups' fingerprints agree, and if not, who differs.

Each rank of a check gathers one vector per member of its cross-replica group
(`fingerprint.Fingerprint.vector`, or an absent one from a member that heals
this step). `judge` compares the vectors of the members that take part: the
state held by more than half of them is the majority's, and everyone else is
a minority whose state is corrupt. With no strict majority (two groups that
disagree, or three that all differ) nobody can say which state is right, so
the verdict says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = ["Divergence", "StateVerdict", "VerdictKind", "judge"]


class VerdictKind(Enum):
    """AGREE: every member taking part holds the same state. MINORITY: a strict
    majority agrees and the others differ from it. NO_MAJORITY: they differ and
    no state is held by more than half of them."""

    AGREE = "agree"
    MINORITY = "minority"
    NO_MAJORITY = "no_majority"


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """Member `rank` (its rank in the cross-replica group) differs from the
    reference state in `slots` (digest slots: see `fingerprint.names_in_slots`);
    `count_differs`: it even holds a different number of tensors."""

    rank: int
    slots: tuple[int, ...]
    count_differs: bool


@dataclass(frozen=True, kw_only=True)
class StateVerdict:
    """What a check found. `checked`: the ranks that took part; `majority`: the
    ranks holding the majority's state (empty without one); `diverged`: how each
    other member differs from the majority's state (without a majority: from
    the state of the lowest rank taking part, every member holding another)."""

    kind: VerdictKind
    checked: tuple[int, ...]
    majority: tuple[int, ...]
    diverged: tuple[Divergence, ...]

    def divergence_of(self, rank: int) -> Divergence | None:
        """How member `rank` differs, or None if it is not among the diverged."""
        return next((d for d in self.diverged if d.rank == rank), None)

    def trusted(self, rank: int) -> bool:
        """Member `rank`'s state may be copied: it is in the majority, or all agree."""
        return self.kind == VerdictKind.AGREE or rank in self.majority


def _divergence(rank: int, vector: Sequence[int], reference: Sequence[int]) -> Divergence:
    count, slots = vector[1], vector[3:]
    return Divergence(
        rank=rank,
        slots=tuple(i for i, (a, b) in enumerate(zip(slots, reference[3:], strict=True)) if a != b),
        count_differs=count != reference[1],
    )


def judge(vectors: Sequence[Sequence[int]]) -> StateVerdict:
    """The verdict on the gathered `vectors`, indexed by member rank; a vector
    whose first element is 0 is a member not taking part. Raises ValueError
    if the vectors differ in length (they are of fixed length by design)."""
    vectors = [tuple(v) for v in vectors]
    lengths = {len(v) for v in vectors}
    if len(lengths) > 1:
        raise ValueError(f"fingerprint vectors of different lengths {sorted(lengths)}")
    checked = tuple(r for r, v in enumerate(vectors) if v and v[0] != 0)
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in checked:
        groups.setdefault(tuple(vectors[r]), []).append(r)
    if len(groups) <= 1:
        return StateVerdict(kind=VerdictKind.AGREE, checked=checked, majority=checked, diverged=())
    state, holders = max(groups.items(), key=lambda item: len(item[1]))
    if 2 * len(holders) > len(checked):
        return StateVerdict(
            kind=VerdictKind.MINORITY,
            checked=checked,
            majority=tuple(holders),
            diverged=tuple(_divergence(r, vectors[r], state) for r in checked if r not in holders),
        )
    reference = vectors[checked[0]]
    return StateVerdict(
        kind=VerdictKind.NO_MAJORITY,
        checked=checked,
        majority=(),
        diverged=tuple(
            _divergence(r, vectors[r], reference) for r in checked if vectors[r] != reference
        ),
    )

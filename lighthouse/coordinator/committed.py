"""Pure: the job's committed step, advanced only by what a quorum's members reach together.

A request's ``step`` is a claim: the replica says it holds that many committed
steps. The lighthouse cannot check it, so a claim alone never becomes the
job's committed step (quorum rule 6, and the number the state file keeps): a
stranger, or a stale or buggy process of the job, claiming step 2**62 in one
request would otherwise make every later quorum "below the committed step" and
stop the job for good.

The committed step moves only from what the members of the latest quorum
report *after* it was issued (their next request, or a liveness ping on a
lease), and only to the lowest step that every live member has reached: once
every member still alive has reported, the least of their latest steps is a
step the whole quorum holds, so it was committed, not merely claimed. A member
that lies high changes nothing (the others' steps are lower); one that lies
low only holds the value back; one that vanishes is dropped from the count
(``gone``) and its reports with it, so nothing it claimed outlives it. Members
that report without a failed commit, all of them, have *committed a step
together*: the quorum rules call them proven (rule 7).

What a quorum's live members reach together is also the right size to
remember for a restart (``members``, rule 3): a quorum inflated by members
that never report is never counted.

No clock, no sockets: ``QuorumState`` calls it with the events it sees. Each
report is O(1) amortized (the least step is kept per distinct step value);
``issued`` is O(members).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CommittedStep", "Together"]


@dataclass(frozen=True, kw_only=True)
class Together:
    """Every live member of the tracked quorum has reported since it was issued.

    ``step``: the lowest of their latest steps (what they hold together);
    ``members``: their replica ids, sorted; ``committed``: none of their latest
    reports was a failed commit (they committed a step together).
    """

    step: int
    members: tuple[str, ...]
    committed: bool


class CommittedStep:
    """The job's committed ``step`` and the quorum whose reports may advance it.

    ``step``: the committed step (it only rises, except by ``reset``);
    ``members``: how many live members last reached a step together (0: none
    yet), the quorum size a restarted lighthouse waits for a majority of;
    ``ended``: the run that committed ``step`` ended cleanly (every member of its
    last quorum left with a clean shutdown), so a new run may start from step 0.
    """

    def __init__(self, step: int = 0, members: int = 0, ended: bool = False) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"committed step must be an int >= 0, got {step!r}")
        if isinstance(members, bool) or not isinstance(members, int) or members < 0:
            raise ValueError(f"members must be an int >= 0, got {members!r}")
        self.step = step
        self.members = members
        self.ended = ended
        self._unreported: set[str] = set()  # tracked members with no report since the issue
        self._reached: dict[str, int] = {}  # member -> its latest reported step
        self._counts: Counter[int] = Counter()  # reported step -> members at it
        self._failed: set[str] = set()  # members whose latest report was a failed commit
        # the last Together returned: (step, committed, how many members)
        self._last: tuple[int, bool, int] | None = None

    def issued(self, replica_ids: Iterable[str]) -> None:
        """A quorum of ``replica_ids`` was issued: from now on only its members'
        reports count, and each must report again before any counts."""
        self._unreported = set(replica_ids)
        self._reached.clear()
        self._counts.clear()
        self._failed.clear()
        self._last = None

    def reported(self, replica_id: str, step: int, failed: bool = False) -> Together | None:
        """``replica_id`` reported ``step`` (a quorum request, or a liveness ping);
        ``failed``: the request says its last commit failed.

        Returns a ``Together`` when this report completes, or changes, what the
        tracked quorum's live members hold together, else None (a member of
        another quorum, or some member has not reported yet). Advances ``step``
        when they hold more than it.
        """
        if replica_id in self._unreported:
            self._unreported.discard(replica_id)
        elif replica_id in self._reached:
            self._drop(replica_id)
        else:
            return None
        self._reached[replica_id] = step
        self._counts[step] += 1
        if failed:
            self._failed.add(replica_id)
        else:
            self._failed.discard(replica_id)
        return self._together()

    def gone(self, replica_id: str) -> None:
        """``replica_id`` is dead or left: it no longer counts, nor do its reports.

        Advances nothing by itself: the remaining members' next report does, so
        a departure never turns what is left into a committed step on its own."""
        self._unreported.discard(replica_id)
        if replica_id in self._reached:
            self._drop(replica_id)
            del self._reached[replica_id]
            self._failed.discard(replica_id)

    def reset(self, step: int) -> None:
        """The operator allowed a quorum below the committed step, or a new run
        starts after one that ended: it is the job's new history, so the committed
        step goes down to ``step``."""
        self.step = min(self.step, step)
        self.ended = False

    def end(self) -> None:
        """The run ended cleanly: its step stays the committed step (a restart
        below it, from a checkpoint, is still refused), and a new run from step 0
        is allowed (``ended``) until a quorum is issued."""
        self.ended = True
        self.members = 0  # a new run need not wait for the old run's size (rule 3)

    def _drop(self, replica_id: str) -> None:
        old = self._reached[replica_id]
        self._counts[old] -= 1
        if not self._counts[old]:
            del self._counts[old]

    def _together(self) -> Together | None:
        if self._unreported or not self._reached:
            return None
        step = min(self._counts)  # O(distinct steps): one to three while training
        committed = not self._failed
        last = (step, committed, len(self._reached))
        if self._last == last:
            return None  # said already: keeps a lease's pings O(1) each
        self._last = last
        self.step = max(self.step, step)
        self.members = len(self._reached)
        return Together(step=step, members=tuple(sorted(self._reached)), committed=committed)

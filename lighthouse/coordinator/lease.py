"""Pure: the lighthouse's record of the outstanding quorum lease, and when to recall it.

A quorum lease lets the members of a quorum run their following steps without
asking the lighthouse, which takes the per-step round trip (the largest part
of the fault-tolerance cost per step) off every step where nothing changes.
The lighthouse grants one when a quorum leaves nobody waiting, and recalls it,
on the holders' liveness streams, when:

- anyone else asks for a quorum: a joiner (nobody's collectives are stranded;
  the holders finish the rounds up to the one after the highest a holder
  reported, which any of them may have begun, and then all ask together), or
  a member that left the lease (a
  failed step, a broken stream). That member runs no collectives any more, so
  a holder already in a leased step at or above the member's step would wait
  for it forever: the recall tells such a holder to fail that step now;
- a holder stalls: another holder's leased step has been ahead of it for the
  join timeout or ``STALL_ROUNDS`` rounds' length, whichever is longer (the
  holders ahead are stuck in collectives waiting for it). The round length is
  the time between the last two rises of the holders' top step: on slow links a
  holder normally starts a round a few hundred ms after the fastest, and a
  threshold of a 300 ms join timeout alone failed a leased step nearly every
  round there (50 ms delay, 1% loss), so that three replicas never met again;
- a holder leaves cleanly (a death is told by the failure notice instead):
  the others may still finish their leased rounds below the step the leaver
  committed through (``valid_below_step``), so a replica that finishes first
  strands nobody;
- a quorum issued at the join timeout leaves holders out;
- a holder is quarantined as a straggler (no leased round fails: the
  straggler's own ask, held in quarantine, then recalls as any ask does).

Alignment: the lease keeps its members in step as a quorum round would. Each
holder reports every round it starts (an immediate liveness ping), and a
holder starts a leased round at step s only once the floor (the slowest
holder's step) is >= s - 1: never more than one step ahead of the slowest.
Usually its own collectives of step s - 1 proved that already (they
completed, so every holder had begun s - 1); a holder without that proof says
in its ping that it waits (``floor_wanted``), and the lighthouse sends it the
floor (``LeaseFloor``) once the floor reaches that step. So a job whose steps
run collectives costs the lighthouse one message per holder and step, not two.

Recalls are sent when their content changes, so a burst of asks costs one
message per holder per change. Steps come from the holders' liveness pings.
"""

from __future__ import annotations

from lighthouse.types import LeaseFloor, LeaseRecall, Quorum, QuorumMember

STALL_ROUNDS = 3.0  # a holder behind for this many rounds' length (and the join timeout) stalls


class QuorumLease:
    """The one outstanding lease (or none: ``lease_id`` 0). Times in seconds."""

    def __init__(self) -> None:
        self.lease_id = 0
        self.quorum_id = 0
        self.members: frozenset[str] = frozenset()
        self.holders: dict[str, int] = {}  # holder -> step of its latest round
        self._top = 0  # the highest step a holder reported
        self._top_since = 0.0  # when a holder first reported it
        self.floor = 0  # the lowest step a holder reported (last sent in a LeaseFloor)
        self.round_s = 0.0  # seconds between the last two rises of _top (0: not seen yet)
        self._sent: tuple[int, tuple[str, ...], int, int] | None = None
        self._joiners_below = 0  # the rounds a recall for joiners left on the lease (0: none sent)
        self.waiting: dict[str, int] = {}  # holder -> the floor it waits for (``want``)

    def grant(self, lease_id: int, quorum: Quorum, now: float) -> None:
        """Lease ``quorum`` to all its members (replacing any older lease)."""
        self.lease_id = lease_id
        self.quorum_id = quorum.quorum_id
        self.members = frozenset(m.replica_id for m in quorum.participants)
        self.holders = {m.replica_id: m.step for m in quorum.participants}
        self._top = max(self.holders.values(), default=0)
        self._top_since = now
        self.floor = min(self.holders.values(), default=0)
        self.round_s = 0.0
        self._sent = None
        self._joiners_below = 0
        self.waiting = {}

    def clear(self) -> None:
        self.lease_id = 0
        self.holders = {}
        self.members = frozenset()
        self.waiting = {}

    def want(self, replica_id: str, step: int) -> LeaseFloor | None:
        """Holder ``replica_id`` waits until the floor reaches ``step``: the floor to
        send it now if it is there already, else None (it gets the floor with the
        rise that reaches it, ``waiters``)."""
        if replica_id not in self.holders:
            return None
        if self.floor >= step:
            self.waiting.pop(replica_id, None)
            return LeaseFloor("", self.lease_id, self.floor)
        self.waiting[replica_id] = step
        return None

    def waiters(self, floor: int) -> list[str]:
        """The holders waiting for a floor that ``floor`` reaches; no longer waiting."""
        done = [rid for rid, step in self.waiting.items() if step <= floor]
        for rid in done:
            del self.waiting[rid]
        return done

    def asked(self, replica_id: str) -> None:
        """``replica_id`` asked for a quorum: it no longer runs on the lease."""
        self.holders.pop(replica_id, None)
        self.waiting.pop(replica_id, None)

    def progress(self, replica_id: str, step: int, now: float) -> LeaseFloor | None:
        """A holder's liveness ping reports its latest round at ``step``; the floor
        to send the holders if it rose. O(holders) only when the slowest reports."""
        old = self.holders.get(replica_id)
        if old is None or step <= old:
            return None
        self.holders[replica_id] = step
        if step > self._top:
            if step == self._top + 1 and now > self._top_since:
                self.round_s = now - self._top_since
            self._top, self._top_since = step, now
        if old == self.floor:  # it may have been the slowest
            return self._raise_floor()
        return None

    def forgive_silence(self, now: float) -> None:
        """The lighthouse did not run for a while: how long a holder has seemed
        behind counts from ``now``, not from before the pause."""
        if self.holders:
            self._top_since = now

    def floor_event(self, epoch: str) -> LeaseFloor:
        return LeaseFloor(epoch, self.lease_id, self.floor)

    def _raise_floor(self) -> LeaseFloor | None:
        floor = min(self.holders.values(), default=self.floor)
        if floor <= self.floor:
            return None
        self.floor = floor
        return LeaseFloor("", self.lease_id, floor)

    def recall_for_ask(self, epoch: str, waiting: list[QuorumMember]) -> LeaseRecall | None:
        """The recall due now that someone asked; ``waiting`` are the pending requests.
        None if there is no holder left or the holders were already told the same."""
        if not self.holders:
            return None
        absent = sorted((m.step, m.replica_id) for m in waiting if m.replica_id in self.members)
        if not absent:
            # Only joiners: nobody's collectives are stranded, but a holder may
            # already be one round ahead of the others (or have started it
            # unseen, its ping in flight): had the others asked at that round,
            # it would wait for them in its collectives and fail the round. So
            # the holders finish every round up to the highest one any may have
            # begun on the lease, and all ask at the round after it.
            # Fixed once per lease: a later ask sends nothing new.
            if self._joiners_below == 0:
                self._joiners_below = self._top + 2
            return self._once(epoch, (), -1, valid_below=self._joiners_below)
        return self._once(epoch, tuple(sorted(rid for _, rid in absent)), absent[0][0])

    def recall_for_stall(self, epoch: str, now: float, join_timeout_s: float) -> LeaseRecall | None:
        """A recall if a holder has been behind another for ``join_timeout_s`` seconds
        and ``STALL_ROUNDS`` rounds' length (``round_s``), whichever is longer."""
        patience_s = max(join_timeout_s, STALL_ROUNDS * self.round_s)
        if not self.holders or now - self._top_since < patience_s:
            return None
        behind = tuple(sorted(rid for rid, step in self.holders.items() if step < self._top))
        if not behind:
            return None
        return self._once(epoch, behind, self._top)

    def recall_for_leave(
        self, epoch: str, replica_id: str, committed_through: int
    ) -> tuple[LeaseRecall | None, LeaseFloor | None]:
        """``replica_id`` left cleanly while holding the lease, having committed every
        round below ``committed_through`` (-1: unknown, use its last round's step;
        never above that step + 1, whatever the ping claims): the others keep the lease for rounds below that step, fail any leased round
        at or above it (the leaver runs no collectives there) and ask for later
        rounds. Also the floor, if the leaver was the slowest."""
        step = self.holders.pop(replica_id, None)
        self.waiting.pop(replica_id, None)
        if step is None or not self.holders:
            return None, None
        if committed_through < 0:
            return self._once(epoch, (replica_id,), step), self._raise_floor()
        # It committed at most the round it last reported: a higher claim would let
        # the others run leased rounds it never joins.
        committed_through = min(committed_through, step + 1)
        recall = self._once(epoch, (replica_id,), committed_through, committed_through)
        return recall, self._raise_floor()

    def recall_all(self, epoch: str) -> LeaseRecall | None:
        """For every holder: ask the lighthouse from the next round on, failing no
        leased round (a member was quarantined as a straggler; it finishes its
        round with the others)."""
        if not self.holders:
            return None
        return self._once(epoch, (), -1)

    def recall_excluded(self, epoch: str) -> LeaseRecall | None:
        """For holders left out of a new quorum: fail any leased step (their peers left)."""
        if not self.holders:
            return None
        return LeaseRecall(epoch, self.lease_id, self.quorum_id, (), 0)

    def _once(
        self, epoch: str, absent: tuple[str, ...], abort_from: int, valid_below: int = 0
    ) -> LeaseRecall | None:
        key = (self.lease_id, absent, abort_from, valid_below)
        if key == self._sent:
            return None
        self._sent = key
        return LeaseRecall(epoch, self.lease_id, self.quorum_id, absent, abort_from, valid_below)

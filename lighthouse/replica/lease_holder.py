"""A manager server's side of a quorum lease (the lighthouse's side is
``lighthouse.coordinator.lease``): when a round may be answered from it, when
it is void, and which leased step a recall strands.

No I/O: the manager server passes in the liveness stream's state (its
generation while open, None while broken) and relays what comes back.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field, replace
from datetime import timedelta

from lighthouse.replica.ranks import compute_quorum_result
from lighthouse.types import (
    CollectivesDone,
    FailureNotice,
    LeaseFloor,
    LeaseRecall,
    Quorum,
    QuorumResult,
    copy_with,
)


@dataclass
class _Lease:
    epoch: str
    lease_id: int
    quorum: Quorum  # every participant at one step, so no leased round heals
    next_step: int  # the step the next leased round must be at
    generation: int  # the liveness stream's generation when granted
    floor: int  # every holder started its round at this step or later
    valid_below: int | None = None  # a member left: rounds at or above it must ask
    stream_broken: bool = False  # the lighthouse is away: no floor will come from it
    results: dict[tuple[int, bool], QuorumResult] = field(default_factory=dict)


@dataclass(frozen=True)
class LeasedRound:
    """What a round answered from a lease resolves to (instead of a ``Quorum``)."""

    lease: _Lease
    step: int


class LeaseHolder:
    """The lease this replica holds, if any; used on the server's loop only
    (``lease_id`` and ``wait`` from any thread)."""

    def __init__(self) -> None:
        self._lease: _Lease | None = None
        self._changed = threading.Condition()
        self._recalled = ("", 0)  # (lighthouse epoch, highest lease id recalled in it)
        self.leased_round: LeasedRound | None = None  # the latest round, if leased
        self.rounds = 0  # rounds answered from a lease
        self.aligned_waits = 0  # leased rounds that waited for the slowest holder
        self._floor_waiters: list[asyncio.Future[None]] = []  # on the server's loop

    def _set(self, lease: _Lease | None) -> None:
        if lease is self._lease:
            return
        self._lease = lease
        self._wake()
        with self._changed:
            self._changed.notify_all()

    def _wake(self) -> None:
        waiters, self._floor_waiters = self._floor_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    @property
    def lease_id(self) -> int:
        lease = self._lease
        return 0 if lease is None else lease.lease_id

    def wait(self, held: bool, timeout: timedelta) -> bool:
        """Wait until a lease is (``held``) or is not held; False after ``timeout``."""
        with self._changed:
            return self._changed.wait_for(
                lambda: (self._lease is not None) == held, timeout=timeout.total_seconds()
            )

    def wait_recalled(self, timeout: timedelta) -> bool:
        """Wait until no lease is held or the one held was recalled from a step on
        (it answers only the rounds below that step); False after ``timeout``."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._lease is None or self._lease.valid_below is not None,
                timeout=timeout.total_seconds(),
            )

    def take(
        self,
        quorum: Quorum,
        lease_id: int,
        asked_generation: int | None,
        generation: int | None,
        stream_epoch: str,
    ) -> None:
        """The lighthouse answered with ``quorum`` and ``lease_id`` (0: none). Taken only
        if the liveness stream (``generation``, None while broken) stayed open to that
        lighthouse since the ask and no recall for it overtook the answer."""
        recalled = self._recalled[0] == quorum.epoch and self._recalled[1] >= lease_id
        if (
            lease_id <= 0
            or recalled
            or generation is None
            or generation != asked_generation
            or stream_epoch != quorum.epoch
        ):
            return
        next_step = max(m.step for m in quorum.participants) + 1
        at_next = tuple(replace(m, step=next_step) for m in quorum.participants)
        self._set(
            _Lease(
                quorum.epoch,
                lease_id,
                replace(quorum, participants=at_next),
                next_step,
                generation,
                floor=next_step - 1,
            )
        )

    def must_wait(self, step: int, eligible: bool, generation: int | None) -> bool:
        """True if a round at ``step`` would be answered from the lease but the
        slowest holder has not started step - 1 yet (see ``wait_floor``)."""
        lease = self._lease
        return (
            lease is not None
            and eligible
            and step == lease.next_step
            and generation == lease.generation  # broken (None): no floor will come
            and (lease.valid_below is None or step < lease.valid_below)
            and lease.floor < step - 1
        )

    async def wait_floor(self, step: int, timeout_s: float) -> None:
        """Wait (on the server's loop) until the floor reaches ``step - 1``, the lease
        changes or ``timeout_s`` seconds pass; the caller then calls ``answer``."""
        self.aligned_waits += 1
        lease = self._lease
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (
            lease is self._lease
            and lease is not None
            and not lease.stream_broken
            and lease.floor < step - 1
        ):
            left = deadline - loop.time()
            if left <= 0:
                return
            w: asyncio.Future[None] = loop.create_future()
            self._floor_waiters.append(w)
            try:
                await asyncio.wait_for(w, left)
            except asyncio.TimeoutError:
                return

    def on_floor(self, floor: LeaseFloor) -> None:
        """Every holder of ``floor``'s lease started step ``floor.step`` (on the loop)."""
        lease = self._lease
        if lease is None or (lease.epoch, lease.lease_id) != (floor.epoch, floor.lease_id):
            return
        if floor.step > lease.floor:
            lease.floor = floor.step
            self._wake()

    def proven(self, done: CollectivesDone) -> None:
        """A rank of this group completed a cross-replica collective at ``done.step``
        of ``done``'s quorum: if that is the lease's quorum, every holder had begun
        that step, so the floor is at least that step (on the loop). This keeps a
        lease running while the lighthouse cannot send the floor (hung, or away)."""
        lease = self._lease
        if lease is None or (lease.epoch, lease.quorum.quorum_id) != (done.epoch, done.quorum_id):
            return
        if done.step > lease.floor:
            lease.floor = done.step
            self._wake()

    def answer(self, step: int, eligible: bool, generation: int | None) -> LeasedRound | None:
        """The leased answer for a round at ``step``, or None (and the lease is void):
        the round must follow the last leased one, be ``eligible`` (no shrink_only, no
        commit failures), the stream must be the one the lease was granted on or
        broken (None), and every holder must have begun step - 1 (the floor, from
        the lighthouse or the group's own collectives, ``proven``).

        While the stream is broken the lighthouse is away (down, restarting, or
        cut off from us): the lease keeps answering rounds whose floor the
        group's own collectives prove, so a job whose membership does not change
        commits on through the outage. That is safe because the holders' steps
        are collectives among exactly the lease's members: a holder that left
        the lease (told so by a lighthouse we cannot hear) runs none, and our
        collective of that step then fails instead of committing."""
        lease = self._lease
        if (
            lease is None
            or not eligible
            or step != lease.next_step
            # the stream it was granted on, or none (broken: the lighthouse is away)
            or generation not in (lease.generation, None)
            or (lease.valid_below is not None and step >= lease.valid_below)
            or lease.floor < step - 1  # the slowest holder did not catch up in time
        ):
            self.drop()
            return None
        lease.next_step += 1
        self.rounds += 1
        self.leased_round = LeasedRound(lease, step)
        return self.leased_round

    def drop(self) -> None:
        self._set(None)
        self.leased_round = None

    def on_stream_broken(self) -> None:
        """The liveness stream broke (on the loop): no floor comes from the lighthouse
        any more, so a leased round waiting for it stops waiting, and goes on if the
        group's own collectives prove the floor (``answer``), else asks the
        lighthouse. The lease stays until the stream reopens (``on_stream_reopened``),
        which voids it."""
        if self._lease is not None:
            self._lease.stream_broken = True
        self._wake()

    def on_stream_reopened(self, replica_id: str, resolved_step: int) -> FailureNotice | None:
        """The liveness stream opened again (on the loop); the lease is void. Returns the
        step-scoped notice that fails the leased step still in progress (its vote not
        decided: ``resolved_step`` is the latest decided), if any.

        While the stream was broken the lighthouse could not reach us: it may have
        recalled the lease (it saw our stream close), or it restarted and knows no
        lease at all. Either way a peer may have left the leased step to ask for a
        quorum, and nobody can tell us any more, so the step's collectives would
        wait for it until they time out (while the lighthouse, seeing us live but
        not asking, waits its join timeout for us). A step that did finish
        meanwhile is decided and left alone.
        """
        leased = self.leased_round
        self.drop()
        if leased is None or leased.step <= resolved_step:
            return None
        lease = leased.lease
        peers = tuple(m.replica_id for m in lease.quorum.participants if m.replica_id != replica_id)
        if not peers:
            return None  # alone in the quorum: nobody to wait for
        return FailureNotice(
            lease.epoch,
            lease.quorum.quorum_id,
            peers,
            f"the liveness stream to the lighthouse reopened: lease {lease.lease_id} is void and "
            f"the peers may have left step {leased.step}",
            step=leased.step,
        )

    def on_recall(self, recall: LeaseRecall, resolved_step: int) -> FailureNotice | None:
        """Void the recalled lease; the step-scoped notice to relay if the leased step
        in progress (its vote not decided: ``resolved_step`` is the latest decided) is stranded."""
        lease = self._lease
        ours = lease is not None and (lease.epoch, lease.lease_id) == (
            recall.epoch,
            recall.lease_id,
        )
        if recall.valid_below_step > 0 and ours:
            assert lease is not None
            # A member left cleanly: the lease still answers rounds below its step.
            below = recall.valid_below_step
            lease.valid_below = (
                below if lease.valid_below is None else min(below, lease.valid_below)
            )
            self._wake()
            with self._changed:
                self._changed.notify_all()
        else:
            if self._recalled[0] != recall.epoch or self._recalled[1] < recall.lease_id:
                self._recalled = (recall.epoch, recall.lease_id)
            if ours:
                self._set(None)
        leased = self.leased_round
        if (
            recall.abort_from_step < 0
            or leased is None
            or (leased.lease.epoch, leased.lease.lease_id) != (recall.epoch, recall.lease_id)
            or leased.step < recall.abort_from_step
            or leased.step <= resolved_step
        ):
            return None
        absent = list(recall.absent_replica_ids)
        return FailureNotice(
            recall.epoch,
            recall.quorum_id,
            recall.absent_replica_ids,
            f"lease {recall.lease_id} recalled: {absent} run no collectives at step {leased.step}",
            step=leased.step,
        )


def leased_result(
    answer: LeasedRound, replica_id: str, group_rank: int, init_sync: bool
) -> QuorumResult:
    """Group rank ``group_rank``'s result for a leased round (computed once per lease)."""
    cache = answer.lease.results
    key = (group_rank, init_sync)
    base = cache.get(key)
    if base is None:
        base = cache[key] = compute_quorum_result(
            answer.lease.quorum, replica_id, group_rank, init_sync
        )
    return copy_with(base, max_step=answer.step)

"""``GroupRounds``: the manager server gathers its group's ranks into one lighthouse call.

The replica group's side of each quorum round and commit vote, the state both
transports share. (Not to be confused with ``torchft_pg.manager.quorum_round``'s
``QuorumRound``: one rank's round in its Manager, whose request arrives here.)

Every rank of the replica group sends one quorum request per step; the round
waits for all ``world_size`` of them, checks they report the same step, and
answers from the quorum lease if it still holds, else makes ONE lighthouse
call for the whole group. If that call fails every waiting rank hears it at
once. A commit vote is the AND of the ranks' votes for one step; stale votes
are refused.

No transport: the gRPC handlers (``lighthouse.replica.server``) and the
in-process client (``lighthouse.replica.local``) both enter rounds and votes
here. Everything runs on the server's event loop, so nothing needs a lock;
only ``checkpoint_metadata`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from lighthouse import validate
from lighthouse.errors import FaultToleranceError, QuorumRejectedError
from lighthouse.replica.lease_holder import LeasedRound, LeaseHolder, leased_result
from lighthouse.replica.link import LighthouseLink
from lighthouse.replica.ranks import compute_quorum_result
from lighthouse.replica.reachability import unreachable
from lighthouse.replica.silence import silent_too_long
from lighthouse.types import (
    HealReport,
    IntegrityKind,
    IntegrityReport,
    ManagerQuorumRequest,
    Quorum,
    QuorumMember,
    QuorumResult,
)

__all__ = ["Gather", "GroupRounds", "Vote", "group_heal", "group_integrity", "vote_margin_s"]

log = logging.getLogger("lighthouse.manager")


def vote_margin_s(remaining_s: float) -> float:
    """How long before a remote caller's deadline (``remaining_s`` seconds away) its
    vote is closed, so that the answer still reaches it: a tenth, at most 0.5 s."""
    return min(0.5, 0.1 * remaining_s)


def group_heal(reqs: list[ManagerQuorumRequest]) -> HealReport | None:
    """The group's heal from its ranks' reports (None if no rank reports one): each
    rank receives its own part of the state, so the bytes add up, and the group's
    heal lasts as long as its slowest rank's (seconds); the step is the highest."""
    heals = [r.heal for r in reqs if r.heal is not None]
    if not heals:
        return None
    return HealReport(
        step=max(h.step for h in heals),
        bytes_received=min(sum(h.bytes_received for h in heals), validate.MAX_COUNTER),
        transfer_s=max(h.transfer_s for h in heals),
    )


# Which finding a group reports when its ranks found different ones at one step:
# its own corruption first (the one the lighthouse counts toward quarantine),
# then its own corrupt reduction.
_INTEGRITY_ORDER = (
    IntegrityKind.DIVERGED,
    IntegrityKind.GRADIENT_DIVERGED,
    IntegrityKind.HEAL_SOURCE_DIVERGED,
    IntegrityKind.NO_MAJORITY,
)


def group_integrity(reqs: list[ManagerQuorumRequest]) -> IntegrityReport | None:
    """The group's integrity finding from its ranks' reports (None if no rank reports
    one). Each rank checks its own shard, so ranks may report different kinds and
    tensors: the group reports the latest step's, its own divergence before its
    averaged gradient's before its heal source's before no majority, with the tensors its ranks named for that
    kind (in group-rank order, each once, at most ``MAX_INTEGRITY_TENSORS``)."""
    reports = [
        r.integrity for r in sorted(reqs, key=lambda q: q.group_rank) if r.integrity is not None
    ]
    if not reports:
        return None
    step = max(r.step for r in reports)
    latest = [r for r in reports if r.step == step]
    kind = min((r.kind for r in latest), key=_INTEGRITY_ORDER.index)
    names = dict.fromkeys(n for r in latest if r.kind is kind for n in r.tensors)
    return IntegrityReport(
        step=step, kind=kind, tensors=tuple(names)[: validate.MAX_INTEGRITY_TENSORS]
    )


@dataclass
class Gather:
    """One quorum round being gathered from the local ranks."""

    requests: dict[int, ManagerQuorumRequest] = field(default_factory=dict)
    deadlines: dict[int, float] = field(default_factory=dict)  # loop time, seconds
    future: asyncio.Future[Quorum | LeasedRound] | None = None
    launched: bool = False
    task: asyncio.Task[None] | None = None  # the lighthouse call, kept referenced


@dataclass
class Vote:
    """One commit vote being gathered: ``step``, the quorum round it belongs to
    (``round``: how many rounds had launched when it opened) and each group rank's
    vote so far."""

    step: int
    round: int = 0
    votes: dict[int, bool] = field(default_factory=dict)
    future: asyncio.Future[bool] | None = None


class GroupRounds:
    """Rounds and votes of replica group ``replica_id`` (``world_size`` ranks): each
    round gathers the group's ranks' requests into one lighthouse call (or one
    answer from the lease), each vote their votes into one decision.

    ``address`` gives the manager server's advertised ``host:port`` (sent to the
    lighthouse so healing peers can reach it); ``link`` asks the lighthouse;
    ``lease`` is the quorum lease this replica holds.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        world_size: int,
        store_addr: str,
        address: Callable[[], str],
        link: LighthouseLink,
        lease: LeaseHolder,
    ) -> None:
        self.replica_id = replica_id
        self.world_size = world_size
        self._store_addr = store_addr
        self._address = address
        self._link = link
        self._lease = lease
        self._gather = Gather()
        self._vote: Vote | None = None
        # (loop time, stream generation, lighthouse epoch) when the latest round began.
        self._round_mark: tuple[float, int | None, str] | None = None
        self._last_quorum_step = -1
        self._launched = 0  # quorum rounds launched so far
        # (step, round) of the latest vote decided "no" because a rank's wait ran
        # out: a late vote for it must not open a second vote for the same attempt.
        self._expired: tuple[int, int] | None = None
        self.resolved_step = -1  # the latest step whose commit vote is decided
        self._metadata: dict[int, str] = {}
        # The other members of the latest lighthouse quorum: replica id -> manager
        # server address (probed after a failed step, see `reachability`).
        self._peers: dict[str, str] = {}

    # -- quorum --------------------------------------------------------------------------
    def check_request(self, req: ManagerQuorumRequest) -> int:
        """Validate one rank's quorum request; return its group rank (ValueError if bad)."""
        validate.check_manager_quorum_request(req)
        return self.check_bounds(req)

    def check_bounds(self, req: ManagerQuorumRequest) -> int:
        """What ``check_request`` adds to ``validate.check_manager_quorum_request``
        (for a request already through it): the group rank against this group's
        world size and the metadata's size. Returns the group rank."""
        rank = validate.check_group_rank(req.group_rank, self.world_size)
        if len(req.checkpoint_metadata) > validate.MAX_METADATA_BYTES:
            raise ValueError(
                f"checkpoint_metadata must be at most {validate.MAX_METADATA_BYTES} bytes"
            )
        return rank

    @property
    def launched(self) -> int:
        """Quorum rounds launched so far (each is one request to the lighthouse)."""
        return self._launched

    def enter_gather(
        self, rank: int, req: ManagerQuorumRequest
    ) -> tuple[Gather, asyncio.Future[Quorum | LeasedRound]]:
        """Add ``rank``'s request to this round; the last rank to arrive launches the
        single lighthouse call. Returns the round and the future of its quorum."""
        loop = asyncio.get_running_loop()
        self._metadata[rank] = req.checkpoint_metadata
        g = self._gather
        if g.future is None:
            g.future = loop.create_future()
        g.requests[rank] = req
        g.deadlines[rank] = loop.time() + req.timeout.total_seconds()
        fut = g.future
        if len(g.requests) == self.world_size:
            self._gather = Gather()
            g.launched = True
            self._launched += 1
            steps = {r: q.step for r, q in sorted(g.requests.items())}
            if len(set(steps.values())) > 1:
                fut.set_exception(
                    QuorumRejectedError(
                        f"local ranks of replica {self.replica_id!r} reported different steps "
                        f"(group rank: step) {steps}; all ranks of a replica group must agree"
                    )
                )
            else:
                self._start_round(g, fut)
        return g, fut

    @staticmethod
    def leave_gather(g: Gather, rank: int, req: ManagerQuorumRequest) -> None:
        """``rank`` gave up (deadline, cancelled) before its round was launched."""
        if not g.launched and g.requests.get(rank) is req:
            del g.requests[rank]
            g.deadlines.pop(rank, None)

    def result_for(self, answer: Quorum | LeasedRound, rank: int, init_sync: bool) -> QuorumResult:
        """Group rank ``rank``'s result from a lighthouse quorum or a leased round."""
        if isinstance(answer, Quorum):
            return compute_quorum_result(answer, self.replica_id, rank, init_sync)
        return leased_result(answer, self.replica_id, rank, init_sync)

    def _start_round(self, g: Gather, fut: asyncio.Future[Quorum | LeasedRound]) -> None:
        """Answer the gathered round from the lease if it still holds, else ask the lighthouse."""
        reqs = list(g.requests.values())
        step = reqs[0].step
        self._last_quorum_step = step
        # the group is as slow as its slowest rank: the largest step and busy times
        self._link.progress = (
            step,
            max(r.step_time_ms for r in reqs),
            max(r.busy_ms for r in reqs),
        )
        heal = group_heal(reqs)
        if heal is not None:  # the ping below reaches the lighthouse even on a leased round
            self._link.heal = heal
        # An integrity finding goes to the lighthouse, never answered from the lease
        # (its step failed, so it would not be anyway: this only makes sure).
        eligible = not any(
            r.shrink_only or r.commit_failures or r.integrity is not None for r in reqs
        )
        for r in reqs:  # what the group's own collectives proved of the slowest holder
            if r.collectives_done is not None:
                self._lease.proven(r.collectives_done)
        generation = self._link.open_generation
        loop = asyncio.get_running_loop()
        self._round_mark = (loop.time(), generation, self._link.lighthouse_epoch)
        wait = self._lease.must_wait(step, eligible, generation)
        # A leased round that must wait asks the lighthouse for the floor with its
        # report; otherwise the lighthouse sends it none.
        self._link.floor_wanted = step - 1 if wait else 0
        if self._lease.lease_id > 0 or heal is not None:
            # Lease holders report each round they start (the lighthouse's view of
            # their steps: the floor, stalls, recalls). Without a lease the round asks
            # the lighthouse, and the request carries its step: a ping too would only
            # double the lighthouse's work per round.
            self._link.ping_soon()
        if wait:
            g.task = loop.create_task(self._aligned_leased_round(g, fut, step, eligible))
            return
        leased = self._lease.answer(step, eligible, generation)
        if leased is not None:
            fut.set_result(leased)
            return
        g.task = loop.create_task(self._lighthouse_quorum(g, fut, step))

    async def _aligned_leased_round(
        self, g: Gather, fut: asyncio.Future[Quorum | LeasedRound], step: int, eligible: bool
    ) -> None:
        """A leased round that must first let the slowest holder catch up (to step - 1).

        Bounded by the round's deadline; a recall or a stall recall ends the wait
        early, and the round then asks the lighthouse like any unleased round.
        """
        left = min(g.deadlines.values()) - asyncio.get_running_loop().time()
        try:
            await self._lease.wait_floor(step, max(0.0, left))
        finally:
            self._link.floor_wanted = 0
        leased = self._lease.answer(step, eligible, self._link.open_generation)
        if leased is not None:
            if not fut.done():
                fut.set_result(leased)
            return
        await self._lighthouse_quorum(g, fut, step)

    async def _lighthouse_quorum(
        self, g: Gather, fut: asyncio.Future[Quorum | LeasedRound], step: int
    ) -> None:
        reqs = list(g.requests.values())
        failures = max(r.commit_failures for r in reqs)
        cut = await unreachable(self._peers) if failures and self._peers else ()
        if cut:
            log.warning(
                "%s: step %d failed and the manager servers of %s do not accept connections; "
                "reporting them unreachable",
                self.replica_id,
                step,
                list(cut),
            )
        member = QuorumMember(
            replica_id=self.replica_id,
            address=self._address(),
            store_address=self._store_addr,
            step=step,
            world_size=self.world_size,
            shrink_only=any(r.shrink_only for r in reqs),
            commit_failures=failures,
            step_time_ms=max(float(r.step_time_ms) for r in reqs),
            busy_ms=max(float(r.busy_ms) for r in reqs),
            checkpoint_metadata=tuple(
                g.requests[r].checkpoint_metadata for r in range(self.world_size)
            ),
            unreachable=cut,
            heal=group_heal(reqs),
            integrity=group_integrity(reqs),
        )
        asked_generation = self._link.open_generation
        try:
            quorum, lease_id = await self._link.quorum(member, min(g.deadlines.values()))
        except FaultToleranceError as exc:
            fut.set_exception(exc)
            return
        self._peers = {
            m.replica_id: m.address for m in quorum.participants if m.replica_id != self.replica_id
        }
        self._lease.take(
            quorum,
            lease_id,
            asked_generation,
            self._link.open_generation,
            self._link.lighthouse_epoch,
        )
        fut.set_result(quorum)

    # -- commit vote, metadata -------------------------------------------------------------
    def enter_vote(self, rank: int, step: int, vote: bool) -> tuple[Vote, asyncio.Future[bool]]:
        """Record ``rank``'s vote for ``step``; the last rank's vote decides.

        ValueError for a bad rank or a stale vote; a vote for a later step
        abandons the open one (its waiters get ``QuorumRejectedError``).
        """
        validate.check_group_rank(rank, self.world_size)
        validate.check_step("step", step)
        if step < self._last_quorum_step:
            raise ValueError(
                f"stale vote: group rank {rank} voted for step {step} but replica "
                f"{self.replica_id!r} last joined a quorum at step {self._last_quorum_step}"
            )
        if 0 <= self._last_quorum_step < step:
            # Every rank votes on the step it asked a quorum for: a vote ahead of it
            # would abandon the open vote and then never be decided.
            raise ValueError(
                f"vote ahead: group rank {rank} voted for step {step} but replica "
                f"{self.replica_id!r} last joined a quorum at step {self._last_quorum_step}"
            )
        if self._expired == (step, self._launched):
            raise ValueError(
                f"late vote: group rank {rank} voted for step {step} after that vote was "
                "decided no (another rank stopped waiting for it); the step is retried with "
                "a new quorum"
            )
        v = self._vote
        if v is not None and step < v.step:
            raise ValueError(
                f"stale vote: group rank {rank} voted for step {step} while the open vote is "
                f"for step {v.step}"
            )
        if v is not None and step > v.step:
            assert v.future is not None
            v.future.set_exception(
                QuorumRejectedError(
                    f"the vote for step {v.step} was abandoned: group rank {rank} moved on to step "
                    f"{step} before ranks {sorted(set(range(self.world_size)) - set(v.votes))} voted"
                )
            )
            v = None
        if v is None:
            v = self._vote = Vote(
                step, self._launched, future=asyncio.get_running_loop().create_future()
            )
        assert v.future is not None
        v.votes[rank] = vote
        fut = v.future
        if len(v.votes) == self.world_size:
            self._vote = None
            self.resolved_step = max(self.resolved_step, step)
            no = sorted(r for r, ok in v.votes.items() if not ok)
            presumed_dead = None if no else self._presumed_dead()
            if presumed_dead is not None:
                log.warning("%s: step %d not committed: %s", self.replica_id, step, presumed_dead)
            elif not no:  # told to the lighthouse when leaving: peers may finish below it
                self._link.committed_through = max(self._link.committed_through, step + 1)
            if no:
                log.info(
                    "%s: step %d not committed; group ranks %s voted no", self.replica_id, step, no
                )
            fut.set_result(not no and presumed_dead is None)
        return v, fut

    def _presumed_dead(self) -> str | None:
        """Why the lighthouse may have declared this replica dead since the round began.

        Then the survivors abandoned the step (they were told), and what this
        replica's collectives returned may mix in their abandoned operations:
        it must not commit. None when nothing suggests so.
        """
        if self._round_mark is None:
            return None
        start, generation, epoch = self._round_mark
        link = self._link
        silence = link.silences.longest_since(start, asyncio.get_running_loop().time())
        if silent_too_long(silence, link.heartbeat_timeout_s):  # may have been declared dead
            return (
                f"silent to the lighthouse for {silence:.2f} s during the step (it declares a "
                f"replica dead after {link.heartbeat_timeout_s:g} s of silence)"
            )
        now_generation = link.open_generation
        if (
            generation is not None
            and now_generation is not None
            and now_generation != generation
            and link.lighthouse_epoch == epoch
        ):
            return (
                "the liveness stream to the lighthouse closed and reopened during the step "
                "(the lighthouse declares a replica whose stream closes dead)"
            )
        return None

    def leave_vote(self, v: Vote, rank: int) -> None:
        """``rank``'s caller went away (cancelled) before the vote was decided."""
        if self._vote is v:
            v.votes.pop(rank, None)

    def expire_vote(self, v: Vote, rank: int) -> bool:
        """``rank``'s wait for ``v`` ran out: its decision, deciding "no" for every
        rank if it is still open.

        A rank that simply stopped waiting would leave the others undecided, or,
        worse, decided yes while it gave up (a split group). So the vote is
        closed here, on the server's loop, before the caller's own deadline: every
        rank hears the same "no", and a vote still to come for this attempt is
        refused as late (``enter_vote``). Raises what the vote raised, if it failed.
        """
        fut = v.future
        assert fut is not None
        if fut.done():
            return fut.result()
        if self._vote is v:
            self._vote = None
        self._expired = (v.step, v.round)
        self.resolved_step = max(self.resolved_step, v.step)
        missing = sorted(set(range(self.world_size)) - set(v.votes))
        log.warning(
            "%s: step %d not committed: group rank %d stopped waiting for the votes of "
            "group ranks %s",
            self.replica_id,
            v.step,
            rank,
            missing,
        )
        fut.set_result(False)
        return False

    def checkpoint_metadata(self, rank: int) -> str:
        """What group rank ``rank`` sent with its last quorum; any thread.
        ``QuorumRejectedError`` if it sent none."""
        try:
            return self._metadata[rank]
        except KeyError:
            raise QuorumRejectedError(
                f"CheckpointMetadata: no metadata for group rank {rank} on replica "
                f"{self.replica_id!r} (ranks with metadata: {sorted(self._metadata)})"
            ) from None

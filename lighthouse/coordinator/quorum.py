"""The quorum rules: a mutable ``QuorumState`` and the pure ``decide_quorum``.

Rules (1-4 are torchft's, so a mixed job decides alike; 5 is ours):

1. **Fast quorum**: once every member of the previous quorum has asked again,
   issue at once, admitting joiners that already asked (``shrink_only`` keeps
   them out).
2. Otherwise at least ``min_replicas`` askers,
3. a strict majority of all live replicas (split-brain guard),
4. and wait up to ``join_timeout_s`` (from the earliest pending ask) for live
   replicas that have not asked yet; then issue.
5. On every path: never issue a quorum whose highest step is
   below the last step a live replica outside it reported. Such a quorum
   would commit steps again from an older state, and those commits would be
   overwritten when the replica that is ahead heals everyone (a split history:
   e.g. restarted replicas at step 0 outvoting the one holding steps 0..85
   while it is briefly stalled). Wait for it instead; if it dies, it stops
   being live and the quorum proceeds.
6. Never issue a quorum whose highest step is below the job's committed step
   (the highest step any replica ever reported: a replica asks, or reports
   progress, only at a committed step), unless ``allow_step_reset``. Rule 5
   guards against a live replica that is ahead; this rule guards against the
   case where every up-to-date replica is gone, which would otherwise restart
   the job silently from older (e.g. initial) weights. Replicas that load a
   checkpoint at or past the committed step ask at that step and pass.

The quorum id changes only when the membership changes or a member reports
commit failures. Unlike torchft's lighthouse: a cancelled request is withdrawn (it can
never be put into a quorum nobody receives), a replica whose liveness stream
closes is forgotten at once, long-silent replicas are pruned, and every
operation is O(1) except issuing (O(N log N) to sort the members) and the
cheap expiry scan (O(number of expired entries)).

Liveness: a replica is live while its last sign of life (request, heartbeat,
liveness ping) is younger than ``heartbeat_timeout_s``, or while it has a
pending request (an open request is proof of life; a dead process's request
is cancelled and withdrawn by the server).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from lighthouse.types import Quorum, QuorumMember

DEFAULT_MIN_REPLICAS = 1
DEFAULT_JOIN_TIMEOUT_MS = 10_000
DEFAULT_QUORUM_TICK_MS = 100
DEFAULT_HEARTBEAT_TIMEOUT_MS = 5_000


@dataclass(frozen=True)
class QuorumConfig:
    """Quorum parameters. Times are in seconds (the clock's unit).

    ``lease``: grant quorum leases (see ``lighthouse.coordinator.lease``), so that members
    skip the lighthouse on steps where nothing changes.
    ``allow_step_reset``: let a quorum start below the job's committed step (rule 6);
    the operator's explicit choice to restart a job from older state.
    """

    min_replicas: int = DEFAULT_MIN_REPLICAS
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_MS / 1000
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_MS / 1000
    lease: bool = True
    allow_step_reset: bool = False

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise ValueError(f"min_replicas must be >= 1, got {self.min_replicas}")
        if self.join_timeout_s < 0:
            raise ValueError(f"join_timeout_s must be >= 0, got {self.join_timeout_s}")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s}")


@dataclass(frozen=True)
class Decision:
    """``members`` (sorted by replica id) when a quorum should be issued, else None.

    ``kind`` is a stable tag (``fast``, ``ready``, ``idle``, ``min_replicas``,
    ``split_brain``, ``join_timeout``, ``shrink_empty``, ``behind``, ``below_committed``);
    ``reason`` says why in words.
    """

    members: tuple[QuorumMember, ...] | None
    reason: str
    kind: str


@dataclass
class _Pending:
    member: QuorumMember
    joined: float


class QuorumState:
    """Everything the rules look at. Mutated only through its methods."""

    def __init__(self, epoch: str, committed_step: int = 0) -> None:
        """``epoch``: the lighthouse's random start-up id, stamped on every quorum.
        ``committed_step``: the job's committed step as recorded before a restart."""
        self.epoch = epoch
        # The highest step any replica reported (rule 6); it only grows, except when
        # the operator allows a reset and a lower quorum issues.
        self.committed_step = committed_step
        # replica id -> last seen (s), oldest first
        self.seen: OrderedDict[str, float] = OrderedDict()
        self.pending: dict[str, _Pending] = {}  # insertion order == join order
        self.last_member: dict[str, QuorumMember] = {}  # latest request of each live replica
        self.prev: Quorum | None = None
        self.quorum_id = 0
        self._prev_ids: tuple[str, ...] = ()
        self._prev_set: frozenset[str] = frozenset()
        self.prev_pending = 0  # members of prev that are pending
        self.shrink_pending = 0  # pending requests with shrink_only

    # -- signs of life ---------------------------------------------------------------
    def heartbeat(self, replica_id: str, now: float) -> None:
        """Record that ``replica_id`` was seen at ``now`` (seconds)."""
        self.seen[replica_id] = now
        self.seen.move_to_end(replica_id)

    def request(self, member: QuorumMember, now: float) -> None:
        """``member`` asks for a quorum at ``now``; a repeated ask replaces the old one."""
        rid = member.replica_id
        self.withdraw(rid)
        self.heartbeat(rid, now)
        self.pending[rid] = _Pending(member, now)
        self.last_member[rid] = member
        if member.step > self.committed_step:
            self.committed_step = member.step
        if rid in self._prev_set:
            self.prev_pending += 1
        if member.shrink_only:
            self.shrink_pending += 1

    def report_progress(self, replica_id: str, step: int, step_time_ms: float) -> None:
        """A live replica running on a lease reached ``step``: rule 5 and the step
        report see it as if it had asked at that step."""
        m = self.last_member.get(replica_id)
        if m is not None and step > m.step:
            self.last_member[replica_id] = replace(m, step=step, step_time_ms=step_time_ms)
            if step > self.committed_step:
                self.committed_step = step

    def withdraw(self, replica_id: str) -> bool:
        """Drop ``replica_id``'s pending request (cancelled). True if there was one."""
        p = self.pending.pop(replica_id, None)
        if p is None:
            return False
        if replica_id in self._prev_set:
            self.prev_pending -= 1
        if p.member.shrink_only:
            self.shrink_pending -= 1
        return True

    def forget(self, replica_id: str) -> bool:
        """``replica_id`` is dead (its liveness stream closed): drop all its state.

        True if it was known.
        """
        had = self.withdraw(replica_id)
        self.last_member.pop(replica_id, None)
        return self.seen.pop(replica_id, None) is not None or had

    def expired(self, now: float, timeout_s: float) -> list[str]:
        """Replicas silent for ``timeout_s`` seconds with no pending request (read-only)."""
        out = []
        for rid, last in self.seen.items():
            if now - last < timeout_s:
                break
            if rid not in self.pending:
                out.append(rid)
        return out

    def prune(self, now: float, timeout_s: float) -> list[str]:
        """Forget replicas silent for ``timeout_s`` seconds; return their ids.

        Pending requesters stay (their open request is their liveness) and are
        re-stamped so the scan stays proportional to what expired.
        """
        dead = self.expired(now, timeout_s)
        for rid in dead:
            self.forget(rid)
        stale_pending = []
        for rid, last in self.seen.items():
            if now - last < timeout_s:
                break
            stale_pending.append(rid)
        for rid in stale_pending:
            self.heartbeat(rid, now)
        return dead

    def live_count(self, now: float, timeout_s: float) -> int:
        """Number of live replicas at ``now`` (pending requesters always count)."""
        return len(self.seen) - len(self.expired(now, timeout_s))

    # -- deciding ----------------------------------------------------------------------
    def earliest_joined(self) -> float:
        """When the oldest pending request arrived (seconds); requires one."""
        return next(iter(self.pending.values())).joined

    def candidates(self, shrink_only: bool) -> tuple[QuorumMember, ...]:
        """Pending members sorted by replica id; under shrink_only only previous members."""
        members = [p.member for p in self.pending.values()]
        if shrink_only and self.prev is not None:
            members = [m for m in members if m.replica_id in self._prev_set]
        members.sort(key=lambda m: m.replica_id)
        return tuple(members)

    def issue(self, members: tuple[QuorumMember, ...], now: float, created_unix_ms: int) -> Quorum:
        """Turn a decision into the next quorum and reset the pending set.

        Requesters left out (shrink_only) stay pending with a fresh join time.
        """
        ids = tuple(m.replica_id for m in members)
        if (
            self.prev is None
            or ids != self._prev_ids
            or any(m.commit_failures > 0 for m in members)
        ):
            self.quorum_id += 1
        quorum = Quorum(self.quorum_id, self.epoch, members, created_unix_ms)
        for rid in ids:
            del self.pending[rid]
        left = list(self.pending.values())
        self.pending = {p.member.replica_id: _Pending(p.member, now) for p in left}
        self.prev = quorum
        self.committed_step = max(
            (m.step for m in members), default=self.committed_step
        )  # == before, unless an allowed reset issued below it
        self._prev_ids = ids
        self._prev_set = frozenset(ids)
        self.prev_pending = 0
        self.shrink_pending = sum(1 for p in left if p.member.shrink_only)
        return quorum


def decide_quorum(now: float, state: QuorumState, config: QuorumConfig) -> Decision:
    """Decide whether to issue a quorum now (seconds), and why. Does not mutate ``state``.

    O(1) when not ready; O(N log N) to list the members when ready.
    """
    n = len(state.pending)
    if n == 0:
        return Decision(None, "idle: no replica is waiting for a quorum", "idle")
    shrink = state.shrink_pending > 0
    prev = state.prev
    if prev is not None and state.prev_pending == len(prev.participants):
        members = state.candidates(shrink)
        joiners = len(members) - len(prev.participants)
        held = n - len(members)
        reason = f"fast quorum: all {len(prev.participants)} members of quorum {prev.quorum_id} asked again"
        if joiners:
            reason += f", admitting {joiners} joiner(s)"
        if held:
            reason += f", shrink_only holds {held} newcomer(s) back"
        return _refusal(members, state, config) or Decision(members, reason, "fast")
    tail = f"[{n} asked, shrink_only={shrink}]"
    if n < config.min_replicas:
        return Decision(
            None,
            f"not ready: {n} replica(s) asked, need min_replicas={config.min_replicas} {tail}",
            "min_replicas",
        )
    live = state.live_count(now, config.heartbeat_timeout_s)
    if n <= live // 2:
        return Decision(
            None,
            f"not ready: {n} of {live} live replicas asked; a quorum needs a strict majority "
            f"(> {live // 2}) to rule out split brain {tail}",
            "split_brain",
        )
    stragglers = live - n
    if stragglers > 0:
        waited = now - state.earliest_joined()
        if waited < config.join_timeout_s:
            return Decision(
                None,
                f"not ready: waiting up to {config.join_timeout_s - waited:.3f} s more (join_timeout) "
                f"for {stragglers} live replica(s) that have not asked {tail}",
                "join_timeout",
            )
    members = state.candidates(shrink)
    if not members:
        return Decision(
            None,
            f"not ready: shrink_only and no asker was in the previous quorum {tail}",
            "shrink_empty",
        )
    reason = f"quorum of {len(members)}: {n} of {live} live replicas asked"
    if stragglers > 0:
        reason += f"; join_timeout passed, leaving {stragglers} straggler(s) out"
    return _refusal(members, state, config) or Decision(members, reason, "ready")


def _refusal(
    members: tuple[QuorumMember, ...], state: QuorumState, config: QuorumConfig
) -> Decision | None:
    """Rule 5, then rule 6: why ``members`` must not be issued, or None."""
    return _unless_behind(members, state) or _unless_committed(members, state, config)


def _unless_committed(
    members: tuple[QuorumMember, ...], state: QuorumState, config: QuorumConfig
) -> Decision | None:
    """A "below_committed" refusal if the members' highest step is below the job's
    committed step and no reset is allowed (rule 6). O(members)."""
    top = max((m.step for m in members), default=0)
    if top >= state.committed_step or config.allow_step_reset:
        return None
    return Decision(
        None,
        f"refused: the job has committed step {state.committed_step} but the askers' highest "
        f"step is {top} and no live replica holds step {state.committed_step}; issuing would "
        f"restart the job from older state. Bring back a replica at step >= "
        f"{state.committed_step}, load a checkpoint at that step in the replicas, or restart "
        "the lighthouse with --allow-step-reset",
        "below_committed",
    )


def _unless_behind(members: tuple[QuorumMember, ...], state: QuorumState) -> Decision | None:
    """A "behind" refusal if a live replica outside `members` reported a higher step (rule 5).

    O(live replicas); runs only when a quorum would otherwise be issued.
    """
    top = max((m.step for m in members), default=0)
    inside = {m.replica_id for m in members}
    ahead = sorted(
        (m.step, rid) for rid, m in state.last_member.items() if rid not in inside and m.step > top
    )
    if not ahead:
        return None
    listed = ", ".join(f"{rid} (step {step})" for step, rid in ahead[-3:])
    return Decision(
        None,
        f"not ready: live replica(s) {listed} are ahead of the askers' highest step {top}; "
        "waiting for them so no committed step is overwritten",
        "behind",
    )

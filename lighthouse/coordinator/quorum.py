"""The quorum rules: a mutable ``QuorumState`` and the pure ``decide_quorum``.

Rules (1-4 are torchft's, so a mixed job decides alike; 5 is ours):

1. **Fast quorum**: once every member of the previous quorum has asked again,
   issue at once, admitting joiners that already asked (``shrink_only`` keeps
   them out).
2. Otherwise at least ``min_replicas`` askers,
3. a strict majority of all live replicas (split-brain guard); during the
   first ``heartbeat_timeout_s`` after a restart, of at least as many replicas
   as the last quorum before it had (``recalled_members``): a restarted
   lighthouse has not heard from the live replicas yet, and a replica asking
   alone must not commit a step the others then commit again without it,
4. and wait up to ``join_timeout_s`` (from the earliest pending ask; an ask
   held in quarantine counts from the quarantine's end) for live replicas
   that have not asked yet; then issue.
5. On every path: never issue a quorum whose highest step is
   below the last step a live replica outside it reported. Such a quorum
   would commit steps again from an older state, and those commits would be
   overwritten when the replica that is ahead heals everyone (a split history:
   e.g. restarted replicas at step 0 outvoting the one holding steps 0..85
   while it is briefly stalled). Wait for it instead; if it dies, it stops
   being live and the quorum proceeds.
6. Never issue a quorum whose highest step is below the job's committed step,
   unless ``allow_step_reset``. Rule 5 guards against a live replica that is
   ahead; this rule guards against the case where every up-to-date replica is
   gone, which would otherwise restart the job silently from older (e.g.
   initial) weights. Replicas that load a checkpoint at or past the committed
   step ask at that step and pass. The committed step is what the members of
   the latest quorum reach together after it (``lighthouse.coordinator.committed``),
   never a step one request claims: a claim would let one request stop the job.
   Once a run has ended cleanly (every member of its last quorum left with a
   clean shutdown and no replica is left), a quorum of replicas all at step 0
   is a new run and is issued; one below the committed step but above 0 is a
   restart from an older checkpoint and is still refused. The refusal is
   final (``Decision.final``: the server fails the askers at once instead of
   holding them to their deadline) when no wait can lift it: the lighthouse
   has heard from replicas for ``heartbeat_timeout_s``, so every live one has
   had time to show itself, and every live replica is asking below the step.

7. Quarantine: when every member of the previous quorum asks again having
   failed ``quarantine_after_failures`` steps in a row, and some of them have
   committed a step with the lighthouse before (proven) while others never
   have, the unproven ones are the likely cause (e.g. a member whose
   ``configure`` always fails): they are left out of quorums for a backoff
   (``quarantine_base_s``, doubling per repeat up to ``QUARANTINE_MAX_S``) so
   the others continue. Their requests wait; when the backoff ends they are
   admitted again on probation. If nobody or everybody is proven the failure
   cannot be pinned on a member and nothing is quarantined. Proven: a member
   of a quorum whose members all reported a commit together (``committed``),
   so a member's own word (``commit_failures == 0``) never proves it.
8. Cut links: members that each name the other unreachable (their manager
   servers probe the previous quorum's members after a failed step) cannot
   share a process group, and a quorum holding both fails on every retry
   while both stay live (a partition between replicas, not between a replica
   and the lighthouse). The fewest members that leave no such pair are
   quarantined as in rule 7 (most cut links first; on a tie the one behind,
   then the unproven, then the higher replica id), so the rest form a quorum
   and train; when the backoff ends they are admitted again, and cut out
   again while the link is still down. A member naming a peer alone, without
   that peer naming it back, changes nothing: one hostile or confused member
   cannot evict another. (A claimant, rule 9, goes first on a tie: a stranger
   claiming to be far ahead at an address its peers cannot reach is the one cut.)
9. A claim nobody could heal from is refused. A *claimant* is a replica whose
   first request came more than one step ahead of every proven live replica
   (a step it did not earn in this lighthouse's quorums: an honest replica
   joins at or below the job's steps, and moves ahead only by committing in
   a quorum). When proven members that had to heal from the previous quorum's
   highest step come back still below it, and that step was above the job's
   committed step and held only by claimants, those claimants are
   quarantined as in rule 7, and rule 5 does not wait for a quarantined
   claimant. A claimant that commits a step together with the others is
   proven and no longer a claimant.
10. Silent data corruption: a replica that reported its own state diverged
   from the majority's (``IntegrityReport``, kind ``DIVERGED``)
   ``quarantine_after_divergences`` times within ``divergence_window_s`` is
   quarantined as in rule 7, with a reason that says how often and where
   (``lighthouse.coordinator.integrity``). Only a replica's own reports count,
   the count starts afresh at each quarantine, and no quarantine leaves fewer
   than ``min_replicas`` live replicas.

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
from dataclasses import dataclass
from enum import Enum

from lighthouse.coordinator.committed import CommittedStep
from lighthouse.coordinator.integrity import (
    DEFAULT_DIVERGENCE_WINDOW_S,
    DEFAULT_QUARANTINE_AFTER_DIVERGENCES,
    DivergenceLog,
    divergence_reason,
    repeat_offenders,
)
from lighthouse.coordinator.stragglers import (
    DEFAULT_STRAGGLER_SLOWDOWN,
    DEFAULT_STRAGGLER_WINDOW,
)
from lighthouse.types import IntegrityReport, Quorum, QuorumMember, copy_with

DEFAULT_MIN_REPLICAS = 1
DEFAULT_JOIN_TIMEOUT_MS = 10_000
DEFAULT_QUORUM_TICK_MS = 100
DEFAULT_HEARTBEAT_TIMEOUT_MS = 5_000
DEFAULT_QUARANTINE_AFTER_FAILURES = 3
DEFAULT_QUARANTINE_BASE_MS = 30_000
QUARANTINE_MAX_S = 600.0


@dataclass(frozen=True)
class QuorumConfig:
    """Quorum parameters. Times are in seconds (the clock's unit).

    ``lease``: grant quorum leases (see ``lighthouse.coordinator.lease``), so that members
    skip the lighthouse on steps where nothing changes.
    ``allow_step_reset``: let a quorum start below the job's committed step (rule 6);
    the operator's explicit choice to restart a job from older state.
    ``quarantine_after_failures``: consecutive failed steps of a whole quorum before
    its unproven members are quarantined (rule 7); 0 disables quarantine.
    ``quarantine_base_s``: the first quarantine's length, doubled per repeat.
    ``quarantine_after_divergences``: a replica's own reports of silent data
    corruption within ``divergence_window_s`` seconds before it is quarantined
    (rule 10); 0 disables that rule.
    ``straggler_window``: steps of work times kept per replica group to tell a
    straggler (``lighthouse.coordinator.stragglers``); 0 disables the detector.
    ``straggler_slowdown``: how many times the other members' median work per
    step a group's median must reach to be quarantined as a straggler (> 1).
    """

    min_replicas: int = DEFAULT_MIN_REPLICAS
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_MS / 1000
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_MS / 1000
    lease: bool = True
    allow_step_reset: bool = False
    quarantine_after_failures: int = DEFAULT_QUARANTINE_AFTER_FAILURES
    quarantine_base_s: float = DEFAULT_QUARANTINE_BASE_MS / 1000
    quarantine_after_divergences: int = DEFAULT_QUARANTINE_AFTER_DIVERGENCES
    divergence_window_s: float = DEFAULT_DIVERGENCE_WINDOW_S
    straggler_window: int = DEFAULT_STRAGGLER_WINDOW
    straggler_slowdown: float = DEFAULT_STRAGGLER_SLOWDOWN

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise ValueError(f"min_replicas must be >= 1, got {self.min_replicas}")
        if self.join_timeout_s < 0:
            raise ValueError(f"join_timeout_s must be >= 0, got {self.join_timeout_s}")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s}")
        if self.quarantine_after_failures < 0:
            raise ValueError(
                f"quarantine_after_failures must be >= 0, got {self.quarantine_after_failures}"
            )
        if self.quarantine_base_s <= 0:
            raise ValueError(f"quarantine_base_s must be > 0, got {self.quarantine_base_s}")
        if self.quarantine_after_divergences < 0:
            raise ValueError(
                "quarantine_after_divergences must be >= 0, got "
                f"{self.quarantine_after_divergences}"
            )
        if self.divergence_window_s <= 0:
            raise ValueError(f"divergence_window_s must be > 0, got {self.divergence_window_s}")
        if self.straggler_window < 0:
            raise ValueError(f"straggler_window must be >= 0, got {self.straggler_window}")
        if not self.straggler_slowdown > 1:  # also refuses NaN
            raise ValueError(f"straggler_slowdown must be > 1, got {self.straggler_slowdown}")


class DecisionKind(str, Enum):
    """Which rule a ``Decision`` followed. The values are stable tags: ``/status``
    (``next_quorum.kind``), the dashboard and a waiting group's ``QuorumWait``
    carry them as plain strings (``.value``)."""

    FAST = "fast"  # rule 1: every member of the previous quorum asked again (issued)
    READY = "ready"  # rules 2-4 hold (issued)
    IDLE = "idle"  # no replica is asking (or every asker is quarantined)
    MIN_REPLICAS = "min_replicas"  # rule 2: fewer askers than min_replicas
    SPLIT_BRAIN = "split_brain"  # rule 3: no strict majority of the live replicas
    JOIN_TIMEOUT = "join_timeout"  # rule 4: waiting for live replicas that have not asked
    SHRINK_EMPTY = "shrink_empty"  # shrink_only and no asker was in the previous quorum
    BEHIND = "behind"  # rule 5: a live replica outside is ahead
    BELOW_COMMITTED = "below_committed"  # rule 6: below the job's committed step
    QUARANTINE = "quarantine"  # rules 7-10 and stragglers: replicas to quarantine first


@dataclass(frozen=True)
class Decision:
    """``members`` (sorted by replica id) when a quorum should be issued, else None.

    ``kind`` says which rule decided (a ``DecisionKind``, whose values are the
    stable tags ``fast``, ``ready``, ``idle``, ...); ``reason`` says why in
    words. ``quarantine``: replica ids the caller must quarantine
    (``QuorumState.quarantine``) before deciding again. ``final``: a refusal
    that no wait can lift (rule 6); the caller fails the pending requests with
    ``reason`` now rather than at their deadlines.
    """

    members: tuple[QuorumMember, ...] | None
    reason: str
    kind: DecisionKind
    quarantine: tuple[str, ...] = ()
    final: bool = False


@dataclass(frozen=True)
class Quarantine:
    """A replica left out of quorums until ``until`` (seconds, the clock's), the
    ``strikes``-th time, and why."""

    until: float
    strikes: int
    reason: str


@dataclass
class _Pending:
    member: QuorumMember
    joined: float


class QuorumState:
    """Everything the rules look at. Mutated only through its methods."""

    def __init__(
        self,
        epoch: str,
        committed_step: int = 0,
        recalled_members: int = 0,
        run_ended: bool = False,
    ) -> None:
        """``epoch``: the lighthouse's random start-up id, stamped on every quorum.
        ``committed_step``: the job's committed step as recorded before a restart;
        ``recalled_members``: the size of the last quorum recorded before it (rule 3);
        ``run_ended``: the run that committed it ended cleanly (rule 6)."""
        self.epoch = epoch
        self.recalled_members = 0 if run_ended else recalled_members
        self.started: float | None = None  # the first time seen (seconds), for rule 3
        # The job's committed step (rule 6): what the latest quorum's members reached
        # together; it only grows, except when the operator allows a reset.
        self.commits = CommittedStep(committed_step, ended=run_ended)
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
        # Rule 7: replicas that committed a step in a quorum of this lighthouse, and
        # the quarantined (kept after release for the backoff; dropped when forgotten).
        self.proven: set[str] = set()
        self.quarantined: dict[str, Quarantine] = {}
        self._now = 0.0  # the latest time seen (seconds), for quarantine expiry
        # Rule 9: the previous quorum's steps by member and its highest, and the
        # claims refuted since (replica id -> why), quarantined at the next decision.
        self._prev_steps: dict[str, int] = {}
        self._prev_top = 0
        self.refuted: dict[str, str] = {}
        self.claimants: set[str] = set()  # rule 9: joined far ahead of every proven replica
        self.divergences = DivergenceLog()  # rule 10: replicas' own reports of corrupt state

    @property
    def committed_step(self) -> int:
        """The job's committed step (rule 6; ``lighthouse.coordinator.committed``)."""
        return self.commits.step

    @property
    def run_ended(self) -> bool:
        """The run that committed ``committed_step`` ended cleanly (rule 6)."""
        return self.commits.ended

    def end_run(self) -> None:
        """Every member of the last quorum left cleanly and no replica is left: a
        quorum of replicas at step 0 is a new run (rule 6), and it need not wait
        for the old run's size (rule 3)."""
        self.commits.end()
        self.recalled_members = 0

    # -- signs of life ---------------------------------------------------------------
    def heartbeat(self, replica_id: str, now: float) -> None:
        """Record that ``replica_id`` was seen at ``now`` (seconds)."""
        if self.started is None:
            self.started = now
        self.seen[replica_id] = now
        self.seen.move_to_end(replica_id)

    def forgive_silence(self, now: float) -> None:
        """The lighthouse itself did not run for a while (stopped, starved): nobody's
        silence meanwhile is theirs, so every replica counts as seen ``now``."""
        for rid in self.seen:
            self.seen[rid] = now

    def request(self, member: QuorumMember, now: float) -> None:
        """``member`` asks for a quorum at ``now``; a repeated ask replaces the old one."""
        rid = member.replica_id
        self.withdraw(rid)
        self.heartbeat(rid, now)
        if rid not in self.last_member:
            self._note_claimant(member)
        self._reported(rid, member.step, member.commit_failures > 0)
        self._refute_unhealed(member, now)
        self.pending[rid] = _Pending(member, now)
        self.last_member[rid] = member
        if rid in self._prev_set:
            self.prev_pending += 1
        if member.shrink_only:
            self.shrink_pending += 1

    def report_progress(
        self, replica_id: str, step: int, step_time_ms: float, busy_ms: float = 0.0
    ) -> None:
        """A live replica running on a lease reached ``step``: rule 5 and the step
        report see it as if it had asked at that step (with its last step's
        duration and own work, ``step_time_ms`` and ``busy_ms``)."""
        m = self.last_member.get(replica_id)
        if m is not None and step > m.step:
            self.last_member[replica_id] = copy_with(
                m, step=step, step_time_ms=step_time_ms, busy_ms=busy_ms
            )
            self._reported(replica_id, step, False)

    def integrity_reported(self, replica_id: str, report: IntegrityReport, now: float) -> bool:
        """``replica_id`` reported an integrity finding at ``now`` (rule 10). False
        if it is the report already recorded (a resent request): nothing changes."""
        return self.divergences.reported(replica_id, report, now)

    def _reported(self, replica_id: str, step: int, failed: bool) -> None:
        """A member's report after the previous quorum: it may commit a step (rule 6)
        and prove its members (rule 7), when every live member has reported."""
        together = self.commits.reported(replica_id, step, failed)
        if together is not None and together.committed:
            self.proven.update(together.members)
            self.claimants.difference_update(together.members)

    def _note_claimant(self, member: QuorumMember) -> None:
        """Rule 9: a new replica asking more than one step ahead of every proven live
        replica is a claimant. O(proven), once per new replica."""
        if not self.proven:
            return
        lead = max(
            (self.last_member[p].step for p in self.proven if p in self.last_member), default=None
        )
        if lead is not None and member.step > lead + 1:
            self.claimants.add(member.replica_id)

    def _refute_unhealed(self, member: QuorumMember, now: float) -> None:
        """Rule 9: a proven member that had to heal in the previous quorum asks again
        below its highest step, a step above the committed step held only by
        claimants: those claimants are refuted. O(1), plus O(members) then."""
        rid, top = member.replica_id, self._prev_top
        if (
            member.step >= top
            or top <= self.committed_step
            or rid not in self.proven
            or self._prev_steps.get(rid, top) >= top
        ):
            return
        assert self.prev is not None
        sources = [m.replica_id for m in self.prev.participants if m.step == top]
        if not all(s in self.claimants for s in sources):
            return
        for s in sources:
            if s in self.seen and s not in self.refuted and not self.is_quarantined(s, now):
                self.refuted[s] = (
                    f"it claimed step {top}, above the job's committed step "
                    f"{self.committed_step}, and {rid}, told to heal from it in quorum "
                    f"{self.prev.quorum_id}, came back at step {member.step}: a step "
                    "nobody could heal from is a claim, not a committed step"
                )

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
        self.proven.discard(replica_id)
        self.quarantined.pop(replica_id, None)
        self.refuted.pop(replica_id, None)
        self.claimants.discard(replica_id)
        self.divergences.forget(replica_id)
        self.commits.gone(replica_id)  # nothing it reported outlives it
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
        """Number of live replicas at ``now`` that are not quarantined (pending
        requesters always count)."""
        held = sum(1 for rid in self.seen if self.is_quarantined(rid, now))
        return len(self.seen) - len(self.expired(now, timeout_s)) - held

    # -- quarantine (rule 7) -------------------------------------------------------------
    def is_quarantined(self, replica_id: str, now: float) -> bool:
        q = self.quarantined.get(replica_id)
        return q is not None and q.until > now

    def quarantine(
        self, replica_ids: tuple[str, ...], now: float, config: QuorumConfig, why: str
    ) -> None:
        """Leave ``replica_ids`` out of quorums for the backoff of their next strike."""
        for rid in replica_ids:
            old = self.quarantined.get(rid)
            strikes = 1 if old is None else old.strikes + 1
            length = min(config.quarantine_base_s * 2 ** (strikes - 1), QUARANTINE_MAX_S)
            self.quarantined[rid] = Quarantine(now + length, strikes, why)
            self.refuted.pop(rid, None)
            self.divergences.quarantined(rid)  # rule 10 counts afresh after any quarantine
            # Left out, it no longer holds the job's committed step back (or moves it):
            # the others commit on without it.
            self.commits.gone(rid)

    def asking(self, now: float) -> int:
        """Pending requests that are not quarantined."""
        if not self.quarantined:
            return len(self.pending)
        return sum(1 for rid in self.pending if not self.is_quarantined(rid, now))

    # -- deciding ----------------------------------------------------------------------
    def earliest_joined(self, now: float) -> float:
        """When the oldest pending request that is not quarantined at ``now`` arrived
        (seconds; ``now`` if none). A request held in a quarantine counts from the
        quarantine's end, when it starts to ask: its wait in quarantine must not
        have used up the join timeout of the quorum that takes it back, or the
        first of the others to ask again would form one with it alone. O(1)
        without quarantines, else O(pending)."""
        if not self.quarantined:
            return next(iter(self.pending.values())).joined if self.pending else now
        times = []
        for rid, p in self.pending.items():
            q = self.quarantined.get(rid)
            if q is None:
                times.append(p.joined)
            elif q.until <= now:
                times.append(max(p.joined, q.until))
        return min(times, default=now)

    def candidates(self, shrink_only: bool, now: float) -> tuple[QuorumMember, ...]:
        """Pending members that are not quarantined, sorted by replica id; under
        shrink_only only previous members."""
        members = [p.member for p in self.pending.values()]
        if self.quarantined:
            members = [m for m in members if not self.is_quarantined(m.replica_id, now)]
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
        self._prev_steps = {m.replica_id: m.step for m in members}
        self._prev_top = max(self._prev_steps.values(), default=0)
        if self._prev_top < self.commits.step or self.commits.ended:
            self.commits.reset(self._prev_top)  # an allowed reset, or a new run
        self.commits.issued(ids)
        self._prev_ids = ids
        self._prev_set = frozenset(ids)
        self.prev_pending = 0
        self.shrink_pending = sum(1 for p in left if p.member.shrink_only)
        return quorum


def decide_quorum(now: float, state: QuorumState, config: QuorumConfig) -> Decision:
    """Decide whether to issue a quorum now (seconds), and why. Does not mutate ``state``.

    O(1) when not ready; O(N log N) to list the members when ready.
    """
    refuted = _refuted(state, config) or _corrupt(state, config, now)
    if refuted is not None:
        return refuted
    n = state.asking(now)
    if n == 0:
        if state.pending:
            return Decision(
                None,
                f"idle: the {len(state.pending)} waiting replica(s) are quarantined",
                DecisionKind.IDLE,
            )
        return Decision(None, "idle: no replica is waiting for a quorum", DecisionKind.IDLE)
    shrink = state.shrink_pending > 0
    prev = state.prev
    if prev is not None and state.prev_pending == len(prev.participants):
        members = state.candidates(shrink, now)
        joiners = len(members) - len(prev.participants)
        held = n - len(members)
        reason = f"fast quorum: all {len(prev.participants)} members of quorum {prev.quorum_id} asked again"
        if joiners:
            reason += f", admitting {joiners} joiner(s)"
        if held:
            reason += f", shrink_only holds {held} newcomer(s) back"
        return (
            _cut_apart(members, state, config)
            or _quarantine_suspects(members, state, config, now)
            or _refusal(members, state, config, now)
            or Decision(members, reason, DecisionKind.FAST)
        )
    tail = f"[{n} asked, shrink_only={shrink}]"
    if n < config.min_replicas:
        return Decision(
            None,
            f"not ready: {n} replica(s) asked, need min_replicas={config.min_replicas} {tail}",
            DecisionKind.MIN_REPLICAS,
        )
    live = state.live_count(now, config.heartbeat_timeout_s)
    recalled = state.recalled_members
    if (
        recalled > live
        and state.started is not None
        and now - state.started < config.heartbeat_timeout_s
    ):
        if n <= recalled // 2:
            return Decision(
                None,
                f"not ready: restarted {now - state.started:.3f} s ago; the last quorum before "
                f"the restart had {recalled} members and only {n} asked, so up to "
                f"{config.heartbeat_timeout_s:g} s after the restart a quorum needs more than "
                f"{recalled // 2} (the others may be live and not yet reconnected) {tail}",
                DecisionKind.SPLIT_BRAIN,
            )
        live = recalled
    if n <= live // 2:
        return Decision(
            None,
            f"not ready: {n} of {live} live replicas asked; a quorum needs a strict majority "
            f"(> {live // 2}) to rule out split brain {tail}",
            DecisionKind.SPLIT_BRAIN,
        )
    stragglers = live - n
    if stragglers > 0:
        waited = now - state.earliest_joined(now)
        if waited < config.join_timeout_s:
            return Decision(
                None,
                f"not ready: waiting up to {config.join_timeout_s - waited:.3f} s more (join_timeout) "
                f"for {stragglers} live replica(s) that have not asked {tail}",
                DecisionKind.JOIN_TIMEOUT,
            )
    members = state.candidates(shrink, now)
    if not members:
        return Decision(
            None,
            f"not ready: shrink_only and no asker was in the previous quorum {tail}",
            DecisionKind.SHRINK_EMPTY,
        )
    reason = f"quorum of {len(members)}: {n} of {live} live replicas asked"
    if stragglers > 0:
        reason += f"; join_timeout passed, leaving {stragglers} straggler(s) out"
    return (
        _cut_apart(members, state, config)
        or _quarantine_suspects(members, state, config, now)
        or _refusal(members, state, config, now)
        or Decision(members, reason, DecisionKind.READY)
    )


def _refuted(state: QuorumState, config: QuorumConfig) -> Decision | None:
    """Rule 9: a "quarantine" decision naming the refuted claims, if any (and
    quarantine is on)."""
    if not state.refuted or config.quarantine_after_failures <= 0:
        return None
    ids = tuple(sorted(state.refuted))
    why = "; ".join(f"{rid}: {state.refuted[rid]}" for rid in ids[:3])
    return Decision(None, f"refusing the claim of {list(ids)}: {why}", DecisionKind.QUARANTINE, ids)


def _corrupt(state: QuorumState, config: QuorumConfig, now: float) -> Decision | None:
    """Rule 10: a "quarantine" decision naming the replicas whose own reports of a
    diverged state reached ``quarantine_after_divergences`` within
    ``divergence_window_s``, as many as leave ``min_replicas`` live ones.
    O(1) while no replica reported a divergence."""
    log = state.divergences
    if config.quarantine_after_divergences <= 0 or not log.replica_ids():
        return None
    offenders = repeat_offenders(
        log,
        now,
        after=config.quarantine_after_divergences,
        window_s=config.divergence_window_s,
        live=state.live_count(now, config.heartbeat_timeout_s),
        min_replicas=config.min_replicas,
        is_quarantined=lambda rid: state.is_quarantined(rid, now),
    )
    if not offenders:
        return None
    why = "; ".join(
        f"{rid}: {divergence_reason(n, log.last_diverged(rid), config.divergence_window_s)}"
        for rid, n in offenders
    )
    ids = tuple(rid for rid, _ in offenders)
    return Decision(None, f"quarantining {list(ids)}: {why}", DecisionKind.QUARANTINE, ids)


def _quarantine_suspects(
    members: tuple[QuorumMember, ...], state: QuorumState, config: QuorumConfig, now: float
) -> Decision | None:
    """Rule 7: a "quarantine" decision naming the unproven ``members`` if every one of
    them failed ``quarantine_after_failures`` steps in a row and some are proven."""
    k = config.quarantine_after_failures
    if k <= 0 or len(members) < 2:
        return None
    failures = min(m.commit_failures for m in members)
    if failures < k:
        return None
    suspects = tuple(m.replica_id for m in members if m.replica_id not in state.proven)
    if not suspects or len(suspects) == len(members):
        return None  # nobody or everybody is unproven: the failure is not attributable
    why = (
        f"every member of the would-be quorum failed at least {failures} steps in a row, "
        f"{len(members) - len(suspects)} of them committed steps before; "
        f"{list(suspects)} never committed a step with this lighthouse"
    )
    return Decision(
        None, f"quarantining {list(suspects)}: {why}", DecisionKind.QUARANTINE, suspects
    )


def _cut_apart(
    members: tuple[QuorumMember, ...], state: QuorumState, config: QuorumConfig
) -> Decision | None:
    """Rule 8: a "quarantine" decision naming the fewest ``members`` whose removal
    leaves no two members that each named the other unreachable. O(members +
    reports); a greedy cover, exact for the one or two cut links partitions make."""
    if config.quarantine_after_failures <= 0 or not any(m.unreachable for m in members):
        return None
    by_id = {m.replica_id: m for m in members}
    links = {
        (a, b) if a < b else (b, a)
        for a, m in by_id.items()
        for b in m.unreachable
        if b in by_id and b != a and a in by_id[b].unreachable
    }
    if not links:
        return None
    cut_links = sorted(links)
    excluded: list[str] = []
    while links:
        degree: dict[str, int] = {}
        for a, b in links:
            degree[a] = degree.get(a, 0) + 1
            degree[b] = degree.get(b, 0) + 1
        # most links, then a claimant (rule 9), then behind, then unproven, then the higher id
        out = max(
            (
                n,
                int(rid in state.claimants),
                -by_id[rid].step,
                int(rid not in state.proven),
                rid,
            )
            for rid, n in degree.items()
        )[4]
        excluded.append(out)
        links = {link for link in links if out not in link}
    pairs = ", ".join(f"{a} <-> {b}" for a, b in cut_links)
    why = (
        f"members that named each other unreachable after a failed step cannot share a "
        f"process group ({pairs}); leaving {excluded} out lets the others train"
    )
    return Decision(
        None, f"cutting {excluded} out: {why}", DecisionKind.QUARANTINE, tuple(excluded)
    )


def _refusal(
    members: tuple[QuorumMember, ...], state: QuorumState, config: QuorumConfig, now: float
) -> Decision | None:
    """Rule 5, then rule 6: why ``members`` must not be issued, or None."""
    return _unless_behind(members, state, now) or _unless_committed(members, state, config, now)


def _unless_committed(
    members: tuple[QuorumMember, ...], state: QuorumState, config: QuorumConfig, now: float
) -> Decision | None:
    """A "below_committed" refusal if the members' highest step is below the job's
    committed step and no reset is allowed (rule 6). O(live replicas)."""
    top = max((m.step for m in members), default=0)
    if top >= state.committed_step or config.allow_step_reset:
        return None
    if top == 0 and state.run_ended:
        return None  # a new run after one that ended cleanly
    return Decision(
        None,
        f"refused: the job has committed step {state.committed_step} but the askers' highest "
        f"step is {top} and no live replica holds step {state.committed_step}; issuing would "
        f"restart the job from older state. Bring back a replica at step >= "
        f"{state.committed_step}, load a checkpoint at that step in the replicas, or restart "
        "the lighthouse with --allow-step-reset"
        + (
            f" (the run that committed step {state.committed_step} ended cleanly: a new run "
            "from step 0 would be admitted)"
            if state.run_ended
            else ""
        ),
        DecisionKind.BELOW_COMMITTED,
        final=_no_wait_lifts(state, config, now),
    )


def _no_wait_lifts(state: QuorumState, config: QuorumConfig, now: float) -> bool:
    """Rule 6's refusal is final: the lighthouse has heard from replicas for
    ``heartbeat_timeout_s`` (after a restart, live replicas reconnect within it)
    and every live replica is asking, all below the committed step, so nobody
    who could bring that step is on the way. O(live replicas)."""
    if state.started is None or now - state.started < config.heartbeat_timeout_s:
        return False
    if any(rid not in state.pending for rid in state.seen):
        return False  # a live replica that is not asking may be at the step (e.g. loading it)
    return all(p.member.step < state.committed_step for p in state.pending.values())


def _unless_behind(
    members: tuple[QuorumMember, ...], state: QuorumState, now: float
) -> Decision | None:
    """A "behind" refusal if a live replica outside `members` reported a higher step
    (rule 5); a quarantined claimant does not count (rule 9).

    O(live replicas); runs only when a quorum would otherwise be issued.
    """
    top = max((m.step for m in members), default=0)
    inside = {m.replica_id for m in members}
    ahead = sorted(
        (m.step, rid)
        for rid, m in state.last_member.items()
        if rid not in inside
        and m.step > top
        and not (rid in state.claimants and state.is_quarantined(rid, now))
    )
    if not ahead:
        return None
    listed = ", ".join(f"{rid} (step {step})" for step, rid in ahead[-3:])
    return Decision(
        None,
        f"not ready: live replica(s) {listed} are ahead of the askers' highest step {top}; "
        "waiting for them so no committed step is overwritten",
        DecisionKind.BEHIND,
    )

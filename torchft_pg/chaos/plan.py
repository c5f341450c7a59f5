"""Fault plans: which fault hits which replica at which step, reproducible from a seed.

A plan is data, not a timer: the same seed always gives the same faults at
the same (replica, step) points, so a failing chaos run can be replayed.
Faults planned at one step form a *group* (overlapping faults). Each rank
fires its own faults (`replica_faults.ReplicaFaults`); a supervisor that
watches the job may hold each group back until the job has recovered from
the previous one (`FaultPlan.due`'s `released`), so a plan never takes away
the last up-to-date replica by accident of timing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "CLASSIC_FAULTS",
    "HEALTH_FAULTS",
    "LIGHTHOUSE_FAULTS",
    "PHASE_FAULTS",
    "Fault",
    "FaultPlan",
]


class Fault(str, Enum):
    """What happens to a replica group. The process-killing kinds name the phase they land in."""

    KILL_REPLICA = "kill_replica"  # SIGKILL every rank between forward and backward
    KILL_BABY_CHILD = "kill_baby_child"  # SIGKILL the Baby PG's backend child
    FAIL_ALLREDUCE = "fail_allreduce"  # the next allreduce runs but reports a failure
    DELAY = "delay"  # stall before the quorum, past the lighthouse join timeout
    RESTART_LIGHTHOUSE = "restart_lighthouse"  # stop and restart the lighthouse, same address
    # The lighthouse stops answering for a while (sockets open: a SIGSTOP, a hung
    # host), then goes on; the job must commit on from its lease meanwhile.
    FREEZE_LIGHTHOUSE = "freeze_lighthouse"
    # The lighthouse is down for a while, then restarted on the same address and
    # state file (a new epoch); the job must commit on from its lease meanwhile.
    LIGHTHOUSE_OUTAGE = "lighthouse_outage"
    # Kills at a phase of the step (`injection.Phase`); every rank of the group dies there.
    KILL_ALLREDUCE_BEFORE = "kill_allreduce_before"  # in the PG's allreduce, before issuing it
    KILL_ALLREDUCE_AFTER = "kill_allreduce_after"  # right after issuing it (collective in flight)
    KILL_COMMIT_BEFORE = "kill_commit_before"  # entering should_commit, before voting
    KILL_COMMIT_AFTER = "kill_commit_after"  # after the vote's decision, before optimizer.step
    # Fails this step's allreduce, so the next quorum is a new one, and dies inside
    # the PG's configure() for it (before meeting the peers).
    KILL_CONFIGURE = "kill_configure"
    # Fails this step's allreduce, so the replica is behind next step and heals,
    # and dies inside recv_checkpoint (the source is serving it).
    KILL_HEALER = "kill_healer"
    # Dies right after its next send_checkpoint returns, while the healer fetches.
    # Needs a healer: `FaultPlan.random` pairs it with FAIL_ALLREDUCE on another
    # replica at the same step, one this replica is the heal source of.
    KILL_HEAL_SOURCE = "kill_heal_source"
    # Only the group's last rank dies, right after issuing its allreduce; the
    # launcher (torchrun, or a supervisor) stops the rest of the group, the
    # failure domain. Needs group_world_size > 1.
    PARTIAL_KILL = "partial_kill"
    # SIGSTOP in the allreduce, before issuing it; SIGCONT comes past the lighthouse
    # heartbeat timeout (`ReplicaFaults.freeze_s`). The zombie must commit nothing stale.
    FREEZE = "freeze"
    # Faults that stop nothing. One low mantissa bit of one tensor of the replica's
    # state flips between two steps (`corruption.py`); the replica keeps voting yes,
    # and only the Manager's integrity check can tell.
    CORRUPT_STATE = "corrupt_state"
    # The replica works `ReplicaFaults.straggle_s` longer per step for
    # `straggle_steps` of its steps, or until it was taken out of the quorum and
    # heals back in (then it keeps pace again).
    STRAGGLE = "straggle"


#: The kinds `FaultPlan.random` draws its other faults from by default.
CLASSIC_FAULTS: tuple[Fault, ...] = (
    Fault.FAIL_ALLREDUCE,
    Fault.DELAY,
    Fault.KILL_BABY_CHILD,
    Fault.RESTART_LIGHTHOUSE,
)
#: The faults that land inside a phase of the step, for a gloo job of single-rank groups
#: (PARTIAL_KILL needs multi-rank groups: add it for those).
PHASE_FAULTS: tuple[Fault, ...] = (
    Fault.KILL_ALLREDUCE_BEFORE,
    Fault.KILL_ALLREDUCE_AFTER,
    Fault.KILL_COMMIT_BEFORE,
    Fault.KILL_COMMIT_AFTER,
    Fault.KILL_CONFIGURE,
    Fault.KILL_HEALER,
    Fault.KILL_HEAL_SOURCE,
    Fault.FREEZE,
)
#: The faults that stop nothing (a corrupt state, a slow replica), which the job's
#: health checks must catch. `FaultPlan.random` never overlaps them with another
#: fault, and CORRUPT_STATE needs 3 replicas (a majority to tell the corrupt one).
HEALTH_FAULTS: tuple[Fault, ...] = (Fault.CORRUPT_STATE, Fault.STRAGGLE)
#: The faults that happen to the lighthouse, not to a replica (the replica a plan
#: names only announces them, for whoever runs the lighthouse to act).
LIGHTHOUSE_FAULTS: tuple[Fault, ...] = (
    Fault.RESTART_LIGHTHOUSE,
    Fault.FREEZE_LIGHTHOUSE,
    Fault.LIGHTHOUSE_OUTAGE,
)
# Faults that leave the replica's state intact at the step they hit: every
# other kind kills the replica, freezes it or fails its step (it falls behind).
_HARMLESS = frozenset(LIGHTHOUSE_FAULTS)


@dataclass(frozen=True)
class FaultPlan:
    """Faults keyed by (replica index, step); a step is the replica's committed step.

    A fault fires at the replica's first step at or past the planned one (`due`),
    and, under a supervisor that releases groups, not before its group was released.
    """

    faults: dict[tuple[int, int], Fault] = field(default_factory=dict)
    seed: int | None = None

    def due(
        self,
        replica: int,
        step: int,
        fired: set[tuple[int, int]] | frozenset[tuple[int, int]],
        released: Mapping[int, int] | None = None,
    ) -> tuple[int, Fault] | None:
        """The earliest unfired fault of `replica` planned at or before `step`.

        A fault fires at the replica's first step at or past its planned step:
        a restarted replica heals past the steps it missed, and its faults
        there must still fire, or the plan's fault count would depend on timing.
        `released` (planned step -> step to fire at), when given, holds a fault
        back until its group is released and `step` reached the release's step.
        """
        planned = sorted(
            s for (r, s) in self.faults if r == replica and s <= step and (r, s) not in fired
        )
        if not planned:
            return None
        first = planned[0]
        if released is not None and (first not in released or released[first] > step):
            return None
        return first, self.faults[(replica, first)]

    def groups(self) -> list[int]:
        """The planned steps that hold faults, in the order they are released."""
        return sorted({s for _, s in self.faults})

    def count(self, kind: Fault) -> int:
        return sum(1 for f in self.faults.values() if f == kind)

    @classmethod
    def random(
        cls,
        seed: int,
        replicas: int,
        steps: int,
        kills: int,
        other_faults: int = 0,
        first_step: int = 2,
        gap: int = 3,
        same_replica_gap: int = 24,
        kinds: Sequence[Fault] = CLASSIC_FAULTS,
        overlaps: int = 0,
    ) -> FaultPlan:
        """`kills` replica kills and `other_faults` faults drawn from `kinds`, spread over the run.

        Faults are at least `gap` steps apart and faults on one replica at
        least `same_replica_gap` apart: a restarted replica heals to its peers'
        step, which moved on while it restarted. Any replica may be killed,
        replica 0 included; with the faults of one group well apart in steps
        (or a supervisor releasing each group only once the job has recovered
        from the previous one), other replicas hold the committed state. Up to `overlaps` of the fault groups get a second fault
        on another replica at the same step, while one replica stays untouched
        (a group that would leave none gets no second fault), except a group
        whose fault is one of `HEALTH_FAULTS`. A KILL_HEAL_SOURCE comes with FAIL_ALLREDUCE
        on another replica at the same step, whose heal it will serve: the
        heal source of a single healer is the lowest-numbered up-to-date replica
        (when both candidate sources were hit within `same_replica_gap`, another
        kind is drawn instead).
        """
        rng = random.Random(seed)
        total = kills + other_faults
        if replicas < 2:
            raise ValueError(f"a chaos plan needs at least 2 replicas, got {replicas}")
        if first_step + gap * total > steps:
            raise ValueError(
                f"{total} faults {gap} steps apart from step {first_step} need "
                f"{first_step + gap * total} steps, got {steps}"
            )
        if overlaps > total:
            raise ValueError(f"overlaps ({overlaps}) cannot exceed the number of faults ({total})")
        if (overlaps or Fault.KILL_HEAL_SOURCE in kinds or Fault.CORRUPT_STATE in kinds) and (
            replicas < 3
        ):
            raise ValueError(
                "overlapping faults, KILL_HEAL_SOURCE and CORRUPT_STATE need at least 3 "
                f"replicas, got {replicas}"
            )
        kind_list = [Fault.KILL_REPLICA] * kills + [rng.choice(kinds) for _ in range(other_faults)]
        rng.shuffle(kind_list)
        overlapping = set(rng.sample(range(total), overlaps))
        second_kinds = [
            k
            for k in (*kinds, Fault.KILL_REPLICA)
            if k != Fault.KILL_HEAL_SOURCE and k not in HEALTH_FAULTS
        ]
        faults: dict[tuple[int, int], Fault] = {}
        last: dict[int, int] = {}

        def free(step: int, taken: set[int]) -> list[int]:
            return [
                r
                for r in range(replicas)
                if r not in taken and step - last.get(r, -same_replica_gap) >= same_replica_gap
            ]

        def place(replica: int, step: int, kind: Fault) -> None:
            last[replica] = step
            faults[(replica, step)] = kind

        for i, kind in enumerate(kind_list):
            step = first_step + gap * i
            taken: set[int] = set()
            # A healer q, and the source that will serve it: the lowest other replica.
            # (The healer's FAIL_ALLREDUCE is mild: it may come sooner than
            # same_replica_gap after the healer's previous fault.)
            pairs = [
                (q, min(r for r in range(replicas) if r != q))
                for q in range(replicas)
                if min(r for r in range(replicas) if r != q) in free(step, {q})
            ]
            if kind == Fault.KILL_HEAL_SOURCE and not pairs:
                kind = rng.choice(second_kinds)  # both possible sources were hit too recently
            if kind == Fault.KILL_HEAL_SOURCE:
                healer, source = rng.choice(pairs)
                place(healer, step, Fault.FAIL_ALLREDUCE)
                place(source, step, Fault.KILL_HEAL_SOURCE)
                taken = {healer, source}
            else:
                candidates = free(step, set())
                if not candidates:
                    raise ValueError(_crowded(total, gap, same_replica_gap))
                replica = rng.choice(candidates)
                place(replica, step, kind)
                taken = {replica}
            if i in overlapping and kind not in HEALTH_FAULTS:
                # A health fault stays alone: a corrupt replica must be told from a
                # majority of sound ones, a straggler from groups keeping pace.
                # Keep one replica untouched by this group: it holds the committed state.
                extra = rng.choice(second_kinds)
                hit = sum(1 for r in taken if faults[(r, step)] not in _HARMLESS)
                candidates = free(step, taken)
                if candidates and (extra in _HARMLESS or hit + 1 < replicas):
                    place(rng.choice(candidates), step, extra)
        return cls(faults=faults, seed=seed)

    def describe(self) -> str:
        items = sorted(self.faults.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return ", ".join(f"step {s}: {f.value} replica {r}" for (r, s), f in items) or "no faults"


def _crowded(total: int, gap: int, same_replica_gap: int) -> str:
    return (
        f"cannot place {total} faults {gap} steps apart with {same_replica_gap} steps between "
        f"faults on one replica: use more replicas, more steps or a larger gap"
    )

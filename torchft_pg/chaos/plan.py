"""Fault plans: which fault hits which replica at which step, reproducible from a seed.

A plan is data, not a timer: the same seed always gives the same faults at
the same (replica, step) points, so a failing chaos run can be replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Fault", "FaultPlan"]


class Fault(str, Enum):
    KILL_REPLICA = "kill_replica"  # SIGKILL the replica group's process mid-step
    KILL_BABY_CHILD = "kill_baby_child"  # SIGKILL the Baby PG's backend child
    FAIL_ALLREDUCE = "fail_allreduce"  # the next allreduce fails
    DELAY = "delay"  # stall before the quorum, past the lighthouse join timeout
    RESTART_LIGHTHOUSE = "restart_lighthouse"  # stop and restart the lighthouse, same address


@dataclass(frozen=True)
class FaultPlan:
    """Faults keyed by (replica index, step); a step is the replica's committed step.

    A fault fires at the replica's first step at or past the planned one (`due`).
    """

    faults: dict[tuple[int, int], Fault] = field(default_factory=dict)
    seed: int | None = None

    def due(self, replica: int, step: int, fired: set[tuple[int, int]]) -> tuple[int, Fault] | None:
        """The earliest unfired fault of `replica` planned at or before `step`.

        A fault fires at the replica's first step at or past its planned step:
        a restarted replica heals past the steps it missed, and its faults
        there must still fire, or the plan's fault count would depend on timing.
        """
        planned = sorted(
            s for (r, s) in self.faults if r == replica and s <= step and (r, s) not in fired
        )
        return (planned[0], self.faults[(replica, planned[0])]) if planned else None

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
    ) -> FaultPlan:
        """`kills` replica kills and `other_faults` other faults, spread over the run.

        Faults are at least `gap` steps apart so each recovery completes before
        the next fault, and faults on one replica at least `same_replica_gap`
        apart: a restarted replica heals to its peers' step, which moved on
        while it restarted, and a fault planned for a step it skipped never
        fires. Replica 0 is never killed, so one replica always holds the
        committed state (a job that loses every replica at once cannot heal).
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
        kinds = [Fault.KILL_REPLICA] * kills + [
            rng.choice(
                [Fault.FAIL_ALLREDUCE, Fault.DELAY, Fault.KILL_BABY_CHILD, Fault.RESTART_LIGHTHOUSE]
            )
            for _ in range(other_faults)
        ]
        rng.shuffle(kinds)
        faults: dict[tuple[int, int], Fault] = {}
        last: dict[int, int] = {}
        for i, kind in enumerate(kinds):
            step = first_step + gap * i
            candidates = range(1, replicas) if kind == Fault.KILL_REPLICA else range(replicas)
            free = [
                r for r in candidates if step - last.get(r, -same_replica_gap) >= same_replica_gap
            ]
            if not free:
                raise ValueError(
                    f"cannot place {total} faults {gap} steps apart with {same_replica_gap} steps between "
                    f"faults on one replica: use more replicas, more steps or a larger gap"
                )
            replica = rng.choice(free)
            last[replica] = step
            faults[(replica, step)] = kind
        return cls(faults=faults, seed=seed)

    def describe(self) -> str:
        items = sorted(self.faults.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return ", ".join(f"step {s}: {f.value} replica {r}" for (r, s), f in items) or "no faults"

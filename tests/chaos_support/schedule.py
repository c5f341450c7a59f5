"""When each fault group of a plan may fire, and when the run may end: pure bookkeeping.

The supervisor releases a plan's fault groups (the faults planned at one step)
one at a time, in step order. A group is released once every fault of the
previous one fired and the job recovered: every replica committed, with every
replica taking part, a step past the last disruption (a fault fired, a rank
died or froze or resumed, a group restarted), and no replica is held: a
replica whose state was corrupted, until it was caught and healed, or a
straggler, until it keeps pace again, and the lighthouse is not away. Recovery is judged by steps,
not by the order events arrive in, because events of different ranks come
over different pipes. After the last group the ranks are told where to stop.
"""

from __future__ import annotations

from tests.chaos_support.events import Finish, Release
from torchft_pg.chaos.plan import Fault, FaultPlan

__all__ = ["FaultSchedule"]

# Steps between the highest committed step seen and the step a message names, so
# that every rank reads it (it polls once per step) before it reaches that step.
MARGIN = 2
# In a group with the lighthouse going away, the other faults fire this many steps
# after it went: while it is away (the job commits on from its lease meanwhile).
WHILE_AWAY = 10
_AWAY = frozenset({Fault.FREEZE_LIGHTHOUSE, Fault.LIGHTHOUSE_OUTAGE})


class FaultSchedule:
    """`plan`'s release schedule for a job of `replicas` replica groups."""

    def __init__(self, plan: FaultPlan, replicas: int) -> None:
        self.plan = plan
        self.replicas = replicas
        self.groups = plan.groups()
        self.next_group = 0
        self.fired: set[tuple[int, int]] = set()  # (replica, planned step)
        self.released: dict[int, int] = {}  # planned step -> step to fire at
        self.finish_at: int | None = None
        self.max_step = -1  # the highest committed step seen
        self.disrupted_at = -1  # the highest step a disruption happened at
        self.last_full: dict[int, int] = {}  # replica -> last step committed with everyone
        # replicas whose health fault has not run its course (-1: the lighthouse, away)
        self.held: set[int] = set()

    def hold(self, replica: int) -> None:
        """`replica` is corrupt or straggling: no group is released until `unhold`."""
        self.held.add(replica)

    def unhold(self, replica: int, step: int) -> None:
        """`replica`'s health fault ran its course at `step` (healed, or keeps pace)."""
        if replica in self.held:
            self.held.discard(replica)
            self.disrupt(step)

    def fire(self, replica: int, planned_step: int, step: int) -> bool:
        """A fault fired at `step`; False if it had already (every rank announces it)."""
        if (replica, planned_step) in self.fired:
            return False
        self.fired.add((replica, planned_step))
        self.disrupt(step)
        return True

    def disrupt(self, step: int) -> None:
        self.disrupted_at = max(self.disrupted_at, step, self.max_step)

    def committed(self, replica: int, step: int, participants: int) -> None:
        self.max_step = max(self.max_step, step)
        if participants == self.replicas:
            self.last_full[replica] = max(self.last_full.get(replica, -1), step)

    def recovered(self) -> bool:
        if self.held:
            return False
        return all(self.last_full.get(r, -1) > self.disrupted_at for r in range(self.replicas))

    def unfired(self) -> list[tuple[int, int]]:
        return sorted(set(self.plan.faults) - self.fired, key=lambda k: (k[1], k[0]))

    def due_messages(self) -> list[Release | Finish]:
        """What to tell the ranks now: the groups that may be released, then `Finish`."""
        out: list[Release | Finish] = []
        while self.finish_at is None:
            if self.next_group > 0:
                previous = self.groups[self.next_group - 1]
                pending = [k for k in self.plan.faults if k[1] == previous and k not in self.fired]
                if pending or not self.recovered():
                    return out
            elif not self.groups and not self.recovered():
                return out
            if self.next_group == len(self.groups):
                self.finish_at = self.max_step + 1 + MARGIN
                out.append(Finish(at_step=self.finish_at))
                return out
            planned = self.groups[self.next_group]
            fire_at = max(planned, self.max_step + MARGIN)
            self.released[planned] = fire_at
            self.next_group += 1
            away = any(f in _AWAY for (_, s), f in self.plan.faults.items() if s == planned)
            out.append(
                Release(
                    planned_step=planned, fire_at=fire_at, others_after=WHILE_AWAY if away else 0
                )
            )
        return out

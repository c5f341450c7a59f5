"""The chaos fault schedule: one group at a time, each on a recovered job, judged by steps."""

from __future__ import annotations

from tests.chaos_support.events import Finish, Release
from tests.chaos_support.schedule import FaultSchedule
from torchft_pg.chaos.plan import Fault, FaultPlan


def _all_commit(schedule: FaultSchedule, step: int, participants: int = 3) -> None:
    for replica in range(3):
        schedule.committed(replica, step, participants)


def test_groups_are_released_in_order_each_after_recovery() -> None:
    plan = FaultPlan({(1, 4): Fault.KILL_REPLICA, (2, 4): Fault.DELAY, (0, 10): Fault.KILL_REPLICA})
    s = FaultSchedule(plan, replicas=3)
    assert s.due_messages() == [Release(planned_step=4, fire_at=4)]  # the first at once
    assert s.due_messages() == []
    _all_commit(s, 3)
    assert s.fire(1, 4, step=4) and not s.fire(1, 4, step=4)  # announced once per group
    _all_commit(s, 5)
    assert s.due_messages() == []  # (2, 4) has not fired yet
    assert s.fire(2, 4, step=6)
    _all_commit(s, 6)
    assert s.due_messages() == []  # step 6 is not past the disruption at step 6
    _all_commit(s, 7, participants=2)
    assert s.due_messages() == []  # not everyone took part
    _all_commit(s, 8)
    assert s.due_messages() == [Release(planned_step=10, fire_at=10)]
    assert s.fire(0, 10, step=10)
    _all_commit(s, 14)
    assert s.due_messages() == [Finish(at_step=17)]
    assert s.unfired() == []


def test_a_commit_that_arrives_late_does_not_count_as_recovery() -> None:
    """Events of different ranks arrive in any order: a commit of a step before the
    fault, read after it, must not release the next group."""
    plan = FaultPlan({(1, 4): Fault.KILL_REPLICA, (0, 6): Fault.KILL_REPLICA})
    s = FaultSchedule(plan, replicas=3)
    s.due_messages()
    s.fire(1, 4, step=20)  # released late: fired at step 20
    _all_commit(s, 19)  # read after the fault, committed before it
    assert s.due_messages() == []
    s.disrupt(s.max_step)  # the killed replica restarts
    _all_commit(s, 21)
    assert s.due_messages() == [Release(planned_step=6, fire_at=23)]


def test_a_plan_without_faults_finishes_once_everyone_took_part() -> None:
    s = FaultSchedule(FaultPlan(), replicas=3)
    assert s.due_messages() == []
    _all_commit(s, 0)
    assert s.due_messages() == [Finish(at_step=3)]

"""`ReplicaFaults`: a rank fires its replica's planned faults once, at or past their step,
arms each at its phase, and a restarted process reading the same record fires none again;
`FaultInjectingManager` routes its heal transport through the injector.

An armed action announces itself before it kills or stops the process; the
announcement here raises instead, so the test process sees which action
would have been taken, at which phase, and survives it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from tests.unit.manager_fakes import FakeClient, FakeTransport, SumGroup
from torchft_pg.chaos import (
    Action,
    Fault,
    FaultInjectingManager,
    FaultInjectingTransport,
    FaultPlan,
    Injector,
    Phase,
    ReplicaFaults,
)
from torchft_pg.process_group import ProcessGroupDummy


class Announced(Exception):
    """Raised by the announcement, in place of the action."""

    def __init__(self, action: Action, phase: Phase) -> None:
        super().__init__(f"{action.value} at {phase.value}")
        self.action = action
        self.phase = phase


def _announce(action: Action, phase: Phase) -> None:
    raise Announced(action, phase)


def _faults(
    plan: FaultPlan,
    *,
    group_rank: int = 0,
    group_world_size: int = 1,
    freeze_s: float | None = 15.0,
    record: Path | None = None,
    on_fired: Callable[[int, Fault, int], None] | None = None,
) -> ReplicaFaults:
    """Replica 0's faults, a DELAY taking no time, around a group that does nothing."""
    faults = ReplicaFaults(
        plan,
        0,
        group_rank=group_rank,
        group_world_size=group_world_size,
        delay_s=0.0,
        freeze_s=freeze_s,
        record=record,
        announce=_announce,
        on_fired=on_fired,
    )
    faults.wrap_process_group(ProcessGroupDummy())
    return faults


def test_a_fault_fires_once_at_the_first_step_at_or_past_its_plan() -> None:
    plan = FaultPlan({(0, 3): Fault.DELAY, (0, 7): Fault.DELAY, (1, 3): Fault.DELAY})
    fired: list[tuple[int, Fault, int]] = []
    faults = _faults(
        plan, on_fired=lambda planned, fault, step: fired.append((planned, fault, step))
    )
    assert faults.fire_due(2) is None
    assert faults.fire_due(8) == Fault.DELAY  # healed past step 3: it still fires
    assert faults.fire_due(8) == Fault.DELAY  # then the one planned at 7
    assert faults.fire_due(9) is None
    assert fired == [(3, Fault.DELAY, 8), (7, Fault.DELAY, 8)]  # never replica 1's
    assert faults.fired == {(0, 3), (0, 7)}


def test_a_held_back_fault_fires_only_once_released() -> None:
    faults = _faults(FaultPlan({(0, 3): Fault.DELAY}))
    assert faults.fire_due(5, released={}) is None
    assert faults.fire_due(5, released={3: 6}) is None
    assert faults.fire_due(6, released={3: 6}) == Fault.DELAY


def test_a_failed_allreduce_fails_the_wrapped_group_next_allreduce() -> None:
    faults = _faults(FaultPlan({(0, 1): Fault.FAIL_ALLREDUCE}))
    assert faults.pg is not None and not faults.pg.fail_next
    faults.fire_due(1)
    assert faults.pg.fail_next


@pytest.mark.parametrize(
    ("fault", "phase", "fails_the_step"),
    [
        (Fault.KILL_ALLREDUCE_BEFORE, Phase.ALLREDUCE_BEFORE, False),
        (Fault.KILL_COMMIT_AFTER, Phase.COMMIT_AFTER, False),
        (Fault.KILL_CONFIGURE, Phase.CONFIGURE, True),
        (Fault.KILL_HEALER, Phase.HEAL_RECV, True),
        (Fault.KILL_HEAL_SOURCE, Phase.HEAL_SEND, False),
    ],
)
def test_a_phase_fault_is_armed_at_its_phase(
    fault: Fault, phase: Phase, fails_the_step: bool
) -> None:
    faults = _faults(FaultPlan({(0, 1): fault}))
    faults.fire_due(1)
    assert faults.pg is not None and faults.pg.fail_next == fails_the_step
    faults.injector.hit(Phase.FORWARD)  # not armed there: nothing happens
    with pytest.raises(Announced) as announced:
        faults.injector.hit(phase)
    assert (announced.value.action, announced.value.phase) == (Action.DIE, phase)
    faults.injector.hit(phase)  # once only


def test_a_replica_kill_dies_after_the_forward() -> None:
    faults = _faults(FaultPlan({(0, 1): Fault.KILL_REPLICA}))
    assert faults.fire_due(1) == Fault.KILL_REPLICA
    with pytest.raises(Announced) as announced:
        faults.after_forward()
    assert (announced.value.action, announced.value.phase) == (Action.DIE, Phase.FORWARD)


def test_a_freeze_stops_the_rank_in_its_allreduce() -> None:
    faults = _faults(FaultPlan({(0, 1): Fault.FREEZE}), freeze_s=None)
    faults.fire_due(1)
    with pytest.raises(Announced) as announced:
        faults.injector.hit(Phase.ALLREDUCE_BEFORE)
    assert announced.value.action == Action.FREEZE


def test_a_partial_kill_arms_only_the_group_last_rank() -> None:
    plan = FaultPlan({(0, 1): Fault.PARTIAL_KILL})
    first = _faults(plan, group_rank=0, group_world_size=2)
    last = _faults(plan, group_rank=1, group_world_size=2)
    assert first.fire_due(1) == last.fire_due(1) == Fault.PARTIAL_KILL  # both fire it
    first.injector.hit(Phase.ALLREDUCE_AFTER)  # the first survives
    with pytest.raises(Announced):
        last.injector.hit(Phase.ALLREDUCE_AFTER)


def test_the_record_keeps_fired_faults_across_a_restart(tmp_path: Path) -> None:
    record = tmp_path / "faults.0.0"
    plan = FaultPlan({(0, 2): Fault.KILL_REPLICA, (0, 30): Fault.DELAY})
    before = _faults(plan, record=record)
    assert before.fire_due(2) == Fault.KILL_REPLICA  # recorded before it acts
    restarted = _faults(plan, record=record)  # a new process, healed to step 40
    assert restarted.fire_due(40) == Fault.DELAY  # the kill does not fire again
    assert _faults(plan, record=record).fired == {(0, 2), (0, 30)}


def test_faults_need_the_process_group_wrapped_first() -> None:
    faults = ReplicaFaults(FaultPlan({(0, 1): Fault.DELAY}), 0)
    with pytest.raises(RuntimeError, match="wrap_process_group"):
        faults.fire_due(1)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="group_rank"):
        ReplicaFaults(FaultPlan(), 0, group_rank=2, group_world_size=2)
    with pytest.raises(ValueError, match="freeze_s"):
        ReplicaFaults(FaultPlan(), 0, freeze_s=0.0)


def test_the_manager_heals_through_the_injector_whatever_transport_it_has() -> None:
    injector = Injector(_announce)
    given = FakeTransport()
    for transport in (given, FaultInjectingTransport(given, injector)):
        manager = FaultInjectingManager(
            SumGroup(),
            injector=injector,
            client=FakeClient([]),
            checkpoint_transport=transport,
            timeout=timedelta(seconds=5),
        )
        try:
            healing = manager._healer.transport
            assert isinstance(healing, FaultInjectingTransport)
            assert healing.inner is given  # wrapped once, never twice
            injector.arm(Phase.HEAL_RECV, Action.DIE)
            with pytest.raises(Announced):
                healing.recv_checkpoint(0, "", 1, timedelta(seconds=1))
        finally:
            manager.shutdown()

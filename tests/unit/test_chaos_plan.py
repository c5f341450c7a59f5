"""Fault plans: reproducible from a seed, spaced, every planned fault becomes due, any
replica may be hit, and a step's faults always leave one replica untouched."""

from __future__ import annotations

import itertools

import pytest

from torchft_pg.chaos import PHASE_FAULTS, Fault, FaultPlan


def test_same_seed_same_plan_and_spacing() -> None:
    a = FaultPlan.random(seed=3, replicas=4, steps=120, kills=10, other_faults=3, gap=8)
    b = FaultPlan.random(seed=3, replicas=4, steps=120, kills=10, other_faults=3, gap=8)
    assert a.faults == b.faults
    assert a.count(Fault.KILL_REPLICA) == 10 and len(a.faults) == 13
    steps = sorted(s for _, s in a.faults)
    assert all(y - x >= 8 for x, y in itertools.pairwise(steps))
    for replica in range(4):
        own = sorted(s for r, s in a.faults if r == replica)
        assert all(y - x >= 24 for x, y in itertools.pairwise(own))


def test_a_fault_fires_at_the_first_step_at_or_past_its_plan() -> None:
    plan = FaultPlan({(1, 5): Fault.KILL_REPLICA, (1, 9): Fault.DELAY})
    fired: set[tuple[int, int]] = set()
    assert plan.due(1, 4, fired) is None
    assert plan.due(1, 12, fired) == (5, Fault.KILL_REPLICA)  # healed past step 5: still fires
    fired.add((1, 5))
    assert plan.due(1, 12, fired) == (9, Fault.DELAY)
    fired.add((1, 9))
    assert plan.due(1, 12, fired) is None
    assert plan.due(0, 12, fired) is None


def test_impossible_plans_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="need 42 steps, got 30"):
        FaultPlan.random(seed=1, replicas=3, steps=30, kills=10, gap=4)
    with pytest.raises(ValueError, match="at least 2 replicas"):
        FaultPlan.random(seed=1, replicas=1, steps=100, kills=1)


def test_every_replica_is_killed_replica_0_included() -> None:
    plan = FaultPlan.random(seed=5, replicas=3, steps=400, kills=30, gap=8)
    killed = {r for (r, _), f in plan.faults.items() if f == Fault.KILL_REPLICA}
    assert killed == {0, 1, 2}


def test_phase_faults_pair_each_heal_source_with_its_healer() -> None:
    plan = FaultPlan.random(
        seed=1, replicas=4, steps=900, kills=10, other_faults=60, gap=12, kinds=PHASE_FAULTS
    )
    assert {f for f in plan.faults.values()} >= set(PHASE_FAULTS)
    for (source, step), fault in plan.faults.items():
        if fault != Fault.KILL_HEAL_SOURCE:
            continue
        healers = [
            r for (r, s), f in plan.faults.items() if s == step and f == Fault.FAIL_ALLREDUCE
        ]
        assert len(healers) >= 1
        # A single healer is served by the lowest-numbered up-to-date replica.
        assert source == min(r for r in range(4) if r != healers[0])


def test_overlapping_faults_leave_one_replica_untouched() -> None:
    plan = FaultPlan.random(
        seed=2,
        replicas=3,
        steps=600,
        kills=20,
        other_faults=20,
        gap=12,
        kinds=PHASE_FAULTS,
        overlaps=25,
    )
    by_step: dict[int, list[Fault]] = {}
    for (_, step), fault in plan.faults.items():
        by_step.setdefault(step, []).append(fault)
    assert any(len(fs) > 1 for fs in by_step.values())  # some steps do overlap
    for faults in by_step.values():
        assert sum(1 for f in faults if f != Fault.RESTART_LIGHTHOUSE) < 3
    assert plan.groups() == sorted(by_step)


def test_a_fault_waits_for_its_release() -> None:
    plan = FaultPlan({(1, 5): Fault.KILL_REPLICA})
    assert plan.due(1, 7, set(), released={}) is None
    assert plan.due(1, 7, set(), released={5: 9}) is None  # released for step 9
    assert plan.due(1, 9, set(), released={5: 9}) == (5, Fault.KILL_REPLICA)
    assert plan.due(1, 7, set()) == (5, Fault.KILL_REPLICA)  # no supervisor: no gating

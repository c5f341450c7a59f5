"""Fault plans: reproducible from a seed, spaced, and every planned fault becomes due."""

from __future__ import annotations

import itertools

import pytest

from torchft_pg.chaos import Fault, FaultPlan


def test_same_seed_same_plan_and_spacing() -> None:
    a = FaultPlan.random(seed=3, replicas=4, steps=120, kills=10, other_faults=3, gap=8)
    b = FaultPlan.random(seed=3, replicas=4, steps=120, kills=10, other_faults=3, gap=8)
    assert a.faults == b.faults
    assert a.count(Fault.KILL_REPLICA) == 10 and len(a.faults) == 13
    assert all(
        r != 0 for (r, _), f in a.faults.items() if f == Fault.KILL_REPLICA
    )  # replica 0 survives
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

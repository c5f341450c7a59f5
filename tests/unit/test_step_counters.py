"""Step counters and how a commit vote moves them: pure bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from torchft_pg.manager.step_counters import StepCounters, checked_counters


def test_a_commit_counts_a_step_and_its_participants() -> None:
    c = StepCounters(step=4, batches_committed=10, commit_failures=2)
    c.settle(True, participants=3, healed=None)
    assert (c.step, c.batches_committed, c.commit_failures) == (5, 13, 0)


def test_a_discarded_step_counts_only_a_failure() -> None:
    c = StepCounters(step=4, batches_committed=10, commit_failures=2)
    c.settle(False, participants=3, healed={"step": 9, "batches_committed": 30})
    assert (c.step, c.batches_committed, c.commit_failures) == (4, 10, 3)


def test_a_committed_heal_adopts_the_sources_counters_then_counts_the_step() -> None:
    c = StepCounters(step=1, batches_committed=1)
    c.begin_quorum()
    c.healed = {"step": 9, "batches_committed": 30}
    assert c.current_step() == 9  # the step the healer votes on
    assert c.quorum_step == 1  # the step it asked its quorum for
    healed = c.take_healed()
    assert c.healed is None and c.current_step() == 1
    c.settle(True, participants=2, healed=healed)
    assert (c.step, c.batches_committed) == (10, 32)


def test_begin_quorum_forgets_an_unsettled_heal() -> None:
    c = StepCounters(step=3)
    c.healed = {"step": 9, "batches_committed": 0}
    c.begin_quorum()
    assert c.healed is None and c.quorum_step == 3


def test_state_dict_round_trips() -> None:
    c = StepCounters(step=5, batches_committed=11, commit_failures=1)
    d = StepCounters()
    d.load_state_dict(c.state_dict())
    assert d.state_dict() == {"step": 5, "batches_committed": 11}


@pytest.mark.parametrize(
    ("state", "names"),
    [
        ({"step": 2**63, "batches_committed": 0}, "step"),
        ({"step": -1, "batches_committed": 0}, "step"),
        ({"step": True, "batches_committed": 0}, "step"),
        ({"step": 1, "batches_committed": "2"}, "batches_committed"),
    ],
)
def test_checked_counters_name_the_bad_counter(state: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError, match=f"{names} must be an int >= 0 and < 2\\*\\*63"):
        checked_counters(state)


def test_checked_counters_keep_only_the_counters() -> None:
    state = {"step": 2**63 - 1, "batches_committed": 0, "extra": 1}
    assert checked_counters(state) == {"step": 2**63 - 1, "batches_committed": 0}

"""CommittedStep: the job's committed step from what a quorum's members reach together."""

from __future__ import annotations

import pytest

from lighthouse.coordinator.committed import CommittedStep, Together


def test_nothing_counts_until_every_member_reported_after_the_issue() -> None:
    c = CommittedStep(10)
    c.issued(["a", "b"])
    assert c.reported("a", 11) is None and c.step == 10  # b has not reported
    assert c.reported("b", 11) == Together(step=11, members=("a", "b"), committed=True)
    assert (c.step, c.members) == (11, 2)


def test_the_least_step_counts_so_a_member_lying_high_changes_nothing() -> None:
    c = CommittedStep(10)
    c.issued(["a", "liar"])
    c.reported("liar", 2**62)
    together = c.reported("a", 11)
    assert together is not None and together.step == 11 and c.step == 11


def test_a_member_that_vanishes_stops_counting_and_adds_nothing_by_leaving() -> None:
    c = CommittedStep(10)
    c.issued(["a", "b", "ghost"])
    c.reported("ghost", 2**62)
    c.reported("a", 11)
    c.gone("ghost")
    assert c.step == 10  # its departure alone commits nothing
    assert c.reported("b", 11) == Together(step=11, members=("a", "b"), committed=True)
    assert c.members == 2  # the ghost never counted in the size either


def test_a_failed_commit_is_no_proof_and_the_step_never_goes_down() -> None:
    c = CommittedStep(10)
    c.issued(["a", "b"])
    c.reported("a", 10, failed=True)
    together = c.reported("b", 11)
    assert together == Together(step=10, members=("a", "b"), committed=False)
    assert c.step == 10
    c.issued(["a"])
    c.reported("a", 3)  # lower than committed: the committed step stays
    assert c.step == 10


def test_reports_outside_the_tracked_quorum_and_repeats_say_nothing() -> None:
    c = CommittedStep()
    c.issued(["a"])
    assert c.reported("stranger", 99) is None
    assert c.reported("a", 5) is not None
    assert c.reported("a", 5) is None  # said already: a lease's pings stay O(1)
    assert c.reported("a", 6) is not None and c.step == 6


def test_an_allowed_reset_lowers_it() -> None:
    c = CommittedStep(500)
    c.reset(0)
    assert c.step == 0
    c.reset(7)
    assert c.step == 0  # a reset never raises it


@pytest.mark.parametrize(("step", "members"), [(-1, 0), (True, 0), (0, -1), (1.5, 0)])
def test_bad_starting_values_are_refused_naming_them(step: object, members: object) -> None:
    with pytest.raises(ValueError, match="must be an int >= 0"):
        CommittedStep(step, members)  # type: ignore[arg-type]

"""`ProgressWatch`: a chaos run fails as hung only once nothing happened for its stall
bound, or past its overall bound, on a clock the test steps by hand (seconds)."""

from __future__ import annotations

import pytest

from tests.chaos_support.progress import ProgressWatch


def test_a_slow_run_that_keeps_progressing_is_not_hung() -> None:
    """Progress every 100 s for 1000 s: a fixed 150 s deadline failed such a run (a
    busy machine), a 120 s stall bound does not."""
    watch = ProgressWatch(stall_s=120, deadline_s=1800, started=5000)
    for now in range(5000, 6001, 100):
        assert watch.failure(now) is None, now
        watch.progressed(now, f"a step at {now}")
    assert watch.failure(6119.9) is None
    assert watch.left(6100) == pytest.approx(20)


def test_nothing_for_the_stall_bound_is_a_hang_naming_the_last_progress() -> None:
    watch = ProgressWatch(stall_s=120, deadline_s=1800, started=0)
    watch.progressed(30.0, "StepEnded from replica 1 rank 0")
    assert watch.failure(149.9) is None
    assert watch.left(149.9) == pytest.approx(0.1)
    assert watch.failure(150.0) == (
        "no progress for 120 s (hang?): nothing from any rank since StepEnded from "
        "replica 1 rank 0, 30.0 s into the run"
    )


def test_the_start_counts_as_progress_and_a_clock_going_back_is_ignored() -> None:
    watch = ProgressWatch(stall_s=10, deadline_s=100, started=0)
    assert watch.failure(9.9) is None
    assert watch.failure(10.0) is not None  # no process ever sent anything
    watch.progressed(8.0, "Ready from replica 0 rank 0")
    watch.progressed(7.0, "an older reading")  # the later reading stays
    assert watch.last == 8.0 and watch.last_what == "Ready from replica 0 rank 0"


def test_the_overall_bound_ends_a_run_that_progresses_for_ever() -> None:
    watch = ProgressWatch(stall_s=120, deadline_s=900, started=0)
    for now in range(0, 900, 60):
        watch.progressed(now, "StepEnded (discarded) from replica 0 rank 0")
        assert watch.failure(now) is None
    assert watch.left(880) == pytest.approx(20)  # the overall bound comes first
    failure = watch.failure(900)
    assert failure is not None and failure.startswith("run did not finish within 900 s")


@pytest.mark.parametrize(
    ("stall_s", "deadline_s", "message"),
    [
        (0, 10, "stall_s must be > 0 seconds, got 0"),
        (float("nan"), 10, "stall_s must be > 0 seconds, got nan"),
        (60, 30, "deadline_s must be >= stall_s (60 s), got 30"),
    ],
)
def test_bad_bounds_are_named(stall_s: float, deadline_s: float, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ProgressWatch(stall_s=stall_s, deadline_s=deadline_s, started=0)

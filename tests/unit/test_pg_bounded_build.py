"""`build_within`: a blocking constructor bounded by a deadline and an interrupt flag."""

from __future__ import annotations

import queue
import threading

import pytest

from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError
from torchft_pg.process_group._bounded_build import Abandoned, build_within


class Blocked:
    """A constructor that returns `value` once `release` is set (or raises `error`)."""

    def __init__(self, value: object = "backend", error: BaseException | None = None) -> None:
        self.release = threading.Event()
        self.value, self.error = value, error

    def __call__(self) -> object:
        assert self.release.wait(10)
        if self.error is not None:
            raise self.error
        return self.value


def _run(
    build: Blocked, timeout_s: float, interrupted: threading.Event
) -> tuple[object, queue.Queue[object]]:
    late: queue.Queue[object] = queue.Queue()
    try:
        got: object = build_within(
            build,
            timeout_s=timeout_s,
            interrupted=interrupted,
            interrupt_reason=lambda: "replica r2 died",
            on_abandoned=late.put,
            what="a test backend",
        )
    except Exception as e:
        got = e
    return got, late


def test_a_build_done_in_time_is_returned_and_nothing_is_abandoned() -> None:
    build = Blocked()
    build.release.set()
    got, late = _run(build, 5, threading.Event())
    assert got == "backend" and late.empty()


def test_an_error_raised_in_time_is_the_callers() -> None:
    build = Blocked(error=RuntimeError("Connect timeout"))
    build.release.set()
    got, late = _run(build, 5, threading.Event())
    assert isinstance(got, RuntimeError) and not isinstance(got, Abandoned) and late.empty()


def test_at_the_deadline_the_caller_gets_a_timeout_and_the_late_backend_is_disposed_of() -> None:
    build = Blocked()
    got, late = _run(build, 0.1, threading.Event())
    assert isinstance(got, ProcessGroupTimeoutError) and isinstance(got, Abandoned)
    assert "a test backend" in str(got) and "0.1 s" in str(got)
    assert late.empty()  # still building
    build.release.set()
    assert late.get(timeout=5) == "backend"  # handed over once it returns


def test_an_interrupt_ends_the_wait_at_once_naming_the_reason() -> None:
    build, flag = Blocked(), threading.Event()
    flag.set()
    got, late = _run(build, 30, flag)
    assert isinstance(got, ProcessGroupAbortedError) and isinstance(got, Abandoned)
    assert "replica r2 died" in str(got)
    build.release.set()
    assert late.get(timeout=5) == "backend"


def test_a_late_failure_gives_the_disposer_none() -> None:
    build = Blocked(error=RuntimeError("refused"))
    got, late = _run(build, 0.05, threading.Event())
    assert isinstance(got, ProcessGroupTimeoutError)
    build.release.set()
    assert late.get(timeout=5) is None


@pytest.mark.parametrize("attempt", range(20))
def test_a_build_finishing_at_the_deadline_goes_to_exactly_one_owner(attempt: int) -> None:
    """Whichever side wins the race, the backend is either returned or disposed of, once."""
    build = Blocked()
    timer = threading.Timer(0.02, build.release.set)
    timer.start()
    got, late = _run(build, 0.02, threading.Event())
    timer.join()
    if got == "backend":
        assert late.empty()
    else:
        assert isinstance(got, ProcessGroupTimeoutError)
        assert late.get(timeout=5) == "backend"
    assert late.empty()

"""A wait on a ProcessGroupGloo collective: first in Gloo's own wait, then abortable.

`AbortableWork.wait` first blocks in the backend's own ``wait`` for at most
`AbortableWork.FIRST_WAIT_S` (what keeps a small op as cheap as a plain Gloo
wait), then on whichever of the op's completion and the abort signal comes
first. These tests pin what that must not change: an op that outlives the
first wait still completes with its result, and an abort fails a wait within
the first wait's bound, never at the group's timeout.

Two members are threads of this process; member 0 posts its op only when a
test says so, so member 1's op outlives any wait the test wants it to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch

from tests.integration.gloo_pair import gloo_pair
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupGloo, ProcessGroupTimeoutError
from torchft_pg.errors import ProcessGroupAbortedError
from torchft_pg.work import AbortableWork

GROUP_TIMEOUT = timedelta(seconds=30)  # far longer than any wait below: it must not end one
SLACK_S = 1.5  # scheduling delay a loaded CI machine may add past a deadline


@pytest.fixture
def pair() -> Iterator[list[ProcessGroupGloo]]:
    """Two configured members of one Gloo group; aborted (in-flight ops fail) afterwards."""
    with gloo_pair("gloo-wait", GROUP_TIMEOUT) as pgs:
        yield pgs


def test_an_op_that_outlives_the_first_wait_completes_with_its_result(
    pair: list[ProcessGroupGloo],
) -> None:
    first, second = pair
    mine = torch.full((4,), 2.0)
    work = second.allreduce([mine])
    # Longer than the first wait in Gloo: that one times out inside the backend,
    # and the op must go on running (a Gloo send or recv would fail there).
    with pytest.raises(ProcessGroupTimeoutError, match=r"0\.050 s passed to wait"):
        work.wait(timedelta(milliseconds=50))
    assert not work.is_completed()
    first.allreduce([torch.ones(4)]).wait()
    assert work.wait() is True
    assert mine.tolist() == [3.0] * 4


def test_a_fresh_op_completes_in_the_first_wait_and_again_on_a_second_wait(
    pair: list[ProcessGroupGloo],
) -> None:
    first, second = pair
    ones = [torch.ones(4), torch.ones(4)]
    works = run_in_threads(
        [lambda: first.allreduce([ones[0]]), lambda: second.allreduce([ones[1]])]
    )
    assert run_in_threads([w.wait for w in works]) == [True, True]
    assert all(w.wait() for w in works)  # a completed work's wait returns at once
    assert [t.tolist() for t in ones] == [[2.0] * 4] * 2


def test_an_explicit_timeout_shorter_than_the_first_wait_bounds_the_wait(
    pair: list[ProcessGroupGloo],
) -> None:
    _, second = pair
    assert AbortableWork.FIRST_WAIT_S > 0.005
    work = second.allreduce([torch.ones(4)])  # member 0 never joins
    start = time.monotonic()
    with pytest.raises(ProcessGroupTimeoutError, match=r"0\.005 s passed to wait"):
        work.wait(timedelta(milliseconds=5))
    assert time.monotonic() - start < SLACK_S


@pytest.mark.parametrize("first_wait_over", [False, True], ids=["fresh", "after-first-wait"])
def test_an_abort_fails_a_blocked_wait_within_the_first_wait(
    pair: list[ProcessGroupGloo], first_wait_over: bool
) -> None:
    """Whether the abort lands before the wait, during Gloo's own first wait or
    after it, the waiter fails at once (within `FIRST_WAIT_S`), not at the
    group's 30 s timeout."""
    _, second = pair
    work = second.allreduce([torch.ones(4)])  # member 0 never joins
    if first_wait_over:
        with pytest.raises(ProcessGroupTimeoutError):
            work.wait(timedelta(milliseconds=20))
    outcome: list[BaseException] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        try:
            work.wait()
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    started.wait(10)
    start = time.monotonic()
    second.abort()
    thread.join(AbortableWork.FIRST_WAIT_S + SLACK_S)
    assert not thread.is_alive(), "abort() did not end a blocked wait"
    assert time.monotonic() - start < AbortableWork.FIRST_WAIT_S + SLACK_S
    assert len(outcome) == 1 and isinstance(outcome[0], ProcessGroupAbortedError), outcome

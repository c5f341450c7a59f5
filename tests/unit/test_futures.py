"""torchft's future helpers: deadlines on futures and blocks, on one watchdog thread."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from torch.futures import Future

from torchft_pg.futures import (
    Watchdog,
    context_timeout,
    future_timeout,
    future_wait,
    stream_timeout,
    watchdog,
)

SHORT = timedelta(milliseconds=50)
LONG = timedelta(seconds=10)


def test_future_timeout_passes_the_value_through() -> None:
    fut: Future[int] = Future()
    out = future_timeout(fut, LONG)
    fut.set_result(7)
    assert out.wait() == 7


def test_future_timeout_passes_the_error_through() -> None:
    fut: Future[Any] = Future()  # torch's stub types set_exception's argument as the value type
    out = future_timeout(fut, LONG)
    fut.set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        out.wait()


def test_future_timeout_fails_with_timeout_error_naming_the_timeout() -> None:
    fut: Future[int] = Future()
    out = future_timeout(fut, SHORT)
    with pytest.raises(TimeoutError, match=r"0:00:00\.05"):
        out.wait()
    fut.set_result(1)  # a late result changes nothing
    assert out.done() and fut.wait() == 1


def test_future_wait() -> None:
    fut: Future[int] = Future()
    threading.Timer(0.01, lambda: fut.set_result(3)).start()
    assert future_wait(fut, LONG) == 3
    with pytest.raises(TimeoutError):
        future_wait(Future(), SHORT)


def test_context_timeout_calls_back_only_when_the_block_overstays() -> None:
    fired = threading.Event()
    with context_timeout(fired.set, LONG):
        pass
    with context_timeout(fired.set, SHORT):
        assert fired.wait(5.0)  # the block is still running: the callback fires
    # a cancelled handle is dropped at its deadline; one that already ran is never kept
    assert watchdog._cancelled <= watchdog._pending


def test_bad_timeouts_are_refused_naming_the_value() -> None:
    with pytest.raises(TypeError, match="timedelta, got 5"):
        future_timeout(Future(), 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timedelta"):
        stream_timeout(lambda: None, 1.0)  # type: ignore[arg-type]


def test_a_stuck_callback_does_not_stop_later_deadlines() -> None:
    stuck, release, later = threading.Event(), threading.Event(), threading.Event()

    def block() -> None:
        stuck.set()
        release.wait(10.0)

    with context_timeout(block, SHORT):
        assert stuck.wait(5.0)
    try:
        never: Future[None] = Future()
        out = future_timeout(never, SHORT)  # due while `block` still runs
        out.add_done_callback(lambda _: later.set())
        assert later.wait(5.0)
        with pytest.raises(TimeoutError):
            out.wait()
    finally:
        release.set()


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0
        self.timed_wait = threading.Event()  # the watchdog waits for a deadline

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.timed_wait.set()
        return super().wait(timeout)

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_only_a_deadline_earlier_than_the_awaited_one_wakes_the_watchdog() -> None:
    wd = Watchdog()
    cond = _CountingCondition()
    wd._cond = cond
    first = threading.Event()
    wd.schedule(LONG, first.set)  # starts the thread, which then waits for LONG
    assert cond.timed_wait.wait(5.0)
    for _ in range(50):  # later deadlines, cancelled in time: nobody is woken
        wd.cancel(wd.schedule(LONG * 2, first.set))
    assert cond.notified == 0
    early = threading.Event()
    wd.schedule(SHORT, early.set)  # earlier than the awaited one: it must wake
    assert early.wait(5.0) and cond.notified == 1
    assert not first.is_set()


def test_a_live_deadline_behind_cancelled_ones_still_fires() -> None:
    wd = Watchdog()
    fired: list[str] = []
    done = threading.Event()
    for _ in range(5):
        wd.cancel(wd.schedule(SHORT, lambda: fired.append("cancelled")))

    def live() -> None:
        fired.append("live")
        done.set()

    wd.schedule(SHORT * 2, live)
    assert done.wait(5.0)
    assert fired == ["live"]


def test_cancelled_deadlines_are_compacted_away() -> None:
    wd = Watchdog(compact_after=8)
    live = wd.schedule(LONG, lambda: None)
    for _ in range(20):
        wd.cancel(wd.schedule(LONG * 2, lambda: None))  # behind the live head
    assert len(wd._heap) <= 1 + 8 and len(wd._cancelled) < 8
    assert live in wd._pending and wd._cancelled <= wd._pending
    wd.cancel(live)

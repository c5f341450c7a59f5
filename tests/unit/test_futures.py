"""torchft's future helpers: deadlines on futures and blocks, on one watchdog thread."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from torch.futures import Future

from torchft_pg.futures import (
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

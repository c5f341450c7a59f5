"""Work helpers: completed works and works whose failures are swallowed.

c10d code (DDP's reducer, functional collectives) only ever calls `wait()`
and `get_future()` on a Work, so these are the two methods that matter.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed import Work
from torch.futures import Future

from torchft_pg import _torch_internals
from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError
from torchft_pg.futures import ProxyFuture, future_for

__all__ = [
    "AbortSignal",
    "AbortableWork",
    "CompletedWork",
    "ErrorSwallowingWork",
    "FailedWork",
    "ManagedWork",
    "completed_future",
    "completed_work",
]


def completed_future(value: Any) -> Future[Any]:
    fut: Future[Any] = future_for(value)
    fut.set_result(value)
    return fut


class CompletedWork(Work):
    """A Work that is already done: `wait()` returns True, the future yields `value`.

    torchft's tests know it as ``_DummyWork`` (the name is exported too)."""

    def __init__(self, value: Any = None) -> None:
        super().__init__()
        self._future = completed_future(value)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def get_future(self) -> Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


_DummyWork = CompletedWork  # torchft's private name for it


def completed_work(value: Any = None) -> Work:
    """A Work that is already done and whose future yields `value`."""
    return CompletedWork(value)


class FailedWork(Work):
    """A Work that failed with `error`, as a backend's does when a peer dies."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self._error = error

    def wait(self, timeout: timedelta | None = None) -> bool:
        raise self._error

    def get_future(self) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_exception(self._error)
        return fut


class ManagedWork(Work):
    """The Manager's collective: its future never raises (errors yield the default)
    and always completes, at the latest at the proxy's deadline."""

    def __init__(self, proxy: ProxyFuture[Any]) -> None:
        super().__init__()
        self._proxy = proxy

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._proxy.future.wait()
        return True

    def get_future(self) -> Future[Any]:
        return self._proxy.future

    def is_completed(self) -> bool:
        return self._proxy.done

    @property
    def succeeded(self) -> bool:
        """Whether the op itself completed this work with a value (see `ProxyFuture.succeeded`)."""
        return self._proxy.succeeded


class ErrorSwallowingWork(Work):
    """Wraps a Work so that a failure is reported, never raised.

    `wait()` returns False after reporting; the future yields `default` (the
    collective's output tensors, untouched) instead of an exception, so DDP's
    reducer carries on and the step is rejected by the commit vote instead.
    """

    def __init__(self, work: Work, report: Callable[[Exception], None], default: Any) -> None:
        super().__init__()
        self._work = work
        self._report = report
        self._default = default

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(timeout)
        except Exception as e:
            self._report(e)
            return False
        return True

    def get_future(self) -> Future[Any]:
        default = self._default

        def swallow(fut: Future[Any]) -> Any:
            try:
                return fut.value()
            except Exception as e:
                self._report(e)
                return default

        return self._work.get_future().then(swallow)

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def synchronize(self) -> None:
        try:
            self._work.synchronize()
        except Exception as e:
            self._report(e)

    def _source_rank(self) -> int:
        return _torch_internals.source_rank(self._work)


class AbortSignal:
    """Fails every in-flight `AbortableWork` of one backend at once when fired.

    A Gloo backend's own ``abort()`` does not wake a thread blocked in
    ``wait()``: that thread sleeps until the op's timeout. Our works' waiters
    are woken by whichever comes first, the op's completion or this signal.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[Callable[[], None]] = set()
        self.error: Exception | None = None

    def fire(self, error: Exception) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = error
            waiters, self._waiters = self._waiters, set()
        for wake in waiters:
            wake()

    def add(self, wake: Callable[[], None]) -> bool:
        """Call `wake` when fired; False (and no call) if already fired."""
        with self._lock:
            if self.error is not None:
                return False
            self._waiters.add(wake)
            return True

    def discard(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._waiters.discard(wake)


class AbortableWork(Work):
    """A backend's Work whose `wait` and future fail at once when `signal` fires.

    `outputs` is what the future yields; `timeout` (the group's) bounds a
    `wait()` without its own timeout, plus `BACKSTOP_GRACE_S`: the backend
    applies the same timeout itself and its error (which names the cause)
    should win. An explicit ``wait(timeout)`` is bounded by that timeout alone,
    as a c10d Work's is. Some Gloo works (send, recv, reduce_scatter) have no
    future and only progress inside ``wait()``: a daemon thread waits for
    those, so the caller's wait stays abortable and they get a future too.
    The first wait's explicit timeout is handed to that thread's backend
    ``wait``, so Gloo fails the op at that timeout exactly as a plain Gloo
    work would (and closes the pair to that peer, so a later op to it fails at
    once instead of waiting out its own timeout: what torchft's transport
    tests rely on).

    A `wait` on a work with a future of its own first blocks in the backend's
    own wait for at most `FIRST_WAIT_S`, so that the small op, which nearly
    always finishes within it, costs what a plain Gloo wait costs; an abort
    fired during that first wait fails it when the first wait ends (see `wait`).
    """

    BACKSTOP_GRACE_S = 2.0
    FIRST_WAIT_S = 0.01  # the longest `wait` first blocks in the backend's own wait (s)
    # c10d counts whole milliseconds and reads 0 ms as "no timeout" (wait forever).
    _FIRST_WAIT = timedelta(milliseconds=max(1, round(FIRST_WAIT_S * 1000)))

    def __init__(
        self, work: Work, signal: AbortSignal, timeout: timedelta, outputs: Any = None
    ) -> None:
        super().__init__()
        self._work = work
        self._signal = signal
        self._timeout = timeout
        self._outputs = outputs
        self._future: Future[Any] | None = None  # see _completion
        self._own_future: Future[Any] | None = None  # see _backend_future
        self._asked_for_future = False

    def _aborted(self) -> Exception:
        return ProcessGroupAbortedError(f"collective aborted: {self._signal.error}")

    def _backend_future(self) -> Future[Any] | None:
        """The backend work's own future; None for a work without one (asked once)."""
        if not self._asked_for_future:
            self._asked_for_future = True
            try:  # noqa: SIM105  (suppress() costs ~0.5 us, and this runs on every op)
                self._own_future = self._work.get_future()
            except RuntimeError:  # "Work::getFuture not implemented"
                pass
        return self._own_future

    def _completion(self, wait_timeout: timedelta | None = None) -> Future[Any]:
        """A future completed when the backend's work is (its own, else a waiter's).

        A waiter started here runs the backend's ``wait(wait_timeout)``, or with
        the group's timeout when `wait_timeout` is None.
        """
        if self._future is None:
            own = self._backend_future()
            if own is None:
                own = _waited_future(self._work, wait_timeout or self._timeout, self._outputs)
            self._future = own
        return self._future

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the op finished; raise its error, or on abort or timeout.

        `timeout`: None (or zero, what c10d's C++ callers pass) waits up to the
        group's timeout plus `BACKSTOP_GRACE_S`; any other value bounds this
        wait alone and, for an op without a future whose waiter is not running
        yet, is the timeout of the backend's own wait (see the class doc).

        The first wait on an op with a future of its own (and a timeout of at
        least `FIRST_WAIT_S`) blocks first in the backend's own ``wait``, for at
        most `FIRST_WAIT_S` (10 ms): Gloo's worker thread then wakes this one
        itself, as in a plain Gloo wait. Waking it from a done-callback instead
        makes that worker take the GIL and run Python, then hand the GIL back:
        15-23% more time per 4 KiB op between two processes on a loaded 2-core
        host (`bench/collectives.py`). An abort
        during those 10 ms is raised when they end; after them, the waiter is
        woken by the first of the op's completion and the abort signal. This
        path runs on every op, so it does as little as it can.
        """
        if (
            self._future is None
            and self._signal.error is None
            and (timeout is None or not timeout or timeout >= self._FIRST_WAIT)
            and self._backend_future() is not None
        ):
            work = self._work
            try:
                return bool(work.wait(self._FIRST_WAIT))
            except RuntimeError:  # "Operation timed out!", or the op's own error
                if work.is_completed():
                    return bool(work.wait())  # its result, or its own error
            return self._wait_abortably(timeout, waited_s=self.FIRST_WAIT_S)
        return self._wait_abortably(timeout)

    def _wait_abortably(self, timeout: timedelta | None, waited_s: float = 0.0) -> bool:
        """`wait`, woken by the first of the op's completion and the abort signal;
        `waited_s`: how long `wait` already waited (s), deducted from its bound."""
        work = self._work
        if self._future is None and work.is_completed():
            return bool(work.wait())
        if self._signal.error is not None:
            raise self._aborted()
        explicit = timeout if timeout is not None and timeout > timedelta(0) else None
        if explicit is not None:
            limit_s = explicit.total_seconds()
        else:
            limit_s = self._timeout.total_seconds() + self.BACKSTOP_GRACE_S
        # A SimpleQueue, not an Event: the completion callback runs on Gloo's
        # worker thread, and `put` is C code, so that thread runs no Python frame
        # and holds the GIL only briefly (an Event's `set` is a Condition's
        # notify, in Python: ~25 us more per op, measured on a loaded 2-core host).
        wake: queue.SimpleQueue[object] = queue.SimpleQueue()
        on_abort = functools.partial(wake.put, None)
        if not self._signal.add(on_abort):
            raise self._aborted()
        try:
            future = self._completion(explicit)
            future.add_done_callback(wake.put)
            with contextlib.suppress(queue.Empty):
                wake.get(timeout=max(0.0, limit_s - waited_s))
        finally:
            self._signal.discard(on_abort)
        if not future.done():
            if self._signal.error is not None:
                raise self._aborted()
            if explicit is not None:
                bound = f"the {limit_s:.3f} s passed to wait()"
            else:
                bound = f"the group's timeout {self._timeout} + {self.BACKSTOP_GRACE_S} s"
            raise ProcessGroupTimeoutError(
                f"collective timed out: it did not finish within {bound}"
            )
        future.value()  # raises the op's own error
        return True

    def get_future(self) -> Future[Any]:
        inner = self._completion()
        out: Future[Any] = future_for(self._outputs)
        lock = threading.Lock()
        settled = [False]

        def settle(value: Any = None, error: Exception | None = None) -> None:
            with lock:
                if settled[0]:
                    return
                settled[0] = True
            if error is not None:
                out.set_exception(error)
            else:
                out.set_result(value)

        def on_done(fut: Future[Any]) -> None:
            try:
                value = fut.value()
            except Exception as e:
                settle(error=e)
                return
            settle(value)

        def on_abort() -> None:
            settle(error=self._aborted())

        if not self._signal.add(on_abort):
            on_abort()
        inner.add_done_callback(on_done)
        out.add_done_callback(lambda _: self._signal.discard(on_abort))
        return out

    def is_completed(self) -> bool:
        if self._future is not None:
            return self._future.done()
        return bool(self._work.is_completed())

    def is_success(self) -> bool:
        return bool(self._work.is_success())

    def exception(self) -> Any:
        return self._work.exception()

    def synchronize(self) -> None:
        self._work.synchronize()

    def _source_rank(self) -> int:
        return _torch_internals.source_rank(self._work)


def _waited_future(work: Work, timeout: timedelta, outputs: Any) -> Future[Any]:
    fut: Future[Any] = future_for(outputs)

    def run() -> None:
        try:
            work.wait(timeout)
        except Exception as e:
            fut.set_exception(e)
            return
        fut.set_result(outputs)

    threading.Thread(target=run, name="torchft_pg-work-wait", daemon=True).start()
    return fut

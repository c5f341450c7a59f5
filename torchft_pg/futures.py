"""Futures with deadlines, on one watchdog thread for the whole process.

`ProxyFuture` is completed by whichever comes first: the real result, an
error, the deadline, or an explicit `abort` (the Manager aborts every
in-flight collective when the lighthouse reports a dead peer, instead of
waiting for the collective's own timeout).

torchft's helpers, same names and arguments: `future_timeout` (a future that
fails with `TimeoutError` after `timeout`), `future_wait` (wait at most
`timeout`), `context_timeout` (call back if a block outlives `timeout`) and
`stream_timeout` (call back if the current CUDA stream has not reached this
point after `timeout`). Every timeout is a `datetime.timedelta`.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Generic, TypeVar

import torch
from torch.futures import Future

__all__ = [
    "ProxyFuture",
    "Watchdog",
    "context_timeout",
    "future_for",
    "future_timeout",
    "future_wait",
    "stream_timeout",
    "tensors_in",
    "watchdog",
]

T = TypeVar("T")


class Watchdog:
    """Runs callbacks at deadlines on a single daemon thread (started lazily).

    Nearly every deadline is cancelled (a collective finished in time), so the
    thread is woken only by a deadline earlier than every one it waits for,
    and drops the cancelled deadlines at the head of its queue without waiting
    for them: an allreduce per bucket costs no thread wake-up, and the thread
    sleeps until the earliest deadline still live. `compact_after` cancelled
    entries left behind a live one are removed in one pass, bounding memory.
    """

    def __init__(self, compact_after: int = 4096) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._pending: set[int] = set()  # scheduled and not yet run
        self._cancelled: set[int] = set()
        self._compact_after = compact_after
        self._thread: threading.Thread | None = None
        self._waiting_until: float | None = None  # the thread's wake-up time (None: none)

    def schedule(self, delay: timedelta, callback: Callable[[], None]) -> int:
        """Call `callback` after `delay`; returns a handle for `cancel`."""
        handle = next(self._ids)
        deadline = time.monotonic() + delay.total_seconds()
        with self._cond:
            heapq.heappush(self._heap, (deadline, handle, callback))
            self._pending.add(handle)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="torchft_pg-watchdog", daemon=True
                )
                self._thread.start()
            elif self._waiting_until is None or deadline < self._waiting_until:
                self._cond.notify()
        return handle

    def cancel(self, handle: int) -> None:
        """Do not run `handle`'s callback (no effect once it has run)."""
        with self._cond:
            if handle not in self._pending:
                return
            self._cancelled.add(handle)
            if len(self._cancelled) >= self._compact_after:
                self._heap = [e for e in self._heap if e[1] not in self._cancelled]
                heapq.heapify(self._heap)
                self._pending -= self._cancelled
                self._cancelled.clear()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] in self._cancelled:
                    _, handle, _ = heapq.heappop(self._heap)
                    self._cancelled.discard(handle)
                    self._pending.discard(handle)
                if not self._heap:
                    self._waiting_until = None
                    self._cond.wait()
                    continue
                deadline, handle, callback = self._heap[0]
                now = time.monotonic()
                if deadline > now:
                    self._waiting_until = deadline
                    self._cond.wait(deadline - now)
                    self._waiting_until = None
                    continue
                heapq.heappop(self._heap)
                self._pending.discard(handle)
            # Each due callback runs on a thread of its own: one that blocks (a user's
            # context_timeout callback stuck in an abort) must not stop every later
            # deadline in the process, the Manager's collective timeouts among them.
            # Only deadlines that expire get here; most are cancelled before.
            threading.Thread(
                target=_run_callback, args=(callback,), name="torchft_pg-deadline", daemon=True
            ).start()


def _run_callback(callback: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # a callback's failure concerns only its own deadline
        callback()


watchdog = Watchdog()


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in `value`: a tensor, or lists and tuples of them, nested."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def future_for(value: Any) -> Future[Any]:
    """A new Future that will carry `value`, CUDA-aware when `value` holds CUDA tensors.

    A plain Future records no CUDA events: completed from a callback that ran
    on one of torch's pooled streams (where a CUDA future runs its callbacks),
    its consumer (DDP's reducer, on the default stream) could read a tensor
    before the callback's kernels ran. With ``devices`` set, `set_result`
    records an event on the current streams and `wait`/`value` make the
    consumer's stream wait for it.
    """
    devices = sorted({t.device.index or 0 for t in tensors_in(value) if t.is_cuda})
    if devices:
        return Future(devices=[torch.device("cuda", i) for i in devices])
    return Future()


class ProxyFuture(Generic[T]):
    """A torch Future completed once, by the first of: source, timeout, abort.

    On an error, timeout or abort it yields `default` and calls `on_error`
    with the reason, so callers (DDP's reducer) never see an exception; the
    step is rejected by the commit vote instead. `transform` (run on the
    source's value) is skipped once an abort or timeout won. `succeeded`
    tells whether the source completed it with a value: only then has the
    operation behind the source certainly stopped writing its outputs.
    """

    def __init__(
        self,
        source: Future[Any],
        default: T,
        on_error: Callable[[Exception], None],
        timeout: timedelta | None,
        transform: Callable[[Any], T] | None = None,
    ) -> None:
        self.future: Future[T] = future_for(default)
        self._default = default
        self._on_error = on_error
        self._transform = transform
        self._lock = threading.Lock()
        self._done = False
        self.succeeded = False
        self._timer = watchdog.schedule(timeout, self._timed_out) if timeout is not None else None
        self._timeout = timeout
        source.add_done_callback(self._from_source)

    def _claim(self) -> bool:
        """Become the one completion; False if another (abort, timeout, source) won."""
        with self._lock:
            if self._done:
                return False
            self._done = True
        if self._timer is not None:
            watchdog.cancel(self._timer)
        return True

    def _settle(self, value: T | None, error: Exception | None) -> None:
        if not self._claim():
            return
        self._complete(value, error)

    def _complete(self, value: T | None, error: Exception | None) -> None:
        if error is not None:
            self._on_error(error)
            self.future.set_result(self._default)
        else:
            self.future.set_result(value)  # type: ignore[arg-type]

    def _from_source(self, source: Future[Any]) -> None:
        # Claimed before `transform` runs: once an abort or the deadline has
        # completed this future, the source's late result never reaches the
        # caller's tensors (transform is what copies it there).
        if not self._claim():
            return
        try:
            value = source.value()
            if self._transform is not None:
                value = self._transform(value)
        except Exception as e:
            self._complete(None, e)
            return
        self.succeeded = True
        self._complete(value, None)

    def _timed_out(self) -> None:
        from torchft_pg.errors import ProcessGroupTimeoutError

        self._settle(
            None, ProcessGroupTimeoutError(f"collective did not finish within {self._timeout}")
        )

    def abort(self, reason: Exception) -> None:
        """Complete now with the default value, reporting `reason`."""
        self._settle(None, reason)

    @property
    def done(self) -> bool:
        return self._done


def _check_timeout(timeout: timedelta) -> None:
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {timeout!r}")


def future_timeout(fut: Future[T], timeout: timedelta) -> Future[T]:
    """A future with `fut`'s value or error, or `TimeoutError` if `fut` is not
    done within `timeout`. `fut` itself is left running."""
    _check_timeout(timeout)
    out: Future[Any] = Future()
    lock = threading.Lock()
    settled = [False]

    def settle(value: Any = None, error: Exception | None = None) -> bool:
        with lock:
            if settled[0]:
                return False
            settled[0] = True
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(value)
        return True

    def expire() -> None:
        settle(error=TimeoutError(f"future did not complete within {timeout}"))

    handle = watchdog.schedule(timeout, expire)

    def on_done(source: Future[T]) -> None:
        try:
            value = source.value()
        except Exception as e:
            if settle(error=e):
                watchdog.cancel(handle)
            return
        if settle(value):
            watchdog.cancel(handle)

    fut.add_done_callback(on_done)
    return out


def future_wait(fut: Future[T], timeout: timedelta) -> T:
    """`fut`'s value, waiting at most `timeout`; raises `TimeoutError` after that
    (and `fut`'s own error if it failed)."""
    _check_timeout(timeout)
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    if not done.wait(timeout.total_seconds()):
        raise TimeoutError(f"future did not complete within {timeout}")
    return fut.wait()


@contextlib.contextmanager
def context_timeout(callback: Callable[[], None], timeout: timedelta) -> Iterator[None]:
    """Call `callback` (on the watchdog thread) if the block has not exited
    within `timeout`, e.g. to abort a group a stuck collective runs on."""
    _check_timeout(timeout)
    handle = watchdog.schedule(timeout, callback)
    try:
        yield
    finally:
        watchdog.cancel(handle)


def stream_timeout(callback: Callable[[], None], timeout: timedelta) -> None:
    """Call `callback` if the current CUDA stream has not reached this point
    (an event recorded now) within `timeout`. Without CUDA there is no stream
    to wait for, and nothing is scheduled."""
    _check_timeout(timeout)
    if not torch.cuda.is_available():
        return
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()

    def check() -> None:
        if not event.query():  # type: ignore[no-untyped-call]
            callback()

    watchdog.schedule(timeout, check)

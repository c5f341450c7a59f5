"""Build a backend on a thread of its own, so `configure` waits at most its timeout.

Gloo's constructor connects every pair before it returns and cannot be
interrupted. Against a peer whose packets are silently dropped (a partition, a
host gone dark) torch's Gloo makes several connection attempts per pair, each
waiting the whole timeout, so the constructor returns only after a multiple of
the timeout the caller asked for; a failure notice for a dead member cannot cut
it short either.

`build_within` runs the constructor on a daemon thread and waits for it, for
the caller's interrupt flag, or for the deadline, whichever comes first. On an
interrupt or the deadline the build is abandoned: the thread runs on, and when
the constructor finally returns (or raises), what it built is handed to
`on_abandoned` on that thread, for the caller to dispose of (retire the
backend, release the store client it was lent). Nothing it built is ever used.

The number of abandoned builds alive at once is bounded by how often a caller
configures: each lives at most the constructor's own worst case.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError

__all__ = ["Abandoned", "BuildInterruptedError", "BuildTimeoutError", "build_within"]

T = TypeVar("T")
_POLL_S = 0.05  # how often the wait looks at the interrupt flag (seconds)


class BuildTimeoutError(ProcessGroupTimeoutError):
    """The build passed its deadline and was abandoned (its result goes to `on_abandoned`)."""


class BuildInterruptedError(ProcessGroupAbortedError):
    """The build was interrupted and abandoned (its result goes to `on_abandoned`)."""


# The errors after which `on_abandoned` owns the build's result (and the caller does not).
Abandoned = (BuildTimeoutError, BuildInterruptedError)


class _Build(Generic[T]):
    """One constructor call and who, if anyone, still wants its result."""

    def __init__(self, build: Callable[[], T], on_abandoned: Callable[[T | None], None]) -> None:
        self._build = build
        self._on_abandoned = on_abandoned
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._abandoned = False
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = self._build()
        except BaseException as e:  # handed to the waiting caller, or dropped if abandoned
            error = e
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self.value, self.error = value, error
                self._done.set()
        if abandoned:
            self._on_abandoned(value)

    def wait(self, timeout_s: float, interrupted: threading.Event) -> bool:
        """True once built (or failed); False if abandoned at the deadline or interrupt.

        On False the result will go to `on_abandoned` instead, exactly once.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if self._done.wait(max(0.0, min(_POLL_S, left))):
                return True
            if interrupted.is_set() or left <= 0:
                with self._lock:
                    if self._done.is_set():  # finished just now: the caller takes it
                        return True
                    self._abandoned = True
                return False


def build_within(
    build: Callable[[], T],
    *,
    timeout_s: float,
    interrupted: threading.Event,
    interrupt_reason: Callable[[], str],
    on_abandoned: Callable[[T | None], None],
    what: str,
) -> T:
    """`build()`, or an error once `timeout_s` seconds pass or `interrupted` is set.

    Raises `BuildTimeoutError` (naming `what` and the timeout) at the deadline
    and `BuildInterruptedError` (with `interrupt_reason()`) on an interrupt
    (together: `Abandoned`); in both cases `on_abandoned` later receives what `build`
    returned (None if it raised). Errors `build` raises in time propagate.
    """
    job: _Build[T] = _Build(build, on_abandoned)
    thread = threading.Thread(target=job.run, name=f"torchft_pg-build-{what}", daemon=True)
    thread.start()
    if job.wait(timeout_s, interrupted):
        if job.error is not None:
            raise job.error
        assert job.value is not None
        return job.value
    if interrupted.is_set():
        raise BuildInterruptedError(f"configure interrupted: {interrupt_reason()}")
    raise BuildTimeoutError(
        f"building {what} did not finish within {timeout_s:g} s (a member's packets may be "
        "dropped on the way); the half-built backend is discarded when it returns"
    )

"""A readers/writer gate over the checkpoint a server may serve.

`allow(step, payload)` opens it (`serving_step` tells which step is open);
`read(step, wait_s)` lets a request handler use the payload (waiting up to
`wait_s` seconds for it to open); `disallow(drain_s)` closes it and waits up to
`drain_s` seconds until no reader is left, so the owner may mutate the state
dict afterwards. A reader that streams for long checks `is_current(payload)`
between pieces and stops early once closed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["GateClosedError", "NotAllowedError", "ServingGate", "WrongStepError"]

P = TypeVar("P")


class NotAllowedError(Exception):
    """Serving was not allowed within the reader's wait."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"checkpoint serving was not allowed within {waited_s:.3f} s")
        self.waited_s = waited_s


class WrongStepError(Exception):
    """The reader asked for a step other than the one being served."""

    def __init__(self, requested: int, serving: int) -> None:
        super().__init__(f"requested step {requested}, but this replica serves step {serving}")
        self.requested = requested
        self.serving = serving


class GateClosedError(Exception):
    """The gate was shut down for good (the transport is shutting down)."""


class ServingGate(Generic[P]):
    """Thread-safe open/closed state with a reader count (see module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._step: int | None = None
        self._payload: P | None = None
        self._readers = 0
        self._waiting = 0
        self._shut = False

    def allow(self, step: int, payload: P) -> None:
        """Serve `payload` for `step` from now on (replaces any earlier one)."""
        with self._cond:
            self._step, self._payload = step, payload
            self._cond.notify_all()

    def disallow(self, drain_s: float) -> bool:
        """Close; wait up to `drain_s` seconds for readers to finish. True if drained."""
        with self._cond:
            self._step, self._payload = None, None
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._readers == 0, timeout=drain_s)

    def shutdown(self) -> None:
        """Close for good; waiting readers raise `GateClosedError`."""
        with self._cond:
            self._shut = True
            self._step, self._payload = None, None
            self._cond.notify_all()

    @property
    def serving_step(self) -> int | None:
        """The step being served now, or None while closed."""
        with self._cond:
            return self._step if self._payload is not None else None

    @property
    def readers(self) -> int:
        with self._cond:
            return self._readers

    def wait_for_waiting(self, n: int, timeout_s: float) -> bool:
        """Block until at least `n` readers wait for the gate to open (for tests/diagnostics)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting >= n, timeout=timeout_s)

    def is_current(self, payload: P) -> bool:
        """Whether `payload` is still the one being served (a reader's stop check)."""
        with self._cond:
            return self._payload is payload

    @contextmanager
    def read(self, step: int, wait_s: float) -> Iterator[P]:
        """Hold a reader slot on the payload of `step`, waiting up to `wait_s` seconds."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            try:
                opened = self._cond.wait_for(
                    lambda: self._shut or self._payload is not None, timeout=wait_s
                )
            finally:
                self._waiting -= 1
            if self._shut:
                raise GateClosedError("checkpoint server is shutting down")
            if not opened or self._payload is None:
                raise NotAllowedError(wait_s)
            if self._step != step:
                assert self._step is not None
                raise WrongStepError(step, self._step)
            payload = self._payload
            self._readers += 1
        try:
            yield payload
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

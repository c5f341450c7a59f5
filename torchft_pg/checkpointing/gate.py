"""What a checkpoint server may serve, and which transfers may go on streaming.

`allow(step, payload)` opens the gate (`serving_step` tells which step is
open); `read(step, wait_s)` lets a request handler use the payload (waiting up
to `wait_s` seconds for it to open); `disallow()` closes it to new readers and
returns at once: a transfer already reading goes on with the payload it holds.
That is safe only because the payload is a snapshot (`serialization.pack(...,
snapshot=True)`), not the owner's live state, and it is what keeps a slow
reader from holding up the owner's step.

A reader that streams for long checks `may_continue(payload)` between pieces:
true while its payload is the open one, or the one closed last (draining to
the readers already in it); false once a newer payload was allowed or the gate
was shut down, so at most two payloads are held for readers (the open one and
the one draining) besides superseded ones whose readers are being stopped. The
gate keeps no reference to a closed payload once its last reader is done, so a
snapshot's memory goes as soon as nobody reads it.
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
    """Thread-safe open/closed state with readers counted per payload (see module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._step: int | None = None
        self._payload: P | None = None
        self._draining: P | None = None  # closed last, still read by the readers it has
        self._counts: dict[int, int] = {}  # id(payload) -> readers; each reader holds its payload
        self._waiting = 0
        self._shut = False

    def allow(self, step: int, payload: P) -> None:
        """Serve `payload` for `step` from now on; readers of any other payload stop."""
        with self._cond:
            self._step, self._payload = step, payload
            self._draining = None
            self._cond.notify_all()

    def disallow(self) -> None:
        """Close to new readers at once; readers already in go on (`may_continue`)."""
        with self._cond:
            if self._payload is not None:
                held = self._counts.get(id(self._payload), 0) > 0
                self._draining = self._payload if held else None
            self._step, self._payload = None, None
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Close for good; waiting readers raise `GateClosedError`, streaming ones stop."""
        with self._cond:
            self._shut = True
            self._step, self._payload, self._draining = None, None, None
            self._cond.notify_all()

    @property
    def serving_step(self) -> int | None:
        """The step being served now, or None while closed."""
        with self._cond:
            return self._step if self._payload is not None else None

    @property
    def readers(self) -> int:
        """Readers of any payload (open, draining or superseded)."""
        with self._cond:
            return sum(self._counts.values())

    def wait_idle(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` seconds until no reader is left. True if none is."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._counts, timeout=timeout_s)

    def wait_for_waiting(self, n: int, timeout_s: float) -> bool:
        """Block until at least `n` readers wait for the gate to open (for tests/diagnostics)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting >= n, timeout=timeout_s)

    def may_continue(self, payload: P) -> bool:
        """Whether a reader holding `payload` (from `read`) may go on streaming it:
        it is the open payload or the one draining, and the gate is not shut."""
        with self._cond:
            return not self._shut and (payload is self._payload or payload is self._draining)

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
            key = id(payload)
            self._counts[key] = self._counts.get(key, 0) + 1
        try:
            yield payload
        finally:
            with self._cond:
                self._counts[key] -= 1
                if not self._counts[key]:
                    del self._counts[key]
                    if self._draining is payload:
                        self._draining = None  # its last reader is done: free the snapshot
                self._cond.notify_all()

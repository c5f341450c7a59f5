"""Clocks: the lighthouse's logic takes ``now`` (seconds) from one of these.

Tests move a ``FakeClock`` forward instead of sleeping: no test synchronises on a sleep.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic time source in seconds."""

    def now(self) -> float:
        """Current time in seconds (monotonic; arbitrary origin)."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic()`` in seconds."""

    def now(self) -> float:
        """Seconds since an arbitrary origin, never going backwards."""
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to, for deterministic tests."""

    def __init__(self, start: float = 1000.0) -> None:
        """``start``: the initial reading in seconds."""
        self._now = float(start)

    def now(self) -> float:
        """The current fake reading in seconds."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0) and return the new reading."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self._now += seconds
        return self._now

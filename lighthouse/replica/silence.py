"""How long this replica was silent to the lighthouse: the gaps between its liveness pings.

The lighthouse declares a replica dead after a heartbeat timeout of silence and
tells the survivors, who abandon the step. A replica that was frozen (stopped,
swapped out, a stalled event loop) for that long may wake inside the same step
and finish it with the abandoned collective; it must not commit that step. So
the manager server keeps the recent gaps between pings and votes no on a step
during which it was silent for 90% of the lighthouse's timeout or more.

Our silence bounds the lighthouse's from above: it measures from when our
last ping arrived, which is after we wrote it. So a replica silent for less
than the timeout cannot have been declared dead for silence, and a vote that
says otherwise would only make this replica fall behind the others, who
commit; the 10% margin covers clock-rate differences and the lighthouse's
tick.

Plain logic on a clock's readings (seconds), no I/O.
"""

from __future__ import annotations

from collections import deque

__all__ = ["SILENCE_VOTES_NO_AT", "Silences", "silent_too_long"]

# The fraction of the lighthouse's heartbeat timeout a step may stay silent.
SILENCE_VOTES_NO_AT = 0.9


class Silences:
    """The times between consecutive pings, long enough to matter, recently."""

    def __init__(self, keep: int = 64, floor_s: float = 0.25) -> None:
        self._last: float | None = None
        self._floor_s = floor_s  # shorter gaps (regular pings) are never worth keeping
        self._gaps: deque[tuple[float, float]] = deque(maxlen=keep)  # (end, length)

    def pinged(self, now: float) -> None:
        """A ping was written at `now`."""
        if self._last is not None and now - self._last >= self._floor_s:
            self._gaps.append((now, now - self._last))
        self._last = now

    def longest_since(self, start: float, now: float) -> float:
        """The longest silence overlapping [start, now], the one still going included."""
        longest = 0.0
        for end, length in self._gaps:
            if end > start:
                longest = max(longest, end - max(end - length, start))
        if self._last is not None:
            longest = max(longest, now - max(self._last, start))
        return longest


def silent_too_long(silence_s: float, heartbeat_timeout_s: float | None) -> bool:
    """Whether a step this silent may have been declared dead (unknown timeout: no)."""
    if not heartbeat_timeout_s:
        return False
    return silence_s >= SILENCE_VOTES_NO_AT * heartbeat_timeout_s

"""How long this replica was silent to the lighthouse: the gaps in which its manager
server did not run.

The lighthouse declares a replica dead after a heartbeat timeout of silence and
tells the survivors, who abandon the step. A replica that was frozen (stopped,
swapped out, a stalled event loop) for that long may wake inside the same step
and finish it with the abandoned collective; it must not commit that step. So
the manager server marks every 100 ms that its event loop runs (and so pings
when due), keeps the recent gaps between the marks, and votes no on a step
during which it was silent for 90% of the lighthouse's timeout or more.

A gap in the marks bounds the lighthouse's view of our silence from above
where it is ours: a replica whose loop ran pinged in time. A replica silent
for less cannot have been declared dead for its own silence, and a vote that
says otherwise would only make it fall behind the others, who commit; the
10% margin covers clock-rate differences and the lighthouse's tick. A ping
that cannot go out because the lighthouse does not read it (stopped: its
socket fills) is not our silence: a lighthouse that did not run declares
nobody dead for the time it did not run (its first tick after a pause
forgives every silence), so a job commits on through it from its lease.

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

    def ran(self, now: float) -> None:
        """The manager server's loop ran at `now` (seconds)."""
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

"""When a chaos run counts as hung: nothing happened for a while, or it ran past its bound.

A run's wall time follows the machine's load: the same plan that takes a minute
on an idle 2-core machine took more than 150 s while the rest of `make test`
ran beside it, and a fixed 150 s deadline failed it though it never stopped
committing. So a run fails on time only when it stops making progress: no event
from any rank (a step ended, committed or not, a rank ready, a fault fired, a
death, a heal's trace) and no rank exited for `stall_s` seconds. `deadline_s`
stays as an upper bound far above any healthy run, for a run that keeps making
events but never ends (e.g. every step discarded for ever).

Pure: the caller passes the readings of a monotonic clock, in seconds.
"""

from __future__ import annotations

__all__ = ["ProgressWatch"]


class ProgressWatch:
    """Tracks a run's last progress; `failure(now)` says whether it has hung.

    `stall_s`: seconds without progress after which the run fails; `deadline_s`:
    seconds after `started` after which it fails however it progresses (at
    least `stall_s`); `started`: the clock's reading at the run's start, which
    counts as progress (the processes' start-up must send an event in time).
    """

    def __init__(self, *, stall_s: float, deadline_s: float, started: float) -> None:
        if not stall_s > 0:
            raise ValueError(f"stall_s must be > 0 seconds, got {stall_s!r}")
        if not deadline_s >= stall_s:
            raise ValueError(f"deadline_s must be >= stall_s ({stall_s:g} s), got {deadline_s!r}")
        self.stall_s = stall_s
        self.deadline_s = deadline_s
        self.started = started
        self.last = started
        self.last_what = "the run's start"

    def progressed(self, now: float, what: str) -> None:
        """Something happened at `now` (`what`, for the failure message)."""
        if now >= self.last:
            self.last, self.last_what = now, what

    def left(self, now: float) -> float:
        """Seconds from `now` until `failure` would report one (<= 0: it does)."""
        return min(self.started + self.deadline_s, self.last + self.stall_s) - now

    def failure(self, now: float) -> str | None:
        """Why the run has hung at `now`, or None while it has not."""
        if now - self.started >= self.deadline_s:
            return (
                f"run did not finish within {self.deadline_s:g} s, though it was still making "
                f"progress (last: {self.last_what}, {self.last - self.started:.1f} s into "
                "the run): a livelock?"
            )
        if now - self.last >= self.stall_s:
            return (
                f"no progress for {self.stall_s:g} s (hang?): nothing from any rank since "
                f"{self.last_what}, {self.last - self.started:.1f} s into the run"
            )
        return None

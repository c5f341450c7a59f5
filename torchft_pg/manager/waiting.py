"""Saying what a job waits for: at once, then every so often, and once when it ends.

A job that cannot commit (fewer replica groups present than
`min_replica_size`, a quorum that does not form) used to sit at one step
with nothing above INFO. `WaitReport` decides when such a wait is worth a
WARNING line: the first time, then every `period_s` seconds while it lasts
(with how long and how many tries so far), and once when it is over. Pure: a
clock and the calls decide.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["WaitReport"]


class WaitReport:
    """When to report a wait; `clock` gives seconds, `period_s` spaces the repeats."""

    def __init__(self, clock: Callable[[], float], period_s: float = 10.0) -> None:
        self._clock = clock
        self._period_s = period_s
        self._what: str | None = None
        self._since = 0.0
        self._last = 0.0
        self._tries = 0

    def waiting(self, what: str) -> str | None:
        """Another try that ended waiting for `what`; the line to log, or None to stay quiet."""
        now = self._clock()
        if self._what != what:
            if self._what is None:
                self._since = now
                self._tries = 0
            self._what, self._last = what, now
            self._tries += 1
            return f"waiting for {what}"
        self._tries += 1
        if now - self._last < self._period_s:
            return None
        self._last = now
        return f"still waiting for {what} ({now - self._since:.0f} s, {self._tries} tries)"

    def resolved(self) -> str | None:
        """The wait is over; the line to log once (None if nothing was waited for)."""
        if self._what is None:
            return None
        what, self._what = self._what, None
        return f"no longer waiting for {what} (after {self._clock() - self._since:.0f} s, {self._tries} tries)"

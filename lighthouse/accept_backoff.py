"""How an accept loop waits out a process that ran out of file descriptors.

``accept()`` failing with ``EMFILE``/``ENFILE`` leaves the connection in the
kernel's queue, so the listening socket stays readable: a loop that just polls
again spins on the same failure at 100% of a core until a descriptor frees up.
``AcceptBackoff`` says how long to wait instead (doubling from ``first_s`` up
to ``max_s``), and when to log: once when an episode of failures starts and
once when an accept works again. Pure: a function of failures and a clock.
"""

from __future__ import annotations

import errno

__all__ = ["OUT_OF_DESCRIPTORS", "AcceptBackoff"]

#: ``accept()`` errors that mean "no descriptor or buffer free now", worth waiting out.
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class AcceptBackoff:
    """The backoff of one accept loop (``what`` names it in log lines).

    ``first_s`` and ``max_s``: the first and the longest wait, in seconds
    (0 < ``first_s`` <= ``max_s``).
    """

    def __init__(self, what: str, first_s: float = 0.05, max_s: float = 1.0) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(
                f"need 0 < first_s <= max_s seconds, got first_s={first_s!r}, max_s={max_s!r}"
            )
        self.what = what
        self.first_s = first_s
        self.max_s = max_s
        self._failures = 0  # in the current episode
        self._since = 0.0  # when the episode began (the caller's clock)
        self.episodes = 0  # episodes started so far

    @property
    def failing(self) -> bool:
        """Whether the loop is in an episode of failures now."""
        return self._failures > 0

    def failed(self, error: OSError, now: float) -> tuple[float, str | None]:
        """An accept failed with ``error`` at ``now`` (seconds): how long to wait
        before the next, and the line to log (only the episode's first failure)."""
        self._failures += 1
        if self._failures == 1:
            self._since = now
            self.episodes += 1
            line: str | None = (
                f"{self.what}: cannot accept connections ({error.strerror or error}): out of "
                f"file descriptors; retrying every {self.first_s:g} to {self.max_s:g} s "
                "instead of spinning. Logged again when accepts work"
            )
        else:
            line = None
        return min(self.max_s, self.first_s * 2 ** (self._failures - 1)), line

    def accepted(self, now: float) -> str | None:
        """An accept worked at ``now``: the line to log if it ends an episode."""
        if self._failures == 0:
            return None
        failures, self._failures = self._failures, 0
        return (
            f"{self.what}: accepting connections again after {failures} failed accept(s) "
            f"over {now - self._since:.1f} s"
        )

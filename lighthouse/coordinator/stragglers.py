"""Pure: which replica group is a straggler, from the work each reports per step.

In a synchronous job every group's step takes as long as the slowest group's:
the fast ones wait for it in the step's cross-replica allreduce. Their step
times are therefore all alike and tell nothing; what differs is how much of
the step each group *worked* rather than waited. Each group reports that as
``busy_ms`` (its step time less the wait of the step's last allreduce, see
``QuorumMember.busy_ms``) with every quorum request and liveness ping.

``BusyWindows`` keeps, per replica, the last ``window`` busy times (one per
step, the first report of each step; 0 = unknown is skipped).
``find_straggler`` is the verdict: the slowest member S of the current
quorum is a straggler when

* every member's window is full (a newcomer, or S after it was let back in,
  is judged only once a whole window of its steps is in),
* median(busy of S) >= ``slowdown`` x the median, over the other members, of
  their own medians (medians, so a few slow steps, a heal or a checkpoint,
  never count),
* the others would process more samples per second without S than the job
  does with it: with n members, S's slowdown exceeds n / (n - 1) (two
  groups: 2x; three: 1.5x), and
* the others still number at least ``min_replicas``.

One straggler per verdict: the slowest; the next is judged afresh.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_STRAGGLER_SLOWDOWN",
    "DEFAULT_STRAGGLER_WINDOW",
    "BusyWindows",
    "Straggler",
    "find_straggler",
]

# Measured (bench/stragglers.py: groups of 20 ms simulated steps on 2 shared
# cores) the healthy groups' median work per step stayed within 1.07x of each
# other; 1.5x (and n/(n-1), larger for fewer than three groups) leaves a wide
# margin, and the median over 50 steps ignores a few slow ones (heals, checkpoints).
DEFAULT_STRAGGLER_SLOWDOWN = 1.5
DEFAULT_STRAGGLER_WINDOW = 50  # steps; 0 turns the detector off


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """A verdict: ``replica_id`` works ``busy_ms`` per step (the median of its last
    ``steps`` steps) against ``others_ms``, the median of the other members'
    medians; both in milliseconds."""

    replica_id: str
    busy_ms: float
    others_ms: float
    steps: int

    @property
    def slowdown(self) -> float:
        """How many times the others' work per step it takes (> 1)."""
        return self.busy_ms / self.others_ms

    def reason(self) -> str:
        """The words /status, the dashboard and the log show for its quarantine."""
        return (
            f"straggler: {self.busy_ms:.0f} ms of work per step against the others' "
            f"{self.others_ms:.0f} ms ({self.slowdown:.1f}x, over {self.steps} steps)"
        )


class BusyWindows:
    """The last ``window`` busy times (ms) of each replica, one per step.

    O(1) per report; a median is computed once per change of its window.
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self.window = window
        self._busy: dict[str, deque[float]] = {}
        self._step: dict[str, int] = {}  # the step of each replica's latest sample
        self._median: dict[str, float] = {}  # cached medians of full windows

    def record(self, replica_id: str, step: int, busy_ms: float) -> None:
        """``replica_id`` reported ``busy_ms`` with its round at ``step``: kept if it
        is the first report of a later step and known (> 0)."""
        if busy_ms <= 0 or step <= self._step.get(replica_id, -1):
            return
        self._step[replica_id] = step
        buf = self._busy.get(replica_id)
        if buf is None:
            buf = self._busy[replica_id] = deque(maxlen=self.window)
        buf.append(busy_ms)
        self._median.pop(replica_id, None)

    def reset(self, replica_id: str) -> None:
        """Start ``replica_id``'s window afresh (it was evicted: it is judged again
        only on a whole new window of steps)."""
        self._busy.pop(replica_id, None)
        self._median.pop(replica_id, None)

    def forget(self, replica_id: str) -> None:
        """``replica_id`` is gone."""
        self.reset(replica_id)
        self._step.pop(replica_id, None)

    def known(self) -> list[str]:
        """Every replica with a window or a step recorded."""
        return list(self._step)

    def median(self, replica_id: str) -> float | None:
        """The median of ``replica_id``'s window (ms) if it is full, else None."""
        cached = self._median.get(replica_id)
        if cached is not None:
            return cached
        buf = self._busy.get(replica_id)
        if buf is None or len(buf) < self.window:
            return None
        value = self._median[replica_id] = statistics.median(buf)
        return value

    def medians(self, replica_ids: Iterable[str]) -> dict[str, float] | None:
        """Each replica's median (ms), or None unless every window is full."""
        out: dict[str, float] = {}
        for rid in replica_ids:
            m = self.median(rid)
            if m is None:
                return None
            out[rid] = m
        return out


def find_straggler(
    medians: Mapping[str, float], *, slowdown: float, min_replicas: int, steps: int
) -> Straggler | None:
    """The straggler among the members whose median busy times (ms) are
    ``medians`` (every member of the quorum, each over a full window of
    ``steps`` steps), or None: see the module docstring. O(n log n)."""
    n = len(medians)
    if n < 2 or n - 1 < min_replicas:
        return None
    slowest = max(medians, key=lambda rid: (medians[rid], rid))
    others = statistics.median(m for rid, m in medians.items() if rid != slowest)
    if others <= 0:
        return None
    ratio = medians[slowest] / others
    if ratio < slowdown or ratio <= n / (n - 1):
        return None
    return Straggler(replica_id=slowest, busy_ms=medians[slowest], others_ms=others, steps=steps)

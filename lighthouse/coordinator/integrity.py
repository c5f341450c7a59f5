"""Pure: which replicas keep diverging from the majority (silent data corruption).

A replica group's integrity check compares its state with the other groups'
every few steps; a group that finds its own state corrupt votes no, heals
from the majority, and reports an ``IntegrityReport`` with its next quorum
request. One finding is a bit flip healed at once; a group caught again and
again has a fault that healing does not cure (bad memory, a broken kernel on
that host), and every check it fails costs the job a step. Rule 10 of
``lighthouse.coordinator.quorum`` quarantines such a repeat offender.

Only a replica's own ``DIVERGED`` reports count against it: a healer's word
about its heal source (``HEAL_SOURCE_DIVERGED``) and a job-wide
``NO_MAJORITY`` are recorded but blame nobody, so no replica can get another
one quarantined (the corrupt source, which took part in the same check,
reports its own divergence). ``GRADIENT_DIVERGED`` (a replica received an
averaged gradient that differs from the majority's) is recorded but not
counted either: a reduction's result passes through its peers' memory and
links, so a differing result does not pin the fault on the replica that
received it, and its state was never touched. The count covers the last ``window_s`` seconds
and starts afresh at each quarantine, so a replica released on probation is
quarantined again (with a longer backoff) only after ``after`` new findings.
A quarantine never leaves fewer than ``min_replicas`` live replicas.

Everything takes ``now`` (the lighthouse clock, seconds) from the caller and
reads no clock itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from lighthouse.types import IntegrityKind, IntegrityReport

__all__ = [
    "DEFAULT_DIVERGENCE_WINDOW_S",
    "DEFAULT_QUARANTINE_AFTER_DIVERGENCES",
    "DivergenceLog",
    "divergence_reason",
    "repeat_offenders",
]

DEFAULT_QUARANTINE_AFTER_DIVERGENCES = 3  # own divergences within the window: quarantined
DEFAULT_DIVERGENCE_WINDOW_S = 3600.0  # the window, in seconds (an hour)
_KEPT_PER_REPLICA = 64  # divergence times kept per replica (a count above it reads 64)
_TENSORS_IN_REASON = 3  # tensor names a quarantine's reason repeats


class DivergenceLog:
    """Per replica: the clock times (seconds) of its own ``DIVERGED`` reports since
    its last quarantine, and its latest report of any kind (to recognize the
    same report arriving twice). Mutated only through its methods; the lighthouse
    forgets a replica's entries when it forgets the replica."""

    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}
        self._latest: dict[str, IntegrityReport] = {}
        self._latest_diverged: dict[str, IntegrityReport] = {}

    def reported(self, replica_id: str, report: IntegrityReport, now: float) -> bool:
        """Record ``replica_id``'s ``report`` at ``now`` (seconds). False if it is the
        report already recorded for it (a resent request), which changes nothing."""
        if self._latest.get(replica_id) == report:
            return False
        self._latest[replica_id] = report
        if report.kind is IntegrityKind.DIVERGED:
            times = self._times.get(replica_id)
            if times is None:
                times = self._times[replica_id] = deque(maxlen=_KEPT_PER_REPLICA)
            times.append(now)
            self._latest_diverged[replica_id] = report
        return True

    def count(self, replica_id: str, now: float, window_s: float) -> int:
        """``replica_id``'s own divergences in the ``window_s`` seconds up to ``now``
        since its last quarantine (older ones are dropped here)."""
        times = self._times.get(replica_id)
        if times is None:
            return 0
        while times and now - times[0] > window_s:
            times.popleft()
        if not times:
            del self._times[replica_id]
            return 0
        return len(times)

    def last_diverged(self, replica_id: str) -> IntegrityReport | None:
        """``replica_id``'s latest ``DIVERGED`` report, or None."""
        return self._latest_diverged.get(replica_id)

    def replica_ids(self) -> list[str]:
        """Replicas with divergences counted (some may be past the window until ``count``)."""
        return list(self._times)

    def quarantined(self, replica_id: str) -> None:
        """``replica_id`` was quarantined: its count starts afresh."""
        self._times.pop(replica_id, None)

    def forget(self, replica_id: str) -> None:
        """``replica_id`` is gone: drop everything about it."""
        self._times.pop(replica_id, None)
        self._latest.pop(replica_id, None)
        self._latest_diverged.pop(replica_id, None)


def repeat_offenders(
    log: DivergenceLog,
    now: float,
    *,
    after: int,
    window_s: float,
    live: int,
    min_replicas: int,
    is_quarantined: Callable[[str], bool],
) -> tuple[tuple[str, int], ...]:
    """The replicas to quarantine now, with their counts: those not quarantined
    already that reported their own divergence at least ``after`` times in the
    ``window_s`` seconds up to ``now``; most divergences first (then by replica
    id), and no more than leave ``min_replicas`` of the ``live`` replicas
    (``live`` counts none already quarantined). ``after`` <= 0: nobody.
    O(replicas with divergences counted)."""
    if after <= 0:
        return ()
    offenders = sorted(
        (-n, rid)
        for rid in log.replica_ids()
        if not is_quarantined(rid) and (n := log.count(rid, now, window_s)) >= after
    )
    room = max(0, live - min_replicas)
    return tuple((rid, -n) for n, rid in offenders[:room])


def divergence_reason(count: int, report: IntegrityReport | None, window_s: float) -> str:
    """Why a repeat offender is quarantined, in words: how often its state diverged
    within ``window_s`` seconds, at which step last and in which tensors."""
    if report is None:
        last = ""
    else:
        names = report.tensors[:_TENSORS_IN_REASON]
        more = len(report.tensors) - len(names)
        tensors = ", ".join(names) + (f" and {more} more" if more > 0 else "")
        last = f" (last at step {report.step}: tensors {tensors or 'not named'})"
    return (
        f"silent data corruption: state diverged from the majority {count} times{last} "
        f"within {window_s:g} s"
    )

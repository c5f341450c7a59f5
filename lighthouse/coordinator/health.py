"""Per-replica health for the dashboard: one row per replica the lighthouse knows.

A pure function of the quorum state, the liveness streams and the step
history at one instant, so it is unit-tested with plain values. The rows show
each replica's *latest* step (quorum requests and liveness pings), not the
step it asked the current quorum at: on a lease, members report progress
without asking, and the quorum's own record stays at the step it formed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from lighthouse.coordinator.history import EventKind, StepHistory
from lighthouse.coordinator.quorum import QuorumState

__all__ = ["BEHIND_AFTER_STEPS", "Health", "ReplicaHealth", "replica_health"]

# Lease holders may be one step apart (a leased round waits for the slowest to
# reach step - 1), and a member's ping for its next round may still be in flight
# while a faster one's has arrived: a lag of two steps is normal; more is "behind".
BEHIND_AFTER_STEPS = 2
# Silent for this fraction of the heartbeat timeout: shown before it is declared dead.
SILENT_FRACTION = 0.5
MAX_ROWS = 1000  # rows in /status at most (the dashboard of a huge job shows the first)


class Health(str, Enum):
    """A replica's state as the dashboard colours it (``status`` in ``/status``)."""

    OK = "ok"  # in the current quorum and keeping up
    BEHIND = "behind"  # a member more than two steps below the job's lead (see ``lag``)
    FAILING = "failing"  # a member whose latest steps did not commit (``commit_failures``)
    WAITING = "waiting"  # asked for a quorum it is not in yet
    OUTSIDE = "outside"  # alive, neither in the quorum nor asking
    SILENT = "silent"  # no sign of life for half the heartbeat timeout
    QUARANTINED = "quarantined"  # left out of quorums for a while (rules 7-9, stragglers)
    DEAD = "dead"  # declared dead (stream closed, or heartbeat timeout)
    LEFT = "left"  # shut down cleanly


@dataclass(frozen=True, kw_only=True)
class ReplicaHealth:
    """One replica's row. Times in seconds, step times in milliseconds; None = unknown.

    ``lag``: the job's lead minus ``step`` (live replicas only): the lead is the
    highest step a proven live replica reports, or the committed step if higher
    (a step one unproven replica claims never makes the others look behind). ``steps_per_s``: over about
    the last ``history.RECENT_RATE_SPAN_S`` seconds. ``step_time_ms``: the latest
    reported, else derived from the step history (``step_time_derived``).
    ``commit_failures``: the steps in a row the replica's latest request says did
    not commit (e.g. fewer groups than its ``min_replica_size``; its own log says
    why); a member with any is ``failing``. ``busy_ms``: the replica's latest
    reported own work per step (its step time less its wait for the other
    groups; the straggler detector compares these). ``quarantine_reason``: why
    it is quarantined (e.g. a straggler's work against the others'), while it is.
    """

    replica_id: str
    status: Health
    in_quorum: bool
    alive: bool
    pending: bool
    step: int | None
    lag: int | None
    last_seen_s_ago: float | None
    quarantined_s: float | None
    steps_per_s: float | None
    step_time_ms: float | None
    step_time_derived: bool
    liveness_streams: int
    commit_failures: int = 0
    busy_ms: float | None = None
    quarantine_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "status": self.status.value,
            "in_quorum": self.in_quorum,
            "alive": self.alive,
            "pending": self.pending,
            "step": self.step,
            "lag": self.lag,
            "last_seen_s_ago": self.last_seen_s_ago,
            "quarantined_s": self.quarantined_s,
            "steps_per_s": self.steps_per_s,
            "step_time_ms": self.step_time_ms,
            "step_time_derived": self.step_time_derived,
            "liveness_streams": self.liveness_streams,
            "commit_failures": self.commit_failures,
            "busy_ms": self.busy_ms,
            "quarantine_reason": self.quarantine_reason,
        }


def replica_health(
    *,
    state: QuorumState,
    now: float,
    heartbeat_timeout_s: float,
    streams: Mapping[str, int],
    steps: StepHistory,
    gone: Callable[[str], EventKind | None],
) -> list[ReplicaHealth]:
    """Rows for every live replica, every member of the current quorum, and every
    departed replica with step samples in the history window (dead or left: its
    chart line ends there), sorted by replica id, at most ``MAX_ROWS``.

    ``now``: clock seconds; ``streams``: open liveness streams per replica;
    ``gone``: why a departed replica left (``JobHistory.gone_reason``).
    """
    members = {} if state.prev is None else {m.replica_id: m for m in state.prev.participants}
    lead = max(
        (m.step for rid, m in state.last_member.items() if rid in state.proven),
        default=state.committed_step,
    )
    lead = max(lead, state.committed_step)
    departed = {rid for rid in steps.replica_ids() if gone(rid) is not None}
    ids = sorted(set(state.seen) | set(members) | departed)[:MAX_ROWS]
    rows = []
    for rid in ids:
        last_seen = state.seen.get(rid)
        alive = last_seen is not None
        latest = state.last_member.get(rid)
        member = members.get(rid)
        step = latest.step if latest is not None else (None if member is None else member.step)
        sample = steps.latest(rid)
        if sample is not None and (step is None or sample.step > step):
            step = sample.step
        rate = steps.recent_rate(rid, now) if alive else None
        reported = latest.step_time_ms if latest is not None and latest.step_time_ms > 0 else None
        if reported is None and alive:
            reported = steps.last_reported_ms(rid)
        step_time = reported
        if reported is None and rate is not None and rate > 0:
            step_time = 1000 / rate
        derived = reported is None and step_time is not None
        q = state.quarantined.get(rid)
        quarantined_s = round(q.until - now, 3) if q is not None and q.until > now else None
        lag = None if step is None or not alive else max(0, lead - step)
        silent_s = None if last_seen is None else now - last_seen
        failures = latest.commit_failures if latest is not None and alive else 0
        if not alive:
            status = Health.LEFT if gone(rid) is EventKind.LEFT else Health.DEAD
        elif quarantined_s is not None:
            status = Health.QUARANTINED
        elif silent_s is not None and silent_s >= SILENT_FRACTION * heartbeat_timeout_s:
            status = Health.SILENT
        elif member is None:  # a joiner waits (and heals once in) whatever its step
            status = Health.WAITING if rid in state.pending else Health.OUTSIDE
        elif failures > 0:
            status = Health.FAILING
        elif lag is not None and lag > BEHIND_AFTER_STEPS:
            status = Health.BEHIND
        else:
            status = Health.OK
        rows.append(
            ReplicaHealth(
                replica_id=rid,
                status=status,
                in_quorum=member is not None,
                alive=alive,
                pending=rid in state.pending,
                step=step,
                lag=lag,
                last_seen_s_ago=None if silent_s is None else round(silent_s, 3),
                quarantined_s=quarantined_s,
                steps_per_s=None if rate is None else round(rate, 3),
                step_time_ms=None if step_time is None else round(step_time, 3),
                step_time_derived=derived,
                liveness_streams=streams.get(rid, 0),
                commit_failures=failures,
                busy_ms=round(latest.busy_ms, 3)
                if latest is not None and alive and latest.busy_ms > 0
                else None,
                quarantine_reason=None if quarantined_s is None or q is None else q.reason,
            )
        )
    return rows

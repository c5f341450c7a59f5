"""A synthetic job's ``/status``: a real ``LighthouseCore`` driven by a fake clock.

``synthetic_status`` runs ``replicas`` replica groups in lockstep through
``minutes`` of simulated training on a ``LighthouseCore`` (no sockets, no
processes): the first quorum, liveness pings every second with each
replica's own step time, one replica killed at 40 % of the run (the others
pause for a few seconds, then form a quorum without it), its restart at 60 %
joining behind and healing, and one replica that went silent just before the
end. The result is the core's own snapshot, so the page is tested against the
real ``/status`` shape at a size no test machine could run as processes.

Events carry wall-clock stamps; ``wall_ms`` maps the fake clock onto them so
that the timeline lines up with the step history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import LighthouseCore
from lighthouse.coordinator.quorum import QuorumConfig
from lighthouse.coordinator.status import LighthouseMetrics
from lighthouse.types import IntegrityKind, IntegrityReport, QuorumMember

CONFIG = QuorumConfig(min_replicas=2, join_timeout_s=1.0, heartbeat_timeout_s=5.0, lease=False)
PAUSE_AFTER_KILL_S = 4  # survivors' steps stall this long after the kill (s)
HEAL_S = 3  # the restarted replica reports step 0 this long before it has healed (s)


@dataclass(frozen=True, kw_only=True)
class SyntheticJob:
    """What was simulated, for the test's assertions."""

    status: dict[str, Any]
    replica_ids: tuple[str, ...]  # the replicas alive at the end (the restarted one included)
    killed: str
    restarted: str
    silent: str
    corrupt: str  # reported its state diverged from the majority's once


def replica_name(i: int, incarnation: int = 1) -> str:
    """A manager-server-like id: a name and a per-incarnation suffix."""
    return f"trainer-{i:02d}:{(i * 7919 + incarnation * 104729) & 0xFFFFFFFF:08x}"


def synthetic_status(
    *, replicas: int, minutes: float, clock: FakeClock, epoch: str = "5ca1ab1e0064"
) -> SyntheticJob:
    """Simulate the job (``minutes`` of fake time, one ping per replica per second)."""
    return asyncio.run(_simulate(replicas, minutes, clock, epoch))


def step_time_ms(i: int, second: int) -> float:
    """Replica ``i``'s step time in milliseconds at ``second``: 90-130 ms, one slow replica."""
    base = 90.0 + (i * 37 % 41)
    wobble = ((second * 13 + i * 7) % 11) - 5
    return base + wobble + (60.0 if i == 3 else 0.0)


async def _simulate(n: int, minutes: float, clock: FakeClock, epoch: str) -> SyntheticJob:
    core = LighthouseCore(CONFIG, clock, epoch, LighthouseMetrics())
    ids = [replica_name(i) for i in range(n)]
    queues = {rid: asyncio.Queue[bytes]() for rid in ids}
    for rid in ids:
        core.stream_opened(rid, queues[rid])

    def ask_all(members: list[str], step: int, second: int) -> None:
        for i, rid in enumerate(members):
            core.request(
                QuorumMember(
                    rid,
                    address=f"10.0.{i // 250}.{i % 250 + 1}:29512",
                    step=step,
                    world_size=8,
                    step_time_ms=step_time_ms(i, second),
                )
            )

    ask_all(ids, 0, 0)
    total_s = int(minutes * 60)
    kill_at, restart_at = int(total_s * 0.4), int(total_s * 0.6)
    killed, silent, corrupt = ids[7], ids[42 % n], ids[5]
    corrupt_at = int(total_s * 0.2)
    restarted = replica_name(7, incarnation=2)
    alive = list(ids)
    step = 0.0
    paused_until = -1
    for second in range(1, total_s + 1):
        clock.advance(1.0)
        if second > paused_until:
            slowest = max(step_time_ms(i, second) for i in range(n))
            step += 1000.0 / slowest  # lockstep: the slowest replica sets the pace
        if second == corrupt_at:  # its integrity check caught a flipped bit
            core.request(
                QuorumMember(
                    corrupt,
                    step=int(step),
                    world_size=8,
                    commit_failures=1,
                    integrity=IntegrityReport(
                        step=int(step), kind=IntegrityKind.DIVERGED, tensors=("layers.3.w",)
                    ),
                )
            )
        if second == kill_at:
            alive.remove(killed)
            core.stream_closed(killed, queues.pop(killed))
            paused_until = second + PAUSE_AFTER_KILL_S
        if second == paused_until:
            ask_all(alive, int(step), second)  # the survivors' next quorum, without the dead one
        if second == restart_at:
            queues[restarted] = asyncio.Queue()
            core.stream_opened(restarted, queues[restarted])
            core.request(QuorumMember(restarted, step=0, world_size=8))
            ask_all(alive, int(step), second)  # a joiner: everyone asks again; it heals
            alive.append(restarted)
        for i, rid in enumerate(alive):
            if rid == silent and second > total_s - 3:
                continue  # no ping for the last 3 s: shown as silent
            healing = rid == restarted and second < restart_at + HEAL_S
            core.progress(rid, 0 if healing else int(step), step_time_ms(i, second))
        core.tick()
    return SyntheticJob(
        status=core.snapshot(),
        replica_ids=tuple(alive),
        killed=killed,
        restarted=restarted,
        silent=silent,
        corrupt=corrupt,
    )


def wall_clock_for(clock: FakeClock, end_unix_ms: int, minutes: float) -> Callable[[], int]:
    """Wall-clock milliseconds for the fake clock, ending the run at ``end_unix_ms``."""
    start = clock.now()
    first_ms = end_unix_ms - int(minutes * 60 * 1000)
    return lambda: first_ms + int((clock.now() - start) * 1000)

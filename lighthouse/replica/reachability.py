"""Which peers of the previous quorum this replica group cannot reach.

After a failed step a manager server opens a TCP connection to each other
member's manager server (their advertised ``host:port``), all at once, each
bounded by `PROBE_TIMEOUT_S`, and reports the ones that failed with its next
quorum request (``QuorumMember.unreachable``). A partition between two
replicas makes each name the other; the lighthouse then cuts one of them out
(rule 8 in ``lighthouse.coordinator.quorum``). A connect to a live server
completes in the kernel even when its process is busy, so a slow peer is not
mistaken for an unreachable one; the probe sends nothing and closes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from lighthouse._net import split_host_port

__all__ = ["PROBE_TIMEOUT_S", "unreachable"]

#: Seconds one probe may take: far above a connect on any working network, and
#: short next to the process-group timeout the failed step already waited.
PROBE_TIMEOUT_S = 1.0


async def _reaches(address: str, timeout_s: float) -> bool:
    try:
        host, port = split_host_port(address)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, ValueError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def unreachable(
    peers: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S
) -> tuple[str, ...]:
    """The replica ids in `peers` (id -> manager server address) whose address
    did not accept a connection within `timeout_s` seconds, sorted."""
    ids = sorted(rid for rid, addr in peers.items() if addr)
    results = await asyncio.gather(*(_reaches(peers[rid], timeout_s) for rid in ids))
    return tuple(rid for rid, ok in zip(ids, results, strict=True) if not ok)

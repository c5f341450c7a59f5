"""A real heal, as the lighthouse reports it: a replica that joins late heals from
a live peer over HTTP, and the lighthouse's ``/status`` and ``/metrics`` show
what that heal moved (bytes, seconds, GB/s) as the healer measured it.

Two replica groups of one rank each, in processes of their own, with quorum
leases on (the default): the healer's first round after the heal runs on the
lease, so its report reaches the lighthouse on the liveness ping.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.integration.lh_fixtures import lighthouse
from tests.multiproc import RankContext, run_ranks
from tests.security.healing_job import HealingRun, healing_replica

pytestmark = pytest.mark.timeout(120)

STATE_ELEMENTS = 1 << 20  # float32: the state is 4 MiB (4,194,304 bytes) of tensor data
STATE_BYTES = STATE_ELEMENTS * 4
# What the transport counts beyond the tensor data: the skeleton (JSON text naming
# one tensor, well under a KiB) and padding of small tensors to 64 bytes (none here).
OVERHEAD_BOUND = 4096


def _replica(ctx: RankContext) -> dict[str, Any]:
    """Replica group ``ctx.rank`` with a 4 MiB state; replica 1 joins once replica 0
    committed step 2 and heals. It goes on a few steps after both took part, so the
    healer's report has been sent. ``ctx.args`` = (lighthouse address,)."""
    (lighthouse_addr,) = ctx.args
    run = HealingRun(
        lighthouse_addr=lighthouse_addr,
        env={},
        hostname="127.0.0.1",
        elements=STATE_ELEMENTS,
        min_step=8,
        together=3,
    )
    return healing_replica(ctx, run)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
        return body


def test_a_heal_from_a_live_peer_shows_its_bytes_and_seconds_on_status_and_metrics() -> None:
    with lighthouse(min_replicas=1, http_bind="127.0.0.1:0") as lh:
        r0, r1 = run_ranks(_replica, 2, lh.address(), timeout=100)
        assert r0["w0"] == r1["w0"]  # replica 1 healed replica 0's weights
        base = lh.http_address()
        assert base is not None
        status = json.loads(_get(f"{base}/status"))
        metrics = _get(f"{base}/metrics").decode()
    healer = r1["replica_id"]
    history = status["history"]
    reported = [e for e in history["timeline"] if e["heal_bytes"] is not None]
    assert len(reported) == 1, history["timeline"]
    (event,) = reported
    # the lighthouse saw replica 1 enter behind, and its catch-up carries the report
    assert event["kind"] == "caught_up" and event["replica_ids"] == [healer]
    assert STATE_BYTES < event["heal_bytes"] <= STATE_BYTES + OVERHEAD_BOUND
    assert 0 < event["heal_s"] < 10
    assert event["heal_gb_per_s"] == pytest.approx(event["heal_bytes"] / event["heal_s"] / 1e9)
    assert history["heals_reported"] == 1 and history["heal_bytes_total"] == event["heal_bytes"]
    assert [h["replica_id"] for h in history["heals"]] == [healer]
    # the healer's own series are dropped when it leaves; the counter keeps the total
    samples = dict(
        line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#")
    )
    assert float(samples["lighthouse_heal_bytes_total"]) == event["heal_bytes"]
    assert f'lighthouse_replica_heal_bytes{{replica_id="{healer}"}}' not in samples
    print(
        f"heal of {healer}: {event['heal_bytes']} bytes in {event['heal_s']:.4f} s "
        f"({event['heal_gb_per_s']:.3f} GB/s)"
    )

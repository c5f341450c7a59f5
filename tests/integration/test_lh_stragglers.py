"""A replica group that is alive but consistently slow is quarantined by the
lighthouse as a straggler, and the others go on committing at their own pace
(real processes, lighthouse, stores and Gloo; the quorum on a lease)."""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

import pytest

from lighthouse import LighthouseServer
from tests.multiproc import RankContext, run_ranks

pytestmark = pytest.mark.timeout(120)
SLOW = 2  # the rank whose replica group works six times as long per step
FAST_S, SLOW_S = 0.01, 0.06  # simulated compute per step (s)
WINDOW = 10  # steps the detector needs of every member
TARGET = 30  # steps the healthy pair must commit without the straggler
DONE = "healthy_done"


def _replica(ctx: RankContext) -> dict[str, Any]:
    import torch
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager import Manager

    (lighthouse,) = ctx.args
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    slow = ctx.rank == SLOW
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=10)),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{ctx.rank}",
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=5),
        init_sync=False,
    )
    coord = ctx.store
    out: dict[str, Any] = {"with_three": 0, "alone_steps_s": [], "refusal": ""}
    deadline = time.monotonic() + 80
    try:
        while time.monotonic() < deadline:
            if slow and coord.check([DONE]):
                break
            if not slow and len(out["alone_steps_s"]) >= TARGET:
                break
            began = time.monotonic()
            time.sleep(SLOW_S if slow else FAST_S)  # simulated compute, not synchronization
            try:
                manager.start_quorum()
                manager.allreduce(torch.ones(4)).wait()
                committed = manager.should_commit()
            except Exception as exc:  # the straggler, quarantined: its quorum times out
                assert slow, exc
                out["refusal"] = str(exc)
                continue
            if not committed:
                errored = manager.errored()  # the straggler's quorum timed out in its step
                if slow and errored is not None:
                    out["refusal"] = str(errored)
                continue
            if manager.num_participants() == 3:
                out["with_three"] += 1
            elif out["with_three"] and not slow:  # the straggler was taken out
                out["alone_steps_s"].append(time.monotonic() - began)
        if not slow:
            coord.add(DONE, 1)
    finally:
        manager.shutdown(wait=False)
    return out


def test_a_consistently_slow_group_is_quarantined_and_the_others_keep_their_pace() -> None:
    with LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=2,
        join_timeout_ms=500,
        quarantine_base_ms=120_000,  # it stays out for the rest of the test
        straggler_window=WINDOW,
    ) as lh:
        results = run_ranks(_replica, 3, lh.address(), timeout=100)
        status = lh.status()
    healthy = [results[r] for r in range(3) if r != SLOW]
    assert all(len(r["alone_steps_s"]) >= TARGET for r in healthy), results
    assert all(r["with_three"] >= WINDOW for r in healthy), results  # it was judged on a window
    # without the straggler the pair steps at its own pace, far below the slow one's
    for r in healthy:
        assert statistics.median(r["alone_steps_s"]) < 0.6 * SLOW_S, r["alone_steps_s"]
    held = [q for q in status["recent_quarantines"] if q["replica_id"].startswith(f"group{SLOW}")]
    assert len(held) == 1 and held[0]["strikes"] == 1, status["recent_quarantines"]
    assert held[0]["reason"].startswith("straggler: "), held[0]
    assert f"over {WINDOW} steps" in held[0]["reason"]
    assert all(
        not q["replica_id"].startswith(("group0", "group1")) for q in status["recent_quarantines"]
    )
    # the dashboard's timeline shows it with the reason (the tile's status and reason
    # while it is held are the unit tests'; by now the group has left)
    shown = [e["text"] for e in status["history"]["timeline"] if e["kind"] == "quarantine"]
    assert any(held[0]["reason"] in text for text in shown), shown
    assert status["stragglers"]["last_verdict"]["slowdown"] > 1.5
    # the straggler's own wait said why, in the lighthouse's words
    assert "straggler" in results[SLOW]["refusal"], results[SLOW]

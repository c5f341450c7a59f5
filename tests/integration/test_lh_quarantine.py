"""A replica group that can never configure is quarantined by the lighthouse and
the others go on committing (real processes, lighthouse, stores and Gloo)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from lighthouse import LighthouseServer
from tests.multiproc import RankContext, run_ranks

pytestmark = pytest.mark.timeout(180)
BROKEN = 2  # the rank whose replica group never configures
TARGET = 3  # steps the healthy groups must commit after the broken one joined
DONE = "healthy_done"


def _replica(ctx: RankContext) -> dict[str, Any]:
    import torch
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager import Manager

    class NeverConfigures(ProcessGroupGloo):
        def configure(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("this member can never configure")

    lighthouse, go_key = ctx.args
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    broken = ctx.rank == BROKEN
    pg = (NeverConfigures if broken else ProcessGroupGloo)(timeout=timedelta(seconds=2))
    manager = Manager(
        pg,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{ctx.rank}",
        timeout=timedelta(seconds=2),
        quorum_timeout=timedelta(seconds=8),
        init_sync=False,
    )
    coord = TCPStore("127.0.0.1", ctx.store_port, is_master=False, timeout=timedelta(seconds=60))
    out: dict[str, Any] = {"commits_after_join": 0, "errors": 0, "saw_broken": False}
    try:
        if not broken:  # the healthy groups commit once together before the broken one joins
            manager.start_quorum()
            manager.allreduce(torch.ones(1)).wait()
            assert manager.should_commit()
            coord.add(go_key, 1)
        else:
            while coord.add(go_key, 0) < 2:
                coord.wait([go_key], timedelta(seconds=60))
        # The broken group keeps trying until the healthy ones are done (or 45 s).
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and out["commits_after_join"] < TARGET:
            if broken and coord.check([DONE]) and "refusal" in out:
                break
            try:
                manager.start_quorum()
                manager.allreduce(torch.ones(1)).wait()
                committed = manager.should_commit()
            except Exception as exc:  # the broken group, quarantined: its quorum times out
                assert broken, exc
                out["refusal"] = str(exc)
                continue
            # count only what happens once the broken group took part in a quorum
            # the first failed step is the broken group's doing (nothing else fails here)
            out["saw_broken"] = out["saw_broken"] or not committed
            if not out["saw_broken"]:
                continue
            if committed:
                out["commits_after_join"] += 1
            else:
                out["errors"] += 1
        out["step"] = manager.current_step()
        if not broken:
            coord.add(DONE, 1)
    finally:
        manager.shutdown(wait=False)
    return out


def test_a_group_that_never_configures_is_quarantined_and_the_others_commit() -> None:
    with LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=2,  # the healthy pair starts together, and can go on without the third
        join_timeout_ms=200,
        quarantine_after_failures=2,
        quarantine_base_ms=60_000,
        quorum_lease=False,
    ) as lh:
        results = run_ranks(_replica, 3, lh.address(), "ready", timeout=150)
        status = lh.status()
    healthy = [results[r] for r in range(3) if r != BROKEN]
    assert all(r["saw_broken"] and r["commits_after_join"] >= TARGET for r in healthy), results
    assert all(r["errors"] >= 2 for r in healthy), results  # it did break their steps first
    assert results[BROKEN]["commits_after_join"] == 0
    held = [q for q in status["recent_quarantines"] if q["replica_id"].startswith(f"group{BROKEN}")]
    assert held and held[0]["strikes"] == 1, status["recent_quarantines"]
    assert all(not q["replica_id"].startswith("group0") for q in status["recent_quarantines"])
    assert "never committed a step" in held[0]["reason"]
    # the quarantined group heard why from the lighthouse, not a bare timeout
    assert "is quarantined for" in results[BROKEN]["refusal"], results[BROKEN]

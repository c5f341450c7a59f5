"""`ManagedProcessGroup` under every `torch.distributed` call, in a real job.

Each process is a one-rank replica group with its own Manager, manager server
and group store, meeting at one real lighthouse. After a quorum, the managed
group is the cross-replica group: every check of `tests.interop.calls` runs
on it with ``group=``, and the step must still commit (no call may have
reported an error to the Manager).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from lighthouse import LighthouseServer
from tests.interop.calls import Members, run_checks
from tests.multiproc import RankContext, run_ranks


def _replica(ctx: RankContext) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    from torchft_pg import ManagedProcessGroup, Manager, ProcessGroupGloo

    lighthouse, with_default = ctx.args
    if with_default:
        dist.init_process_group(
            "gloo",
            store=PrefixStore("default", ctx.store),
            rank=ctx.rank,
            world_size=ctx.world_size,
        )
    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=20)),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"replica{ctx.rank}",
        init_sync=False,
    )
    out: dict[str, Any] = {}
    try:
        manager.start_quorum()
        pg = ManagedProcessGroup(manager)
        rank = manager.participating_rank()
        assert rank is not None
        world = manager.num_participants()
        out["rank"], out["world"] = rank, world
        # Participants are ordered by replica id ("replica0" < "replica1"), so the
        # participating rank, and the default-group rank, is the process index.
        members = Members(
            rank=rank, world=world, globals_by_rank=tuple(range(world)), default_group=with_default
        )
        out["checks"] = run_checks(pg, members)
        errored = manager.errored()
        out["errored"] = None if errored is None else str(errored)
        out["committed"] = manager.should_commit()
    finally:
        manager.shutdown()
        if with_default:
            dist.destroy_process_group()
    return out


@pytest.mark.parametrize("with_default", [False, True], ids=["no-default-group", "default-group"])
def test_every_call_on_the_managed_group(with_default: bool) -> None:
    with LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=10_000) as lh:
        results = run_ranks(_replica, 2, lh.address(), with_default, timeout=120)
    failures = [
        f"process {p} {name}: {outcome}"
        for p, r in enumerate(results)
        for name, outcome in r["checks"].items()
        if outcome != "ok"
    ]
    assert failures == []
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 for r in results)
    assert len(results[0]["checks"]) >= 25
    assert [r["errored"] for r in results] == [None, None]
    assert all(r["committed"] for r in results)

"""The Manager against real servers: a real lighthouse, real manager servers,
real group TCPStores and Gloo, one process per replica group."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

import pytest

from lighthouse import LighthouseServer, LighthouseUnavailableError
from tests.multiproc import RankContext, run_ranks

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(ctx: RankContext) -> dict[str, Any]:
    import torch
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager import Manager

    (lighthouse,) = ctx.args
    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=10)),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"group{ctx.rank}",
        init_sync=False,
    )
    out: dict[str, Any] = {"sums": [], "timings": []}
    try:
        for _ in range(3):
            manager.start_quorum()
            t = torch.full((2,), float(ctx.rank + 1))
            manager.allreduce(t).wait()
            out["sums"].append(t.tolist())
            assert manager.should_commit()
            out["timings"].append(manager.last_quorum_timings())
        out["replica_id"] = manager.replica_id
        out["step"] = manager.current_step()
    finally:
        manager.shutdown()
    return out


def test_two_groups_commit_and_report_where_each_quorum_went() -> None:
    with LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=5000) as lh:
        results = run_ranks(_train, 2, lh.address(), timeout=90)
    for rank, r in enumerate(results):
        assert r["sums"] == [[1.5, 1.5]] * 3  # (1 + 2) / 2 participants
        assert r["step"] == 3
        assert r["replica_id"].startswith(f"group{rank}:")  # incarnation suffix once connected
        first, *steady = r["timings"]
        assert first.configure_s > 0  # the first quorum builds the group
        assert all(t.configure_s == 0.0 and t.heal_s == 0.0 for t in steady)


def test_a_lighthouse_that_is_not_there_fails_the_first_quorum_naming_it() -> None:
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupDummy
    from torchft_pg.manager import Manager

    addr = f"127.0.0.1:{_free_port()}"
    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    start = time.monotonic()
    manager = Manager(
        ProcessGroupDummy(),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=addr,
        replica_id="lonely",
        connect_timeout=timedelta(seconds=2),
    )
    # the constructor did not wait out the 2 s connect_timeout: connecting is in the background
    assert time.monotonic() - start < 1.0
    try:
        with pytest.raises(LighthouseUnavailableError, match=addr):
            manager.start_quorum()
        assert time.monotonic() - start < 15  # bounded by connect_timeout, not hung
    finally:
        manager.shutdown()


def test_a_step_past_int64_fails_at_once_not_at_the_quorum_timeout() -> None:
    """Loading it is refused; a step that got there anyway fails the step at once."""
    import torch
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.manager import Manager

    with LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=0) as lh:
        group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            ProcessGroupGloo(timeout=timedelta(seconds=10)),
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=group_store.port,
            lighthouse_addr=lh.address(),
            replica_id="huge",
            quorum_timeout=timedelta(seconds=60),
        )
        try:
            with pytest.raises(ValueError, match=r"step must be an int >= 0 and < 2\*\*63"):
                manager.load_state_dict({"step": 2**63, "batches_committed": 0})
            with pytest.raises(ValueError, match="batches_committed must be an int"):
                bad: dict[str, Any] = {"step": 1, "batches_committed": "2"}
                manager.load_state_dict(bad)
            manager._counters.step = 2**63  # e.g. a subclass's own restore path
            start = time.monotonic()
            manager.start_quorum()
            manager.allreduce(torch.ones(2)).wait()
            error = manager.errored()
            assert error is not None
            assert "step must be >= 0 and fit in an int64, got 9223372036854775808" in str(
                error.original_exception
            )
            with pytest.raises(ValueError, match="fit in an int64"):
                manager.should_commit()
            assert time.monotonic() - start < 30  # not the 60 s quorum timeout
        finally:
            manager.shutdown()

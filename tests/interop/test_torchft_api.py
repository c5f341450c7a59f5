"""Process-group calls torchft's own tests make, with torchft's arguments and shapes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import AllreduceOptions, HashStore, ReduceScatterOptions

from tests.multiproc import RankContext, run_ranks, store_server
from torchft_pg import ProcessGroupAbortedError, ProcessGroupBabyGloo, ProcessGroupGloo
from torchft_pg.process_group import ProcessGroup


@pytest.fixture
def store_addr() -> Iterator[str]:
    with store_server() as store:
        yield f"127.0.0.1:{store.port}"


def _make(kind: str, timeout: float) -> ProcessGroup:
    if kind == "gloo":
        return ProcessGroupGloo(timeout)
    return ProcessGroupBabyGloo(timeout, warm_spare=False)  # a spare would only cost CPU here


def _active_work(ctx: RankContext) -> dict[str, Any]:
    (kind,) = ctx.args
    pg = _make(kind, 20.0)
    pg.configure(ctx.addr("active"), ctx.rank, ctx.world_size)
    out: dict[str, Any] = {"before": pg.num_active_work()}
    t = torch.ones(2)
    if ctx.rank == 0:
        work = pg.allreduce([t], AllreduceOptions())  # waits for rank 1's half
        out["in_flight"] = pg.num_active_work()
        ctx.barrier("issued")
        work.wait()
    else:
        ctx.barrier("issued")
        work = pg.allreduce([t], AllreduceOptions())
        work.wait()
    out["after"] = pg.num_active_work()
    out["sum"] = t.tolist()
    ctx.barrier("done")
    pg.shutdown()
    return out


@pytest.mark.parametrize("kind", ["gloo", "baby_gloo"])
def test_num_active_work_counts_ops_in_flight(kind: str) -> None:
    first, second = run_ranks(_active_work, 2, kind, timeout=120)
    assert first["before"] == 0 and first["in_flight"] == 1 and first["after"] == 0
    assert second["after"] == 0
    assert first["sum"] == second["sum"] == [2.0, 2.0]


def _futures_of_every_op(ctx: RankContext) -> dict[str, list[float]]:
    (kind,) = ctx.args
    pg = _make(kind, 20.0)
    pg.configure(ctx.addr("fut"), ctx.rank, ctx.world_size)
    r = float(ctx.rank + 1)
    out: dict[str, list[float]] = {}
    dst = torch.zeros(2)
    inputs = [torch.full((2,), r), torch.full((2,), 10 * r)]
    pg.reduce_scatter([dst], [inputs], ReduceScatterOptions()).get_future().wait()
    out["reduce_scatter"] = dst.tolist()
    t = torch.full((2,), r)
    pg.allreduce([t], AllreduceOptions()).get_future().wait()
    out["allreduce"] = t.tolist()
    if ctx.rank == 0:
        pg.send([torch.full((1,), 5.0)], 1, 0).get_future().wait()
    else:
        got = torch.zeros(1)
        pg.recv([got], 0, 0).get_future().wait()
        out["recv"] = got.tolist()
    pg.shutdown()
    return out


@pytest.mark.parametrize("kind", ["gloo", "baby_gloo"])
def test_every_work_has_a_future_even_where_gloo_has_none(kind: str) -> None:
    first, second = run_ranks(_futures_of_every_op, 2, kind, timeout=120)
    assert first["reduce_scatter"] == [3.0, 3.0]  # rank 0 gets slot 0: 1 + 2
    assert second["reduce_scatter"] == [30.0, 30.0]
    assert first["allreduce"] == second["allreduce"] == [3.0, 3.0]
    assert second["recv"] == [5.0]


@pytest.mark.parametrize("kind", ["gloo", "baby_gloo"])
def test_a_configure_that_times_out_raises_timeout_error(kind: str, store_addr: str) -> None:
    pg = _make(kind, 1.0)
    try:
        with pytest.raises(TimeoutError, match=r"\[1\] did not arrive"):
            pg.configure(f"{store_addr}/alone", 0, 2)  # member 1 never comes
    finally:
        pg.shutdown()


def test_split_group_with_our_group_as_parent_fails_as_for_a_plain_group(
    store_addr: str,
) -> None:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
        pg.configure(f"{store_addr}/split", 0, 1)
        with pytest.raises(RuntimeError) as ours:
            dist.split_group(parent_pg=pg, split_ranks=[[0]])
        with pytest.raises(RuntimeError) as plain:
            dist.split_group(split_ranks=[[0]])
        # torch splits only accelerator (NCCL/XCCL) groups: the same refusal either way
        assert str(ours.value) == str(plain.value)
        pg.shutdown()
    finally:
        dist.destroy_process_group()


def test_baby_op_after_shutdown_raises_oserror_handle_is_closed(store_addr: str) -> None:
    """torchft's test_baby_gloo_apis ends with ``assertRaisesRegex(OSError, "handle is
    closed")`` around an allreduce after shutdown(); ours raises at the call too,
    and the error is also a ProcessGroupAbortedError that says how to recover."""
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=20), warm_spare=False)
    try:
        pg.configure(f"{store_addr}/baby-shut", "0", 0, 1)
        t = torch.full((3,), 2.0)
        pg.allreduce([t], AllreduceOptions()).wait()
        assert t.tolist() == [2.0, 2.0, 2.0]
        pg.shutdown()
        assert pg.child_pid is None  # the child is gone, not merely idle
        with pytest.raises(OSError, match="handle is closed") as err:
            pg.allreduce([torch.zeros(10)], AllreduceOptions()).wait()
        assert isinstance(err.value, ProcessGroupAbortedError)
        assert "ProcessGroupBabyGloo was shut down" in str(err.value)
        assert "call configure()" in str(err.value)
        pg.configure(f"{store_addr}/baby-shut-2", "0", 0, 1)  # a new child: usable again
        t = torch.full((3,), 5.0)
        pg.allreduce([t], AllreduceOptions()).wait()
        assert t.tolist() == [5.0, 5.0, 5.0]
    finally:
        pg.shutdown()


def test_baby_op_after_abort_is_not_reported_as_shut_down(store_addr: str) -> None:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=20), warm_spare=False)
    try:
        pg.configure(f"{store_addr}/baby-abort", 0, 1)
        pg.abort()
        with pytest.raises(ProcessGroupAbortedError, match="aborted") as err:
            pg.allreduce([torch.zeros(2)], AllreduceOptions())
        assert not isinstance(err.value, OSError)
    finally:
        pg.shutdown()

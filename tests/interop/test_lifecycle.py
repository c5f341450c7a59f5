"""Teardown, registration, abort and leaks, as third-party code drives them."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed import AllreduceOptions, HashStore, PrefixStore

from tests.multiproc import RankContext, run_ranks, store_server
from torchft_pg import ProcessGroupBabyGloo, ProcessGroupDummy, ProcessGroupGloo
from torchft_pg.errors import ProcessGroupAbortedError


@pytest.fixture
def default_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def store_addr() -> Iterator[str]:
    with store_server() as store:
        yield f"127.0.0.1:{store.port}"


@pytest.mark.parametrize("with_default", [False, True])
def test_destroy_process_group_on_an_unregistered_group(
    store_addr: str, with_default: bool, request: pytest.FixtureRequest
) -> None:
    if with_default:
        request.getfixturevalue("default_group")
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
    pg.configure(f"{store_addr}/d", 0, 1)
    dist.all_reduce(torch.ones(2), group=pg)
    dist.destroy_process_group(pg)  # what fairseq2's close() does
    with pytest.raises(ProcessGroupAbortedError, match="shut down"):
        pg.allreduce([torch.ones(1)])
    pg.configure(f"{store_addr}/d2", 0, 1)  # and it can be formed again
    dist.all_reduce(torch.ones(2), group=pg)
    pg.shutdown()


def test_register_again_after_destroying_the_registered_group(
    store_addr: str, default_group: None
) -> None:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
    pg.configure(f"{store_addr}/r", 0, 1)
    group = pg.register("first")
    dist.destroy_process_group(group)
    pg.configure(f"{store_addr}/r2", 0, 1)
    again = pg.register("second")
    assert pg.group_name == again.group_name
    t = torch.full((2,), 3.0)
    dist.all_reduce(t, group=again)
    assert t.tolist() == [3.0, 3.0]
    pg.unregister()
    pg.shutdown()


def test_destroying_the_default_group_keeps_a_live_group_usable(store_addr: str) -> None:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
    pg.configure(f"{store_addr}/k", 0, 1)
    dist.destroy_process_group()
    assert dist.get_world_size(group=pg) == 1
    assert dist.get_global_rank(pg, 0) == 0  # its rank table survived
    t = torch.ones(2)
    dist.broadcast(t, src=0, group=pg)
    pg.shutdown()


def _registered_and_renumbered(ctx: RankContext) -> dict[str, object]:
    dist.init_process_group(
        "gloo", store=PrefixStore("default", ctx.store), rank=ctx.rank, world_size=2
    )
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    pg.configure(ctx.addr("g1"), ctx.rank, 2)
    group = pg.register("renumbered")
    pg.configure(ctx.addr("g2"), 1 - ctx.rank, 2)  # process 0 is now group rank 1
    t = torch.full((2,), float(ctx.rank))
    dist.broadcast(t, src=0, group=group)  # src names global rank 0, i.e. process 0
    out = {"rank": dist.get_rank(group=group), "bcast": t.tolist()}
    dist.destroy_process_group()  # the default group, and our registered one with it
    return out


def test_a_registered_group_has_its_full_live_rank_table() -> None:
    results = run_ranks(_registered_and_renumbered, 2, timeout=60)
    assert [r["rank"] for r in results] == [1, 0]
    assert all(r["bcast"] == [0.0, 0.0] for r in results)


def _abort_in_flight(ctx: RankContext) -> float | None:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=60))
    pg.configure(ctx.addr("a"), ctx.rank, 2)
    if ctx.rank == 1:  # never joins the allreduce
        ctx.barrier("aborted")
        return None
    work = pg.allreduce([torch.ones(4)])
    started = time.monotonic()
    waiting = threading.Event()

    def abort_when_waiting() -> None:
        waiting.wait()
        pg.abort()

    threading.Thread(target=abort_when_waiting, daemon=True).start()
    waiting.set()
    with pytest.raises(ProcessGroupAbortedError):
        work.wait()
    elapsed = time.monotonic() - started
    ctx.barrier("aborted")
    return elapsed


def test_gloo_abort_fails_in_flight_work_at_once() -> None:
    elapsed, _ = run_ranks(_abort_in_flight, 2, timeout=90)
    assert elapsed is not None and elapsed < 30.0  # not the op's 60 s timeout


# -- ProcessGroupDummy as a fake group ------------------------------------------------------
def test_dummy_as_the_default_group_with_sub_groups() -> None:
    dist.Backend.register_backend(
        "fake_for_tests", lambda store, rank, world, timeout: ProcessGroupDummy(rank, world)
    )
    dist.init_process_group("fake_for_tests", store=HashStore(), rank=2, world_size=4)
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (2, 4)
        t = torch.full((3,), 5.0)
        dist.broadcast(t, src=0)
        dist.all_reduce(t)
        assert t.tolist() == [5.0, 5.0, 5.0]
        out = [torch.zeros(3) for _ in range(4)]
        dist.all_gather(out, torch.arange(3.0))
        assert all(o.tolist() == [0.0, 1.0, 2.0] for o in out)
        objs: list[object] = [None] * 4
        dist.all_gather_object(objs, {"me": 2})
        assert objs == [{"me": 2}] * 4
        sub = dist.new_group([1, 2])
        assert dist.get_rank(group=sub) == 1 and dist.get_world_size(group=sub) == 2
        dist.all_reduce(t, group=sub)
    finally:
        dist.destroy_process_group()


def test_dummy_under_a_plain_default_group(default_group: None) -> None:
    pg = ProcessGroupDummy(rank=3, world=5)
    assert dist.get_rank(group=pg) == 3 and dist.get_world_size(group=pg) == 5
    out = torch.zeros(10)
    dist.all_gather_into_tensor(out, torch.tensor([1.0, 2.0]), group=pg)
    assert out.tolist() == [1.0, 2.0] * 5
    pg.configure("unused-address", 0, 1)  # an address it never uses is fine
    pg.configure("host:1/p", "replica-a", 3, 5, quorum_id=4)  # torchft's form
    assert pg.configure_count == 2


# -- leaks ------------------------------------------------------------------------------
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_configure_destroy_cycles_and_dropped_groups_leak_nothing(store_addr: str) -> None:
    def cycle(i: int) -> None:
        pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
        pg.configure(f"{store_addr}/leak/{i}", 0, 1)
        dist.all_reduce(torch.ones(4), group=pg)
        if i % 2:
            dist.destroy_process_group(pg)
        # even cycles: dropped without shutdown

    for i in range(10):  # warm-up: pooled store client, reaper thread
        cycle(i)
    gc.collect()
    fds, threads = _fds(), threading.active_count()
    refs = []
    for i in range(10, 210):
        cycle(i)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
    pg.configure(f"{store_addr}/leak/last", 0, 1)
    refs.append(weakref.ref(pg))
    del pg
    gc.collect()
    assert refs[0]() is None, "a dropped group is still referenced"
    assert _fds() <= fds + 2, (fds, _fds())
    assert threading.active_count() <= threads + 1, (threads, threading.active_count())


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_baby_configure_cycles_with_shared_memory_tensors_leak_nothing(store_addr: str) -> None:
    warm = ProcessGroupGloo(timeout=timedelta(seconds=10))  # this store's pooled client
    warm.configure(f"{store_addr}/baby-shm/warm", 0, 1)
    warm.shutdown()
    before_shm, before_fds = _shm(), _fds()
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=30), warm_spare=False)
    big = torch.ones(64 * 1024)  # 256 KiB: travels through shared memory, not the socket
    for i in range(100):
        pg.configure(f"{store_addr}/baby-shm/{i}", 0, 1)
        work = pg.allreduce([big], AllreduceOptions())
        work.wait()
        dist.all_reduce(torch.ones(64 * 1024), group=pg)  # a fresh tensor each time
        if i == 9:
            warm_shm, warm_fds = _shm(), _fds()
    assert _shm() - warm_shm == set()
    assert _fds() <= warm_fds + 2, (warm_fds, _fds())
    pg.shutdown()
    gc.collect()
    assert _shm() - before_shm == set()
    assert _fds() <= before_fds + 2, (before_fds, _fds())


def test_a_dropped_baby_group_stops_its_children(store_addr: str) -> None:
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=30))
    pg.configure(f"{store_addr}/baby-drop", 0, 1)
    dist.all_reduce(torch.ones(2), group=pg)
    zygote = pg._children.zygote
    children = [c.proc for c in (pg._child, zygote) if c is not None]
    assert len(children) == 2  # the child, and the zygote that forks its replacements
    del pg
    gc.collect()
    for proc in children:
        assert proc.wait(timeout=20) is not None


def test_torchft_argument_forms(store_addr: str) -> None:
    pg = ProcessGroupBabyGloo(timeout=60.0)  # seconds, as torchft documents
    pg.configure(
        f"{store_addr}/tf", "replica-0", 0, 1, quorum_id=3, group_rank=0, group_world_size=1
    )
    dist.all_reduce(torch.ones(1), group=pg)
    pg.abort(errored=False)
    pg.shutdown()
    gloo = ProcessGroupGloo(timeout=5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        gloo.configure(f"{store_addr}/x", 0, 1, bogus=1)
    with pytest.raises(ValueError, match="global_ranks"):
        gloo.configure(f"{store_addr}/x", 0, 2, global_ranks=[3, 3])

"""ProcessGroupGloo across real processes on 127.0.0.1 (real TCPStore, real Gloo)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.distributed_c10d import GroupName

from tests.multiproc import RankContext, run_ranks
from tests.pg_checks import check_collectives
from torchft_pg import ProcessGroupGloo
from torchft_pg.errors import ProcessGroupAbortedError

CPU = torch.device("cpu")


def _collectives(ctx: RankContext) -> list[str]:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    pg.configure(ctx.addr("c/0"), ctx.rank, ctx.world_size)
    assert (pg.rank(), pg.size()) == (ctx.rank, ctx.world_size)
    names = check_collectives(pg, CPU)
    pg.shutdown()
    return names


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_collective_gives_exact_results(world_size: int) -> None:
    results = run_ranks(_collectives, world_size)
    assert all(r == results[0] for r in results)
    assert "reduce_scatter" in results[0] and "send_recv" in results[0]


def _torch_distributed_functions(ctx: RankContext) -> dict[str, object]:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    pg.configure(ctx.addr("tdf/0"), ctx.rank, ctx.world_size)
    out: dict[str, object] = {}
    t = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(t, group=pg)
    out["all_reduce"] = t.tolist()
    b = torch.full((2,), float(ctx.rank))
    dist.broadcast(b, group_src=1, group=pg)
    out["broadcast"] = b.tolist()
    objs: list[object] = [{"from": ctx.rank}]
    dist.broadcast_object_list(objs, group_src=0, group=pg)
    out["broadcast_object_list"] = objs
    gathered: list[object] = [None] * ctx.world_size
    dist.all_gather_object(gathered, ("rank", ctx.rank), group=pg)
    out["all_gather_object"] = gathered
    data = bytes(range(5)) * 3
    if ctx.rank == 0:
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), group_dst=1, group=pg)
        handle = dist.isend(
            torch.frombuffer(bytearray(data[::-1]), dtype=torch.uint8), group_dst=1, group=pg
        )
        assert handle is not None
        handle.wait()
    else:
        buf = torch.zeros(len(data), dtype=torch.uint8)
        dist.recv(buf, group_src=0, group=pg)
        out["recv"] = bytes(buf.tolist())
        req = dist.irecv(buf, group_src=0, group=pg)
        assert req is not None
        req.wait()
        out["irecv"] = bytes(buf.tolist())
    out["world"] = dist.get_world_size(pg)
    pg.shutdown()
    return out


def test_torch_distributed_functions_accept_our_group() -> None:
    r0, r1 = run_ranks(_torch_distributed_functions, 2)
    for r in (r0, r1):
        assert r["all_reduce"] == [3.0, 3.0]
        assert r["broadcast"] == [1.0, 1.0]
        assert r["broadcast_object_list"] == [{"from": 0}]
        assert r["all_gather_object"] == [("rank", 0), ("rank", 1)]
        assert r["world"] == 2
    data = bytes(range(5)) * 3
    assert r1["recv"] == data and r1["irecv"] == data[::-1]


def _ddp(ctx: RankContext) -> list[float]:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    pg.configure(ctx.addr("ddp/0"), ctx.rank, ctx.world_size)
    torch.manual_seed(ctx.rank)  # different init: DDP must broadcast rank 0's weights
    model = torch.nn.Linear(3, 1, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    # c10d fixes a group's C++ size at construction; the stock hook divides by the
    # live pg.size(), so gradients are averaged over the real world size.
    ddp.register_comm_hook(pg, allreduce_hook)
    x = torch.full((1, 3), float(ctx.rank + 1))
    ddp(x).sum().backward()
    assert model.weight.grad is not None
    grad = model.weight.grad.flatten().tolist()
    pg.shutdown()
    return grad + model.weight.detach().flatten().tolist()


def test_ddp_across_two_processes_averages_gradients() -> None:
    r0, r1 = run_ranks(_ddp, 2)
    assert r0 == r1  # same broadcast weights, same averaged gradients
    assert r0[:3] == [1.5, 1.5, 1.5]  # mean of inputs 1 and 2


def _ddp_dummy(ctx: RankContext) -> bool:
    from torchft_pg import ProcessGroupDummy

    model = torch.nn.Linear(3, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=ProcessGroupDummy(0, 1))
    ddp(torch.rand(2, 3)).sum().backward()
    return model.weight.grad is not None


def test_ddp_runs_with_dummy_group() -> None:
    assert run_ranks(_ddp_dummy, 1) == [True]


def _membership_changes(ctx: RankContext) -> list[float]:
    """3 members, then 2 (rank 2 gone), then 3 again; sums checked each time."""
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    sums = []
    plan = [(0, [0, 1, 2]), (1, [0, 1]), (2, [0, 1, 2]), (3, [0, 1, 2])]
    for gen, members in plan:
        if ctx.rank in members:
            pg.configure(ctx.addr(f"mc/{gen}"), members.index(ctx.rank), len(members))
            t = torch.tensor([float(ctx.rank + 1)])
            pg.allreduce([t]).wait()
            sums.append(t.item())
        ctx.barrier(f"gen{gen}")
    pg.shutdown()
    return sums


def test_reconfigure_membership_three_two_three() -> None:
    r0, r1, r2 = run_ranks(_membership_changes, 3)
    assert r0 == r1 == [6.0, 3.0, 6.0, 6.0]
    assert r2 == [6.0, 6.0, 6.0]


def _peer_dies(ctx: RankContext) -> dict[str, object]:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    pg.configure(ctx.addr("pd/0"), ctx.rank, 3)
    pg.allreduce([torch.ones(1)]).wait()
    if ctx.rank == 2:
        os._exit(0)  # dies without shutting anything down
    ctx.barrier("survivors", [0, 1])
    start = time.monotonic()
    error = ""
    try:
        for _ in range(3):  # the first op after the death may still be in flight
            pg.allreduce([torch.ones(1)]).wait()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    failed_after = time.monotonic() - start
    ctx.barrier("reconfigure", [0, 1])  # what the next quorum does in real use
    pg.configure(ctx.addr("pd/1"), ctx.rank, 2)
    t = torch.tensor([float(ctx.rank + 1)])
    pg.allreduce([t]).wait()
    pg.shutdown()
    return {"error": error, "failed_after": failed_after, "sum_after": t.item()}


def test_survivor_fails_within_timeout_then_reconfigures() -> None:
    results = run_ranks(_peer_dies, 3, allow_exit={2}, timeout=60)
    for r in results[:2]:
        assert r["error"], "a collective with a dead peer must fail, not succeed"
        assert r["failed_after"] < 5.0 + 2.0  # within the 5 s PG timeout (+ slack)
        assert r["sum_after"] == 3.0


def _shutdown_and_abort(ctx: RankContext) -> list[str]:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
    seen = []
    pg.configure(ctx.addr("sd/0"), ctx.rank, ctx.world_size)
    pg.allreduce([torch.ones(1)]).wait()
    pg.shutdown()
    pg.shutdown()  # idempotent
    try:
        pg.allreduce([torch.ones(1)])
    except ProcessGroupAbortedError as e:
        seen.append(str(e))
    pg.configure(ctx.addr("sd/1"), ctx.rank, ctx.world_size)
    pg.allreduce([torch.ones(1)]).wait()
    pg.abort()
    pg.abort()
    assert isinstance(pg.errored(), ProcessGroupAbortedError)
    pg.configure(ctx.addr("sd/2"), ctx.rank, ctx.world_size)
    assert pg.errored() is None
    t = torch.ones(1)
    pg.allreduce([t]).wait()
    seen.append(str(t.item()))
    pg.shutdown()
    return seen


def test_shutdown_and_abort_are_idempotent_and_configure_recovers() -> None:
    for r in run_ranks(_shutdown_and_abort, 2):
        assert "shut down" in r[0] and "configure()" in r[0]
        assert r[1] == "2.0"


def _register(ctx: RankContext) -> list[float]:
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("default", ctx.store),
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
    pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
    pg.configure(ctx.addr("reg/0"), ctx.rank, ctx.world_size)
    group = pg.register("ft_dp")
    assert pg.group_name == group.group_name
    t = funcol.all_reduce(torch.full((2,), float(ctx.rank + 1)), "sum", GroupName(pg.group_name))
    out = funcol.wait_tensor(t).tolist()
    pg.unregister()
    pg.unregister()  # idempotent
    still = torch.ones(1)
    pg.allreduce([still]).wait()  # unregistering leaves the group usable
    out.append(still.item())
    group = pg.register("ft_dp_again")
    dist.destroy_process_group(group)  # c10d's own teardown works too
    pg.unregister()
    dist.destroy_process_group()
    return out


def test_register_resolves_for_functional_collectives_and_unregisters() -> None:
    for r in run_ranks(_register, 2):
        assert r == [3.0, 3.0, 2.0]


def _swallow_peer_death(ctx: RankContext) -> dict[str, object]:
    from torchft_pg import ErrorSwallowingProcessGroupWrapper

    pg = ErrorSwallowingProcessGroupWrapper(ProcessGroupGloo(timeout=timedelta(seconds=5)))
    pg.configure(ctx.addr("sw/0"), ctx.rank, 3)
    pg.allreduce([torch.ones(1)]).wait()
    if ctx.rank == 2:
        os._exit(0)
    ctx.barrier("survivors", [0, 1])
    waits = [pg.allreduce([torch.ones(1)]).wait() for _ in range(3)]  # never raises
    untouched = torch.full((1,), 9.0)
    skipped = pg.allreduce([untouched]).wait()
    error = repr(pg.error())
    ctx.barrier("reconfigure", [0, 1])
    pg.configure(ctx.addr("sw/1"), ctx.rank, 2)
    after = torch.ones(1)
    pg.allreduce([after]).wait()
    pg.shutdown()
    return {
        "waits": waits,
        "skipped": skipped,
        "untouched": untouched.item(),
        "error": error,
        "cleared": after.item(),
    }


def test_error_swallowing_over_gloo_survives_a_dead_peer() -> None:
    for r in run_ranks(_swallow_peer_death, 3, allow_exit={2}, timeout=60)[:2]:
        assert False in r["waits"]  # the failure was reported, not raised
        assert r["skipped"] is True and r["untouched"] == 9.0
        assert "RuntimeError" in str(r["error"])
        assert r["cleared"] == 2.0


def _interrupted_configure(ctx: RankContext) -> dict[str, object]:
    import threading

    from torch.distributed import PrefixStore

    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    out: dict[str, object] = {}
    if ctx.rank < 2:  # rank 2 "died" after the quorum formed: it never configures

        def interrupt_once_both_arrived() -> None:
            PrefixStore("int/0", ctx.store).wait(["torchft_pg/present/0", "torchft_pg/present/1"])
            pg.interrupt_configure("replica 2 died")

        threading.Thread(target=interrupt_once_both_arrived, daemon=True).start()
        start = time.monotonic()
        try:
            pg.configure(ctx.addr("int/0"), ctx.rank, 3)
            out["error"] = "configured?"
        except ProcessGroupAbortedError as e:
            out["error"] = str(e)
        out["failed_after"] = time.monotonic() - start
        pg.configure(ctx.addr("int/1"), ctx.rank, 2)  # the next quorum, without rank 2
        t = torch.ones(1)
        pg.allreduce([t]).wait()
        out["sum"] = t.item()
        pg.shutdown()
    return out


def test_configure_with_a_dead_member_fails_at_once_when_interrupted() -> None:
    for r in run_ranks(_interrupted_configure, 3, timeout=60)[:2]:
        assert "configure interrupted: replica 2 died" in str(r["error"])
        assert r["failed_after"] < 5.0  # not the 20 s PG timeout
        assert r["sum"] == 2.0


def _listening_ipv4(pid: int | str = "self") -> set[str]:
    """The IPv4 addresses process `pid` has TCP sockets listening on (/proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    hosts = set()
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                packed = bytes.fromhex(local.split(":")[0])[::-1]  # little-endian
                hosts.add(".".join(str(b) for b in packed))
    return hosts


def _gloo_on_hostname(ctx: RankContext) -> dict[str, object]:
    host = f"127.0.0.{ctx.rank + 2}"  # every 127/8 address is this machine's loopback
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20), hostname=host)
    pg.configure(ctx.addr("hn/0"), ctx.rank, ctx.world_size)
    t = torch.full((1,), float(ctx.rank + 1))
    pg.allreduce([t]).wait()
    listening = _listening_ipv4()
    pg.shutdown()
    return {"host": host, "sum": t.item(), "listening": listening}


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc/net/tcp")
def test_hostname_is_the_address_gloo_binds_and_advertises() -> None:
    """Each rank's Gloo listens on its own `hostname` (not the machine's name, which
    often resolves to loopback), and the peers connect to it there."""
    for r in run_ranks(_gloo_on_hostname, 2):
        assert r["sum"] == 3.0
        assert r["host"] in r["listening"], r  # type: ignore[operator]


def _baby_gloo_on_hostname(ctx: RankContext) -> dict[str, object]:
    from torchft_pg import ProcessGroupBabyGloo

    host = f"127.0.0.{ctx.rank + 2}"
    pg = ProcessGroupBabyGloo(timeout=timedelta(seconds=20), hostname=host)
    pg.configure(ctx.addr("baby-hn/0"), ctx.rank, ctx.world_size)
    t = torch.full((1,), float(ctx.rank + 1))
    pg.allreduce([t]).wait()
    assert pg.child_pid is not None
    listening = _listening_ipv4(pg.child_pid)  # the child's Gloo, not this process
    pg.shutdown()
    return {"host": host, "sum": t.item(), "listening": listening}


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc/net/tcp")
def test_baby_gloo_takes_the_hostname_its_childs_gloo_binds_and_advertises() -> None:
    for r in run_ranks(_baby_gloo_on_hostname, 2):
        assert r["sum"] == 3.0
        assert r["host"] in r["listening"], r  # type: ignore[operator]


def test_hostname_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="hostname must be a str"):
        ProcessGroupGloo(timeout=timedelta(seconds=1), hostname=5)  # type: ignore[arg-type]


def test_an_op_issued_as_a_notice_aborts_the_group_does_not_wait_out_its_peers() -> None:
    """A thread took the backend to issue an op just as an abort retired it, while an
    earlier op still waits for a peer that will never come: letting go of the
    backend must not run its teardown (which waits out that op's 8 s timeout) on
    the issuing thread."""
    import threading

    from torchft_pg.process_group._staging import backend_op

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    groups = [ProcessGroupGloo(timeout=timedelta(seconds=8)) for _ in range(2)]
    meet = [
        threading.Thread(target=g.configure, args=(f"127.0.0.1:{store.port}/race", r, 2))
        for r, g in enumerate(groups)
    ]
    for t in meet:
        t.start()
    for t in meet:
        t.join(30)
    pg = groups[0]
    pending = pg.allreduce([torch.ones(4)])  # rank 1 never joins this op
    issue = backend_op(pg.parent, "allreduce")  # the issuing thread's fleeting reference
    pg.abort()  # a failure notice, on another thread in the Manager: the backend is retired
    began = time.monotonic()
    issue([torch.ones(4)])
    del issue  # the issuing thread lets go of the retired backend
    assert time.monotonic() - began < 4.0  # not the 8 s of the pending op
    with pytest.raises(ProcessGroupAbortedError):
        pending.wait()
    groups[1].abort()

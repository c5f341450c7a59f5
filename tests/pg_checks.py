"""Numeric checks of every collective, run inside each rank of a real group.

Shared by the Gloo, BabyGloo, NCCL and BabyNCCL tests: each value a rank
sends is a function of its rank, so each expected result is exact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceScatterOptions,
)

from torchft_pg.process_group import ProcessGroup


def _eq(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    want = want.to(got.dtype)
    assert torch.equal(got, want), f"{name}: got {got.tolist()}, want {want.tolist()}"


def check_collectives(
    pg: ProcessGroup, device: torch.device, skip: set[str] | None = None
) -> list[str]:
    """Run each collective once on `pg`; return the names checked."""
    skip = skip or set()
    rank, world = pg.rank(), pg.size()
    total = world * (world + 1) // 2  # sum of (r + 1) over ranks

    def full(value: float, n: int = 4) -> torch.Tensor:
        return torch.full((n,), float(value), device=device)

    def allreduce_opts() -> None:
        t = full(rank + 1)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp(ReduceOp.SUM)
        pg.allreduce([t], opts).wait()
        _eq("allreduce", t, torch.full((4,), float(total)))

    def allreduce_bare_op() -> None:
        t = full(rank + 1)
        pg.allreduce([t], ReduceOp.MAX).wait()  # type: ignore[arg-type]  # the bare-op form c10d's stubs omit
        _eq("allreduce(MAX)", t, torch.full((4,), float(world)))

    def allreduce_coalesced() -> None:
        a, b = full(rank + 1, 3), full(10 * (rank + 1), 5)
        pg.allreduce_coalesced([a, b], AllreduceCoalescedOptions()).wait()
        _eq("allreduce_coalesced[0]", a, torch.full((3,), float(total)))
        _eq("allreduce_coalesced[1]", b, torch.full((5,), float(10 * total)))

    def allgather() -> None:
        out = [[full(-1) for _ in range(world)]]
        pg.allgather(out, [full(rank)], AllgatherOptions()).wait()
        for i, t in enumerate(out[0]):
            _eq(f"allgather[{i}]", t, torch.full((4,), float(i)))

    def allgather_into_tensor_coalesced() -> None:
        out = torch.full((world * 2,), -1.0, device=device)
        pg.allgather_into_tensor_coalesced([out], [full(rank, 2)], AllgatherOptions()).wait()
        want = torch.arange(world, dtype=torch.float32).repeat_interleave(2)
        _eq("allgather_into_tensor_coalesced", out, want)

    def broadcast() -> None:
        root = world - 1
        t = full(rank + 100)
        opts = BroadcastOptions()
        opts.rootRank = root
        pg.broadcast([t], opts).wait()
        _eq("broadcast", t, torch.full((4,), float(root + 100)))

    def broadcast_one() -> None:
        t = full(rank + 7)
        pg.broadcast_one(t, 0).wait()
        _eq("broadcast_one", t, torch.full((4,), 7.0))

    def barrier() -> None:
        pg.barrier(BarrierOptions()).wait()

    def reduce_scatter() -> None:
        out = full(-1)
        inputs = [[full(rank + j) for j in range(world)]]
        pg.reduce_scatter([out], inputs, ReduceScatterOptions()).wait()
        want = sum(r + rank for r in range(world))
        _eq("reduce_scatter", out, torch.full((4,), float(want)))

    def reduce_scatter_tensor_coalesced() -> None:
        out = full(-1, 2)
        inp = torch.cat([full(rank + j, 2) for j in range(world)])
        pg.reduce_scatter_tensor_coalesced([out], [inp], ReduceScatterOptions()).wait()
        want = sum(r + rank for r in range(world))
        _eq("reduce_scatter_tensor_coalesced", out, torch.full((2,), float(want)))

    def alltoall_base() -> None:
        inp = torch.arange(world, dtype=torch.float32, device=device) + rank * world
        out = torch.full((world,), -1.0, device=device)
        pg.alltoall_base(out, inp, [], [], AllToAllOptions()).wait()
        want = torch.arange(world, dtype=torch.float32) * world + rank
        _eq("alltoall_base", out, want)

    def send_recv() -> None:
        if world < 2:
            return
        dst, src = (rank + 1) % world, (rank - 1) % world
        got = torch.zeros(3, dtype=torch.uint8, device=device)
        payload = torch.tensor([rank, 42, 255], dtype=torch.uint8, device=device)
        # Even ranks send first, odd ranks receive first, so a ring never deadlocks.
        if rank % 2 == 0:
            pg.send([payload], dst, 0).wait()
            pg.recv([got], src, 0).wait()
        else:
            pg.recv([got], src, 0).wait()
            pg.send([payload], dst, 0).wait()
        _eq("send/recv", got, torch.tensor([src, 42, 255]))

    checks: dict[str, Callable[[], None]] = {
        "allreduce": allreduce_opts,
        "allreduce_bare_op": allreduce_bare_op,
        "allreduce_coalesced": allreduce_coalesced,
        "allgather": allgather,
        "allgather_into_tensor_coalesced": allgather_into_tensor_coalesced,
        "broadcast": broadcast,
        "broadcast_one": broadcast_one,
        "barrier": barrier,
        "reduce_scatter": reduce_scatter,
        "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
        "alltoall_base": alltoall_base,
        "send_recv": send_recv,
    }
    done = []
    for name, check in checks.items():
        if name not in skip:
            check()
            done.append(name)
    return done

"""Plain torch DDP against the Manager's DDP on the same processes, in alternating rounds.

Shared by `bench/recovery.py` (its per-step overhead case) and
`bench/step_overhead.py` (a mid-size model, and a profile of the Manager's
steps). Each rank builds both on the same model: plain DDP over a default
Gloo group, and `torchft_pg`'s Manager (its own one-rank replica group,
quorum leases on) with its DDP and optimizer wrapper. Adjacent rounds share
the machine's load, so the median of each round's ratio to its neighbour is
the overhead (`paired_overhead`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tests.multiproc import RankContext


@dataclass(frozen=True, kw_only=True)
class DDPPair:
    """One step of each (`plain_step`, `ft_step`: zero_grad, forward, backward,
    optimizer step); `close` shuts the Manager and the default group down."""

    plain_step: Callable[[], None]
    ft_step: Callable[[], None]
    close: Callable[[], None]


def ddp_pair(
    ctx: RankContext, lighthouse: str, model: Callable[[], Any], x: Any, y: Any
) -> DDPPair:
    """Both DDPs on this rank, each on its own `model()`, trained on (`x`, `y`)
    with Adam and an MSE loss; warmed up with two steps each."""
    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore

    from torchft_pg import ProcessGroupGloo
    from torchft_pg.ddp import DistributedDataParallel
    from torchft_pg.manager import Manager
    from torchft_pg.optim import OptimizerWrapper

    # one compute thread per process, as torchrun sets (OMP_NUM_THREADS=1) when it
    # starts several: 2 processes x 2 threads would oversubscribe the 2 cores
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("plain", ctx.store), rank=ctx.rank, world_size=ctx.world_size
    )
    plain_model = model()
    plain = torch.nn.parallel.DistributedDataParallel(plain_model)
    plain_opt = torch.optim.Adam(plain_model.parameters())

    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ft_model = model()
    ft_inner = torch.optim.Adam(ft_model.parameters())
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=30)),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"bench{ctx.rank}",
        init_sync=False,
    )
    ft = DistributedDataParallel(manager, ft_model)
    ft_opt = OptimizerWrapper(manager, ft_inner)

    def plain_step() -> None:
        plain_opt.zero_grad()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        plain_opt.step()

    def ft_step() -> None:
        ft_opt.zero_grad()
        torch.nn.functional.mse_loss(ft(x), y).backward()
        ft_opt.step()

    def close() -> None:
        manager.shutdown()
        dist.destroy_process_group()

    for fn in (plain_step, ft_step, plain_step, ft_step):  # warm-up
        fn()
    return DDPPair(plain_step=plain_step, ft_step=ft_step, close=close)


def alternate(ctx: RankContext, pair: DDPPair, rounds: int, steps: int) -> dict[str, list[float]]:
    """`rounds` rounds of `steps` steps each, plain and Manager in turn (the order
    flipped every round: no drift bias), every round started together on all
    ranks. Seconds per step of each round, wall (``plain``, ``manager``) and CPU
    of all the rank's threads (``plain_cpu``, ``manager_cpu``)."""
    out: dict[str, list[float]] = {"plain": [], "manager": [], "plain_cpu": [], "manager_cpu": []}
    modes = [("plain", pair.plain_step), ("manager", pair.ft_step)]
    for r in range(rounds):
        for name, fn in modes if r % 2 == 0 else modes[::-1]:
            ctx.barrier(f"{name}/{r}")
            cpu = time.process_time()
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            out[name].append((time.perf_counter() - start) / steps)
            out[f"{name}_cpu"].append((time.process_time() - cpu) / steps)
    return out


def paired_overhead(per_rank: list[dict[str, Any]], ours: str, plain: str) -> float:
    """The median over both ranks of each round's ratio `ours` / `plain`, minus one."""
    ratios = [m / p for r in per_rank for m, p in zip(r[ours], r[plain], strict=True)]
    return statistics.median(ratios) - 1

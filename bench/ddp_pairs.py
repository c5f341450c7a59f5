"""Plain torch DDP against the Manager's DDP on the same processes, in alternating rounds.

Shared by `bench/recovery.py` (its per-step overhead case) and
`bench/step_overhead.py` (a mid-size model, and a profile of the Manager's
steps). Each rank builds both on the same model: plain DDP over a default
Gloo group, and `torchft_pg`'s Manager (its own one-rank replica group,
quorum leases on) with its DDP and optimizer wrapper. Adjacent rounds share
the machine's load, so the median of each round's ratio to its neighbour is
the overhead (`paired_overhead`).

Given torchft's lighthouse address (a run under a python that has the real
torchft installed), each rank also builds torchft's Manager (its own one-rank
replica group), DDP and optimizer wrapper on a third copy of the model, and the
rounds rotate through all three: torchft's figures come from the same
processes and the same minutes as ours.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tests.multiproc import RankContext


@dataclass(frozen=True, kw_only=True)
class DDPPair:
    """One step of each (`plain_step`, `ft_step`, and `torchft_step` when torchft
    runs too: zero_grad, forward, backward, optimizer step); `close` shuts the
    Managers and the default group down."""

    plain_step: Callable[[], None]
    ft_step: Callable[[], None]
    close: Callable[[], None]
    torchft_step: Callable[[], None] | None = None

    def modes(self) -> list[tuple[str, Callable[[], None]]]:
        """(name, step) of every variant: ``plain``, ``manager`` and ``torchft``."""
        out = [("plain", self.plain_step), ("manager", self.ft_step)]
        if self.torchft_step is not None:
            out.append(("torchft", self.torchft_step))
        return out


def _torchft_step(
    ctx: RankContext, lighthouse: str, model: Callable[[], Any], x: Any, y: Any
) -> tuple[Callable[[], None], Callable[[], None]]:
    """torchft's Manager + DDP + optimizer wrapper on this rank (its own one-rank
    replica group, the same timeouts as ours): (step, close)."""
    import torch
    from torch.distributed import TCPStore
    from torchft.ddp import DistributedDataParallel as TorchftDDP  # type: ignore[import-not-found]
    from torchft.manager import Manager as TorchftManager  # type: ignore[import-not-found]
    from torchft.optim import OptimizerWrapper as TorchftOptimizer  # type: ignore[import-not-found]
    from torchft.process_group import (  # type: ignore[import-not-found]
        ProcessGroupGloo as TorchftGloo,
    )

    # torchft's replica group store; held until close (the Manager reaches it by port)
    stores = [TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)]
    net = model()
    inner = torch.optim.Adam(net.parameters())
    manager = TorchftManager(
        pg=TorchftGloo(timeout=timedelta(seconds=30)),
        load_state_dict=lambda _: None,  # never called: nobody heals here
        state_dict=lambda: {},
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=stores[0].port,
        lighthouse_addr=lighthouse,
        replica_id=f"torchft{ctx.rank}",
        init_sync=False,
        timeout=timedelta(seconds=30),
    )
    ddp = TorchftDDP(manager, net)
    opt = TorchftOptimizer(manager, inner)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    def close() -> None:
        manager.shutdown(wait=False)
        stores.clear()

    return step, close


def ddp_pair(
    ctx: RankContext,
    lighthouse: str,
    model: Callable[[], Any],
    x: Any,
    y: Any,
    torchft_lighthouse: str | None = None,
) -> DDPPair:
    """Both DDPs on this rank, each on its own `model()`, trained on (`x`, `y`)
    with Adam and an MSE loss; warmed up with two steps each. With
    `torchft_lighthouse`, torchft's too (see the module docstring)."""
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

    torchft_step: Callable[[], None] | None = None
    torchft_close: Callable[[], None] | None = None
    if torchft_lighthouse is not None:
        torchft_step, torchft_close = _torchft_step(ctx, torchft_lighthouse, model, x, y)

    def close() -> None:
        manager.shutdown()
        if torchft_close is not None:
            torchft_close()
        dist.destroy_process_group()

    pair = DDPPair(plain_step=plain_step, ft_step=ft_step, close=close, torchft_step=torchft_step)
    for _ in range(2):  # warm-up
        for _, fn in pair.modes():
            fn()
    return pair


def alternate(
    ctx: RankContext,
    pair: DDPPair,
    rounds: int,
    steps: int,
    probe: Callable[[], dict[str, float]] | None = None,
) -> dict[str, list[float]]:
    """`rounds` rounds of `steps` steps each, every variant in turn (the order
    rotated, and reversed, from round to round: no drift bias), every round
    started together on all ranks. Seconds per step of each round, wall
    (``plain``, ``manager``, ``torchft``) and CPU of all the rank's threads
    (``plain_cpu``, ...).

    `probe` (on one rank) reads cumulative CPU seconds of other processes by
    variant (e.g. each variant's lighthouse); what a variant's process used from
    the start of each of that variant's rounds to the start of the next round
    (after every rank finished it) is summed into ``<variant>_probe``."""
    modes = pair.modes()
    out: dict[str, list[float]] = {}
    for name, _ in modes:
        out[name], out[f"{name}_cpu"], out[f"{name}_probe"] = [], [], []
    last: tuple[str, dict[str, float]] | None = None

    def sample(name: str) -> None:
        nonlocal last
        if probe is None:
            return
        now = probe()
        if last is not None and last[0] in now:
            out[f"{last[0]}_probe"].append(now[last[0]] - last[1][last[0]])
        last = (name, now)

    for r in range(rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            ctx.barrier(f"{name}/{r}")
            sample(name)
            cpu = time.process_time()
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            out[name].append((time.perf_counter() - start) / steps)
            out[f"{name}_cpu"].append((time.process_time() - cpu) / steps)
    ctx.barrier("end")
    sample("end")
    return out


def paired_overhead_ci(
    per_rank: list[dict[str, Any]],
    ours: str,
    plain: str,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """A bootstrap confidence interval (at `level`) of `paired_overhead`.

    Rounds are resampled with replacement, each round carrying both ranks'
    ratios (the ranks of one round share its load, so they are not
    independent samples); the interval is the percentiles of the resampled
    medians, minus one. It says how far one run's overhead can be trusted on
    a noisy machine: a target met by the point estimate but not by the upper
    end is not shown to be met."""
    rounds = [[r[ours][i] / r[plain][i] for r in per_rank] for i in range(len(per_rank[0][ours]))]
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(
            x for i in rng.choices(range(len(rounds)), k=len(rounds)) for x in rounds[i]
        )
        for _ in range(resamples)
    )
    tail = (1 - level) / 2
    lo = medians[int(tail * (resamples - 1))]
    hi = medians[int((1 - tail) * (resamples - 1))]
    return lo - 1, hi - 1


def paired_overhead(per_rank: list[dict[str, Any]], ours: str, plain: str) -> float:
    """The median over both ranks of each round's ratio `ours` / `plain`, minus one."""
    ratios = [m / p for r in per_rank for m, p in zip(r[ours], r[plain], strict=True)]
    return statistics.median(ratios) - 1

"""Heals are safe for FSDP2 by default: the source's ``model.state_dict()`` is never
read while its training thread runs a forward or backward.

FSDP2's state-dict hook reshards the parameters a forward has just unsharded,
so a heal that read the model's state on the quorum thread mid-forward failed
the source's step with "got mixed torch.Tensor and DTensor". Here a source
group trains FSDP2 with an asynchronous quorum and registers
``model.state_dict()`` as torchtitan does (no sharded-state helper), while the
other group rejoins as a new incarnation, healing from it each time: 10 times
in `make test`, 50 in the `slow` soak.

A heal is counted only if the step that gave an incarnation its first state
received one. The two groups start together, and with ``min_replicas=1`` a
healer incarnation that reaches the lighthouse before the source has ever
asked for a quorum forms a quorum alone on a fresh job and commits step 1
from its own state, healing nothing. So the healer starts only once the
source has committed a step: from then on every quorum it asks for holds the
source, ahead of it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from lighthouse import LighthouseServer
from tests.multiproc import RankContext, run_ranks
from torchft_pg import ProcessGroupGloo
from torchft_pg.manager import Manager
from torchft_pg.optim import OptimizerWrapper

GROUP_SIZE = 2
TIMEOUT = timedelta(seconds=30)
MAX_STEPS = 20_000  # bounds the source's loop; it stops long before
SOURCE_COMMITTED = "source_committed"  # test-store key: the source committed a step
SOURCE_START_TIMEOUT = timedelta(seconds=120)  # the source's start-up and first step


class Block(torch.nn.Module):
    """A layer that computes for a while (0.02 s) with its parameters unsharded,
    as a real model's layers do: its forward spans the moment a quorum result
    arrives, which a tiny model's would not."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        time.sleep(0.02)  # compute time, not synchronization
        return torch.tanh(y + self.linear.bias)


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block() for _ in range(6)))


def group_store(ctx: RankContext, name: str, group_rank: int) -> TCPStore:
    """A TCPStore hosted by group rank 0, found through the test's store under `name`."""
    if group_rank == 0:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        ctx.store.set(name, str(store.port))
        return store
    port = int(ctx.store.get(name).decode())
    return TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=TIMEOUT)


def new_manager(store: TCPStore, group_rank: int, lighthouse: str, replica: int) -> Manager:
    return Manager(
        ProcessGroupGloo(timeout=TIMEOUT),
        min_replica_size=1,
        rank=group_rank,
        world_size=GROUP_SIZE,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"replica_{replica}",
        timeout=TIMEOUT,
        quorum_timeout=TIMEOUT,
        connect_timeout=TIMEOUT,
    )


def _rank(ctx: RankContext) -> dict[str, Any]:
    """Ranks 0-1 are the source group and ranks 2-3 the healer group; with
    `source_present` False only a healer group runs (on ranks 0-1)."""
    lighthouse, heals_wanted, source_present = ctx.args
    replica, group_rank = divmod(ctx.rank, GROUP_SIZE)
    if not source_present:
        replica = 1
    group = [ctx.rank - group_rank + r for r in range(GROUP_SIZE)]  # this group's test ranks
    default_store = group_store(ctx, f"default/{replica}", group_rank)
    dist.init_process_group(
        "gloo",
        store=PrefixStore("default", default_store),
        rank=group_rank,
        world_size=GROUP_SIZE,
        timeout=timedelta(seconds=120),
    )
    mesh = init_device_mesh("cpu", (GROUP_SIZE,), mesh_dim_names=("fsdp",))
    model = make_model()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(ctx.rank))

    def load(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    def save() -> dict[str, Any]:  # torchtitan's way: the model's own state_dict()
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def step(manager: Manager, optimizer: OptimizerWrapper) -> None:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    try:
        if replica == 0:  # the source: trains until the healer is done
            store = group_store(ctx, "source", group_rank)
            manager = new_manager(store, group_rank, lighthouse, replica)
            manager.set_state_dict_fns(load, save)
            optimizer = OptimizerWrapper(manager, inner)
            sent = steps = 0
            announced = False
            for steps in range(MAX_STEPS):  # noqa: B007
                if ctx.store.check(["stop_at"]) and manager.current_step() >= int(
                    ctx.store.get("stop_at")
                ):
                    break
                if (
                    group_rank == 0
                    and ctx.store.check(["healed"])
                    and not ctx.store.check(["stop_at"])
                ):
                    ctx.store.set("stop_at", str(manager.current_step() + 3))
                step(manager, optimizer)
                timings = manager.last_quorum_timings()
                sent += int(timings is not None and timings.heal_s > 0)
                if group_rank == 0 and not announced and manager.current_step() > 0:
                    ctx.store.set(SOURCE_COMMITTED, "1")
                    announced = True
            manager.shutdown()
            return {"sent": sent, "steps": steps}
        if source_present:
            ctx.store.wait([SOURCE_COMMITTED], SOURCE_START_TIMEOUT)
        heals = unhealed = 0
        for incarnation in range(heals_wanted):  # the healer: a new incarnation per heal
            store = group_store(ctx, f"healer/{incarnation}", group_rank)
            manager = new_manager(store, group_rank, lighthouse, replica)
            manager.set_state_dict_fns(load, save)
            optimizer = OptimizerWrapper(manager, inner)
            healed = False
            for _ in range(200):
                was_at = manager.current_step()
                step(manager, optimizer)
                if was_at == 0 and manager.current_step() > 0:  # this step gave it a state
                    timings = manager.last_quorum_timings()
                    healed = timings is not None and timings.heal_s > 0
                if manager.current_step() > 0 and manager.is_participating():
                    heals += int(healed)
                    unhealed += int(not healed)
                    break
            manager.shutdown()
            ctx.barrier(f"incarnation/{incarnation}", members=group)
        if group_rank == 0:
            ctx.store.set("healed", "1")
        return {"heals": heals, "unhealed": unhealed}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("heals", [10, pytest.param(50, marks=pytest.mark.slow)])
def test_heals_from_an_fsdp2_source_training_with_an_asynchronous_quorum(heals: int) -> None:
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100, http_bind=None
    )
    try:
        results = run_ranks(_rank, 2 * GROUP_SIZE, lighthouse.address(), heals, True, timeout=840)
    finally:
        lighthouse.shutdown()
    source, healer = results[:GROUP_SIZE], results[GROUP_SIZE:]
    assert [(r["heals"], r["unhealed"]) for r in healer] == [(heals, 0)] * GROUP_SIZE, healer
    assert all(r["sent"] >= heals for r in source), source


def test_an_incarnation_that_trains_alone_is_not_counted_as_healed() -> None:
    """The start-up order the heal test once lost to (heals counted 50, sends 49),
    made certain: a healer incarnation that finds no source commits step 1 from
    its own state, and the heal test's count must say it healed nothing."""
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100, http_bind=None
    )
    try:
        results = run_ranks(_rank, GROUP_SIZE, lighthouse.address(), 1, False, timeout=240)
    finally:
        lighthouse.shutdown()
    assert [(r["heals"], r["unhealed"]) for r in results] == [(0, 1)] * GROUP_SIZE, results

"""A 2-replica Manager job for tests of heals: replica 1 joins at step 2 with other
weights, and ends equal to replica 0 only if it healed (over whatever the
environment turned on: the job secret, TLS)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from tests.multiproc import RankContext


@dataclass(frozen=True, kw_only=True)
class HealingRun:
    """One replica's part. `elements`: float32 values of its state; it stops once at
    `min_step` with at least `together` steps taken by both replicas."""

    lighthouse_addr: str
    env: dict[str, str]
    hostname: str | None = None
    elements: int = 4
    min_step: int = 6
    together: int = 1


def healing_replica(ctx: RankContext, run: HealingRun) -> dict[str, Any]:
    """Rank `ctx.rank` as replica group `ctx.rank`: its step, first weight, weights
    (when small), the participants of every step and its replica id."""
    from torch.distributed import TCPStore

    from torchft_pg import Manager, ProcessGroupGloo

    os.environ.update(run.env)  # what a launcher would export to every process of the job
    weight = torch.full((run.elements,), float(ctx.rank * 100))  # replica 1 must heal this away

    def load(sd: dict[str, torch.Tensor]) -> None:
        weight.copy_(sd["w"])

    if ctx.rank == 1:
        ctx.store.wait(["replica0/at-step-2"])
    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        ProcessGroupGloo(timeout=timedelta(seconds=10)),
        load_state_dict=load,
        state_dict=lambda: {"w": weight},
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=run.lighthouse_addr,
        replica_id=f"replica{ctx.rank}",
        hostname=run.hostname,
        timeout=timedelta(seconds=10),
    )
    participants: list[int] = []
    try:
        for _ in range(100):  # bounded: replica 0 waits for replica 1 at step 2
            if manager.current_step() >= run.min_step and participants.count(2) >= run.together:
                break
            manager.start_quorum()
            if ctx.rank == 1 and not participants:
                ctx.store.set("replica1/asked", "1")  # its first request is on its way
            grad = torch.ones(4)
            manager.allreduce(grad).wait()
            if manager.should_commit():
                weight[:4].add_(grad)
            participants.append(manager.num_participants())
            if ctx.rank == 0 and manager.current_step() == 2:
                ctx.store.set("replica0/at-step-2", "1")
                # Stepping on alone while replica 1 starts and sends its first request
                # (seconds on a loaded machine) could use up the bounded loop, and
                # replica 1 would then find nobody to heal from.
                ctx.store.wait(["replica1/asked"])
        return {
            "step": manager.current_step(),
            "w0": weight[0].item(),
            "w": weight.tolist() if run.elements <= 16 else None,
            "participants": participants,
            "replica_id": manager.replica_id,
        }
    finally:
        manager.shutdown()


def replica_with_env(ctx: RankContext) -> dict[str, Any]:
    """`healing_replica` with `ctx.args` = (lighthouse address, environment to export,
    hostname to advertise or None)."""
    lighthouse_addr, env, hostname = ctx.args
    return healing_replica(
        ctx, HealingRun(lighthouse_addr=lighthouse_addr, env=env, hostname=hostname)
    )

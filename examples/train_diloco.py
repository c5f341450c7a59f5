"""Fault-tolerant Streaming DiLoCo: run one torchrun per replica group against one lighthouse.

    .venv/bin/torchft-pg-lighthouse --bind 127.0.0.1:29510 --min-replicas 1 &
    REPLICA_GROUP_ID=0 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 \\
        .venv/bin/torchrun --nproc_per_node=1 --master_port=29600 examples/train_diloco.py
    REPLICA_GROUP_ID=1 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 \\
        .venv/bin/torchrun --nproc_per_node=1 --master_port=29601 examples/train_diloco.py

Each replica group trains alone on its shard of the data (inner AdamW steps)
and the groups meet only every SYNC_EVERY / 2 inner steps, when one of the
model's two fragments averages its pseudo-gradient and takes an outer
Nesterov step; the allreduce starts one inner step early, overlapping it.
Kill either torchrun at any time: the other keeps training and syncing; start
it again and, at its first sync, it heals (model, inner and outer optimizer
state, global parameters) from the live one.

Environment: STEPS (outer syncs, default 100), SYNC_EVERY (inner steps
between two syncs of a fragment, default 8), NUM_REPLICA_GROUPS (the most
groups the job will have, for sharding the data; default 2). With
``--nproc_per_node`` above 1, rank r of every group syncs with rank r of the
others; the ranks inside a group need their own data parallelism (FSDP/DDP),
as in examples/train_hsdp.py.
"""

import logging
import os
from datetime import timedelta
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchft_pg import ProcessGroupGloo
from torchft_pg.data import DistributedSampler
from torchft_pg.local_sgd import DiLoCo
from torchft_pg.manager import Manager


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    steps = int(os.environ.get("STEPS", "100"))
    sync_every = int(os.environ.get("SYNC_EVERY", "8"))
    replica = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", "2"))
    torch.manual_seed(0)  # every group starts from the same weights
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    fragments = [model[0], model[2]]
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer = [
        torch.optim.SGD(f.parameters(), lr=0.7, momentum=0.9, nesterov=True) for f in fragments
    ]

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager = Manager(  # reads TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID, MASTER_*, RANK, WORLD_SIZE
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        use_async_quorum=False,  # DiLoCo heals at the quorum, before its pseudo-gradient
        load_state_dict=load_state_dict,  # the model and inner optimizer; DiLoCo adds its own
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
    )

    x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(1))
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        dataset,
        replica_rank=replica,
        num_replica_groups=groups,
        group_rank=int(os.environ.get("RANK", "0")),
        num_replicas=int(os.environ.get("WORLD_SIZE", "1")),
    )
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    with DiLoCo(
        manager,
        fragments,
        inner,
        outer,
        sync_every=sync_every,
        fragment_sync_delay=1,
    ):
        epoch = 0
        while manager.current_step() < steps:
            sampler.set_epoch(epoch)
            for inputs, targets in loader:
                before = manager.current_step()
                inner.zero_grad()
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                inner.step()  # every SYNC_EVERY / 2 steps: one fragment's outer step
                if manager.current_step() != before:
                    epoch_, quorum = manager.quorum_id()
                    print(
                        f"replica {replica} rank {os.environ.get('RANK', '0')} "
                        f"step {manager.current_step()} quorum {epoch_}/{quorum} "
                        f"participants {manager.num_participants()} loss {loss.item():.4f}\n",
                        end="",  # one write per line: ranks share the terminal
                        flush=True,
                    )
                if manager.current_step() >= steps:
                    break
            epoch += 1
    manager.shutdown()


if __name__ == "__main__":
    main()

"""Fault-tolerant DDP: run one torchrun per replica group against one lighthouse.

    torchft-pg-lighthouse --bind 127.0.0.1:29510 --min-replicas 1 &
    REPLICA_GROUP_ID=0 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 \\
        torchrun --nproc_per_node=1 --master_port=29600 examples/train_ddp.py
    REPLICA_GROUP_ID=1 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 \\
        torchrun --nproc_per_node=1 --master_port=29601 examples/train_ddp.py

Kill either torchrun (or one of its workers) at any time: the other keeps
committing steps; start it again and it heals from the live one.
"""

import logging
import os
from datetime import timedelta

import torch

from torchft_pg import ProcessGroupGloo
from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.manager import Manager
from torchft_pg.optim import OptimizerWrapper


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    steps = int(os.environ.get("STEPS", "200"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=lambda sd: (
            model.load_state_dict(sd["model"]),
            inner.load_state_dict(sd["optim"]),
        ),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner)

    while manager.current_step() < steps:
        x = torch.randn(32, 16)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()  # starts this step's quorum in the background
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # gradients averaged over the live replica groups
        optimizer.step()  # applied only if every participating rank committed
        epoch, quorum = manager.quorum_id()
        print(
            f"replica {os.environ.get('REPLICA_GROUP_ID', '?')} rank {os.environ.get('RANK', '0')} "
            f"step {manager.current_step()} quorum {epoch}/{quorum} "
            f"participants {manager.num_participants()} loss {loss.item():.4f}",
            flush=True,
        )
    manager.shutdown()


if __name__ == "__main__":
    main()

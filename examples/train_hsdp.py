"""Fault-tolerant HSDP: FSDP2 shards inside each replica group, the Manager averages across groups.

One torchrun per replica group against one lighthouse (CPU/Gloo by default,
CUDA/NCCL when GPUs are visible):

    .venv/bin/torchft-pg-lighthouse --bind 127.0.0.1:29510 --min-replicas 1 &
    REPLICA_GROUP_ID=0 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 \\
        .venv/bin/torchrun --nproc_per_node=2 --master_port=29600 examples/train_hsdp.py
    REPLICA_GROUP_ID=1 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 \\
        .venv/bin/torchrun --nproc_per_node=2 --master_port=29601 examples/train_hsdp.py

On several machines, bind the lighthouse to a reachable address, point
TORCHFT_LIGHTHOUSE at it, and give each group's torchrun its own
``--master_addr`` (the host of that group's rank 0). Every replica group must
use the same number of ranks: a healing rank receives the shards of the same
group rank of a live group. Kill either torchrun at any time: the other keeps
committing steps; start it again and it heals from the live one.
"""

import logging
import os
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from torchft_pg import ProcessGroupGloo, ProcessGroupNCCL
from torchft_pg.device_mesh import ft_init_device_mesh
from torchft_pg.manager import Manager
from torchft_pg.optim import OptimizerWrapper
from torchft_pg.sharded_state import sharded_state_dict_fns


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    steps = int(os.environ.get("STEPS", "200"))
    cuda = torch.cuda.is_available()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")  # this replica group only (torchrun's env)
    group_size = dist.get_world_size()

    pg = (
        ProcessGroupNCCL(timeout=timedelta(seconds=10))
        if cuda
        else ProcessGroupGloo(timeout=timedelta(seconds=5))
    )
    manager = Manager(pg=pg, min_replica_size=1)
    # Dimension 0 spans the live replica groups (through the Manager); dimension 1 shards.
    mesh = ft_init_device_mesh(
        device.type, (1, group_size), ("dp_replicate", "dp_shard"), replicate_dim=0, manager=manager
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    replica, rank = os.environ.get("REPLICA_GROUP_ID", "?"), os.environ.get("RANK", "0")
    data = torch.Generator(device).manual_seed(
        zlib.crc32(f"{replica}/{rank}".encode())
    )  # each rank its own batches
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # Healing sends each rank's local shards (plain tensors) and rebuilds DTensors on arrival.
    manager.register_state_dict_fn("train", *sharded_state_dict_fns(model, inner))
    optimizer = OptimizerWrapper(manager, inner)

    while manager.current_step() < steps:
        x = torch.randn(32, 16, device=device, generator=data)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()  # starts this step's quorum in the background
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # reduce-scattered in the group, averaged over the live groups
        optimizer.step()  # applied only if every participating rank committed
        epoch, quorum = manager.quorum_id()
        print(
            f"replica {replica} rank {rank} "
            f"step {manager.current_step()} quorum {epoch}/{quorum} "
            f"participants {manager.num_participants()} loss {loss.item():.4f}\n",
            end="",  # one write per line: ranks share the terminal
            flush=True,
        )
    # The same group rank of every replica group holds the same shard: compare these across groups.
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.to_local().detach().cpu().contiguous().numpy().tobytes(), crc)
    print(
        f"replica {replica} rank {rank} done at step {manager.current_step()} shard crc32 {crc:08x}\n",
        end="",  # one write per line: ranks share the terminal
        flush=True,
    )
    manager.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Fault-tolerant DDP: run one torchrun per replica group against one lighthouse.

From the repository's root, after `make install`, each command in its own terminal:

    .venv/bin/torchft-pg-lighthouse --bind 127.0.0.1:29510 --min-replicas 1
    REPLICA_GROUP_ID=0 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 .venv/bin/torchrun --nproc_per_node=2 --master_port=29600 examples/train_ddp.py
    REPLICA_GROUP_ID=1 TORCHFT_LIGHTHOUSE=127.0.0.1:29510 .venv/bin/torchrun --nproc_per_node=2 --master_port=29601 examples/train_ddp.py

Kill either torchrun (Ctrl-C, or SIGKILL one of its workers) at any time: the
other keeps committing steps; start it again and it heals from the live one.
Each rank prints one line per step, ``step N committed`` or ``step N discarded
(why)``, and its parameters' checksum at the end (the same on every rank).

Environment: STEPS (committed steps to train, default 200); STEP_TIME_S
(seconds each step takes at least, default 0.25: 4 steps a second, so a run
lasts about a minute and a kill by hand lands mid-run; 0 runs flat out).
Every rank of every replica group draws its own batches; the ranks of a
group average their gradients among themselves, and the Manager averages
them across the live replica groups.
"""

import logging
import os
import time
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist

from torchft_pg import ProcessGroupGloo
from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.manager import Manager
from torchft_pg.optim import OptimizerWrapper


def why_discarded(manager: Manager) -> str:
    """This rank's failure of the step, else the vote that another rank cast."""
    error = manager.errored()
    if error is None:
        return "another rank voted no"
    text = str(error).splitlines()[0]
    return text if len(text) <= 100 else text[:99] + "…"


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    steps = int(os.environ.get("STEPS", "200"))
    step_time_s = float(os.environ.get("STEP_TIME_S", "0.25"))
    replica, rank = os.environ.get("REPLICA_GROUP_ID", "?"), os.environ.get("RANK", "0")
    group_size = int(os.environ.get("WORLD_SIZE", "1"))
    if group_size > 1:
        dist.init_process_group("gloo")  # this replica group only (torchrun's env)
    torch.manual_seed(0)  # one model: the same initial weights everywhere
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(zlib.crc32(f"{replica}/{rank}".encode()))  # own batches

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
        started, before = time.monotonic(), manager.current_step()
        x = torch.randn(32, 16, generator=data)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()  # starts this step's quorum in the background
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # gradients averaged over the live replica groups
        if group_size > 1:  # ... and over this group's ranks (Gloo has no AVG)
            for grad in [p.grad for p in model.parameters() if p.grad is not None]:
                dist.all_reduce(grad)
                grad.div_(group_size)
        optimizer.step()  # applied only if every participating rank committed
        epoch, quorum = manager.quorum_id()
        outcome = (
            f"step {manager.current_step()} committed"
            if manager.current_step() > before
            else f"step {before + 1} discarded ({why_discarded(manager)})"
        )
        print(
            f"replica {replica} rank {rank} {outcome} quorum {epoch}/{quorum} "
            f"participants {manager.num_participants()} loss {loss.item():.4f}\n",
            end="",  # one write per line: ranks share the terminal
            flush=True,
        )
        time.sleep(max(0.0, started + step_time_s - time.monotonic()))  # the pace, see above
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().numpy().tobytes(), crc)  # to compare across ranks
    print(
        f"replica {replica} rank {rank} done at step {manager.current_step()} crc32 {crc:08x}\n",
        end="",  # one write per line: ranks share the terminal
        flush=True,
    )
    manager.shutdown()
    if group_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One rank of a replica group, driving torchtitan's fault-tolerance modules unchanged.

Run as ``python -m tests.torchtitan.titan_worker MODE`` with torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) plus
``TORCHFT_LIGHTHOUSE`` and ``TITAN_REPLICA``/``TITAN_GROUPS``. It calls
torchtitan's ``torchtitan.experiments.torchft`` modules in the order
torchtitan's FT trainer calls them: the default group created with ``_ranks``
(the replica group's global ranks), ``TorchFTManager`` (which builds
``torchft.ProcessGroupGloo``, ``torchft.Manager`` and registers
``ManagedProcessGroup("dp_replicate")``), FSDP2 inside the group, the
all-reduce hook, ``TorchFTOptimizersContainer``, torchtitan's LR schedulers,
``TorchFTCheckpointManager`` (which registers the heal state through
``set_state_dict_fns``) and ``maybe_semi_sync_training``. ``import torchft``
there resolves to torchft_pg through the torchft-pg-compat distribution.

MODE is ``hsdp`` (asynchronous quorum, the all-reduce hook), ``diloco`` (two
fragments) or ``local_sgd``. It prints one JSON line per step: the step, the
Manager's committed step, the loss as torchtitan reduces it over the
fault-tolerant group, the participants, and a digest of every parameter's
local shard (per DiLoCo fragment for ``diloco``). It stops after ``--steps``
iterations, or once the committed step reaches the integer under key ``stop``
in the test's store (``TITAN_TEST_STORE``), when that is set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import TCPStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

VOCAB = 32
DIM = 16
LAYERS = 2
SEQ = 8
BATCH = 4
LR = 0.02


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.feed_forward = nn.Sequential(
            nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(self.attention_norm(x))


class TinyLM(nn.Module):
    """A decoder-shaped model with torchtitan's module names, so torchtitan's
    ``fragment_llm`` splits it as it splits Llama."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def make_model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def replay(dp_ranks_per_step: list[list[int]]) -> dict[str, torch.Tensor]:
    """The same training in one process without any parallelism: each step's
    gradient is the mean of its participating data-parallel ranks' loss
    gradients (a replica healing in a step contributes nothing). Its
    optimizer state is made as torchtitan's optimizer container makes it
    (one zero-gradient, zero-lr step, which AdamW counts)."""
    from torchtitan.components.optimizer.utils import init_optim_state

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    init_optim_state(optimizer)
    optimizer.zero_grad()
    for step, dp_ranks in enumerate(dp_ranks_per_step):
        optimizer.zero_grad()
        loss = torch.stack([loss_of(model, d, step) for d in dp_ranks]).mean()
        loss.backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def batch(dp_rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel rank `dp_rank`'s batch at committed step `step`: counting
    sequences (next token = token + 1) from random starts, so the loss falls."""
    g = torch.Generator().manual_seed(10_000 * step + dp_rank)
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    seq = (starts + torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def loss_of(
    model: nn.Module, dp_rank: int, step: int, device: torch.device | None = None
) -> torch.Tensor:
    inputs, labels = (t.to(device) for t in batch(dp_rank, step))
    return nn.functional.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())


def digest(params: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 over the names and bytes of each parameter's local shard."""
    h = hashlib.sha256()
    for name, p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(name.encode())
        flat = local.detach().reshape(-1).contiguous().cpu()
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class TrainState:
    """torchtitan's trainer state in its checkpoint (``train_state``)."""

    step: int = 0
    ntokens_seen: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.ntokens_seen = int(state_dict["ntokens_seen"])


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["hsdp", "diloco", "local_sgd"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sync-steps", type=int, default=2)
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="nccl: torchtitan's reference config (one GPU per rank, FSDP2 on CUDA too)",
    )
    args = parser.parse_args()

    from torchtitan.components.optimizer import LRSchedulersContainer, ParamGroupConfig
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
    from torchtitan.experiments.torchft.config import FaultTolerance
    from torchtitan.experiments.torchft.diloco import fragment_llm
    from torchtitan.experiments.torchft.manager import TorchFTManager, maybe_semi_sync_training
    from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer

    replica = int(os.environ["TITAN_REPLICA"])
    groups = int(os.environ["TITAN_GROUPS"])
    group_rank = int(os.environ["RANK"])
    group_size = int(os.environ["WORLD_SIZE"])
    test_store = TCPStore(
        "127.0.0.1",
        int(os.environ["TITAN_TEST_STORE"]),
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )

    # As torchtitan's FT trainer does: the default group named by its global ranks.
    first = replica * group_size
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", first + group_rank)  # one GPU per rank of the job
        torch.cuda.set_device(device)
    dist.init_process_group(
        "gloo" if args.backend == "gloo" else "cpu:gloo,cuda:nccl",
        timeout=timedelta(seconds=120),
        _ranks=list(range(first, first + group_size)),
    )
    semi_sync = None if args.mode == "hsdp" else args.mode
    ft_config = FaultTolerance(
        enable=True,
        process_group=args.backend,
        process_group_timeout_ms=10_000,
        replica_id=replica,
        group_size=groups,
        min_replica_size=1,
        semi_sync_method=semi_sync,
        sync_steps=args.sync_steps,
        num_fragments=2 if args.mode == "diloco" else 1,
    )
    ft_manager = ft_config.build()
    assert isinstance(ft_manager, TorchFTManager)
    dp_degree, dp_rank = ft_manager.get_dp_info(group_size, group_rank)

    mesh = init_device_mesh(device.type, (group_size,), mesh_dim_names=("fsdp",))
    model = make_model().to(device)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ft_manager.maybe_set_all_reduce_hook([model])

    optimizers = TorchFTOptimizersContainer(
        TorchFTOptimizersContainer.Config(
            param_groups=[
                ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": LR})
            ],
            implementation="for-loop",
        ),
        model_parts=[model],
        ft_manager=ft_manager,
    )
    # A constant learning rate: torchtitan's TorchFTOptimizersContainer serves a
    # state dict cached when it was built (or last loaded), whose param groups
    # carry the lr of that time, and its LR schedulers restore only last_epoch;
    # so with a changing lr a healed group's first step uses a stale lr (with
    # torchft too). docs/torchft.md says so.
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=0.0).build(
        optimizers=optimizers, training_steps=args.steps
    )
    train_state = TrainState()
    with tempfile.TemporaryDirectory() as folder:
        TorchFTCheckpointManager(
            TorchFTCheckpointManager.Config(enable=True, enable_ft_dataloader_checkpoints=False),
            dataloader=None,
            model_parts=[model],
            optimizers=optimizers,
            lr_schedulers=lr_schedulers,
            states={"train_state": train_state},
            sd_adapter=None,
            base_folder=folder,
            ft_manager=ft_manager,
        )
        manager = ft_manager.manager
        # The same split maybe_semi_sync_training makes (its fragments share these parameters).
        fragments = fragment_llm(model, ft_config, LAYERS) if args.mode == "diloco" else [model]
        context = maybe_semi_sync_training(
            ft_config,
            ft_manager=ft_manager,
            model=model,
            n_layers=LAYERS,
            optimizer=optimizers,
            fragment_fn=fragment_llm if args.mode == "diloco" else None,
        )
        timeouts = manager.timeouts
        emit(
            event="ready",
            replica=replica,
            rank=group_rank,
            dp_degree=dp_degree,
            timeouts=[
                timeouts.timeout.total_seconds(),
                timeouts.quorum_timeout.total_seconds(),
                timeouts.connect_timeout.total_seconds(),
                timeouts.quorum_retries,
            ],
        )
        with context:
            for it in range(args.steps):
                if test_store.check(["stop"]) and manager.current_step() >= int(
                    test_store.get("stop")
                ):
                    break
                optimizers.zero_grad()
                committed_before = manager.current_step()
                # The batch follows the committed step (the heal carries it), so a
                # healed group reads what its source reads at the same step.
                data_step = committed_before if semi_sync is None else it
                loss = loss_of(model, dp_rank, data_step, device)
                loss.backward()
                reduced = dist_utils.dist_mean(loss.detach(), None, ft_manager.loss_sync_pg)
                participating = manager.is_participating()  # False while healing
                optimizers.step()
                lr_schedulers.step()
                train_state.step += 1
                emit(
                    event="step",
                    replica=replica,
                    rank=group_rank,
                    it=it,
                    dp_rank=dp_rank,
                    participating=participating,
                    data_step=data_step,
                    committed=manager.current_step(),
                    participants=manager.num_participants(),
                    loss=reduced,
                    digest=digest(list(model.named_parameters())),
                    params={n: digest([(n, p)]) for n, p in model.named_parameters()},
                    optim=digest(
                        [
                            (f"{i}.{k}", v)
                            for i, st in enumerate(optimizers.optimizers[0].state.values())
                            for k, v in sorted(st.items())
                        ]
                    ),
                    fragments=[digest(list(f.named_parameters())) for f in fragments],
                )
        # every parameter gathered whole (a collective of the group: every rank calls it)
        full = {
            n: cast(DTensor, p).full_tensor().cpu().tolist() for n, p in model.named_parameters()
        }
        emit(
            event="done",
            replica=replica,
            rank=group_rank,
            committed=manager.current_step(),
            full=full if group_rank == 0 else None,
        )
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

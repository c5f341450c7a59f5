"""ft_init_device_mesh argument checks and sharded-state healing, in one process.

The DTensor cases run FSDP2 on c10d's "fake" backend (no sockets: every
collective completes at once), as rank 0 of a 2-rank group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchft_pg.device_mesh import ft_init_device_mesh
from torchft_pg.process_group import ManagedProcessGroup, ProcessGroupDummy
from torchft_pg.sharded_state import sharded_state_dict_fns, to_local_tree
from torchft_pg.work import completed_work


class NoManager:
    """Argument checks fail before the manager is touched."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the manager was used ({name}) before the arguments were checked")


@pytest.mark.parametrize(
    ("shape", "names", "dim", "error", "match"),
    [
        ((2, 2), ("r",), 0, ValueError, "same length"),
        ((2, 2), ("r", "r"), 0, ValueError, "unique"),
        ((2, 2), ("r", "s"), 2, ValueError, r"replicate_dim must be in \[0, 2\), got 2"),
        ((2, 2), ("r", "s"), "0", TypeError, "replicate_dim must be an int"),
        ((2,), ("r",), 0, ValueError, "DistributedDataParallel"),
        ((2, 0), ("r", "s"), 0, ValueError, "'s' must have a positive int size, got 0"),
    ],
)
def test_ft_init_device_mesh_names_the_bad_argument(
    shape: tuple[int, ...], names: tuple[str, ...], dim: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ft_init_device_mesh("cpu", shape, names, dim, NoManager())  # type: ignore[arg-type]


@pytest.fixture
def fake_world() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def sharded(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,), mesh_dim_names=("shard",)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_sharded_state_round_trips_local_shards(fake_world: None) -> None:
    src_model, src_opt = sharded(seed=0)
    dst_model, dst_opt = sharded(seed=1)
    dst_opt.state.clear()  # a freshly restarted replica has no optimizer state yet
    payload = sharded_state_dict_fns(src_model, src_opt).save()
    for name, t in payload["model"].items():
        assert type(t) is torch.Tensor, name  # what the heal transports can carry
    for entry in payload["optimizer"]["state"].values():
        assert all(type(t) is torch.Tensor for t in entry.values()), entry

    sharded_state_dict_fns(dst_model, dst_opt).load(payload)

    for (name, a), b in zip(
        src_model.state_dict().items(), dst_model.state_dict().values(), strict=True
    ):
        local = a.to_local() if isinstance(a, DTensor) else a
        other = b.to_local() if isinstance(b, DTensor) else b
        assert torch.equal(local, other), name
    src_state, dst_state = src_opt.state_dict()["state"], dst_opt.state_dict()["state"]
    assert src_state.keys() == dst_state.keys()
    for index, entry in src_state.items():
        assert isinstance(dst_state[index]["exp_avg"], DTensor)
        assert dst_state[index]["exp_avg"].placements == entry["exp_avg"].placements
        assert torch.equal(dst_state[index]["exp_avg"].to_local(), entry["exp_avg"].to_local())
        assert type(dst_state[index]["step"]) is torch.Tensor  # Adam keeps its step plain
        assert dst_state[index]["step"].item() == entry["step"].item()


def test_to_local_tree_keeps_structure(fake_world: None) -> None:
    model, _ = sharded(seed=0)
    weight = model.state_dict()["0.weight"]
    tree = to_local_tree({"a": [weight, (1, "x")], "b": None})
    assert type(tree["a"][0]) is torch.Tensor and tree["a"][0].shape == (2, 4)
    assert tree["a"][1] == (1, "x") and tree["b"] is None


def test_sharded_state_refuses_a_different_sharding(fake_world: None) -> None:
    model, optimizer = sharded(seed=0)
    payload = sharded_state_dict_fns(model, optimizer).save()
    payload["model"]["0.weight"] = torch.zeros(3, 4)  # a whole tensor, not this rank's shard
    with pytest.raises(
        ValueError, match=r"'0.weight': local shard shape \(2, 4\) expected, got \(3, 4\)"
    ):
        sharded_state_dict_fns(model, optimizer).load(payload)
    del payload["model"]["0.weight"]
    with pytest.raises(KeyError, match=r"missing \['0.weight'\]"):
        sharded_state_dict_fns(model, optimizer).load(payload)


class OneReplicaManager:
    """A Manager stand-in: one live replica, allreduce leaves tensors as they are."""

    def __init__(self) -> None:
        self.pg = ProcessGroupDummy(0, 1)
        self.allreduced: list[torch.Size] = []

    def allreduce(
        self, tensor: torch.Tensor, should_quantize: bool = False, reduce_op: Any = None
    ) -> Any:
        self.allreduced.append(tensor.shape)
        return completed_work(tensor)

    def num_participants(self) -> int:
        return 1

    def participating_rank(self) -> int | None:
        return 0

    def report_error(self, e: Exception) -> None:
        raise AssertionError(f"unexpected error: {e}")

    def errored(self) -> Exception | None:
        return None


def test_ft_mesh_slices_into_an_hsdp_mesh_whose_replicate_group_is_the_manager(
    fake_world: None,
) -> None:
    manager = OneReplicaManager()
    mesh = ft_init_device_mesh("cpu", (8, 2, 1), ("dp_replicate", "dp_shard", "tp"), 0, manager)
    assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "tp")
    assert tuple(mesh.shape) == (1, 2, 1)  # the replicate entry of mesh_shape is not used
    replicate = mesh.get_group("dp_replicate")
    assert isinstance(replicate, ManagedProcessGroup) and replicate.size() == 1
    dp = mesh["dp_replicate", "dp_shard"]
    assert dp.get_group("dp_replicate") is replicate
    model = torch.nn.Linear(4, 3)
    fully_shard(model, mesh=dp)
    model(torch.randn(5, 4)).sum().backward()
    # FSDP2 ran native HSDP: one all-reduce of the reduce-scattered gradients via the Manager.
    assert manager.allreduced == [
        torch.Size([10])
    ]  # this rank: 2 of 4 padded weight rows (8) + 2 bias
    replicate.unregister()

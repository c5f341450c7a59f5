"""DTensor layouts through the wire format in a fake world of 4 ranks (no sockets).

The fake backend lets one process build the meshes rank 1 of a 4-rank job
would build (2 x 2, slices, a flattened dimension), so the sender's layout and
the receiver's rebuilt one can be compared as `DeviceMesh.__eq__` and
`DTensor._spec` equality see them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _MaskPartial
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchft_pg.checkpointing.serialization import pack, unpack
from torchft_pg.checkpointing.skeleton import decode_skeleton


@pytest.fixture(scope="module")
def mesh() -> Iterator[DeviceMesh]:
    """Rank 1's 2 x 2 ("dp", "tp") mesh in a fake world of 4."""
    if dist.is_initialized():
        pytest.fail("a default process group is already initialized in this test process")
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        yield init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


def round_trip(sd: dict[str, Any]) -> dict[str, Any]:
    packed = pack(sd, 3)
    out: dict[str, Any] = unpack(decode_skeleton(packed.skeleton_bytes), packed.blobs)
    return out


def shard(mesh: DeviceMesh, placements: list[Any], *shape: int) -> DTensor:
    return DTensor.from_local(torch.randn(*shape), mesh, placements, run_check=False)


def test_slices_and_flattened_meshes_come_back_equal_to_the_receivers_own(
    mesh: DeviceMesh,
) -> None:
    flat = mesh._flatten("dp_tp")
    sd = {
        "whole": shard(mesh, [Shard(0), Replicate()], 3, 2),
        "tp": shard(mesh["tp"], [Shard(0)], 3),
        "dp": shard(mesh["dp"], [Replicate()], 3),
        "flat": shard(flat, [Shard(0)], 3),
    }
    out = round_trip(sd)
    for key, sent in sd.items():
        got = out[key]
        assert isinstance(got, DTensor), key
        assert got.device_mesh == sent.device_mesh and got._spec == sent._spec, key
        assert torch.equal(got.to_local(), sent.to_local()), key
    assert out["tp"].device_mesh == mesh["tp"], "the receiver's own slice"
    assert out["tp"].device_mesh.get_group(0) is mesh["tp"].get_group(0)
    assert out["tp"].device_mesh.mesh.tolist() == [0, 1]


def test_a_rank_outside_the_mesh_keeps_the_shard_it_was_sent(mesh: DeviceMesh) -> None:
    del mesh  # the fake world the mesh below is built in
    outside = DeviceMesh("cpu", 2)  # rank 1 is not in it (torchft's tests build such a mesh)
    sent = DTensor.from_local(torch.tensor([5, 6, 7]), outside, [], run_check=False)
    sent = DTensor(torch.tensor([5, 6, 7]), sent._spec, requires_grad=False)
    got = round_trip({"d": sent})["d"]
    assert got._spec == sent._spec and torch.equal(got.to_local(), torch.tensor([5, 6, 7]))


def test_layouts_that_cannot_be_described_arrive_as_the_plain_local_shard(
    mesh: DeviceMesh,
) -> None:
    unnamed = init_device_mesh("cpu", (2, 2))
    no_groups = DeviceMesh("cpu", [0, 1, 2, 3], _init_backend=False)
    sd = {
        "unnamed": shard(unnamed, [Shard(0), Replicate()], 3),
        "no_groups": shard(no_groups, [Shard(0)], 3),
        "mask": shard(mesh["tp"], [_MaskPartial()], 3),
        "ok": shard(mesh, [Replicate(), Replicate()], 3),
    }
    packed = pack(sd, 3)
    assert b'"layouts"' in packed.skeleton_bytes
    out = round_trip(sd)
    for key in ("unnamed", "no_groups", "mask"):
        assert type(out[key]) is torch.Tensor, key
        assert torch.equal(out[key], sd[key].to_local()), key
    assert isinstance(out["ok"], DTensor)

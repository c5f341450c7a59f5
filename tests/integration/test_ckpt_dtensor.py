"""DTensor state dicts through every checkpoint transport, in a 1-rank gloo world on CPU.

The sender sends each DTensor's local shard and a description of its layout
(mesh, placements, global shape and stride); the receiver gets, when its own
state dict has a DTensor at that path, that DTensor with its local shard filled
in place, else a DTensor rebuilt from the description on the process groups of
the same names (see `torchft_pg.checkpointing.serialization`). HTTP runs over
real sockets on 127.0.0.1; PGTransport over the in-memory group of the PG unit
tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from tests.unit.test_ckpt_pg_fake import pair
from torchft_pg.checkpointing import HTTPTransport, InProcessHub, InProcessTransport, PGTransport
from torchft_pg.checkpointing.serialization import pack, unpack
from torchft_pg.checkpointing.skeleton import as_dtensor, decode_skeleton
from torchft_pg.errors import RecoveryError

T = timedelta(seconds=10)
Receive = Callable[[dict[str, Any], Any], dict[str, Any]]


@pytest.fixture(scope="module")
def mesh() -> Iterator[DeviceMesh]:
    """A 1-D CPU mesh over a gloo world of one rank (store on 127.0.0.1, ephemeral port)."""
    if dist.is_initialized():
        pytest.fail("a default process group is already initialized in this test process")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=T)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=T)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def half_of(local: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    """`local` as rank 0's shard of a DTensor twice as long (what a 2-way Shard(0) holds)."""
    shape = (2 * local.shape[0], *local.shape[1:])
    return DTensor.from_local(
        local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=local.stride()
    )


def sent_state(mesh: DeviceMesh) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": half_of(torch.randn(8, 3, generator=g), mesh),
        "big": distribute_tensor(torch.randn(1 << 19, generator=g), mesh, [Shard(0)]),
        "bias": distribute_tensor(torch.randn(5, generator=g), mesh, [Replicate()]),
        "plain": torch.arange(4),
        "epoch": 2,
    }


def zeros_like_sent(mesh: DeviceMesh) -> dict[str, Any]:
    return {
        "w": half_of(torch.zeros(8, 3), mesh),
        "big": distribute_tensor(torch.zeros(1 << 19), mesh, [Shard(0)]),
        "bias": distribute_tensor(torch.zeros(5), mesh, [Replicate()]),
        "plain": torch.zeros(4, dtype=torch.int64),
        "epoch": 0,
    }


def via_in_process(sd: dict[str, Any], template: Any) -> dict[str, Any]:
    hub = InProcessHub()
    sender: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "src")
    fn = (lambda: template) if template is not None else None
    receiver: InProcessTransport[dict[str, Any]] = InProcessTransport(hub, "dst", state_dict=fn)
    sender.send_checkpoint([1], 4, sd, T)
    return receiver.recv_checkpoint(0, sender.metadata(), 4, T)


def via_http(num_chunks: int) -> Receive:
    def receive(sd: dict[str, Any], template: Any) -> dict[str, Any]:
        fn = (lambda: template) if template is not None else None
        sender = HTTPTransport[dict[str, Any]](T, bind_host="127.0.0.1")
        receiver = HTTPTransport[dict[str, Any]](
            T, num_chunks, bind_host="127.0.0.1", state_dict=fn
        )
        try:
            sender.send_checkpoint([1], 4, sd, T)
            return receiver.recv_checkpoint(0, sender.address(), 4, T)
        finally:
            sender.shutdown()
            receiver.shutdown()

    return receive


def via_pg(sd: dict[str, Any], template: Any) -> dict[str, Any]:
    g0, g1 = pair()
    cpu = torch.device("cpu")
    fn = (lambda: template) if template is not None else None
    sender = PGTransport[dict[str, Any]](g0, T, cpu)
    receiver = PGTransport[dict[str, Any]](g1, T, cpu, state_dict=fn)
    sender.send_checkpoint([1], 4, sd, T)  # the in-memory group's sends never block
    return receiver.recv_checkpoint(0, sender.metadata(), 4, T)


TRANSPORTS: dict[str, Receive] = {
    "in_process": via_in_process,
    "http": via_http(0),
    "http_chunked": via_http(3),
    "pg": via_pg,
}


def local(t: Any) -> torch.Tensor:
    assert isinstance(t, DTensor)
    return t.to_local()


def same_layout(got: Any, sent: DTensor) -> None:
    """`got` is a DTensor laid out as `sent` (torchft compares the whole spec)."""
    assert isinstance(got, DTensor), f"a DTensor, got {type(got).__name__}"
    assert got.device_mesh == sent.device_mesh
    assert got.placements == sent.placements
    assert got.shape == sent.shape and got.stride() == sent.stride() and got.dtype == sent.dtype
    assert got._spec == sent._spec


@pytest.mark.parametrize("how", list(TRANSPORTS))
def test_without_a_target_each_dtensor_is_rebuilt_with_the_senders_layout(
    mesh: DeviceMesh, how: str
) -> None:
    sd = sent_state(mesh)
    out = TRANSPORTS[how](sd, None)
    for key in ("w", "big", "bias"):
        got = out[key]
        same_layout(got, sd[key])
        assert torch.equal(local(got), local(sd[key])), key
        assert local(got).data_ptr() != local(sd[key]).data_ptr(), f"{key}: a copy"
        assert not got.requires_grad
    assert out["w"].shape == (16, 3) and local(out["w"]).shape == (8, 3)
    assert out["w"].device_mesh.get_group(0) is mesh.get_group(0), "this process's group"
    assert out["w"].device_mesh is out["big"].device_mesh, "one mesh per sender mesh"
    assert torch.equal(out["plain"], torch.arange(4)) and out["epoch"] == 2


@pytest.mark.parametrize("how", ["http", "pg"])
def test_named_meshes_and_every_placement_kind_are_rebuilt(mesh: DeviceMesh, how: str) -> None:
    del mesh  # the default group the meshes below are built on
    mesh2 = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    mesh0 = DeviceMesh("cpu", 0)  # no dimensions, as torchft's transport tests build it
    g = torch.Generator().manual_seed(1)
    sd: dict[str, Any] = {
        "sr": distribute_tensor(torch.randn(4, 6, generator=g), mesh2, [Shard(1), Replicate()]),
        "p": DTensor.from_local(torch.randn(3, generator=g), mesh2, [Partial("avg"), Shard(0)]),
        "ss": DTensor.from_local(
            torch.randn(4, 2, generator=g),
            mesh2,
            [_StridedShard(0, split_factor=2), Replicate()],
            run_check=False,
        ),
        "zero_dim_mesh": distribute_tensor(torch.tensor([5, 6, 7]), mesh0, []),
        "sub": distribute_tensor(torch.randn(5, generator=g), mesh2["tp"], [Shard(0)]),
    }
    out = TRANSPORTS[how](sd, None)
    for key, sent in sd.items():
        same_layout(out[key], sent)
        assert torch.equal(local(out[key]), local(sent)), key
    assert out["sr"].device_mesh.mesh_dim_names == ("dp", "tp")


@pytest.mark.parametrize("how", list(TRANSPORTS))
def test_a_dtensor_target_is_filled_in_place(mesh: DeviceMesh, how: str) -> None:
    sd = sent_state(mesh)
    mine = zeros_like_sent(mesh)
    mine["big"] = torch.nn.Parameter(mine["big"])  # a parameter: requires_grad must not matter
    ptrs = {k: local(mine[k]).data_ptr() for k in ("w", "big", "bias")}
    out = TRANSPORTS[how](sd, mine)
    for key in ("w", "big", "bias"):
        got = out[key]
        assert got is mine[key], f"{key}: the receiver's own DTensor comes back"
        assert local(got).data_ptr() == ptrs[key], f"{key}: received into its local shard"
        assert torch.equal(local(got), local(sd[key])), key
        assert got.placements == sd[key].placements and got.shape == sd[key].shape, key
    assert out["big"].requires_grad
    assert out["w"].shape == (16, 3) and torch.equal(out["plain"], torch.arange(4))


@pytest.mark.parametrize("how", ["in_process", "http"])
def test_a_dtensor_sharded_differently_is_a_recovery_error(mesh: DeviceMesh, how: str) -> None:
    sd = sent_state(mesh)
    mine = zeros_like_sent(mesh)
    mine["w"] = DTensor.from_local(
        torch.zeros(8, 3),
        mesh,
        [Shard(0)],
        run_check=False,
        shape=torch.Size((24, 3)),
        stride=(3, 1),
    )
    with pytest.raises(
        RecoveryError,
        match=r"DTensor at \('w',\): the sender's local shard is torch.float32 \[8, 3\] of "
        r"global shape \[16, 3\], this receiver's is torch.float32 \[8, 3\] .* of global "
        r"shape \[24, 3\]",
    ):
        TRANSPORTS[how](sd, mine)
    assert not local(mine["w"]).any(), "nothing was written into the mismatched target"


def test_plain_tensors_and_dtensors_are_not_received_into_each_other(mesh: DeviceMesh) -> None:
    sent = distribute_tensor(torch.randn(6), mesh, [Shard(0)])
    sd = {"d": sent, "p": torch.randn(6)}
    mine = {"d": torch.zeros(6), "p": distribute_tensor(torch.zeros(6), mesh, [Shard(0)])}
    out = via_in_process(sd, mine)
    same_layout(out["d"], sent)
    assert type(out["p"]) is torch.Tensor and out["p"] is not mine["p"]
    assert torch.equal(local(out["d"]), local(sd["d"])) and torch.equal(out["p"], sd["p"])
    assert not mine["d"].any() and not local(mine["p"]).any()


def forged(mesh: DeviceMesh, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The skeleton of a one-DTensor state dict, with `change` applied to its JSON."""
    doc = json.loads(
        pack({"d": distribute_tensor(torch.randn(6), mesh, [Shard(0)])}, 1).skeleton_bytes
    )
    change(doc)
    return json.dumps(doc).encode()


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (_set(("layouts", 0, 2), [["S", 1]]), r"Shard\(1\) of a 1-dimensional tensor"),
        (_set(("layouts", 0, 2), [["Q"]]), "unknown placement"),
        (_set(("layouts", 0, 2), [["P", "os.system"]]), "unknown placement"),
        (_set(("layouts", 0, 2), []), "1 placements for a 1-dimensional mesh, got 0"),
        (_set(("layouts", 0, 3), [1, 1]), "global stride"),
        (_set(("layouts", 0, 0), 5), "not a DTensor"),
        (_set(("layouts", 0, 1), 3), "mesh 3 out of range"),
        (_set(("meshes", 0, 0), "ops"), "device type"),
        (_set(("meshes", 0, 2), [-1]), "ranks"),
        (_set(("meshes", 0, 1), [2]), "ranks"),
        (_set(("meshes", 0, 4), []), "process group names"),
    ],
)
def test_forged_dtensor_layouts_are_refused(
    mesh: DeviceMesh, change: Callable[[dict[str, Any]], None], match: str
) -> None:
    with pytest.raises(RecoveryError, match="refused checkpoint metadata from peer: .*" + match):
        decode_skeleton(forged(mesh, change))


def test_a_mesh_under_another_group_name_is_rebuilt_on_this_process_group(
    mesh: DeviceMesh,
) -> None:
    # Replica groups whose default group was made with `_ranks` name their groups
    # by a hash of global ranks: the sender's names never exist at the receiver.
    sd = {"d": distribute_tensor(torch.randn(6), mesh, [Shard(0)])}
    packed = pack(sd, 1)
    skeleton = decode_skeleton(forged(mesh, _set(("meshes", 0, 4), ["14e19eea8201d2e3"])))
    got = unpack(skeleton, packed.blobs)["d"]
    assert isinstance(got, DTensor) and got.device_mesh == mesh
    assert got.device_mesh.get_group(0).group_name == mesh.get_group(0).group_name
    assert torch.equal(got.to_local(), sd["d"].to_local())


def test_a_mesh_this_process_has_no_group_for_is_a_recovery_error(mesh: DeviceMesh) -> None:
    sd = {"d": distribute_tensor(torch.randn(6), mesh, [Shard(0)])}
    packed = pack(sd, 1)

    def two_ranks(doc: dict[str, Any]) -> None:
        doc["meshes"][0][1:3] = [[2], [0, 1]]
        doc["meshes"][0][4] = ["no-such-group"]

    skeleton = decode_skeleton(forged(mesh, two_ranks))
    with pytest.raises(
        RecoveryError,
        match=r"DTensor at \('d',\): .*process group 'no-such-group'.* ranks \[0, 1\]",
    ):
        unpack(skeleton, packed.blobs)


def test_the_wire_carries_the_local_shard_and_the_global_shape(mesh: DeviceMesh) -> None:
    sd = sent_state(mesh)
    packed = pack(sd, 4)
    big = local(sd["big"])
    assert any(b.data_ptr() == big.data_ptr() for b in packed.blobs), "sent from its own memory"
    skeleton = decode_skeleton(packed.skeleton_bytes)
    by_path = {p[0]: i for i, p in enumerate(skeleton.paths)}
    assert dict(skeleton.dtensors) == {
        by_path["w"]: (16, 3),
        by_path["big"]: (1 << 19,),
        by_path["bias"]: (5,),
    }
    assert skeleton.tensors[by_path["w"]].shape == (8, 3)
    assert b"Shard" not in packed.skeleton_bytes, "placements as JSON tags, nothing pickled"
    assert as_dtensor(sd["w"]) is sd["w"] and as_dtensor(sd["plain"]) is None

"""extend_device_mesh: our group as a mesh dimension, used by functional collectives."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

from tests.multiproc import RankContext, run_ranks
from torchft_pg import ProcessGroupGloo
from torchft_pg.device_mesh import extend_device_mesh


def _extend(ctx: RankContext) -> dict[str, object]:
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("default", ctx.store),
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
    mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("shard",))
    pg = ProcessGroupGloo(timeout=timedelta(seconds=20))
    pg.configure(ctx.addr("mesh/0"), ctx.rank, ctx.world_size)
    ext = extend_device_mesh(mesh, pg, name="dp", dim=0)
    t = funcol.all_reduce(torch.full((2,), float(ctx.rank + 1)), "sum", (ext, 0))
    over_dp = funcol.wait_tensor(t).tolist()
    s = funcol.all_reduce(torch.full((2,), float(ctx.rank + 1)), "sum", (ext, 1))
    over_shard = funcol.wait_tensor(s).tolist()
    out = {
        "names": ext.mesh_dim_names,
        "shape": tuple(ext.shape),
        "dp_group_is_pg": ext.get_group("dp") is pg,
        "over_dp": over_dp,
        "over_shard": over_shard,
    }
    # The group keeps working after a reconfiguration, under the same mesh.
    pg.configure(ctx.addr("mesh/1"), ctx.rank, ctx.world_size)
    t2 = funcol.all_reduce(torch.ones(1), "sum", (ext, 0))
    out["after_reconfigure"] = funcol.wait_tensor(t2).tolist()
    pg.unregister()
    pg.shutdown()
    dist.destroy_process_group()
    return out


def test_extend_device_mesh_inserts_a_live_replicate_dimension() -> None:
    for r in run_ranks(_extend, 2):
        assert r["names"] == ("dp", "shard")
        assert r["shape"] == (1, 2)
        assert r["dp_group_is_pg"]
        assert r["over_dp"] == [3.0, 3.0]  # our group spans both processes
        assert r["over_shard"] == [3.0, 3.0]
        assert r["after_reconfigure"] == [2.0]

"""The interop checks with CUDA tensors, and fault-tolerant DDP on a CUDA model.

NCCL and BabyNCCL take one rank per GPU (NCCL refuses two ranks on one
device), so they run at as many ranks as there are GPUs. The Gloo family
carries CUDA tensors too, and any number of ranks may share one GPU, so those
cases run at world sizes 2 and 3 on a single GPU. Every tensor the checks of
`tests.interop.calls` make lands on the rank's GPU through torch's default
device. Skipped visibly without CUDA.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from lighthouse import LighthouseServer
from tests.interop.calls import Members, run_checks
from tests.multiproc import RankContext, run_ranks
from torchft_pg.process_group import ProcessGroup

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device (none here)")
TIMEOUT = timedelta(seconds=30)
NCCL_KINDS = ("nccl", "baby_nccl")


def _make(kind: str) -> ProcessGroup:
    from torchft_pg import (
        ProcessGroupBabyGloo,
        ProcessGroupBabyNCCL,
        ProcessGroupGloo,
        ProcessGroupNCCL,
    )

    makers: dict[str, Any] = {
        "nccl": ProcessGroupNCCL,
        "baby_nccl": ProcessGroupBabyNCCL,
        "gloo": ProcessGroupGloo,
        "baby_gloo": ProcessGroupBabyGloo,
    }
    pg: ProcessGroup = makers[kind](timeout=TIMEOUT)
    return pg


def _run(ctx: RankContext) -> dict[str, dict[str, str]]:
    kind, with_default = ctx.args
    device = torch.device("cuda", ctx.rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.set_default_device(device)
    if with_default:
        backend = "cpu:gloo,cuda:nccl" if kind in NCCL_KINDS else "cpu:gloo,cuda:gloo"
        dist.init_process_group(
            backend,
            store=PrefixStore("default", ctx.store),
            rank=ctx.rank,
            world_size=ctx.world_size,
        )
    pg = _make(kind)
    out: dict[str, dict[str, str]] = {}
    try:
        pg.configure(ctx.addr("gen1"), ctx.rank, ctx.world_size)
        first = Members(
            rank=ctx.rank,
            world=ctx.world_size,
            globals_by_rank=tuple(range(ctx.world_size)),
            default_group=with_default,
        )
        out["gen1"] = run_checks(pg, first)
        # Renumbered: process i becomes group rank world-1-i.
        rank = ctx.world_size - 1 - ctx.rank
        pg.configure(ctx.addr("gen2"), rank, ctx.world_size)
        second = Members(
            rank=rank,
            world=ctx.world_size,
            globals_by_rank=(
                tuple(reversed(range(ctx.world_size)))
                if with_default
                else tuple(range(ctx.world_size))
            ),
            default_group=with_default,
        )
        out["gen2"] = run_checks(pg, second)
        torch.cuda.synchronize()
        ctx.barrier("done")
    finally:
        pg.shutdown()
        if with_default:
            dist.destroy_process_group()
    return out


# c10d's NCCL backend has no list-of-lists allgather_coalesced; the error must say so.
NCCL_REFUSES = {"all_gather_coalesced": "does not support allgather_coalesced"}


def _failures(results: list[Any], refused: dict[str, str] | None = None) -> list[str]:
    refused = refused or {}
    return [
        f"process {p} {gen} {name}: {outcome}"
        for p, by_gen in enumerate(results)
        for gen, checks in by_gen.items()
        for name, outcome in checks.items()
        if outcome != "ok" and not (name in refused and refused[name] in outcome)
    ]


@needs_gpu
@pytest.mark.parametrize("with_default", [False, True], ids=["no-default-group", "default-group"])
@pytest.mark.parametrize("kind", NCCL_KINDS)
def test_every_call_on_nccl_one_rank_per_gpu(kind: str, with_default: bool) -> None:
    results = run_ranks(_run, GPUS, kind, with_default, timeout=240)
    failures = _failures(results, NCCL_REFUSES)
    assert not failures, "\n".join(failures)
    assert len(results[0]["gen1"]) >= (25 if GPUS > 1 else 20)  # one GPU: no peer for p2p


@needs_gpu
@pytest.mark.parametrize("with_default", [False, True], ids=["no-default-group", "default-group"])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", ["gloo", "baby_gloo"])
def test_every_call_with_cuda_tensors_on_the_gloo_family(
    kind: str, world: int, with_default: bool
) -> None:
    results = run_ranks(_run, world, kind, with_default, timeout=240)
    failures = _failures(results)
    assert not failures, "\n".join(failures)
    assert len(results[0]["gen1"]) >= 25


STEPS = 8
JOIN_AT = 3  # replica 1 starts once replica 0 has committed this many steps


def _ddp_replica(ctx: RankContext) -> dict[str, Any]:
    from torch.distributed import TCPStore

    from torchft_pg import Manager, ProcessGroupGloo, ProcessGroupNCCL
    from torchft_pg.ddp import DistributedDataParallel
    from torchft_pg.optim import OptimizerWrapper

    (lighthouse,) = ctx.args
    device = torch.device("cuda", ctx.rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.manual_seed(ctx.rank)  # different initial weights: replica 1 must heal them away
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(
        device
    )
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def load(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    if ctx.rank == 1:
        ctx.store.wait(["replica0/committed"])
    # Cross-replica traffic: NCCL when each replica has a GPU of its own.
    pg = ProcessGroupNCCL(timeout=TIMEOUT) if GPUS >= 2 else ProcessGroupGloo(timeout=TIMEOUT)
    group_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg,
        load_state_dict=load,
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        min_replica_size=1,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=group_store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"replica{ctx.rank}",
        timeout=TIMEOUT,
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner)
    participants: list[int] = []
    steps: list[int] = []
    trace: list[tuple[int, int, bool, float]] = []  # step, participants, participating, sum
    try:
        if ctx.rank == 1:
            ctx.store.set("replica1/started", "1")
        for _ in range(200):  # bounded: replica 0 may step alone a while first
            # Both stop after a step they took together: a replica that stopped
            # right after healing (a step it sat out) would fail its peer's next.
            if manager.current_step() >= STEPS and 2 in participants:
                break
            step = manager.current_step()
            g = torch.Generator(device=device).manual_seed(1000 * ctx.rank + step)
            x = torch.randn(16, 8, device=device, generator=g)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            optimizer.step()
            participants.append(manager.num_participants())
            steps.append(manager.current_step())
            trace.append(
                (
                    manager.current_step(),
                    manager.num_participants(),
                    manager.is_participating(),
                    float(sum(p.detach().double().sum() for p in model.parameters())),
                )
            )
            if ctx.rank == 0 and manager.current_step() == JOIN_AT:
                ctx.store.set("replica0/committed", "1")
                ctx.store.wait(["replica1/started"])
        torch.cuda.synchronize()
        params = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        return {
            "step": manager.current_step(),
            "params": params.tolist(),
            "on_cuda": all(p.is_cuda for p in model.parameters()),
            "participants": participants,
            "steps": steps,
            "trace": trace,
        }
    finally:
        manager.shutdown()


@needs_gpu
def test_fault_tolerant_ddp_on_a_cuda_model_heals_a_late_replica() -> None:
    with LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200) as lh:
        r0, r1 = run_ranks(_ddp_replica, 2, lh.address(), timeout=240)
    assert r0["step"] == r1["step"] >= STEPS
    # Replica 1 did not replay steps 1..JOIN_AT: it healed to replica 0's step.
    assert r1["steps"][0] > JOIN_AT, r1["steps"]
    assert r0["on_cuda"] and r1["on_cuda"]
    # Replica 1 began with other weights; after healing and stepping together
    # with averaged gradients both hold the same parameters.
    assert r0["params"] == r1["params"], f"replica 0 {r0['trace']}\nreplica 1 {r1['trace']}"
    assert 2 in r0["participants"] and r1["participants"][-1] == 2


DILOCO_CFG: dict[str, Any] = {
    "fragments": 2,
    "sync_every": 4,
    "delay": 1,
    "alpha": 0.25,
    "steps": 8,
}


def _diloco_replica(ctx: RankContext) -> dict[str, Any]:
    from tests.integration import test_semisync as semisync

    lighthouse, device_type = ctx.args
    device = torch.device(device_type)
    if device.type == "cuda":
        device = torch.device("cuda", ctx.rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    cfg = DILOCO_CFG
    model = semisync.make_model().to(device)
    inner = semisync.make_inner(model)
    fragments = semisync.fragments_of(model, cfg["fragments"])
    outer = [semisync.make_outer(f.parameters()) for f in fragments]
    manager, _store = semisync.make_manager(
        lighthouse,
        f"replica{ctx.rank}",
        min_replica_size=ctx.world_size,
        init_sync=False,
        use_async_quorum=False,
    )
    try:
        diloco = semisync.make_diloco(manager, fragments, inner, outer, cfg)
        with diloco:
            for t in range(cfg["steps"]):  # the replay's data, moved to the device
                semisync.inner_step(model, inner, ctx.rank, t, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return {
            "step": manager.current_step(),
            "on_device": all(p.device == device for p in model.parameters()),
            "params": semisync.as_lists(model.parameters()),
            "backups": [
                semisync.as_lists(f.original_parameters.values()) for f in diloco._fragments
            ],
            "momenta": [semisync.as_lists(semisync.momenta(o)) for o in outer],
        }
    finally:
        manager.shutdown()


@needs_gpu
def test_diloco_on_a_cuda_model_matches_the_replayed_math() -> None:
    """Streaming DiLoCo (two fragments, a sync delay, mixing) on CUDA models: the
    pseudo-gradients are averaged over Gloo through the host, and every group
    ends where a CPU replay of the same training ends."""
    check_diloco_against_replay("cuda")


def check_diloco_against_replay(device_type: str) -> None:
    """DiLoCo on `device_type` models in 3 groups vs `replay_diloco` on the CPU
    (`check_diloco_against_replay("cpu")` checks this check without a GPU)."""
    from tests.integration import test_semisync as semisync

    with LighthouseServer(bind="127.0.0.1:0", min_replicas=semisync.GROUPS) as lh:
        results = run_ranks(
            _diloco_replica, semisync.GROUPS, lh.address(), device_type, timeout=240
        )
    expected = semisync.replay_diloco(DILOCO_CFG)
    for group, r in enumerate(results):
        assert r["on_device"] and r["step"] == expected["step"]
        for actual, want in zip(r["params"], expected["params"][group], strict=True):
            torch.testing.assert_close(torch.tensor(actual), want, rtol=1e-4, atol=1e-5)
        for f in range(DILOCO_CFG["fragments"]):
            for actual, want in zip(r["backups"][f], expected["backups"][f], strict=True):
                torch.testing.assert_close(torch.tensor(actual), want, rtol=1e-4, atol=1e-5)
        # the global state is bit-identical on every group
        assert (r["backups"], r["momenta"]) == (results[0]["backups"], results[0]["momenta"])

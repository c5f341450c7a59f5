"""LocalSGD and DiLoCo across real replica groups: processes, a lighthouse and Gloo.

Each replica group is one process with its own Manager, manager server and
group store, meeting at a real lighthouse in the test process; every group
trains on its own fixed data. One job of 4 processes serves every test (each
process pays torch's first-optimizer import, seconds, once):

0. the 4 processes form a default process group, as the ranks of one replica
   group, and build a `DistributedSampler` from it;
1. processes 0-2 run LocalSGD and DiLoCo (one fragment; two fragments with a
   sync delay and mixing; two with int8 pseudo-gradients) as 3 groups, each configuration against a fresh
   lighthouse; the tests replay the same training with plain torch (every
   group's inner steps, the mean over the groups, the outer step) and compare
   parameters, global (backup) parameters and outer momentum;
2. then processes 0, 1 and 3 run DiLoCo as groups 0, 1 and 2; group 2 is
   SIGKILLed while its pseudo-gradient allreduce is due, process 2 restarts it
   from other weights, and the test checks that it heals to the survivors'
   global parameters and outer optimizer state.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore
from torch.utils.data import Dataset

from lighthouse import LighthouseServer
from tests.multiproc import RankContext, run_ranks
from torchft_pg import ProcessGroupGloo
from torchft_pg.data import DistributedSampler
from torchft_pg.local_sgd import DiLoCo, LocalSGD
from torchft_pg.manager import Manager
from torchft_pg.quantization import Quantization, simulated_sum

TIMEOUT = timedelta(seconds=20)
GROUPS = 3


def make_model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def fragments_of(model: torch.nn.Sequential, n: int) -> list[torch.nn.Module]:
    return [model] if n == 1 else [model[0], model[2]]


def make_inner(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def make_outer(params: Any) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def inner_step(
    model: torch.nn.Module,
    inner: torch.optim.Optimizer,
    group: int,
    step: int,
    device: torch.device | None = None,
) -> None:
    """Group `group`'s inner step `step`, on data of its own (made on the CPU, then
    moved to `device` if given: the same numbers on every device)."""
    g = torch.Generator().manual_seed(1000 * group + step)
    x, y = torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g)
    if device is not None:
        x, y = x.to(device), y.to(device)
    inner.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()


def make_diloco(
    manager: Manager,
    fragments: list[torch.nn.Module],
    inner: torch.optim.Optimizer,
    outer: list[torch.optim.SGD],
    cfg: dict[str, Any],
) -> DiLoCo:
    """DiLoCo as configuration `cfg` (one of `CONFIGS`) describes it."""
    return DiLoCo(
        manager,
        fragments,
        inner,
        outer,
        sync_every=cfg["sync_every"],
        fragment_sync_delay=cfg["delay"],
        fragment_update_alpha=cfg["alpha"],
        should_quantize="quantization" in cfg,
        quantization=cfg.get("quantization", "int8"),
    )


def as_lists(tensors: Any) -> list[Any]:
    return [t.detach().tolist() for t in tensors]


def momenta(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        optimizer.state[p]["momentum_buffer"] for g in optimizer.param_groups for p in g["params"]
    ]


def make_manager(lighthouse: str, replica_id: str, **kw: Any) -> tuple[Manager, TCPStore]:
    """A one-rank replica group's Manager and its group store (keep both alive).

    The quorum timeout is generous: a group's first quorum waits for the
    slowest group to start (seconds apart on a loaded 2-core machine)."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    manager = Manager(
        ProcessGroupGloo(timeout=TIMEOUT),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=replica_id,
        timeout=TIMEOUT,
        quorum_timeout=3 * TIMEOUT,
        connect_timeout=TIMEOUT,
        **kw,
    )
    return manager, store


# -- against the replayed math -----------------------------------------------------


CONFIGS: dict[str, dict[str, Any]] = {
    "local_sgd": {"sync_every": 3, "steps": 9},
    "diloco_one_fragment": {"fragments": 1, "sync_every": 3, "delay": 0, "alpha": 0.0, "steps": 9},
    "diloco_two_fragments": {
        "fragments": 2,
        "sync_every": 4,
        "delay": 1,
        "alpha": 0.25,
        "steps": 10,
    },
    "diloco_int8": {
        "fragments": 2,
        "sync_every": 4,
        "delay": 1,
        "alpha": 0.0,
        "steps": 8,
        "quantization": "int8",
    },
}


def _train(lighthouse: str, group: int, name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    local_sgd = name == "local_sgd"
    model = make_model()
    inner = make_inner(model)
    manager, _store = make_manager(
        lighthouse,
        f"replica{group}",
        min_replica_size=GROUPS,
        init_sync=False,  # every group starts from the same weights; nobody heals
        use_async_quorum=local_sgd,
    )
    try:
        outer: list[torch.optim.SGD] = []
        wrapper: LocalSGD | DiLoCo
        if local_sgd:
            wrapper = LocalSGD(manager, model, inner, sync_every=cfg["sync_every"])
        else:
            fragments = fragments_of(model, cfg["fragments"])
            outer = [make_outer(f.parameters()) for f in fragments]
            wrapper = make_diloco(manager, fragments, inner, outer, cfg)
        with wrapper:
            for t in range(cfg["steps"]):
                inner_step(model, inner, group, t)
        out: dict[str, Any] = {
            "step": manager.current_step(),
            "params": as_lists(model.parameters()),
            "momenta": [as_lists(momenta(o)) for o in outer],
        }
        if isinstance(wrapper, DiLoCo):
            out["backups"] = [as_lists(f.original_parameters.values()) for f in wrapper._fragments]
        return out
    finally:
        manager.shutdown()


def replay_local_sgd(sync_every: int, steps: int) -> list[torch.Tensor]:
    models = [make_model() for _ in range(GROUPS)]
    inners = [make_inner(m) for m in models]
    for t in range(steps):
        for r in range(GROUPS):
            inner_step(models[r], inners[r], r, t)
        if (t + 1) % sync_every == 0:
            with torch.no_grad():
                for ps in zip(*(m.parameters() for m in models), strict=True):
                    mean = torch.stack([p.detach() for p in ps]).mean(0)
                    for p in ps:
                        p.copy_(mean)
    return [p.detach() for p in models[0].parameters()]


def mean_of(parts: list[torch.Tensor], quantization: str | None) -> torch.Tensor:
    """The groups' average as the allreduce computes it: exact, or each part
    encoded, exchanged and summed in group (rank) order."""
    if quantization is None:
        return torch.stack(parts).mean(0)
    total = simulated_sum(parts, Quantization(quantization))
    return total.view(parts[0].shape) / len(parts)


def replay_diloco(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every group's inner steps, then each fragment's outer step on the mean pseudo-gradient."""
    n, delay, alpha = cfg["fragments"], cfg["delay"], cfg["alpha"]
    interval = cfg["sync_every"] // n
    models = [make_model() for _ in range(GROUPS)]
    inners = [make_inner(m) for m in models]
    frags = [fragments_of(m, n) for m in models]
    glob = [[torch.nn.Parameter(p.detach().clone()) for p in f.parameters()] for f in frags[0]]
    outer = [make_outer(g) for g in glob]
    step = local = 0
    pending: tuple[int, list[torch.Tensor]] | None = None
    for t in range(cfg["steps"]):
        for r in range(GROUPS):
            inner_step(models[r], inners[r], r, t)
        local += 1
        if local == interval - delay:
            f = step % n
            pseudo = [
                mean_of([g.detach() - p.detach() for p in ps], cfg.get("quantization"))
                for g, *ps in zip(glob[f], *(fr[f].parameters() for fr in frags), strict=True)
            ]
            pending = (f, pseudo)
        if local == interval:
            local = 0
            assert pending is not None
            f, avg = pending
            for g, a in zip(glob[f], avg, strict=True):
                g.grad = a
            outer[f].step()
            with torch.no_grad():
                for fr in frags:
                    for p, g in zip(fr[f].parameters(), glob[f], strict=True):
                        mine = p.detach().clone()
                        p.copy_(g)
                        if alpha > 0:
                            p.lerp_(mine, alpha)
            step += 1
    return {
        "step": step,
        "params": [[p.detach() for p in m.parameters()] for m in models],
        "backups": [[g.detach() for g in gs] for gs in glob],
        "momenta": [momenta(o) for o in outer],
    }


def close(actual: list[Any], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(torch.tensor(a), e, rtol=1e-5, atol=1e-6)


def test_local_sgd_matches_the_replayed_math(job: list[dict[str, Any]]) -> None:
    cfg = CONFIGS["local_sgd"]
    expected = replay_local_sgd(cfg["sync_every"], cfg["steps"])
    results = [r["local_sgd"] for r in job[:GROUPS]]
    for r in results:
        assert r["step"] == 3
        close(r["params"], expected)
        assert r["params"] == results[0]["params"]


@pytest.mark.parametrize("name", ["diloco_one_fragment", "diloco_two_fragments", "diloco_int8"])
def test_diloco_matches_the_replayed_math(job: list[dict[str, Any]], name: str) -> None:
    cfg = CONFIGS[name]
    expected = replay_diloco(cfg)
    assert expected["step"] == cfg["steps"] // (cfg["sync_every"] // cfg["fragments"])
    results = [r[name] for r in job[:GROUPS]]
    for group, r in enumerate(results):
        assert r["step"] == expected["step"]
        close(r["params"], expected["params"][group])
        for f in range(cfg["fragments"]):
            close(r["backups"][f], expected["backups"][f])
            close(r["momenta"][f], expected["momenta"][f])
        # the global state is bit-identical on every group
        assert (r["backups"], r["momenta"]) == (results[0]["backups"], results[0]["momenta"])


# -- a group killed mid-window and restarted --------------------------------------

KILL_STEP = 2  # the victim dies as its pseudo-gradient allreduce for this sync is due
END_STEP = KILL_STEP + 3  # the failed sync's retry (with the joiner), then one per fragment
KILL_CFG: dict[str, Any] = {"fragments": 2, "sync_every": 4, "delay": 1, "alpha": 0.0}


def _heal_group(
    ctx: RankContext, lighthouse: str, group: int, joiner: bool, victim: bool
) -> dict[str, Any]:
    """Group `group` of the kill scenario: a survivor, the victim, or the joiner.

    The lighthouse needs all 3 groups for a quorum, so the victim is in every
    quorum up to its death, and the survivors' next sync waits for the joiner.
    """
    model = make_model(seed=99 if joiner else 0)  # the joiner starts elsewhere on purpose
    inner = make_inner(model)
    initial = as_lists(model.parameters())
    killed_at = None
    if joiner:
        pid = int(ctx.store.get("victim_pid"))
        killed_at = int(ctx.store.get("victim_step"))
        os.kill(pid, signal.SIGKILL)

    def load(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager, _store = make_manager(
        lighthouse,
        f"replica{group}",
        min_replica_size=2,
        use_async_quorum=False,
        load_state_dict=load,
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
    )
    if victim:
        real_allreduce = manager.allreduce

        def stall_then_die(tensor: torch.Tensor, *a: Any, **kw: Any) -> Any:
            if manager.current_step() == KILL_STEP:
                ctx.store.set("victim_step", str(manager.current_step()))
                ctx.store.set("victim_pid", str(os.getpid()))
                ctx.store.wait(["never set"], timedelta(seconds=60))  # SIGKILLed here
            return real_allreduce(tensor, *a, **kw)

        manager.allreduce = stall_then_die  # type: ignore[method-assign]
    try:
        fragments = fragments_of(model, KILL_CFG["fragments"])
        outer = [make_outer(f.parameters()) for f in fragments]
        diloco = make_diloco(manager, fragments, inner, outer, KILL_CFG)
        syncs: list[tuple[int, bool]] = []  # (step synced, committed)
        with diloco:
            for t in range(200):
                if manager.current_step() >= END_STEP:
                    break
                before = manager.current_step()
                inner_step(model, inner, group, t)
                if diloco._local_step == 0:
                    syncs.append((before, manager.current_step() == before + 1))
            else:
                raise AssertionError(f"group {group} never reached step {END_STEP}: {syncs}")
        return {
            "step": manager.current_step(),
            "killed_at": killed_at,
            "syncs": syncs,
            "initial": initial,
            "backups": [as_lists(f.original_parameters.values()) for f in diloco._fragments],
            "momenta": [as_lists(momenta(o)) for o in outer],
        }
    finally:
        manager.shutdown()


def _job(ctx: RankContext) -> dict[str, Any]:
    """Process `ctx.rank` of the job in the module docstring."""
    configs, heal = ctx.args
    out: dict[str, Any] = {"sampler": _sampler_defaults(ctx)}
    if ctx.rank < GROUPS:
        for name, cfg in CONFIGS.items():
            out[name] = _train(configs[name], ctx.rank, name, cfg)
    else:
        make_inner(make_model())  # the first optimizer imports for seconds: meanwhile
    if ctx.rank == 2:
        out["heal"] = _heal_group(ctx, heal, group=2, joiner=True, victim=False)
    else:
        ctx.barrier("heal", [0, 1, 3])
        group = 2 if ctx.rank == 3 else ctx.rank
        out["heal"] = _heal_group(ctx, heal, group=group, joiner=False, victim=ctx.rank == 3)
    return out


class Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _sampler_defaults(ctx: RankContext) -> dict[str, Any]:
    """The sampler's group rank and size taken from a real default process group
    (the 4 processes as the ranks of replica group 1 of 3)."""
    dist.init_process_group(
        "gloo", store=PrefixStore("sampler", ctx.store), rank=ctx.rank, world_size=ctx.world_size
    )
    try:
        sampler: DistributedSampler[int] = DistributedSampler(
            Indices(48), replica_rank=1, num_replica_groups=3, shuffle=False
        )
        return {
            "global": (sampler.global_rank, sampler.global_world_size),
            "indices": list(sampler),
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def job() -> list[dict[str, Any]]:
    """The 4 processes' results (process 3, the killed one, returns None)."""
    names = [*CONFIGS, "heal"]
    servers = {name: LighthouseServer(bind="127.0.0.1:0", min_replicas=GROUPS) for name in names}
    try:
        configs = {name: servers[name].address() for name in CONFIGS}
        return run_ranks(_job, 4, configs, servers["heal"].address(), timeout=240, allow_exit={3})
    finally:
        for lh in servers.values():
            lh.shutdown()


def test_diloco_group_killed_mid_window_heals_to_the_same_global_state(
    job: list[dict[str, Any]],
) -> None:
    assert job[3] is None  # the victim was killed
    survivors = [job[0]["heal"], job[1]["heal"]]
    joiner = job[2]["heal"]
    assert joiner["killed_at"] == KILL_STEP
    retry_on = [(step, True) for step in range(KILL_STEP, END_STEP)]
    for s in survivors:
        # syncs commit up to the kill; the one the victim never joined fails and
        # its fragment is retried, with the joiner, at the next turn
        assert s["syncs"] == [(0, True), (1, True), (KILL_STEP, False), *retry_on], s["syncs"]
    # the joiner healed: it started from other weights, its first sync was the
    # retry, and it ends with the survivors' global parameters and outer momentum
    assert joiner["initial"] != survivors[0]["initial"]
    assert joiner["syncs"] == retry_on
    for s in survivors:
        assert s["step"] == joiner["step"] == END_STEP
        assert s["backups"] == joiner["backups"]
        assert s["momenta"] == joiner["momenta"]


def test_sampler_takes_group_rank_and_size_from_the_default_group(
    job: list[dict[str, Any]],
) -> None:
    # process 3 was killed later, so its result is lost; the other three say enough
    for rank in range(3):
        sampler = job[rank]["sampler"]
        assert sampler["global"] == (4 + rank, 12)
        assert sampler["indices"] == list(range(4 + rank, 48, 12))

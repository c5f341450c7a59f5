"""Every `torch.distributed` call with ``group=`` on our groups, across real processes.

Each case runs the checks of `tests.interop.calls` on a first group of all
processes, then reconfigures to a group that renumbers them (and, from 3
processes, drops one), and runs them again: rank arguments must follow the
new numbering. With a default group, ``src=``/``dst=`` name default-group
ranks; without one they name group ranks.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed import PrefixStore

from tests.interop.calls import Members, run_checks
from tests.multiproc import RankContext, run_ranks
from torchft_pg import ErrorSwallowingProcessGroupWrapper, ProcessGroupBabyGloo, ProcessGroupGloo
from torchft_pg.process_group import ProcessGroup

TIMEOUT = timedelta(seconds=20)


def _make(kind: str) -> ProcessGroup:
    if kind == "gloo":
        return ProcessGroupGloo(timeout=TIMEOUT)
    if kind == "baby_gloo":
        return ProcessGroupBabyGloo(timeout=TIMEOUT)
    if kind == "error_swallowing":
        return ErrorSwallowingProcessGroupWrapper(ProcessGroupGloo(timeout=TIMEOUT))
    raise ValueError(kind)


def _second_generation(world: int) -> list[int]:
    """Process indices of the second group, by new group rank."""
    return [2, 0] if world == 3 else list(reversed(range(world)))


def _run(ctx: RankContext) -> dict[str, dict[str, str]]:
    kind, with_default = ctx.args
    if with_default:
        dist.init_process_group(
            "gloo",
            store=PrefixStore("default", ctx.store),
            rank=ctx.rank,
            world_size=ctx.world_size,
        )
    pg = _make(kind)
    out: dict[str, dict[str, str]] = {}
    pg.configure(ctx.addr("gen1"), ctx.rank, ctx.world_size)
    first = Members(
        rank=ctx.rank,
        world=ctx.world_size,
        globals_by_rank=tuple(range(ctx.world_size)),
        default_group=with_default,
    )
    out["gen1"] = run_checks(pg, first)
    members = _second_generation(ctx.world_size)
    if ctx.rank in members:
        rank = members.index(ctx.rank)
        pg.configure(ctx.addr("gen2"), rank, len(members))
        second = Members(
            rank=rank,
            world=len(members),
            globals_by_rank=tuple(members) if with_default else tuple(range(len(members))),
            default_group=with_default,
        )
        out["gen2"] = run_checks(pg, second)
    ctx.barrier("done")
    pg.shutdown()
    if with_default:
        dist.destroy_process_group()
    return out


def _failures(results: list[Any]) -> list[str]:
    return [
        f"process {p} {gen} {name}: {outcome}"
        for p, by_gen in enumerate(results)
        for gen, checks in by_gen.items()
        for name, outcome in checks.items()
        if outcome != "ok"
    ]


@pytest.mark.parametrize("with_default", [False, True], ids=["no-default-group", "default-group"])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", ["gloo", "baby_gloo", "error_swallowing"])
def test_every_call_then_again_after_renumbering(kind: str, world: int, with_default: bool) -> None:
    results = run_ranks(_run, world, kind, with_default, timeout=240)
    assert _failures(results) == []
    gen2 = [r for r in results if "gen2" in r]
    assert len(gen2) == len(_second_generation(world))
    assert len(results[0]["gen1"]) >= 25  # every check ran

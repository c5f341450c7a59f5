"""Different Gloo-based groups meeting on one store prefix, across real processes.

ProcessGroupGloo, ProcessGroupBabyGloo and a plain torch Gloo group given
``PrefixStore(prefix, store)`` must rendezvous with one another at a shared
``host:port/prefix`` and run collectives together.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore

from tests.multiproc import RankContext, run_ranks
from torchft_pg import ProcessGroupBabyGloo, ProcessGroupGloo

TIMEOUT = timedelta(seconds=20)


class _PlainGloo:
    """A plain torch Gloo group, rebuilt at each prefix as a torch user would."""

    def __init__(self, ctx: RankContext) -> None:
        self._ctx = ctx
        self._client = TCPStore(
            "127.0.0.1", ctx.store_port, is_master=False, timeout=TIMEOUT, wait_for_workers=False
        )
        self._pg: Any = None

    def configure(self, prefix: str, rank: int, world_size: int) -> None:
        store = PrefixStore(prefix, self._client)
        self._pg = dist.ProcessGroupGloo(store, rank, world_size, TIMEOUT)

    def allreduce(self, tensors: list[torch.Tensor]) -> Any:
        return self._pg.allreduce(tensors)

    def shutdown(self) -> None:
        self._pg = None


class _Ours:
    """One of our groups, configured with the prefix as a store address."""

    def __init__(self, ctx: RankContext, kind: str) -> None:
        self._ctx = ctx
        self._pg: ProcessGroupGloo | ProcessGroupBabyGloo
        if kind == "gloo":
            self._pg = ProcessGroupGloo(timeout=TIMEOUT)
        else:
            self._pg = ProcessGroupBabyGloo(timeout=TIMEOUT, warm_spare=False)

    def configure(self, prefix: str, rank: int, world_size: int) -> None:
        self._pg.configure(self._ctx.addr(prefix), rank, world_size)

    def allreduce(self, tensors: list[torch.Tensor]) -> Any:
        return self._pg.allreduce(tensors)

    def shutdown(self) -> None:
        self._pg.shutdown()


def _group(ctx: RankContext, kind: str) -> _PlainGloo | _Ours:
    return _PlainGloo(ctx) if kind == "torch" else _Ours(ctx, kind)


def _allreduce_sum(group: _PlainGloo | _Ours, rank: int) -> list[float]:
    t = torch.full((4,), float(rank + 1))
    group.allreduce([t]).wait()
    return t.tolist()


def _mixed_allreduce(ctx: RankContext) -> list[list[float]]:
    kinds: tuple[str, ...] = ctx.args[0]
    prefixes: tuple[str, ...] = ctx.args[1]
    group = _group(ctx, kinds[ctx.rank])
    sums = []
    try:
        for prefix in prefixes:
            group.configure(prefix, ctx.rank, ctx.world_size)
            sums.append(_allreduce_sum(group, ctx.rank))
    finally:
        group.shutdown()
    return sums


def _expected(world_size: int) -> list[float]:
    return [float(sum(range(1, world_size + 1)))] * 4


@pytest.mark.parametrize(
    "kinds",
    [("gloo", "baby"), ("baby", "gloo"), ("gloo", "torch"), ("torch", "baby")],
    ids=lambda kinds: "+".join(kinds),
)
def test_two_different_gloo_groups_allreduce_on_one_prefix(kinds: tuple[str, str]) -> None:
    results = run_ranks(_mixed_allreduce, 2, kinds, ("mixed/0",), timeout=90)
    assert results == [[_expected(2)]] * 2


def test_a_mixed_world_reconfigures_to_a_fresh_prefix() -> None:
    kinds = ("baby", "torch", "gloo")
    results = run_ranks(_mixed_allreduce, 3, kinds, ("mixed/q1", "mixed/q2"), timeout=120)
    assert results == [[_expected(3), _expected(3)]] * 3

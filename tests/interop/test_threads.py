"""Ranks as threads of one process, and several groups in one process (torchft's own tests
run this way): no group's store wait may hold up another's."""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist

from tests.interop.calls import Members, run_checks
from tests.multiproc import store_server
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupGloo

TIMEOUT = timedelta(seconds=20)
KEY_CASES = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv", "barrier"}


def _members(rank: int, world: int) -> Members:
    return Members(rank=rank, world=world, globals_by_rank=tuple(range(world)), default_group=False)


def test_three_ranks_as_threads_then_two_on_a_fresh_prefix() -> None:
    with store_server() as store:
        pgs = [ProcessGroupGloo(timeout=TIMEOUT) for _ in range(3)]
        addr = f"127.0.0.1:{store.port}"

        def first(rank: int) -> dict[str, str]:
            pgs[rank].configure(f"{addr}/threads/1", rank, 3)
            return run_checks(pgs[rank], _members(rank, 3), only=KEY_CASES)

        def second(rank: int) -> dict[str, str]:
            new_rank = 1 - rank  # renumbered
            pgs[rank].configure(f"{addr}/threads/2", new_rank, 2)
            return run_checks(pgs[rank], _members(new_rank, 2), only=KEY_CASES)

        one = run_in_threads([functools.partial(first, r) for r in range(3)])
        two = run_in_threads([functools.partial(second, r) for r in range(2)])
        for result in one + two:
            assert result == {name: "ok" for name in result} and len(result) == len(KEY_CASES)
        for pg in pgs:
            pg.shutdown()


def test_two_groups_configuring_at_once_on_one_store() -> None:
    """Two 2-member groups, all four members threads of this process, ten times over."""
    with store_server() as store:
        addr = f"127.0.0.1:{store.port}"
        groups = [[ProcessGroupGloo(timeout=TIMEOUT) for _ in range(2)] for _ in range(2)]

        def member(g: int, rank: int, round_: int) -> float:
            pg = groups[g][rank]
            pg.configure(f"{addr}/two/{g}/{round_}", rank, 2)
            t = torch.full((3,), float(10 * g + rank + 1))
            dist.all_reduce(t, group=pg)
            return float(t[0])

        for round_ in range(10):
            sums = run_in_threads(
                [functools.partial(member, g, r, round_) for g in range(2) for r in range(2)]
            )
            assert sums == [3.0, 3.0, 23.0, 23.0], (round_, sums)
        for pair in groups:
            for pg in pair:
                pg.shutdown()

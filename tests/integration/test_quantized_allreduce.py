"""The quantized allreduce over real Gloo (ranks as threads, a real TCPStore): the
reduce-scatter + allgather and the allgather give every rank the same bits,
close to the float32 sum, and the reduce-scatter's bytes per rank do not grow
with the number of ranks; then through real Managers and a lighthouse."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import torch
from torch.distributed import AllToAllOptions, TCPStore, Work

from lighthouse import LighthouseServer
from tests.threads import run_in_threads
from torchft_pg import ProcessGroupBabyGloo, ProcessGroupGloo
from torchft_pg._torch_internals import AllgatherOptions
from torchft_pg.manager import Manager
from torchft_pg.manager.issue_order import IssueOrder, Turn
from torchft_pg.manager.quantized_sum import QuantizedSum
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.quantization import (
    CHUNK,
    Exchange,
    Quantization,
    choose_exchange,
    encoded_numel,
    simulated_sum,
    traffic,
)

pytestmark = pytest.mark.timeout(120)

TIMEOUT = timedelta(seconds=20)
NUMEL = 300 * CHUNK + 11  # not a whole number of chunks, nor of shards


class CountingGloo(ProcessGroupGloo):
    """Gloo that counts the payload bytes this rank sends to and receives from
    the others in the collectives of a quantized sum."""

    def __init__(self) -> None:
        super().__init__(timeout=TIMEOUT)
        self.sent = 0
        self.received = 0

    def _count(self, to_each: int, from_each: int) -> None:
        others = self.size() - 1
        self.sent += others * to_each
        self.received += others * from_each

    def alltoall_base(  # type: ignore[override]
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        block = input_buffer.numel() * input_buffer.element_size() // self.size()
        self._count(block, block)
        return super().alltoall_base(
            output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts
        )

    def allgather_into_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        mine = input_tensors[0].numel() * input_tensors[0].element_size()
        self._count(mine, mine)
        return super().allgather_into_tensor_coalesced(output_tensors, input_tensors, opts)


def _contribution(rank: int, numel: int = NUMEL) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(numel, generator=gen) * 1e-3
    x[:: 97 + rank] *= 50.0  # outliers widen some int8 chunks
    return x


def _on_groups(world: int, fn: Any, make: Callable[[], ProcessGroup] = CountingGloo) -> list[Any]:
    """Run ``fn(pg)`` on `world` ranks (threads), each with its own configured group."""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)

    def rank(r: int) -> Any:
        pg = make()
        pg.configure(f"127.0.0.1:{store.port}/q", r, world)
        try:
            return fn(pg)
        finally:
            pg.shutdown()

    return run_in_threads([partial(rank, r) for r in range(world)], timeout_s=90)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_same_bits_close_to_the_float32_sum(world: int) -> None:
    cases = [(s, e) for s in Quantization for e in Exchange]

    def run(pg: CountingGloo) -> list[tuple[torch.Tensor, int, int]]:
        out = []
        for scheme, exchange in cases:
            sent, received = pg.sent, pg.received
            summing = QuantizedSum(pg, _contribution(pg.rank()), scheme, exchange=exchange)
            summing.future.wait()
            out.append((summing.total(), pg.sent - sent, pg.received - received))
        return out

    results = _on_groups(world, run)
    parts = [_contribution(r) for r in range(world)]
    exact = torch.stack(parts).sum(0)
    errors = {}
    for i, (scheme, exchange) in enumerate(cases):
        sums = [per_rank[i][0] for per_rank in results]
        assert all(torch.equal(s, sums[0]) for s in sums), (scheme, exchange)
        assert torch.equal(sums[0], simulated_sum(parts, scheme, exchange))
        errors[scheme, exchange] = float((sums[0] - exact).norm() / exact.norm())
        moved = traffic(NUMEL, world, scheme, exchange)
        for per_rank in results:
            assert (per_rank[i][1], per_rank[i][2]) == (moved.sent, moved.received)
    # The stated error (docs/benchmarks.md): these contributions have 50x outliers,
    # int8's hard case; the reduce-scatter's second rounding adds about sqrt(2) times.
    for scheme, limit in ((Quantization.INT8, 6e-2), (Quantization.BF16, 3e-3)):
        one, two = errors[scheme, Exchange.ALLGATHER], errors[scheme, Exchange.REDUCE_SCATTER]
        assert one < limit and one < two < 2 * one, errors


def test_a_baby_gloo_group_gets_the_same_bits_as_the_simulation() -> None:
    """The same collectives through ProcessGroupBabyGloo (Gloo in a child process,
    the buffers in shared memory)."""
    world = 3

    def run(pg: ProcessGroup) -> list[torch.Tensor]:
        out = []
        for exchange in Exchange:
            summing = QuantizedSum(
                pg, _contribution(pg.rank()), Quantization.INT8, exchange=exchange
            )
            summing.future.wait()
            out.append(summing.total())
        return out

    def baby() -> ProcessGroup:
        return ProcessGroupBabyGloo(timeout=TIMEOUT, warm_spare=False)

    results = _on_groups(world, run, baby)
    parts = [_contribution(r) for r in range(world)]
    for i, exchange in enumerate(Exchange):
        want = simulated_sum(parts, Quantization.INT8, exchange)
        assert all(torch.equal(per_rank[i], want) for per_rank in results), exchange


def test_the_reduce_scatters_bytes_per_rank_do_not_grow_with_the_ranks() -> None:
    encoded = encoded_numel(NUMEL, Quantization.INT8)
    moved: dict[tuple[int, Exchange], int] = {}
    for world in (2, 3):

        def run(pg: CountingGloo) -> dict[Exchange, int]:
            out = {}
            for exchange in Exchange:
                before = pg.sent + pg.received
                summing = QuantizedSum(
                    pg, _contribution(pg.rank()), Quantization.INT8, exchange=exchange
                )
                summing.future.wait()
                out[exchange] = pg.sent + pg.received - before
            return out

        for per_rank in _on_groups(world, run):
            for exchange, count in per_rank.items():
                moved[world, exchange] = max(moved.get((world, exchange), 0), count)
    # sent and received: 2 (n - 1) / n encoded sizes each, under 2 whatever n is
    for world in (2, 3):
        assert moved[world, Exchange.REDUCE_SCATTER] < 2 * 2 * encoded
        assert moved[world, Exchange.ALLGATHER] == 2 * (world - 1) * encoded
    assert moved[3, Exchange.REDUCE_SCATTER] < moved[3, Exchange.ALLGATHER]


def test_sums_and_allreduces_issued_without_waiting_meet_their_partners() -> None:
    """Each rank issues sums and plain allreduces back to back; a sum's second stage
    is issued whenever its first completes on that rank. Issued in turn, every rank
    issues them in the same order, so each result is right."""
    world = 3
    plan = [
        ("sum", Quantization.INT8, NUMEL),
        ("allreduce", None, 1000),
        ("sum", Quantization.BF16, NUMEL),
        ("sum", Quantization.INT8, 100),  # small: one allgather
        ("sum", Quantization.INT8, 2 * NUMEL),
        ("allreduce", None, 10),
    ]

    def run(pg: CountingGloo) -> list[torch.Tensor]:
        order = IssueOrder()
        sums: list[QuantizedSum | None] = []
        plain: dict[int, torch.Tensor] = {}
        works: list[Work] = []
        for i, (kind, scheme, numel) in enumerate(plan):
            mine = _contribution(pg.rank(), numel)
            if kind == "sum":
                assert scheme is not None
                sums.append(QuantizedSum(pg, mine, scheme, order=order))
            else:
                sums.append(None)
                plain[i] = mine

                def start(turn: Turn, t: torch.Tensor = mine) -> None:
                    works.append(pg.allreduce([t]))
                    turn.release()

                order.take(start)
        out = []
        for summing in sums:
            if summing is not None:
                summing.future.wait()
                out.append(summing.total())
        for w in works:
            w.wait()
        return out + list(plain.values())

    results = _on_groups(world, run)
    assert all(
        torch.equal(a, b)
        for per_rank in results[1:]
        for a, b in zip(per_rank, results[0], strict=True)
    )
    summed = [(s, n) for kind, s, n in plan if kind == "sum"]
    for got, (scheme, numel) in zip(results[0], summed, strict=False):
        assert scheme is not None
        parts = [_contribution(r, numel) for r in range(world)]
        assert torch.equal(got, simulated_sum(parts, scheme))
    exact = [torch.stack([_contribution(r, n) for r in range(world)]).sum(0) for _, _, n in plan]
    plain_results = results[0][len(summed) :]
    plain_exact = [e for (kind, _, _), e in zip(plan, exact, strict=True) if kind == "allreduce"]
    assert all(torch.allclose(a, b) for a, b in zip(plain_results, plain_exact, strict=True))


def test_managers_average_quantized_gradients_to_the_same_bits() -> None:
    """Three replica groups (a Manager each) average int8 gradients large enough to
    take the reduce-scatter, and a plain one between them, for a few steps."""
    groups, steps = 3, 3
    numel = 400 * CHUNK
    assert choose_exchange(numel, groups, Quantization.INT8) is Exchange.REDUCE_SCATTER
    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=groups, join_timeout_ms=200, http_bind=None
    )

    def group(g: int) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            ProcessGroupGloo(timeout=TIMEOUT),
            min_replica_size=groups,
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lighthouse.address(),
            replica_id=f"g{g}",
            timeout=TIMEOUT,
            quorum_timeout=3 * TIMEOUT,
            init_sync=False,
            load_state_dict=lambda _: None,
            state_dict=lambda: {},
        )
        out = []
        try:
            for step in range(steps):
                manager.start_quorum()
                grad = _contribution(10 * g + step, numel)
                small = torch.full((3,), float(g))
                works = [
                    manager.allreduce(grad, should_quantize=True),
                    manager.allreduce(small),  # issued in turn, between the sum's stages
                ]
                for w in works:
                    w.wait()
                out.append((grad, small, manager.should_commit()))
        finally:
            manager.shutdown(wait=False)
        return out

    try:
        runs = run_in_threads([partial(group, g) for g in range(groups)], timeout_s=110)
    finally:
        lighthouse.shutdown()
    for step in range(steps):
        grads = [run[step][0] for run in runs]
        assert all(torch.equal(g, grads[0]) for g in grads)
        assert all(run[step][2] for run in runs)
        parts = [_contribution(10 * g + step, numel) for g in range(groups)]
        want = simulated_sum(parts, Quantization.INT8) / groups
        assert torch.equal(grads[0], want)
        assert all(run[step][1].tolist() == [1.0] * 3 for run in runs)

"""QuantizedSum over an in-memory group of several members (no sockets).

`Fabric` matches the members' collectives as Gloo does, by the order each
member issues them, and checks that the k-th ops of all members are the same
collective; the test decides when matched ops complete. Everything runs on
the test's thread: a completion runs the members' callbacks, which issue
their next collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed import Work
from torch.futures import Future

from tests.unit.manager_fakes import HeldWork
from torchft_pg.errors import ProcessGroupAbortedError
from torchft_pg.manager.issue_order import IssueOrder, Turn
from torchft_pg.manager.quantized_sum import QuantizedSum
from torchft_pg.process_group.dummy import ProcessGroupDummy
from torchft_pg.quantization import CHUNK, Exchange, Quantization, simulated_sum

_Op = tuple[str, Any, Any, Future[Any]]  # name, outputs, inputs, future


class Fabric:
    """The wires between `world` `Member`s. `auto`: complete each collective as
    soon as every member issued it; else `complete` does, in issue order."""

    def __init__(self, world: int, auto: bool = True) -> None:
        self.world = world
        self.auto = auto
        self.members = [Member(self, r) for r in range(world)]
        self._posted: list[dict[int, _Op]] = []  # by sequence number, then rank
        self._issued = [0] * world
        self.ready: list[int] = []  # matched and not completed (manual mode)
        self.log: list[tuple[int, str]] = []  # (rank, op) in issue order

    def post(self, rank: int, name: str, outputs: Any, inputs: Any) -> Work:
        fut: Future[Any] = Future()
        seq = self._issued[rank]
        self._issued[rank] += 1
        self.log.append((rank, name))
        while len(self._posted) <= seq:
            self._posted.append({})
        self._posted[seq][rank] = (name, outputs, inputs, fut)
        if len(self._posted[seq]) == self.world:
            names = {op[0] for op in self._posted[seq].values()}
            assert len(names) == 1, f"collective {seq} met different ops: {sorted(names)}"
            if self.auto:
                self._complete(seq)
            else:
                self.ready.append(seq)
        return HeldWork(fut)

    def complete(self, error: Exception | None = None) -> None:
        """Complete the oldest matched collective (fail it with `error`)."""
        self._complete(self.ready.pop(0), error)

    def _complete(self, seq: int, error: Exception | None = None) -> None:
        ops = [self._posted[seq][r] for r in range(self.world)]
        if error is None:
            _run(ops)
        for _, outputs, _, fut in ops:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(outputs)


def _run(ops: list[_Op]) -> None:
    """What the collective writes into every member's outputs."""
    name, world = ops[0][0], len(ops)
    if name == "allreduce":
        total = torch.stack([op[2] for op in ops]).sum(0)
        for op in ops:
            op[1].copy_(total)
    elif name == "allgather_into_tensor_coalesced":
        gathered = torch.cat([op[2] for op in ops])
        for op in ops:
            op[1].copy_(gathered)
    elif name == "alltoall_base":
        for r, (_, outputs, _, _) in enumerate(ops):
            blocks = outputs.view(world, -1)
            for i, op in enumerate(ops):
                blocks[i].copy_(op[2].view(world, -1)[r])
    else:
        raise AssertionError(f"unexpected collective {name}")


class Member(ProcessGroupDummy):
    """Member `rank` of a `Fabric`: the collectives a QuantizedSum issues."""

    def __init__(self, fabric: Fabric, rank: int) -> None:
        super().__init__(rank, fabric.world)
        self.fabric = fabric
        self.broken: Exception | None = None

    def errored(self) -> Exception | None:
        return self.broken

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        return self.fabric.post(self._rank, "allreduce", tensors[0], tensors[0].clone())

    def allgather_into_tensor_coalesced(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], *_: Any
    ) -> Work:
        return self.fabric.post(
            self._rank, "allgather_into_tensor_coalesced", output_tensors[0], input_tensors[0]
        )

    def alltoall_base(  # type: ignore[override]
        self, output_buffer: torch.Tensor, input_buffer: torch.Tensor, *_: Any
    ) -> Work:
        return self.fabric.post(self._rank, "alltoall_base", output_buffer, input_buffer)


def _parts(world: int, numel: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(world)
    return [torch.randn(numel, generator=gen) * 1e-3 for _ in range(world)]


def _plain(order: IssueOrder, pg: Member, tensor: torch.Tensor) -> list[Work]:
    """An allreduce issued in its turn of `order` (as the gradient sync issues one)."""
    works: list[Work] = []

    def start(turn: Turn) -> None:
        works.append(pg.allreduce([tensor]))
        turn.release()

    order.take(start)
    return works


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("scheme", list(Quantization))
def test_every_member_gets_the_same_bits_the_simulation_predicts(
    world: int, scheme: Quantization
) -> None:
    fabric = Fabric(world)
    parts = _parts(world, 7 * CHUNK + 5)
    sums = [
        QuantizedSum(m, p.view(-1, 1), scheme, exchange=Exchange.REDUCE_SCATTER)
        for m, p in zip(fabric.members, parts, strict=True)
    ]
    assert all(s.future.done() for s in sums)
    results = [s.total() for s in sums]
    assert results[0].shape == (7 * CHUNK + 5, 1)
    want = simulated_sum(parts, scheme, Exchange.REDUCE_SCATTER).view(-1, 1)
    assert all(torch.equal(r, want) for r in results)
    names = [name for rank, name in fabric.log if rank == 0]
    assert names == ["alltoall_base", "allgather_into_tensor_coalesced"]


def test_the_exchange_is_chosen_alike_on_every_member() -> None:
    fabric = Fabric(3)
    big = [QuantizedSum(m, torch.ones(1 << 18), Quantization.INT8) for m in fabric.members]
    small = [QuantizedSum(m, torch.ones(10), Quantization.INT8) for m in fabric.members]
    assert {s.exchange for s in big} == {Exchange.REDUCE_SCATTER}
    assert {s.exchange for s in small} == {Exchange.ALLGATHER}
    assert all(torch.equal(s.total(), torch.full((10,), 3.0)) for s in small)


def test_members_issue_in_the_same_order_whenever_a_first_stage_completes() -> None:
    """Member 0 asks for a plain allreduce before the sum's first stage completed;
    the others only after: without the order, member 0 would issue it before the
    sum's second stage and meet the others' allgather with it."""
    world = 3
    fabric = Fabric(world, auto=False)
    orders = [IssueOrder() for _ in range(world)]
    parts = _parts(world, 4 * CHUNK)
    plain = [torch.full((2,), float(r)) for r in range(world)]
    sums = [
        QuantizedSum(m, p, Quantization.INT8, order=o, exchange=Exchange.REDUCE_SCATTER)
        for m, p, o in zip(fabric.members, parts, orders, strict=True)
    ]
    early = _plain(orders[0], fabric.members[0], plain[0])
    assert not early  # waits for the sum's second stage
    fabric.complete()  # the alltoall: every member issues its allgather
    assert early  # member 0's allreduce follows its allgather at once
    late = [_plain(orders[r], fabric.members[r], plain[r]) for r in (1, 2)]
    assert all(late)
    fabric.complete()  # the allgather
    fabric.complete()  # the allreduce
    want = simulated_sum(parts, Quantization.INT8, Exchange.REDUCE_SCATTER)
    assert all(torch.equal(s.total(), want) for s in sums)
    assert all(t.tolist() == [3.0, 3.0] for t in plain)
    for r in range(world):
        assert [n for rank, n in fabric.log if rank == r] == [
            "alltoall_base",
            "allgather_into_tensor_coalesced",
            "allreduce",
        ]


def test_an_abandoned_sum_issues_nothing_more_and_lets_the_next_op_through() -> None:
    fabric = Fabric(3, auto=False)
    order = IssueOrder()
    member = fabric.members[0]
    parts = _parts(3, 4 * CHUNK)
    summing = QuantizedSum(
        member, parts[0], Quantization.INT8, order=order, exchange=Exchange.REDUCE_SCATTER
    )
    for m, p in zip(fabric.members[1:], parts[1:], strict=True):
        QuantizedSum(m, p, Quantization.INT8, exchange=Exchange.REDUCE_SCATTER)
    after = _plain(order, member, torch.ones(1))
    assert not after
    assert summing.abandon() is True  # its allgather was never issued
    assert after and order.idle()  # the next op did not wait for the alltoall
    fabric.complete()  # the alltoall completes late: member 0 issues no allgather
    assert [n for rank, n in fabric.log if rank == 0] == ["alltoall_base", "allreduce"]
    assert not summing.future.done()  # its caller stopped listening; nothing written


@pytest.mark.parametrize("exchange", list(Exchange))
def test_an_empty_tensor_sums_to_an_empty_tensor(exchange: Exchange) -> None:
    fabric = Fabric(3)
    sums = [
        QuantizedSum(m, torch.ones(0, 4), Quantization.INT8, exchange=exchange)
        for m in fabric.members
    ]
    assert all(s.total().shape == (0, 4) for s in sums)


def test_abandoning_a_sum_that_issued_everything_reports_nothing_skipped() -> None:
    fabric = Fabric(2)
    sums = [QuantizedSum(m, torch.ones(4), Quantization.BF16) for m in fabric.members]
    assert sums[0].abandon() is False


@pytest.mark.parametrize("stage", [0, 1])
def test_a_failed_stage_fails_the_sum_and_releases_its_turn(stage: int) -> None:
    fabric = Fabric(3, auto=False)
    order = IssueOrder()
    parts = _parts(3, 4 * CHUNK)
    summing = QuantizedSum(
        fabric.members[0], parts[0], Quantization.INT8, order=order,
        exchange=Exchange.REDUCE_SCATTER,
    )  # fmt: skip
    for m, p in zip(fabric.members[1:], parts[1:], strict=True):
        QuantizedSum(m, p, Quantization.INT8, exchange=Exchange.REDUCE_SCATTER)
    if stage == 1:
        fabric.complete()
    fabric.complete(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        summing.future.wait()
    assert order.idle()
    assert summing.abandon() is (stage == 0)


def test_a_sum_whose_group_broke_before_its_second_stage_gives_up() -> None:
    fabric = Fabric(3, auto=False)
    go = [True]
    proceed: Callable[[], bool] = lambda: go[0]  # noqa: E731
    parts = _parts(3, 4 * CHUNK)
    sums = [
        QuantizedSum(m, p, Quantization.INT8, exchange=Exchange.REDUCE_SCATTER, proceed=proceed)
        for m, p in zip(fabric.members, parts, strict=True)
    ]
    go[0] = False  # e.g. a notice aborted the group, or the step's quorum moved on
    fabric.complete()
    with pytest.raises(ProcessGroupAbortedError, match="given up between its stages"):
        sums[0].future.wait()
    assert [n for _, n in fabric.log] == ["alltoall_base"] * 3

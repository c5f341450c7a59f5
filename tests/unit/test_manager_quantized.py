"""The Manager's quantized allreduce in two stages (reduce-scatter, then allgather),
with injected fakes: what an abort, a timeout or a later op sees between them."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch

from lighthouse import FailureNotice
from tests.unit.manager_fakes import make, result
from torchft_pg.quantization import CHUNK, Exchange, Quantization, choose_exchange

NUMEL = 256 * CHUNK  # at 3 groups int8 takes the reduce-scatter (asserted below)


def _gradient() -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(0))


def test_the_size_used_here_takes_the_reduce_scatter() -> None:
    assert choose_exchange(NUMEL, 3, Quantization.INT8) is Exchange.REDUCE_SCATTER


def test_an_op_requested_between_the_stages_is_issued_after_the_second() -> None:
    manager, _, _, pg = make([result(world=3)])
    manager.start_quorum()
    pg.hold = True
    t = _gradient()
    quantized = manager.allreduce(t, should_quantize=True)
    plain = manager.allreduce(torch.ones(2))
    assert pg.ops == ["alltoall_base"]  # the allreduce waits for the sum's allgather
    pg.pending[0].set_result(pg.held[0])  # the alltoall completes
    assert pg.ops == ["alltoall_base", "allgather_into_tensor_coalesced", "allreduce"]
    assert not quantized.is_completed()
    pg.pending[1].set_result(pg.held[1])
    assert quantized.get_future().wait() is t
    pg.held[2][0].fill_(3.0)  # what the held allreduce sums
    pg.pending[2].set_result(pg.held[2])
    assert plain.get_future().wait().tolist() == [1.0, 1.0]
    assert manager.errored() is None and manager.should_commit()
    manager.shutdown()


def test_an_abort_during_the_first_stage_completes_at_once_and_writes_nothing() -> None:
    manager, client, _, pg = make([result(world=3)])
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True
    t = _gradient()
    before = t.clone()
    quantized = manager.allreduce(t, should_quantize=True)
    queued = manager.allreduce(torch.ones(2))
    done = threading.Event()
    quantized.get_future().add_done_callback(lambda _: done.set())
    client.failure_callback(
        FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), reason="stream closed")
    )
    assert done.wait(1.0)  # by the notice, not by the 5 s timeout
    assert queued.get_future().wait().tolist() == [1.0, 1.0]  # aborted too, untouched
    # The alltoall completes late (a frozen peer resumed): no allgather is issued,
    # the queued allreduce never is, and nothing reaches the caller's tensor.
    pg.held[0][0].fill_(7)
    pg.pending[0].set_result(pg.held[0])
    assert pg.ops == ["alltoall_base"]
    assert torch.equal(t, before)
    assert "r2" in str(manager.errored())
    assert manager._state.skipped_collectives  # the integrity check stays out of it
    assert manager.should_commit() is False
    manager.shutdown()


def test_a_timeout_during_the_first_stage_issues_no_second_one() -> None:
    manager, _, _, pg = make([result(world=3)], timeout=timedelta(milliseconds=200))
    manager.start_quorum()
    pg.hold = True
    t = _gradient()
    before = t.clone()
    work = manager.allreduce(t, should_quantize=True)
    assert work.get_future().wait() is t  # completed by the timeout
    pg.pending[0].set_result(pg.held[0])
    assert pg.ops == ["alltoall_base"] and torch.equal(t, before)
    assert "did not finish within" in str(manager.errored())
    manager.shutdown()


def test_a_failed_first_stage_fails_the_step_and_the_next_op_is_skipped() -> None:
    manager, _, _, pg = make([result(world=3)])
    manager.start_quorum()
    pg.hold = True
    t = _gradient()
    before = t.clone()
    work = manager.allreduce(t, should_quantize=True)
    pg.pending[0].set_exception(RuntimeError("Connection closed by peer"))
    assert work.get_future().wait() is t and torch.equal(t, before)
    assert "Connection closed by peer" in str(manager.errored())
    manager.allreduce(torch.ones(2)).wait()
    assert pg.ops == ["alltoall_base"]
    assert manager.should_commit() is False
    manager.shutdown()


def test_a_healing_member_contributes_zeros_through_both_stages() -> None:
    # The fake group's members all send what this one sends: zeros sum to zeros.
    manager, _, _, pg = make([result(world=3)])
    manager.start_quorum()
    manager._state.healing = True
    t = _gradient()
    manager.allreduce(t, should_quantize=True).wait()
    assert pg.ops == ["alltoall_base", "allgather_into_tensor_coalesced"]
    assert bool((t == 0).all())
    manager.shutdown()

"""The Manager surface a torchft user calls, with torchft's names and shapes."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import ReduceOp

from tests.unit.manager_fakes import FakeTransport, make, result
from torchft_pg import OptimizerWrapper
from torchft_pg.errors import RecoveryError
from torchft_pg.manager import MANAGER_ADDR_KEY, REPLICA_ID_KEY


def test_store_keys_are_torchfts() -> None:
    assert (MANAGER_ADDR_KEY, REPLICA_ID_KEY) == ("manager_addr", "replica_id")


def test_state_dict_registration_takes_torchfts_keywords() -> None:
    manager, _, transport, _ = make([result(dst=[1])])
    seen: list[Any] = []
    manager.register_state_dict_fn(
        "model", load_state_dict=seen.append, state_dict=lambda: {"w": 1}
    )
    manager.set_state_dict_fns(load_state_dict=seen.append, state_dict=lambda: {"v": 2})
    with pytest.raises(ValueError, match="'model'"):
        manager.register_state_dict_fn("model", seen.append, lambda: 0)
    manager.start_quorum()
    assert manager.should_commit()  # an asynchronous quorum serves at the vote
    assert transport.sent[0][2]["user"] == {"model": {"w": 1}, "default": {"v": 2}}
    manager.shutdown()


def test_allreduce_takes_a_reduce_op_object_as_c10d_passes_it() -> None:
    manager, _, _, _ = make([result(world=2)])
    manager.start_quorum()
    t = torch.full((2,), 3.0)
    manager.allreduce(t, reduce_op=ReduceOp(ReduceOp.MAX)).wait()
    assert t.tolist() == [6.0, 6.0]  # the fake group multiplies by the world; not divided
    assert manager.errored() is None
    manager.shutdown()


def test_a_heal_send_waits_while_state_dict_reads_are_disallowed() -> None:
    manager, _, transport, _ = make([result(dst=[1])])
    manager.register_state_dict_fn("model", lambda s: None, lambda: {"w": 1})
    manager.disallow_state_dict_read()
    manager.disallow_state_dict_read()  # idempotent
    manager.start_quorum()
    sent = threading.Event()

    def wait_then_signal() -> None:
        manager.should_commit()  # an asynchronous quorum serves at the vote
        sent.set()

    waiter = threading.Thread(target=wait_then_signal)
    waiter.start()
    assert not sent.wait(0.2)  # held: the optimizer may be mutating the state
    assert transport.sent == []
    manager.allow_state_dict_read()
    assert sent.wait(5.0)
    waiter.join()
    assert len(transport.sent) == 1 and manager.errored() is None
    manager.shutdown()


def test_a_heal_send_disallowed_past_the_timeout_fails_the_step_not_the_job() -> None:
    manager, _, transport, _ = make([result(dst=[1])], timeout=timedelta(milliseconds=200))
    manager.disallow_state_dict_read()
    manager.start_quorum()
    assert manager.should_commit() is False
    errored = manager.errored()
    assert errored is not None and isinstance(errored.original_exception, RecoveryError)
    assert "disallow_state_dict_read" in str(errored)
    assert transport.sent == []
    manager.shutdown()


def test_disallow_waits_for_a_send_reading_the_state() -> None:
    reading, release = threading.Event(), threading.Event()

    class SlowTransport(FakeTransport):
        def send_checkpoint(self, dst_ranks: list[int], step: int, sd: Any, t: Any) -> None:
            reading.set()
            assert release.wait(5.0)
            super().send_checkpoint(dst_ranks, step, sd, t)

    manager, _, transport, _ = make([result(dst=[1])], transport=SlowTransport())
    manager.start_quorum()
    voter = threading.Thread(target=manager.should_commit)  # serves at the vote
    voter.start()
    assert reading.wait(5.0)
    disallowed = threading.Event()

    def disallow_then_signal() -> None:
        manager.disallow_state_dict_read()
        disallowed.set()

    t = threading.Thread(target=disallow_then_signal)
    t.start()
    assert not disallowed.wait(0.2)  # the send is still reading
    release.set()
    assert disallowed.wait(5.0)
    t.join()
    voter.join(timeout=5.0)
    assert len(transport.sent) == 1
    manager.allow_state_dict_read()
    manager.shutdown()


def test_optimizer_wrapper_takes_torchfts_keywords() -> None:
    manager, _, _, _ = make([result()])
    param = torch.nn.Parameter(torch.ones(1))
    inner = torch.optim.SGD([param], lr=1.0)
    opt = OptimizerWrapper(manager=manager, optim=inner)
    assert opt.optim is inner and opt.param_groups is inner.param_groups
    opt.zero_grad()
    param.grad = torch.ones(1)
    opt.step()
    assert param.item() == 0.0 and manager.current_step() == 1
    with pytest.raises(TypeError, match="optimizer"):
        OptimizerWrapper(manager, optim=object())  # type: ignore[arg-type]
    manager.shutdown()


def test_pure_ddp_reduces_each_gradient_and_the_vote_waits_for_them() -> None:
    """torchft's PureDistributedDataParallel: per-parameter allreduces nobody waits
    on during backward; should_commit waits for them before voting."""
    from torchft_pg.ddp import PureDistributedDataParallel

    manager, client, _, pg = make([result(world=2)])
    model = torch.nn.Linear(3, 1)
    ddp = PureDistributedDataParallel(manager, model)
    optim = OptimizerWrapper(manager, torch.optim.SGD(model.parameters(), lr=1.0))
    before = model.weight.detach().clone()
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True
    ddp(torch.ones(2, 3)).sum().backward()
    assert len(pg.pending) == 2  # weight and bias, issued from the hooks
    local_grad = model.weight.grad.detach().clone()  # type: ignore[union-attr]
    voted = threading.Event()

    def step() -> None:
        optim.step()
        voted.set()

    stepper = threading.Thread(target=step)
    stepper.start()
    assert not voted.wait(0.3)  # still waiting for the reductions, not voting yet
    for fut in pg.pending:
        fut.set_result(None)  # the peers' sums arrive (SumGroup's result: the same grads)
    assert voted.wait(5.0)
    stepper.join(5.0)
    assert client.votes[-1] == (0, True)
    # averaged over 2 participants: this fake's sum is the local value, so grad / 2
    torch.testing.assert_close(model.weight.grad, local_grad / 2)
    torch.testing.assert_close(model.weight.detach(), before - local_grad / 2)
    manager.shutdown()


def test_ddp_reduces_in_reduce_dtype_and_casts_back() -> None:
    """`reduce_dtype=torch.float64`: the group sees a float64 bucket; the gradients
    stay float32 and hold the average."""
    from torchft_pg.ddp import DistributedDataParallel

    with pytest.raises(ValueError, match=r"reduce_dtype must be a floating dtype, got torch.int64"):
        DistributedDataParallel(
            make([result(world=2)])[0], torch.nn.Linear(3, 1), reduce_dtype=torch.int64
        )
    manager, _, _, pg = make([result(world=2)])
    model = torch.nn.Linear(3, 1)
    ddp = DistributedDataParallel(manager, model, reduce_dtype=torch.float64)
    optim = OptimizerWrapper(manager, torch.optim.SGD(model.parameters(), lr=1.0))
    optim.zero_grad()
    manager.start_quorum()
    manager.wait_quorum()
    pg.hold = True
    x = torch.tensor([[1.0, 2.0, 3.0]])
    ddp(x).sum().backward()
    assert [t.dtype for t in pg.held[0]] == [torch.float64]
    for tensors, fut in zip(pg.held, pg.pending, strict=True):
        for t in tensors:
            t.mul_(2)  # the peer sent the same bucket
        fut.set_result(tensors)
    optim.step()
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32
    torch.testing.assert_close(model.weight.grad, x)  # (x + x) / 2 participants
    manager.shutdown()


def test_a_refused_vote_is_a_no_and_a_vote_timeout_is_raised() -> None:
    """A refused vote (late: the group decided without it) means the step was not
    committed; a timeout leaves the decision unknown and is raised."""
    from lighthouse import QuorumRejectedError, QuorumTimeoutError

    manager, _, _, _ = make(
        [result(world=2), result(world=2)],
        decisions=[QuorumRejectedError("late vote"), QuorumTimeoutError("no answer")],
    )
    manager.start_quorum()
    assert manager.should_commit() is False
    assert manager.current_step() == 0 and isinstance(manager.errored(), Exception)
    manager.start_quorum()
    with pytest.raises(QuorumTimeoutError, match="no answer"):
        manager.should_commit()
    manager.shutdown()

"""DDP reduces its buckets in place, and retires them after an op that did not succeed.

An op a failure notice abandoned may still complete in the retired backend and
write into the bucket it was given; these tests play that late write and
check that it reaches no later step's gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import Work

from lighthouse import FailureNotice
from tests.unit.manager_fakes import SumGroup, make, result
from torchft_pg.ddp import DistributedDataParallel
from torchft_pg.optim import OptimizerWrapper

X = torch.tensor([[1.0, 2.0, 3.0]])


def _setup(
    worlds: int = 1, world: int = 2, **ddp_kwargs: Any
) -> tuple[Any, Any, SumGroup, torch.nn.Linear, DistributedDataParallel, OptimizerWrapper]:
    manager, client, _, pg = make([result(world=world)] * worlds)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ddp = DistributedDataParallel(manager, model, **ddp_kwargs)
    optim = OptimizerWrapper(manager, torch.optim.SGD(model.parameters(), lr=1.0))
    return manager, client, pg, model, ddp, optim


def _record(pg: SumGroup, then: Callable[[], None] = lambda: None) -> list[torch.Tensor]:
    """Every tensor `pg` is asked to reduce, in order; `then` runs after each submit."""
    seen: list[torch.Tensor] = []
    submit = SumGroup.allreduce.__get__(pg)  # the fake's own, not an earlier recorder

    def allreduce(tensors: list[torch.Tensor], opts: Any = None) -> Work:
        seen.extend(tensors)
        work = submit(tensors, opts)
        then()
        return work

    pg.allreduce = allreduce  # type: ignore[method-assign]
    return seen


def _step(ddp: DistributedDataParallel, optim: OptimizerWrapper) -> None:
    optim.zero_grad()
    ddp(X).sum().backward()


def test_a_bucket_is_reduced_in_place_without_a_copy() -> None:
    manager, _, pg, model, ddp, optim = _setup()
    seen = _record(pg)
    for _ in range(2):
        _step(ddp, optim)
        optim.step()
        assert model.weight.grad is not None
        torch.testing.assert_close(model.weight.grad, X)  # (x + x) / 2 participants
    assert len(seen) == 2 and seen[0].data_ptr() == seen[1].data_ptr()  # the bucket itself
    manager.shutdown()


def test_an_abandoned_in_place_op_writing_late_reaches_no_later_step() -> None:
    manager, client, pg, model, ddp, optim = _setup(worlds=2, world=3)
    notice = FailureNotice(epoch="ep", quorum_id=1, dead_replica_ids=("r2",), reason="frozen")
    pg.hold = True
    seen = _record(pg, then=lambda: client.failure_callback(notice))  # abandoned at once
    _step(ddp, optim)
    [abandoned] = seen
    before = model.weight.detach().clone()
    optim.step()  # the vote is no: nothing applied
    torch.testing.assert_close(model.weight.detach(), before)
    # The next step runs on a new bucket; the abandoned op's late write, played
    # once that bucket holds the step's gradients, must not reach them.
    pg.hold = False

    def finish_late() -> None:
        abandoned.fill_(99.0)
        pg.pending[0].set_result([abandoned])

    late = _record(pg, then=finish_late)
    _step(ddp, optim)
    assert len(late) == 1 and late[0].data_ptr() != abandoned.data_ptr()
    assert manager.should_commit() is True
    torch.testing.assert_close(model.weight.grad, X)  # (3 x) / 3: nothing of the 99s
    manager.shutdown()


def test_buckets_that_are_the_gradients_are_reduced_through_a_copy() -> None:
    # With gradient_as_bucket_view the bucket is the gradients' own memory, which
    # a new reducer would not retire: the backend gets a private copy instead.
    manager, _, pg, model, ddp, optim = _setup(gradient_as_bucket_view=True)
    seen = _record(pg)
    _step(ddp, optim)
    optim.step()
    grad = model.weight.grad
    assert grad is not None
    torch.testing.assert_close(grad, X)
    [written] = seen
    assert not written.data_ptr() <= grad.data_ptr() < written.data_ptr() + written.nbytes
    manager.shutdown()

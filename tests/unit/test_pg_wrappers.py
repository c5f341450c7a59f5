"""Dummy, ErrorSwallowing and Managed groups, driven without sockets.

`FailingGroup` is a ProcessGroupDummy whose collectives fail on demand: the
thing under test is the wrapper, not the backend.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import ReduceOp, Work

from torchft_pg import (
    ErrorSwallowingProcessGroupWrapper,
    ManagedProcessGroup,
    ProcessGroupDummy,
    ProcessGroupGloo,
    ProcessGroupWrapper,
)
from torchft_pg.process_group import FakeProcessGroupWrapper
from torchft_pg.work import FailedWork, completed_work


class FailingGroup(ProcessGroupDummy):
    def __init__(self, world: int = 2) -> None:
        super().__init__(rank=0, world=world)
        self.fail_sync: Exception | None = None
        self.fail_async: Exception | None = None
        self.calls = 0

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        self.calls += 1
        if self.fail_sync is not None:
            raise self.fail_sync
        if self.fail_async is not None:
            return FailedWork(self.fail_async)
        for t in tensors:
            t.mul_(self.size())
        return completed_work(tensors)

    def broadcast(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        self.calls += 1
        if self.fail_sync is not None:
            raise self.fail_sync
        return completed_work(tensor_list)


def test_dummy_counts_configures_and_copies_gathers() -> None:
    pg = ProcessGroupDummy(rank=0, world=1)
    pg.configure("h:1/a", 0, 1)
    pg.configure("h:1/b", 0, 1)
    assert pg.configure_count == 2
    out = [[torch.zeros(2)]]
    pg.allgather(out, [torch.ones(2)]).wait()
    assert out[0][0].tolist() == [1.0, 1.0]
    t = torch.full((2,), 3.0)
    assert pg.allreduce([t]).get_future().wait() == [t]


def test_error_swallowing_captures_first_failure_and_skips_until_configure() -> None:
    inner = FailingGroup()
    pg = ErrorSwallowingProcessGroupWrapper(inner)
    t = torch.ones(2)
    pg.allreduce([t]).wait()
    assert t.tolist() == [2.0, 2.0]

    first = RuntimeError("connection closed by peer")
    inner.fail_async = first
    work = pg.allreduce([t])
    assert work.wait() is False  # reported, not raised
    assert pg.error() is first and pg.errored() is first

    inner.fail_async = None
    inner.fail_sync = RuntimeError("second failure")
    calls = inner.calls
    untouched = torch.full((2,), 7.0)
    value = pg.allreduce([untouched]).get_future().wait()
    pg.broadcast([untouched]).wait()
    assert inner.calls == calls  # skipped: the backend was not called
    assert untouched.tolist() == [7.0, 7.0] and value == [untouched]
    assert pg.error() is first  # the first real failure is kept

    inner.fail_sync = None
    pg.configure("h:1/next", 0, 2)
    assert pg.error() is None
    pg.allreduce([untouched]).wait()
    assert untouched.tolist() == [14.0, 14.0]


def test_error_swallowing_future_yields_inputs_on_failure() -> None:
    inner = FailingGroup()
    pg = ErrorSwallowingProcessGroupWrapper(inner)
    inner.fail_async = RuntimeError("peer died")
    t = torch.full((1,), 5.0)
    assert pg.allreduce([t]).get_future().wait() == [t]
    assert isinstance(pg.error(), RuntimeError)


class FakeManager:
    """The Manager interface ManagedProcessGroup relies on, with observable calls."""

    def __init__(self, pg: ProcessGroupDummy, participants: int) -> None:
        self.pg = pg
        self.participants = participants
        self.errors: list[Exception] = []
        self.allreduce_calls: list[tuple[torch.Tensor, Any]] = []

    def allreduce(
        self, tensor: torch.Tensor, should_quantize: bool = False, reduce_op: Any = ReduceOp.AVG
    ) -> Work:
        self.allreduce_calls.append((tensor, reduce_op))
        tensor.add_(100)
        return completed_work([tensor])

    def num_participants(self) -> int:
        return self.participants

    def participating_rank(self) -> int | None:
        return 1

    def report_error(self, e: Exception) -> None:
        self.errors.append(e)

    def errored(self) -> Exception | None:
        return self.errors[0] if self.errors else None


def test_managed_group_routes_allreduce_through_manager_and_reports_errors() -> None:
    inner = FailingGroup(world=3)
    manager = FakeManager(inner, participants=2)
    pg = ManagedProcessGroup(manager)
    assert pg.size() == 2 and pg.rank() == 1
    t = torch.zeros(1)
    pg.allreduce([t], ReduceOp(ReduceOp.SUM)).wait()
    assert t.item() == 100.0 and manager.allreduce_calls[0][1] == ReduceOp.SUM

    inner.fail_sync = RuntimeError("broadcast broke")
    pg.broadcast([t]).wait()  # another collective: error goes to the manager
    assert [str(e) for e in manager.errors] == ["broadcast broke"]
    before = len(manager.allreduce_calls)
    pg.allreduce([t]).wait()  # the manager errored: skipped
    assert len(manager.allreduce_calls) == before


def test_error_swallowing_needs_a_torchft_group() -> None:
    with pytest.raises(TypeError, match="torchft_pg ProcessGroup"):
        ErrorSwallowingProcessGroupWrapper(object())  # type: ignore[arg-type]


def test_wrapper_around_a_dummy_configures_with_an_address_it_never_uses() -> None:
    """torchft's test_process_group_wrapper: ``configure("addr", ...)`` on a wrapper of a
    Dummy reaches the Dummy; no store address is parsed or dialled."""
    pg = ProcessGroupDummy(0, 1)
    wrapper = ProcessGroupWrapper(pg=pg)
    assert wrapper.parent is pg
    wrapper.configure("addr", "0", 0, 1)
    assert pg.configure_count == 1
    assert repr(wrapper) == "ProcessGroupWrapper(pg=ProcessGroupDummy())"
    wrapper.configure("addr", 0, 1)  # our 3-argument form as well
    assert pg.configure_count == 2
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\), got 3"):
        wrapper.configure("addr", "0", 3, 1)  # rank and size are still checked
    assert pg.configure_count == 2


def test_wrapper_around_a_group_that_uses_the_address_still_refuses_a_bad_one() -> None:
    inner = ProcessGroupGloo(timeout=5.0)
    wrapper = ProcessGroupWrapper(pg=inner)
    with pytest.raises(ValueError, match=r"store address must be .* got 'addr'"):
        wrapper.configure("addr", "0", 0, 1)  # refused by the Gloo group, before any socket


def test_fake_wrapper_fails_the_next_allreduce_only_after_running_it() -> None:
    inner = FailingGroup()
    pg = FakeProcessGroupWrapper(inner)
    assert pg.parent is inner
    injected = RuntimeError("injected allreduce error")
    pg.report_future_error(injected)

    pg.broadcast([torch.ones(1)]).wait()  # not an allreduce: untouched, error kept
    t = torch.ones(2)
    work = pg.allreduce([t])
    with pytest.raises(RuntimeError, match="injected allreduce error") as err:
        work.wait()
    assert err.value is injected
    assert t.tolist() == [2.0, 2.0] and inner.calls == 2  # the op itself ran
    with pytest.raises(RuntimeError, match="injected allreduce error"):
        work.get_future().wait()

    t = torch.ones(2)
    assert pg.allreduce([t]).get_future().wait() == [t]  # one shot: the next one succeeds
    assert t.tolist() == [2.0, 2.0]


def test_fake_wrapper_future_fails_and_configure_drops_a_pending_error() -> None:
    inner = FailingGroup()
    pg = FakeProcessGroupWrapper(inner)
    pg.report_future_error(ValueError("first"))
    pg.report_future_error(RuntimeError("second"))  # replaces the one not yet taken
    with pytest.raises(RuntimeError, match="second"):
        pg.allreduce([torch.ones(1)]).get_future().wait()

    pg.report_future_error(RuntimeError("never used"))
    pg.configure("h:1/next", "0", 0, 2)
    assert inner.configure_count == 1
    assert pg.allreduce([torch.ones(1)]).wait() is True


def test_fake_wrapper_own_failure_wins_and_arguments_are_checked() -> None:
    inner = FailingGroup()
    pg = FakeProcessGroupWrapper(inner)
    inner.fail_async = RuntimeError("peer died")
    pg.report_future_error(RuntimeError("injected"))
    with pytest.raises(RuntimeError, match="peer died"):
        pg.allreduce([torch.ones(1)]).get_future().wait()
    with pytest.raises(TypeError, match="needs an Exception, got 'oops'"):
        pg.report_future_error("oops")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="torchft_pg ProcessGroup"):
        FakeProcessGroupWrapper(object())  # type: ignore[arg-type]

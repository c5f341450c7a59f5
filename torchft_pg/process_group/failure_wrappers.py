"""Wrappers that change what a failure does: swallow it, hand it to the Manager, or
(for tests) make one up.

The first two override the single collective path `_run`, so every collective
(not only allreduce, as in torchft) is protected. `FakeProcessGroupWrapper`
injects a failure into the next allreduce only, as torchft's does.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Protocol

import torch
from torch.distributed import ReduceOp, Work
from torch.futures import Future, collect_all

from torchft_pg import _torch_internals
from torchft_pg.errors import NotConfiguredError
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.process_group.reconfigurable import ProcessGroupWrapper
from torchft_pg.work import ErrorSwallowingWork, completed_work

__all__ = [
    "ErrorSwallowingProcessGroupWrapper",
    "FakeProcessGroupWrapper",
    "ManagedProcessGroup",
    "ManagerLike",
]


class ErrorSwallowingProcessGroupWrapper(ProcessGroupWrapper):
    """After the first failure every collective is skipped until `configure`.

    A skipped collective returns a completed Work and leaves its tensors
    untouched; a failing one reports its error instead of raising. `error()`
    holds the first real failure. Collectives before any `configure` still
    raise NotConfiguredError: that is a programming error, not a fault.
    """

    def __init__(self, pg: ProcessGroup) -> None:
        if not isinstance(pg, ProcessGroup):
            raise TypeError(f"pg must be a torchft_pg ProcessGroup, got {type(pg).__name__}")
        super().__init__(pg=pg)

    def report_error(self, e: Exception) -> None:
        """Record `e` unless an earlier error is already recorded."""
        if self._error is None:
            self._error = e

    def error(self) -> Exception | None:
        """The first failure since the last `configure`, or None."""
        return self._error

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        if self.error() is not None:
            return completed_work(outputs)
        try:
            work = super()._run(op, outputs, *args)
        except NotConfiguredError:
            raise
        except Exception as e:
            self.report_error(e)
            return completed_work(outputs)
        return ErrorSwallowingWork(work, self.report_error, outputs)


class _InjectedFailureWork(Work):
    """`work` runs to its end, then fails with `error` (unless it failed by itself).

    The op really runs, so peers are not left waiting for this member; only
    this member's view of the result is a failure.
    """

    def __init__(self, work: Work, error: Exception) -> None:
        super().__init__()
        self._work = work
        self._error = error

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is None:
            self._work.wait()
        else:
            self._work.wait(timeout)
        raise self._error

    def get_future(self) -> Future[Any]:
        error = self._error

        def fail(fut: Future[Any]) -> Any:
            fut.value()  # the op's own failure, if any, wins
            raise error

        return self._work.get_future().then(fail)

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def is_success(self) -> bool:
        return False

    def exception(self) -> Any:
        return self._error


class FakeProcessGroupWrapper(ProcessGroupWrapper):
    """Wraps a group so a test can make its next allreduce fail (torchft's fault injector).

    After `report_future_error(e)`, the next allreduce still runs on the inner
    group (its peers see a normal collective), but the Work it returns fails
    with `e`: ``wait()`` raises it and the future completes with it. Only that
    one allreduce fails; `configure` drops an error no allreduce has taken yet.
    """

    def __init__(self, pg: ProcessGroup) -> None:
        if not isinstance(pg, ProcessGroup):
            raise TypeError(f"pg must be a torchft_pg ProcessGroup, got {type(pg).__name__}")
        super().__init__(pg=pg)
        self._lock = threading.Lock()  # a test thread injects while a training thread runs ops
        self._future_error: Exception | None = None

    def configure(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self._future_error = None
        super().configure(*args, **kwargs)

    def report_future_error(self, e: Exception) -> None:
        """Make the next allreduce's Work fail with `e` (replacing an error not yet taken)."""
        if not isinstance(e, Exception):
            raise TypeError(f"report_future_error needs an Exception, got {e!r}")
        with self._lock:
            self._future_error = e

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        work = super()._run(op, outputs, *args)
        if op != "allreduce":
            return work
        with self._lock:
            error, self._future_error = self._future_error, None
        return work if error is None else _InjectedFailureWork(work, error)


class ManagerLike(Protocol):
    """What ManagedProcessGroup needs of a Manager (see `torchft_pg.manager`)."""

    @property
    def pg(self) -> ProcessGroup: ...

    def allreduce(
        self,
        tensor: torch.Tensor,
        should_quantize: bool = ...,
        reduce_op: ReduceOp | ReduceOp.RedOpType = ...,
    ) -> Work: ...

    def num_participants(self) -> int: ...

    def participating_rank(self) -> int | None: ...

    def report_error(self, e: Exception) -> None: ...

    def errored(self) -> Exception | None: ...


class ManagedProcessGroup(ErrorSwallowingProcessGroupWrapper):
    """The Manager's cross-replica group, seen as a ProcessGroup (e.g. for HSDP).

    `size()` is the number of participating replicas; allreduce goes through
    `manager.allreduce` (averaging over participants, zeros from healing
    replicas); every other collective runs on the Manager's group with its
    errors reported to the Manager, and is skipped once the Manager errored.
    The Manager, not the user, configures the underlying group.
    """

    def __init__(self, manager: ManagerLike) -> None:
        super().__init__(manager.pg)
        self._manager = manager

    def report_error(self, e: Exception) -> None:
        self._manager.report_error(e)

    def error(self) -> Exception | None:
        return self._manager.errored()

    def errored(self) -> Exception | None:
        return self._manager.errored()

    def size(self) -> int:
        return self._manager.num_participants()

    def rank(self) -> int:
        return self._manager.participating_rank() or 0

    def getBackendName(self) -> str:
        return "torchft-managed"

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        if op != "allreduce":
            return super()._run(op, outputs, *args)
        if self.error() is not None:
            return completed_work(outputs)
        tensors, opts = args
        # The Manager's futures yield one tensor; c10d's yield the list of tensors.
        works = [self._manager.allreduce(t, reduce_op=opts.reduceOp) for t in tensors]
        fut = collect_all([w.get_future() for w in works]).then(lambda _: tensors)
        return _torch_internals.work_from_future(fut)

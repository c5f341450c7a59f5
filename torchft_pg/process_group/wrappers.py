"""Wrappers that change what a failure does: swallow it, or hand it to the Manager.

Both override the single collective path `_run`, so every collective (not
only allreduce, as in torchft) is protected.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
    ReduceOp,
    Work,
    _create_work_from_future,
)
from torch.futures import collect_all

from torchft_pg.errors import NotConfiguredError
from torchft_pg.process_group.base import ProcessGroup
from torchft_pg.process_group.wrapper import ProcessGroupWrapper
from torchft_pg.work import ErrorSwallowingWork, completed_work

__all__ = ["ErrorSwallowingProcessGroupWrapper", "ManagedProcessGroup", "ManagerLike"]


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
        return _create_work_from_future(fut)

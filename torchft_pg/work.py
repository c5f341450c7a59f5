"""Work helpers: completed works and works whose failures are swallowed.

c10d code (DDP's reducer, functional collectives) only ever calls `wait()`
and `get_future()` on a Work, so these are the two methods that matter.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import Work, _create_work_from_future  # type: ignore[attr-defined]
from torch.futures import Future

from torchft_pg.futures import ProxyFuture

__all__ = ["ErrorSwallowingWork", "FailedWork", "ManagedWork", "completed_future", "completed_work"]


def completed_future(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


def completed_work(value: Any = None) -> Work:
    """A Work that is already done and whose future yields `value`."""
    return _create_work_from_future(completed_future(value))


class FailedWork(Work):
    """A Work that failed with `error`, as a backend's does when a peer dies."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self._error = error

    def wait(self, timeout: timedelta | None = None) -> bool:
        raise self._error

    def get_future(self) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_exception(self._error)
        return fut


class ManagedWork(Work):
    """The Manager's collective: its future never raises (errors yield the default)
    and always completes, at the latest at the proxy's deadline."""

    def __init__(self, proxy: ProxyFuture[Any]) -> None:
        super().__init__()
        self._proxy = proxy

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._proxy.future.wait()
        return True

    def get_future(self) -> Future[Any]:
        return self._proxy.future

    def is_completed(self) -> bool:
        return self._proxy.done


class ErrorSwallowingWork(Work):
    """Wraps a Work so that a failure is reported, never raised.

    `wait()` returns False after reporting; the future yields `default` (the
    collective's output tensors, untouched) instead of an exception, so DDP's
    reducer carries on and the step is rejected by the commit vote instead.
    """

    def __init__(self, work: Work, report: Callable[[Exception], None], default: Any) -> None:
        super().__init__()
        self._work = work
        self._report = report
        self._default = default

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(timeout)
        except Exception as e:
            self._report(e)
            return False
        return True

    def get_future(self) -> Future[Any]:
        default = self._default

        def swallow(fut: Future[Any]) -> Any:
            try:
                return fut.value()
            except Exception as e:
                self._report(e)
                return default

        return self._work.get_future().then(swallow)

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def synchronize(self) -> None:
        try:
            self._work.synchronize()
        except Exception as e:
            self._report(e)

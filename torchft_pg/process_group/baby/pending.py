"""Requests a Baby group has sent its child and awaits replies for (see `parent`)."""

from __future__ import annotations

import threading
from typing import Any

from torch.futures import Future

from torchft_pg.process_group.baby import protocol as proto

__all__ = ["PendingOp", "PendingRequest"]

_COMPLETION = threading.Lock()  # makes finish() once-only and orders it against get_future()


class PendingRequest:
    """A request awaiting its reply. `_released` is held until the reply came:
    blocking on a bare lock is cheaper than on a threading.Event (a Condition)."""

    __slots__ = ("_released", "done", "error", "reply")

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None
        self.reply: Any = None
        self._released = threading.Lock()
        self._released.acquire()

    def finish(self, error: Exception | None, reply: Any = None) -> None:
        """Record the outcome and wake waiters; later calls do nothing."""
        with _COMPLETION:
            if self.done:
                return
            self.error = error
            self.reply = reply
            self.done = True
        self._released.release()

    def block(self, seconds: float) -> bool:
        """Sleep until done or `seconds` passed (another thread reads the reply)."""
        if self._released.acquire(timeout=max(seconds, 0.0)):
            self._released.release()  # let later waiters through too
            return True
        return self.done


class PendingOp(PendingRequest):
    """One op in flight; its future is made only if asked for (most callers just wait)."""

    __slots__ = ("encoded", "future", "outputs", "source_rank")

    def __init__(self, encoded: proto.EncodedArgs, outputs: Any) -> None:
        super().__init__()
        self.encoded = encoded
        self.outputs = outputs  # what the future yields
        self.source_rank: int | None = None  # recv_anysource: the member that sent
        self.future: Future[Any] | None = None

    def finish(self, error: Exception | None, reply: Any = None) -> None:
        with _COMPLETION:
            if self.done:
                return
            self.error = error
            self.done = True
            future = self.future
        self._released.release()
        if future is not None:
            self._complete(future)

    def get_future(self) -> Future[Any]:
        with _COMPLETION:
            future = self.future
            if future is not None:
                return future
            future = self.future = Future()
            done = self.done
        if done:
            self._complete(future)
        return future

    def _complete(self, future: Future[Any]) -> None:
        if self.error is None:
            future.set_result(self.outputs)
        else:
            future.set_exception(self.error)

"""``LocalManagerClient``: group rank 0 talking to the manager server in its own process.

Rank 0 hosts its replica group's manager server, so it needs no gRPC channel
to it: a quorum or a commit vote joins the server's round with one callback
on the server's loop and comes back as a future, checkpoint metadata is a
read, and failure notices are handed over in-process. Same validation and
same exception types as ``ManagerClient`` over gRPC, minus a loopback round
trip, gRPC's encoding and a channel per process (~1 ms per call and ~8 ms at
start-up on a busy 2-core machine). Only ``kill`` opens a channel.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from lighthouse import validate
from lighthouse.client import ManagerClient, _seconds
from lighthouse.errors import QuorumTimeoutError
from lighthouse.types import FailureNotice, QuorumResult

__all__ = ["LocalFailureSubscription", "LocalManagerClient"]

log = logging.getLogger("lighthouse.client")
T = TypeVar("T")

# How much longer than the call's own timeout a caller waits for the server's
# timer to fail the future: only a stopped server loop ever uses it (seconds).
_LOOP_MARGIN_S = 5.0


class LocalFailureSubscription:
    """Failure notices of an in-process manager server, delivered on a thread of
    their own (the server's loop must never run the caller's abort logic)."""

    def __init__(self, server: Any, callback: Callable[[FailureNotice], None]) -> None:
        self._server = server
        self._callback = callback
        self._queue: queue.SimpleQueue[FailureNotice | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="failure-notices", daemon=True)
        self._thread.start()
        server.add_local_watcher(self._queue.put)

    def _run(self) -> None:
        while (notice := self._queue.get()) is not None:
            try:
                self._callback(notice)
            except Exception:
                log.exception("failure-notice callback raised")

    def wait_ready(self, timeout: timedelta) -> bool:
        """Always True: in-process, the subscription is live from the start."""
        _seconds("timeout", timeout)
        return True

    def cancel(self) -> None:
        """Stop receiving notices (waits at most 5 s for the delivery thread)."""
        self._server.remove_local_watcher(self._queue.put)
        self._queue.put(None)
        self._thread.join(timeout=5.0)


class LocalManagerClient:
    """The methods of `ManagerClient`, served by `server` (a `ManagerServer`) in-process.

    `addr` is the server's address, used in messages and by `kill`, the one
    call that still goes over gRPC.
    """

    def __init__(
        self, server: Any, addr: str, connect_timeout: timedelta = timedelta(seconds=10)
    ) -> None:
        self._server = server
        self._addr = addr
        self._connect_timeout = connect_timeout
        self._remote: ManagerClient | None = None
        self._local_addr = f"local manager server {addr}"

    def _wait(self, fut: concurrent.futures.Future[T], timeout_s: float, what: str) -> T:
        try:
            return fut.result(timeout=timeout_s + _LOOP_MARGIN_S)
        except concurrent.futures.TimeoutError:
            raise QuorumTimeoutError(
                f"{what} to {self._local_addr}: no answer within {timeout_s:.3f} s"
            ) from None

    def quorum_async(
        self,
        group_rank: int,
        step: int,
        checkpoint_metadata: str,
        shrink_only: bool,
        timeout: timedelta,
        init_sync: bool = True,
        commit_failures: int = 0,
        step_time_ms: float = 0.0,
    ) -> concurrent.futures.Future[QuorumResult]:
        """`quorum` without blocking: the future gets the result or the error."""
        validate.check_step("group_rank", group_rank)
        validate.check_step("step", step)
        validate.check_step("commit_failures", commit_failures)
        req = {
            "group_rank": group_rank,
            "step": step,
            "checkpoint_metadata": checkpoint_metadata,
            "shrink_only": shrink_only,
            "init_sync": init_sync,
            "commit_failures": commit_failures,
            "step_time_ms": step_time_ms,
        }
        return self._server.quorum_local(req, _seconds("timeout", timeout))  # type: ignore[no-any-return]

    def quorum(
        self,
        group_rank: int,
        step: int,
        checkpoint_metadata: str,
        shrink_only: bool,
        timeout: timedelta,
        init_sync: bool = True,
        commit_failures: int = 0,
        step_time_ms: float = 0.0,
    ) -> QuorumResult:
        """Join this step's quorum (see `ManagerClient.quorum`)."""
        fut = self.quorum_async(
            group_rank,
            step,
            checkpoint_metadata,
            shrink_only,
            timeout,
            init_sync,
            commit_failures,
            step_time_ms,
        )
        return self._wait(fut, _seconds("timeout", timeout), f"quorum of group rank {group_rank}")

    def should_commit(
        self, group_rank: int, step: int, should_commit: bool, timeout: timedelta
    ) -> bool:
        """Vote for `step`; True only if every local rank voted yes."""
        validate.check_step("group_rank", group_rank)
        validate.check_step("step", step)
        timeout_s = _seconds("timeout", timeout)
        fut = self._server.should_commit_local(group_rank, step, should_commit, timeout_s)
        return self._wait(fut, timeout_s, f"commit vote of group rank {group_rank} for step {step}")

    def checkpoint_metadata(self, rank: int, timeout: timedelta) -> str:
        """The checkpoint metadata group rank `rank` sent with its last quorum."""
        validate.check_step("rank", rank)
        _seconds("timeout", timeout)
        return self._server.checkpoint_metadata_local(rank)  # type: ignore[no-any-return]

    def subscribe_failures(
        self,
        callback: Callable[[FailureNotice], None],
        group_rank: int = 0,
        on_error: Callable[[Exception], None] | None = None,
    ) -> LocalFailureSubscription:
        """Call `callback(notice)` (on a background thread) for every failure notice.
        In-process the subscription cannot break, so `on_error` is never called."""
        validate.check_group_rank(group_rank, self._server.world_size)
        return LocalFailureSubscription(self._server, callback)

    def kill(self, msg: str, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Make the process hosting the manager server (this one) exit with status 1."""
        if self._remote is None:
            self._remote = ManagerClient(self._addr, self._connect_timeout)
        self._remote.kill(msg, timeout)

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()

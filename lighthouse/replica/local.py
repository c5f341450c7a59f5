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

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from lighthouse import validate
from lighthouse.errors import QuorumRejectedError, QuorumTimeoutError
from lighthouse.replica.client import ManagerClient
from lighthouse.replica.server import ManagerServer
from lighthouse.types import FailureNotice, ManagerQuorumRequest, QuorumResult

__all__ = ["LocalFailureSubscription", "LocalManagerClient"]

log = logging.getLogger("lighthouse.client")
T = TypeVar("T")

# How much longer than the call's own timeout a caller waits for the server's
# timer to fail the future: only a stopped server loop ever uses it (seconds).
_LOOP_MARGIN_S = 5.0


class LocalFailureSubscription:
    """Failure notices of an in-process manager server, delivered on a thread of
    their own (the server's loop must never run the caller's abort logic)."""

    def __init__(self, server: ManagerServer, callback: Callable[[FailureNotice], None]) -> None:
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
        validate.timeout_seconds("timeout", timeout)
        return True

    def cancel(self) -> None:
        """Stop receiving notices (waits at most 5 s for the delivery thread)."""
        self._server.remove_local_watcher(self._queue.put)
        self._queue.put(None)
        self._thread.join(timeout=5.0)


class LocalManagerClient:
    """The methods of `ManagerClient`, served by `server` in-process; implements
    ``ManagerClientProtocol``.

    `addr` is the server's address, used in messages and by `kill`, the one
    call that still goes over gRPC (retried for up to `connect_timeout`).
    """

    def __init__(
        self, server: ManagerServer, addr: str, connect_timeout: timedelta = timedelta(seconds=10)
    ) -> None:
        self._server = server
        self._rounds = server.rounds
        self._loop = server.loop
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

    # -- quorum ----------------------------------------------------------------------------
    def quorum_async(
        self, request: ManagerQuorumRequest
    ) -> concurrent.futures.Future[QuorumResult]:
        """`quorum` without blocking: the future gets the result or the error, set on
        the server's loop. No gRPC, no encoding and no extra thread: the round is
        joined by one callback on that loop. The future fails with
        ``QuorumTimeoutError`` after ``request.timeout``."""
        validate.check_manager_quorum_request(request)
        out: concurrent.futures.Future[QuorumResult] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._join, request, out)
        return out

    def quorum(self, request: ManagerQuorumRequest) -> QuorumResult:
        """Join this step's quorum (see `ManagerClient.quorum`)."""
        fut = self.quorum_async(request)
        what = f"quorum of group rank {request.group_rank}"
        return self._wait(fut, request.timeout.total_seconds(), what)

    def _join(
        self, req: ManagerQuorumRequest, out: concurrent.futures.Future[QuorumResult]
    ) -> None:
        """On the server's loop: enter ``req`` into the round, as the ``Quorum`` RPC does."""
        rounds = self._rounds
        try:
            rank = rounds.check_bounds(req)  # quorum_async validated the rest
        except ValueError as exc:
            out.set_exception(QuorumRejectedError(f"Quorum: {exc}"))
            return
        g, fut = rounds.enter_gather(rank, req)
        _complete(
            self._loop,
            fut,
            out,
            req.timeout.total_seconds(),
            f"quorum of group rank {rank} on replica {rounds.replica_id!r}",
            lambda: rounds.leave_gather(g, rank, req),
            lambda answer: rounds.result_for(answer, rank, req.init_sync),
        )

    # -- commit vote, metadata ---------------------------------------------------------------
    def should_commit(
        self, group_rank: int, step: int, should_commit: bool, timeout: timedelta
    ) -> bool:
        """Vote for `step`; True only if every local rank voted yes."""
        validate.check_step("group_rank", group_rank)
        validate.check_step("step", step)
        timeout_s = validate.timeout_seconds("timeout", timeout)
        out: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._vote, group_rank, step, should_commit, timeout_s, out)
        return self._wait(out, timeout_s, f"commit vote of group rank {group_rank} for step {step}")

    def _vote(
        self,
        rank: int,
        step: int,
        vote: bool,
        timeout_s: float,
        out: concurrent.futures.Future[bool],
    ) -> None:
        """On the server's loop: cast the vote, as the ``ShouldCommit`` RPC does; ``out``
        fails with ``QuorumTimeoutError`` after ``timeout_s`` seconds."""
        rounds = self._rounds
        try:
            v, fut = rounds.enter_vote(rank, step, vote)
        except ValueError as exc:
            out.set_exception(QuorumRejectedError(f"ShouldCommit: {exc}"))
            return
        what = f"commit vote of group rank {rank} for step {step}"
        # At the deadline the vote is closed for every rank (GroupRounds.expire_vote),
        # on this loop, before the caller's own wait (timeout_s + _LOOP_MARGIN_S) ends.
        _complete(
            self._loop,
            fut,
            out,
            timeout_s,
            what,
            lambda: rounds.leave_vote(v, rank),
            bool,
            expire=lambda: rounds.expire_vote(v, rank),
        )

    def checkpoint_metadata(self, rank: int, timeout: timedelta) -> str:
        """The checkpoint metadata group rank `rank` sent with its last quorum."""
        validate.check_step("rank", rank)
        validate.timeout_seconds("timeout", timeout)
        return self._rounds.checkpoint_metadata(rank)

    # -- failure notices, kill, close ---------------------------------------------------------
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
            self._remote = ManagerClient(
                self._addr, self._connect_timeout, job_secret=self._server.job_secret
            )
        self._remote.kill(msg, timeout)

    def close(self) -> None:
        """Close the channel `kill` opened, if any. The server is its owner's to stop."""
        if self._remote is not None:
            self._remote.close()


def _complete(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    out: concurrent.futures.Future[Any],
    timeout_s: float,
    what: str,
    give_up: Callable[[], None],
    convert: Callable[[Any], Any],
    expire: Callable[[], Any] | None = None,
) -> None:
    """On ``loop``: copy ``fut``'s outcome (through ``convert``) into ``out``. After
    ``timeout_s`` seconds: with ``expire``, ``out`` gets what it returns (or raises);
    without, ``give_up()`` runs and ``out`` fails with ``QuorumTimeoutError``."""

    def on_deadline() -> None:
        if fut.done() or out.done():
            return
        if expire is None:
            give_up()
            out.set_exception(QuorumTimeoutError(f"{what}: no answer within {timeout_s:.3f} s"))
            return
        try:
            out.set_result(convert(expire()))
        except Exception as e:
            out.set_exception(e)

    timer = loop.call_later(timeout_s, on_deadline)

    def finish(f: asyncio.Future[Any]) -> None:
        timer.cancel()
        exc = f.exception()  # retrieved even when nobody waits any more
        if out.done():
            return
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(convert(f.result()))
        except Exception as e:
            out.set_exception(e)

    fut.add_done_callback(finish)

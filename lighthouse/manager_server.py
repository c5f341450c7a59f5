"""``ManagerServer``: one per replica group, hosted by group rank 0.

- ``Quorum``: waits for all ``world_size`` local ranks, checks they report the
  same step, makes ONE lighthouse call and answers each rank with its own
  ``QuorumResult``; if the lighthouse call fails every waiting rank hears it at once.
- ``ShouldCommit``: AND of the local ranks' votes for one step; stale votes are refused.
- ``CheckpointMetadata``, ``Kill``, and ``WatchFailures`` (notices relayed from the lighthouse).
- A liveness stream to the lighthouse, pinged every ``heartbeat_interval`` and
  reopened (50 ms .. 1 s backoff) after a lighthouse restart.
- Quorum leases (``lighthouse.lease``): while the lighthouse's lease holds, a
  round whose step follows the last committed one is answered here from the
  leased quorum, without a lighthouse call. Any doubt voids the lease: a
  recall, a failure notice, a broken liveness stream, a step that did not
  advance, shrink_only or commit failures. A recall that strands a leased step
  (a member it needs waits at the lighthouse) fails that step on every rank.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc

from lighthouse import validate, wire
from lighthouse._loop import background_loop, run_sync
from lighthouse.client import normalize_address
from lighthouse.errors import (
    FaultToleranceError,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from lighthouse.lease_holder import LeasedRound, LeaseHolder, leased_result
from lighthouse.link import LighthouseLink
from lighthouse.ranks import compute_quorum_result
from lighthouse.server import advertised_host, grpc_server_options, join_host_port, split_host_port
from lighthouse.types import FailureNotice, LeaseRecall, Quorum, QuorumMember, QuorumResult

log = logging.getLogger("lighthouse.manager")


def _exit_process(msg: str) -> None:
    log.error("killed: %s; exiting with status 1", msg)
    os._exit(1)


@dataclass
class _Gather:
    """One quorum round being gathered from the local ranks."""

    requests: dict[int, dict[str, Any]] = field(default_factory=dict)
    deadlines: dict[int, float] = field(default_factory=dict)  # loop time, seconds
    future: asyncio.Future[Quorum | LeasedRound] | None = None
    launched: bool = False
    task: asyncio.Task[None] | None = None  # the lighthouse call, kept referenced


@dataclass
class _Vote:
    step: int
    votes: dict[int, bool] = field(default_factory=dict)
    future: asyncio.Future[bool] | None = None


class ManagerServer:
    """The per-replica-group server (see module docstring).

    Args:
        replica_id: this replica group's id (unique per incarnation).
        lighthouse_addr: the lighthouse, ``host:port``.
        hostname: host to advertise to peers; default: the bind host, or the
            machine's name for a wildcard bind (pass the right NIC's address).
        bind: listen address ``host:port`` (port 0 picks one).
        store_addr: this group's rendezvous store ``host:port``.
        world_size: ranks in the replica group (>= 1).
        heartbeat_interval: period of liveness pings to the lighthouse.
        connect_timeout: how long to wait for the lighthouse at start-up and
            to retry it when unreachable during a quorum.
        quorum_retries: extra attempts of a failed lighthouse quorum call
            (other than "unreachable", which is retried for ``connect_timeout``).
        on_kill: called with the message on ``Kill``; default exits the process.
    """

    def __init__(
        self,
        replica_id: str,
        lighthouse_addr: str,
        hostname: str | None = None,
        bind: str = "[::]:0",
        store_addr: str = "",
        world_size: int = 1,
        heartbeat_interval: timedelta = timedelta(milliseconds=100),
        connect_timeout: timedelta = timedelta(seconds=10),
        quorum_retries: int = 0,
        on_kill: Callable[[str], None] | None = None,
    ) -> None:
        validate.check_replica_id(replica_id)
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if quorum_retries < 0:
            raise ValueError(f"quorum_retries must be >= 0, got {quorum_retries}")
        self.replica_id = replica_id
        self.world_size = world_size
        self.store_addr = store_addr
        self._hb_s = heartbeat_interval.total_seconds()
        self._connect_s = connect_timeout.total_seconds()
        if self._hb_s <= 0 or self._connect_s <= 0:
            raise ValueError(
                f"heartbeat_interval and connect_timeout must be positive, got "
                f"{heartbeat_interval} and {connect_timeout}"
            )
        self._on_kill = on_kill or _exit_process
        bind_host, _ = split_host_port(bind, "bind")
        self._host = advertised_host(bind_host, hostname)
        self._gather = _Gather()
        self._vote: _Vote | None = None
        self._last_quorum_step = -1
        self._lease = LeaseHolder()
        self._resolved_step = -1  # the latest step whose commit vote is decided
        self._metadata: dict[int, str] = {}
        self._subscribers: set[asyncio.Queue[bytes]] = set()
        # in-process subscribers; replaced, never mutated, so any thread may add
        self._local_watchers: frozenset[Callable[[FailureNotice], None]] = frozenset()
        self._link = LighthouseLink(
            replica_id,
            normalize_address(lighthouse_addr),
            self._hb_s,
            self._connect_s,
            quorum_retries,
            self._on_event,
        )
        self._stopped = False
        self._loop = background_loop()
        self._port = run_sync(self._start(bind), timeout_s=self._connect_s + 30)

    # -- lifecycle -----------------------------------------------------------------------
    async def _start(self, bind: str) -> int:
        """Bind and start serving while the lighthouse link connects (both at once:
        a restarted replica waits for neither twice)."""
        server = grpc.aio.server(options=grpc_server_options(5000))
        handlers = {
            "Quorum": grpc.unary_unary_rpc_method_handler(self._quorum),
            "CheckpointMetadata": grpc.unary_unary_rpc_method_handler(self._checkpoint_metadata),
            "ShouldCommit": grpc.unary_unary_rpc_method_handler(self._should_commit),
            "Kill": grpc.unary_unary_rpc_method_handler(self._kill),
            "WatchFailures": grpc.unary_stream_rpc_method_handler(self._watch_failures),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(wire.MANAGER_SERVICE, handlers),)
        )
        port = server.add_insecure_port(bind)
        if port == 0:
            raise OSError(f"could not bind the manager server to {bind!r}")
        self._server = server
        results = await asyncio.gather(self._link.connect(), server.start(), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await server.stop(grace=None)
            if results[0] is None:  # connected: close the link we will not use
                await self._link.close(leave=True)
            raise errors[0]
        return port

    def address(self) -> str:
        """``host:port`` of this manager server, as advertised to peers."""
        return join_host_port(self._host, self._port)

    def wait_liveness(self, timeout: timedelta, epoch: str | None = None) -> bool:
        """Wait until the liveness stream is open (to lighthouse ``epoch`` if given).

        False if ``timeout`` passed first.
        """
        return self._link.wait_liveness(timeout, epoch)

    @property
    def lighthouse_epoch(self) -> str:
        """Epoch of the lighthouse our liveness stream is open to ("" before the first)."""
        return self._link.lighthouse_epoch

    async def _stop(self, leave: bool) -> None:
        for q in self._subscribers:
            q.put_nowait(b"")
        await self._server.stop(grace=0.2)
        await self._link.close(leave=leave)

    def shutdown(self, leave: bool = True) -> None:
        """Stop serving and close the liveness stream. Idempotent.

        ``leave``: tell the lighthouse this is a clean shutdown, so our peers get
        no failure notice; False closes the stream as a crash would.
        """
        if self._stopped:
            return
        self._stopped = True
        run_sync(self._stop(leave), timeout_s=10)

    def __enter__(self) -> ManagerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- quorum lease ------------------------------------------------------------------------
    @property
    def lease_id(self) -> int:
        """The id of the quorum lease this replica holds (0: none)."""
        return self._lease.lease_id

    @property
    def leased_rounds(self) -> int:
        """Rounds answered from a lease so far."""
        return self._lease.rounds

    def wait_lease(self, held: bool, timeout: timedelta) -> bool:
        """Wait until a lease is (``held``) or is not held; False after ``timeout``. Any thread."""
        return self._lease.wait(held, timeout)

    # -- failure notices and lease recalls ---------------------------------------------------
    def _on_event(self, event: FailureNotice | LeaseRecall) -> None:
        """An event from the lighthouse's liveness stream (on the loop)."""
        if isinstance(event, LeaseRecall):
            self._on_recall(event)
            return
        self._lease.drop()  # a member died: the next round asks the lighthouse
        log.warning(
            "%s: lighthouse reports %s of quorum %s/%d dead (%s)",
            self.replica_id,
            list(event.dead_replica_ids),
            event.epoch,
            event.quorum_id,
            event.reason,
        )
        self._relay(event)

    def _on_recall(self, recall: LeaseRecall) -> None:
        """Void the recalled lease; fail the leased step in progress if it is stranded."""
        stranded = self._lease.on_recall(recall, self._resolved_step)
        if stranded is not None:
            log.warning("%s: failing step %s: %s", self.replica_id, stranded.step, stranded.reason)
            self._relay(stranded)

    def _relay(self, notice: FailureNotice) -> None:
        """Hand ``notice`` to every local rank (in-process watchers and WatchFailures streams)."""
        for watch in self._local_watchers:
            watch(notice)
        payload = wire.encode_failure_notice(notice)
        for q in self._subscribers:
            q.put_nowait(payload)

    def add_local_watcher(self, watch: Callable[[FailureNotice], None]) -> None:
        """Call ``watch(notice)`` on the server's loop for every failure notice.
        It must not block (hand the notice to another thread). Any thread."""
        self._local_watchers = self._local_watchers | {watch}

    def remove_local_watcher(self, watch: Callable[[FailureNotice], None]) -> None:
        self._local_watchers = self._local_watchers - {watch}

    async def _watch_failures(self, request: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            validate.check_group_rank(wire.decode_watch_failures_request(request), self.world_size)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"WatchFailures: {exc}")
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            await context.write(
                wire.encode_failure_notice(FailureNotice(self.lighthouse_epoch, 0, ()))
            )
            while True:
                payload = await queue.get()
                if not payload:
                    return
                await context.write(payload)
        finally:
            self._subscribers.discard(queue)

    # -- quorum --------------------------------------------------------------------------
    def _check_quorum_request(self, req: dict[str, Any]) -> int:
        """Validate one rank's quorum request; return its group rank (ValueError if bad)."""
        rank = validate.check_group_rank(int(req["group_rank"]), self.world_size)
        validate.check_step("step", int(req["step"]))
        validate.check_step("commit_failures", int(req["commit_failures"]))
        if len(str(req["checkpoint_metadata"])) > validate.MAX_METADATA_BYTES:
            raise ValueError(
                f"checkpoint_metadata must be at most {validate.MAX_METADATA_BYTES} bytes"
            )
        return rank

    def _enter_gather(
        self, rank: int, req: dict[str, Any], timeout_s: float
    ) -> tuple[_Gather, asyncio.Future[Quorum | LeasedRound]]:
        """Add ``rank``'s request to this round; the last rank to arrive launches the
        single lighthouse call. Returns the round and the future of its quorum."""
        loop = asyncio.get_running_loop()
        self._metadata[rank] = str(req["checkpoint_metadata"])
        g = self._gather
        if g.future is None:
            g.future = loop.create_future()
        g.requests[rank] = req
        g.deadlines[rank] = loop.time() + timeout_s
        fut = g.future
        if len(g.requests) == self.world_size:
            self._gather = _Gather()
            g.launched = True
            steps = {r: q["step"] for r, q in sorted(g.requests.items())}
            if len(set(steps.values())) > 1:
                fut.set_exception(
                    QuorumRejectedError(
                        f"local ranks of replica {self.replica_id!r} reported different steps "
                        f"(group rank: step) {steps}; all ranks of a replica group must agree"
                    )
                )
            else:
                self._start_round(g, fut)
        return g, fut

    def _start_round(self, g: _Gather, fut: asyncio.Future[Quorum | LeasedRound]) -> None:
        """Answer the gathered round from the lease if it still holds, else ask the lighthouse."""
        reqs = list(g.requests.values())
        step = int(reqs[0]["step"])
        self._last_quorum_step = step
        self._link.progress = (step, max(float(r["step_time_ms"]) for r in reqs))
        eligible = not any(r["shrink_only"] or int(r["commit_failures"]) for r in reqs)
        leased = self._lease.answer(step, eligible, self._link.open_generation)
        if leased is not None:
            fut.set_result(leased)
            return
        g.task = asyncio.get_running_loop().create_task(self._lighthouse_quorum(g, fut, step))

    def _result_for(self, answer: Quorum | LeasedRound, rank: int, init_sync: bool) -> QuorumResult:
        """Group rank ``rank``'s result from a lighthouse quorum or a leased round."""
        if isinstance(answer, Quorum):
            return compute_quorum_result(answer, self.replica_id, rank, init_sync)
        return leased_result(answer, self.replica_id, rank, init_sync)

    @staticmethod
    def _leave_gather(g: _Gather, rank: int, req: dict[str, Any]) -> None:
        """``rank`` gave up (deadline, cancelled) before its round was launched."""
        if not g.launched and g.requests.get(rank) is req:
            del g.requests[rank]
            g.deadlines.pop(rank, None)

    async def _quorum(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            req = wire.decode_manager_quorum_request(request)
            rank = self._check_quorum_request(req)
            remaining = context.time_remaining()
            if remaining is None:
                raise ValueError("ManagerService.Quorum needs a deadline (grpc timeout), got none")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Quorum: {exc}")
        g, fut = self._enter_gather(rank, req, remaining)
        try:
            quorum = await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._leave_gather(g, rank, req)
            raise
        except QuorumRejectedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"Quorum: {exc}")
        except FaultToleranceError as exc:
            await context.abort(grpc.StatusCode.ABORTED, f"{type(exc).__name__}: {exc}")
        result = self._result_for(quorum, rank, bool(req["init_sync"]))
        return wire.encode_quorum_result(result)

    def quorum_local(
        self, req: dict[str, Any], timeout_s: float
    ) -> concurrent.futures.Future[QuorumResult]:
        """The ``Quorum`` RPC for a rank in this process, callable from any thread.

        ``req`` has the fields of a ``ManagerQuorumRequest``. No gRPC, no encoding
        and no extra thread: the round is joined by one callback on the server's
        loop and the result is set from there. Errors are the RPC's exception
        types; the future fails with ``QuorumTimeoutError`` after ``timeout_s`` seconds.
        """
        out: concurrent.futures.Future[QuorumResult] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._join_local, req, timeout_s, out)
        return out

    def _join_local(
        self, req: dict[str, Any], timeout_s: float, out: concurrent.futures.Future[QuorumResult]
    ) -> None:
        try:
            rank = self._check_quorum_request(req)
        except ValueError as exc:
            out.set_exception(QuorumRejectedError(f"Quorum: {exc}"))
            return
        g, fut = self._enter_gather(rank, req, timeout_s)
        init_sync = bool(req["init_sync"])
        self._complete_local(
            fut,
            out,
            timeout_s,
            f"quorum of group rank {rank} on replica {self.replica_id!r}",
            lambda: self._leave_gather(g, rank, req),
            lambda answer: self._result_for(answer, rank, init_sync),
        )

    def _complete_local(
        self,
        fut: asyncio.Future[Any],
        out: concurrent.futures.Future[Any],
        timeout_s: float,
        what: str,
        give_up: Callable[[], None],
        convert: Callable[[Any], Any],
    ) -> None:
        """Copy ``fut``'s outcome (through ``convert``) into ``out``, or fail ``out``
        with ``QuorumTimeoutError`` after ``timeout_s`` seconds, calling ``give_up``."""

        def expire() -> None:
            if not fut.done() and not out.done():
                give_up()
                out.set_exception(QuorumTimeoutError(f"{what}: no answer within {timeout_s:.3f} s"))

        timer = self._loop.call_later(timeout_s, expire)

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

    async def _lighthouse_quorum(
        self, g: _Gather, fut: asyncio.Future[Quorum | LeasedRound], step: int
    ) -> None:
        reqs = list(g.requests.values())
        member = QuorumMember(
            replica_id=self.replica_id,
            address=self.address(),
            store_address=self.store_addr,
            step=step,
            world_size=self.world_size,
            shrink_only=any(bool(r["shrink_only"]) for r in reqs),
            commit_failures=max(int(r["commit_failures"]) for r in reqs),  # type: ignore[call-overload]
            step_time_ms=max(float(r["step_time_ms"]) for r in reqs),  # type: ignore[arg-type]
            checkpoint_metadata=tuple(
                str(g.requests[r]["checkpoint_metadata"]) for r in range(self.world_size)
            ),
        )
        asked_generation = self._link.open_generation
        try:
            quorum, lease_id = await self._link.quorum(member, min(g.deadlines.values()))
        except FaultToleranceError as exc:
            fut.set_exception(exc)
            return
        self._lease.take(
            quorum,
            lease_id,
            asked_generation,
            self._link.open_generation,
            self._link.lighthouse_epoch,
        )
        fut.set_result(quorum)

    # -- commit vote, metadata, kill -------------------------------------------------------
    def _enter_vote(self, rank: int, step: int, vote: bool) -> tuple[_Vote, asyncio.Future[bool]]:
        """Record ``rank``'s vote for ``step``; the last rank's vote decides.

        ValueError for a bad rank or a stale vote; a vote for a later step
        abandons the open one (its waiters get ``QuorumRejectedError``).
        """
        validate.check_group_rank(rank, self.world_size)
        validate.check_step("step", step)
        if step < self._last_quorum_step:
            raise ValueError(
                f"stale vote: group rank {rank} voted for step {step} but replica "
                f"{self.replica_id!r} last joined a quorum at step {self._last_quorum_step}"
            )
        v = self._vote
        if v is not None and step < v.step:
            raise ValueError(
                f"stale vote: group rank {rank} voted for step {step} while the open vote is "
                f"for step {v.step}"
            )
        if v is not None and step > v.step:
            assert v.future is not None
            v.future.set_exception(
                QuorumRejectedError(
                    f"the vote for step {v.step} was abandoned: group rank {rank} moved on to step "
                    f"{step} before ranks {sorted(set(range(self.world_size)) - set(v.votes))} voted"
                )
            )
            v = None
        if v is None:
            v = self._vote = _Vote(step, future=asyncio.get_running_loop().create_future())
        assert v.future is not None
        v.votes[rank] = vote
        fut = v.future
        if len(v.votes) == self.world_size:
            self._vote = None
            self._resolved_step = max(self._resolved_step, step)
            no = sorted(r for r, ok in v.votes.items() if not ok)
            if no:
                log.info(
                    "%s: step %d not committed; group ranks %s voted no", self.replica_id, step, no
                )
            fut.set_result(not no)
        return v, fut

    def _leave_vote(self, v: _Vote, rank: int) -> None:
        if self._vote is v:
            v.votes.pop(rank, None)

    async def _should_commit(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            rank, step, vote = wire.decode_should_commit_request(request)
            v, fut = self._enter_vote(rank, step, vote)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"ShouldCommit: {exc}")
        try:
            decision = await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._leave_vote(v, rank)
            raise
        except QuorumRejectedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"ShouldCommit: {exc}")
        return wire.encode_should_commit_response(decision)

    def should_commit_local(
        self, rank: int, step: int, vote: bool, timeout_s: float
    ) -> concurrent.futures.Future[bool]:
        """The ``ShouldCommit`` RPC for a rank in this process, callable from any
        thread (see ``quorum_local``); fails with ``QuorumTimeoutError`` after
        ``timeout_s`` seconds."""
        out: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._vote_local, rank, step, vote, timeout_s, out)
        return out

    def _vote_local(
        self,
        rank: int,
        step: int,
        vote: bool,
        timeout_s: float,
        out: concurrent.futures.Future[bool],
    ) -> None:
        try:
            v, fut = self._enter_vote(rank, step, vote)
        except ValueError as exc:
            out.set_exception(QuorumRejectedError(f"ShouldCommit: {exc}"))
            return
        what = f"commit vote of group rank {rank} for step {step}"
        self._complete_local(fut, out, timeout_s, what, lambda: self._leave_vote(v, rank), bool)

    def checkpoint_metadata_local(self, rank: int) -> str:
        """What group rank ``rank`` sent with its last quorum; any thread.
        ``QuorumRejectedError`` if it sent none."""
        try:
            return self._metadata[rank]
        except KeyError:
            raise QuorumRejectedError(
                f"CheckpointMetadata: no metadata for group rank {rank} on replica "
                f"{self.replica_id!r} (ranks with metadata: {sorted(self._metadata)})"
            ) from None

    async def _checkpoint_metadata(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        try:
            rank = wire.decode_checkpoint_metadata_request(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"CheckpointMetadata: {exc}")
        try:
            metadata = self.checkpoint_metadata_local(rank)
        except QuorumRejectedError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        return wire.encode_checkpoint_metadata_response(metadata)

    async def _kill(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            msg = wire.decode_kill_request(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Kill: {exc}")
        log.warning("%s: Kill received: %s", self.replica_id, msg)
        asyncio.get_running_loop().call_later(0.05, self._on_kill, msg)
        return wire.encode_kill_response()

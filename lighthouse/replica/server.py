"""``ManagerServer``: one per replica group, hosted by group rank 0.

- ``Quorum``: waits for all ``world_size`` local ranks, checks they report the
  same step, makes ONE lighthouse call and answers each rank with its own
  ``QuorumResult``; if the lighthouse call fails every waiting rank hears it at once.
- ``ShouldCommit``: AND of the local ranks' votes for one step; stale votes are refused.
- ``CheckpointMetadata``, ``Kill``, and ``WatchFailures`` (notices relayed from the lighthouse).
- A liveness stream to the lighthouse, pinged every ``heartbeat_interval`` and
  reopened (50 ms .. 1 s backoff) after a lighthouse restart.
- Quorum leases (``lighthouse.coordinator.lease``): while the lighthouse's lease holds, a
  round whose step follows the last committed one is answered here from the
  leased quorum, without a lighthouse call. Any doubt voids the lease: a
  recall, a failure notice, a broken liveness stream, a step that did not
  advance, shrink_only or commit failures. A recall that strands a leased step
  (a member it needs waits at the lighthouse) fails that step on every rank.

The rounds and votes themselves live in ``lighthouse.replica.group_rounds``; this
module is their gRPC service and the server's lifecycle. Group rank 0 reaches
the same rounds in-process through ``lighthouse.replica.local``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lighthouse import auth, exposure, services, validate, wire
from lighthouse._conn_guard import ConnectionGuard
from lighthouse._grpc import grpc
from lighthouse._loop import background_loop, run_sync
from lighthouse._net import (
    advertised_host,
    bind_server,
    join_host_port,
    normalize_addresses,
    split_host_port,
)
from lighthouse.connection_policy import (
    DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
    DEFAULT_UNAUTHENTICATED_TIMEOUT_S,
    ConnectionLimits,
)
from lighthouse.errors import FaultToleranceError, QuorumRejectedError
from lighthouse.fd_limit import raise_nofile_limit, resolve_max_connections
from lighthouse.replica.group_rounds import GroupRounds, vote_margin_s
from lighthouse.replica.lease_holder import LeaseHolder
from lighthouse.replica.link import LighthouseLink
from lighthouse.tls import TlsConfig, resolve_tls
from lighthouse.types import FailureNotice, LeaseFloor, LeaseRecall, QuorumWait

__all__ = ["FD_RESERVE", "MIN_CONNECTIONS", "ManagerServer", "default_max_connections"]

log = logging.getLogger("lighthouse.manager")

#: File descriptors a manager server keeps free beside its connections: it lives in
#: a trainer's process, whose store, process groups, heal server and data loaders
#: need their own.
FD_RESERVE = 256
#: The fewest connections a manager server starts with.
MIN_CONNECTIONS = 8


def default_max_connections(world_size: int) -> int:
    """A manager server's default connection cap: four per rank of its group, at
    least 64 (each rank holds one channel; half the cap stays free for them
    whatever strangers hold, the rest covers reconnects and peers' probes)."""
    return max(64, 4 * world_size)


def _exit_process(msg: str) -> None:
    log.error("killed: %s; exiting with status 1", msg)
    os._exit(1)


class ManagerServer:
    """The per-replica-group server (see module docstring).

    Args:
        replica_id: this replica group's id (unique per incarnation).
        lighthouse_addr: the lighthouse, ``host:port``; or several separated by
            commas (an active lighthouse and its standbys), tried in turn while the
            one in use is unreachable.
        hostname: host to advertise to peers; default: the bind host, or the
            machine's name for a wildcard bind (pass the right NIC's address).
        bind: listen address ``host:port`` (port 0 picks one). None: ``[::]:0``
            (every interface) with a job secret, else ``127.0.0.1:0``; beyond
            loopback without a job secret: ``ValueError`` unless ``insecure``
            (``lighthouse.exposure``). A loopback bind advertises only a
            loopback ``hostname``.
        store_addr: this group's rendezvous store ``host:port``.
        world_size: ranks in the replica group (>= 1).
        heartbeat_interval: period of liveness pings to the lighthouse (None: a
            tenth of the lighthouse's heartbeat timeout, at least 100 ms; see
            ``lighthouse.replica.link.default_heartbeat_s``).
        connect_timeout: how long to wait for the lighthouse at start-up and
            to retry it when unreachable during a quorum.
        quorum_retries: extra attempts of a failed lighthouse quorum call
            (other than "unreachable", which is retried for ``connect_timeout``).
        on_kill: called with the message on ``Kill``; default exits the process.
        allow_kill: whether ``Kill`` is served at all (default no: it is
            refused with PERMISSION_DENIED); giving ``on_kill`` allows it.
        job_secret: the job's secret (default: from the environment, see
            ``lighthouse.auth``): calls without it are refused with
            UNAUTHENTICATED, and the link to the lighthouse presents it.
        job_id: the job this replica belongs to (default: ``$TORCHFT_JOB_ID``),
            sent to the lighthouse, which refuses another job's replicas.
        tls: the job's TLS files (default: from the environment, see
            ``lighthouse.tls``; none set: plaintext): this server serves TLS
            with its certificate, and the link verifies the lighthouse's
            certificate against its CA.
        max_connections: gRPC connections held at once, from all peers; one
            past it is closed on arrival. None: ``default_max_connections``
            (4 per rank, at least 64), or as many as the open-file limit
            carries if fewer (a warning says so). The soft ``RLIMIT_NOFILE`` is
            first raised to the hard limit; the cap plus ``FD_RESERVE`` (256)
            must fit in it, and the cap must be at least twice ``world_size``
            (the half kept for the group holds every rank) and 8, else
            ``ValueError`` naming the figures.
        max_unauthenticated_per_peer: connections one peer address may hold
            that never authenticated (no call passed the job check on them);
            the oldest past it are closed. Default 16.
        unauthenticated_timeout: how long a connection may stay open without
            authenticating (default 10 s). Connections that never
            authenticated are also kept to half of ``max_connections`` in all;
            a flood is logged once when it starts and once when it ends
            (``lighthouse.connection_policy``).
        insecure: listen beyond loopback without a job secret; None:
            ``$TORCHFT_INSECURE``. Default: refused.
    """

    def __init__(
        self,
        replica_id: str,
        lighthouse_addr: str,
        hostname: str | None = None,
        bind: str | None = None,
        store_addr: str = "",
        world_size: int = 1,
        heartbeat_interval: timedelta | None = None,
        connect_timeout: timedelta = timedelta(seconds=10),
        quorum_retries: int = 0,
        on_kill: Callable[[str], None] | None = None,
        *,
        allow_kill: bool = False,
        job_secret: str | None = None,
        job_id: str | None = None,
        tls: TlsConfig | None = None,
        max_connections: int | None = None,
        max_unauthenticated_per_peer: int = DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
        unauthenticated_timeout: timedelta = timedelta(seconds=DEFAULT_UNAUTHENTICATED_TIMEOUT_S),
        insecure: bool | None = None,
    ) -> None:
        validate.check_replica_id(replica_id)
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        fd_limit, _ = raise_nofile_limit()
        self.limits = ConnectionLimits(
            max_connections=resolve_max_connections(
                max_connections,
                default=default_max_connections(world_size),
                floor=max(MIN_CONNECTIONS, 2 * world_size),
                reserve=FD_RESERVE,
                limit=fd_limit,
                what=f"the manager server of {replica_id!r}",
            ),
            max_unauthenticated_per_peer=max_unauthenticated_per_peer,
            unauthenticated_timeout_s=unauthenticated_timeout.total_seconds(),
        )
        if quorum_retries < 0:
            raise ValueError(f"quorum_retries must be >= 0, got {quorum_retries}")
        self.replica_id = replica_id
        self.world_size = world_size
        self.store_addr = store_addr
        self._hb_s = None if heartbeat_interval is None else heartbeat_interval.total_seconds()
        self._connect_s = connect_timeout.total_seconds()
        if (self._hb_s is not None and self._hb_s <= 0) or self._connect_s <= 0:
            raise ValueError(
                f"heartbeat_interval and connect_timeout must be positive, got "
                f"{heartbeat_interval} and {connect_timeout}"
            )
        self._allow_kill = allow_kill or on_kill is not None
        self._on_kill = on_kill or _exit_process
        self._job_secret = auth.resolve_job_secret(job_secret)
        self._tls = tls if tls is not None else resolve_tls()
        insecure = exposure.insecure_opted_out(insecure)
        if bind is None:
            bind = join_host_port(exposure.default_host(self._job_secret, insecure), 0)
        bind_host, _ = split_host_port(bind, "bind")
        exposure.check_bind("the manager server", bind, bind_host, self._job_secret, insecure)
        if hostname:
            exposure.check_advertised("the manager server", bind_host, hostname)
        auth.warn_if_exposed(log, "the manager server", bind_host, self._job_secret)
        self._host = advertised_host(bind_host, hostname)
        self._lease = LeaseHolder()
        self._subscribers: set[asyncio.Queue[bytes]] = set()
        # in-process subscribers; replaced, never mutated, so any thread may add
        self._local_watchers: frozenset[Callable[[FailureNotice], None]] = frozenset()
        self._link = LighthouseLink(
            replica_id,
            ",".join(normalize_addresses(lighthouse_addr)),
            self._hb_s,
            self._connect_s,
            quorum_retries,
            self._on_event,
            self._on_stream,
            job_secret=self._job_secret,
            job_id=auth.resolve_job_id(job_id),
            tls=self._tls,
        )
        self._rounds = GroupRounds(
            replica_id=replica_id,
            world_size=world_size,
            store_addr=store_addr,
            address=self.address,
            link=self._link,
            lease=self._lease,
        )
        # the lighthouse's latest word on why our request waits, and the round it was for
        self._lighthouse_wait: tuple[QuorumWait, int] | None = None
        self._stopped = False
        self._loop = background_loop()
        self._conn_guard = ConnectionGuard(self.limits, f"the manager server of {replica_id!r}")
        try:
            self._port = run_sync(self._start(bind), timeout_s=self._connect_s + 30)
        except BaseException:
            self._conn_guard.stop()
            raise

    # -- lifecycle -----------------------------------------------------------------------
    async def _start(self, bind: str) -> int:
        """Bind and start serving while the lighthouse link connects (both at once:
        a restarted replica waits for neither twice)."""
        handlers: dict[str, Callable[..., Any]] = {
            "Quorum": self._quorum,
            "CheckpointMetadata": self._checkpoint_metadata,
            "ShouldCommit": self._should_commit,
            "Kill": self._kill,
            "WatchFailures": self._watch_failures,
        }
        server, port = bind_server(
            services.MANAGER_SERVICE,
            handlers,
            bind,
            keepalive_ms=5000,
            what="the manager server",
            secret=self._job_secret,
            tls_config=self._tls,
            conn_guard=self._conn_guard,
        )
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

    @property
    def rounds(self) -> GroupRounds:
        """The quorum rounds and commit votes, for the in-process client
        (``lighthouse.replica.local``); use them on ``loop`` only."""
        return self._rounds

    @property
    def job_secret(self) -> str | None:
        """The secret this server requires of its callers (None: no check)."""
        return self._job_secret

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS configuration of this server and its link (None: plaintext)."""
        return self._tls

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this server and its rounds run on."""
        return self._loop

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
        self._conn_guard.stop()
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

    def wait_lease_recalled(self, timeout: timedelta) -> bool:
        """Wait until no lease is held, or the one held answers only the rounds below
        a step a recall named; False after ``timeout``. Any thread."""
        return self._lease.wait_recalled(timeout)

    # -- failure notices and lease recalls ---------------------------------------------------
    def lighthouse_wait(self) -> QuorumWait | None:
        """Why the lighthouse holds this group's quorum request, as it last said while
        the request waits (None: it said nothing since the request went out). Any thread."""
        told = self._lighthouse_wait
        if told is None or told[1] != self._rounds.launched:
            return None
        return told[0]

    def _on_event(self, event: wire.LivenessEventBody) -> None:
        """An event from the lighthouse's liveness stream (on the loop)."""
        if isinstance(event, QuorumWait):
            self._lighthouse_wait = (event, self._rounds.launched)
            log.debug("%s: the lighthouse holds our quorum: %s", self.replica_id, event.reason)
            return
        if isinstance(event, LeaseFloor):
            self._lease.on_floor(event)
            return
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

    def _on_stream(self, is_open: bool) -> None:
        """The liveness stream opened or broke (on the loop). A leased step still
        running when it reopens is failed: see ``LeaseHolder.on_stream_reopened``."""
        if not is_open:
            self._lease.on_stream_broken()
            return
        stranded = self._lease.on_stream_reopened(self.replica_id, self._rounds.resolved_step)
        if stranded is not None:
            log.warning("%s: failing step %s: %s", self.replica_id, stranded.step, stranded.reason)
            self._relay(stranded)

    def _on_recall(self, recall: LeaseRecall) -> None:
        """Void the recalled lease; fail the leased step in progress if it is stranded."""
        stranded = self._lease.on_recall(recall, self._rounds.resolved_step)
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
    async def _quorum(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            remaining = context.time_remaining()
            if remaining is None:
                raise ValueError("ManagerService.Quorum needs a deadline (grpc timeout), got none")
            req = wire.decode_manager_quorum_request(request, timedelta(seconds=remaining))
            rank = self._rounds.check_request(req)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Quorum: {exc}")
        g, fut = self._rounds.enter_gather(rank, req)
        try:
            quorum = await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._rounds.leave_gather(g, rank, req)
            raise
        except QuorumRejectedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"Quorum: {exc}")
        except FaultToleranceError as exc:
            await context.abort(grpc.StatusCode.ABORTED, f"{type(exc).__name__}: {exc}")
        result = self._rounds.result_for(quorum, rank, req.init_sync)
        return wire.encode_quorum_result(result)

    # -- commit vote, metadata, kill -------------------------------------------------------
    async def _should_commit(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            rank, step, vote = wire.decode_should_commit_request(request)
            v, fut = self._rounds.enter_vote(rank, step, vote)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"ShouldCommit: {exc}")
        remaining = context.time_remaining()
        # Decide before the caller's deadline, so that it hears the group's answer
        # (see GroupRounds.expire_vote) rather than a timeout it cannot read.
        budget = None if remaining is None else max(0.0, remaining - vote_margin_s(remaining))
        try:
            try:
                decision = await asyncio.wait_for(asyncio.shield(fut), budget)
            except asyncio.TimeoutError:
                decision = self._rounds.expire_vote(v, rank)
        except asyncio.CancelledError:
            self._rounds.leave_vote(v, rank)
            raise
        except QuorumRejectedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"ShouldCommit: {exc}")
        return wire.encode_should_commit_response(decision)

    async def _checkpoint_metadata(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        try:
            rank = wire.decode_checkpoint_metadata_request(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"CheckpointMetadata: {exc}")
        try:
            metadata = self._rounds.checkpoint_metadata(rank)
        except QuorumRejectedError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        return wire.encode_checkpoint_metadata_response(metadata)

    async def _kill(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            msg = wire.decode_kill_request(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Kill: {exc}")
        if not self._allow_kill:
            log.warning("%s: refused a Kill (not enabled): %s", self.replica_id, msg)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "Kill: not enabled on this manager server (ManagerServer(allow_kill=True))",
            )
        log.warning("%s: Kill received: %s", self.replica_id, msg)
        asyncio.get_running_loop().call_later(0.05, self._on_kill, msg)
        return wire.encode_kill_response()

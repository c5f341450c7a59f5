"""``LighthouseServer``: the gRPC shell around ``LighthouseCore`` plus the HTTP status.

The asyncio gRPC server (measured faster than the thread-pool server under
hundreds of concurrent long-polls, see bench/quorum.py) runs on the
process-wide background loop; every handler is a few lines that decode,
validate, call the core and encode.

Every call under a replica id (quorum requests, heartbeats, liveness streams
with their leaving pings) first passes ``lighthouse.coordinator.admission``
(capacity, the id's incarnation token, streams per id): a refused call
changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

from lighthouse import auth, exposure, services, validate, wire
from lighthouse._conn_guard import ConnectionGuard
from lighthouse._grpc import grpc
from lighthouse._loop import run_sync
from lighthouse._net import advertised_host, bind_server, join_host_port, split_host_port
from lighthouse.clock import Clock, MonotonicClock
from lighthouse.connection_policy import (
    DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
    DEFAULT_UNAUTHENTICATED_TIMEOUT_S,
    ConnectionLimits,
)
from lighthouse.coordinator.admission import (
    DEFAULT_MAX_TRACKED_REPLICAS,
    MAX_STREAMS_PER_REPLICA,
    Admission,
    Refusal,
)
from lighthouse.coordinator.core import LighthouseCore, RefusedError, SupersededError
from lighthouse.coordinator.integrity import (
    DEFAULT_DIVERGENCE_WINDOW_S,
    DEFAULT_QUARANTINE_AFTER_DIVERGENCES,
)
from lighthouse.coordinator.job_state import JobStateFile
from lighthouse.coordinator.quorum import (
    DEFAULT_HEARTBEAT_TIMEOUT_MS,
    DEFAULT_JOIN_TIMEOUT_MS,
    DEFAULT_MIN_REPLICAS,
    DEFAULT_QUARANTINE_AFTER_FAILURES,
    DEFAULT_QUARANTINE_BASE_MS,
    DEFAULT_QUORUM_TICK_MS,
    QuorumConfig,
)
from lighthouse.coordinator.state_lock import StateFileLock
from lighthouse.coordinator.status import MAX_CONNECTIONS as STATUS_MAX_CONNECTIONS
from lighthouse.coordinator.status import LighthouseMetrics, StatusHTTPServer
from lighthouse.coordinator.stragglers import (
    DEFAULT_STRAGGLER_SLOWDOWN,
    DEFAULT_STRAGGLER_WINDOW,
)
from lighthouse.fd_limit import raise_nofile_limit, resolve_max_connections
from lighthouse.tls import TlsConfig, resolve_tls

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_TRACKED_REPLICAS",
    "FD_RESERVE",
    "MAX_STREAMS_PER_REPLICA",
    "MIN_CONNECTIONS",
    "LighthouseServer",
]

log = logging.getLogger("lighthouse")
# How the server answers each kind of refusal (see ``admission.Refusal``).
_REFUSAL_CODES = {
    "capacity": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "streams": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "incarnation": grpc.StatusCode.PERMISSION_DENIED,
    "malformed": grpc.StatusCode.INVALID_ARGUMENT,
}

#: gRPC connections the lighthouse holds at once by default: a job of 1024 replica
#: groups holds about 1024 (one per manager server, plus any LighthouseClient), and
#: half the cap stays free for the job whatever strangers hold (connection_policy).
DEFAULT_MAX_CONNECTIONS = 4096
#: The fewest connections a lighthouse starts with.
MIN_CONNECTIONS = 8
#: File descriptors kept free beside the gRPC connections and the status page's:
#: the state file, the listeners, gRPC's and asyncio's own, logs, stdio.
FD_RESERVE = 64
_REASON_MARGIN_S = 0.25  # a quorum wait ends this long before the caller's deadline
_TICK_SLACK_S = 0.001  # a timer may fire this early on a loop with a millisecond clock (s)
_MAX_MS = 2**31 - 1  # about 24.8 days: gRPC takes its keepalive period as a C int


def _ms_arg(name: str, value: int | None, default: int, minimum: int) -> int:
    """A milliseconds argument: None means ``default``; otherwise an int (not a
    bool or float) in ``[minimum, 2**31 - 1]``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of milliseconds or None, got {value!r}")
    if not minimum <= value <= _MAX_MS:
        raise ValueError(f"{name} must be in [{minimum}, {_MAX_MS}] milliseconds, got {value}")
    return value


class LighthouseServer:
    """One lighthouse per job: decides every quorum and detects dead replicas.

    The first five parameters are torchft's ``LighthouseServer`` signature, with
    None meaning "the default" as there. The defaults are ours, the same as the
    ``python -m lighthouse`` flags: they differ from torchft's Python binding
    (join 100 ms, tick 100 ms, heartbeat 5000 ms) only in ``join_timeout_ms``,
    10_000 ms here (``quorum.DEFAULT_JOIN_TIMEOUT_MS``). Pass
    ``join_timeout_ms=100`` for torchft's timing.

    Args:
        bind: gRPC listen address, ``host:port`` (port 0 picks a free one).
            None: ``[::]:0`` (every interface) with a job secret, else
            ``127.0.0.1:0`` (this machine only). A bind beyond loopback without
            a job secret raises ``ValueError`` unless ``insecure``
            (``lighthouse.exposure``); torchft's Ray Train integration binds
            ``[::]:0`` and so needs ``TORCHFT_JOB_SECRET`` (or ``TORCHFT_INSECURE=1``).
        min_replicas: fewest replica groups for a (non-fast) quorum, an int >= 1.
        join_timeout_ms: milliseconds (int >= 0) to wait for live replicas that
            have not asked yet, counted from the first pending request;
            None = ``DEFAULT_JOIN_TIMEOUT_MS`` (10_000).
        quorum_tick_ms: milliseconds (int >= 1) between background
            re-evaluations while a replica asks; None = ``DEFAULT_QUORUM_TICK_MS``
            (100). While none asks, ticks come at most every 500 ms, a tenth of
            the heartbeat timeout and a quarter of the join timeout, and never
            more often than this (``core.tick_period_s``).
        heartbeat_timeout_ms: milliseconds (int >= 1) of silence after which a
            replica without a pending request is declared dead (fallback; a
            closed liveness stream declares it dead at once);
            None = ``DEFAULT_HEARTBEAT_TIMEOUT_MS`` (5000).
        quorum_lease: grant quorum leases, so members skip the lighthouse on
            steps where nothing changes (``lighthouse.coordinator.lease``); False makes every
            step a full quorum round, as in torchft.
        http_bind: ``host:port`` for the dashboard, ``/status`` and ``/metrics``;
            None serves no HTTP. Checked like ``bind``.
        hostname: host to advertise in ``address()``; default: the bind host,
            or the machine's host name for a wildcard bind. A loopback bind
            advertises a loopback host only (``ValueError`` otherwise).
        clock: time source (seconds); tests inject a ``FakeClock``.
        epoch: override the random start-up id (tests only).
        state_file: where to keep the job's committed step (a small JSON file,
            created if missing), so a lighthouse restarted with the same file
            still refuses a quorum that would restart the job below it. None
            (the default here; the command line defaults to a file) keeps it in
            memory only: a restart then learns it again from the replicas that
            are still alive. A lighthouse holds the file's lock
            (``lighthouse.coordinator.state_lock``) while it runs: a second one
            on the same file raises ``StateFileLockedError`` naming the holder.
        state_lock: the file's lock, already held (a standby that waited for
            it); default: taken here.
        allow_step_reset: issue a quorum even if its highest step is below the
            job's committed step (an operator restarting a job from older state).
        quarantine_after_failures: consecutive failed steps of a whole quorum after
            which its members that never committed a step (while others have)
            are left out of quorums for a while (e.g. one that can never
            configure); 0 disables it.
        job_secret: the job's secret (default: ``$TORCHFT_JOB_SECRET`` or the file
            ``$TORCHFT_JOB_SECRET_FILE``; see ``lighthouse.auth``); when set, every
            call without it is refused with UNAUTHENTICATED and changes nothing.
        job_id: the job this lighthouse serves (default: ``$TORCHFT_JOB_ID``);
            when set, calls for another job or for none are refused with
            FAILED_PRECONDITION, so two jobs never merge into one quorum.
        quarantine_base_ms: the first quarantine's length in milliseconds
            (doubled per repeat, at most 600 s); None = 30_000.
        tls: serve gRPC over TLS with this certificate (default: from
            ``$TORCHFT_TLS_CERT``/``$TORCHFT_TLS_KEY``, see ``lighthouse.tls``;
            neither set: plaintext). The status page stays plain HTTP.
        max_tracked_replicas: most replica ids remembered at once (default
            4096); a call under a new id beyond it is refused with
            RESOURCE_EXHAUSTED and changes nothing, as is a liveness stream
            beyond ``MAX_STREAMS_PER_REPLICA`` (4) open under one id. Both are
            logged once per episode, not per call.
        max_connections: gRPC connections held at once, from all peers; one
            past it is closed on arrival. None: ``DEFAULT_MAX_CONNECTIONS``
            (4096), or as many as the open-file limit carries if fewer (a
            warning says so). The soft ``RLIMIT_NOFILE`` is first raised to the
            hard limit; the cap plus the status page's 64 connections plus
            ``FD_RESERVE`` (64) must fit in it, and the cap must be at least
            ``MIN_CONNECTIONS`` (8) and twice ``min_replicas`` (the half kept
            for the job holds them), else ``ValueError`` naming the figures.
        max_unauthenticated_per_peer: connections one peer address may hold
            that never authenticated (no call passed the job check on them);
            the oldest past it are closed. Default 16.
        unauthenticated_timeout_ms: milliseconds a connection may stay open
            without authenticating (default 10_000). Connections that never
            authenticated are also kept to half of ``max_connections`` in all,
            so the other half stays free for the job; a flood is logged once
            when it starts and once when it ends
            (``lighthouse.connection_policy``).
        insecure: listen beyond loopback without a job secret (one warning
            says so); None: ``$TORCHFT_INSECURE``. Default: refused.
        quarantine_after_divergences: how many times a replica may report its
            own state diverged from the majority's (silent data corruption,
            found by its integrity check) within ``divergence_window_ms``
            before it is quarantined (rule 10 of ``lighthouse.coordinator.quorum``;
            never below ``min_replicas``); 0 disables it. Default 3.
        divergence_window_ms: that window in milliseconds; None = 3_600_000 (an hour).
        straggler_window: steps of each replica group's work per step kept to
            tell a straggler (``lighthouse.coordinator.stragglers``; default
            50); 0 disables the detector.
        straggler_slowdown: a group whose median work per step is at least
            this many times the other members' (a float > 1, default 1.5) is
            quarantined, with the quarantine's backoff, while the others stay
            at least ``min_replicas``.

    Every millisecond argument must be at most 2**31 - 1. A wrong type raises
    ``TypeError`` and a value out of range ``ValueError``, each naming the value.
    """

    def __init__(
        self,
        bind: str | None = None,
        min_replicas: int = DEFAULT_MIN_REPLICAS,
        join_timeout_ms: int | None = None,
        quorum_tick_ms: int | None = None,
        heartbeat_timeout_ms: int | None = None,
        quorum_lease: bool = True,
        http_bind: str | None = None,
        hostname: str | None = None,
        clock: Clock | None = None,
        epoch: str | None = None,
        state_file: str | os.PathLike[str] | None = None,
        allow_step_reset: bool = False,
        quarantine_after_failures: int = DEFAULT_QUARANTINE_AFTER_FAILURES,
        quarantine_base_ms: int | None = None,
        *,
        job_secret: str | None = None,
        job_id: str | None = None,
        tls: TlsConfig | None = None,
        max_tracked_replicas: int = DEFAULT_MAX_TRACKED_REPLICAS,
        max_connections: int | None = None,
        max_unauthenticated_per_peer: int = DEFAULT_MAX_UNAUTHENTICATED_PER_PEER,
        unauthenticated_timeout_ms: int | None = None,
        insecure: bool | None = None,
        state_lock: StateFileLock | None = None,
        quarantine_after_divergences: int = DEFAULT_QUARANTINE_AFTER_DIVERGENCES,
        divergence_window_ms: int | None = None,
        straggler_window: int = DEFAULT_STRAGGLER_WINDOW,
        straggler_slowdown: float = DEFAULT_STRAGGLER_SLOWDOWN,
    ) -> None:
        self._job_secret = auth.resolve_job_secret(job_secret)
        insecure = exposure.insecure_opted_out(insecure)
        if bind is None:
            host = exposure.default_host(self._job_secret, insecure)
            bind = join_host_port(host, 0)
        if not isinstance(bind, str):
            raise TypeError(f"bind must be a 'host:port' string or None, got {bind!r}")
        for name, value in (
            ("min_replicas", min_replicas),
            ("quarantine_after_failures", quarantine_after_failures),
            ("quarantine_after_divergences", quarantine_after_divergences),
            ("max_tracked_replicas", max_tracked_replicas),
            ("straggler_window", straggler_window),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        join_timeout_ms = _ms_arg("join_timeout_ms", join_timeout_ms, DEFAULT_JOIN_TIMEOUT_MS, 0)
        quorum_tick_ms = _ms_arg("quorum_tick_ms", quorum_tick_ms, DEFAULT_QUORUM_TICK_MS, 1)
        heartbeat_timeout_ms = _ms_arg(
            "heartbeat_timeout_ms", heartbeat_timeout_ms, DEFAULT_HEARTBEAT_TIMEOUT_MS, 1
        )
        if isinstance(straggler_slowdown, bool) or not isinstance(straggler_slowdown, (int, float)):
            raise TypeError(f"straggler_slowdown must be a float, got {straggler_slowdown!r}")
        self.config = QuorumConfig(
            min_replicas=min_replicas,
            join_timeout_s=join_timeout_ms / 1000,
            heartbeat_timeout_s=heartbeat_timeout_ms / 1000,
            lease=quorum_lease,
            allow_step_reset=allow_step_reset,
            quarantine_after_failures=quarantine_after_failures,
            quarantine_base_s=_ms_arg(
                "quarantine_base_ms", quarantine_base_ms, DEFAULT_QUARANTINE_BASE_MS, 1
            )
            / 1000,
            quarantine_after_divergences=quarantine_after_divergences,
            divergence_window_s=_ms_arg(
                "divergence_window_ms",
                divergence_window_ms,
                round(DEFAULT_DIVERGENCE_WINDOW_S * 1000),
                1,
            )
            / 1000,
            straggler_window=straggler_window,
            straggler_slowdown=float(straggler_slowdown),
        )
        unauthenticated_timeout_ms = _ms_arg(
            "unauthenticated_timeout_ms",
            unauthenticated_timeout_ms,
            round(DEFAULT_UNAUTHENTICATED_TIMEOUT_S * 1000),
            1,
        )
        fd_limit, _ = raise_nofile_limit()
        self.limits = ConnectionLimits(
            max_connections=resolve_max_connections(
                max_connections,
                default=DEFAULT_MAX_CONNECTIONS,
                floor=max(MIN_CONNECTIONS, 2 * min_replicas),
                reserve=FD_RESERVE + (STATUS_MAX_CONNECTIONS if http_bind is not None else 0),
                limit=fd_limit,
                what="the lighthouse",
            ),
            max_unauthenticated_per_peer=max_unauthenticated_per_peer,
            unauthenticated_timeout_s=unauthenticated_timeout_ms / 1000,
        )
        self._tick_s = quorum_tick_ms / 1000
        self._heartbeat_timeout_ms = heartbeat_timeout_ms
        self.job_id = auth.resolve_job_id(job_id)
        self._tls = tls if tls is not None else resolve_tls()
        bind_host, _ = split_host_port(bind, "bind")
        exposure.check_bind("the lighthouse", bind, bind_host, self._job_secret, insecure)
        if http_bind is not None:
            http_host, _ = split_host_port(http_bind, "http_bind")
            exposure.check_bind(
                "the lighthouse's status page", http_bind, http_host, self._job_secret, insecure
            )
        if hostname:
            exposure.check_advertised("the lighthouse", bind_host, hostname)
        auth.warn_if_exposed(log, "the lighthouse", bind_host, self._job_secret)
        self.epoch = epoch or secrets.token_hex(6)
        self.metrics = LighthouseMetrics()
        job_state = None if state_file is None else JobStateFile(state_file)
        self._state_lock: StateFileLock | None = None
        if state_file is not None:
            # one lighthouse per job state file: taken before the file is read
            self._state_lock = state_lock or StateFileLock(state_file)
            self._state_lock.acquire()
        try:
            self.core = LighthouseCore(
                self.config, clock or MonotonicClock(), self.epoch, self.metrics, job_state
            )
        except BaseException:  # e.g. a corrupt state file: let the next lighthouse try
            if self._state_lock is not None:
                self._state_lock.release()
            raise
        self._admission = Admission(
            max_tracked=max_tracked_replicas, knows=self._knows, tracked=self._tracked
        )
        self._server: grpc.aio.Server | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self._tick_replan: asyncio.Event | None = None  # set: the tick loop plans again
        self._http: StatusHTTPServer | None = None
        self._stopped = False
        self._conn_guard = ConnectionGuard(self.limits, "the lighthouse")
        try:
            self._port = run_sync(self._start(bind, max(1000, heartbeat_timeout_ms)), timeout_s=30)
        except BaseException:
            self._conn_guard.stop()
            if self._state_lock is not None:
                self._state_lock.release()
            raise
        self._host = advertised_host(bind_host, hostname)
        if http_bind is not None:
            self._http = StatusHTTPServer(
                split_host_port(http_bind, "http_bind"), self.status, self.metrics
            )
        log.info(
            "lighthouse epoch %s serving on %s (min_replicas=%d, join_timeout_ms=%d, "
            "quorum_tick_ms=%d, heartbeat_timeout_ms=%d, quorum_lease=%s, max_connections=%d "
            "(of an open-file limit of %d), committed step %d%s)%s",
            self.epoch,
            self.address(),
            min_replicas,
            join_timeout_ms,
            quorum_tick_ms,
            heartbeat_timeout_ms,
            quorum_lease,
            self.limits.max_connections,
            fd_limit,
            self.core.state.committed_step,
            "" if job_state is None else f" from {str(job_state.path)!r}",
            f", status on {self.http_address()}" if self._http else "",
        )

    # -- lifecycle -----------------------------------------------------------------------
    async def _start(self, bind: str, keepalive_ms: int) -> int:
        handlers: dict[str, Callable[..., Any]] = {
            "Quorum": self._quorum,
            "QuorumStream": self._quorum_stream,
            "Heartbeat": self._heartbeat,
            "Liveness": self._liveness,
        }
        server, port = bind_server(
            services.LIGHTHOUSE_SERVICE,
            handlers,
            bind,
            keepalive_ms=keepalive_ms,
            what="the lighthouse",
            secret=self._job_secret,
            job_id=self.job_id,
            tls_config=self._tls,
            conn_guard=self._conn_guard,
        )
        await server.start()
        self._server = server
        self._tick_task = asyncio.get_running_loop().create_task(self._tick_loop())
        return port

    async def _tick_loop(self) -> None:
        """Tick every `LighthouseCore.tick_period` seconds. A quorum request re-plans
        the wait (`_replan_tick`): ticks stay at least the configured period apart,
        and one comes within that period of the request."""
        loop = asyncio.get_running_loop()
        replan = self._tick_replan = asyncio.Event()
        last = loop.time()
        while True:
            due = last + self.core.tick_period(self._tick_s)
            now = loop.time()
            if now < due - _TICK_SLACK_S:
                replan.clear()
                timer = loop.call_later(due - now, replan.set)
                try:
                    await replan.wait()
                finally:
                    timer.cancel()
                continue  # due, or a request shortened the period: plan again
            last = now
            try:
                self.core.tick()
                room = self._admission.tick()
                if room is not None:
                    log.info("%s", room)
            except Exception:
                log.exception("lighthouse tick failed")

    def _knows(self, replica_id: str) -> bool:
        """Whether the core still remembers ``replica_id`` (seen and not forgotten,
        or with a liveness stream open): its incarnation binding lives as long."""
        return replica_id in self.core.state.seen or replica_id in self.core.streams

    def _tracked(self) -> int:
        """Replica ids the core remembers: seen, or with a liveness stream open. O(streams)."""
        seen = self.core.state.seen
        return len(seen) + sum(1 for rid in self.core.streams if rid not in seen)

    async def _admit(self, rpc: str, replica_id: str, context: grpc.aio.ServicerContext) -> None:
        """Abort the call unless ``lighthouse.coordinator.admission`` lets it in."""
        token = auth.incarnation_of(context.invocation_metadata())
        await self._refuse(self._admission.admit(rpc, replica_id, token, context.peer()), context)

    @staticmethod
    async def _refuse(refusal: Refusal | None, context: grpc.aio.ServicerContext) -> None:
        """Log ``refusal`` (once per episode) and abort the call with its status."""
        if refusal is None:
            return
        if refusal.log is not None:
            log.warning("%s", refusal.log)
        await context.abort(_REFUSAL_CODES[refusal.kind], refusal.reason)

    async def _stop(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        if self._server is not None:
            await self._server.stop(grace=0.2)
        self._conn_guard.stop()
        self.core.flush_job_state()  # a failure is logged there, never raised

    def shutdown(self) -> None:
        """Stop serving; pending calls fail with UNAVAILABLE/CANCELLED. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            run_sync(self._stop(), timeout_s=10)
        finally:
            if self._http is not None:
                self._http.shutdown()
            if self._state_lock is not None:
                self._state_lock.release()  # after the last write: a standby may take over

    def __enter__(self) -> LighthouseServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def requires_job_secret(self) -> bool:
        """Whether calls must present the job secret (see ``lighthouse.auth``)."""
        return self._job_secret is not None

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS configuration gRPC is served with (None: plaintext)."""
        return self._tls

    def address(self) -> str:
        """``http://host:port`` (``http://[v6]:port``) for clients, as torchft's
        ``address()`` returns it. Every client here and ``ManagerServer`` accept
        it as is; raw gRPC channels need ``bare_address()``."""
        return f"http://{self.bare_address()}"

    def bare_address(self) -> str:
        """``host:port`` (``[v6]:port``) without the scheme, for ``grpc.insecure_channel``."""
        return join_host_port(self._host, self._port)

    @property
    def port(self) -> int:
        return self._port

    def http_address(self) -> str | None:
        """``http://host:port`` of the status page, or None without one."""
        if self._http is None:
            return None
        return f"http://{join_host_port(self._host, self._http.port)}"

    def status(self) -> dict[str, Any]:
        """The ``/status`` dict, computed on the event loop (waits at most 5 s)."""

        async def snap() -> dict[str, Any]:
            return self.core.snapshot()

        return run_sync(snap(), timeout_s=5)

    # -- handlers (event loop) -----------------------------------------------------------
    async def _answer_quorum(
        self, rpc: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Validate one quorum request and wait for its quorum (shared by both RPCs).

        A cancelled wait (deadline, client gone) withdraws the request. Shortly
        before the caller's deadline the call ends with DEADLINE_EXCEEDED and the
        rules' current reason, so the caller learns why no quorum formed instead of
        a bare timeout. A refusal no wait can lift (a step reset with nobody left
        at the committed step) ends the call at once with FAILED_PRECONDITION.
        """
        try:
            member, timeout_ms = wire.decode_lighthouse_quorum_request_timeout(request)
            validate.check_member(member)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{rpc}: {exc}")
        await self._admit(rpc, member.replica_id, context)
        state = self.core.state
        jump = self._admission.step_jump_once(
            member.replica_id,
            member.step,
            state.committed_step,
            known=state.committed_step > 0 or state.commits.members > 0,
        )
        if jump is not None:
            log.warning("%s", jump)
        fut = self.core.request(member)
        if self._tick_replan is not None:  # an ask: the join timeout runs on the tick
            self._tick_replan.set()
        remaining = context.time_remaining()
        if timeout_ms > 0:
            remaining = (
                timeout_ms / 1000 if remaining is None else min(remaining, timeout_ms / 1000)
            )
        try:
            if remaining is None:
                return await fut
            # End a little before the caller's deadline so our reason reaches it first.
            wait_s = max(0.0, remaining - min(_REASON_MARGIN_S, remaining / 10))
            return await asyncio.wait_for(asyncio.shield(fut), wait_s)
        except SupersededError as exc:
            await context.abort(grpc.StatusCode.ABORTED, f"{rpc}: {exc}")
        except RefusedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{rpc}: {exc}")
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return fut.result()  # issued just as the wait ended: it is ours
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{rpc}: no quorum for {member.replica_id!r} at step {member.step} before its "
                f"deadline: "
                f"{self.core.quarantine_reason(member.replica_id) or self.core.decision.reason}",
            )
        finally:
            self.core.withdraw(member.replica_id, fut)
        raise AssertionError("unreachable")

    async def _quorum(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._answer_quorum("Quorum", request, context)

    async def _quorum_stream(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            assert isinstance(msg, bytes)
            await context.write(await self._answer_quorum("QuorumStream", msg, context))

    async def _heartbeat(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            rid = validate.check_replica_id(wire.decode_heartbeat_request(request))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Heartbeat: {exc}")
        await self._admit("Heartbeat", rid, context)
        self.core.heartbeat(rid)
        return wire.encode_heartbeat_response(self.epoch)

    async def _liveness(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        try:
            assert isinstance(first, bytes)
            rid = validate.check_replica_id(wire.decode_liveness_ping(first)[0])
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Liveness: {exc}")
        # Checked once per stream: its pings (a leaving one too) must keep this id.
        await self._admit("Liveness", rid, context)
        open_streams = len(self.core.streams.get(rid, ()))
        await self._refuse(self._admission.admit_stream(rid, open_streams, context.peer()), context)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.core.stream_opened(rid, queue)
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read_pings(rid, queue, context))
        # The reader ending (EOF, a leaving ping, a bad ping) wakes the writer below
        # with an empty payload, so the writer needs no per-event asyncio.wait.
        reader.add_done_callback(lambda _: queue.put_nowait(b""))
        try:
            await context.write(wire.encode_liveness_ack(self.epoch, self._heartbeat_timeout_ms))
            while True:
                payload = await queue.get()
                if not payload:  # the reader ended, or the core hung this stream up
                    break
                await context.write(payload)
        finally:
            reader.cancel()
            self.core.stream_closed(rid, queue)
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Liveness: {reader.exception()}")

    async def _read_pings(
        self, rid: str, queue: asyncio.Queue[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            assert isinstance(msg, bytes)
            ping = wire.decode_liveness_ping_report(msg)
            if ping.replica_id and ping.replica_id != rid:
                raise ValueError(
                    f"replica_id must stay {rid!r} on one liveness stream, got {ping.replica_id!r}"
                )
            if ping.leaving:
                self.core.replica_leaving(rid, queue, ping.step if ping.step > 0 else -1)
                return  # ends the stream; stream_closed() forgets it quietly
            self.core.progress(
                rid, ping.step, ping.step_time_ms, ping.heal, ping.busy_ms, ping.floor_wanted
            )

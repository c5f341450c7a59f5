"""A manager server's link to the lighthouse: liveness stream, quorum stream, retries.

Lives on the background event loop. The liveness stream is pinged every
heartbeat interval and reopened after it breaks, e.g. across a lighthouse
restart; failure notices arriving on it go to ``on_notice``, and every open
and break to ``on_stream``. Quorum requests travel on one persistent
``QuorumStream``.

Reconnecting. A lighthouse restarted on the same address listens again within
about a second, so while the lighthouse is unreachable the liveness stream is
retried every 50 ms for the first second, then backing off (x1.5 per attempt)
to two attempts a second (`retry_delay`). gRPC's own reconnect backoff would
pace the attempts instead (it reaches 1 s within a second of failures), so a
channel that is in backoff is replaced by a fresh one before each attempt. A
quorum request that failed because the lighthouse was unreachable is asked
again as soon as the liveness stream reopens, not at its next retry.

Standbys. ``addr`` may list several lighthouses, separated by commas: the
active one and its standbys (a standby serves only once it holds the job's
state file, i.e. once the active one is gone, see
``lighthouse.coordinator.state_lock``). The link talks to one at a time and
moves to the next after every failed attempt, so a takeover is found at the
retry pace above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from lighthouse import auth, services, wire
from lighthouse._grpc import grpc
from lighthouse._net import BROKEN_CALL, CHANNEL_OPTIONS, connection_error, split_host_port, stub
from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from lighthouse.replica.silence import Silences
from lighthouse.tls import TlsConfig, channel_credentials, channel_options
from lighthouse.types import (
    HealReport,
    Quorum,
    QuorumMember,
)

log = logging.getLogger("lighthouse.manager")

MIN_HEARTBEAT_S = 0.1  # the default ping period's floor (seconds; torchft's default period)
HEARTBEATS_PER_TIMEOUT = 10  # default pings per heartbeat timeout of the lighthouse


def default_heartbeat_s(heartbeat_timeout_s: float | None) -> float:
    """Seconds between liveness pings when none was given: a tenth of the
    lighthouse's heartbeat timeout (it says it when the stream opens), at least
    0.1 s. Ten pings per timeout leave a death detected as late as before, and
    each ping costs the lighthouse ~0.2 ms of CPU: at its default timeout (5
    s) that is 4 pings a second per replica instead of 20. (A lease holder also
    pings at every round it starts, and a ping restarts the period.)"""
    if heartbeat_timeout_s is None:
        return MIN_HEARTBEAT_S
    return max(MIN_HEARTBEAT_S, heartbeat_timeout_s / HEARTBEATS_PER_TIMEOUT)


# Seconds a clean leave waits to send its message, and then for the lighthouse to
# confirm it by ending the stream: a loaded host (ranks exiting, torch starting
# next to it) can take more than half a second to schedule the lighthouse.
LEAVE_TIMEOUT_S = 2.0

T = TypeVar("T")

RETRY_FAST_S = 0.05  # seconds between attempts during the first second of an outage
RETRY_FAST_FOR_S = 1.0  # how long an outage is retried at the fast pace (seconds)
RETRY_MAX_S = 0.5  # the slowest pace (seconds between attempts)
RUNNING_MARK_S = 0.1  # how often the loop marks that it runs, for `silence` (seconds)
# A channel of its own: a fresh channel must not inherit the backoff of a shared subchannel.
_LINK_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


def retry_delay(down_s: float, previous_s: float) -> float:
    """Seconds to wait before the next attempt to reach the lighthouse, which has
    been unreachable for ``down_s`` seconds; ``previous_s``: the last delay (0 at first)."""
    if down_s < RETRY_FAST_FOR_S:
        return RETRY_FAST_S
    return min(max(previous_s, RETRY_FAST_S) * 1.5, RETRY_MAX_S)


class LighthouseLink:
    """Connection of replica ``replica_id`` to the lighthouse at ``addr`` (``host:port``,
    or several separated by commas: tried in turn, see the module docstring).

    ``heartbeat_s``: seconds between liveness pings (None: ``default_heartbeat_s``
    of the lighthouse's heartbeat timeout, once it has said it); ``connect_s``: seconds an
    unreachable lighthouse is waited for (start-up) or retried (quorum);
    ``retries``: extra attempts after other quorum failures. ``on_stream(open)``
    is called on the loop after the liveness stream opens (True) or breaks (False).
    ``tls``: reach the lighthouse over TLS, verifying its certificate against
    this CA (None: plaintext; see ``lighthouse.tls``). ``incarnation``: this
    incarnation's token, sent with every call so the lighthouse refuses
    ``replica_id`` to anyone else (default: a fresh random one, see
    ``lighthouse.coordinator.incarnations``).
    """

    def __init__(
        self,
        replica_id: str,
        addr: str,
        heartbeat_s: float | None,
        connect_s: float,
        retries: int,
        on_notice: Callable[[wire.LivenessEventBody], None],
        on_stream: Callable[[bool], None] | None = None,
        job_secret: str | None = None,
        job_id: str | None = None,
        tls: TlsConfig | None = None,
        incarnation: str | None = None,
    ) -> None:
        self.replica_id = replica_id
        self._tls = tls
        self.incarnation = (
            auth.new_incarnation() if incarnation is None else auth.check_incarnation(incarnation)
        )
        # The job secret and our incarnation token, sent with both streams' calls
        # (see lighthouse.auth).
        self._call_metadata = auth.call_metadata(job_secret, job_id, self.incarnation)
        self._lh_addrs = tuple(a.strip() for a in addr.split(","))
        self._lh_addr = self._lh_addrs[0]  # the one in use
        self._hb_s = heartbeat_s
        self._connect_s = connect_s
        self._retries = retries
        self._on_notice = on_notice
        self._on_stream = on_stream
        self.lighthouse_epoch = ""  # epoch of the lighthouse our liveness stream is open to
        # Bumped whenever the liveness stream opens or breaks: a lease granted under
        # one generation is void under another (a recall may have been lost).
        self.generation = 0
        self.stream_open = False
        # When pings went out (event-loop time), and after how long a silence the
        # lighthouse declares a replica dead (s; None until it has said).
        self.silences = Silences()
        self._refusal = ""  # why the lighthouse last refused our stream (auth, job id)
        self.heartbeat_timeout_s: float | None = None
        # (step, step time ms, busy ms) sent with every ping
        self.progress: tuple[int, float, float] = (0, 0.0, 0.0)
        self.heal: HealReport | None = None  # the group's latest heal, sent with the next ping
        # The lease floor a leased round waits for, sent with every ping while it
        # waits (0: none; see ``LivenessPing.floor_wanted``).
        self.floor_wanted = 0
        self.committed_through = -1  # sent with the leaving ping (-1: unknown)
        self._ping_now: asyncio.Event | None = None  # set: ping at once (a new round)
        self._epoch_cond = threading.Condition()
        self._qcall: Any = None  # the persistent QuorumStream call, reopened after errors
        self._task: asyncio.Task[None] | None = None
        self._alive_task: asyncio.Task[None] | None = None  # marks that the loop runs
        self._live_call: Any = None  # the open liveness stream, for the leaving ping
        self._leaving = False
        self._open_now: asyncio.Event | None = None  # set while the liveness stream is open
        self._retired: list[Any] = []  # replaced channels not closed yet (see _redial)
        self._qcall_channel: Any = None  # the channel the quorum stream is on
        self.redials = 0  # channels replaced because gRPC was backing off

    def _dial(self) -> None:
        """A new channel to the lighthouse, and the stubs on it."""
        if self._tls is None:
            self._channel = grpc.aio.insecure_channel(self._lh_addr, options=_LINK_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(
                self._lh_addr,
                channel_credentials(self._tls),
                options=[*_LINK_CHANNEL_OPTIONS, *channel_options(self._tls)],
            )
        self._lh_quorum_stream = stub(self._channel, services.LIGHTHOUSE_QUORUM_STREAM)
        self._lh_liveness = stub(self._channel, services.LIGHTHOUSE_LIVENESS)

    async def _redial(self) -> None:
        """Replace the channel if gRPC is backing off from a failed connection: its
        next attempt may be up to a second away, ours is due now.

        Only the liveness loop redials, between its calls. A quorum request in
        flight may still be on the old channel (it fails there, and is asked
        again once the stream reopens on the new one): closing a channel
        cancels its calls with ``CancelledError``, which would end the round's
        task, so an old channel is closed only while no quorum request is in
        flight (`_close_retired`).
        """
        if len(self._lh_addrs) > 1:
            self._next_address()
        elif self._channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            self._retired.append(self._channel)
            self._dial()
            self.redials += 1
        await self._close_retired()

    def _next_address(self) -> None:
        """Move to the next lighthouse of the list, on a fresh channel."""
        index = self._lh_addrs.index(self._lh_addr)
        self._lh_addr = self._lh_addrs[(index + 1) % len(self._lh_addrs)]
        self._retired.append(self._channel)
        self._dial()
        self.redials += 1

    async def _close_retired(self) -> None:
        if not self._retired or self._qlock.locked():
            return
        if self._qcall is not None and self._qcall_channel is not self._channel:
            self._qcall.cancel()  # the quorum stream of an old channel: reopen on the new one
            self._qcall = self._qcall_channel = None
        retired, self._retired = self._retired, []
        for channel in retired:
            await channel.close()

    async def connect(self) -> None:
        """Wait up to ``connect_s`` for the lighthouse, then start the liveness stream.
        A host name that does not resolve fails at once: that is not transient."""
        await self._check_resolves()
        self._dial()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_s
        while True:
            # With standbys, each is given a short turn: only the active one listens.
            left = deadline - loop.time()
            turn = left if len(self._lh_addrs) == 1 else min(left, RETRY_FAST_FOR_S)
            try:
                await asyncio.wait_for(self._channel.channel_ready(), timeout=max(turn, 0.0))
                break
            except asyncio.TimeoutError:
                if loop.time() < deadline:
                    self._next_address()
                    continue
            why = await self._why_unreachable()
            await self._channel.close()
            for channel in self._retired:
                await channel.close()
            self._retired = []
            where = (
                self._lh_addr if len(self._lh_addrs) == 1 else f"any of {', '.join(self._lh_addrs)}"
            )
            raise LighthouseUnavailableError(
                f"lighthouse at {where} not reachable within connect_timeout "
                f"{self._connect_s:g} s" + (f": {why}" if why else "")
            ) from None
        await self._close_retired_now()
        self._qlock = asyncio.Lock()
        self._opened = asyncio.Event()
        self._open_now = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._liveness_loop())
        if self._alive_task is None:
            self._alive_task = asyncio.get_running_loop().create_task(self._mark_running())
        # Wait for the stream's acknowledgement too: a quorum lease is only taken
        # over an open stream, and a member without one while its peers hold it
        # would make them wait for a recall at its first step.
        try:
            await asyncio.wait_for(self._opened.wait(), timeout=self._connect_s)
        except asyncio.TimeoutError:
            self._task.cancel()
            await self._channel.close()
            raise LighthouseUnavailableError(
                f"lighthouse at {self._lh_addr} did not open a liveness stream within "
                f"connect_timeout {self._connect_s:g} s"
                + (f" (it answered {self._refusal})" if self._refusal else "")
            ) from None

    async def _check_resolves(self) -> None:
        for addr in self._lh_addrs:
            host, port = split_host_port(addr, "the lighthouse address")
            try:
                await asyncio.wait_for(
                    asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
                    timeout=min(self._connect_s, 10.0),
                )
            except socket.gaierror as e:
                raise LighthouseUnavailableError(
                    f"the lighthouse's host {host!r} (from {addr}) does not resolve: {e}; "
                    "check TORCHFT_LIGHTHOUSE (or lighthouse_addr)"
                ) from None
            except asyncio.TimeoutError:
                pass  # a slow resolver: let the connection attempt say what is wrong

    async def _close_retired_now(self) -> None:
        """Close the channels left behind while looking for the active lighthouse
        (at start-up: no quorum request is in flight)."""
        retired, self._retired = self._retired, []
        for channel in retired:
            await channel.close()

    async def _why_unreachable(self) -> str:
        """The channel's last connection error, or "" if it does not say within a second."""
        return await connection_error(self._channel, 1.0)

    @property
    def open_generation(self) -> int | None:
        """The liveness stream's generation while it is open; None while it is broken."""
        return self.generation if self.stream_open else None

    async def close(self, leave: bool = True) -> None:
        """Stop pinging and close the channel; with ``leave``, first say this is a
        clean shutdown, so the lighthouse forgets us without telling our peers we
        died. Bounded: at most ``LEAVE_TIMEOUT_S`` seconds to send it and as long
        for the lighthouse to end the stream, which confirms it (closing the
        channel before that may cancel the stream before the lighthouse read the
        message: it would then count us dead, and a run all of whose members
        left would not have ended cleanly).
        """
        self._leaving = True
        call = self._live_call
        if leave and call is not None and self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(
                    call.write(
                        wire.encode_liveness_ping(
                            self.replica_id, leaving=True, step=max(self.committed_through, 0)
                        )
                    ),
                    LEAVE_TIMEOUT_S,
                )
                await asyncio.wait_for(asyncio.shield(self._task), LEAVE_TIMEOUT_S)
            except (
                asyncio.TimeoutError,
                grpc.aio.AioRpcError,
                grpc.aio.UsageError,
                asyncio.InvalidStateError,
            ) as e:
                log.warning(
                    "%s: the lighthouse did not confirm our clean leave (%s): it may count "
                    "this replica dead",
                    self.replica_id,
                    type(e).__name__,
                )
        if self._task is not None:
            self._task.cancel()
        if self._alive_task is not None:
            self._alive_task.cancel()
        for channel in (*self._retired, self._channel):
            await channel.close()

    def wait_liveness(self, timeout: timedelta, epoch: str | None = None) -> bool:
        """Wait until the liveness stream is open (to lighthouse ``epoch`` if given).

        False if ``timeout`` passed first. Thread-safe.
        """
        with self._epoch_cond:
            return self._epoch_cond.wait_for(
                lambda: self.lighthouse_epoch != "" and epoch in (None, self.lighthouse_epoch),
                timeout=timeout.total_seconds(),
            )

    async def _mark_running(self) -> None:
        """Every ``RUNNING_MARK_S``: this server's loop runs, so it pings when due. A gap
        between two marks is a silence of ours (``silence``), unlike a ping the
        lighthouse does not read."""
        loop = asyncio.get_running_loop()
        while True:
            self.silences.ran(loop.time())
            await asyncio.sleep(RUNNING_MARK_S)

    async def _liveness_loop(self) -> None:
        loop = asyncio.get_running_loop()
        down_since: float | None = None  # loop time of the first failure since the stream was open
        delay = 0.0
        ping = wire.encode_liveness_ping(self.replica_id)
        while not self._leaving:
            call = self._lh_liveness(metadata=self._call_metadata)
            self._live_call = call
            pinger: asyncio.Task[None] | None = None
            try:
                await call.write(ping)
                ack = await call.read()
                if ack is grpc.aio.EOF:
                    raise ConnectionError("lighthouse closed the liveness stream")
                assert isinstance(ack, bytes)
                epoch, timeout_ms = wire.decode_liveness_ack(ack)
                self.heartbeat_timeout_s = timeout_ms / 1000 if timeout_ms else None
                if epoch != self.lighthouse_epoch:
                    log.info(
                        "%s: liveness stream open to lighthouse epoch %s", self.replica_id, epoch
                    )
                with self._epoch_cond:
                    self.lighthouse_epoch = epoch
                    self._epoch_cond.notify_all()
                self.generation += 1
                self.stream_open = True
                self._opened.set()
                assert self._open_now is not None
                self._open_now.set()
                down_since, delay = None, 0.0
                if self._on_stream is not None:
                    self._on_stream(True)
                pinger = asyncio.get_running_loop().create_task(self._ping(call))
                while True:
                    ev = await call.read()
                    if ev is grpc.aio.EOF:
                        break
                    assert isinstance(ev, bytes)
                    _, notice = wire.decode_liveness_event(ev)
                    if notice is not None:
                        self._on_notice(notice)
            except (
                grpc.aio.AioRpcError,
                grpc.aio.UsageError,  # a call on a channel closed meanwhile
                asyncio.InvalidStateError,
                ConnectionError,
                ValueError,
            ) as exc:
                refusal = _refusal(exc)
                if refusal and refusal != self._refusal:  # said once per reason, not per retry
                    log.warning(
                        "%s: the lighthouse at %s refused the liveness stream: %s",
                        self.replica_id,
                        self._lh_addr,
                        refusal,
                    )
                self._refusal = refusal
                log.debug(
                    "%s: liveness stream to %s broke: %s", self.replica_id, self._lh_addr, exc
                )
            finally:
                was_open = self.stream_open
                if was_open:
                    self.generation += 1
                    self.stream_open = False
                    assert self._open_now is not None
                    self._open_now.clear()
                if pinger is not None:
                    pinger.cancel()
                call.cancel()
                self._live_call = None
                if was_open and self._on_stream is not None and not self._leaving:
                    self._on_stream(False)
            if self._leaving:
                return
            now = loop.time()
            down_since = now if down_since is None else down_since
            delay = retry_delay(now - down_since, delay)
            await asyncio.sleep(delay)
            await self._redial()

    def ping_soon(self) -> None:
        """Send the current progress now rather than at the next heartbeat (on the loop):
        lease holders wait for each other's round reports."""
        if self._ping_now is not None:
            self._ping_now.set()

    async def _ping(self, call: Any) -> None:
        """Ping every heartbeat interval, and at once when ``ping_soon`` asks. A timer
        handle per ping (not a ``wait_for`` task): this runs once per leased round."""
        loop = asyncio.get_running_loop()
        wake = self._ping_now = asyncio.Event()
        timer: asyncio.TimerHandle | None = None
        try:
            while True:
                interval = self._hb_s
                if interval is None:
                    interval = default_heartbeat_s(self.heartbeat_timeout_s)
                timer = loop.call_later(interval, wake.set)
                await wake.wait()
                timer.cancel()
                wake.clear()
                step, step_time_ms, busy_ms = self.progress
                heal, self.heal = self.heal, None  # reported once
                try:
                    await call.write(
                        wire.encode_liveness_ping(
                            self.replica_id,
                            False,
                            step,
                            step_time_ms,
                            heal,
                            busy_ms,
                            self.floor_wanted,
                        )
                    )
                except BaseException:
                    if self.heal is None:  # not sent: the next stream's first ping carries it
                        self.heal = heal
                    raise
        finally:
            if timer is not None:
                timer.cancel()

    async def quorum(self, member: QuorumMember, deadline: float) -> tuple[Quorum, int]:
        """Ask for a quorum; ``deadline`` is in event-loop time (seconds).
        Returns the quorum and its lease id (0: no lease).

        Raises ``QuorumTimeoutError``, ``LighthouseUnavailableError`` (after
        ``connect_s`` of unreachability), ``QuorumRejectedError`` or ``FaultToleranceError``.
        """
        loop = asyncio.get_running_loop()
        first_unavailable: float | None = None
        retries = 0
        delay = 0.0
        timeout = QuorumTimeoutError(
            f"lighthouse at {self._lh_addr} formed no quorum with {self.replica_id!r} in time"
        )
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise timeout
            # the lighthouse answers just before this with its reason if no quorum forms
            payload = wire.encode_lighthouse_quorum_request(member, int(remaining * 1000))
            reply, code, details = await self._ask(payload, remaining)
            if reply is not None:
                try:
                    return wire.decode_leased_quorum_response(reply)
                except ValueError as exc:  # e.g. a member's data is not JSON text
                    raise FaultToleranceError(
                        f"lighthouse at {self._lh_addr} sent a malformed quorum reply: {exc}"
                    ) from exc
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                if details and not details.startswith("no quorum within"):
                    raise QuorumTimeoutError(f"{timeout}: {details}")  # the lighthouse's reason
                raise timeout
            if code in BROKEN_CALL:  # the stream broke under the request: ask again
                now = loop.time()
                first_unavailable = now if first_unavailable is None else first_unavailable
                if now - first_unavailable >= self._connect_s:
                    raise LighthouseUnavailableError(
                        f"lighthouse at {self._lh_addr} unreachable for {now - first_unavailable:.2f} s "
                        f"(connect_timeout {self._connect_s:g} s): {code.name}: {details}"
                    )
                delay = retry_delay(now - first_unavailable, delay)
                await self._until_reopened(min(delay, max(0.0, deadline - loop.time())))
                continue
            if code == grpc.StatusCode.FAILED_PRECONDITION:  # final: asking again won't help
                raise QuorumRejectedError(f"lighthouse at {self._lh_addr} refused: {details}")
            if retries < self._retries:
                retries += 1
            elif code == grpc.StatusCode.INVALID_ARGUMENT:
                raise QuorumRejectedError(f"lighthouse at {self._lh_addr} refused: {details}")
            else:
                raise FaultToleranceError(
                    f"lighthouse quorum call to {self._lh_addr} failed: {code.name}: {details}"
                )
            delay = min(max(delay, RETRY_FAST_S) * 1.5, RETRY_MAX_S)
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))

    async def _until_reopened(self, timeout_s: float) -> None:
        """Sleep ``timeout_s`` seconds, or less: until the liveness stream opens again
        (the lighthouse is back), if it is not open now."""
        opened = self._open_now
        if opened is None or self.stream_open:
            await asyncio.sleep(timeout_s)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(opened.wait(), timeout_s)

    async def _ask(
        self, payload: bytes, timeout_s: float
    ) -> tuple[bytes | None, grpc.StatusCode, str]:
        """One request on the persistent QuorumStream, waiting up to ``timeout_s`` seconds.

        Returns (reply, OK, "") or (None, status code, details); any failure
        cancels the stream (which withdraws the request) so the next call reopens it.
        """
        async with self._qlock:
            if self._qcall is None:
                self._qcall = self._lh_quorum_stream(metadata=self._call_metadata)
                self._qcall_channel = self._channel
            call = self._qcall
            try:
                reply = await _within(_exchange(call, payload), timeout_s)
                if reply is grpc.aio.EOF:
                    raise ConnectionError("the lighthouse ended the quorum stream")
                assert isinstance(reply, bytes)
                return reply, grpc.StatusCode.OK, ""
            except asyncio.TimeoutError:
                code, details = (
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no quorum within {timeout_s:.3f} s",
                )
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
            except (ConnectionError, asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
                code, details = grpc.StatusCode.UNAVAILABLE, str(exc)
            if self._qcall_channel is not self._channel:  # its channel was replaced: retry
                code, details = (
                    grpc.StatusCode.UNAVAILABLE,
                    f"reconnecting ({code.name}: {details})",
                )
            call.cancel()
            self._qcall = self._qcall_channel = None
            return None, code, details


def _refusal(exc: BaseException) -> str:
    """'CODE: details' if the lighthouse refused the call itself (wrong job secret or
    job id), else ''."""
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
    ):
        return f"{exc.code().name}: {exc.details()}"
    return ""


async def _exchange(call: Any, payload: bytes) -> Any:
    await call.write(payload)
    return await call.read()


async def _within(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``coro`` bounded by ``timeout_s`` seconds (asyncio.TimeoutError after).

    ``asyncio.timeout`` where there is one (3.11+): it runs ``coro`` in the
    caller's task, where ``wait_for`` would start a task per call.
    """
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:
        return await asyncio.wait_for(coro, timeout_s)
    async with timeout(timeout_s):
        return await coro

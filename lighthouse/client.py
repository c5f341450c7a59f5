"""Blocking clients: ``LighthouseClient`` and ``ManagerClient``.

Every call has a deadline (a ``timedelta``). A server that cannot be reached
is retried with backoff (50 ms, x1.5, capped at 1 s) for up to
``connect_timeout``, then ``LighthouseUnavailableError`` /
``ManagerUnavailableError`` names the address. A deadline that passes gives
``QuorumTimeoutError``; a refused request gives ``QuorumRejectedError`` with
the server's reason. Bad arguments raise ``ValueError`` before anything is sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import grpc

from lighthouse import validate, wire
from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    ManagerUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)
from lighthouse.types import FailureNotice, Quorum, QuorumMember, QuorumResult

log = logging.getLogger("lighthouse.client")

# Status codes a server uses to refuse a request (the details say why).
_REJECTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
}
# Manager servers forward lighthouse failures as ABORTED with the error class name first.
_FORWARDED: dict[str, type[FaultToleranceError]] = {
    "LighthouseUnavailableError": LighthouseUnavailableError,
    "QuorumTimeoutError": QuorumTimeoutError,
    "QuorumRejectedError": QuorumRejectedError,
}

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


def _seconds(name: str, value: timedelta) -> float:
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {type(value).__name__}")
    s = value.total_seconds()
    if s <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return s


def normalize_address(addr: str) -> str:
    """Accept ``host:port`` and the peer's ``http://host:port``; return ``host:port``."""
    for prefix in ("http://", "grpc://"):
        if addr.startswith(prefix):
            addr = addr[len(prefix) :]
    addr = addr.rstrip("/")
    if not addr or ":" not in addr:
        raise ValueError(f"address must be 'host:port', got {addr!r}")
    return addr


def error_for_status(
    code: grpc.StatusCode, details: str, *, what: str, addr: str, timeout_s: float
) -> FaultToleranceError | None:
    """The exception for a failed call, or None if the server was unreachable (retry)."""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return QuorumTimeoutError(
            f"{what} to {addr}: no answer within {timeout_s:.3f} s ({details})"
        )
    if code in _REJECTED:
        return QuorumRejectedError(f"{what} refused by {addr}: {code.name}: {details}")
    if code == grpc.StatusCode.ABORTED:
        name, _, rest = details.partition(": ")
        return _FORWARDED.get(name, QuorumRejectedError)(f"{what} via {addr}: {rest or details}")
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return FaultToleranceError(f"{what} to {addr} failed: {code.name}: {details}")
    return None


def call_with_retries(
    method: grpc.UnaryUnaryMultiCallable,
    request: bytes,
    *,
    what: str,
    addr: str,
    timeout_s: float,
    connect_timeout_s: float,
    unavailable: type[FaultToleranceError],
) -> bytes:
    """One unary call with a deadline ``timeout_s`` (seconds), retrying while the
    server is unreachable for at most ``connect_timeout_s`` seconds."""
    start = time.monotonic()
    deadline = start + timeout_s
    delay = 0.05
    attempts = 0
    while True:
        attempts += 1
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise QuorumTimeoutError(f"{what} to {addr}: no answer within {timeout_s:.3f} s")
        try:
            return method(request, timeout=remaining)  # type: ignore[no-any-return]
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
            details: str = exc.details() or ""  # type: ignore[attr-defined]
            error = error_for_status(code, details, what=what, addr=addr, timeout_s=timeout_s)
            if error is not None:
                raise error from exc
            elapsed = time.monotonic() - start
            if elapsed >= connect_timeout_s or elapsed + delay >= timeout_s:
                raise unavailable(
                    f"{what}: {addr} unreachable after {attempts} attempt(s) over {elapsed:.2f} s "
                    f"(connect_timeout {connect_timeout_s:g} s): {code.name}: {details}"
                ) from exc
            time.sleep(delay)  # backoff between attempts, not synchronization
            delay = min(delay * 1.5, 1.0)


class LighthouseClient:
    """Talks to a lighthouse at ``addr`` (``host:port``); thread-safe.

    ``connect_timeout``: how long an unreachable lighthouse is retried per call.
    """

    def __init__(self, addr: str, connect_timeout: timedelta = timedelta(seconds=10)) -> None:
        self._addr = normalize_address(addr)
        self._connect_s = _seconds("connect_timeout", connect_timeout)
        self._channel = grpc.insecure_channel(self._addr, options=CHANNEL_OPTIONS)
        base = f"/{wire.LIGHTHOUSE_SERVICE}/"
        self._quorum = self._channel.unary_unary(base + "Quorum")
        self._heartbeat = self._channel.unary_unary(base + "Heartbeat")

    def quorum(
        self,
        replica_id: str,
        timeout: timedelta,
        address: str = "",
        store_address: str = "",
        step: int = 0,
        world_size: int = 0,
        shrink_only: bool = False,
        data: Any = None,
        commit_failures: int = 0,
        step_time_ms: float = 0.0,
    ) -> Quorum:
        """Ask for a quorum and wait (up to ``timeout``) until one containing us forms.

        ``data``: any JSON-serializable value (torchft passes a dict), or None.
        It travels as JSON text, and every participant of the returned quorum
        carries its sender's value decoded again (``json.loads``: tuples come
        back as lists, non-str dict keys as str), or None if it sent none. A
        ``str`` is sent as a JSON string, not parsed. Raises ``TypeError`` /
        ``ValueError`` before sending for a value JSON cannot hold (NaN and
        infinity included) or one over 64 KiB encoded, and ``FaultToleranceError``
        if the reply carries data that is not JSON text.
        """
        text = validate.encode_data(data)
        member = QuorumMember(
            replica_id=replica_id,
            address=address,
            store_address=store_address,
            step=step,
            world_size=world_size,
            shrink_only=shrink_only,
            data=data,
            commit_failures=commit_failures,
            step_time_ms=step_time_ms,
        )
        validate.check_member(validate.with_data_json(member, text))
        reply = call_with_retries(
            self._quorum,
            wire.encode_lighthouse_quorum_request(member),
            what=f"quorum request of {replica_id!r}",
            addr=self._addr,
            timeout_s=_seconds("timeout", timeout),
            connect_timeout_s=self._connect_s,
            unavailable=LighthouseUnavailableError,
        )
        try:
            return wire.decode_lighthouse_quorum_response(reply)
        except ValueError as exc:
            raise FaultToleranceError(
                f"quorum request of {replica_id!r}: malformed reply from {self._addr}: {exc}"
            ) from exc

    def heartbeat(self, replica_id: str, timeout: timedelta = timedelta(seconds=5)) -> str:
        """Tell the lighthouse ``replica_id`` is alive; returns the lighthouse epoch."""
        validate.check_replica_id(replica_id)
        reply = call_with_retries(
            self._heartbeat,
            wire.encode_heartbeat_request(replica_id),
            what=f"heartbeat of {replica_id!r}",
            addr=self._addr,
            timeout_s=_seconds("timeout", timeout),
            connect_timeout_s=self._connect_s,
            unavailable=LighthouseUnavailableError,
        )
        return wire.decode_heartbeat_response(reply)

    def close(self) -> None:
        """Close the channel; later calls fail."""
        self._channel.close()


class FailureSubscription:
    """Handle of ``ManagerClient.subscribe_failures``; ``cancel()`` ends it."""

    def __init__(
        self,
        call: Any,
        callback: Callable[[FailureNotice], None],
        on_error: Callable[[Exception], None] | None,
    ) -> None:
        self._call = call
        self._callback = callback
        self._on_error = on_error
        self._cancelled = threading.Event()
        self.ready = threading.Event()  # set once the manager server acknowledged us
        self.done = threading.Event()
        self.epoch = ""
        self._thread = threading.Thread(target=self._run, name="failure-subscription", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for data in self._call:  # ends when the stream ends or is cancelled
                notice = wire.decode_failure_notice(data)
                if not self.ready.is_set():
                    self.epoch = notice.epoch
                    self.ready.set()
                    continue
                try:
                    self._callback(notice)
                except Exception:
                    log.exception("failure-notice callback raised")
        except grpc.RpcError as exc:
            self._report(f"failure subscription broke: {exc}")
        else:
            self._report("failure subscription ended: the manager server shut down")
        finally:
            self.done.set()

    def _report(self, msg: str) -> None:
        if not self._cancelled.is_set() and self._on_error is not None:
            self._on_error(ManagerUnavailableError(msg))

    def wait_ready(self, timeout: timedelta) -> bool:
        """Wait until the subscription is live; False if ``timeout`` passed first."""
        return self.ready.wait(_seconds("timeout", timeout))

    def cancel(self) -> None:
        """Stop receiving notices (waits at most 5 s for the reader thread)."""
        self._cancelled.set()
        self._call.cancel()
        self._thread.join(timeout=5.0)


class ManagerClient:
    """Talks to the manager server of this rank's replica group; thread-safe.

    ``connect_timeout``: how long an unreachable manager server is retried per call.
    """

    def __init__(self, addr: str, connect_timeout: timedelta = timedelta(seconds=10)) -> None:
        self._addr = normalize_address(addr)
        self._connect_s = _seconds("connect_timeout", connect_timeout)
        self._channel = grpc.insecure_channel(self._addr, options=CHANNEL_OPTIONS)
        base = f"/{wire.MANAGER_SERVICE}/"
        self._quorum = self._channel.unary_unary(base + "Quorum")
        self._metadata = self._channel.unary_unary(base + "CheckpointMetadata")
        self._commit = self._channel.unary_unary(base + "ShouldCommit")
        self._kill = self._channel.unary_unary(base + "Kill")
        self._watch = self._channel.unary_stream(base + "WatchFailures")

    def _call(
        self, method: grpc.UnaryUnaryMultiCallable, request: bytes, what: str, timeout: timedelta
    ) -> bytes:
        return call_with_retries(
            method,
            request,
            what=what,
            addr=self._addr,
            timeout_s=_seconds("timeout", timeout),
            connect_timeout_s=self._connect_s,
            unavailable=ManagerUnavailableError,
        )

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
        """Join this step's quorum; returns once every local rank asked and the
        lighthouse answered, or raises (every waiting rank at once) if it failed."""
        validate.check_step("group_rank", group_rank)
        validate.check_step("step", step)
        validate.check_step("commit_failures", commit_failures)
        request = wire.encode_manager_quorum_request(
            group_rank,
            step,
            checkpoint_metadata,
            shrink_only,
            init_sync,
            commit_failures,
            step_time_ms,
        )
        reply = self._call(self._quorum, request, f"quorum of group rank {group_rank}", timeout)
        return wire.decode_quorum_result(reply)

    def checkpoint_metadata(self, rank: int, timeout: timedelta) -> str:
        """The checkpoint metadata group rank ``rank`` sent with its last quorum."""
        validate.check_step("rank", rank)
        reply = self._call(
            self._metadata,
            wire.encode_checkpoint_metadata_request(rank),
            f"checkpoint metadata of rank {rank}",
            timeout,
        )
        return wire.decode_checkpoint_metadata_response(reply)

    def should_commit(
        self, group_rank: int, step: int, should_commit: bool, timeout: timedelta
    ) -> bool:
        """Vote for ``step``; returns True only if every local rank voted yes."""
        validate.check_step("group_rank", group_rank)
        validate.check_step("step", step)
        reply = self._call(
            self._commit,
            wire.encode_should_commit_request(group_rank, step, should_commit),
            f"commit vote of group rank {group_rank} for step {step}",
            timeout,
        )
        return wire.decode_should_commit_response(reply)

    def kill(self, msg: str, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Make the process hosting the manager server exit with status 1."""
        self._call(self._kill, wire.encode_kill_request(msg), "kill", timeout)

    def subscribe_failures(
        self,
        callback: Callable[[FailureNotice], None],
        group_rank: int = 0,
        on_error: Callable[[Exception], None] | None = None,
    ) -> FailureSubscription:
        """Call ``callback(notice)`` (on a background thread) whenever the lighthouse
        reports that members of our quorum died. ``on_error`` gets a
        ``ManagerUnavailableError`` if the stream breaks. ``cancel()`` the handle."""
        validate.check_step("group_rank", group_rank)
        call = self._watch(wire.encode_watch_failures_request(group_rank))
        return FailureSubscription(call, callback, on_error)

    def close(self) -> None:
        """Close the channel; later calls fail."""
        self._channel.close()

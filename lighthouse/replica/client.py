"""``ManagerClient``: a rank's blocking gRPC client of its replica group's manager server.

Every call has a deadline (a ``timedelta``). An unreachable manager server is
retried with backoff for up to ``connect_timeout``, then
``ManagerUnavailableError`` names the address; a deadline that passes gives
``QuorumTimeoutError``, a refused request ``QuorumRejectedError`` with the
server's reason (``lighthouse._calls``). Bad arguments raise ``ValueError`` /
``TypeError`` before anything is sent.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lighthouse import auth, services, validate, wire
from lighthouse._calls import call_with_retries
from lighthouse._grpc import grpc
from lighthouse._net import CHANNEL_OPTIONS, normalize_address, stub
from lighthouse.errors import ManagerUnavailableError
from lighthouse.tls import TlsConfig, resolve_tls
from lighthouse.types import FailureNotice, ManagerQuorumRequest, QuorumResult

__all__ = ["FailureSubscription", "ManagerClient"]

log = logging.getLogger("lighthouse.client")

# Most quorum_async calls one client runs at once, one worker thread each (the
# threads start on demand; a group's ranks sharing one client each need one).
_MAX_ASYNC_CALLS = 32


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
        return self.ready.wait(validate.timeout_seconds("timeout", timeout))

    def cancel(self) -> None:
        """Stop receiving notices (waits at most 5 s for the reader thread)."""
        self._cancelled.set()
        self._call.cancel()
        self._thread.join(timeout=5.0)


class ManagerClient:
    """Talks to the manager server of this rank's replica group; thread-safe.
    Implements ``ManagerClientProtocol``.

    ``connect_timeout``: how long an unreachable manager server is retried per call.
    ``job_secret``: the job's secret (default: from the environment, see
    ``lighthouse.auth``), sent with every call.
    ``tls``: verify the manager server's TLS certificate against this CA
    (default: from the environment, see ``lighthouse.tls``; none set: plaintext).
    """

    def __init__(
        self,
        addr: str,
        connect_timeout: timedelta = timedelta(seconds=10),
        *,
        job_secret: str | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self._addr = normalize_address(addr)
        self._connect_s = validate.timeout_seconds("connect_timeout", connect_timeout)
        self._channel = auth.sync_channel(
            self._addr,
            CHANNEL_OPTIONS,
            auth.resolve_job_secret(job_secret),
            tls_config=tls if tls is not None else resolve_tls(),
        )
        self._quorum = stub(self._channel, services.MANAGER_QUORUM)
        self._metadata = stub(self._channel, services.MANAGER_CHECKPOINT_METADATA)
        self._commit = stub(self._channel, services.MANAGER_SHOULD_COMMIT)
        self._kill = stub(self._channel, services.MANAGER_KILL)
        self._watch = stub(self._channel, services.MANAGER_WATCH_FAILURES)
        self._calls = concurrent.futures.ThreadPoolExecutor(
            max_workers=_MAX_ASYNC_CALLS, thread_name_prefix="manager-client"
        )

    def _call(
        self, method: grpc.UnaryUnaryMultiCallable, request: bytes, what: str, timeout: timedelta
    ) -> bytes:
        return call_with_retries(
            method,
            request,
            what=what,
            addr=self._addr,
            timeout_s=validate.timeout_seconds("timeout", timeout),
            connect_timeout_s=self._connect_s,
            unavailable=ManagerUnavailableError,
        )

    def quorum(self, request: ManagerQuorumRequest) -> QuorumResult:
        """Join this step's quorum; returns once every local rank asked and the
        lighthouse answered, or raises (every waiting rank at once) if it failed.
        Waits up to ``request.timeout``."""
        payload = wire.encode_manager_quorum_request(request)
        what = f"quorum of group rank {request.group_rank}"
        reply = self._call(self._quorum, payload, what, request.timeout)
        return wire.decode_quorum_result(reply)

    def quorum_async(
        self, request: ManagerQuorumRequest
    ) -> concurrent.futures.Future[QuorumResult]:
        """``quorum`` on a worker thread of this client (the future completes
        there). ``request`` is checked here, so a bad one raises at once."""
        validate.check_manager_quorum_request(request)
        return self._calls.submit(self.quorum, request)

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
        """Close the channel (a call in flight fails) and stop the worker threads;
        later calls fail."""
        self._calls.shutdown(wait=False)
        self._channel.close()

"""Blocking unary calls shared by the clients of both roles: a deadline per call,
retries while the server is unreachable, and one exception type per outcome.

A server that cannot be reached is retried with backoff (50 ms, x1.5, capped at
1 s) for up to the caller's connect timeout, then the caller's "unavailable"
error names the address. A deadline that passes gives ``QuorumTimeoutError``;
a refused request gives ``QuorumRejectedError`` with the server's reason.
"""

from __future__ import annotations

import time

from lighthouse._grpc import grpc
from lighthouse._net import BROKEN_CALL
from lighthouse.errors import (
    FaultToleranceError,
    LighthouseUnavailableError,
    QuorumRejectedError,
    QuorumTimeoutError,
)

__all__ = ["call_with_retries", "error_for_status"]

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


def error_for_status(
    code: grpc.StatusCode, details: str, *, what: str, addr: str, timeout_s: float
) -> FaultToleranceError | None:
    """The exception for a failed call, or None if the server was unreachable (retry).
    ``timeout_s`` is the call's deadline in seconds, quoted in a timeout's message."""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return QuorumTimeoutError(
            f"{what} to {addr}: no answer within {timeout_s:.3f} s ({details})"
        )
    if code in _REJECTED:
        return QuorumRejectedError(f"{what} refused by {addr}: {code.name}: {details}")
    if code == grpc.StatusCode.ABORTED:
        name, _, rest = details.partition(": ")
        return _FORWARDED.get(name, QuorumRejectedError)(f"{what} via {addr}: {rest or details}")
    if code not in BROKEN_CALL:
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
            code: grpc.StatusCode = exc.code()
            details: str = exc.details() or ""
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

"""Job authentication: the job secret every gRPC call of a job must present.

A job is closed to strangers by one shared secret, given to every process of
the job (the lighthouse, each manager server, each trainer): as an argument,
else in ``TORCHFT_JOB_SECRET``, else in the file named by
``TORCHFT_JOB_SECRET_FILE``. With a secret set, a server refuses every call
that does not carry it with UNAUTHENTICATED before the handler runs, so the
call changes nothing; clients add it to every call. With none set (the
default, for a job on one machine), calls are not checked.

The secret travels as call metadata in clear text unless the channel uses
TLS: it keeps out anyone who can reach the ports, not anyone who can read the
network between the job's hosts.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

__all__ = [
    "HTTP_HEADER",
    "METADATA_KEY",
    "MIN_SECRET_LENGTH",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "call_metadata",
    "guard",
    "header_presents",
    "presents",
    "resolve_job_secret",
    "sync_channel",
]

SECRET_ENV = "TORCHFT_JOB_SECRET"
SECRET_FILE_ENV = "TORCHFT_JOB_SECRET_FILE"
METADATA_KEY = "x-torchft-job-secret"  # gRPC metadata keys are lower case
HTTP_HEADER = "X-Torchft-Job-Secret"  # the same secret on the job's HTTP endpoints
MIN_SECRET_LENGTH = 16


def resolve_job_secret(secret: str | None = None) -> str | None:
    """The job secret: `secret`, else ``$TORCHFT_JOB_SECRET``, else the contents of the
    file ``$TORCHFT_JOB_SECRET_FILE`` (surrounding whitespace stripped); None if unset.

    ``ValueError`` naming the source if the secret is shorter than 16 characters.
    """
    source = "job_secret"
    if secret is None:
        secret, source = os.environ.get(SECRET_ENV) or None, SECRET_ENV
    if secret is None and os.environ.get(SECRET_FILE_ENV):
        path = os.environ[SECRET_FILE_ENV]
        with open(path, encoding="utf-8") as f:
            secret, source = f.read().strip(), f"the file {path} (${SECRET_FILE_ENV})"
    if secret is None:
        return None
    if not isinstance(secret, str):
        raise TypeError(f"job_secret must be a str or None, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_LENGTH:
        raise ValueError(
            f"the job secret from {source} must be at least {MIN_SECRET_LENGTH} characters, "
            f"got {len(secret)}"
        )
    return secret


def presents(metadata: Sequence[tuple[str, Any]] | None, secret: str) -> bool:
    """Whether call `metadata` carries `secret` (compared in constant time)."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            given = value.encode() if isinstance(value, str) else bytes(value)
            return hmac.compare_digest(given, secret.encode())
    return False


def header_presents(value: str | None, secret: str) -> bool:
    """Whether an HTTP request's ``X-Torchft-Job-Secret`` header `value` is `secret`."""
    return value is not None and hmac.compare_digest(value.encode(), secret.encode())


def guard(
    handler: Callable[[Any, Any], Awaitable[Any]], secret: str | None, what: str
) -> Callable[[Any, Any], Awaitable[Any]]:
    """`handler` (an asyncio gRPC handler) that first refuses calls without `secret`.

    The refusal is UNAUTHENTICATED and names `what` (the method), never the secret.
    """
    if secret is None:
        return handler

    async def checked(request: Any, context: Any) -> Any:
        if not presents(context.invocation_metadata(), secret):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{what}: this job requires its job secret ({SECRET_ENV})",
            )
        return await handler(request, context)

    return checked


def call_metadata(secret: str | None) -> tuple[tuple[str, str], ...] | None:
    """The metadata to pass to one call so it carries `secret` (None without one)."""
    return None if secret is None else ((METADATA_KEY, secret),)


def _with_secret(metadata: Any, secret: str) -> list[tuple[str, Any]]:
    return [*(metadata or ()), (METADATA_KEY, secret)]


class _SyncDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, secret: str) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = _with_secret(base.metadata, secret)
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


class _SyncSecret(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, secret: str) -> None:
        self._secret = secret

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_SyncDetails(details, self._secret), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_SyncDetails(details, self._secret), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_SyncDetails(details, self._secret), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_SyncDetails(details, self._secret), requests)


def sync_channel(addr: str, options: Any, secret: str | None) -> grpc.Channel:
    """A blocking channel to `addr` whose every call carries `secret` (if any)."""
    channel = grpc.insecure_channel(addr, options=options)
    if secret is None:
        return channel
    return grpc.intercept_channel(channel, _SyncSecret(secret))

"""Job authentication: the job secret every gRPC call of a job must present.

A job is closed to strangers by one shared secret, given to every process of
the job (the lighthouse, each manager server, each trainer): as an argument,
else in ``TORCHFT_JOB_SECRET``, else in the file named by
``TORCHFT_JOB_SECRET_FILE``. With a secret set, a server refuses every call
that does not carry it with UNAUTHENTICATED before the handler runs, so the
call changes nothing; clients add it to every call. With none set (the
default, for a job on one machine), calls are not checked.

The secret travels as call metadata in clear text unless the job turns TLS
on (``lighthouse.tls``): without TLS it keeps out anyone who can reach the
ports, not anyone who can read the network between the job's hosts.

Within the job, each incarnation of a manager server also sends a random
incarnation token (``new_incarnation``, under ``INCARNATION_KEY``) with its
lighthouse calls, so only the incarnation that owns a replica id can ask,
ping or leave under it (``lighthouse.coordinator.incarnations``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from lighthouse import tls
from lighthouse._grpc import grpc

__all__ = [
    "HTTP_HEADER",
    "INCARNATION_KEY",
    "JOB_ID_ENV",
    "JOB_ID_KEY",
    "METADATA_KEY",
    "MIN_SECRET_LENGTH",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "call_metadata",
    "check_incarnation",
    "exposure_warning",
    "guard",
    "header_presents",
    "incarnation_of",
    "new_incarnation",
    "presents",
    "resolve_job_id",
    "resolve_job_secret",
    "sync_channel",
    "warn_if_exposed",
]

JOB_ID_ENV = "TORCHFT_JOB_ID"
JOB_ID_KEY = "x-torchft-job-id"
SECRET_ENV = "TORCHFT_JOB_SECRET"
SECRET_FILE_ENV = "TORCHFT_JOB_SECRET_FILE"
METADATA_KEY = "x-torchft-job-secret"  # gRPC metadata keys are lower case
HTTP_HEADER = "X-Torchft-Job-Secret"  # the same secret on the job's HTTP endpoints
MIN_SECRET_LENGTH = 16
# The token of the incarnation that owns a call's replica id (see new_incarnation).
INCARNATION_KEY = "x-torchft-incarnation"
MIN_INCARNATION_LENGTH = 16  # characters; new_incarnation() gives 32
MAX_INCARNATION_LENGTH = 128  # characters
_INCARNATION = re.compile(r"[A-Za-z0-9_-]+")


def new_incarnation() -> str:
    """A fresh random incarnation token (32 hex characters, 128 bits): one per manager
    server incarnation, sent with every lighthouse call under its replica id so the
    lighthouse refuses that id to anyone else (``lighthouse.coordinator.incarnations``)."""
    return secrets.token_hex(16)


def check_incarnation(token: str) -> str:
    """`token` if it is an incarnation token: a str of 16 to 128 characters from
    ``[A-Za-z0-9_-]``. ``ValueError`` (``TypeError`` for a non-str) naming it otherwise."""
    if not isinstance(token, str):
        raise TypeError(f"an incarnation token must be a str, got {type(token).__name__}")
    if not (
        MIN_INCARNATION_LENGTH <= len(token) <= MAX_INCARNATION_LENGTH
        and _INCARNATION.fullmatch(token)
    ):
        raise ValueError(
            f"an incarnation token must be {MIN_INCARNATION_LENGTH} to "
            f"{MAX_INCARNATION_LENGTH} characters from [A-Za-z0-9_-], got {token!r:.160}"
        )
    return token


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


_warned_exposed: set[str] = set()


def exposure_warning(what: str, bind_host: str, secret: str | None) -> str | None:
    """What to warn about when `what` listens on `bind_host` without a job secret, or None.

    Loopback binds (``127.0.0.0/8``, ``::1``, ``localhost``) and servers with a
    secret are not exposed; any other bind (a wildcard, an interface's address,
    a host name) may be reached from other machines, and without a secret
    anyone who reaches it may join, read, poison or stop the job. The servers
    still start: a multi-machine job needs such binds, and the secret is the
    operator's to set.
    """
    if secret is not None:
        return None
    host = bind_host.strip("[]")
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to any interface
    return (
        f"{what} listens on {bind_host or '*'} with no job secret: anyone who can reach it "
        f"can join, read or stop this job. Set {SECRET_ENV} (or {SECRET_FILE_ENV}) in every "
        "process of the job, or bind to 127.0.0.1 for a job on one machine "
        "(docs/security.md)"
    )


def warn_if_exposed(log: logging.Logger, what: str, bind_host: str, secret: str | None) -> None:
    """Log `exposure_warning` once per process and kind of server (`what`)."""
    warning = exposure_warning(what, bind_host, secret)
    if warning is not None and what not in _warned_exposed:
        _warned_exposed.add(what)
        log.warning(warning)


def resolve_job_id(job_id: str | None = None) -> str | None:
    """The job id: `job_id`, else ``$TORCHFT_JOB_ID``; None if unset.

    A lighthouse with a job id refuses calls for another job (or for none), so
    two jobs pointed at one lighthouse by mistake never merge into one quorum.
    """
    if job_id is None:
        job_id = os.environ.get(JOB_ID_ENV) or None
    if job_id is not None and (not isinstance(job_id, str) or not 0 < len(job_id) <= 128):
        raise ValueError(f"job id must be a str of 1 to 128 characters, got {job_id!r:.140}")
    return job_id


def _metadata_value(metadata: Sequence[tuple[str, Any]] | None, key: str) -> str | None:
    for k, value in metadata or ():
        if k == key:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


def incarnation_of(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The incarnation token call `metadata` carries, or None if it carries none."""
    return _metadata_value(metadata, INCARNATION_KEY)


def presents(metadata: Sequence[tuple[str, Any]] | None, secret: str) -> bool:
    """Whether call `metadata` carries `secret` (compared in constant time)."""
    return header_presents(_metadata_value(metadata, METADATA_KEY), secret)


def header_presents(value: str | None, secret: str) -> bool:
    """Whether `value` (an HTTP ``X-Torchft-Job-Secret`` header, or the secret's call
    metadata) is `secret`, compared in constant time."""
    return value is not None and hmac.compare_digest(value.encode(), secret.encode())


def guard(
    handler: Callable[[Any, Any], Awaitable[Any]],
    secret: str | None,
    what: str,
    job_id: str | None = None,
    admitted: Callable[[Any], None] | None = None,
) -> Callable[[Any, Any], Awaitable[Any]]:
    """`handler` (an asyncio gRPC handler) that first refuses calls without `secret`
    (UNAUTHENTICATED) and, if `job_id` is set, calls for another job or for none
    (FAILED_PRECONDITION). Refusals name `what` (the method), never the secret.
    ``admitted(context)``, if given, hears of every call that passes: its
    connection authenticated (``lighthouse._conn_guard``).
    """
    if secret is None and job_id is None:
        if admitted is None:
            return handler

        async def recorded(request: Any, context: Any) -> Any:
            admitted(context)
            return await handler(request, context)

        return recorded

    async def checked(request: Any, context: Any) -> Any:
        metadata = context.invocation_metadata()
        if secret is not None and not presents(metadata, secret):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{what}: this job requires its job secret ({SECRET_ENV})",
            )
        if job_id is not None:
            theirs = _metadata_value(metadata, JOB_ID_KEY)
            if theirs != job_id:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{what}: this lighthouse serves job {job_id!r}, the call is for "
                    + (f"job {theirs!r}" if theirs else f"no job (set {JOB_ID_ENV})"),
                )
        if admitted is not None:
            admitted(context)
        return await handler(request, context)

    return checked


def call_metadata(
    secret: str | None, job_id: str | None = None, incarnation: str | None = None
) -> tuple[tuple[str, str], ...] | None:
    """The metadata that makes one call carry `secret`, `job_id` and the `incarnation`
    token, each only if set (None: none of them)."""
    pairs = []
    if secret is not None:
        pairs.append((METADATA_KEY, secret))
    if job_id is not None:
        pairs.append((JOB_ID_KEY, job_id))
    if incarnation is not None:
        pairs.append((INCARNATION_KEY, incarnation))
    return tuple(pairs) or None


def _with_extra(metadata: Any, extra: tuple[tuple[str, str], ...]) -> list[tuple[str, Any]]:
    return [*(metadata or ()), *extra]


class _SyncDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, extra: tuple[tuple[str, str], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = _with_extra(base.metadata, extra)
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


class _SyncMetadata(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, extra: tuple[tuple[str, str], ...]) -> None:
        self._extra = extra  # appended to every call's metadata

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_SyncDetails(details, self._extra), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_SyncDetails(details, self._extra), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_SyncDetails(details, self._extra), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_SyncDetails(details, self._extra), requests)


def sync_channel(
    addr: str,
    options: Any,
    secret: str | None,
    job_id: str | None = None,
    tls_config: tls.TlsConfig | None = None,
    incarnation: str | None = None,
) -> grpc.Channel:
    """A blocking channel to `addr` whose every call carries `secret`, `job_id` and the
    `incarnation` token (each if set), over TLS verified against `tls_config`'s CA if
    given (see ``lighthouse.tls``)."""
    if tls_config is None:
        channel = grpc.insecure_channel(addr, options=options)
    else:
        channel = grpc.secure_channel(
            addr,
            tls.channel_credentials(tls_config),
            options=[*options, *tls.channel_options(tls_config)],
        )
    extra = call_metadata(secret, job_id, incarnation)
    if extra is None:
        return channel
    return grpc.intercept_channel(channel, _SyncMetadata(extra))

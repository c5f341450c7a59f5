"""Network helpers shared by both roles: addresses, gRPC channel and server options,
binding a gRPC server and building client stubs from the method table.

Every address is ``host:port`` (``[v6]:port`` for IPv6 literals); clients also
accept torchft's ``http://host:port``.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Mapping
from typing import Any

from lighthouse import auth, services, tls, validate
from lighthouse._conn_guard import ConnectionGuard
from lighthouse._grpc import grpc
from lighthouse.connection_policy import ConnectionLimits

__all__ = [
    "BROKEN_CALL",
    "CHANNEL_OPTIONS",
    "advertised_host",
    "bind_server",
    "connection_error",
    "grpc_server_options",
    "join_host_port",
    "method_handlers",
    "normalize_address",
    "split_host_port",
    "stub",
]

_WILDCARDS = ("", "0.0.0.0", "::", "[::]")

#: Options of every client channel: a 256 MiB receive limit, reconnect backoff
#: from 50 ms up to 1 s, and no gRPC-level retries (callers retry themselves).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]

#: Status codes that say a call broke on its way (the server is gone or going, or
#: the connection under a stream died), not that a server answered it: callers
#: retry these while their connect timeout lasts. gRPC's Python client reports an
#: operation on a stream whose connection has already died (a lighthouse that was
#: restarted under a quorum stream) as INTERNAL "Internal error from Core"; our
#: servers never send INTERNAL themselves.
BROKEN_CALL = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL}
)


def normalize_address(addr: str) -> str:
    """Accept ``host:port`` and torchft's ``http://host:port``; return ``host:port``."""
    for prefix in ("http://", "grpc://"):
        if addr.startswith(prefix):
            addr = addr[len(prefix) :]
    addr = addr.rstrip("/")
    if not addr or ":" not in addr:
        raise ValueError(f"address must be 'host:port', got {addr!r}")
    return addr


def normalize_addresses(addrs: str) -> tuple[str, ...]:
    """A comma-separated list of addresses (each as `normalize_address` accepts),
    in order, e.g. a lighthouse and its standby."""
    parts = [part.strip() for part in addrs.split(",")]
    if not all(parts):
        raise ValueError(f"addresses must be 'host:port' separated by commas, got {addrs!r}")
    return tuple(normalize_address(part) for part in parts)


def split_host_port(addr: str, what: str = "address") -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host without brackets, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} must be 'host:port' or '[v6]:port', got {addr!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """Inverse of ``split_host_port`` (brackets IPv6 literals)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised_host(bind_host: str, hostname: str | None) -> str:
    """``hostname`` if given, else the bind host, else (wildcard bind) the machine's name."""
    if hostname:
        return hostname
    if bind_host not in _WILDCARDS:
        return bind_host
    return socket.gethostname()


def grpc_server_options(
    keepalive_ms: int, limits: ConnectionLimits | None = None
) -> list[tuple[str, Any]]:
    """Options shared by both servers: size limit, no port sharing, keepalive pings
    every ``keepalive_ms`` milliseconds so a silent peer's calls end.

    With ``limits``: at most ``limits.max_connections`` connections at once (one
    past it is closed on arrival, before it costs more than its accept), and a
    connection that has not finished gRPC's handshake (HTTP/2 preface, TLS) within
    ``limits.unauthenticated_timeout_s`` seconds is closed.
    """
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", validate.MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", keepalive_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ]
    if limits is not None:
        options += [
            ("grpc.max_allowed_incoming_connections", limits.max_connections),
            (
                "grpc.server_handshake_timeout_ms",
                max(1, round(limits.unauthenticated_timeout_s * 1000)),
            ),
        ]
    return options


def method_handlers(
    service: str,
    handlers: Mapping[str, Callable[..., Any]],
    secret: str | None = None,
    job_id: str | None = None,
    admitted: Callable[[Any], None] | None = None,
) -> grpc.GenericRpcHandler:
    """Serve ``handlers`` (method name -> raw-bytes handler) as ``service``, each with
    the shape the method table (``lighthouse.services``) gives it.

    ``ValueError`` unless ``handlers`` names exactly the service's methods, so a
    server can neither miss an RPC nor serve one the proto does not declare.
    With a job ``secret`` every method first refuses calls without it
    (UNAUTHENTICATED; see ``lighthouse.auth``), and with a ``job_id`` calls
    for another job (FAILED_PRECONDITION); ``admitted(context)`` hears of
    every call that passes.
    """
    methods = {m.name: m for m in services.SERVICES[service]}
    if set(handlers) != set(methods):
        raise ValueError(
            f"handlers for {service} must be exactly {sorted(methods)}, got {sorted(handlers)}"
        )
    table = {
        name: getattr(grpc, f"{methods[name].shape}_rpc_method_handler")(
            auth.guard(fn, secret, f"{service.rsplit('.', 1)[-1]}.{name}", job_id, admitted)
        )
        for name, fn in handlers.items()
    }
    return grpc.method_handlers_generic_handler(service, table)


def _why_cannot_bind(bind: str) -> str:
    """Why a plain socket cannot bind `bind` either, in words (what gRPC does not say)."""
    try:
        host, port = split_host_port(bind, "bind")
    except ValueError as e:
        return str(e)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host if host not in ("", "*") else "", port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"port {port} is in use (another lighthouse or server already runs there); choose another port"
        if e.errno == errno.EADDRNOTAVAIL:
            return f"{host!r} is not an address of this machine"
        return str(e)
    return "gRPC could not bind it (run with GRPC_VERBOSITY=debug for its reason)"


def bind_server(
    service: str,
    handlers: Mapping[str, Callable[..., Any]],
    bind: str,
    *,
    keepalive_ms: int,
    what: str,
    secret: str | None = None,
    job_id: str | None = None,
    tls_config: tls.TlsConfig | None = None,
    conn_guard: ConnectionGuard | None = None,
) -> tuple[grpc.aio.Server, int]:
    """An asyncio gRPC server serving ``service`` and bound to ``bind``, not yet
    started; returns it and the bound port. Call on the event loop that will run
    it. ``OSError`` naming ``what`` if the address cannot be bound.

    With ``tls_config`` the port serves TLS only (``lighthouse.tls``): a
    plaintext client's connection is closed during the handshake, before any
    call reaches a handler. ``ValueError`` if it has no certificate and key.

    With ``conn_guard`` the server holds at most its ``max_connections``, and
    the guard, watching the bound port from here on, closes connections that
    never authenticate (``lighthouse.connection_policy``); the caller stops it
    with the server.
    """
    credentials = None if tls_config is None else tls.server_credentials(tls_config, what)
    limits = None if conn_guard is None else conn_guard.limits
    server = grpc.aio.server(options=grpc_server_options(keepalive_ms, limits))
    admitted = None if conn_guard is None or not conn_guard.enforced else conn_guard.admitted
    server.add_generic_rpc_handlers((method_handlers(service, handlers, secret, job_id, admitted),))
    try:
        port: int = (
            server.add_insecure_port(bind)
            if credentials is None
            else server.add_secure_port(bind, credentials)
        )
    except RuntimeError:  # grpcio raises "Failed to bind to address ..." instead of a 0
        port = 0
    if port == 0:
        raise OSError(f"{what} cannot listen on {bind!r}: {_why_cannot_bind(bind)}")
    if conn_guard is not None:
        conn_guard.watch(port)
    return server, port


def stub(channel: Any, method: services.Method) -> Any:
    """The client callable for ``method`` on ``channel`` (blocking or asyncio),
    built with the shape the method table gives it."""
    return getattr(channel, method.shape)(method.path)


# A method no server serves: calling it reads a channel's last connection error.
_PROBE_METHOD = "/torchft_pg.LighthouseService/ConnectionProbe"


async def connection_error(channel: Any, timeout_s: float = 1.0) -> str:
    """An asyncio channel's last connection error (a refused connection, a failed
    TLS handshake), or "" if it does not say within `timeout_s` seconds.

    Asked with a call to a method no server serves (so it never reaches a
    handler): on a channel that cannot connect it fails at once with that
    error; one that connected meanwhile answers UNIMPLEMENTED.
    """
    probe = channel.unary_unary(_PROBE_METHOD)
    try:
        await probe(b"", timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return exc.details() or ""
    return ""

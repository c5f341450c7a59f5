"""Optional TLS for every connection of a job: gRPC (lighthouse, manager servers and
their clients) and the checkpoint HTTP servers that heals fetch from.

Configured like the job secret (``lighthouse.auth``): each of the certificate,
its private key and the CA bundle comes from an argument, else from
``TORCHFT_TLS_CERT``, ``TORCHFT_TLS_KEY``, ``TORCHFT_TLS_CA`` (PEM file
paths). With none of the three set, TLS is off and every connection is plain,
exactly as without this module.

* A server (lighthouse, manager server, checkpoint server) needs the
  certificate and its key. The certificate must name the host clients dial:
  a subjectAltName with each host's IP address or DNS name (or one name for
  the whole job, see ``TORCHFT_TLS_SERVER_NAME`` below).
* A client verifies the server's certificate against the CA bundle, and the
  host name it dials against the certificate's names. Without a CA bundle,
  the certificate itself is the trust root: one self-signed certificate
  shared by every process of a job is enough.
* ``TORCHFT_TLS_SERVER_NAME`` (optional): the name clients expect in server
  certificates instead of the host they dial, for a job certificate that
  carries one shared name rather than every host's address.

Clients are not authenticated by certificate; the job secret does that, and
with TLS it no longer crosses the network in clear text.
"""

from __future__ import annotations

import http.client
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from lighthouse._grpc import grpc

__all__ = [
    "CA_ENV",
    "CERT_ENV",
    "KEY_ENV",
    "SERVER_NAME_ENV",
    "TlsConfig",
    "channel_credentials",
    "channel_options",
    "client_ssl_context",
    "https_connection",
    "resolve_tls",
    "server_credentials",
    "server_ssl_context",
]

CERT_ENV = "TORCHFT_TLS_CERT"
KEY_ENV = "TORCHFT_TLS_KEY"
CA_ENV = "TORCHFT_TLS_CA"
SERVER_NAME_ENV = "TORCHFT_TLS_SERVER_NAME"


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    """A job's TLS files, read and checked once (``resolve_tls``).

    ``cert``/``key``: the server certificate chain and its private key (None
    for a process that is only a client); ``ca``: the trust root clients verify
    servers with (None: ``cert`` is its own root). ``*_pem``: the files' bytes,
    as gRPC takes them. ``server_name``: the name clients expect in a server's
    certificate instead of the host dialled (None: the host).
    """

    cert: Path | None
    key: Path | None
    ca: Path | None
    cert_pem: bytes | None = field(repr=False)
    key_pem: bytes | None = field(repr=False)
    ca_pem: bytes = field(repr=False)
    server_name: str | None = None

    @property
    def can_serve(self) -> bool:
        """Whether this process has a certificate and key to serve with."""
        return self.cert is not None and self.key is not None

    def describe(self) -> str:
        """The files, for error messages (never their contents)."""
        root = f"CA {self.ca}" if self.ca is not None else f"self-signed {self.cert}"
        return f"TLS ({root})"


def _pick(value: str | os.PathLike[str] | None, env: str, what: str) -> tuple[Path | None, str]:
    if value is not None:
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{what} must be a path or None, got {type(value).__name__}")
        return Path(value), what
    from_env = os.environ.get(env) or None
    return (Path(from_env), f"${env}") if from_env else (None, what)


def _read(path: Path, source: str, kind: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(
            f"cannot read the TLS {kind} {str(path)!r} (from {source}): {exc.strerror}"
        ) from exc
    if b"-----BEGIN " not in data:
        raise ValueError(
            f"the TLS {kind} {str(path)!r} (from {source}) must be a PEM file, "
            f"got {len(data)} bytes without a '-----BEGIN' line"
        )
    return data


def resolve_tls(
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
    ca: str | os.PathLike[str] | None = None,
    server_name: str | None = None,
) -> TlsConfig | None:
    """The job's TLS configuration: each argument, else its environment variable
    (``TORCHFT_TLS_CERT``, ``TORCHFT_TLS_KEY``, ``TORCHFT_TLS_CA``,
    ``TORCHFT_TLS_SERVER_NAME``); None (TLS off) when no file is set.

    ``ValueError`` naming the file and where it came from if a file is
    unreadable or not PEM, if only one of certificate and key is set, or if
    the key does not belong to the certificate.
    """
    cert_path, cert_src = _pick(cert, CERT_ENV, "tls_cert")
    key_path, key_src = _pick(key, KEY_ENV, "tls_key")
    ca_path, ca_src = _pick(ca, CA_ENV, "tls_ca")
    if server_name is None:
        server_name = os.environ.get(SERVER_NAME_ENV) or None
    if cert_path is None and key_path is None and ca_path is None:
        if server_name is not None:
            raise ValueError(
                f"a TLS server name ({server_name!r}) needs TLS files: set {CA_ENV}, or "
                f"{CERT_ENV} and {KEY_ENV}"
            )
        return None
    if (cert_path is None) != (key_path is None):
        given, missing = (cert_src, KEY_ENV) if key_path is None else (key_src, CERT_ENV)
        raise ValueError(
            f"TLS needs a certificate and its key together: {given} is set but {missing} "
            "(or its argument) is not"
        )
    cert_pem = None if cert_path is None else _read(cert_path, cert_src, "certificate")
    key_pem = None if key_path is None else _read(key_path, key_src, "private key")
    if cert_path is not None and key_path is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_path, key_path)
        except ssl.SSLError as exc:
            raise ValueError(
                f"the TLS key {str(key_path)!r} (from {key_src}) does not fit the certificate "
                f"{str(cert_path)!r} (from {cert_src}): {exc.reason or exc}"
            ) from exc
    if ca_path is not None:
        ca_pem = _read(ca_path, ca_src, "CA bundle")
    else:
        assert cert_pem is not None  # no CA and no certificate returned None above
        ca_pem = cert_pem
    if server_name is not None and not (isinstance(server_name, str) and server_name.strip()):
        raise ValueError(f"the TLS server name must be a non-empty host name, got {server_name!r}")
    return TlsConfig(
        cert=cert_path,
        key=key_path,
        ca=ca_path,
        cert_pem=cert_pem,
        key_pem=key_pem,
        ca_pem=ca_pem,
        server_name=server_name,
    )


def _serving(tls: TlsConfig, what: str) -> tuple[bytes, bytes]:
    if tls.cert_pem is None or tls.key_pem is None:
        raise ValueError(
            f"{what} serves TLS and needs a certificate and key ({CERT_ENV}, {KEY_ENV}); "
            f"only a CA bundle is set ({tls.ca})"
        )
    return tls.cert_pem, tls.key_pem


def server_credentials(tls: TlsConfig, what: str) -> grpc.ServerCredentials:
    """Credentials for a gRPC server named ``what``; ``ValueError`` without a certificate."""
    cert_pem, key_pem = _serving(tls, what)
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Credentials for a gRPC channel that verifies the server against the CA."""
    return grpc.ssl_channel_credentials(root_certificates=tls.ca_pem)


def channel_options(tls: TlsConfig | None) -> list[tuple[str, str]]:
    """Extra gRPC channel options: the expected certificate name, if overridden."""
    if tls is None or tls.server_name is None:
        return []
    return [("grpc.ssl_target_name_override", tls.server_name)]


def server_ssl_context(tls: TlsConfig, what: str) -> ssl.SSLContext:
    """An ``SSLContext`` for an HTTP server named ``what`` (TLS 1.2 or later)."""
    _serving(tls, what)
    assert tls.cert is not None and tls.key is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    return context


def client_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """An ``SSLContext`` for HTTP clients: verifies the server against the CA and
    its certificate's names against the host dialled (or ``server_name``)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=tls.ca_pem.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that checks the certificate for ``expected_name``
    instead of the host it dials."""

    def __init__(
        self, host: str, port: int, *, timeout: float, context: ssl.SSLContext, expected_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._expected_name = expected_name
        self._tls_context = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._expected_name)


def https_connection(
    host: str, port: int, timeout_s: float, tls: TlsConfig, context: ssl.SSLContext
) -> http.client.HTTPSConnection:
    """An HTTPS connection to ``host:port`` (socket timeout ``timeout_s`` seconds)
    with ``context`` (``client_ssl_context(tls)``), expecting ``tls.server_name``
    in the certificate if set."""
    if tls.server_name is None:
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    return _NamedHTTPSConnection(
        host, port, timeout=timeout_s, context=context, expected_name=tls.server_name
    )

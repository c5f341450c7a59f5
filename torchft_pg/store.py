"""Store addresses (`host:port/prefix`) and the TCPStore clients behind them.

Every `configure` gets a fresh address such as ``127.0.0.1:29500/torchft/e1/3/0``;
`create_store_client` turns it into a ``PrefixStore(prefix, TCPStore(host, port))``.

One TCPStore client connection is kept per store server (host, port) and shared
by every prefix: opening a new TCP connection per configure costs a connect
handshake each time and, on these machines, about 1 in 30 fresh connects stalls
for ~5 s. A cached client whose server went away is detected (one round trip)
and replaced.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import timedelta

from torch.distributed import PrefixStore, Store, TCPStore

__all__ = ["StoreAddress", "create_store_client", "parse_store_address"]

_DEFAULT_TIMEOUT = timedelta(seconds=60)
# host:port/prefix where host is a name, an IPv4 literal or a bracketed IPv6 literal.
_ADDRESS = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>\d+)(?:/(?P<prefix>.*))?$"
)


@dataclass(frozen=True)
class StoreAddress:
    """A parsed store address: the TCPStore server and the key prefix inside it."""

    host: str
    port: int
    prefix: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}/{self.prefix}"


def parse_store_address(store_addr: str) -> StoreAddress:
    """Parse ``host:port/prefix`` (``[::1]:29500/p`` for IPv6 literals).

    A bare IPv6 address must be bracketed, because its colons would be ambiguous
    with the port separator. Raises ValueError naming the address otherwise.
    """
    if not isinstance(store_addr, str):
        raise TypeError(f"store address must be a str 'host:port/prefix', got {store_addr!r}")
    match = _ADDRESS.match(store_addr.strip())
    if match is None:
        raise ValueError(
            f"store address must be 'host:port/prefix' (IPv6 as '[::1]:port/prefix'), "
            f"got {store_addr!r}"
        )
    port = int(match["port"])
    if not 0 < port < 65536:
        raise ValueError(f"store address port must be in [1, 65535], got {port} in {store_addr!r}")
    host = match["v6"] or match["host"]
    return StoreAddress(host=host, port=port, prefix=match["prefix"] or "")


class _ClientCache:
    """One live TCPStore client per (host, port), shared across prefixes and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, int], TCPStore] = {}

    def get(self, host: str, port: int, timeout: timedelta) -> TCPStore:
        key = (host, port)
        with self._lock:
            client = self._clients.get(key)
            if client is not None and _alive(client):
                client.set_timeout(timeout)
                return client
            self._clients.pop(key, None)
        # Connect outside the lock: a connect can take up to `timeout`.
        client = TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
        with self._lock:
            self._clients[key] = client
        return client


def _alive(client: TCPStore) -> bool:
    try:
        client.check([])  # one round trip; raises if the server or connection is gone
    except Exception:
        return False
    return True


_CACHE = _ClientCache()


def create_store_client(store_addr: str, timeout: timedelta = _DEFAULT_TIMEOUT) -> Store:
    """Return ``PrefixStore(prefix, TCPStore client)`` for a ``host:port/prefix`` address.

    `timeout` bounds the connect and every store operation (default 60 s).
    Raises ValueError for a malformed address and the store's own error
    (a RuntimeError) when the server cannot be reached within `timeout`.
    """
    addr = parse_store_address(store_addr)
    if timeout <= timedelta(0):
        raise ValueError(f"timeout must be positive, got {timeout}")
    client = _CACHE.get(addr.host, addr.port, timeout)
    return PrefixStore(addr.prefix, client)

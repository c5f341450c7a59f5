"""Store addresses (`host:port/prefix`) and the TCPStore clients behind them.

Every `configure` gets a fresh address such as ``127.0.0.1:29500/torchft/e1/3/0``;
`create_store_client` turns it into a ``PrefixStore(prefix, TCPStore(host, port))``.

Store clients are pooled per store server (host, port) and reused across
prefixes: opening a new TCP connection per configure costs a connect handshake
each time and, on these machines, about 1 in 30 fresh connects stalls for ~5 s.
A pooled client is lent to one group at a time (see `_ClientPool`); one whose
server went away is detected (one round trip) and replaced.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass
from datetime import timedelta

from torch.distributed import PrefixStore, Store, TCPStore

__all__ = [
    "BorrowedStore",
    "StoreAddress",
    "borrow_store_client",
    "create_store_client",
    "parse_store_address",
]

_DEFAULT_TIMEOUT = timedelta(seconds=60)
_FORMS = (
    "'host:port/prefix' (an IPv6 host as '[::1]:port/prefix', or unbracketed as "
    "'::1:port/prefix', where the field after the last colon is the port)"
)


def _split_host_port(hostport: str, store_addr: str) -> tuple[str, str]:
    """``host:port`` → (bare host, port text); ValueError naming `store_addr` otherwise.

    A bracketed host must be a whole IPv6 literal followed by ``:port``. An
    unbracketed host is everything before the last colon, and when it has
    colons itself it must be an IPv6 literal (torchft reads bare IPv6 hosts the
    same way; a name or an IPv4 literal never has a colon).
    """
    if hostport.startswith("["):
        host, sep, port = hostport[1:].partition("]:")
        if not sep or "[" in host or "]" in host or not _is_ipv6(host):
            raise ValueError(f"store address must be {_FORMS}, got {store_addr!r}")
        return host, port
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or "[" in host or "]" in host or (":" in host and not _is_ipv6(host)):
        raise ValueError(f"store address must be {_FORMS}, got {store_addr!r}")
    return host, port


def _is_ipv6(host: str) -> bool:
    """Whether `host` is an IPv6 literal, optionally with a zone (``fe80::1%eth0``)."""
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True)
class StoreAddress:
    """A parsed store address: the TCPStore server (`host`, `port`) and the key
    `prefix` inside it. `host` is bare (an IPv6 literal without brackets).

    Parse text once with `StoreAddress.parse` (or `parse_store_address`) and
    pass this object on: every user of an address reads these fields instead
    of splitting the string again.
    """

    host: str
    port: int
    prefix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host or "/" in self.host:
            raise ValueError(
                f"store host must be a non-empty name or IP literal, got {self.host!r}"
            )
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise TypeError(f"store port must be an int, got {self.port!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"store port must be in [1, 65535], got {self.port}")
        if not isinstance(self.prefix, str):
            raise TypeError(f"store prefix must be a str, got {self.prefix!r}")

    @classmethod
    def parse(cls, store_addr: str) -> StoreAddress:
        """Parse ``host:port/prefix``; an IPv6 host as ``[::1]:29500/p`` or ``::1:29500/p``.

        The prefix is everything after the first ``/``. Unbracketed, the field
        after the last colon is the port, so ``::1:1234/p`` is host ``::1``,
        port 1234 (as torchft reads it); a host with colons must then be an
        IPv6 literal. Raises TypeError for a non-string and ValueError naming
        the address otherwise.
        """
        if not isinstance(store_addr, str):
            raise TypeError(f"store address must be a str 'host:port/prefix', got {store_addr!r}")
        hostport, _, prefix = store_addr.strip().partition("/")
        host, port_text = _split_host_port(hostport, store_addr)
        if not port_text.isascii() or not port_text.isdigit():
            raise ValueError(f"store address must be {_FORMS}, got {store_addr!r}")
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError(
                f"store address port must be in [1, 65535], got {port} in {store_addr!r}"
            )
        return cls(host=host, port=port, prefix=prefix)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}/{self.prefix}"


def parse_store_address(store_addr: str | StoreAddress) -> StoreAddress:
    """`StoreAddress.parse`, passing an already parsed address through unchanged."""
    if isinstance(store_addr, StoreAddress):
        return store_addr
    return StoreAddress.parse(store_addr)


class _ClientPool:
    """Idle TCPStore clients per (host, port), each lent to one user at a time.

    A TCPStore client is one socket: a blocking ``wait``/``get`` on it holds
    every other call behind it. Two groups of one process (ranks as threads,
    or two groups configuring at once) that shared a client could each wait
    for a key the other must set first, and stall until the timeout. So a
    client is lent to one group for as long as that group's backend lives,
    and comes back to the pool when the group is reconfigured or shut down;
    the next configure of any group reuses it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[TCPStore]] = {}

    def acquire(self, host: str, port: int, timeout: timedelta) -> TCPStore:
        key = (host, port)
        while True:
            with self._lock:
                idle = self._idle.get(key)
                client = idle.pop() if idle else None
            if client is None:
                break
            if _alive(client):
                client.set_timeout(timeout)
                return client
        # Connect outside the lock: a connect can take up to `timeout`.
        return TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)

    def release(self, host: str, port: int, client: TCPStore) -> None:
        with self._lock:
            idle = self._idle.setdefault((host, port), [])
            if len(idle) < _MAX_IDLE_PER_SERVER:
                idle.append(client)


_MAX_IDLE_PER_SERVER = 8


def _alive(client: TCPStore) -> bool:
    try:
        client.check([])  # one round trip; raises if the server or connection is gone
    except Exception:
        return False
    return True


_POOL = _ClientPool()


class BorrowedStore:
    """A pooled store client borrowed by one user: `store` is ``PrefixStore(prefix, client)``.

    Call `release` once the user (a group's backend) no longer needs it, to
    return the client to the pool; releasing twice is harmless. One never
    released just keeps its connection until it is garbage collected.
    """

    def __init__(self, addr: StoreAddress, client: TCPStore) -> None:
        self.address = addr
        self.store: Store = PrefixStore(addr.prefix, client)
        self._client: TCPStore | None = client

    def release(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            _POOL.release(self.address.host, self.address.port, client)


def borrow_store_client(
    store_addr: str | StoreAddress, timeout: timedelta = _DEFAULT_TIMEOUT
) -> BorrowedStore:
    """Borrow a store client for ``host:port/prefix`` (see `_ClientPool` for why).

    `timeout` bounds the connect and every store operation.
    """
    addr = parse_store_address(store_addr)
    if timeout <= timedelta(0):
        raise ValueError(f"timeout must be positive, got {timeout}")
    return BorrowedStore(addr, _POOL.acquire(addr.host, addr.port, timeout))


def create_store_client(
    store_addr: str | StoreAddress, timeout: timedelta = _DEFAULT_TIMEOUT
) -> Store:
    """Return ``PrefixStore(prefix, TCPStore client)`` for a ``host:port/prefix`` address.

    The client is the caller's alone. `timeout` bounds the connect and every
    store operation (default 60 s). Raises ValueError for a malformed address
    and the store's own error (a RuntimeError) when the server cannot be
    reached within `timeout`.
    """
    return borrow_store_client(store_addr, timeout).store

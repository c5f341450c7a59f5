"""Closes the connections ``lighthouse.connection_policy`` says to, for gRPC servers.

gRPC's Python server shows neither its accepted sockets nor the connection a
call arrived on, only the call's peer (``ipv4:10.0.0.5:41234``), which names
the connection: a connection is one (peer address, peer port) pair on the
server's port. So:

- each server's ``ConnectionGuard.admitted`` is called by ``auth.guard`` with
  every call that passes the job check, and records the call's peer;
- one scanner thread per process lists the process's sockets every
  ``SCAN_INTERVAL_S`` seconds (``/proc/self/fd``, ``fstat`` of each; a socket
  is inspected once, through a duplicate of its descriptor, and remembered by
  inode), gives each guard the connections on its port with whether they
  authenticated, and shuts down the ones its policy closes. ``shutdown()``
  acts on the socket, not the descriptor: gRPC sees the connection end and
  closes its own descriptor, so nothing here ever closes a descriptor gRPC
  owns.

A scan costs about 3 ms per thousand open descriptors, plus about 15 us per
connection it has not seen before.

On a system without ``/proc/self/fd`` the scanner does nothing (logged once);
gRPC's own cap and handshake timeout still apply.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from lighthouse.connection_policy import Connection, ConnectionLimits, ConnectionPolicy

__all__ = ["SCAN_INTERVAL_S", "ConnectionGuard", "parse_peer", "scan_once"]

log = logging.getLogger("lighthouse")

#: Seconds between two scans of the process's sockets.
SCAN_INTERVAL_S = 0.5
_FD_DIR = "/proc/self/fd"


def _normal_ip(host: str) -> str:
    """``host`` as one text for both sources: IPv4-mapped IPv6 as IPv4, zone ids
    dropped. Both gRPC and the socket module write addresses with ``inet_ntop``, so
    nothing else differs (string work only: this runs once per new connection)."""
    host = host.split("%", 1)[0]
    if host[:7].lower() == "::ffff:" and "." in host:
        return host[7:]
    return host


def parse_peer(peer: str) -> tuple[str, int] | None:
    """gRPC's peer text (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, percent-encoded as
    ``ipv6:%5B::1%5D:5``) as (address, port); None for any other kind (unix sockets)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return _normal_ip(host.strip("[]")), int(port)


@dataclass(frozen=True)
class _Socket:
    """A connected TCP socket of this process: its local port and its peer."""

    local_port: int
    peer: str
    peer_port: int


_UNKNOWN = _Socket(local_port=-1, peer="", peer_port=-1)  # could not look: ask again


def _inspect(fd: int, inode: int) -> _Socket | None:
    """The connected TCP socket at ``fd`` if it still has ``inode``; None for anything
    else (a listener, a non-TCP socket, a descriptor reused meanwhile); ``_UNKNOWN``
    if no descriptor was free to look with."""
    try:
        dup = os.dup(fd)
    except OSError:
        return _UNKNOWN
    try:
        if os.fstat(dup).st_ino != inode:
            os.close(dup)
            return None
        sock = socket.socket(fileno=dup)  # owns dup from here
    except OSError:
        os.close(dup)
        return None
    with sock:
        if sock.type != socket.SOCK_STREAM or sock.family not in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            return None
        try:
            local_port = int(sock.getsockname()[1])
            host, port = sock.getpeername()[:2]
        except OSError:  # a listener, or not connected
            return None
        return _Socket(local_port=local_port, peer=_normal_ip(host), peer_port=port)


def _shut(fd: int, inode: int) -> bool:
    """Shut the socket at ``fd`` down both ways if it still has ``inode``. True if done."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        with socket.socket(fileno=dup) as sock:
            dup = -1
            sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if dup >= 0:
            os.close(dup)


class ConnectionGuard:
    """One gRPC server's connection caps (``lighthouse.connection_policy``), enforced
    by the process's scanner once ``watch(port)`` is called, until ``stop()``."""

    def __init__(self, limits: ConnectionLimits, what: str) -> None:
        self.limits = limits
        self.policy = ConnectionPolicy(limits, what)
        self.what = what
        self.port = 0
        # whether the scanner can see this process's sockets; if not, only gRPC's cap applies
        self.enforced = os.path.isdir(_FD_DIR)
        # peers of calls that passed the job check, as gRPC writes them; added on the
        # server's event loop, pruned by the scanner (set operations are atomic)
        self._authenticated: set[str] = set()
        self._parsed: dict[str, tuple[str, int] | None] = {}  # the scanner's, per peer text

    def admitted(self, context: Any) -> None:
        """A call on ``context`` passed the job check: its connection authenticated.
        Called by ``auth.guard`` for every such call (well under a microsecond)."""
        self._authenticated.add(context.peer())

    def watch(self, port: int) -> None:
        """Start enforcing on the server's bound ``port`` (if ``enforced``)."""
        self.port = port
        _scanner.add(self)

    def stop(self) -> None:
        """Stop enforcing (the server is stopping). Idempotent."""
        _scanner.remove(self)

    def _sweep(self, sockets: list[tuple[int, int, _Socket]], seen: set[str], now: float) -> None:
        """Apply the policy to this server's ``sockets`` (fd, inode, socket) (scanner
        thread). ``seen``: the authenticated peers as copied before the sockets were
        listed, so a peer recorded later, whose connection the listing may have
        missed, is kept for the next scan."""
        parsed = self._parsed
        current = self._authenticated.copy()  # holds seen: only this thread removes
        for text in current - parsed.keys():
            parsed[text] = parse_peer(text)
        authenticated = {parsed[text] for text in current}
        conns = []
        live = set()
        for _, inode, s in sockets:
            pair = (s.peer, s.peer_port)
            live.add(pair)
            conns.append(Connection(key=inode, peer=s.peer, authenticated=pair in authenticated))
        sweep = self.policy.sweep(conns, now)
        if sweep.close:
            fds = {inode: fd for fd, inode, _ in sockets}
            for inode in sweep.close:
                _shut(fds[inode], inode)
        if sweep.warning:
            log.warning("%s", sweep.warning)
        if sweep.info:
            log.info("%s", sweep.info)
        # forget the peers of connections that ended (recorded before this scan began)
        gone = [text for text in seen if parsed[text] not in live]
        self._authenticated.difference_update(gone)
        for text in gone:
            del parsed[text]


def scan_once(guards: list[ConnectionGuard], cache: dict[int, _Socket | None]) -> None:
    """One scan: the process's sockets, grouped by the guards' ports, swept by each
    guard. ``cache`` (inode -> socket, or None for one that is none of ours) is
    kept between scans and pruned to the sockets still open."""
    by_port: dict[int, list[tuple[int, int, _Socket]]] = {g.port: [] for g in guards}
    recorded = [g._authenticated.copy() for g in guards]  # before listing: see _sweep
    seen: set[int] = set()
    for name in os.listdir(_FD_DIR):
        fd = int(name)
        try:
            st = os.fstat(fd)  # a third of readlink's cost, and a socket's inode too
        except OSError:  # closed meanwhile (or the listing's own descriptor)
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        inode = st.st_ino
        seen.add(inode)
        if inode in cache:
            info = cache[inode]
        else:
            info = _inspect(fd, inode)
            if info is _UNKNOWN:
                continue
            cache[inode] = info
        if info is not None and info.local_port in by_port:
            by_port[info.local_port].append((fd, inode, info))
    for inode in [i for i in cache if i not in seen]:
        del cache[inode]
    now = time.monotonic()
    for g, authenticated in zip(guards, recorded, strict=True):
        g._sweep(by_port[g.port], authenticated, now)


class _Scanner:
    """The process's one scanning thread, running while any guard watches."""

    def __init__(self, interval_s: float, scan: Callable[..., None]) -> None:
        self.interval_s = interval_s
        self._scan = scan
        self._lock = threading.Lock()
        self._guards: list[ConnectionGuard] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def add(self, guard: ConnectionGuard) -> None:
        if not os.path.isdir(_FD_DIR):
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s: no %s on this system: only gRPC's own connection cap applies",
                    guard.what,
                    _FD_DIR,
                )
            return
        with self._lock:
            self._guards.append(guard)
            if self._thread is None:
                self._wake.clear()
                self._thread = threading.Thread(
                    target=self._run, name="lighthouse-conn-guard", daemon=True
                )
                self._thread.start()

    def remove(self, guard: ConnectionGuard) -> None:
        with self._lock:
            if guard in self._guards:
                self._guards.remove(guard)
            if not self._guards and self._thread is not None:
                self._thread = None
                self._wake.set()  # the thread sees no guards and ends

    def _run(self) -> None:
        cache: dict[int, _Socket | None] = {}
        me = threading.current_thread()
        while True:
            self._wake.wait(self.interval_s)
            with self._lock:
                if self._thread is not me:
                    return
                guards = list(self._guards)
            try:
                self._scan(guards, cache)
            except Exception:  # never let the thread die: the next scan may work
                log.exception("connection scan failed")


_scanner = _Scanner(SCAN_INTERVAL_S, scan_once)

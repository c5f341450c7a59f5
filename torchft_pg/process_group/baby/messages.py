"""The messages between a Baby group (the parent) and its backend child, and their framing.

The two ends are one trainer process and the child it started, joined by an
AF_UNIX SOCK_SEQPACKET socketpair: no other process can write to it, so the
header is pickled (as before this module existed). One message is one packet:

    [4-byte little-endian header length][pickled header tuple][raw tensor bytes...]

The header is ``(tag, *fields)``; the raw bytes after it are the small CPU
tensors an op carries (`RunOp`) or returns (`OpDone`), in argument order, so
neither side copies them into Python bytes objects. File descriptors (shared
memory storages) ride along as SCM_RIGHTS.

Control messages are frozen keyword-only dataclasses. The two sent per op
(`RunOp`, `OpDone`) are `__slots__` classes with keyword-only constructors,
treated as immutable: a frozen dataclass costs about 2x to construct
(``object.__setattr__`` per field), paid twice per op on each side.
"""

from __future__ import annotations

import array
import os
import pickle
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torchft_pg.store import StoreAddress

__all__ = [
    "MAX_FDS",
    "MAX_MESSAGE_BYTES",
    "Configure",
    "Configured",
    "Message",
    "OpDone",
    "Ready",
    "Receiver",
    "RunOp",
    "Shutdown",
    "send",
    "socket_pair",
]

INLINE_MAX_BYTES = 64 * 1024  # tensor bytes per op carried in the message; more go through shm
MAX_MESSAGE_BYTES = 4 * INLINE_MAX_BYTES + 64 * 1024  # headroom for the header and specs
MAX_FDS = 64
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
_LENGTH = struct.Struct("<I")
# Plain ints: socket's flag constants are IntFlag members, and enum arithmetic
# costs microseconds per message.
_TRUNCATED = int(socket.MSG_TRUNC) | int(socket.MSG_CTRUNC)
_MSG_TRUNC = int(socket.MSG_TRUNC)
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(socket.SCM_RIGHTS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ready:
    """Child → parent, once: started (torch imported), serving on the socket."""

    TAG: ClassVar[int] = 1
    request_id: int
    pid: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Configure:
    """Parent → child: build a new backend at `address` (`timeout_s` bounds its rendezvous)."""

    TAG: ClassVar[int] = 2
    request_id: int
    address: StoreAddress
    rank: int
    world_size: int
    timeout_s: float
    hostname: str | None = None  # what a Gloo backend binds and advertises (None: torch's)


@dataclass(frozen=True, kw_only=True, slots=True)
class Configured:
    """Child → parent: the `Configure` with `request_id` finished; `error` says why not."""

    TAG: ClassVar[int] = 3
    request_id: int
    error: str | None
    timed_out: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Shutdown:
    """Parent → child: exit now."""

    TAG: ClassVar[int] = 4


class RunOp:
    """Parent → child: run collective `name` on `args` (tensors as specs, see
    `protocol`); `forget` lists shared storages the child may unmap."""

    TAG: ClassVar[int] = 5
    __slots__ = ("args", "forget", "name", "op_id")

    def __init__(self, *, op_id: int, name: str, args: Any, forget: Sequence[Any]) -> None:
        self.op_id = op_id
        self.name = name
        self.args = args
        self.forget = forget

    def fields(self) -> tuple[Any, ...]:
        return (self.op_id, self.name, self.args, self.forget)


class OpDone:
    """Child → parent: op `op_id` finished. On success the raw bytes after the
    header are its inline tensors' results; `source_rank` answers `recv_anysource`."""

    TAG: ClassVar[int] = 6
    __slots__ = ("error", "op_id", "source_rank")

    def __init__(self, *, op_id: int, error: str | None, source_rank: int | None) -> None:
        self.op_id = op_id
        self.error = error
        self.source_rank = source_rank

    def fields(self) -> tuple[Any, ...]:
        return (self.op_id, self.error, self.source_rank)


Message = Ready | Configure | Configured | Shutdown | RunOp | OpDone


def _wire(message: Message) -> tuple[Any, ...]:
    if isinstance(message, (RunOp, OpDone)):
        return (message.TAG, *message.fields())
    if isinstance(message, Ready):
        return (Ready.TAG, message.request_id, message.pid)
    if isinstance(message, Configure):
        a = message.address
        return (
            Configure.TAG,
            message.request_id,
            a.host,
            a.port,
            a.prefix,
            message.rank,
            message.world_size,
            message.timeout_s,
            message.hostname,
        )
    if isinstance(message, Configured):
        return (Configured.TAG, message.request_id, message.error, message.timed_out)
    if isinstance(message, Shutdown):
        return (Shutdown.TAG,)
    raise TypeError(f"not a Baby PG message: {message!r}")


def _unwire(fields: tuple[Any, ...]) -> Message:
    tag = fields[0]
    if tag == RunOp.TAG:
        return RunOp(op_id=fields[1], name=fields[2], args=fields[3], forget=fields[4])
    if tag == OpDone.TAG:
        return OpDone(op_id=fields[1], error=fields[2], source_rank=fields[3])
    if tag == Ready.TAG:
        return Ready(request_id=fields[1], pid=fields[2])
    if tag == Configure.TAG:
        _, request_id, host, port, prefix, rank, world_size, timeout_s, hostname = fields
        address = StoreAddress(host=host, port=port, prefix=prefix)
        return Configure(
            request_id=request_id,
            address=address,
            rank=rank,
            world_size=world_size,
            timeout_s=timeout_s,
            hostname=hostname,
        )
    if tag == Configured.TAG:
        return Configured(request_id=fields[1], error=fields[2], timed_out=fields[3])
    if tag == Shutdown.TAG:
        return Shutdown()
    raise ValueError(f"unknown Baby PG message tag {tag!r}")


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected SOCK_SEQPACKET pair with buffers for several large messages."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    return a, b


def send(
    sock: socket.socket,
    message: Message,
    buffers: Sequence[Any] = (),
    fds: Sequence[int] = (),
) -> None:
    """Send `message` and `buffers` (C-contiguous bytes-like objects) as one packet.

    A SOCK_SEQPACKET send is atomic (the whole packet or an error, never part
    of it), so threads may send concurrently without a lock. Raises OSError
    when the peer is gone.
    """
    header = pickle.dumps(_wire(message), protocol=pickle.HIGHEST_PROTOCOL)
    parts = [_LENGTH.pack(len(header)), header, *buffers]
    if fds:
        sock.sendmsg(parts, [(_SOL_SOCKET, _SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendmsg(parts)


class Receiver:
    """Reads messages into one reused buffer (a fresh 320 KiB buffer per message
    would cost an mmap and page faults on every op).

    Not thread-safe: one thread at a time reads (see `parent`). The
    payload view of a message is valid until the next `recv`.
    """

    _ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)

    def __init__(self, sock: socket.socket, *, takes_fds: bool = True) -> None:
        self._sock = sock
        self._buf = bytearray(MAX_MESSAGE_BYTES)
        self._view = memoryview(self._buf)
        # The parent's side never receives fds (the child sends none): it reads with
        # plain recv_into, cheaper per op than recvmsg_into and its ancillary data.
        # Any fd that did arrive would be closed by the kernel, not leaked.
        self._takes_fds = takes_fds

    def recv(self, flags: int = 0) -> tuple[Message, memoryview, list[int]]:
        """One message, its payload (raw bytes after the header) and its fds.

        Raises EOFError when the peer is gone, BlockingIOError for
        ``flags=MSG_DONTWAIT`` with nothing to read.
        """
        if not self._takes_fds:
            # MSG_TRUNC: the packet's real length, so a truncated one is seen as such.
            n = self._sock.recv_into(self._buf, 0, flags | _MSG_TRUNC)
            if n == 0:
                raise EOFError("peer closed the Baby PG socket")
            if n > len(self._buf):
                raise OSError(f"Baby PG message truncated ({n} bytes sent)")
            return self._parse(n, [])
        n, ancdata, msg_flags, _addr = self._sock.recvmsg_into([self._buf], self._ANC_SIZE, flags)
        fds: list[int] = []
        for level, kind, data in ancdata:
            if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
                fds.extend(arr)
        if n == 0 or msg_flags & _TRUNCATED:
            for fd in fds:
                os.close(fd)
            if n == 0:
                raise EOFError("peer closed the Baby PG socket")
            raise OSError(f"Baby PG message truncated (flags {msg_flags:#x}, {n} bytes read)")
        return self._parse(n, fds)

    def _parse(self, n: int, fds: list[int]) -> tuple[Message, memoryview, list[int]]:
        """The message in the first `n` bytes of the buffer, its payload, and `fds`."""
        (length,) = _LENGTH.unpack_from(self._buf)
        start = _LENGTH.size + length
        message = _unwire(pickle.loads(self._view[_LENGTH.size : start]))
        return message, self._view[start:n], fds

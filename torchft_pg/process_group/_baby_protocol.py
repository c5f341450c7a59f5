"""The Baby PG's wire format between the trainer (parent) and its backend child.

Messages are pickled tuples on an AF_UNIX SOCK_SEQPACKET socket, with file
descriptors riding along (SCM_RIGHTS). A tensor argument travels as one of:
- ``("inline", i)``: small or non-shareable tensors; their bytes are in the
  message and the results come back the same way (one memcpy each way);
- ``("shm", key, fd_index, dtype, shape, stride, offset)``: a CPU tensor whose
  storage lives in shared memory (moved there once, in place); the storage's fd
  is sent only the first time, then the child reuses its mapping by `key`;
- ``("cuda", payload)``: a CUDA tensor as a torch IPC handle.
c10d option objects are not picklable and travel as (class name, fields).
"""

from __future__ import annotations

import array
import io
import os
import pickle
import socket
from collections import OrderedDict
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

INLINE_MAX_BYTES = 64 * 1024  # per op; larger CPU tensors go through shared memory
MAX_MESSAGE_BYTES = 4 * INLINE_MAX_BYTES + 64 * 1024
MAX_FDS = 64
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024

_OPTION_FIELDS: dict[str, tuple[type, tuple[str, ...]]] = {
    "AllreduceOptions": (AllreduceOptions, ("reduceOp", "timeout")),
    "AllreduceCoalescedOptions": (AllreduceCoalescedOptions, ("reduceOp", "timeout")),
    "AllgatherOptions": (AllgatherOptions, ("timeout",)),
    "AllToAllOptions": (AllToAllOptions, ("timeout",)),
    "BarrierOptions": (BarrierOptions, ("timeout",)),
    "BroadcastOptions": (BroadcastOptions, ("rootRank", "rootTensor", "timeout")),
    "ReduceScatterOptions": (ReduceScatterOptions, ("reduceOp", "timeout")),
    "ReduceOptions": (ReduceOptions, ("reduceOp", "rootRank", "rootTensor", "timeout")),
    "GatherOptions": (GatherOptions, ("rootRank", "timeout")),
    "ScatterOptions": (ScatterOptions, ("rootRank", "timeout")),
}


def socket_pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    return a, b


def send(sock: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


class Receiver:
    """Reads messages into one reused buffer (a fresh 300 KiB buffer per message
    would cost an mmap and page faults on every op)."""

    _ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray(MAX_MESSAGE_BYTES)
        self._view = memoryview(self._buf)

    def recv(self) -> tuple[Any, list[int]]:
        """One message and its fds; raises EOFError when the peer is gone."""
        n, ancdata, _flags, _addr = self._sock.recvmsg_into([self._buf], self._ANC_SIZE)
        if n == 0:
            raise EOFError("peer closed the Baby PG socket")
        fds: list[int] = []
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
                fds.extend(arr)
        return pickle.loads(self._view[:n]), fds


# -- option objects -------------------------------------------------------------
def encode_options(opts: Any) -> Any:
    name = type(opts).__name__
    if name not in _OPTION_FIELDS:
        return opts
    key = (name, *(_plain(getattr(opts, f)) for f in _OPTION_FIELDS[name][1]))
    cached = _ENCODED_OPTIONS.get(key)
    if cached is None:
        cached = _ENCODED_OPTIONS[key] = _encode_options(opts, name)
    return cached


def _plain(value: Any) -> Any:
    # ReduceOp objects are not hashable; their RedOpType is (and cheaper than a name).
    return getattr(value, "op", value) if isinstance(value, ReduceOp) else value


_ENCODED_OPTIONS: dict[tuple[Any, ...], Any] = {}


def _encode_options(opts: Any, name: str) -> Any:
    _, fields = _OPTION_FIELDS[name]
    values = []
    for f in fields:
        v = getattr(opts, f)
        if isinstance(v, (ReduceOp, ReduceOp.RedOpType)):
            v = ("reduce_op", _reduce_op_name(v))
        values.append((f, v))
    return ("options", name, tuple(values))


_DECODED_OPTIONS: dict[Any, Any] = {}


def decode_options(value: Any) -> Any:
    """Options objects are immutable in use, so one decoded object serves every op."""
    if not (isinstance(value, tuple) and len(value) == 3 and value[0] == "options"):
        return value
    cached = _DECODED_OPTIONS.get(value)
    if cached is None:
        cached = _DECODED_OPTIONS[value] = _decode_options(value)
    return cached


def _decode_options(value: Any) -> Any:
    cls, _ = _OPTION_FIELDS[value[1]]
    opts = cls()
    for f, v in value[2]:
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "reduce_op":
            v = getattr(ReduceOp, v[1])
        setattr(opts, f, v)
    return opts


def _reduce_op_name(op: Any) -> str:
    op_type = getattr(op, "op", op)
    return str(op_type).split(".")[-1]


# -- tensors --------------------------------------------------------------------
class SharedStorageRegistry:
    """Parent side: which shared storages the child has already mapped.

    Keyed by (inode, ctime_ns, size) of the storage's shm file, so a freed
    storage whose fd or inode number is reused is never confused with a new
    one. Bounded: the oldest entries are dropped and the child told to forget.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._sent: OrderedDict[tuple[int, int, int], None] = OrderedDict()
        self._capacity = capacity
        self.forget: list[tuple[int, int, int]] = []

    def key_for(self, fd: int, size: int) -> tuple[tuple[int, int, int], bool]:
        st = os.fstat(fd)
        key = (st.st_ino, st.st_ctime_ns, size)
        known = key in self._sent
        if known:
            self._sent.move_to_end(key)
        else:
            self._sent[key] = None
            while len(self._sent) > self._capacity:
                old, _ = self._sent.popitem(last=False)
                self.forget.append(old)
        return key, known

    def reset(self) -> None:
        self._sent.clear()
        self.forget.clear()


class EncodedArgs:
    """The args of one op with tensors replaced by specs (see module docstring)."""

    def __init__(self) -> None:
        self.inline_tensors: list[torch.Tensor] = []  # the caller's tensors, to copy results into
        self.inline_bytes: list[bytes] = []
        self.fds: list[int] = []
        self.staged: list[tuple[torch.Tensor, torch.Tensor]] = []  # (caller's, shared copy)
        self.outputs: Any = None  # what the op's future yields


def encode_args(
    args: Any, registry: SharedStorageRegistry, inline_budget: int
) -> tuple[Any, EncodedArgs]:
    out = EncodedArgs()
    return _encode_value(args, out, registry, [inline_budget]), out


def _encode_value(
    v: Any, out: EncodedArgs, registry: SharedStorageRegistry, budget: list[int]
) -> Any:
    # A plain recursive function: a nested closure calling itself would form a
    # reference cycle holding `out` (and the shared-memory tensors and their fds)
    # until the cyclic GC ran.
    if isinstance(v, torch.Tensor):
        return _encode_tensor(v, out, registry, budget)
    if isinstance(v, list):
        return [_encode_value(x, out, registry, budget) for x in v]
    if isinstance(v, tuple):
        return tuple(_encode_value(x, out, registry, budget) for x in v)
    return encode_options(v)


def _encode_tensor(
    t: torch.Tensor, out: EncodedArgs, registry: SharedStorageRegistry, budget: list[int]
) -> Any:
    if t.is_cuda:
        buf = io.BytesIO()
        ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(t)
        return ("cuda", buf.getvalue())
    nbytes = t.numel() * t.element_size()
    if nbytes <= budget[0]:
        budget[0] -= nbytes
        out.inline_tensors.append(t)
        out.inline_bytes.append(tensor_bytes(t))
        return ("inline", len(out.inline_tensors) - 1, _DTYPE_NAMES[t.dtype], tuple(t.shape))
    target = t
    if not t.is_contiguous():
        target = t.contiguous()
        out.staged.append((t, target))
    storage = target.untyped_storage()
    if not storage.is_shared():
        target.share_memory_()  # moves the storage to shared memory in place, once
        storage = target.untyped_storage()
    fd, size = storage._share_fd_cpu_()
    key, known = registry.key_for(fd, size)
    fd_index = -1
    if not known:
        out.fds.append(fd)
        fd_index = len(out.fds) - 1
    return (
        "shm",
        key,
        fd_index,
        size,
        _DTYPE_NAMES[target.dtype],
        tuple(target.shape),
        tuple(target.stride()),
        target.storage_offset(),
    )


def copy_results(encoded: EncodedArgs, results: list[bytes]) -> None:
    """Parent side: write the child's results back into the caller's tensors."""
    for t, data in zip(encoded.inline_tensors, results, strict=True):
        if data:
            t.copy_(tensor_from_bytes(data, t.dtype, tuple(t.shape)))
    for original, staged in encoded.staged:
        original.copy_(staged)


class ChildTensors:
    """Child side: rebuilds tensors from specs and keeps shared mappings by key."""

    def __init__(self) -> None:
        self._storages: dict[tuple[int, int, int], torch.UntypedStorage] = {}

    def forget(self, keys: list[tuple[int, int, int]]) -> None:
        for k in keys:
            self._storages.pop(k, None)

    def decode(
        self, args: Any, inline: list[bytes], fds: list[int]
    ) -> tuple[Any, list[torch.Tensor]]:
        inline_tensors: list[torch.Tensor] = []
        decoded = self._decode_value(args, inline, fds, inline_tensors)
        for fd in fds:  # the mapping holds the memory; the fd is no longer needed
            os.close(fd)
        return decoded, inline_tensors

    def _decode_value(
        self, v: Any, inline: list[bytes], fds: list[int], inline_tensors: list[torch.Tensor]
    ) -> Any:
        # A method, not a self-calling closure: that would be a reference cycle
        # keeping every decoded tensor alive until the cyclic GC ran.
        if isinstance(v, tuple) and v and v[0] in ("inline", "shm", "cuda"):
            return self._tensor(v, inline, fds, inline_tensors)
        if isinstance(v, tuple) and v and v[0] == "options":
            return decode_options(v)
        if isinstance(v, list):
            return [self._decode_value(x, inline, fds, inline_tensors) for x in v]
        if isinstance(v, tuple):
            return tuple(self._decode_value(x, inline, fds, inline_tensors) for x in v)
        return decode_options(v)

    def _tensor(
        self, spec: Any, inline: list[bytes], fds: list[int], inline_tensors: list[torch.Tensor]
    ) -> torch.Tensor:
        kind = spec[0]
        if kind == "inline":
            _, index, dtype_name, shape = spec
            dtype = _DTYPES[dtype_name]
            data = inline[index]
            t = tensor_from_bytes(data, dtype, shape) if data else torch.empty(shape, dtype=dtype)
            inline_tensors.append(t)
            return t
        if kind == "cuda":
            return pickle.loads(spec[1])
        _, key, fd_index, size, dtype_name, shape, stride, offset = spec
        dtype = _DTYPES[dtype_name]
        storage = self._storages.get(key)
        if storage is None:
            if fd_index < 0:
                raise RuntimeError(f"Baby PG child lost shared storage {key}")
            storage = torch.UntypedStorage._new_shared_fd_cpu(os.dup(fds[fd_index]), size)  # type: ignore[attr-defined]
            self._storages[key] = storage
        return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in C order (numpy directly where it knows the dtype: ~4x cheaper)."""
    if t.numel() == 0:
        return b""
    if t.dtype in _NUMPY_DTYPES:
        return t.detach().numpy().tobytes()  # tobytes() copies in C order, contiguous or not
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    t = torch.frombuffer(bytearray(data), dtype=dtype)
    return t if len(shape) == 1 else t.view(shape)


# dtypes travel by name: pickling torch.dtype objects costs several microseconds each.
_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}
_DTYPE_NAMES: dict[torch.dtype, str] = {d: n for n, d in _DTYPES.items()}

_NUMPY_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    }
)


def inline_results(tensors: list[torch.Tensor]) -> list[bytes]:
    return [tensor_bytes(t) for t in tensors]

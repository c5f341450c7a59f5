"""How a Baby op's arguments cross to the child: tensors as specs, options as plain values.

The args of an op (lists of tensors, ints, c10d option objects) travel as the
same nested structure with each tensor replaced by a spec tuple:

- ``("i", dtype, shape)``: a small CPU tensor (at most `INLINE_MAX_BYTES` per
  op in all) whose bytes follow the message header, in argument order; its
  result comes back the same way and is copied straight into the caller's
  tensor;
- ``("s", key, fd_index, size, dtype, shape, stride, offset)``: a CPU tensor
  whose storage lives in shared memory (moved there once, in place); the
  storage's fd is sent the first time only, then the child reuses its mapping
  by `key`;
- ``("c", payload)``: a CUDA tensor as a torch IPC handle.

c10d option objects are not picklable and travel as ``("o", class name,
fields)``. c10d op arguments never contain strings, so a tuple tagged with
one of these strings is always ours.

Tensor bytes are read and written through numpy views of the tensors' own
memory (a dtype numpy lacks is viewed as the same-size integer type): no
intermediate bytes objects on either side.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from collections import OrderedDict
from datetime import timedelta
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.distributed import (
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

from torchft_pg._torch_internals import (
    AllgatherOptions,
    share_storage_fd,
    storage_from_fd,
)
from torchft_pg.process_group.baby.messages import INLINE_MAX_BYTES

__all__ = [
    "INLINE_MAX_BYTES",
    "ChildTensors",
    "EncodedArgs",
    "SharedStorageRegistry",
    "copy_results",
    "decode_options",
    "encode_args",
    "encode_options",
    "result_buffers",
]

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


# -- option objects -------------------------------------------------------------
def encode_options(opts: Any) -> Any:
    """A c10d options object as a tuple of plain values (cached); anything else unchanged.

    Only the cache key is built per call: reading a pybind field costs about
    a microsecond, hashing a ReduceOp's enum several, so the key holds the
    enum's int value.
    """
    name = type(opts).__name__
    if name == "AllreduceOptions":  # the hot one: no loop
        key: tuple[Any, ...] = (name, opts.reduceOp.op.value, opts.timeout)
    else:
        fields = _OPTION_FIELDS.get(name)
        if fields is None:
            return opts
        key = (name, *[_plain(getattr(opts, f)) for f in fields[1]])
    cached = _ENCODED_OPTIONS.get(key)
    if cached is None:
        cached = _ENCODED_OPTIONS[key] = _encode_options(opts, name)
    return cached


def _plain(value: Any) -> Any:
    return value.op.value if isinstance(value, ReduceOp) else value  # type: ignore[attr-defined]


_ENCODED_OPTIONS: dict[tuple[Any, ...], Any] = {}


def _encode_options(opts: Any, name: str) -> Any:
    # On the wire: ReduceOp by name, timeouts as seconds (a float unpickles
    # several microseconds faster than a timedelta).
    _, fields = _OPTION_FIELDS[name]
    values = []
    for f in fields:
        v = getattr(opts, f)
        if isinstance(v, (ReduceOp, ReduceOp.RedOpType)):
            v = ("r", _reduce_op_name(v))
        elif isinstance(v, timedelta):
            v = ("t", v.total_seconds())
        values.append((f, v))
    return ("o", name, tuple(values))


_DECODED_OPTIONS: dict[Any, Any] = {}


def decode_options(value: Any) -> Any:
    """Options objects are immutable in use, so one decoded object serves every op."""
    cached = _DECODED_OPTIONS.get(value)
    if cached is None:
        cached = _DECODED_OPTIONS[value] = _decode_options(value)
    return cached


def _decode_options(value: Any) -> Any:
    _, name, fields = value
    if name not in _OPTION_FIELDS:
        raise ValueError(f"Baby PG: unknown options type {name!r}")
    opts = _OPTION_FIELDS[name][0]()
    for f, v in fields:
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "r":
            v = getattr(ReduceOp, v[1])
        elif isinstance(v, tuple) and len(v) == 2 and v[0] == "t":
            v = timedelta(seconds=v[1])
        setattr(opts, f, v)
    return opts


def _reduce_op_name(op: Any) -> str:
    op_type = getattr(op, "op", op)
    return str(op_type).split(".")[-1]


# -- tensor bytes ---------------------------------------------------------------
# dtypes travel by name: pickling torch.dtype objects costs several microseconds each.
_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}
_DTYPE_NAMES: dict[torch.dtype, str] = {d: n for n, d in _DTYPES.items()}
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class _Wire:
    """How one dtype's bytes are read through numpy: numpy's own type, or (for
    bfloat16, float8, complex32, ...) the same-size integer type viewed as it."""

    __slots__ = ("as_int", "dtype", "itemsize", "name", "np_dtype")

    def __init__(self, dtype: torch.dtype) -> None:
        # On the host whatever torch's default device is (numpy reads host memory only).
        probe = torch.empty(0, dtype=dtype, device="cpu")
        self.dtype = dtype
        self.name = _DTYPE_NAMES[dtype]
        self.as_int: torch.dtype | None = None
        try:
            self.np_dtype = probe.numpy().dtype
        except TypeError:  # numpy has no such type
            self.as_int = _SAME_SIZE_INT.get(probe.element_size())
            if self.as_int is None:
                raise TypeError(f"Baby PG cannot carry tensors of dtype {dtype}") from None
            self.np_dtype = probe.view(self.as_int).numpy().dtype
        self.itemsize = self.np_dtype.itemsize


_WIRES: dict[Any, _Wire] = {}  # by torch.dtype and by dtype name, filled on first use


def _wire(key: torch.dtype | str) -> _Wire:
    wire = _WIRES.get(key)
    if wire is None:
        dtype = key if isinstance(key, torch.dtype) else _DTYPES[key]
        wire = _WIRES[key] = _Wire(dtype)
    return wire


def _numpy_view(t: torch.Tensor, wire: _Wire) -> np.ndarray[Any, Any]:
    """A numpy array over `t`'s own memory (same strides; writes land in `t`)."""
    if t.requires_grad:
        t = t.detach()
    return (t if wire.as_int is None else t.view(wire.as_int)).numpy()


# -- parent side ----------------------------------------------------------------
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

    def take_forget(self) -> tuple[tuple[int, int, int], ...]:
        """The keys the child may unmap, once (sent with the next op)."""
        if not self.forget:
            return ()  # the usual case: no allocation
        forget, self.forget = tuple(self.forget), []
        return forget

    def reset(self) -> None:
        self._sent.clear()
        self.forget.clear()


class EncodedArgs:
    """The parent's record of one op's tensors (see module docstring)."""

    __slots__ = ("budget", "buffers", "fds", "has_cuda", "staged", "views")

    def __init__(self, budget: int) -> None:
        self.budget = budget  # inline bytes left for this op
        self.views: list[np.ndarray[Any, Any]] = []  # numpy views of the inline tensors
        self.buffers: list[Any] = []  # their bytes, C-contiguous, to send after the header
        self.fds: list[int] = []  # shared storages the child has not mapped yet
        self.staged: list[tuple[torch.Tensor, torch.Tensor]] = []  # (caller's, shared copy)
        self.has_cuda = False


def encode_args(
    args: Any, registry: SharedStorageRegistry, inline_budget: int = INLINE_MAX_BYTES
) -> tuple[Any, EncodedArgs]:
    """`args` with each tensor replaced by its spec, and what the parent keeps of them.

    The caller must serialize encodes against one `registry` with sending
    their messages: the child learns of a storage from the first message
    that names it.
    """
    out = EncodedArgs(inline_budget)
    return _encode_value(args, out, registry), out


def _encode_value(v: Any, out: EncodedArgs, registry: SharedStorageRegistry) -> Any:
    # A plain recursive function: a nested closure calling itself would form a
    # reference cycle holding `out` (and the shared-memory tensors and their fds)
    # until the cyclic GC ran.
    if isinstance(v, torch.Tensor):
        return _encode_tensor(v, out, registry)
    if isinstance(v, list):
        return [_encode_value(x, out, registry) for x in v]
    if isinstance(v, tuple):
        return tuple([_encode_value(x, out, registry) for x in v])
    return encode_options(v)


def _encode_tensor(t: torch.Tensor, out: EncodedArgs, registry: SharedStorageRegistry) -> Any:
    if t.is_cuda:
        out.has_cuda = True
        buf = io.BytesIO()
        ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(t)
        return ("c", buf.getvalue())
    nbytes = t.nbytes
    if nbytes <= out.budget:
        out.budget -= nbytes
        wire = _wire(t.dtype)
        view = _numpy_view(t, wire)
        out.views.append(view)
        out.buffers.append(view if t.is_contiguous() else np.ascontiguousarray(view))
        return ("i", wire.name, view.shape)  # numpy's shape is a plain tuple
    target = t
    if not t.is_contiguous():
        target = t.contiguous()
        out.staged.append((t, target))
    storage = target.untyped_storage()
    if not storage.is_shared():
        target.share_memory_()  # type: ignore[no-untyped-call]  # moves the storage to shared memory in place, once
        storage = target.untyped_storage()
    fd, size = share_storage_fd(storage)
    key, known = registry.key_for(fd, size)
    fd_index = -1
    if not known:
        out.fds.append(fd)
        fd_index = len(out.fds) - 1
    return (
        "s",
        key,
        fd_index,
        size,
        _DTYPE_NAMES[target.dtype],
        tuple(target.shape),
        tuple(target.stride()),
        target.storage_offset(),
    )


def copy_results(encoded: EncodedArgs, payload: memoryview) -> None:
    """Parent side: write the child's results (`payload`, in argument order) into
    the caller's tensors, and staged shared copies back into their originals."""
    views = encoded.views
    expected = 0
    for view in views:
        expected += view.nbytes
    if expected != len(payload):
        raise ValueError(f"Baby PG result holds {len(payload)} bytes, expected {expected}")
    offset = 0
    for view in views:
        nbytes = view.nbytes
        if not nbytes:
            continue
        end = offset + nbytes
        if view.flags.c_contiguous:  # the usual case: one memcpy, no numpy temporaries
            view.data.cast("B")[:] = payload[offset:end]
        else:
            src = np.frombuffer(payload, dtype=view.dtype, count=view.size, offset=offset)
            np.copyto(view, src.reshape(view.shape))
        offset = end
    for original, staged in encoded.staged:
        original.copy_(staged)


# -- child side -----------------------------------------------------------------
class ChildTensors:
    """Child side: rebuilds tensors from specs and keeps shared mappings by key."""

    def __init__(self) -> None:
        self._storages: dict[tuple[int, int, int], torch.UntypedStorage] = {}

    def forget(self, keys: Any) -> None:
        for k in keys:
            self._storages.pop(k, None)

    def decode(self, spec: Any, payload: memoryview, fds: list[int]) -> tuple[Any, list[Any], bool]:
        """The op's args, the buffers its inline tensors share (whose results go
        back, in order, see `result_buffers`) and whether any tensor is on CUDA.

        Inline bytes are copied out of `payload` (the receive buffer is reused);
        every fd in `fds` is closed (a mapping holds the memory).
        """
        state = _Decoding(payload, fds)
        try:
            decoded = self._decode_value(spec, state)
        finally:
            for fd in fds:
                os.close(fd)
        return decoded, state.inline, state.cuda

    def _decode_value(self, v: Any, state: _Decoding) -> Any:
        # A method, not a self-calling closure: that would be a reference cycle
        # keeping every decoded tensor alive until the cyclic GC ran.
        if isinstance(v, list):
            return [self._decode_value(x, state) for x in v]
        if isinstance(v, tuple) and v:
            tag = v[0]
            if tag == "i":
                return _inline_tensor(v, state)
            if tag == "s":
                return self._shared_tensor(v, state.fds)
            if tag == "o":
                return decode_options(v)
            if tag == "c":
                state.cuda = True
                return pickle.loads(v[1])
            return tuple(self._decode_value(x, state) for x in v)
        return v

    def _shared_tensor(self, spec: Any, fds: list[int]) -> torch.Tensor:
        _, key, fd_index, size, dtype_name, shape, stride, offset = spec
        storage = self._storages.get(key)
        if storage is None:
            if fd_index < 0:
                raise RuntimeError(f"Baby PG child lost shared storage {key}")
            storage = storage_from_fd(os.dup(fds[fd_index]), size)
            self._storages[key] = storage
        return torch.empty(0, dtype=_DTYPES[dtype_name], device="cpu").set_(
            storage, offset, shape, stride
        )


class _Decoding:
    """One decode's state: where the next inline tensor's bytes start, and what it found."""

    __slots__ = ("cuda", "fds", "inline", "offset", "payload")

    def __init__(self, payload: memoryview, fds: list[int]) -> None:
        self.payload = payload
        self.fds = fds
        self.offset = 0
        self.inline: list[Any] = []  # each inline tensor's memory (ndarray or bytearray)
        self.cuda = False


def _inline_tensor(spec: Any, state: _Decoding) -> torch.Tensor:
    _, dtype_name, shape = spec
    wire = _wire(dtype_name)
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=wire.dtype, device="cpu")
    start = state.offset
    state.offset += count * wire.itemsize
    if len(shape) == 1:
        # The common case (flat buckets), about twice as fast as through numpy: a copy
        # (the receive buffer is reused) that the tensor shares, so its results land in
        # `data`, which is what goes back. (A .view(shape) would cost more than it saves.)
        data = bytearray(state.payload[start : state.offset])
        state.inline.append(data)
        return torch.frombuffer(data, dtype=wire.dtype)
    flat = np.frombuffer(state.payload, dtype=wire.np_dtype, count=count, offset=start)
    array = flat.reshape(shape).copy()  # a copy: the receive buffer is reused
    state.inline.append(array)
    t = torch.from_numpy(array)  # shares `array`'s memory: results land in it
    return t if wire.as_int is None else t.view(wire.dtype)


def result_buffers(arrays: list[Any]) -> list[Any]:
    """Child side: the inline tensors' bytes (`decode`'s buffers: numpy arrays or
    bytearrays, C-contiguous), in order, to send after `OpDone`."""
    return arrays

"""Host staging: run a Gloo op on host copies of CUDA tensors, then copy results back.

Gloo carries CUDA tensors itself for a few ops only (`GLOO_CUDA_OPS`). For the
others torch's Gloo backend raises ("unsupported device type cuda"), or worse:
point-to-point ops and ``allgather_coalesced`` hand the device pointer to the
TCP transport as if it were host memory, which fails with "Bad address" or
kills the process. So for every other op our Gloo groups copy each CUDA tensor
to the host, run the op there, and copy the outputs back into the caller's
tensors when it completes (`StagedWork`). Gloo stages through host memory for
its own CUDA ops too, so little is lost.

A Baby Gloo group stages every op this way: host tensors reach its child
through shared memory, with no CUDA context or IPC handle in the child at all.
The NCCL groups stage the other way (`stage_on_device`): host tensors, which
torch uses for object collectives on groups it cannot place, run on copies on
the current CUDA device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import Work
from torch.futures import Future

from torchft_pg import _torch_internals
from torchft_pg.futures import tensors_in
from torchft_pg.work import completed_work

__all__ = [
    "GLOO_CUDA_OPS",
    "StagedWork",
    "Staging",
    "alltoall_through_one_buffer",
    "backend_op",
    "stage_on_device",
    "stage_on_host",
    "staged_work",
]

# The ops torch's Gloo backend runs on CUDA tensors itself.
GLOO_CUDA_OPS = frozenset(
    {
        "allreduce",
        "reduce",
        "broadcast",
        "allgather",
        "gather",
        "scatter",
        "reduce_scatter",
        "alltoall_base",
        "barrier",
    }
)


def backend_op(group: Any, op: str) -> Any:
    """`group`'s bound method for `op`, under its older c10d name where the new one is absent."""
    method = getattr(group, op, None)
    if method is None and op in _torch_internals.OLDER_OP_NAMES:
        method = getattr(group, _torch_internals.OLDER_OP_NAMES[op], None)
    if method is None:
        raise NotImplementedError(f"{type(group).__name__} has no {op}")
    return method


@dataclass(frozen=True, kw_only=True)
class Staging:
    """One op's stand-in copies: `args` and `outputs` name them in place of the originals.

    `user_outputs` is what the caller passed as outputs; `pairs` maps each
    output tensor that was moved to the copy the op writes.
    """

    args: tuple[Any, ...]
    outputs: Any
    user_outputs: Any
    pairs: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    def copy_back(self) -> None:
        for device_tensor, host_tensor in self.pairs:
            device_tensor.copy_(host_tensor)


def stage_on_host(
    op: str, outputs: Any, args: tuple[Any, ...], native: frozenset[str] = GLOO_CUDA_OPS
) -> Staging | None:
    """Host copies for `op` if it has CUDA tensors and is not in `native`; else None."""
    if op in native:
        return None
    return _stage(outputs, args, lambda t: t.is_cuda, torch.device("cpu"))


def stage_on_device(op: str, outputs: Any, args: tuple[Any, ...]) -> Staging | None:
    """Copies on the current CUDA device if `op` has host tensors (for NCCL); else None.

    torch sends object collectives and barriers of a group it cannot place
    on a device as host tensors, which an NCCL backend refuses.
    """
    del op
    return _stage(outputs, args, lambda t: t.device.type == "cpu", _current_cuda())


def _current_cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _stage(
    outputs: Any,
    args: tuple[Any, ...],
    moves: Callable[[torch.Tensor], bool],
    target: torch.device,
) -> Staging | None:
    if not _any_tensor(args, moves):
        return None
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def stand_in(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if not moves(value):
                return value
            pair = copies.get(id(value))
            if pair is None:
                pair = copies[id(value)] = (value, value.detach().to(target))
            return pair[1]
        if isinstance(value, list):
            return [stand_in(item) for item in value]
        if isinstance(value, tuple):
            return tuple(stand_in(item) for item in value)
        return value

    staged_args = tuple(stand_in(a) for a in args)
    staged_outputs = stand_in(outputs)
    written = {id(t): copies[id(t)] for t in tensors_in(outputs) if moves(t)}
    return Staging(
        args=staged_args,
        outputs=staged_outputs,
        user_outputs=outputs,
        pairs=tuple(written.values()),
    )


def _any_tensor(value: Any, test: Callable[[torch.Tensor], bool]) -> bool:
    """Whether `test` holds for a tensor in `value` (a tensor, or lists and tuples of them).

    Every op of a Baby or Gloo group asks this first and nearly always gets
    False; a plain recursion costs a fraction of chained generators
    (`futures.tensors_in`), which is several microseconds per small op.
    """
    if isinstance(value, torch.Tensor):
        return test(value)
    if isinstance(value, (list, tuple)):
        for item in value:
            if _any_tensor(item, test):
                return True
    return False


def alltoall_through_one_buffer(
    output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor]
) -> Staging:
    """The list form of alltoall as one ``alltoall_base`` over flat buffers.

    Gloo runs only the single-buffer form on some torch builds; its args are
    ``(flat_out, flat_in, output_split_sizes, input_split_sizes)``, and the
    copy-back splits the flat output into the caller's tensors.
    """
    dtypes = {t.dtype for t in (*output_tensors, *input_tensors)}
    devices = {t.device for t in (*output_tensors, *input_tensors)}
    if len(dtypes) != 1 or len(devices) != 1:
        raise ValueError(
            "alltoall: every tensor must have one dtype and device, got "
            f"dtypes {sorted(map(str, dtypes))} on {sorted(map(str, devices))}"
        )
    flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
    out_splits = [t.numel() for t in output_tensors]
    flat_out = flat_in.new_empty(sum(out_splits))
    pairs = []
    offset = 0
    for t, n in zip(output_tensors, out_splits, strict=True):
        pairs.append((t, flat_out[offset : offset + n].view(t.shape)))
        offset += n
    return Staging(
        args=(flat_out, flat_in, out_splits, [t.numel() for t in input_tensors]),
        outputs=flat_out,
        user_outputs=output_tensors,
        pairs=tuple(pairs),
    )


def staged_work(work: Work | None, staging: Staging) -> Work:
    """`work`, run on `staging`'s copies, as a Work of the caller's own tensors.

    A c10d backend that synchronised a blocking op itself returns None (torch
    checks for that); then the copy-back happens here, at once.
    """
    if work is None:
        staging.copy_back()
        return completed_work(staging.user_outputs)
    return StagedWork(work, staging)


class StagedWork(Work):
    """The Work of an op run on stand-in copies; outputs reach the caller's tensors on completion.

    Copies back once, from whichever of `wait()` or the future finishes first.
    """

    def __init__(self, work: Work, staging: Staging) -> None:
        super().__init__()
        self._work = work
        self._staging = staging
        self._lock = threading.Lock()
        self._copied = False

    def _finish(self) -> Any:
        with self._lock:
            if not self._copied:
                self._staging.copy_back()
                self._copied = True
        return self._staging.user_outputs

    def wait(self, timeout: timedelta | None = None) -> bool:
        ok = self._work.wait(timeout) if timeout is not None else self._work.wait()
        self._finish()
        return bool(ok)

    def get_future(self) -> Future[Any]:
        def done(fut: Future[Any]) -> Any:
            fut.value()  # raises the op's error
            return self._finish()

        return self._work.get_future().then(done)

    def is_completed(self) -> bool:
        if not self._work.is_completed():
            return False
        self._finish()
        return True

    def _source_rank(self) -> int:
        """The sender of a completed `recv_anysource` (what ``dist.recv`` returns)."""
        return _torch_internals.source_rank(self._work)

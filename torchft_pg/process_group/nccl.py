"""`ProcessGroupNCCL`: a reconfigurable NCCL group (CUDA tensors, one GPU per rank).

NCCL communicators are created non-blocking so a missing peer cannot wedge
`configure`, and `abort()` records the error *before* aborting so a thread
waiting on the group sees why it failed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import BarrierOptions, Work
from torch._C._distributed_c10d import ProcessGroup as BaseProcessGroup
from torch.distributed import Store

from torchft_pg.errors import ProcessGroupAbortedError
from torchft_pg.process_group._staging import stage_on_device, staged_work
from torchft_pg.process_group.wrapper import DEFAULT_TIMEOUT, ProcessGroupWrapper

__all__ = ["ProcessGroupNCCL", "create_nccl_group"]


def create_nccl_group(
    store: Store, rank: int, world_size: int, timeout: timedelta
) -> BaseProcessGroup:
    """A c10d group backed by a non-blocking NCCL communicator on the current device."""
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        raise RuntimeError("ProcessGroupNCCL needs a CUDA device and a torch build with NCCL")
    opts = dist.ProcessGroupNCCL.Options()
    opts.config.blocking = False
    opts._timeout = timeout
    pg = BaseProcessGroup(store, rank, world_size)
    backend = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    backend._set_sequence_number_for_group()
    backend.eager_connect_single_device(torch.device("cuda", torch.cuda.current_device()))
    pg._register_backend(torch.device("cuda"), BaseProcessGroup.BackendType.NCCL, backend)
    pg._set_default_backend(BaseProcessGroup.BackendType.NCCL)
    return pg


class ProcessGroupNCCL(ProcessGroupWrapper):
    """NCCL, rebuilt on every `configure`; `timeout` bounds rendezvous and each op (s)."""

    C10D_BACKEND = "nccl"

    def __init__(self, timeout: timedelta | float = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout=timeout)

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        return create_nccl_group(store, rank, world_size, self._timeout)

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        staging = stage_on_device(op, outputs, args)
        if staging is not None:  # host tensors (object collectives): run on GPU copies
            return staged_work(super()._run(op, staging.outputs, *staging.args), staging)
        return super()._run(op, outputs, *args)

    def barrier(self, opts: BarrierOptions | None = None) -> Work:
        options = opts or BarrierOptions()
        if not options.device_ids and (options.device is None or options.device.type == "cpu"):
            # torch asks for a CPU barrier on a group it cannot place on a device;
            # an NCCL group has no CPU backend, so it runs on this rank's GPU.
            options.device = torch.device("cuda", torch.cuda.current_device())
        return super().barrier(options)

    def _abort_backend(self, pg: Any) -> None:
        self._error = self._error or ProcessGroupAbortedError("NCCL process group aborted")
        super()._abort_backend(pg)

    def errored(self) -> Exception | None:
        # A queued NCCL failure only surfaces once the stream has run up to it.
        if torch.cuda.is_available() and self._pg is not None:
            torch.cuda.current_stream().synchronize()
        return super().errored()

    def getBackendName(self) -> str:
        return "torchft-nccl"

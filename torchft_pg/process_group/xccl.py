"""`ProcessGroupXCCL`: a reconfigurable XCCL group (Intel XPU tensors, one XPU per rank).

torchft offers XCCL groups for Intel GPUs; this is ours, with torchft's
constructor. It needs a torch built with XCCL and an XPU device; without
them the group can still be constructed (as torchft's can), and `configure`
fails at once, before meeting any peer, with an error that names the group
and what is missing.

Only XPU tensors are supported: unlike `ProcessGroupNCCL`, host tensors are
not staged on the device.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import BarrierOptions, Store
from torch.distributed import ProcessGroup as BaseProcessGroup

from torchft_pg import _torch_internals
from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupError
from torchft_pg.process_group.reconfigurable import DEFAULT_TIMEOUT, ProcessGroupWrapper
from torchft_pg.store import StoreAddress

__all__ = ["ProcessGroupXCCL", "create_xccl_group", "xccl_missing"]


def _xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def _xccl_built() -> bool:
    is_available = getattr(dist, "is_xccl_available", None)
    return bool(is_available is not None and is_available()) and hasattr(dist, "ProcessGroupXCCL")


def xccl_missing() -> str | None:
    """What this process lacks to run XCCL, in words, or None if nothing."""
    missing = []
    if not _xccl_built():
        missing.append(
            f"this torch ({torch.__version__}) is built without XCCL "
            "(torch.distributed.is_xccl_available() is False)"
        )
    if not _xpu_available():
        missing.append("there is no Intel XPU device (torch.xpu.is_available() is False)")
    return " and ".join(missing) or None


def create_xccl_group(
    store: Store, rank: int, world_size: int, timeout: timedelta
) -> BaseProcessGroup:
    """A c10d group backed by XCCL on the current XPU device; `timeout` bounds each op."""
    missing = xccl_missing()
    if missing is not None:
        raise ProcessGroupError(f"an XCCL group needs XCCL and an Intel XPU, but {missing}")
    xccl: Any = getattr(dist, "ProcessGroupXCCL")  # noqa: B009  (absent from torch's stubs)
    opts = xccl.Options()
    _torch_internals.set_options_timeout(opts, timeout, required=False)
    backend = xccl(store, rank, world_size, opts)
    _torch_internals.start_sequence_numbers(backend)
    device = torch.device("xpu", torch.xpu.current_device())
    backend.eager_connect_single_device(device)
    backend_type: Any = BaseProcessGroup.BackendType.XCCL
    return _torch_internals.c10d_group_over(store, rank, world_size, backend, backend_type, ["xpu"])


class ProcessGroupXCCL(ProcessGroupWrapper):
    """XCCL (Intel XPU), rebuilt on every `configure`; `timeout` bounds rendezvous and
    each op (a timedelta, or seconds; default 60 s).

    `configure` raises `ProcessGroupError` at once, naming what is missing, in
    a process without XCCL or an XPU device.
    """

    C10D_BACKEND = "xccl"

    def __init__(self, timeout: timedelta | float = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout=timeout)

    def _create_pg_at(self, address: StoreAddress, rank: int, world_size: int) -> Any:
        # Before meeting the peers: they would all wait for a member that cannot build it.
        missing = xccl_missing()
        if missing is not None:
            raise ProcessGroupError(
                f"{type(self).__name__} cannot configure: it needs XCCL and an Intel XPU, "
                f"but {missing}"
            )
        return super()._create_pg_at(address, rank, world_size)

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        return create_xccl_group(store, rank, world_size, self._timeout)

    def barrier(self, opts: BarrierOptions | None = None) -> Any:
        options = opts or BarrierOptions()
        if not options.device_ids and (options.device is None or options.device.type == "cpu"):
            # An XCCL group has no CPU backend: the barrier runs on this rank's XPU.
            options.device = torch.device("xpu", torch.xpu.current_device())
        return super().barrier(options)

    def _abort_backend(self, pg: Any) -> None:
        # Recorded first, so a thread woken by the abort sees why its op failed.
        self._error = self._error or ProcessGroupAbortedError("XCCL process group aborted")
        super()._abort_backend(pg)

    def errored(self) -> Exception | None:
        # A queued XCCL failure only surfaces once the stream has run up to it.
        if self._pg is not None and _xpu_available():
            torch.xpu.current_stream().synchronize()
        return super().errored()

    def getBackendName(self) -> str:
        return "torchft-xccl"

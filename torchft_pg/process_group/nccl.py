"""`ProcessGroupNCCL`: a reconfigurable NCCL group (CUDA tensors, one GPU per rank).

NCCL communicators are created non-blocking so a missing peer cannot wedge
`configure`, and `abort()` records the error *before* aborting so a thread
waiting on the group sees why it failed.

Timeouts are ours, not c10d's (as in torchft): c10d's NCCL watchdog, on an
operation that overstays its timeout, tears the whole process down by
default. So c10d gets a backstop timeout (`c10d_backstop`) long enough never
to fire first, and every operation is bounded by the group's `timeout` here
(`_deadlines`): an operation not completed on the device by then aborts the
communicator (``ncclCommAbort``), its step fails and votes no, and the process
lives on. With ``TORCHFT_TRIGGER_FR_ON_ABORT=true`` that abort first dumps
NCCL's flight recorder (`_flight_recorder`). Like torchft, the constructor sets
``TORCH_NCCL_NONBLOCKING_TIMEOUT`` to the timeout when it is unset, so a
non-blocking communicator's init and abort are bounded by it too.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import BarrierOptions, Store, Work
from torch.distributed import ProcessGroup as BaseProcessGroup

from torchft_pg import _torch_internals
from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError
from torchft_pg.process_group import _flight_recorder
from torchft_pg.process_group._deadlines import bound_by_deadline
from torchft_pg.process_group._staging import stage_on_device, staged_work
from torchft_pg.process_group.reconfigurable import DEFAULT_TIMEOUT, ProcessGroupWrapper
from torchft_pg.store import StoreAddress

__all__ = ["ProcessGroupNCCL", "c10d_backstop", "create_nccl_group"]

logger = logging.getLogger(__name__)
NONBLOCKING_TIMEOUT_ENV = "TORCH_NCCL_NONBLOCKING_TIMEOUT"


def c10d_backstop(timeout: timedelta) -> timedelta:
    """The timeout c10d's own watchdog gets: far beyond ours, so ours fires first."""
    return max(10 * timeout, timeout + timedelta(minutes=10))


def create_nccl_group(
    store: Store, rank: int, world_size: int, timeout: timedelta
) -> BaseProcessGroup:
    """A c10d group backed by a non-blocking NCCL communicator on the current device."""
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        raise RuntimeError("ProcessGroupNCCL needs a CUDA device and a torch build with NCCL")
    opts = dist.ProcessGroupNCCL.Options()
    opts.config.blocking = False
    _torch_internals.set_options_timeout(opts, timeout)
    backend = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    _torch_internals.start_sequence_numbers(backend)
    backend.eager_connect_single_device(torch.device("cuda", torch.cuda.current_device()))
    return _torch_internals.c10d_group_over(
        store, rank, world_size, backend, BaseProcessGroup.BackendType.NCCL, ["cuda"]
    )


class ProcessGroupNCCL(ProcessGroupWrapper):
    """NCCL, rebuilt on every `configure`; `timeout` bounds rendezvous and each op (s),
    by aborting the communicator (see the module docstring)."""

    C10D_BACKEND = "nccl"

    def __init__(self, timeout: timedelta | float = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout=timeout)
        if NONBLOCKING_TIMEOUT_ENV not in os.environ:
            seconds = f"{self._timeout.total_seconds():g}"
            logger.info(
                "%s is unset: setting it to the group's timeout, %s s",
                NONBLOCKING_TIMEOUT_ENV,
                seconds,
            )
            os.environ[NONBLOCKING_TIMEOUT_ENV] = seconds
        self._dump_base = os.environ.get(_flight_recorder.DUMP_ENV)

    def _create_pg_at(self, address: StoreAddress, rank: int, world_size: int) -> Any:
        if self._dump_base and _flight_recorder.enabled():
            os.environ[_flight_recorder.DUMP_ENV] = _flight_recorder.dump_path_for(
                self._dump_base, address.prefix
            )
        return super()._create_pg_at(address, rank, world_size)

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        return create_nccl_group(store, rank, world_size, c10d_backstop(self._timeout))

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        staging = stage_on_device(op, outputs, args)
        if staging is not None:  # host tensors (object collectives): run on GPU copies
            return staged_work(super()._run(op, staging.outputs, *staging.args), staging)
        backend = self.parent
        work = super()._run(op, outputs, *args)
        return bound_by_deadline(work, self._timeout, lambda: self._overstayed(op, backend))

    def _overstayed(self, op: str, backend: Any) -> None:
        """`op`, issued on `backend`, did not complete within the timeout: abort it."""
        logger.error(
            "NCCL %s did not complete within %s: aborting the communicator", op, self._timeout
        )
        if _flight_recorder.enabled():
            rank = dist.get_rank() if dist.is_initialized() else self.rank()
            _flight_recorder.trigger_dump(rank)
        error = ProcessGroupTimeoutError(f"NCCL {op} did not complete within {self._timeout}")
        if self._pg is backend:
            self._error = self._error or error
            self.abort()
        else:  # the group was rebuilt meanwhile: only the old communicator goes
            self._abort_backend(backend)

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

"""`ProcessGroupGloo`: a reconfigurable Gloo group (CPU tensors; CUDA tensors too)."""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Store, Work

from torchft_pg import _torch_internals
from torchft_pg.errors import ProcessGroupAbortedError
from torchft_pg.process_group import _reaper
from torchft_pg.process_group._bounded_build import Abandoned, build_within
from torchft_pg.process_group._staging import stage_on_host, staged_work
from torchft_pg.process_group.reconfigurable import DEFAULT_TIMEOUT, ProcessGroupWrapper
from torchft_pg.store import StoreAddress
from torchft_pg.work import AbortableWork, AbortSignal

__all__ = ["ProcessGroupGloo"]


def create_gloo_group(
    store: Store, rank: int, world_size: int, timeout: timedelta, hostname: str | None = None
) -> BaseProcessGroup:
    """A c10d group whose CPU (and CUDA) ops run on one Gloo backend.

    Blocks until every member has connected, or raises after `timeout`.
    `hostname`: the address Gloo binds and advertises to its peers; None
    leaves the choice to torch (the interfaces in ``GLOO_SOCKET_IFNAME``, else
    whatever this machine's hostname resolves to, which is often loopback).
    """
    if hostname:
        device = dist.ProcessGroupGloo.create_device(hostname=hostname)
        options = _torch_internals.gloo_options(timeout, device)
        backend = dist.ProcessGroupGloo(store, rank, world_size, options)
    else:
        backend = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    _torch_internals.start_sequence_numbers(backend)
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return _torch_internals.c10d_group_over(
        store, rank, world_size, backend, BaseProcessGroup.BackendType.GLOO, devices
    )


class ProcessGroupGloo(ProcessGroupWrapper):
    """Gloo, rebuilt on every `configure`; `timeout` bounds rendezvous and each op (s).

    `hostname` (keyword only, not in torchft): the address this rank's Gloo
    pairs bind and advertise to the other replicas, e.g. the one given to the
    Manager as its `hostname`. None keeps torch's choice: ``GLOO_SOCKET_IFNAME``,
    else the machine's hostname, which resolves to loopback on many hosts (and
    in a network namespace), so that peers on other hosts cannot connect.
    """

    C10D_BACKEND = "gloo"
    _ALLTOALL_THROUGH_ONE_BUFFER = True

    def __init__(
        self, timeout: timedelta | float = DEFAULT_TIMEOUT, *, hostname: str | None = None
    ) -> None:
        if hostname is not None and not isinstance(hostname, str):
            raise TypeError(f"hostname must be a str or None, got {type(hostname).__name__}")
        super().__init__(timeout=timeout)
        self._hostname = hostname or None
        self._abort_signal = AbortSignal()  # one per backend: fired by abort()
        self._works: weakref.WeakSet[AbortableWork] = weakref.WeakSet()

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        self._abort_signal = AbortSignal()
        return create_gloo_group(store, rank, world_size, self._timeout, self._hostname)

    def _create_pg_at(self, address: StoreAddress, rank: int, world_size: int) -> Any:
        """Meet the members, then build Gloo within the timeout (see `_bounded_build`).

        Gloo's constructor alone can take several times the timeout against a
        peer that drops packets, and no failure notice can stop it; here the
        configure fails at the timeout or the interrupt instead, and the
        constructor's late result (and the store client lent to it) is disposed
        of when it returns.
        """
        borrowed = self._meet_at(address, rank, world_size)

        def dispose(backend: BaseProcessGroup | None) -> None:
            if backend is not None:
                _reaper.retire([backend])
            borrowed.release()

        try:
            backend = build_within(
                lambda: self._create_pg(borrowed.store, rank, world_size),
                timeout_s=self._timeout.total_seconds(),
                interrupted=self._interrupted,
                interrupt_reason=lambda: self._interrupt_reason,
                on_abandoned=dispose,
                what=f"Gloo rank {rank} of {world_size} at {address}",
            )
        except Abandoned:
            raise  # `dispose` releases the store client once the constructor returns
        except BaseException:
            borrowed.release()
            raise
        self._borrowed_store = borrowed
        return backend

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        staging = stage_on_host(op, outputs, args)
        if staging is not None:  # CUDA tensors in an op Gloo runs on host memory only
            return staged_work(self._run(op, staging.outputs, *staging.args), staging)
        # Gloo's own abort() leaves a thread in wait() asleep until the op times out.
        work = AbortableWork(
            super()._run(op, outputs, *args), self._abort_signal, self._timeout, outputs
        )
        self._works.add(work)
        return work

    def num_active_work(self) -> int:
        return sum(1 for work in list(self._works) if not work.is_completed())

    def _abort_backend(self, pg: Any) -> None:
        self._abort_signal.fire(ProcessGroupAbortedError("ProcessGroupGloo was aborted"))
        super()._abort_backend(pg)

    def getBackendName(self) -> str:
        return "torchft-gloo"

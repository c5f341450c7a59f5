"""`ProcessGroupWrapper`: runs collectives on an inner backend that `configure` replaces.

Subclasses differ by hooks, not copies:
- `_create_pg(store, rank, world_size)` builds the inner backend (Gloo, NCCL, …);
- `_run(op, outputs, *args)` is the single path every collective takes, so a
  wrapper that changes behaviour (error swallowing, management) overrides one
  method.
Timeout, abort and shutdown logic live here once.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceScatterOptions,
    Work,
)
from torch.distributed import Store

from torchft_pg.errors import (
    NotConfiguredError,
    ProcessGroupAbortedError,
    ProcessGroupError,
    ProcessGroupTimeoutError,
)
from torchft_pg.process_group import _checks, _reaper
from torchft_pg.process_group.base import ProcessGroup, validate_configure_args
from torchft_pg.store import create_store_client
from torchft_pg.work import completed_work

__all__ = ["ProcessGroupWrapper"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = timedelta(seconds=60)


class ProcessGroupWrapper(ProcessGroup):
    """A ProcessGroup that delegates to an inner group rebuilt on every `configure`.

    `pg`: an inner torchft_pg ProcessGroup to wrap (its `configure` is called);
    without one, subclasses build a fresh backend in `_create_pg`.
    `timeout`: bound on rendezvous and every operation (default 60 s).
    """

    def __init__(
        self, pg: ProcessGroup | None = None, timeout: timedelta = DEFAULT_TIMEOUT
    ) -> None:
        super().__init__()
        if isinstance(pg, timedelta):  # torchft's positional order: (timeout, pg)
            pg, timeout = None, pg
        if timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._timeout = timeout
        self._wrapped = pg  # the user's inner torchft PG, kept across configures
        self._pg: Any = pg  # what collectives run on now
        self._rank = 0
        self._world_size = 1
        self._closed: Exception | None = None  # set by abort()/shutdown()
        self._error: Exception | None = None
        self._interrupted = threading.Event()  # set by interrupt_configure()
        self._interrupt_reason = ""

    # -- hooks -------------------------------------------------------------------
    def _create_pg(self, store: Store, rank: int, world_size: int) -> Any:
        """Build the inner backend for one configuration (a c10d Backend or PG)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _create_pg")

    def _create_pg_at(self, store_addr: str, rank: int, world_size: int) -> Any:
        """Build the inner backend for the group at `store_addr` (default: via a store client)."""
        store = create_store_client(store_addr, self._timeout)
        self._await_members(store, rank, world_size)
        return self._create_pg(store, rank, world_size)

    def _await_members(self, store: Store, rank: int, world_size: int) -> None:
        """Wait until every member reached this configure, or `interrupt_configure` is called.

        A backend's own rendezvous (Gloo's connectFullMesh) cannot be interrupted:
        a member that died after the quorum formed would cost everyone the whole
        timeout. Meeting first on the store, polled (0.1 ms doubling to 10 ms) between
        checks of the interrupt flag, lets a known death fail configure at once.
        """
        store.set(f"torchft_pg/present/{rank}", "1")
        keys = [f"torchft_pg/present/{r}" for r in range(world_size)]
        deadline = time.monotonic() + self._timeout.total_seconds()
        poll_s = 0.0001  # doubling to 10 ms: peers usually arrive within a millisecond
        while not store.check(keys):
            if self._interrupted.wait(poll_s):
                raise ProcessGroupAbortedError(f"configure interrupted: {self._interrupt_reason}")
            if time.monotonic() > deadline:
                missing = [r for r in range(world_size) if not store.check([keys[r]])]
                raise ProcessGroupTimeoutError(
                    f"members {missing} did not arrive within {self._timeout}"
                )
            poll_s = min(poll_s * 2, 0.01)

    def interrupt_configure(self, reason: str) -> None:
        """Make a `configure` in progress (or the next one) fail now: a member is known dead."""
        if self._wrapped is not None:
            self._wrapped.interrupt_configure(reason)
            return
        self._interrupt_reason = reason
        self._interrupted.set()

    def _retire_backend(self, holder: list[Any]) -> None:
        """Dispose of the previous backend (``holder[0]``, its only reference) off-thread."""
        self._abort_backend(holder[0])
        _reaper.retire(holder)

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        """Run collective `op` on the inner group. `outputs` is what its future yields."""
        return getattr(self.parent, op)(*args)

    # -- lifecycle ---------------------------------------------------------------
    @property
    def parent(self) -> Any:
        """The inner group collectives run on; raises if there is none yet."""
        pg = self._pg
        if pg is None:
            raise self._not_ready()
        return pg

    def _not_ready(self) -> Exception:
        name = type(self).__name__
        if self._closed is not None:
            return ProcessGroupAbortedError(
                f"{name}: {self._closed}; call configure() to rebuild it"
            )
        return NotConfiguredError(
            f"{name} is not configured: call configure(store_addr, rank, world_size) "
            "before running collectives"
        )

    def configure(
        self, store_addr: str, rank: int, world_size: int, replica_id: str | None = None
    ) -> None:
        validate_configure_args(store_addr, rank, world_size)
        self._error = None
        self._closed = None
        self._interrupted.clear()
        if self._wrapped is not None:
            self._wrapped.configure(store_addr, rank, world_size, replica_id=replica_id)
            self._pg = self._wrapped
            self._publish_ranks(world_size)
            return
        if self._pg is not None:
            holder, self._pg = [self._pg], None
            self._retire_backend(holder)
        try:
            self._pg = self._create_pg_at(store_addr, rank, world_size)
        except ProcessGroupError:
            raise  # ours already say what happened
        except Exception as e:
            kind = ProcessGroupTimeoutError if _is_timeout(e) else ProcessGroupError
            raise kind(
                f"{type(self).__name__}.configure({store_addr!r}, rank={rank}, "
                f"world_size={world_size}) failed within {self._timeout}: {e}"
            ) from e
        self._rank, self._world_size = rank, world_size
        self._publish_ranks(world_size)

    def _abort_backend(self, pg: Any) -> None:
        abort = getattr(pg, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception as e:  # an abort of an already-broken backend may fail
                logger.debug("abort of %r failed: %s", pg, e)

    def abort(self) -> None:
        self._closed = self._closed or ProcessGroupAbortedError("process group was aborted")
        self._error = self._error or self._closed
        if self._pg is None:
            return
        holder, self._pg = [self._pg], None
        self._abort_backend(holder[0])
        if holder[0] is not self._wrapped:
            _reaper.retire(holder)

    def shutdown(self) -> None:
        if self._keep_alive_on_destroy:
            return
        self._closed = self._closed or ProcessGroupAbortedError("process group was shut down")
        self._publish_ranks(None)
        pg, self._pg = self._pg, None
        if pg is None:
            return
        if pg is self._wrapped:
            self._wrapped.shutdown()
            return
        stop = getattr(pg, "shutdown", None)
        if stop is not None:
            try:
                stop()
            except Exception as e:
                logger.debug("shutdown of %r failed: %s", pg, e)
        del pg  # synchronous: callers expect sockets released on return

    def errored(self) -> Exception | None:
        if self._error is not None:
            return self._error
        if self._wrapped is not None:
            return self._wrapped.errored()
        return None

    def set_timeout(self, timeout: timedelta) -> None:
        if timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._timeout = timeout
        pg = self._pg
        if pg is not None:
            setter = getattr(pg, "set_timeout", None) or getattr(pg, "_set_default_timeout", None)
            if setter is not None:
                setter(timeout)

    def size(self) -> int:
        if self._wrapped is not None:
            return self._wrapped.size()
        return self._world_size

    def rank(self) -> int:
        if self._wrapped is not None:
            return self._wrapped.rank()
        return self._rank

    def getBackendName(self) -> str:
        if self._wrapped is not None:
            return self._wrapped.getBackendName()
        raise NotImplementedError(f"{type(self).__name__} must implement getBackendName")

    def __repr__(self) -> str:
        state = "configured" if self._pg is not None else "not configured"
        return f"{type(self).__name__}(rank={self.rank()}, size={self.size()}, {state})"

    # -- collectives ---------------------------------------------------------------
    def allreduce(
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | ReduceOp | None = None
    ) -> Work:
        _checks.tensor_list("allreduce", "tensors", tensors)
        options = AllreduceOptions() if opts is None else _checks.allreduce_options(opts)
        return self._run("allreduce", tensors, tensors, options)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> Work:
        _checks.tensor_list("allreduce_coalesced", "tensors", tensors)
        return self._run(
            "allreduce_coalesced", tensors, tensors, opts or AllreduceCoalescedOptions()
        )

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensor: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        world = self.size()
        _checks.tensor_list("allgather", "input_tensor", input_tensor)
        options = opts or AllgatherOptions()
        if (
            world > 1
            and len(output_tensors) == len(input_tensor)
            and all(isinstance(o, list) and len(o) == 1 for o in output_tensors)
        ):
            return self._allgather_c10d_sized(output_tensors, input_tensor, options)
        _checks.nested_lists(
            "allgather", "output_tensors", output_tensors, len(input_tensor), world
        )
        return self._run("allgather", output_tensors, output_tensors, input_tensor, options)

    def _allgather_c10d_sized(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensor: list[torch.Tensor],
        opts: AllgatherOptions,
    ) -> Work:
        """An allgather sized by c10d's fixed size of 1 (DDP's parameter check).

        C++ callers size the output by this object's construction-time size (1).
        Gather from every member, then put the first entry that differs from
        ours (else ours) in the single slot, so the caller's consistency check
        still sees a mismatch with any peer.
        """
        world = self.size()
        full = [[torch.empty_like(t) for _ in range(world)] for t in input_tensor]
        self._run("allgather", full, full, input_tensor, opts).wait()
        for out, gathered, mine in zip(output_tensors, full, input_tensor, strict=True):
            differing = [g for g in gathered if g.shape != mine.shape or not torch.equal(g, mine)]
            out[0].copy_(differing[0] if differing else mine)
        return completed_work(output_tensors)

    def allgather_into_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> Work:
        _checks.tensor_list("allgather_into_tensor_coalesced", "input_tensors", input_tensors)
        _checks.tensor_list(
            "allgather_into_tensor_coalesced", "output_tensors", output_tensors, len(input_tensors)
        )
        return self._run(
            "allgather_into_tensor_coalesced",
            output_tensors,
            output_tensors,
            input_tensors,
            opts or AllgatherOptions(),
        )

    def alltoall_base(
        self,
        output_buffer: torch.Tensor,
        input_buffer: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> Work:
        world = self.size()
        _checks.split_sizes(
            "alltoall_base", "output_split_sizes", output_split_sizes, output_buffer, world
        )
        _checks.split_sizes(
            "alltoall_base", "input_split_sizes", input_split_sizes, input_buffer, world
        )
        return self._run(
            "alltoall_base",
            output_buffer,
            output_buffer,
            input_buffer,
            output_split_sizes,
            input_split_sizes,
            opts or AllToAllOptions(),
        )

    def barrier(self, opts: BarrierOptions | None = None) -> Work:
        return self._run("barrier", None, opts or BarrierOptions())

    def broadcast(
        self, tensor_list: list[torch.Tensor], opts: BroadcastOptions | None = None
    ) -> Work:
        _checks.tensor_list("broadcast", "tensor_list", tensor_list)
        options = opts or BroadcastOptions()
        _checks.root_rank("broadcast", options.rootRank, self.size())
        return self._run("broadcast", tensor_list, tensor_list, options)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> Work:
        _checks.tensor_list("send", "tensors", tensors)
        _checks.peer_rank("send", "dst_rank", dst_rank, self.rank(), self.size())
        return self._run("send", tensors, tensors, dst_rank, tag)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> Work:
        _checks.tensor_list("recv", "tensors", tensors)
        _checks.peer_rank("recv", "src_rank", src_rank, self.rank(), self.size())
        return self._run("recv", tensors, tensors, src_rank, tag)

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> Work:
        _checks.tensor_list("reduce_scatter", "output_tensors", output_tensors)
        _checks.nested_lists(
            "reduce_scatter", "input_tensors", input_tensors, len(output_tensors), self.size()
        )
        return self._run(
            "reduce_scatter",
            output_tensors,
            output_tensors,
            input_tensors,
            opts or ReduceScatterOptions(),
        )

    def reduce_scatter_tensor_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> Work:
        _checks.tensor_list("reduce_scatter_tensor_coalesced", "input_tensors", input_tensors)
        _checks.tensor_list(
            "reduce_scatter_tensor_coalesced", "output_tensors", output_tensors, len(input_tensors)
        )
        return self._run(
            "reduce_scatter_tensor_coalesced",
            output_tensors,
            output_tensors,
            input_tensors,
            opts or ReduceScatterOptions(),
        )


def _is_timeout(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, TimeoutError) or "timeout" in text or "timed out" in text

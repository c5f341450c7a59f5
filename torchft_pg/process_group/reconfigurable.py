"""`ProcessGroupWrapper`: runs collectives on an inner backend that `configure` replaces.

This module is the lifecycle: `configure` (meet the other members on the
store, then build a fresh backend), `abort`, `shutdown`, the store client lent
to each backend, and timeouts. The collectives themselves, with their argument
checks, come from `forwarding.ForwardingProcessGroup`.

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
from datetime import timedelta
from typing import Any

from torch.distributed import Store, Work

from torchft_pg import _torch_internals
from torchft_pg.errors import (
    NotConfiguredError,
    ProcessGroupAbortedError,
    ProcessGroupError,
    ProcessGroupTimeoutError,
    is_timeout,
)
from torchft_pg.process_group import _meeting, _reaper
from torchft_pg.process_group._staging import backend_op
from torchft_pg.process_group.base import ProcessGroup, parse_configure_args
from torchft_pg.process_group.forwarding import ForwardingProcessGroup
from torchft_pg.store import BorrowedStore, StoreAddress, borrow_store_client

__all__ = ["ProcessGroupWrapper"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = timedelta(seconds=60)  # rendezvous and per-op bound when none is given


class ProcessGroupWrapper(ForwardingProcessGroup):
    """A ProcessGroup that delegates to an inner group rebuilt on every `configure`.

    `pg`: an inner torchft_pg ProcessGroup to wrap (its `configure` is called);
    without one, subclasses build a fresh backend in `_create_pg`.
    `timeout`: bound on rendezvous and every operation (a timedelta, or seconds;
    default 60 s).
    """

    def __init__(
        self, pg: ProcessGroup | None = None, timeout: timedelta | float = DEFAULT_TIMEOUT
    ) -> None:
        super().__init__()
        if isinstance(pg, (timedelta, int, float)):  # torchft's positional order: (timeout, pg)
            pg, timeout = None, pg
        self._timeout = as_timeout(timeout)
        self._wrapped = pg  # the user's inner torchft PG, kept across configures
        self._pg: Any = pg  # what collectives run on now
        self._rank = 0
        self._world_size = 1
        self._closed: Exception | None = None  # set by abort()/shutdown()
        self._error: Exception | None = None
        self._interrupted = threading.Event()  # set by interrupt_configure()
        self._interrupt_reason = ""
        self._borrowed_store: BorrowedStore | None = None  # the current backend's store client

    @property
    def timeout(self) -> timedelta:
        """The bound on rendezvous and on every operation (`set_timeout` changes it);
        around a user's group, that group's own bound when it has one."""
        inner = getattr(self._wrapped, "timeout", None)
        return inner if isinstance(inner, timedelta) else self._timeout

    # -- hooks -------------------------------------------------------------------
    def _create_pg(self, store: Store, rank: int, world_size: int) -> Any:
        """Build the inner backend for one configuration (a c10d Backend or PG)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _create_pg")

    def _create_pg_at(self, address: StoreAddress, rank: int, world_size: int) -> Any:
        """Build the inner backend for the group at `address` (default: via a store client).

        The store client is lent to this backend for its lifetime (see
        `torchft_pg.store`) and returned when it is retired.
        """
        borrowed = self._meet_at(address, rank, world_size)
        try:
            backend = self._create_pg(borrowed.store, rank, world_size)
        except BaseException:
            borrowed.release()
            raise
        self._borrowed_store = borrowed
        return backend

    def _meet_at(self, address: StoreAddress, rank: int, world_size: int) -> BorrowedStore:
        """Borrow a store client for `address` and meet every member there.

        Records the members' global ranks; the caller owns (and releases) the borrowed store.
        """
        borrowed = borrow_store_client(address, self._timeout)
        try:
            self._global_ranks = self._await_members(borrowed.store, rank, world_size)
        except BaseException:
            borrowed.release()
            raise
        return borrowed

    def _await_members(self, store: Store, rank: int, world_size: int) -> tuple[int, ...]:
        """Wait until every member reached this configure, or `interrupt_configure` is called.

        Returns each member's global rank (see `resolve_global_ranks`). Any
        Gloo-based member counts, ours or a plain torch Gloo group on the same
        prefix; see `_meeting` for how, and why we meet before building the
        backend at all.
        """
        return _meeting.meet(
            store,
            rank,
            world_size,
            self._timeout,
            self._interrupted,
            lambda: self._interrupt_reason,
        )

    def _release_store(self) -> None:
        borrowed, self._borrowed_store = self._borrowed_store, None
        if borrowed is not None:
            borrowed.release()

    def interrupt_configure(self, reason: str) -> None:
        """Make a `configure` in progress (or the next one) fail now: a member is known dead."""
        if self._wrapped is not None:
            self._wrapped.interrupt_configure(reason)
            return
        self._interrupt_reason = reason
        self._interrupted.set()

    def wait_started(self, timeout: timedelta) -> None:
        if self._wrapped is not None:
            self._wrapped.wait_started(timeout)

    def _retire_backend(self, holder: list[Any]) -> None:
        """Dispose of the previous backend (``holder[0]``, its only reference) off-thread."""
        self._abort_backend(holder[0])
        self._release_store()
        _reaper.retire(holder)

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        """Run collective `op` on the inner group (its c10d method of that name).
        `outputs` is what its future yields."""
        work: Work = backend_op(self.parent, op)(*args)
        return work

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

    def configure(self, *args: Any, **kwargs: Any) -> None:
        # Around a user's group, the address is that group's business: it checks
        # what it uses, and a ProcessGroupDummy uses none (torchft's tests pass "addr").
        call = parse_configure_args(args, kwargs, check_address=self._wrapped is None)
        address, rank, world_size = call.address, call.rank, call.world_size
        self._error = None
        self._closed = None
        self._interrupted.clear()
        if self._wrapped is not None:
            self._wrapped.configure(*args, **kwargs)
            self._pg = self._wrapped
            return
        assert address is not None  # parse_configure_args checked it
        if self._pg is not None:
            holder, self._pg = [self._pg], None
            self._retire_backend(holder)
        try:
            self._pg = self._create_pg_at(address, rank, world_size)
        except ProcessGroupError:
            raise  # ours already say what happened
        except Exception as e:
            kind = ProcessGroupTimeoutError if is_timeout(e) else ProcessGroupError
            raise kind(
                f"{type(self).__name__}.configure({call.store_addr!r}, rank={rank}, "
                f"world_size={world_size}) failed within {self._timeout}: {e}"
            ) from e
        self._rank, self._world_size = rank, world_size
        if call.global_ranks is not None:
            self._global_ranks = call.global_ranks

    def _abort_backend(self, pg: Any) -> None:
        abort = getattr(pg, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception as e:  # an abort of an already-broken backend may fail
                logger.debug("abort of %r failed: %s", pg, e)

    def abort(self, errored: bool = True) -> None:
        self._closed = self._closed or ProcessGroupAbortedError("process group was aborted")
        self._error = self._error or self._closed
        if self._pg is None:
            return
        holder, self._pg = [self._pg], None
        self._abort_backend(holder[0])
        if holder[0] is not self._wrapped:
            self._release_store()
            _reaper.retire(holder)

    def shutdown(self) -> None:
        if self._keep_alive_on_destroy:
            return
        self._closed = self._closed or ProcessGroupAbortedError("process group was shut down")
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
        self._release_store()

    def errored(self) -> Exception | None:
        if self._error is not None:
            return self._error
        if self._wrapped is not None:
            return self._wrapped.errored()
        return None

    def num_active_work(self) -> int:
        if self._wrapped is not None:
            return self._wrapped.num_active_work()
        return super().num_active_work()

    def set_timeout(self, timeout: timedelta | float) -> None:
        timeout = self._timeout = as_timeout(timeout)
        pg = self._pg
        if pg is not None:
            _torch_internals.set_timeout_of(pg, timeout)

    def size(self) -> int:
        if self._wrapped is not None:
            return self._wrapped.size()
        return self._world_size

    def global_ranks(self) -> tuple[int, ...]:
        if self._wrapped is not None:
            return self._wrapped.global_ranks()
        return super().global_ranks()

    def _c10d_backend(self) -> str:
        if self._wrapped is not None:
            return self._wrapped._c10d_backend()
        return self.C10D_BACKEND

    def rank(self) -> int:
        if self._wrapped is not None:
            return self._wrapped.rank()
        return self._rank

    def getBackendName(self) -> str:
        if self._wrapped is not None:
            return self._wrapped.getBackendName()
        raise NotImplementedError(f"{type(self).__name__} must implement getBackendName")

    def __repr__(self) -> str:
        if self._wrapped is not None:  # torchft's form for a wrapper around a user's group
            return f"{type(self).__name__}(pg={self._wrapped!r})"
        state = "configured" if self._pg is not None else "not configured"
        return f"{type(self).__name__}(rank={self.rank()}, size={self.size()}, {state})"

    # -- the one collective that does not go through _run ------------------------------
    def monitored_barrier(
        self, timeout: timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        """A barrier that names the members that did not arrive (Gloo only in c10d).

        Blocking, as c10d's is; `timeout` defaults to this group's. It returns
        nothing, so it calls the inner group directly rather than via `_run`.
        """
        self.parent.monitored_barrier(timeout or self._timeout, wait_all_ranks=wait_all_ranks)


def as_timeout(timeout: object) -> timedelta:
    """A positive timedelta from a timedelta or a number of seconds (torchft takes both)."""
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = timedelta(seconds=timeout)
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a timedelta or seconds, got {timeout!r}")
    if timeout <= timedelta(0):
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout

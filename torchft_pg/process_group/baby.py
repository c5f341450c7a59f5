"""Baby process groups: the real backend runs in a child process.

A hung or poisoned communicator cannot wedge the trainer: aborting means
killing the child. Unlike torchft, which starts a fresh interpreter on every
`configure` (seconds: `import torch` dominates), the child lives across
reconfigurations (a configure is one message, a few ms) and a warm spare
stands by, so replacing a killed child costs no start-up either.

CPU tensors of more than 64 KiB per op are moved to shared memory in place,
once (DDP reuses its buckets, so this is paid on the first step); smaller ones
are copied through the socket. CUDA tensors travel as IPC handles.
"""

from __future__ import annotations

import logging
import weakref
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupTimeoutError
from torchft_pg.process_group._baby_child import ChildProcess
from torchft_pg.process_group._baby_requests import PendingOp
from torchft_pg.process_group.wrapper import DEFAULT_TIMEOUT, ProcessGroupWrapper
from torchft_pg.store import StoreAddress

__all__ = ["ProcessGroupBaby", "ProcessGroupBabyGloo", "ProcessGroupBabyNCCL"]

logger = logging.getLogger(__name__)

CHILD_START_TIMEOUT = timedelta(seconds=120)  # a cold `import torch` can take tens of seconds


class _BabyWork(Work):
    """A collective running in the child; `wait` is bounded by the PG timeout.

    `wait` reads the child's reply itself when no other thread is reading
    (see `_baby_child`); `get_future` has the background thread read instead.
    """

    def __init__(self, op: PendingOp, child: ChildProcess, timeout_s: float) -> None:
        super().__init__()
        self._op = op
        self._child = child
        self._timeout_s = timeout_s  # the PG's op timeout, for a wait() without its own

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit_s = timeout.total_seconds() if timeout else self._timeout_s
        if not self._child.await_request(self._op, limit_s):
            raise ProcessGroupTimeoutError(
                f"Baby PG collective (child pid {self._child.pid}) timed out after "
                f"{timedelta(seconds=limit_s)}"
            )
        if self._op.error is not None:
            raise self._op.error
        return True

    def get_future(self) -> Future[Any]:
        future = self._op.get_future()
        if not self._op.done:
            self._child.want_reader()
        return future

    def is_completed(self) -> bool:
        if not self._op.done:
            self._child.poll_completions()
        return self._op.done

    def _source_rank(self) -> int:
        """The sender of a completed `recv_anysource` (what ``dist.recv`` returns)."""
        if self._op.source_rank is None:
            raise RuntimeError("_source_rank: only a completed recv_anysource has a source")
        return self._op.source_rank


class _Children:
    """A Baby group's current child and warm spare, closable without the group itself."""

    def __init__(self) -> None:
        self.child: ChildProcess | None = None
        self.spare: ChildProcess | None = None

    def close(self) -> None:
        for child in (self.child, self.spare):
            if child is not None:
                child.close()
        self.child = self.spare = None


class ProcessGroupBaby(ProcessGroupWrapper):
    """A process group whose backend runs in a long-lived child process.

    `timeout` bounds rendezvous and each op (s). `warm_spare` keeps a second
    child started, so a replacement after `abort()` or a crash is immediate.
    """

    BACKEND = "gloo"
    C10D_BACKEND = "gloo"

    def __init__(
        self, timeout: timedelta | float = DEFAULT_TIMEOUT, warm_spare: bool = True
    ) -> None:
        super().__init__(timeout=timeout)
        self._warm_spare = warm_spare
        self._device_index = torch.cuda.current_device() if self.BACKEND == "nccl" else None
        self._children = _Children()
        # A group dropped without shutdown() must not leave its children running.
        weakref.finalize(self, self._children.close)
        self._child = self._start_child()  # starts importing torch now, in parallel with the caller

    @property
    def _child(self) -> ChildProcess | None:
        return self._children.child

    @_child.setter
    def _child(self, child: ChildProcess | None) -> None:
        self._children.child = child

    @property
    def _spare(self) -> ChildProcess | None:
        return self._children.spare

    @_spare.setter
    def _spare(self, child: ChildProcess | None) -> None:
        self._children.spare = child

    def _start_child(self) -> ChildProcess:
        return ChildProcess(self.BACKEND, self._device_index)

    def _live_child(self) -> ChildProcess:
        """The current child if alive and idle, else the warm spare, else a new one."""
        child = self._child
        if child is not None and child.dead is None:
            child.poll_completions()
            if child.num_pending():  # ops of the previous group still run: only a kill stops them
                child.kill()
        if child is None or child.dead is not None or child.proc.poll() is not None:
            if child is not None:
                child.close()
            child, self._spare = self._spare, None
            if child is None or child.dead is not None or child.proc.poll() is not None:
                child = self._start_child()
            self._child = child
        child.wait_ready(CHILD_START_TIMEOUT)
        if self._warm_spare and (self._spare is None or self._spare.proc.poll() is not None):
            self._spare = self._start_child()
        return child

    def wait_started(self, timeout: timedelta) -> None:
        """Block until the current child serves (it imports torch: seconds when cold)."""
        child = self._child
        if child is not None and child.dead is None:
            child.wait_ready(timeout)

    @property
    def child_pid(self) -> int | None:
        """The pid of the child running the backend (for tests and chaos plans)."""
        return self._child.pid if self._child is not None else None

    def _create_pg_at(self, address: StoreAddress, rank: int, world_size: int) -> Any:
        child = self._live_child()
        # Meet on the store here, as every torchft_pg group does, so a Baby member
        # and a Gloo member can share a prefix and a known death interrupts us.
        self._meet_at(address, rank, world_size).release()
        child.configure(address, rank, world_size, self._timeout)
        return child

    def monitored_barrier(
        self, timeout: timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        raise NotImplementedError(
            f"monitored_barrier is not supported by {type(self).__name__} (it would block "
            "the child's command loop); use barrier()"
        )

    def _retire_backend(self, holder: list[Any]) -> None:
        pass  # the child replaces its own backend on the next "configure"

    def _abort_backend(self, pg: Any) -> None:
        """Fail the in-flight ops at once. A child with an op still running is
        killed: nothing else stops a Gloo op (Gloo's abort leaves it running
        until its timeout), and a live op may still write into the caller's
        shared-memory tensors. An idle child is kept: the next `configure`
        replaces its backend in one message instead of switching to the spare
        and starting a new one (an interpreter importing torch: seconds of CPU)."""
        if not isinstance(pg, ChildProcess):
            return
        pg.poll_completions()  # a failure the child already reported (a dead peer's socket)
        if pg.dead is None and pg.num_pending() == 0:
            return
        pg.kill()
        if self._child is pg:
            self._child = None

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        child = self.parent
        if child.dead is not None:
            raise ProcessGroupAbortedError(f"{child.dead}; call configure() to start a new child")
        return _BabyWork(child.submit(op, args, outputs), child, self._timeout.total_seconds())

    def num_active_work(self) -> int:
        child = self._pg
        return child.num_pending() if isinstance(child, ChildProcess) else 0

    def errored(self) -> Exception | None:
        child = self._pg
        if isinstance(child, ChildProcess) and child.dead is not None:
            return child.dead
        return super().errored()

    def shutdown(self) -> None:
        if self._keep_alive_on_destroy:
            return
        super().shutdown()
        self._children.close()

    def getBackendName(self) -> str:
        return f"torchft-baby-{self.BACKEND}"


class ProcessGroupBabyGloo(ProcessGroupBaby):
    """Gloo in a child process (CPU tensors)."""

    BACKEND = "gloo"


class ProcessGroupBabyNCCL(ProcessGroupBaby):
    """NCCL in a child process: a wedged communicator is killed with the child.

    Costs a second CUDA context (~0.5-1 GB of GPU memory) in the child.
    """

    BACKEND = "nccl"
    C10D_BACKEND = "nccl"

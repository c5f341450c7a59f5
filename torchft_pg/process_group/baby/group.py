"""Baby process groups, in the parent: the real backend runs in a child process.

A hung or poisoned communicator cannot wedge the trainer: aborting an op in
flight means killing the child. Unlike torchft, which starts a fresh
interpreter on every `configure` (seconds: `import torch` dominates), the child
lives across reconfigurations (a configure is one message, a few ms), and a
zygote (`zygote`: an interpreter that imported torch once) forks a
replacement for a killed child in milliseconds.

CPU tensors of more than 64 KiB per op are moved to shared memory in place,
once (DDP reuses its buckets, so this is paid on the first step); smaller ones
are copied through the socket. CUDA tensors travel as IPC handles.
"""

from __future__ import annotations

import logging
import threading
import weakref
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import Work
from torch.futures import Future

from torchft_pg.errors import (
    ProcessGroupAbortedError,
    ProcessGroupError,
    ProcessGroupTimeoutError,
)
from torchft_pg.process_group._staging import stage_on_device, stage_on_host, staged_work
from torchft_pg.process_group.baby.parent import ChildProcess
from torchft_pg.process_group.baby.pending import PendingOp
from torchft_pg.process_group.baby.zygote import Zygote, zygote_supported
from torchft_pg.process_group.reconfigurable import DEFAULT_TIMEOUT, ProcessGroupWrapper
from torchft_pg.process_group.xccl import xccl_missing
from torchft_pg.store import StoreAddress

__all__ = [
    "ProcessGroupBaby",
    "ProcessGroupBabyGloo",
    "ProcessGroupBabyNCCL",
    "ProcessGroupBabyXCCL",
    "ProcessGroupShutdownError",
]

logger = logging.getLogger(__name__)

CHILD_START_TIMEOUT = timedelta(seconds=120)  # a cold `import torch` can take tens of seconds


class ProcessGroupShutdownError(ProcessGroupAbortedError, OSError):
    """An op on a Baby group after `shutdown()`: its child is gone until `configure`.

    Also an OSError, as torchft's Baby groups raise (``OSError: handle is
    closed``, from the closed pipe to their child), so code written for either
    catches it.
    """


class _BabyWork(Work):
    """A collective running in the child; `wait` is bounded by the PG timeout.

    `wait` reads the child's reply itself when no other thread is reading
    (see `parent`); `get_future` has the background thread read instead.
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
    """A Baby group's current child and its zygote, closable without the group itself."""

    def __init__(self) -> None:
        self.child: ChildProcess | None = None
        self.zygote: Zygote | None = None

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
        if self.zygote is not None:
            self.zygote.close()
        self.child = self.zygote = None


class ProcessGroupBaby(ProcessGroupWrapper):
    """A process group whose backend runs in a long-lived child process.

    `timeout` bounds rendezvous and each op (s). `warm_spare` keeps a zygote: an
    interpreter that imports torch once, from construction on, and forks the
    child, and any replacement after `abort()` or a crash, in milliseconds.
    Without it every child is a new interpreter (seconds). `hostname` (keyword
    only, Gloo only, as for `ProcessGroupGloo`): the address the child's Gloo
    pairs bind and advertise to the other replicas; None keeps torch's choice.
    """

    BACKEND = "gloo"
    C10D_BACKEND = "gloo"

    def __init__(
        self,
        timeout: timedelta | float = DEFAULT_TIMEOUT,
        warm_spare: bool = True,
        *,
        hostname: str | None = None,
    ) -> None:
        if hostname is not None and not isinstance(hostname, str):
            raise TypeError(f"hostname must be a str or None, got {type(hostname).__name__}")
        if hostname and self.BACKEND != "gloo":
            raise ValueError(
                f"hostname applies to Gloo only; {type(self).__name__} runs {self.BACKEND}"
            )
        super().__init__(timeout=timeout)
        self._hostname = hostname or None  # what the child's Gloo binds and advertises
        self._warm_spare = warm_spare
        self._device_index = torch.cuda.current_device() if self.BACKEND == "nccl" else None
        self._children = _Children()
        self._children_lock = threading.Lock()  # configure and wait_started may both start one
        # A group dropped without shutdown() must not leave its children running.
        weakref.finalize(self, self._children.close)
        # Start importing torch now, in parallel with the caller: the zygote, which
        # forks the first child once it is ready, or else the first child itself.
        # A group that cannot run here starts nothing; its configure says why.
        if self._unavailable() is None:
            if warm_spare and zygote_supported():
                self._children.zygote = Zygote()
            else:
                self._child = self._start_child(CHILD_START_TIMEOUT)

    @property
    def _child(self) -> ChildProcess | None:
        return self._children.child

    @_child.setter
    def _child(self, child: ChildProcess | None) -> None:
        self._children.child = child

    def _start_child(self, timeout: timedelta) -> ChildProcess:
        """A new child: forked by the zygote if there is one (waiting up to `timeout` for
        it to finish starting: it began before any new interpreter could), else a new
        interpreter."""
        return ChildProcess(self.BACKEND, self._device_index, self._children.zygote, timeout)

    def _unavailable(self) -> str | None:
        """Why this group cannot run in this process (a sentence naming the class and
        what is missing), or None if it can. Default: it can."""
        return None

    def _live_child(self, timeout: timedelta = CHILD_START_TIMEOUT) -> ChildProcess:
        """The current child if alive and idle, else a new one; once it serves.

        Raises `ProcessGroupError` (before starting anything) if `_unavailable` says why
        no child can serve this group.
        """
        why = self._unavailable()
        if why is not None:
            raise ProcessGroupError(why)
        with self._children_lock:
            child = self._child
            if child is not None and child.dead is None:
                child.poll_completions()
                if (
                    child.num_pending()
                ):  # ops of the previous group still run: only a kill stops them
                    child.kill()
            if child is None or child.dead is not None or child.proc.poll() is not None:
                if child is not None:
                    child.close()
                child = self._child = self._start_child(timeout)
            zygote = self._children.zygote
            if self._warm_spare and zygote is not None and not zygote.usable:
                zygote.close()  # it died: the next replacement gets a new one
                self._children.zygote = Zygote()
        child.wait_ready(timeout)
        return child

    def wait_started(self, timeout: timedelta) -> None:
        """Block until a child serves (with a zygote: forked once the zygote imported torch)."""
        self._live_child(timeout)

    @property
    def child_pid(self) -> int | None:
        """The pid of the child running the backend (for tests and chaos plans)."""
        return self._child.pid if self._child is not None else None

    def _create_pg_at(self, address: StoreAddress, rank: int, world_size: int) -> Any:
        child = self._live_child()
        # Meet on the store here, as every torchft_pg group does, so a Baby member
        # and a Gloo member can share a prefix and a known death interrupts us.
        self._meet_at(address, rank, world_size).release()
        child.configure(address, rank, world_size, self._timeout, self._hostname)
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
        replaces its backend in one message, cheaper than a new child."""
        if not isinstance(pg, ChildProcess):
            return
        pg.poll_completions()  # a failure the child already reported (a dead peer's socket)
        if pg.dead is None and pg.num_pending() == 0:
            return
        pg.kill()
        if self._child is pg:
            self._child = None

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        # CUDA tensors travel to a Gloo child as host copies in shared memory;
        # host tensors reach an NCCL child as copies on this rank's GPU.
        if self.BACKEND == "gloo":
            staging = stage_on_host(op, outputs, args, native=frozenset())
        else:
            staging = stage_on_device(op, outputs, args)
        if staging is not None:
            return staged_work(self._run(op, staging.outputs, *staging.args), staging)
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
        # Marks the group as shut down (not merely aborted) for `_not_ready`;
        # `configure` clears it.
        self._closed = ProcessGroupShutdownError("process group was shut down")
        super().shutdown()
        self._children.close()

    def _not_ready(self) -> Exception:
        if isinstance(self._closed, ProcessGroupShutdownError):
            return ProcessGroupShutdownError(
                f"{type(self).__name__} was shut down (its child's handle is closed); "
                "call configure() to start a new child"
            )
        return super()._not_ready()

    def getBackendName(self) -> str:
        return f"torchft-baby-{self.BACKEND}"


class ProcessGroupBabyGloo(ProcessGroupBaby):
    """Gloo in a child process (CPU tensors)."""

    BACKEND = "gloo"
    _ALLTOALL_THROUGH_ONE_BUFFER = True


class ProcessGroupBabyNCCL(ProcessGroupBaby):
    """NCCL in a child process: a wedged communicator is killed with the child.

    Costs a second CUDA context (~0.5-1 GB of GPU memory) in the child.
    """

    BACKEND = "nccl"
    C10D_BACKEND = "nccl"


class ProcessGroupBabyXCCL(ProcessGroupBaby):
    """XCCL (Intel XPU) in a child process: torchft's class and constructor.

    Not runnable yet: `configure` (and `wait_started`) raise `ProcessGroupError`
    at once, naming what this process lacks (a torch with XCCL, an XPU device),
    or, where both are present, that torchft_pg cannot yet hand XPU tensors to
    its child (use `ProcessGroupXCCL` there). Construction starts no child.
    """

    BACKEND = "xccl"
    C10D_BACKEND = "xccl"

    def _unavailable(self) -> str | None:
        name = type(self).__name__
        missing = xccl_missing()
        if missing is not None:
            return f"{name} cannot configure: it needs XCCL and an Intel XPU, but {missing}"
        return (
            f"{name} cannot configure: torchft_pg cannot yet share XPU tensors with a "
            "child process; use ProcessGroupXCCL, which runs XCCL in this process"
        )

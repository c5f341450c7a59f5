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

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

import torchft_pg
from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupError, ProcessGroupTimeoutError
from torchft_pg.process_group import _baby_protocol as proto
from torchft_pg.process_group.wrapper import DEFAULT_TIMEOUT, ProcessGroupWrapper

__all__ = ["ProcessGroupBaby", "ProcessGroupBabyGloo", "ProcessGroupBabyNCCL"]

logger = logging.getLogger(__name__)

CHILD_START_TIMEOUT = timedelta(seconds=120)  # a cold `import torch` can take tens of seconds


class _PendingOp:
    """One op in flight. `_released` is acquired until the op completes: waiting on
    a bare lock is cheaper than on a threading.Event (a Condition underneath)."""

    __slots__ = ("_released", "encoded", "error", "future", "source_rank")

    def __init__(self, encoded: proto.EncodedArgs) -> None:
        self.encoded = encoded
        self.source_rank: int | None = None  # recv_anysource: the member that sent
        self.future: Future[Any] = Future()
        self.error: Exception | None = None
        self._released = threading.Lock()
        self._released.acquire()

    def finish(self, error: Exception | None) -> None:
        self.error = error
        self._released.release()
        if error is None:
            self.future.set_result(self.encoded.outputs)
        else:
            self.future.set_exception(error)

    def wait(self, seconds: float) -> bool:
        if self._released.acquire(timeout=seconds):
            self._released.release()  # let later waiters through too
            return True
        return False

    def is_done(self) -> bool:
        return not self._released.locked()


class _ChildProcess:
    """One backend child: its process, socket, receiver thread and pending ops."""

    def __init__(self, backend: str, device_index: int | None) -> None:
        self.backend = backend
        self._sock, child_sock = proto.socket_pair()
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(torchft_pg.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchft_pg.process_group._baby_worker",
                str(child_sock.fileno()),
                backend,
                "none" if device_index is None else str(device_index),
            ],
            pass_fds=(child_sock.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child_sock.close()
        self.registry = proto.SharedStorageRegistry()
        self._send_lock = threading.Lock()
        # Single dict operations are atomic under the GIL: no lock on the hot path.
        self._pending: dict[int, _PendingOp] = {}
        self._ids = itertools.count()
        self._ready = threading.Event()
        self._configured = threading.Event()
        self._configure_error: str | None = None
        self._configure_timed_out = False
        self.dead: Exception | None = None
        self._thread = threading.Thread(
            target=self._receive, name="torchft_pg-baby-recv", daemon=True
        )
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: timedelta) -> None:
        if not self._ready.wait(timeout.total_seconds()):
            raise ProcessGroupTimeoutError(
                f"Baby PG child (pid {self.pid}) did not start within {timeout}"
            )
        if self.dead is not None:
            raise self.dead

    def _receive(self) -> None:
        receiver = proto.Receiver(self._sock)
        try:
            while True:
                message, _fds = receiver.recv()
                kind = message[0]
                if kind == "done":
                    self._complete(message[1], message[2], message[3], message[4])
                elif kind == "configured":
                    self._configure_error, self._configure_timed_out = message[1], message[2]
                    self._configured.set()
                elif kind == "ready":
                    self._ready.set()
        except (EOFError, OSError):
            pass
        code = self.proc.wait()
        self._die(
            ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) exited with code {code}")
        )

    def _complete(
        self, op_id: int, error: str | None, results: list[bytes], source_rank: int | None
    ) -> None:
        op = self._pending.pop(op_id, None)
        if op is None:
            return
        op.source_rank = source_rank
        if error is None:
            try:
                proto.copy_results(op.encoded, results)
            except Exception as e:
                error = f"copying results failed: {e}"
        op.finish(
            None
            if error is None
            else ProcessGroupError(f"Baby PG collective failed in child (pid {self.pid}): {error}")
        )

    def _die(self, error: Exception) -> None:
        if self.dead is None:
            self.dead = error
        self._ready.set()
        self._configured.set()
        pending, self._pending = self._pending, {}
        for op in pending.values():
            op.finish(self.dead)

    def _send(self, message: Any, fds: list[int] | None = None) -> None:
        if self.dead is not None:
            raise self.dead
        try:
            with self._send_lock:
                proto.send(self._sock, message, fds)
        except OSError as e:
            raise ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) is gone: {e}") from e

    def configure(self, store_addr: str, rank: int, world_size: int, timeout: timedelta) -> None:
        self._configured.clear()
        self._send(("configure", store_addr, rank, world_size, timeout.total_seconds()))
        # The child's own rendezvous is bounded by `timeout`; allow it to report.
        if not self._configured.wait(timeout.total_seconds() + 5.0):
            raise ProcessGroupTimeoutError(
                f"Baby PG child (pid {self.pid}) did not configure within {timeout}"
            )
        if self.dead is not None:
            raise self.dead
        if self._configure_error is not None:
            kind = ProcessGroupTimeoutError if self._configure_timed_out else ProcessGroupError
            raise kind(f"Baby PG child (pid {self.pid}): {self._configure_error}")

    def submit(
        self, name: str, args: tuple[Any, ...], outputs: Any, timeout: timedelta
    ) -> _BabyWork:
        if args and any(_is_cuda(a) for a in args):
            torch.cuda.current_stream().synchronize()  # the child reads on its own stream
        spec, encoded = proto.encode_args(args, self.registry, proto.INLINE_MAX_BYTES)
        encoded.outputs = outputs
        op = _PendingOp(encoded)
        op_id = next(self._ids)
        self._pending[op_id] = op
        forget, self.registry.forget = self.registry.forget, []
        try:
            self._send(("op", op_id, name, spec, encoded.inline_bytes, forget), encoded.fds)
        except Exception:
            self._pending.pop(op_id, None)
            raise
        if self.dead is not None and self._pending.pop(op_id, None) is not None:
            op.finish(self.dead)  # the child died between our insert and _die's sweep
        return _BabyWork(op, timeout, self.pid)

    def num_pending(self) -> int:
        """Ops sent to the child that have not completed."""
        return len(self._pending)

    def kill(self) -> None:
        """SIGKILL the child: pending and future work fail at once, nothing hangs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._die(ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) was killed (abort)"))
        self._close_socket()

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within 5 s.

        A child still starting (importing torch, seconds) holds no group and
        would only read the request once started: it is killed at once.
        """
        if not self._ready.is_set():
            self.kill()
            return
        if self.proc.poll() is None:
            try:
                self._send(("shutdown",))
                self.proc.wait(timeout=5)
            except Exception:
                pass
        if self.proc.poll() is None:
            self.kill()
        self._die(ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) was shut down"))
        self._close_socket()

    def _close_socket(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class _BabyWork(Work):
    """A collective running in the child; `wait` is bounded by the PG timeout."""

    def __init__(self, op: _PendingOp, timeout: timedelta, pid: int) -> None:
        super().__init__()
        self._op = op
        self._timeout = timeout
        self._pid = pid

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit = timeout or self._timeout
        if not self._op.wait(limit.total_seconds()):
            raise ProcessGroupTimeoutError(
                f"Baby PG collective (child pid {self._pid}) timed out after {limit}"
            )
        if self._op.error is not None:
            raise self._op.error
        return True

    def get_future(self) -> Future[Any]:
        return self._op.future

    def is_completed(self) -> bool:
        return self._op.is_done()

    def _source_rank(self) -> int:
        """The sender of a completed `recv_anysource` (what ``dist.recv`` returns)."""
        if self._op.source_rank is None:
            raise RuntimeError("_source_rank: only a completed recv_anysource has a source")
        return self._op.source_rank


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, (list, tuple)):
        return any(_is_cuda(v) for v in value)
    return False


class _Children:
    """A Baby group's current child and warm spare, closable without the group itself."""

    def __init__(self) -> None:
        self.child: _ChildProcess | None = None
        self.spare: _ChildProcess | None = None

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
    def _child(self) -> _ChildProcess | None:
        return self._children.child

    @_child.setter
    def _child(self, child: _ChildProcess | None) -> None:
        self._children.child = child

    @property
    def _spare(self) -> _ChildProcess | None:
        return self._children.spare

    @_spare.setter
    def _spare(self, child: _ChildProcess | None) -> None:
        self._children.spare = child

    def _start_child(self) -> _ChildProcess:
        return _ChildProcess(self.BACKEND, self._device_index)

    def _live_child(self) -> _ChildProcess:
        """The current child if alive, else the warm spare, else a new one."""
        child = self._child
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

    @property
    def child_pid(self) -> int | None:
        """The pid of the child running the backend (for tests and chaos plans)."""
        return self._child.pid if self._child is not None else None

    def _create_pg_at(self, store_addr: str, rank: int, world_size: int) -> Any:
        child = self._live_child()
        # Meet on the store here, as every torchft_pg group does, so a Baby member
        # and a Gloo member can share a prefix and a known death interrupts us.
        self._meet_at(store_addr, rank, world_size).release()
        child.configure(store_addr, rank, world_size, self._timeout)
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
        if isinstance(pg, _ChildProcess):
            pg.kill()
            if self._child is pg:
                self._child = None

    def _run(self, op: str, outputs: Any, *args: Any) -> Work:
        child = self.parent
        if child.dead is not None:
            raise ProcessGroupAbortedError(f"{child.dead}; call configure() to start a new child")
        return child.submit(op, args, outputs, self._timeout)

    def num_active_work(self) -> int:
        child = self._pg
        return child.num_pending() if isinstance(child, _ChildProcess) else 0

    def errored(self) -> Exception | None:
        child = self._pg
        if isinstance(child, _ChildProcess) and child.dead is not None:
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

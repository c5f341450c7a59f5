"""The parent's handle on one Baby child: its process, its socket and the requests in flight.

Who reads the socket. Replies (op results, configure outcomes) are read by
whichever thread holds the read token (`_token`):

- a thread waiting for a reply (`Work.wait()`, `configure`) takes the token
  when it is free and reads the socket itself until its reply has come,
  completing any other replies it meets on the way. The common
  ``allreduce(...).wait()`` thus costs one thread wake-up per op, not two
  (a receiver thread waking, then waking the waiter);
- a background thread reads when a reply is wanted but no waiter is reading:
  an op whose future was asked for (DDP's comm hooks), or a waiter that found
  another thread holding the token (it blocks on its request's lock and asks
  the background thread to keep reading). Once woken, the background thread
  reads until nothing is in flight. While idle it watches the socket only for
  the child's death (EPOLLRDHUP: data does not wake it), so `dead` is set when
  the child dies even with nothing in flight.

Future callbacks therefore run on whichever thread read the reply. The token
is re-entrant, so a callback may itself wait on another op of this child.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from torchft_pg.errors import ProcessGroupAbortedError, ProcessGroupError, ProcessGroupTimeoutError
from torchft_pg.process_group.baby import messages as msgs
from torchft_pg.process_group.baby import protocol as proto
from torchft_pg.process_group.baby.pending import PendingOp, PendingRequest
from torchft_pg.process_group.baby.zygote import ForkedProcess, Zygote, child_env
from torchft_pg.store import StoreAddress

__all__ = ["ChildProcess"]

_READY_ID = 0  # the child's first message answers this request id
_STOP_JOIN_S = 5.0  # how long close()/kill() wait for the background thread to exit
_TOKEN_RECHECK_S = 0.05  # how often the background thread, waiting for the token, checks `dead`
_EXIT_WAIT_S = 5.0  # after its socket closed, how long a child may take to exit before we say so
_SHUTDOWN_WAIT_S = 5.0  # close(): how long a child asked to exit may take before it is killed
_KILL_WAIT_S = 10.0  # kill(): how long to wait for a SIGKILLed child to be reaped


class ChildProcess:
    """One backend child: its process, socket, readers and requests in flight.

    Forked by `zygote` when one is given and usable (milliseconds; it waits up
    to `zygote_wait` for a zygote still starting), else started as a fresh
    interpreter (an ``import torch``: seconds).
    """

    def __init__(
        self,
        backend: str,
        device_index: int | None,
        zygote: Zygote | None = None,
        zygote_wait: timedelta = timedelta(seconds=120),
    ) -> None:
        self.backend = backend
        self._sock, child_sock = msgs.socket_pair()
        device = "none" if device_index is None else str(device_index)
        proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        if zygote is not None and zygote.usable:
            with contextlib.suppress(OSError):  # a broken zygote: start one ourselves
                proc = zygote.spawn(child_sock, backend, device, zygote_wait)
        if proc is None:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torchft_pg.process_group.baby.child",
                    str(child_sock.fileno()),
                    backend,
                    device,
                ],
                pass_fds=(child_sock.fileno(),),
                env=child_env(),
                stdin=subprocess.DEVNULL,
            )
        self.proc: subprocess.Popen[bytes] | ForkedProcess = proc
        child_sock.close()
        self.dead: Exception | None = None
        self._registry = proto.SharedStorageRegistry()
        self._submit_lock = threading.Lock()  # encode + send in one order (shared storages)
        # Single dict operations are atomic under the GIL: no lock around _pending.
        self._pending: dict[int, PendingRequest] = {}
        self._next_id = _READY_ID + 1
        self._ready = PendingRequest()
        self._pending[_READY_ID] = self._ready
        self._token = threading.RLock()  # held by the one thread reading the socket
        self._receiver = msgs.Receiver(self._sock, takes_fds=False)
        self._poller = select.poll()
        self._poller.register(self._sock, select.POLLIN)
        self._bg_reading = False  # the background thread is in its reading loop
        self._wake_lock = threading.Lock()  # guards _wake_fd against use after close
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(
            target=self._background, name="torchft_pg-baby-recv", daemon=True
        )
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def ready(self) -> bool:
        return self._ready.done

    # -- requests ----------------------------------------------------------------
    def wait_ready(self, timeout: timedelta) -> None:
        """Block until the child serves (a cold start imports torch: seconds)."""
        if not self.await_request(self._ready, timeout.total_seconds()):
            raise ProcessGroupTimeoutError(
                f"Baby PG child (pid {self.pid}) did not start within {timeout}"
            )
        if self.dead is not None:
            raise self.dead

    def configure(
        self,
        address: StoreAddress,
        rank: int,
        world_size: int,
        timeout: timedelta,
        hostname: str | None = None,
    ) -> None:
        """Have the child build a backend at `address`; bounded by `timeout` plus 5 s.
        `hostname`: the address a Gloo backend binds and advertises (None: torch's)."""
        request = PendingRequest()
        with self._submit_lock:
            request_id = self._take_id()
            self._pending[request_id] = request
            message = msgs.Configure(
                request_id=request_id,
                address=address,
                rank=rank,
                world_size=world_size,
                timeout_s=timeout.total_seconds(),
                hostname=hostname,
            )
            self._send(message, request_id)
        # The child's own rendezvous is bounded by `timeout`; allow it to report.
        if not self.await_request(request, timeout.total_seconds() + 5.0):
            self._pending.pop(request_id, None)
            raise ProcessGroupTimeoutError(
                f"Baby PG child (pid {self.pid}) did not configure within {timeout}"
            )
        if request.error is not None:
            raise request.error
        reply: msgs.Configured = request.reply
        if reply.error is not None:
            kind = ProcessGroupTimeoutError if reply.timed_out else ProcessGroupError
            raise kind(f"Baby PG child (pid {self.pid}): {reply.error}")

    def submit(self, name: str, args: tuple[Any, ...], outputs: Any) -> PendingOp:
        """Send op `name` to the child; the returned op completes with its reply."""
        with self._submit_lock:
            if self.dead is not None:
                raise self.dead
            spec, encoded = proto.encode_args(args, self._registry)
            if encoded.has_cuda:
                torch.cuda.current_stream().synchronize()  # the child reads on its own stream
            op = PendingOp(encoded, outputs)
            op_id = self._take_id()
            self._pending[op_id] = op
            forget = self._registry.take_forget()
            message = msgs.RunOp(op_id=op_id, name=name, args=spec, forget=forget)
            self._send(message, op_id, encoded.buffers, encoded.fds)
        encoded.buffers = []  # sent: do not keep views of the caller's tensors
        if self.dead is not None and self._pending.pop(op_id, None) is not None:
            op.finish(self.dead)  # the child died between our insert and _die's sweep
        return op

    def _take_id(self) -> int:
        request_id = self._next_id
        self._next_id += 1
        return request_id

    def _send(
        self,
        message: msgs.Message,
        request_id: int,
        buffers: list[Any] | None = None,
        fds: list[int] | None = None,
    ) -> None:
        try:
            msgs.send(self._sock, message, buffers or (), fds or ())
        except OSError as e:
            self._pending.pop(request_id, None)
            raise ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) is gone: {e}") from e

    def num_pending(self) -> int:
        """Ops sent to the child that have not completed."""
        return sum(1 for r in list(self._pending.values()) if isinstance(r, PendingOp))

    # -- reading -----------------------------------------------------------------
    def await_request(self, request: PendingRequest, timeout_s: float) -> bool:
        """Wait up to `timeout_s` seconds for `request`'s reply; False on timeout."""
        if request.done:
            return True
        deadline = time.monotonic() + timeout_s
        if self._token.acquire(blocking=False):
            try:
                return self._read_until(request, deadline)
            finally:
                self._token.release()
        self.want_reader()  # another thread reads: make sure one keeps reading for us
        return request.block(deadline - time.monotonic())

    def want_reader(self) -> None:
        """Have the background thread read until nothing is in flight."""
        if self._bg_reading:
            return  # it re-checks what is in flight before it stops reading
        with self._wake_lock:
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)

    def poll_completions(self) -> None:
        """Complete whatever replies have already arrived, without blocking."""
        if not self._token.acquire(blocking=False):
            return
        try:
            while self.dead is None and self._read_one(socket.MSG_DONTWAIT):
                pass
        finally:
            self._token.release()

    def _read_until(self, request: PendingRequest, deadline: float) -> bool:
        while not request.done:
            if self.dead is not None:
                request.finish(self.dead)  # sent after the sweep of _die
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._poller.poll(math.ceil(remaining * 1000)):
                self._read_one()
        return True

    def _read_one(self, flags: int = 0) -> bool:
        """Read and dispatch one reply. False if there was none (MSG_DONTWAIT) or
        the child is gone (then every request has failed)."""
        if self.dead is not None:
            return False
        try:
            message, payload, fds = self._receiver.recv(flags)
        except BlockingIOError:
            return False
        except (EOFError, ConnectionError):
            self._child_gone()
            return False
        except (OSError, ValueError) as e:  # a truncated or garbled message, or a closed socket
            if self.dead is None:
                self._fail(f"unreadable message: {type(e).__name__}: {e}")
            return False
        for fd in fds:  # the child never sends any; do not leak one that arrives
            os.close(fd)
        if type(message) is msgs.OpDone:
            self._op_done(message, payload)
        elif isinstance(message, (msgs.Configured, msgs.Ready)):
            request = self._pending.pop(message.request_id, None)
            if request is not None:
                request.finish(None, message)
        return True

    def _op_done(self, message: msgs.OpDone, payload: memoryview) -> None:
        op = self._pending.pop(message.op_id, None)
        if not isinstance(op, PendingOp):
            return
        op.source_rank = message.source_rank
        error = message.error
        if error is None:
            try:
                proto.copy_results(op.encoded, payload)
            except Exception as e:
                error = f"copying results failed: {e}"
        op.finish(
            None
            if error is None
            else ProcessGroupError(f"Baby PG collective failed in child (pid {self.pid}): {error}")
        )

    def _background(self) -> None:
        """Read while wanted (see module docstring); notice the child's death."""
        epoll = select.epoll()
        try:
            epoll.register(self._sock.fileno(), select.EPOLLRDHUP)  # HUP/ERR always reported
            epoll.register(self._wake_fd, select.EPOLLIN)
            while self.dead is None:
                hung_up = False
                for fd, _events in epoll.poll():
                    if fd == self._wake_fd:
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(self._wake_fd)
                    else:
                        hung_up = True
                if not self._take_token():
                    break
                try:
                    self._serve(hung_up)
                finally:
                    self._token.release()
        except (OSError, ValueError):  # our socket or eventfd closed under us (kill/close)
            self._child_gone()
        finally:
            self._bg_reading = False
            epoll.close()
            with self._wake_lock:
                os.close(self._wake_fd)
                self._wake_fd = -1

    def _take_token(self) -> bool:
        """Wait for the reader holding the token; False once the child is dead (the
        holder may be a future callback shutting this child down, which joins us)."""
        while not self._token.acquire(timeout=_TOKEN_RECHECK_S):
            if self.dead is not None:
                return False
        return True

    def _serve(self, hung_up: bool) -> None:
        while self.dead is None:
            self._bg_reading = False  # before the check: see want_reader()
            if not (self._pending or hung_up):
                return
            self._bg_reading = True
            if not self._read_one():
                return

    # -- death -------------------------------------------------------------------
    def _child_gone(self) -> None:
        if self.dead is not None:
            return
        try:
            code: int | None = self.proc.wait(timeout=_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        what = "closed its socket" if code is None else f"exited with code {code}"
        self._die(ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) {what}"))

    def _fail(self, why: str) -> None:
        """The channel is unusable: kill the child and fail everything in flight."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self._die(ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) killed: {why}"))

    def _die(self, error: Exception) -> None:
        if self.dead is None:
            self.dead = error
        pending, self._pending = self._pending, {}
        for request in pending.values():
            request.finish(self.dead)

    def kill(self) -> None:
        """SIGKILL the child: pending and future work fail at once, nothing hangs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=_KILL_WAIT_S)
        self._die(ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) was killed (abort)"))
        self._close()

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within 5 s.

        A child still starting (importing torch, seconds) holds no group and
        would only read the request once started: it is killed at once.
        """
        self.poll_completions()  # a Ready still unread in the socket
        if not self.ready:
            self.kill()
            return
        if self.proc.poll() is None:
            try:
                msgs.send(self._sock, msgs.Shutdown())
                self.proc.wait(timeout=_SHUTDOWN_WAIT_S)
            except Exception:
                pass
        if self.proc.poll() is None:
            self.kill()
            return
        self._die(ProcessGroupAbortedError(f"Baby PG child (pid {self.pid}) was shut down"))
        self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self.want_reader()  # wakes the background thread, which sees `dead` and exits
        if threading.current_thread() is not self._thread:
            self._thread.join(_STOP_JOIN_S)
